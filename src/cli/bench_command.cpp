// `tessera bench`: times training steps of a config on synthetic tokens (no data directory
// needed), through the same TrainStep the trainer runs. Prints a table and, with --json, one JSON
// object that bench/compare_pytorch.py and bench/data_parallel.py read.
//
// With --nproc N it runs N ranks (cli/launcher.h) training data-parallel as parallel.* says, each
// rank on its own synthetic batch; --no-comm runs the same N processes doing the same compute
// with no data parallelism at all (each trains alone), the baseline for communication overhead
// on a machine whose cores the processes share. Rank 0 reports; with data parallelism it adds the
// dp group's bytes sent and communication-thread busy time per step, with sequence parallelism
// the sp group's bytes sent per step by operation (sp_bytes_per_step; bench/sequence_parallel.py),
// with tensor parallelism the tp group's (tp_bytes_per_step), with expert parallelism the ep
// group's (ep_bytes_per_step, and the all-to-all bytes to other nodes, ep_inter_node_bytes_per_step;
// bench/expert_parallel.py), with pipeline parallelism every
// pipeline rank's host memory (pp_peak_bytes, pp_model_state_bytes: the two figures below, per
// pipeline rank in order; bench/pipeline_memory.py), the timed steps' mean F, B, I, W per action,
// the transfers' host costs and the measured, simulated and replayed bubble (pp_action_ms,
// pp_transfer_ms, pp_bubble; bench/pipeline_split.py), the check of the start-up prediction
// (pp_prediction), and the bytes this rank sent per step over the pp and pp_down groups
// (pp_bytes_per_step).
//
// MFU is the model FLOPs of the whole step (every data-parallel replica's tokens) over the median
// step time and the peak of every process that ran it: a pipeline, tensor- or sequence-parallel
// replica spans several processes, and its tokens are counted once. Where the processes' threads
// outnumber the machine's cores the basis says they share them.
//
// Host memory (rank 0; memory/host_memory_stats.h, installed as the CPU allocator at start):
//   model_state_bytes  CPU tensor bytes live after the last step (its update and zero_grad done,
//                      before any next forward) minus those live before the model was built: what
//                      the model, optimizer and DataParallel hold between steps (read after a dp
//                      barrier, once the communication thread has dropped its last operation).
//   peak_bytes         the most CPU tensor bytes live at once during the timed steps, minus the
//                      same baseline: model state plus activations, gradients in flight, buffers.
// On CUDA both count host tensors only (the batches are made before the baseline), and are not
// printed: device_peak_gib is the caching allocator's peak over the timed steps instead (0 on CPU).
//   saved_activation_bytes  the most bytes autograd held at once for the blocks' backward during
//                      the timed steps (memory/saved_activations.h: encoded size where
//                      memory.activation_compression encodes, each storage once where kept; the
//                      embedding's and the head's saved tensors not included), on any device;
//                      with memory.activation_offload (or memory.resident_micro_batches: pipeline
//                      rank 0's, which holds the most), what was on the device (its copies on the
//                      host in saved_activation_host_bytes, and the copies' timing in
//                      activation_offload: memory/activation_offload.h, with the last step's
//                      trace as [what, group, start, end] in seconds from its start); with
//                      memory.activation_policy = auto, activation_policy: the reporting rank's
//                      choice for its blocks (layers; under a pipeline its pipeline_rank and the
//                      micro-batches held), the bytes and budget, and the added seconds per step
//                      it predicts.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <thread>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "cli/commands.h"
#include "cli/launcher.h"
#include "comm/device.h"
#include "data/batch_prefetcher.h"
#include "comm/mesh.h"
#include "core/error.h"
#include "memory/host_memory_stats.h"
#include "memory/activation_offload.h"
#include "memory/saved_activations.h"
#include "parallel/layout_check.h"
#include "plan/stage_cut.h"
#include "config/config.h"
#include "train/device_peak.h"
#include "train/peak_memory.h"
#include "train/train_step.h"
#include "model/model_size.h"

