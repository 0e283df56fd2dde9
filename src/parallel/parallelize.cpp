// The layout validator, parallelize() and the layout-free state of a parallel model
// (parallelize.h).
#include "parallel/parallelize.h"

#include <algorithm>
#include <tuple>

#include <torch/torch.h>

#include "core/error.h"
#include "core/random_streams.h"
#include "core/splitmix.h"
#include "memory/storage.h"
#include "memory/swap/swap_owner.h"
#include "model/hf_names.h"
#include "model/init.h"
#include "parallel/data/data_parallel.h"
#include "parallel/expert/expert_parallel.h"
#include "parallel/local_optimizer.h"
#include "parallel/pipeline_step.h"
#include "parallel/plain_step.h"
#include "parallel/sequence/sequence_parallel.h"
#include "parallel/swap_step.h"
#include "precision/autocast.h"

namespace tessera {
void check_parallel_layout(const Config& config, const ParallelDims& d) {
  if (d.world_size() > 1) comm::choose_backend(config.parallel.backend, c10::Device(config.train.device));
  check_layout_options(config, d);
  require(!config.memory.swap || d.dp() == 1 || !c10::Device(config.train.device).is_cuda(),
          "memory.swap = true with parallel.dp = ", d.dp(), " on ", config.train.device, ": the replicas average "
          "their gradients in host memory, which needs a Gloo group beside NCCL's; not implemented yet (dp of "
          "swapped replicas runs on CPU devices)");
  if (d.pp() > 1) {
    // What a pipeline cannot train with in this build (inspect still plans it).
    const ParallelOptions& p = config.parallel;
    require(config.precision.dtype != "fp16", "precision.dtype = \"fp16\" with parallel.pp > 1: the loss scaler's "
            "overflow check would have to span every stage; use bf16 or fp32");
    require(!p.zero3_reshard_per_microbatch || d.dp() * d.sp() > 1 || p.offload,
            "parallel.zero3_reshard_per_microbatch = true with one data-parallel replica per stage (", d.describe(),
            ") and no offload: ZeRO-3 has no replicas to shard the parameters over; leave it false");
    require(p.grad_compression == "none", "parallel.pp > 1 with parallel.grad_compression = ", p.grad_compression,
            ": not implemented yet (the compressors' state is kept over one data-parallel group per model); use none");
  }
}

void check_layout_options(const Config& config, const ParallelDims& d) {
  check_expert_parallel(config, d);
  make_layout(config, d);  // the cut (no stage without a block) and the schedule for the step's micro-batches
  if (config.precision.dtype == "fp16") {
    require(d.dp() * d.sp() * d.tp() == 1, "precision.dtype = \"fp16\" with ", d.describe(),
            ": fp16 master weights and loss scaling are kept by the one-process optimizer only (the data-parallel "
            "shards and the tensor-parallel overflow check would need their own); use bf16 or fp32");
    require(!config.parallel.offload, "precision.dtype = \"fp16\" with parallel.offload = true: ZeRO-Offload's host "
            "optimizer keeps no fp16 master weights or loss scaler; use bf16 or fp32, or parallel.offload = false");
  }
  if (config.memory.swap) {
    // The swap engine trains data-parallel replicas of a whole model, each on one device (docs/swap.md).
    const MemoryOptions& m = config.memory;
    require(d.world_size() == d.dp(), "memory.swap = true with ", d.describe(), ": the swap engine trains "
            "data-parallel replicas (parallel.dp) only; swapping with tp, pp, sp or ep is not implemented yet");
    require(config.parallel.zero_stage == 0 && !config.parallel.offload, "memory.swap = true with parallel.zero_stage = ",
            config.parallel.zero_stage, config.parallel.offload ? " and parallel.offload = true" : "",
            ": swapping keeps the whole training state in host memory itself; set zero_stage = 0 and offload = false");
    require(config.precision.dtype != "fp16", "memory.swap = true with precision.dtype = \"fp16\": the host optimizer "
            "keeps no fp16 loss scaler; use bf16 or fp32");
    require(m.swap_copies != "bf16" || config.precision.dtype == "bf16", "memory.swap_copies = \"bf16\" with "
            "precision.dtype = \"", config.precision.dtype, "\": bf16 copies would round an fp32 run's weights; use "
            "precision.dtype = \"bf16\" or memory.swap_copies = \"auto\"");
    int64_t blocks = 0;
    for (int64_t b : m.swap_blocks) blocks += b;
    require(m.swap_blocks.empty() || blocks == config.model.n_layer, "memory.swap_blocks sums to ", blocks,
            " blocks, but model.n_layer = ", config.model.n_layer);
  }
  check_tensor_parallel(config.model, config.parallel, d, config.train.seq_len, config.optim.name);
  check_sequence_parallel(config.model, config.parallel, d, config.train.seq_len);
  check_data_parallel(config.parallel, config.optim);
}

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
  // 1. Tensor parallelism: every tp rank built the same model (same seed) and keeps its shards.
  ModelParallelNorm norm;
  if (dims && dims->tp() > 1) {
    tp_ = &mesh_->group("tp");
    parallelize_tensor(model_, *tp_, config.parallel.megatron_sp);
    norm.groups.push_back(tp_);
    for (const auto& [name, spec] : model_->parameter_specs())
      if (tensor_parallel_layout(spec).dim < 0) norm.weight[name] = 1.0 / static_cast<double>(tp_->size());
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
    apply_expert_parallel(model_, *ep_);
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
  // 4. Activation checkpointing inside every block.
  model_->set_activation_checkpointing(config.memory.activation_checkpointing);
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
    runner_ = std::make_unique<SwapStep>(model_, *owner, config, device, autocast, layout_.swap_plan());
    holder_ = owner.get();
    owner_ = std::move(owner);
    return;
  }
  std::unique_ptr<ResidentOwner> owner;
  if (data_parallel) {
    replicas_ = &mesh_->group(layout_.replica_group());
    comm::Group& expert_replicas = mesh_->group(layout_.expert_replica_group());  // replicas_ itself while ep = 1
    owner = std::make_unique<DataParallel>(model_, ReductionGroups(*replicas_, &expert_replicas), config.parallel,
                                           config.optim, std::move(norm), zero3_from_meta ? &initial : nullptr);
  } else {
    NamedParams named;
    for (const auto& item : model_->named_parameters()) named.emplace_back(item.key(), item.value());
    auto local = std::make_unique<LocalOptimizer>(named, config.optim, config.precision, named.front().second.device(),
                                                  std::move(norm));
    holder_ = local.get();
    owner = std::move(local);
  }
  if (layout_.pipelined())
    runner_ = std::make_unique<PipelineStep>(model_, *owner, *mesh_, config, layout_, device, autocast);
  else
    runner_ = std::make_unique<PlainStep>(model_, *owner, device, autocast, config.optim.grad_clip);
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

void ParallelModel::average_over_replicas(at::Tensor& values) {
  if (replicas_) replicas_->all_reduce(values, comm::ReduceOp::avg);
}

void ParallelModel::reset_moe_statistics() {
  for (int64_t layer : model_->layers())
    if (MoE moe = model_->block(layer)->moe) moe->reset_statistics();
}

std::vector<MoELayerStatistics> ParallelModel::moe_statistics() {
  const ModelOptions& o = model_->options();
  std::vector<int64_t> layers;  // the whole model's MoE layers
  for (int64_t l = 0; l < o.n_layer; ++l)
    if (o.is_moe_block(l)) layers.push_back(l);
  if (layers.empty()) return {};
  // One row per layer: load [E], kept [E], tokens, forwards, balance loss, z-loss (sums).
  const int64_t E = o.moe_experts;
  at::Tensor table = at::zeros({static_cast<int64_t>(layers.size()), 2 * E + 4}, at::kDouble);
  const std::vector<int64_t>& held = model_->layers();
  for (size_t i = 0; i < layers.size() && tp_rank_ == 0; ++i) {
    if (std::find(held.begin(), held.end(), layers[i]) == held.end()) continue;
    const MoEStatistics& s = model_->block(layers[i])->moe->statistics();
    if (s.forwards == 0) continue;
    at::Tensor row = table[static_cast<int64_t>(i)];
    row.narrow(0, 0, E).copy_(s.assigned);
    row.narrow(0, E, E).copy_(s.kept);
    row[2 * E] = static_cast<double>(s.tokens);
    row[2 * E + 1] = static_cast<double>(s.forwards);
    row[2 * E + 2] = s.balance_loss.item<double>();
    row[2 * E + 3] = s.z_loss.item<double>();
  }
  if (mesh_ && mesh_->world_size() > 1) {
    at::Tensor summed = table.to(mesh_->world().device());
    mesh_->world().all_reduce(summed);
    table = summed.cpu();
  }
  std::vector<MoELayerStatistics> out;
  for (size_t i = 0; i < layers.size(); ++i) {
    const at::Tensor row = table[static_cast<int64_t>(i)].contiguous();
    const double* v = row.data_ptr<double>();
    MoELayerStatistics s;
    s.layer = layers[i];
    s.load.assign(v, v + E);
    s.kept.assign(v + E, v + 2 * E);
    s.tokens = v[2 * E];
    s.forwards = v[2 * E + 1];
    s.balance_loss = s.forwards > 0 ? v[2 * E + 2] / s.forwards : 0.0;
    s.z_loss = s.forwards > 0 ? v[2 * E + 3] / s.forwards : 0.0;
    s.top_k = o.moe_top_k;
    out.push_back(std::move(s));
  }
  return out;
}

void ParallelModel::balance_experts(const std::vector<MoELayerStatistics>& step) {
  const double rate = model_->options().moe_bias_update_rate;
  if (rate == 0) return;
  const std::vector<int64_t>& held = model_->layers();
  for (const MoELayerStatistics& s : step)
    if (std::find(held.begin(), held.end(), s.layer) != held.end())
      model_->block(s.layer)->moe->update_selection_bias(s.load, rate);
}

NamedTensors ParallelModel::routing_state() const {
  NamedTensors out;
  for (int64_t layer : model_->layers())
    if (MoE moe = model_->block(layer)->moe)
      if (moe->selection_bias().defined())
        out.emplace_back("moe.h." + std::to_string(layer) + ".selection_bias", moe->selection_bias().clone());
  return out;
}

void ParallelModel::load_routing_state(const std::map<std::string, at::Tensor>& tensors) {
  for (int64_t layer : model_->layers())
    if (MoE moe = model_->block(layer)->moe) {
      const auto it = tensors.find("moe.h." + std::to_string(layer) + ".selection_bias");
      if (it != tensors.end()) moe->set_selection_bias(it->second);
    }
}

int64_t ParallelModel::data_ranks() const { return replicas_ ? mesh_->dims().dp() : 1; }
int64_t ParallelModel::data_rank() const { return replicas_ ? mesh_->coord().dp : 0; }

NamedTensors ParallelModel::model_state() {
  // This stage's parameters whole (ZeRO-3 gathers them unit by unit), then over the stages.
  auto params = model_->named_parameters();
  std::map<std::string, at::Tensor> mine;
  NamedTensors out;
  owner_->visit_full_parameters([&](const std::vector<std::string>& names) {
    for (const std::string& name : names) {
      if (pp_) mine[name] = placement_->whole(name, params[name].detach().clone());
      else out.push_back(export_tensor(model_->options(), name, placement_->whole(name, params[name].detach())));
    }
  });
  if (!pp_) return out;
  for (const auto& [name, t] : placement_->over_stages([&](const std::string& n) { return mine.at(n); }))
    out.push_back(export_tensor(model_->options(), name, t));
  return out;
}

void ParallelModel::add_pieces(std::vector<Piece>& pieces, const Region& region, comm::Group* over) {
  for (int64_t r = 0; r < (over ? over->size() : 1); ++r) pieces.push_back({region.part_numel(), over, over ? r : -1});
}

bool ParallelModel::holds(const Piece& piece) const {
  return !piece.over || piece.over->rank() == piece.index;
}

std::vector<int64_t> ParallelModel::writers(const std::vector<Piece>& pieces) const {
  // The ranks holding this stage (every rank without pp) and their coordinates in tp and ep.
  struct Holder {
    int64_t rank, tp, ep;
  };
  std::vector<Holder> ranks;
  if (!mesh_) ranks.push_back({0, 0, 0});
  else
    for (int64_t r = 0; r < mesh_->world_size(); ++r) {
      const MeshCoord c = mesh_->dims().coord(r);
      if (c.pp == mesh_->coord().pp) ranks.push_back({r, c.tp, c.dp % mesh_->dims().ep()});
    }
  std::vector<int64_t> load(ranks.size(), 0), out;
  for (const Piece& piece : pieces) {
    size_t least = ranks.size();
    for (size_t i = 0; i < ranks.size(); ++i) {
      const int64_t coordinate = piece.over == tp_ ? ranks[i].tp : ranks[i].ep;
      if ((!piece.over || coordinate == piece.index) && (least == ranks.size() || load[i] < load[least])) least = i;
    }
    load[least] += piece.numel;
    out.push_back(ranks[least].rank);
  }
  return out;
}

std::vector<TensorSlice> ParallelModel::model_state_shard() {
  // Each written tensor whole, or under tp and ep each rank's part, to one of the ranks holding it.
  const int64_t me = mesh_ ? mesh_->rank() : 0;
  std::vector<Piece> pieces;
  std::vector<std::string> which;  // per piece, its parameter
  for (const auto& item : model_->named_parameters()) {
    if (!placement_->writes(item.key())) continue;
    add_pieces(pieces, placement_->part_region(item.key()), placement_->split_group(item.key()));
    which.resize(pieces.size(), item.key());
  }
  const std::vector<int64_t> writer = writers(pieces);
  std::set<std::string> mine;
  for (size_t i = 0; i < which.size(); ++i)
    if (writer[i] == me && holds(pieces[i])) mine.insert(which[i]);
  auto params = model_->named_parameters();
  std::vector<TensorSlice> out;
  at::NoGradGuard no_grad;
  owner_->visit_full_parameters([&](const std::vector<std::string>& names) {
    for (const std::string& name : names) {
      if (!mine.count(name)) continue;
      auto [stored, values] = export_tensor(model_->options(), name, params[name]);
      out.push_back({stored, values, export_region(model_->options(), name, placement_->part_region(name))});
    }
  });
  return out;
}

void ParallelModel::load_model_state(const ModelReader& reader) {
  std::vector<std::string> params;
  for (const auto& [name, shape] : placement_->whole_shapes()) params.push_back(name);
  check_export_names(config_.model, params, reader.names, reader.source);
  // Under pp this stage's parameters only (the last stage's wte from the one tied embedding).
  auto mine = model_->named_parameters();
  const ModelOptions& options = model_->options();
  for (const auto& [name, shape] : placement_->whole_shapes()) {
    if ((pp_ && !mine.contains(name)) || !owner_->keeps_part_of(name)) continue;
    const std::string stored = export_name(options, name);
    const Region part = placement_->part_region(name), want = export_region(options, name, part);
    const std::vector<int64_t> stored_shape = reader.shape(stored);
    if (stored_shape == want.shape) {
      // This rank's part alone, from the pieces holding it.
      const at::Tensor values = reader.read(stored, want).view(want.part_shape());
      owner_->load_parameter(name, import_tensor(options, name, values, part.part_shape(), reader.source));
    } else {
      // Another shape (an embedding without the padded rows, or one import_tensor refuses by name):
      // read whole and cut.
      const at::Tensor whole = reader.read(stored, Region::whole(stored_shape)).view(stored_shape);
      owner_->load_parameter(name, placement_->part(name, import_tensor(options, name, whole, shape, reader.source)));
    }
  }
  owner_->parameters_loaded();
}

NamedTensors ParallelModel::gradients() {
  NamedTensors grads = owner_->gradients();
  auto params = model_->named_parameters();
  for (auto& [name, g] : grads) g = placement_->whole(name, g.defined() ? g : at::zeros_like(params[name]));
  if (!pp_) return grads;
  const std::map<std::string, at::Tensor> mine(grads.begin(), grads.end());
  return placement_->over_stages([&](const std::string& name) { return mine.at(name); });
}

NamedTensors ParallelModel::training_state() {
  NamedTensors state = owner_->training_state();
  for (auto& [name, t] : state) t = placement_->state_whole(name, t);
  for (auto& entry : routing_state()) state.push_back(std::move(entry));
  return state;
}

void ParallelModel::load_training_state(const std::map<std::string, at::Tensor>& tensors, const std::string& source) {
  load_routing_state(tensors);
  // Under pp the state of this stage's parameters (and any of no parameter, replicated).
  std::map<std::string, at::Tensor> local;
  for (const auto& [name, t] : tensors)
    if (placement_->keeps_state(name)) local.emplace(name, t);
  // This rank's regions come 1-D (an owner taking whole tensors gets its tensor-parallel part in
  // its shape); whole tensors are cut to this rank's part.
  const bool ranged = !owner_->training_state_ranges().empty();
  const OptimizerRanges ranges = training_state_ranges();
  for (auto& [name, t] : local) {
    const auto range = ranges.find(name);
    if (range == ranges.end()) t = placement_->state_part(name, t);
    else if (!ranged && t.numel() == range->second.numel()) t = t.view(range->second.part_shape());
  }
  if (ranged) return owner_->load_training_state_ranges(local, source);
  owner_->load_training_state(local, source);
}

OptimizerRanges ParallelModel::training_state_ranges() const {
  OptimizerRanges own = owner_->training_state_ranges();
  if (!tp_ && !ep_) return own;
  // Under tp or ep each split state tensor's part of the whole: the owner's ZeRO ranges of it, or
  // (an owner holding its state whole) all of it.
  if (own.empty())
    for (const auto& [name, t] : owner_->training_state()) own[name] = Region::whole(t.sizes().vec());
  OptimizerRanges out;
  for (const auto& [name, range] : own) {
    const Region region = placement_->state_region(name, range);
    if (!region.is_whole()) out[name] = region;
  }
  return out;
}

std::vector<TensorSlice> ParallelModel::training_state_slices() {
  std::vector<TensorSlice> out;
  const MeshCoord c = mesh_ ? mesh_->coord() : MeshCoord{};
  if (c.dp == 0 && c.sp == 0 && c.tp == 0)
    for (auto& [name, t] : routing_state()) out.push_back({name, t, Region::whole(t.sizes().vec())});
  for (TensorSlice& slice : state_slices()) out.push_back(std::move(slice));
  return out;
}

std::vector<TensorSlice> ParallelModel::state_slices() {
  // Under pp the ranks holding a stage share out its state, the tied embedding's by the first stage.
  auto written = [&](const std::string& name) { return placement_->writes_state(name); };
  // The owner's own slices (its ZeRO ranges, or its even slice at stage 0), which cover its state
  // over the data-parallel replicas; under tp each is a range of this rank's part, and a tensor
  // not split (the same on every tp rank) is written by tp rank 0.
  if (std::optional<std::vector<TensorSlice>> own = owner_->own_training_state_slices()) {
    std::vector<TensorSlice> out;
    for (TensorSlice& slice : *own) {
      if (!written(slice.name)) continue;
      // A tensor the same on every tp rank is written by tp rank 0, and an expert's tensor that is
      // not split (its step, a scalar) by ep rank 0.
      comm::Group* const cut = placement_->state_split_group(slice.name, slice.region.shape);
      const std::string param = placement_->parameter_of(slice.name);
      if (cut != tp_ && tp_rank_ != 0) continue;
      if (ep_ && cut != ep_ && !param.empty() && placement_->split_group(param) == ep_ && ep_->rank() != 0) continue;
      slice.region = placement_->state_region(slice.name, slice.region);
      out.push_back(std::move(slice));
    }
    return out;
  }
  // Otherwise the owner's state, whole over the data replicas (a collective where it is sharded):
  // each tensor, or under tp or ep each rank's part of a split one, written by one rank holding it.
  NamedTensors local = owner_->training_state();
  local.erase(std::remove_if(local.begin(), local.end(), [&](const auto& item) { return !written(item.first); }),
              local.end());
  const int64_t me = mesh_ ? mesh_->rank() : 0;
  std::vector<Piece> pieces;
  std::vector<size_t> which;  // per piece, its index in local
  for (size_t i = 0; i < local.size(); ++i) {
    const std::vector<int64_t> shape = local[i].second.sizes().vec();
    add_pieces(pieces, placement_->state_region(local[i].first, shape),
               placement_->state_split_group(local[i].first, shape));
    which.resize(pieces.size(), i);
  }
  const std::vector<int64_t> writer = writers(pieces);
  std::vector<TensorSlice> mine;
  for (size_t k = 0; k < which.size(); ++k) {
    if (writer[k] != me || !holds(pieces[k])) continue;
    const auto& [name, t] = local[which[k]];
    mine.push_back({name, t, placement_->state_region(name, t.sizes().vec())});
  }
  return mine;
}

}  // namespace tessera
