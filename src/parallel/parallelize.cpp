// parallelize(): the ordered construction of a parallel model, and its data and random streams
// (parallelize.h); its layout-free state is in parallel_model_state.cpp, its MoE statistics in
// parallel_model_moe.cpp.
#include "parallel/parallelize.h"

#include <algorithm>

#include <ATen/ATen.h>

#include "core/error.h"
#include "core/random_streams.h"
#include "core/splitmix.h"
#include "memory/activation_offload.h"
#include "memory/storage.h"
#include "memory/swap/swap_owner.h"
#include "model/init.h"
#include "parallel/data/data_parallel.h"
#include "parallel/expert/expert_parallel.h"
#include "parallel/layout_check.h"
#include "parallel/local_optimizer.h"
#include "parallel/pipeline_step.h"
#include "parallel/plain_step.h"
#include "parallel/sequence/sequence_parallel.h"
#include "parallel/tensor/gradient_shares.h"
#include "parallel/swap_step.h"
#include "plan/activation_estimate.h"
#include "plan/swap_cut.h"
#include "precision/autocast.h"

namespace tessera {
ParallelModel::ParallelModel(TransformerLM model, comm::Mesh* mesh, const Config& config, const Layout& layout,
                             c10::Device device, uint64_t init_seed)
    : config_(config), layout_(layout), model_(std::move(model)), mesh_(mesh), device_(device) {
  require(model_->is_meta(), "internal: parallelize() takes a model built on the meta device");
  require(mesh_ || !config.parallel.offload, "parallel.offload = true needs a process mesh (tessera train)");
  if (mesh_) check_parallel_layout(config, mesh_->dims());
  const ParallelDims* dims = mesh_ ? &mesh_->dims() : nullptr;
  // 0. Random streams: masks agree where activations are replicated over tp and differ elsewhere.
  const MeshCoord coord = mesh_ ? mesh_->coord() : MeshCoord{};
  replica_ = dims ? (coord.pp * dims->dp() + coord.dp) * dims->sp() + coord.sp : 0;
  tp_rank_ = coord.tp;
  seed_random_streams(0);
  if (dims && dims->tp() > 1) {
    DropoutStreams streams;
    streams.attention = random::Stream::model_parallel;
    if (config.parallel.megatron_sp) streams.residual = random::Stream::model_parallel;
    model_->set_dropout_streams(streams);
  }
  // 1. Tensor parallelism: the meta model's linears and heads become this rank's shards (materialised below).
  ModelParallelNorm norm;
  GradientShares shares;
  if (dims && dims->tp() > 1) {
    tp_ = &mesh_->group("tp");
    // Key/value heads fewer than tp ranks: each held by a few consecutive ones, whose gradients
    // are summed among only them.
    const std::vector<int64_t> kv_ranks = kv_replica_ranks(model_, *tp_);
    if (!kv_ranks.empty()) {
      std::string name = "tp_kv";
      for (int64_t r : kv_ranks) name += "/" + std::to_string(r);
      kv_replicas_ = mesh_->new_group(name, kv_ranks);
    }
    parallelize_tensor(model_, *tp_, config.parallel.megatron_sp);
    shares = gradient_shares(model_, *tp_, config.parallel.megatron_sp, kv_replicas_.get());
    norm.groups.push_back(tp_);
    // The clipping norm sums the squares over tp: a tensor every rank holds counts 1/tp per rank,
    // a chunk held by several (replicated key/value heads) 1/replicas.
    for (const auto& [name, spec] : model_->parameter_specs()) {
      const TensorParallelLayout layout = tensor_parallel_layout(spec, tp_->size());
      if (layout.dim < 0) norm.weight[name] = 1.0 / static_cast<double>(tp_->size());
      else if (layout.replicas > 1) norm.weight[name] = 1.0 / static_cast<double>(layout.replicas);
    }
  }
  // 2. Sequence parallelism on each rank's (tensor-parallel) heads.
  if (dims && dims->sp() > 1) {
    sp_ = dims->sp();
    sp_rank_ = mesh_->coord().sp;
    apply_sequence_parallel(model_, mesh_->group("sp"), config.parallel.sp_method);
  }
  // 3. Pipeline stages: each rank built its stages of the layout's cut (train/train_step.h); the
  // clipping norm is summed over the stages, the last stage's copy of the tied embedding counted
  // zero times (its gradient equals the first stage's once summed).
  if (layout_.pipelined()) {
    pp_ = &mesh_->group("pp");
    norm.groups.push_back(pp_);
    if (model_->has_head() && !model_->has_embedding())
      for (const auto& [name, spec] : model_->parameter_specs())
        if (spec.tied) norm.weight[name] = 0.0;
  }
  // 3b. Expert parallelism: this rank's experts, tokens dispatched to theirs.
  if (dims && dims->ep() > 1) {
    ep_ = &mesh_->group("ep");
    apply_expert_parallel(model_, *ep_, expert_dispatch(config.parallel, *ep_));
  }
  // 3c. model.moe_aux_scope = global: the balance loss counts the loads of every data- and
  // sequence-parallel rank's tokens of the micro-batch (tp ranks route the same tokens: not again).
  if (dims && dims->dp() * dims->sp() > 1 && config.model.moe_aux_scope == "global") {
    comm::Group& routing = mesh_->group("dp_sp");
    for (int64_t layer : model_->layers())
      if (MoE moe = model_->block(layer)->moe)
        moe->set_balance_count_sum([&routing](at::Tensor& counts) { routing.all_reduce(counts); });
  }
  placement_ = std::make_unique<ParameterPlacement>(model_, layout_, tp_, pp_, ep_);
  // The parameters, this rank's parts only, on their device (in host memory under memory.swap);
  // under ZeRO-3 DataParallel materialises them unit by unit, already sharded (step 5).
  const InitialValues initial = initial_values(at::TensorOptions()
                                                   .device(config.memory.swap ? c10::Device(at::kCPU) : device)
                                                   .dtype(parameter_dtype(config.precision)),
                                               init_seed);
  const bool data_parallel = !layout_.swapped() && dims && (dims->dp() * sp_ > 1 || config.parallel.offload);
  const bool zero3_from_meta = data_parallel && config.parallel.zero_stage == 3;
  if (!zero3_from_meta) materialize(initial);
  // 4. Activation checkpointing, compression and offload inside every block.
  model_->set_activation_checkpointing(config.memory.activation_checkpointing);
  if (config.memory.activation_compression == "adaptive") {
    model_->set_adaptive_activation_codecs(std::make_shared<AdaptiveCodecs>(config.memory.activation_bits));
  } else {
    model_->set_activation_compression(activation_codec_name(applied_activation_codec(config)));
    model_->set_attention_compression(config.memory.attention_compression);
  }
  // One offload (its two copy streams) for every block and micro-batch that offloads.
  std::shared_ptr<ActivationOffload> offload;
  const ActivationPolicy* policy = layout_.activation_policy(pp_ ? pp_->rank() : 0);
  const int64_t resident_micro_batches =
      policy ? policy->resident_micro_batches : config.memory.resident_micro_batches;
  if (config.memory.activation_offload > 0 || resident_micro_batches > 0 || (policy && policy->offloaded() > 0))
    offload = std::make_shared<ActivationOffload>(device, config.memory.modelled_bandwidth_gbps * 1e9);
  if (config.memory.activation_offload > 0) model_->set_activation_offload(config.memory.activation_offload, offload);
  // memory.activation_policy = auto: this pipeline rank's choice for its blocks.
  if (policy) {
    for (int64_t layer : model_->layers()) {
      const ActivationOption& chosen = policy->of(layer);
      model_->block(layer)->set_checkpoint_mode(parse_checkpoint_mode(chosen.checkpointing));
      model_->block(layer)->set_activation_offload(chosen.offload ? offload : nullptr);
      model_->block(layer)->set_activation_codec(parse_activation_codec(chosen.compression));
    }
  }
  // 5. The optimizer owner. Gradients are averaged over every rank holding a replica of the
  // parameters: the dp ranks, and with sequence parallelism also the sp ranks (each saw a
  // different chunk of the same sequences). ZeRO-Offload is DataParallel's, so it runs through it
  // on one rank as well.
  const std::optional<at::ScalarType> autocast = autocast_dtype(config.precision);
  require(layout_.swapped() == config.memory.swap, "internal: memory.swap = ", config.memory.swap ? "true" : "false",
          " with a layout ", layout_.swapped() ? "that swaps" : "made without the swap costs (plan/layout.h, measure_layout)");
  if (layout_.swapped()) {
    // ATOM: the training state in host memory, the step run by the swap plan (parallel/swap_step.h).
    NamedParams named;
    std::vector<int64_t> blocks;  // each parameter's block, -1 for the ends
    for (const auto& item : model_->named_parameters()) {
      named.emplace_back(item.key(), item.value());
      blocks.push_back(model_->parameter_specs().at(item.key()).block);
    }
    if (dims && dims->dp() > 1) replicas_ = &mesh_->group("dp");  // swapped replicas reduce from the host
    auto owner = std::make_unique<SwapOwner>(named, blocks, layout_.swap_plan().boundaries(), config.optim, device,
                                             config.memory.modelled_bandwidth_gbps * 1e9, replicas_,
                                             config.memory.swap_bf16_copies(config.precision.dtype));
    // The adaptive codecs' probe: rank 0 of the replicas, its table broadcast over them.
    SwapStepOptions step{config.optim.grad_clip, swap_host_memory(config, layout_.swap_plan()).total(), {}};
    step.probing.replicas = replicas_;
    step.probing.every = config.memory.activation_probe_every;
    runner_ = std::make_unique<SwapStep>(model_, *owner, step, device, autocast, layout_.swap_plan());
    holder_ = owner.get();
    owner_ = std::move(owner);
    return;
  }
  // The adaptive codecs' probe counts its errors as the clipping norm counts gradients (copied
  // before the owner takes them).
  ActivationProbing probing;
  probing.every = config.memory.activation_probe_every;
  probing.norm = norm;
  probing.shares = shares;
  probing.input_weight = tp_ && !config.parallel.megatron_sp ? 1.0 / static_cast<double>(tp_->size()) : 1.0;
  std::unique_ptr<ResidentOwner> owner;
  if (data_parallel) {
    replicas_ = &mesh_->group(layout_.replica_group());
    comm::Group& expert_replicas = mesh_->group(layout_.expert_replica_group());  // replicas_ itself while ep = 1
    owner = std::make_unique<DataParallel>(model_, ReductionGroups(*replicas_, &expert_replicas), config.parallel,
                                           config.optim, std::move(norm), std::move(shares),
                                           zero3_from_meta ? &initial : nullptr);
  } else {
    NamedParams named;
    for (const auto& item : model_->named_parameters()) named.emplace_back(item.key(), item.value());
    auto local = std::make_unique<LocalOptimizer>(named, config.optim, config.precision, named.front().second.device(),
                                                  std::move(norm), std::move(shares));
    holder_ = local.get();
    owner = std::move(local);
  }
  // The replicas the table is broadcast over: under sequence parallelism the dp ranks only (the
  // sp group probes together, as the tp, pp and ep groups do).
  // Under expert parallelism the expert replicas (edp: one rank of each ep group).
  probing.replicas = ep_                ? &mesh_->group("edp")
                     : sp_ > 1 ? (dims->dp() > 1 ? &mesh_->group("dp") : nullptr)
                               : replicas_;
  probing.experts = ep_;
  probing.tensor = tp_;
  if (sp_ > 1) probing.sequence = &mesh_->group("sp");
  // model.moe_aux_scope = global: the balance counts are summed over dp_sp, so every rank of it
  // probes its own micro-batch, their micro-batches one (what one process would probe), as the sp
  // group's chunks are one sequence.
  if (config.model.ffn == "moe" && config.model.moe_aux_scope == "global" && dims && dims->dp() * sp_ > 1) {
    probing.sequence = &mesh_->group("dp_sp");
    probing.replicas = nullptr;
  }
  probing.pipeline = pp_;
  if (layout_.pipelined()) {
    // A fully recomputed block (by the key, or the policy's choice for one of this rank's blocks)
    // accumulates its parameters' gradients inside a split backward's I.
    bool full_recomputation = config.memory.activation_checkpointing == "full";
    if (policy)
      for (const ActivationOption& o : policy->blocks) full_recomputation = full_recomputation || o.checkpointing == "full";
    runner_ = std::make_unique<PipelineStep>(
        model_, *owner, *mesh_, config.parallel, layout_,
        PipelineStepOptions{config.train.accumulation(dims->dp()), config.optim.grad_clip, full_recomputation,
                            resident_micro_batches, offload, std::move(probing)},
        device, autocast);
  } else {
    runner_ = std::make_unique<PlainStep>(model_, *owner, device, autocast, config.optim.grad_clip, std::move(probing));
  }
  owner_ = std::move(owner);
}

ParallelModel::~ParallelModel() = default;

void ParallelModel::seed_random_streams(int64_t step) {
  const uint64_t seed = splitmix64(static_cast<uint64_t>(config_.train.seed) + static_cast<uint64_t>(step));
  random::seed_streams(seed, replica_, tp_rank_, device_.is_cuda() ? std::optional<at::Device>(device_) : std::nullopt);
}

InitialValues ParallelModel::initial_values(const at::TensorOptions& where, uint64_t seed) const {
  InitialValues initial;
  initial.where = where;
  initial.of = [this, where, seed](const std::string& name) {
    const at::Tensor value =
        initial_value(model_->parameter_specs().at(name).init, name, placement_->whole_shape(name), seed);
    return placement_->part(name, value).to(where).contiguous();
  };
  return initial;
}

void ParallelModel::materialize(const InitialValues& initial) {
  at::NoGradGuard no_grad;
  for (auto& item : model_->named_parameters()) materialize_meta_parameter(item.value(), initial.of(item.key()));
}

std::unique_ptr<ParallelModel> parallelize(TransformerLM model, comm::Mesh* mesh, const Config& config,
                                           const Layout& layout, c10::Device device, uint64_t init_seed) {
  return std::unique_ptr<ParallelModel>(new ParallelModel(std::move(model), mesh, config, layout, device, init_seed));
}

at::Tensor ParallelModel::local_tokens(const at::Tensor& tokens) {
  if (sp_ == 1) return tokens;
  const int64_t length = tokens.size(1) / sp_;
  require(length * sp_ == tokens.size(1), "internal: a batch of ", tokens.size(1), " tokens per row for parallel.sp = ",
          sp_);
  model_->set_position_offset(sp_rank_ * length);
  return tokens.narrow(1, sp_rank_ * length, length);
}

int64_t ParallelModel::data_ranks() const { return replicas_ ? mesh_->dims().dp() : 1; }
int64_t ParallelModel::data_rank() const { return replicas_ ? mesh_->coord().dp : 0; }

void ParallelModel::average_over_replicas(at::Tensor& values) {
  if (replicas_) replicas_->all_reduce(values, comm::ReduceOp::avg);
}

}  // namespace tessera