namespace tessera::cli {

Command add_bench_command(CLI::App& app) {
  struct Args {
    std::string config, out = "runs/bench", save_to;
    std::vector<std::string> sets;
    int64_t steps = 5, warmup = 2;
    bool json = false;
    bool no_comm = false;
    LaunchOptions launch;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("bench", "time training steps of a config on synthetic tokens");
  cmd->add_option("--config", args->config, "config file or preset name")->required();
  cmd->add_option("--set", args->sets, "override a config key: section.key=value (repeatable)")->take_all();
  cmd->add_option("--steps", args->steps, "timed steps")->capture_default_str();
  cmd->add_option("--warmup", args->warmup, "untimed steps first")->capture_default_str();
  cmd->add_flag("--json", args->json, "print one JSON object instead of a table");
  cmd->add_option("--nproc", args->launch.nproc, "run this many ranks (data parallel as parallel.* says)");
  cmd->add_option("--out", args->out, "with --nproc: directory for the other ranks' logs (logs/rank_N.out)")
      ->capture_default_str();
  cmd->add_flag("--no-comm", args->no_comm, "with --nproc: every rank trains alone (the no-communication baseline)");
  cmd->add_option("--save-to", args->save_to,
                  "after the steps, write each rank's checkpoint shares into this directory as a distributed save "
                  "does, and report the host memory it took per rank (save_by_rank)");
  return [args]() {
    host_memory::install();
    Config config = Config::load(args->config, args->sets);
    require(args->steps > 0 && args->warmup >= 0, "bench: --steps must be > 0 and --warmup >= 0");
    if (args->launch.nproc > 0) {
      check_parallel_layout(config, ParallelDims(config.parallel, args->launch.nproc, config_source(args->config)));
      return launch_workers(args->launch, args->out, config.parallel.timeout_s);
    }
    const comm::LaunchInfo launch = comm::launch_info_from_environment();
    std::unique_ptr<comm::Mesh> mesh;
    if (!args->no_comm)
      mesh = comm::Mesh::connect(launch, ParallelDims(config.parallel, launch.world_size, args->config),
                                 config.parallel, comm::select_device(config.train.device, launch));
    at::Generator generator = at::detail::createCPUGenerator(1 + static_cast<uint64_t>(launch.rank));
    // The micro-batches of a step as training takes them (with train.global_batch_size, over the
    // layout's dp ranks; --no-comm's lone ranks run the same count as their layout's).
    const int64_t accumulation =
        config.train.accumulation(ParallelDims(config.parallel, launch.world_size, args->config).dp());
    std::vector<Batch> batches;
    for (int64_t i = 0; i < accumulation; ++i) {
      at::Tensor tokens = at::randint(config.model.vocab_size, {config.train.batch_size, config.train.seq_len + 1},
                                      generator, at::TensorOptions().dtype(at::kLong));
      batches.push_back({tokens.narrow(1, 0, config.train.seq_len), tokens.narrow(1, 1, config.train.seq_len)});
    }
    host_memory::reset_peak();
    const int64_t bytes_before_model = host_memory::current();
    count_saved_activations(true);
    TrainStep step(config, mesh.get());
    // Set-up, per rank: host memory held at its end and at its peak (the layout's measurements,
    // the model's parts, the optimizer state), and the parameters the rank holds.
    int64_t local_parameters = 0;
    for (const auto& p : step.model()->parameters()) local_parameters += p.numel();
    std::vector<int64_t> setup = {host_memory::peak() - bytes_before_model, host_memory::current() - bytes_before_model,
                                  local_parameters};
    if (mesh) {
      at::Tensor all = at::empty({mesh->world_size() * 3}, at::kLong);
      mesh->world().all_gather(all, at::tensor(setup, at::kLong));
      setup.assign(all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + all.numel());
    }
    comm::Group* dp = mesh && mesh->dims().dp() > 1 ? &mesh->group("dp") : nullptr;
    comm::Group* sp = mesh && mesh->dims().sp() > 1 ? &mesh->group("sp") : nullptr;
    comm::Group* tp = mesh && mesh->dims().tp() > 1 ? &mesh->group("tp") : nullptr;
    comm::Group* ep = mesh && mesh->dims().ep() > 1 ? &mesh->group("ep") : nullptr;
    comm::Group* pp = mesh && mesh->dims().pp() > 1 ? &mesh->group("pp") : nullptr;
    comm::Group* pp_down = mesh && mesh->dims().pp() > 1 ? &mesh->group("pp_down") : nullptr;
    const c10::Device device = step.device();
    // Contiguous and pinned, as training's prefetcher hands a step its batches.
    if (device.is_cuda())
      for (Batch& b : batches) b = prepared_for_copy(b, /*pin=*/true);
    std::vector<double> seconds;
    double offload_trace_start = 0;  // the last step's start, on the offload trace's clock
    for (int64_t i = 0; i < args->warmup + args->steps; ++i) {
      if (i == args->warmup) {
        if (dp) dp->reset_traffic();
        if (sp) sp->reset_traffic();
        if (tp) tp->reset_traffic();
        if (ep) ep->reset_traffic();
        if (pp) pp->reset_traffic();
        if (pp_down) pp_down->reset_traffic();
        host_memory::reset_peak();
        if (device.is_cuda()) take_peak_memory_gib(device);  // resets the device's peak
        reset_saved_activation_peak();
        reset_activation_offload_stats();
        step.runner().start_timing();
      }
      const bool traced_step = i + 1 == args->warmup + args->steps &&
                               (config.memory.activation_offload > 0 || config.memory.activation_policy == "auto");
      if (traced_step) {
        trace_activation_offload(true);
        offload_trace_start = steady_seconds();
      }
      auto start = std::chrono::steady_clock::now();
      step.run(batches, config.optim.lr);
      if (device.is_cuda()) torch::cuda::synchronize();
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (i >= args->warmup) seconds.push_back(s);
      if (traced_step) trace_activation_offload(false);
    }
    const double steps = static_cast<double>(args->steps);
    const double comm_bytes_per_step = dp ? static_cast<double>(dp->bytes_sent()) / steps : 0.0;
    const double comm_busy_s_per_step = dp ? dp->busy_seconds() / steps : 0.0;
    const int64_t peak_bytes = host_memory::peak() - bytes_before_model;
    const double device_peak_gib = device.is_cuda() ? take_peak_memory_gib(device) : 0.0;
    const int64_t saved_bytes = saved_activation_bytes().peak;
    const int64_t saved_host_bytes = saved_activation_bytes().host_peak;
    const ActivationOffloadStats offloaded = activation_offload_stats();
    // The communication thread drops a finished operation (and the tensors it holds, such as the
    // step's all-gather inputs) just after waking its waiter; a barrier queues behind it.
    if (dp) dp->barrier();
    const int64_t model_state_bytes = host_memory::current() - bytes_before_model;
    std::vector<int64_t> pp_peak, pp_state;  // per pipeline rank
    if (mesh && mesh->dims().pp() > 1) {
      comm::Group& pp = mesh->group("pp");
      const at::Tensor mine = at::tensor({peak_bytes, model_state_bytes}, at::kLong);
      at::Tensor all = at::empty({pp.size() * 2}, at::kLong);
      pp.all_gather(all, mine);
      for (int64_t r = 0; r < pp.size(); ++r) {
        pp_peak.push_back(all[2 * r].item<int64_t>());
        pp_state.push_back(all[2 * r + 1].item<int64_t>());
      }
    }
    // A checkpoint save's shares (as the trainer writes them, without the commit): per rank, the
    // peak above the state held before it, and the bytes held before it.
    std::vector<int64_t> save;
    if (!args->save_to.empty()) {
      const int64_t world = mesh ? mesh->world_size() : 1, rank = mesh ? mesh->rank() : 0;
      if (rank == 0) {
        std::filesystem::remove_all(args->save_to);
        std::filesystem::create_directories(args->save_to);
      }
      if (mesh) mesh->world().barrier();
      const int64_t before = host_memory::current();
      host_memory::reset_peak();
      write_model_shard(args->save_to, rank, world, step.model_state_shard());
      write_optimizer_shard(args->save_to, rank, world, step.training_state_slices());
      save = {host_memory::peak() - before, before - bytes_before_model};
      if (mesh) {
        at::Tensor all = at::empty({world * 2}, at::kLong);
        mesh->world().all_gather(all, at::tensor(save, at::kLong));
        save.assign(all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + all.numel());
      }
    }
    std::vector<double> sorted = seconds;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    const double tokens = static_cast<double>(config.train.batch_size * config.train.seq_len * accumulation);
    DevicePeak peak = device_peak(device, step.compute_dtype(), config.train.peak_tflops);
    const int64_t processes = mesh ? mesh->world_size() : 1, replicas = mesh ? mesh->dims().dp() : 1;
    const int64_t cores = static_cast<int64_t>(std::thread::hardware_concurrency());
    if (!device.is_cuda() && cores > 0 && processes * at::get_num_threads() > cores)
      peak.basis += "; " + std::to_string(processes) + " processes of " + std::to_string(at::get_num_threads()) +
                    " thread(s) share " + std::to_string(cores) + " cores";
    const double mfu = flops_per_token(config.model, config.train.seq_len) * tokens * static_cast<double>(replicas) /
                       median / (peak.flops * static_cast<double>(processes));
    nlohmann::json out = {{"peer", "tessera"},
                          {"parameters", parameter_count(config.model)},
                          {"tokens_per_step", tokens},
                          {"step_s", seconds},
                          {"median_step_s", median},
                          {"tokens_per_s", tokens / median},
                          {"mfu", mfu},
                          {"peak_flops", peak.flops},
                          {"peak_basis", peak.basis},
                          {"threads", at::get_num_threads()},
                          {"ranks", launch.world_size},
                          {"data_parallel", dp != nullptr},
                          {"model_state_bytes", model_state_bytes},
                          {"setup_by_rank", setup},  // per rank: peak bytes, bytes held, parameters
                          {"peak_bytes", peak_bytes},
                          {"device_peak_gib", device_peak_gib},
                          {"saved_activation_bytes", saved_bytes},
                          {"activation_compression", config.memory.activation_compression},
                          {"attention_compression", config.memory.attention_compression}};
    const int64_t pp_rank = mesh && mesh->dims().pp() > 1 ? mesh->group("pp").rank() : 0;
    const ActivationPolicy* policy = step.layout().activation_policy(pp_rank);
    if (policy) out["activation_policy"] = activation_policy_json(*policy, accumulation);
    if (config.memory.activation_offload > 0 || config.memory.resident_micro_batches > 0 ||
        (policy && (policy->offloaded() > 0 || policy->resident_micro_batches > 0))) {
      out["saved_activation_host_bytes"] = saved_host_bytes;
      out["activation_offload"] = {{"blocks", config.memory.activation_offload},  // 0 under the policy
                                   {"resident_micro_batches", policy ? policy->resident_micro_batches
                                                                     : config.memory.resident_micro_batches},
                                   {"stored_bytes_per_step", static_cast<double>(offloaded.stored_bytes) / steps},
                                   {"store_s_per_step", offloaded.store_s / steps},
                                   {"fetch_s_per_step", offloaded.fetch_s / steps},
                                   {"fetch_wait_s_per_step", offloaded.fetch_wait_s / steps},
                                   {"exposed_fetches_per_step", static_cast<double>(offloaded.exposed_fetches) / steps},
                                   {"kept_groups_per_step", static_cast<double>(offloaded.kept_groups) / steps},
                                   {"store_wait_s_per_step", offloaded.store_wait_s / steps},
                                   {"store_ahead_wait_s_per_step", offloaded.store_ahead_wait_s / steps}};
      nlohmann::json trace = nlohmann::json::array();  // the last step's, in seconds from its start
      for (const OffloadEvent& e : activation_offload_trace())
        trace.push_back({e.what, e.group, e.start - offload_trace_start, e.end - offload_trace_start});
      out["activation_offload"]["trace"] = trace;
    }
    // By operation; with dp = 1 the sp (or tp) group is also the gradients' group (all_reduce).
    auto bytes_by_op = [&](const comm::Group& group) {
      nlohmann::json by_op = nlohmann::json::object();
      for (const auto& [op, bytes] : group.traffic()) by_op[op] = static_cast<double>(bytes) / steps;
      return by_op;
    };
    if (sp) {
      out["sp_bytes_per_step"] = bytes_by_op(*sp);
      out["sp_method"] = config.parallel.sp_method;
    }
    if (tp) {
      out["tp_bytes_per_step"] = bytes_by_op(*tp);
      out["megatron_sp"] = config.parallel.megatron_sp;
    }
    if (ep) {
      out["ep_bytes_per_step"] = bytes_by_op(*ep);
      out["ep_inter_node_bytes_per_step"] = static_cast<double>(ep->inter_node_bytes()) / steps;
      out["ep_dispatch"] = config.parallel.ep_dispatch;
    }
    if (pp) {  // this rank's: its activations' and gradients' sends, up (pp) and down (pp_down)
      nlohmann::json both = bytes_by_op(*pp);
      for (const auto& [op, bytes] : pp_down->traffic())
        both[op] = both.value(op, 0.0) + static_cast<double>(bytes) / steps;
      out["pp_bytes_per_step"] = both;
    }
    if (!pp_peak.empty()) {
      out["pp_peak_bytes"] = pp_peak;
      out["pp_model_state_bytes"] = pp_state;
      out["pp_schedule"] = config.parallel.pp_schedule;
      const StageCut& cut = step.layout().cut();  // as measured under pp_cut = profile
      out["pp_cut"] = {{"method", cut.method}, {"boundaries", cut.boundaries}, {"predicted_s", cut.seconds}};
    }
    if (!save.empty()) out["save_by_rank"] = save;  // per rank: peak above the held bytes, held bytes
    step.runner().add_bench_fields(out);  // the swap plan's prediction against its measured timeline
    if (dp) {
      out["comm_bytes_per_step"] = comm_bytes_per_step;
      out["dp_bytes_per_step"] = bytes_by_op(*dp);
      out["comm_busy_s_per_step"] = comm_busy_s_per_step;
      out["zero_stage"] = config.parallel.zero_stage;
      out["grad_compression"] = config.parallel.grad_compression;
    }
    if (launch.rank != 0) return 0;
    if (args->json) {
      std::cout << out.dump() << "\n";
      return 0;
    }
    std::printf("%12s %10s %14s %12s %8s\n", "params", "tokens/step", "median step s", "tokens/s", "MFU");
    std::printf("%11.2fM %10.0f %14.4f %12.0f %7.2f%%\n", parameter_count(config.model) / 1e6, tokens, median,
                tokens / median, 100 * mfu);
    std::printf("(MFU against %lld x %.3g TFLOP/s: %s)\n", static_cast<long long>(processes), peak.flops / 1e12,
                peak.basis.c_str());
    if (device.is_cuda())
      std::printf("device memory, rank 0: peak %.2f GiB over the timed steps (the caching allocator's)\n",
                  device_peak_gib);
    else
      std::printf("host memory, rank 0: model state %.1f MiB (%.2f bytes/parameter), peak %.1f MiB\n",
                  model_state_bytes / 1048576.0,
                  static_cast<double>(model_state_bytes) / static_cast<double>(parameter_count(config.model)),
                  peak_bytes / 1048576.0);
    std::printf("saved activations, rank 0: peak %.2f MiB (memory.activation_compression = %s, attention_compression = %s)\n",
                static_cast<double>(saved_bytes) / 1048576.0, config.memory.activation_compression.c_str(),
                config.memory.attention_compression.c_str());
    if (config.memory.activation_offload > 0)
      std::printf("offloaded activations, rank 0: host peak %.2f MiB; per step %.1f MiB stored, fetches %.1f ms of "
                  "which %.1f ms waited for\n",
                  static_cast<double>(saved_host_bytes) / 1048576.0,
                  static_cast<double>(offloaded.stored_bytes) / steps / 1048576.0, 1e3 * offloaded.fetch_s / steps,
                  1e3 * offloaded.fetch_wait_s / steps);
    return 0;
  };
}

}  // namespace tessera::cli
