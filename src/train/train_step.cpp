#include "train/train_step.h"

#include <thread>

#include <malloc.h>

#include <ATen/ATen.h>
#include <torch/torch.h>

#include "comm/device.h"
#include "core/error.h"
#include "plan/memory_estimate.h"
#include "plan/profile_cut.h"
#include "plan/swap_cut.h"
#include "plan/stage_cut.h"
#include "precision/autocast.h"

namespace tessera {
namespace {

// glibc hands the heap top back to the kernel whenever a step's activations are freed and faults
// it back in on the next step (15-25k page faults per tiny_gpt step; docs/benchmarks.md). Blocks
// up to 32 MiB come from a heap that is never trimmed: peak RSS is the step's peak anyway.
void keep_host_heap() {
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, -1);
#endif
}

}  // namespace

TrainStep::TrainStep(const Config& config, comm::Mesh* mesh)
    : config_(config),
      device_(mesh ? mesh->device() : comm::select_device(config.train.device, comm::LaunchInfo())),
      autocast_(autocast_dtype(config.precision)) {
  // More intra-op threads than cores only makes them wait on each other (measured: 600 threads on
  // 2 cores made a step 5x slower, and set-up takes seconds).
  const int64_t cores = std::thread::hardware_concurrency();
  require(cores == 0 || config.train.threads <= cores, "train.threads = ", config.train.threads,
          " exceeds this machine's ", cores, " cores (0 = use them all)");
  if (config.train.threads > 0) at::set_num_threads(static_cast<int>(config.train.threads));
  keep_host_heap();
  // Under pipeline parallelism each rank builds its stages of the cut (its parameters equal the
  // whole model's: they depend on the seed and their names only); parallel.pp_cut = profile
  // measures the blocks first (a collective of the world).
  ModelStage stage;
  if (mesh && mesh->dims().pp() > 1) {
    check_parallel_layout(config_, mesh->dims());
    if (config_.parallel.pp_cut == "profile" && config_.parallel.pp_layers.empty())
      config_.parallel.profiled = profile_pipeline_cut(config_, *mesh);
    const ParallelDims& dims = mesh->dims();
    stage = rank_stage(pipeline_cut(config_, dims), pipeline_schedule(config_, dims), mesh->coord().pp);
  }
  // Under memory.swap the blocks are measured on the device and the model cut into sub-models
  // first; the model is built in host memory, and only the swap plan brings parts of it over.
  std::optional<swap::SwapPlan> swap_plan;
  if (config_.memory.swap) {
    if (mesh) check_parallel_layout(config_, mesh->dims());
    swap_plan = plan_swap(config_, measure_swap_costs(config_, device_), mesh ? mesh->dims().dp() : 1);
    check_swap_host_memory(config_, *swap_plan, host_memory_available());
    config_.memory.swap_boundaries = {0};
    for (const swap::SubModel& s : swap_plan->subs) config_.memory.swap_boundaries.push_back(s.end);
  }
  torch::manual_seed(static_cast<uint64_t>(config_.train.seed));
  TransformerLM model(config_.model, stage);
  model->to(swap_plan ? c10::Device(at::kCPU) : device_, parameter_dtype(config_.precision));
  parallel_ = parallelize(model, mesh, config_);
  if (mesh && mesh->dims().pp() > 1)
    pipeline_ = std::make_unique<PipelineStep>(model, parallel_->owner(), *mesh, config_, device_, autocast_);
  if (swap_plan)
    swap_ = std::make_unique<SwapStep>(model, dynamic_cast<SwapOwner&>(parallel_->owner()), config_, device_, autocast_,
                                       std::move(*swap_plan));
}

TrainStep::~TrainStep() = default;

std::vector<Batch> TrainStep::local_batches(const std::vector<Batch>& batches) {
  std::vector<Batch> out;
  for (const Batch& b : batches) out.push_back({parallel_->local_tokens(b.inputs), parallel_->local_tokens(b.targets)});
  return out;
}

c10::ScalarType TrainStep::compute_dtype() const {
  return config_.precision.dtype == "fp16" ? at::kHalf : autocast_.value_or(at::kFloat);
}

StepResult TrainStep::run(const std::vector<Batch>& micro_batches, double lr, const GradientObserver& observe) {
  StepResult result;
  TransformerLM& model = parallel_->model();
  OptimizerOwner& owner = parallel_->owner();
  model->train();
  const double n = static_cast<double>(micro_batches.size());
  at::Tensor losses = at::zeros({2}, at::kDouble);  // cross-entropy, auxiliary
  UpdateResult update;
  // The gradients finished (reduced over the replicas, unscaled), read by `observe`, applied.
  auto optimizer_step = [&]() {
    owner.finish_gradients();
    if (pipeline_) pipeline_->tie_embedding();
    if (observe) observe(parallel_->gradients());
    update = owner.apply(lr, config_.optim.grad_clip);
  };
  if (pipeline_) {
    const PipelineLosses sums = pipeline_->run(local_batches(micro_batches), optimizer_step);
    losses = at::tensor({sums.ce_sum, sums.aux_sum}, at::kDouble);
  }
  if (swap_) {
    // The plan's OPTIM actions update; the gradients are read once all are on the host.
    const SwapStepResult r = swap_->run(local_batches(micro_batches), lr, [&] {
      if (observe) observe(parallel_->gradients());
    });
    losses = at::tensor({r.ce_sum, r.aux_sum}, at::kDouble);
    update.grad_norm = r.grad_norm;
  }
  for (size_t m = 0; m < micro_batches.size() && !pipeline_ && !swap_; ++m) {
    const Batch& batch = micro_batches[m];
    ModelOutput out;
    {
      AutocastGuard guard(device_.type(), autocast_.value_or(at::kFloat), autocast_.has_value());
      out = model->forward(parallel_->local_tokens(batch.inputs).to(device_),
                           parallel_->local_tokens(batch.targets).to(device_));
    }
    at::Tensor loss = out.loss.to(at::kFloat) / n;
    const double scale = owner.loss_scale();
    if (scale != 1.0) loss = loss * scale;
    owner.before_backward(m + 1 == micro_batches.size());
    loss.backward();
    losses += at::stack({out.ce_loss.detach(), out.aux_loss.detach()}).to(at::kCPU, at::kDouble);
  }
  parallel_->average_over_replicas(losses);
  result.ce_loss = losses[0].item<double>() / n;
  result.aux_loss = losses[1].item<double>() / n;
  if (!pipeline_ && !swap_) optimizer_step();  // a pipeline ran it at its OPTIM, a swap plan at its OPTIMs
  result.grad_norm = update.grad_norm;
  result.skipped = update.skipped;
  return result;
}

double TrainStep::evaluate(const std::vector<Batch>& batches) {
  // Data-parallel ranks each take their equal share of every batch's rows, sequence-parallel ranks
  // their chunk of each row; the mean of their means is the batch mean.
  const int64_t ranks = parallel_->data_ranks(), me = parallel_->data_rank();
  std::vector<Batch> mine;
  for (const Batch& batch : batches) {
    const int64_t rows = batch.inputs.size(0) / ranks;
    require(rows * ranks == batch.inputs.size(0), "internal: evaluation batch of ", batch.inputs.size(0),
            " rows for ", ranks, " data-parallel ranks");
    mine.push_back({batch.inputs.narrow(0, me * rows, rows), batch.targets.narrow(0, me * rows, rows)});
  }
  at::Tensor total = at::zeros({}, at::kDouble);
  if (swap_) {
    total += swap_->evaluate(local_batches(mine)) * static_cast<double>(mine.size());
  } else if (pipeline_) {
    parallel_->owner().begin_pass();
    total += pipeline_->evaluate(local_batches(mine)) * static_cast<double>(mine.size());
    parallel_->owner().end_pass();
  } else {
    torch::NoGradGuard no_grad;
    TransformerLM& model = parallel_->model();
    model->eval();
    for (const Batch& batch : mine) {
      AutocastGuard guard(device_.type(), autocast_.value_or(at::kFloat), autocast_.has_value());
      total += model->forward(parallel_->local_tokens(batch.inputs).to(device_),
                              parallel_->local_tokens(batch.targets).to(device_))
                   .ce_loss.detach()
                   .to(at::kCPU, at::kDouble);
    }
    model->train();
  }
  parallel_->average_over_replicas(total);
  return total.item<double>() / static_cast<double>(batches.size());
}

}  // namespace tessera
