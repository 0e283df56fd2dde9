#include "train/train_step.h"

#include <malloc.h>

#include <cmath>

#include <ATen/ATen.h>
#include <torch/torch.h>

#include "comm/device.h"
#include "core/error.h"
#include "model/hf_names.h"
#include "optim/clipping.h"
#include "parallel/data/data_parallel.h"
#include "parallel/sequence/lasp.h"
#include "parallel/sequence/softmax_attention_sp.h"
#include "parallel/tensor/parallelize.h"
#include "precision/autocast.h"

namespace tessera {
namespace {

void append_prefixed(NamedTensors& out, const std::string& prefix, const NamedTensors& in) {
  for (const auto& [name, t] : in) out.emplace_back(prefix + name, t);
}

std::map<std::string, at::Tensor> with_prefix(const std::map<std::string, at::Tensor>& all, const std::string& prefix) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, t] : all)
    if (name.rfind(prefix, 0) == 0) out.emplace(name.substr(prefix.size()), t);
  return out;
}

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

void check_parallel_layout(const Config& config, const ParallelDims& d) {
  if (d.world_size() > 1) comm::choose_backend(config.parallel.backend, c10::Device(config.train.device));
  const std::pair<const char*, int64_t> unbuilt[] = {{"pp", d.pp()}, {"ep", d.ep()}};
  for (const auto& [key, degree] : unbuilt)
    require(degree == 1, "parallel.", key, " = ", degree,
            ": this build runs data, tensor and sequence parallelism only (parallel.dp, tp, sp); ", key,
            " is not implemented yet");
  require(d.dp() * d.sp() * d.tp() == 1 || config.precision.dtype != "fp16", "precision.dtype = \"fp16\" with ",
          d.describe(), ": fp16 master weights are not combined with parallelism yet; use bf16 or fp32");
  if (d.tp() > 1) {
    const ModelOptions& m = config.model;
    const ParallelOptions& p = config.parallel;
    require(d.sp() == 1 || !p.megatron_sp, "parallel.megatron_sp with parallel.sp = ", d.sp(),
            ": Megatron sequence parallelism splits the sequence inside the tp group, parallel.sp across groups; "
            "use one of them");
    require(p.zero_stage <= 1 && !p.offload && config.optim.name == "adamw", "parallel.tp = ", d.tp(),
            " runs with parallel.zero_stage 0 or 1, no parallel.offload and optim.name = adamw (got zero_stage ",
            p.zero_stage, ", offload ", p.offload, ", optim.name ", config.optim.name, ")");
    require(m.ffn == "dense", "parallel.tp = ", d.tp(), " with model.ffn = ", m.ffn, ": only dense MLPs are split");
    require(m.dropout == 0, "model.dropout = ", m.dropout, " with parallel.tp = ", d.tp(),
            ": tensor-parallel ranks have no separate random streams; set model.dropout = 0");
    require(m.n_head % d.tp() == 0, "model.n_head = ", m.n_head, " is not a multiple of parallel.tp = ", d.tp());
    require(m.vocab_size % d.tp() == 0, "model.vocab_size = ", m.vocab_size, " is not a multiple of parallel.tp = ",
            d.tp());
    require(!p.megatron_sp || config.train.seq_len % d.tp() == 0, "train.seq_len = ", config.train.seq_len,
            " is not a multiple of parallel.tp = ", d.tp(), " (parallel.megatron_sp splits the sequence)");
  }
  if (d.sp() == 1) return;
  require(config.train.seq_len % d.sp() == 0, "train.seq_len = ", config.train.seq_len,
          " is not divisible by parallel.sp = ", d.sp(), " (each rank takes an equal contiguous chunk)");
  const std::string& method = config.parallel.sp_method;
  if (config.model.arch == "linear") {
    require(method == "auto" || method == "lasp" || method == "lasp2", "parallel.sp_method = \"", method,
            "\" with model.arch = linear: ulysses and ring attention split softmax attention; use lasp or lasp2");
    return;
  }
  require(method == "auto" || method == "ulysses" || method == "ring", "parallel.sp_method = \"", method,
          "\" with model.arch = ", config.model.arch, ": LASP needs linear attention; use ring or ulysses");
  require(config.model.dropout == 0, "model.dropout = ", config.model.dropout, " with parallel.sp = ", d.sp(),
          ": sequence-parallel softmax attention applies no attention dropout; set model.dropout = 0");
  require(method != "ulysses" || config.model.n_head % (d.sp() * d.tp()) == 0, "model.n_head = ", config.model.n_head,
          " is not a multiple of parallel.sp * parallel.tp = ", d.sp() * d.tp(),
          " (Ulysses gives each rank whole heads of its tensor-parallel share); use ring");
}

TrainStep::TrainStep(const Config& config, comm::Mesh* mesh)
    : config_(config),
      device_(mesh ? mesh->device() : comm::select_device(config.train.device, comm::LaunchInfo())),
      autocast_(autocast_dtype(config.precision)),
      mesh_(mesh) {
  if (mesh_) check_parallel_layout(config, mesh_->dims());
  if (config.train.threads > 0) at::set_num_threads(static_cast<int>(config.train.threads));
  keep_host_heap();
  torch::manual_seed(static_cast<uint64_t>(config.train.seed));
  model_ = TransformerLM(config.model);
  model_->to(device_, parameter_dtype(config.precision));
  if (mesh_ && mesh_->dims().tp() > 1) {  // every tp rank built the same model (same seed) to shard
    tp_ = &mesh_->group("tp");
    parallelize_tensor(model_, *tp_, config.parallel.megatron_sp);
  }
  model_->set_activation_checkpointing(config.memory.activation_checkpointing);
  NamedTensors named;
  for (const auto& item : model_->named_parameters()) named.emplace_back(item.key(), item.value());
  if (mesh_ && mesh_->dims().sp() > 1) {
    sp_ = mesh_->dims().sp();
    sp_rank_ = mesh_->coord().sp;
    const std::string& method = config.parallel.sp_method;
    if (config.model.arch == "linear")
      apply_lasp(model_, mesh_->group("sp"), lasp_variant(method == "auto" ? "lasp" : method));
    else
      apply_sequence_parallel_attention(model_, mesh_->group("sp"), method == "auto" ? "ring" : method);
  }
  // Gradients are averaged over every rank holding a replica of the parameters: the dp ranks, and
  // with sequence parallelism also the sp ranks (each saw a different chunk of the same sequences).
  // ZeRO-Offload is DataParallel's too, so it runs through it on one rank as well.
  require(mesh_ || !config.parallel.offload, "parallel.offload = true needs a process mesh (tessera train)");
  if (mesh_ && (mesh_->dims().dp() * sp_ > 1 || config.parallel.offload)) {
    replicas_ = &mesh_->group(sp_ > 1 ? "dp_sp" : "dp");
    dp_ = std::make_unique<DataParallel>(model_, *replicas_, config.parallel, config.optim);
  } else if (config.precision.dtype == "fp16") {
    master_ = std::make_unique<MasterWeights>(named);
    scaler_ = std::make_unique<DynamicLossScaler>(config.precision, device_);
    optimizer_ = make_optimizer(config.optim, master_->master());
  } else {
    optimizer_ = make_optimizer(config.optim, named);
  }
}

TrainStep::~TrainStep() = default;

c10::ScalarType TrainStep::compute_dtype() const { return master_ ? at::kHalf : autocast_.value_or(at::kFloat); }

std::vector<at::Tensor> TrainStep::optimized_parameters() const {
  std::vector<at::Tensor> out;
  if (master_)
    for (const auto& [name, p] : master_->master()) out.push_back(p);
  else
    for (const auto& p : model_->parameters()) out.push_back(p);
  return out;
}

at::Tensor TrainStep::sequence_chunk(const at::Tensor& tokens) {
  if (sp_ == 1) return tokens;
  const int64_t length = tokens.size(1) / sp_;
  require(length * sp_ == tokens.size(1), "internal: a batch of ", tokens.size(1), " tokens per row for parallel.sp = ",
          sp_);
  model_->set_position_offset(sp_rank_ * length);
  return tokens.narrow(1, sp_rank_ * length, length);
}

StepResult TrainStep::run(const std::vector<Batch>& micro_batches, double lr) {
  StepResult result;
  model_->train();
  const double n = static_cast<double>(micro_batches.size());
  at::Tensor ce_sum = at::zeros({}, at::kDouble), aux_sum = at::zeros({}, at::kDouble);
  for (size_t m = 0; m < micro_batches.size(); ++m) {
    const Batch& batch = micro_batches[m];
    ModelOutput out;
    {
      AutocastGuard guard(device_.type(), autocast_.value_or(at::kFloat), autocast_.has_value());
      out = model_->forward(sequence_chunk(batch.inputs).to(device_), sequence_chunk(batch.targets).to(device_));
    }
    at::Tensor loss = out.loss.to(at::kFloat) / n;
    if (scaler_) loss = loss * scaler_->value();
    if (dp_) dp_->before_backward(m + 1 == micro_batches.size());
    loss.backward();
    ce_sum += out.ce_loss.detach().to(at::kCPU, at::kDouble);
    aux_sum += out.aux_loss.detach().to(at::kCPU, at::kDouble);
  }
  if (dp_) {
    at::Tensor losses = at::stack({ce_sum, aux_sum});
    replicas_->all_reduce(losses, comm::ReduceOp::avg);
    ce_sum = losses[0];
    aux_sum = losses[1];
  }
  result.ce_loss = ce_sum.item<double>() / n;
  result.aux_loss = aux_sum.item<double>() / n;

  if (dp_) {
    dp_->finish_gradients();
    result.grad_norm =
        tp_ ? clip_tensor_parallel(config_.optim.grad_clip) : dp_->clip_grad_norm(config_.optim.grad_clip);
    dp_->step(lr);
    dp_->zero_grad();
    return result;
  }
  if (master_) {
    result.skipped = master_->copy_grads_to_master(1.0 / scaler_->value());
    if (!result.skipped) {
      result.grad_norm = clip_grad_norm(optimized_parameters(), config_.optim.grad_clip);
      optimizer_->step(lr);
      master_->copy_master_to_model();
    }
    scaler_->update(result.skipped);
  } else {
    result.grad_norm = tp_ ? clip_tensor_parallel(config_.optim.grad_clip)
                           : clip_grad_norm(optimized_parameters(), config_.optim.grad_clip);
    optimizer_->step(lr);
  }
  optimizer_->zero_grad();
  for (auto& p : model_->parameters()) p.mutable_grad().reset();
  return result;
}

double TrainStep::evaluate(const std::vector<Batch>& batches) {
  torch::NoGradGuard no_grad;
  model_->eval();
  // Data-parallel ranks each take their equal share of every batch's rows, sequence-parallel ranks
  // their chunk of each row; the mean of their means is the batch mean.
  const int64_t ranks = dp_ ? mesh_->dims().dp() : 1, me = dp_ ? mesh_->group("dp").rank() : 0;
  at::Tensor total = at::zeros({}, at::kDouble);
  for (const Batch& batch : batches) {
    const int64_t rows = batch.inputs.size(0) / ranks;
    require(rows * ranks == batch.inputs.size(0), "internal: evaluation batch of ", batch.inputs.size(0),
            " rows for ", ranks, " data-parallel ranks");
    AutocastGuard guard(device_.type(), autocast_.value_or(at::kFloat), autocast_.has_value());
    total += model_->forward(sequence_chunk(batch.inputs.narrow(0, me * rows, rows)).to(device_),
                             sequence_chunk(batch.targets.narrow(0, me * rows, rows)).to(device_))
                 .ce_loss.detach()
                 .to(at::kCPU, at::kDouble);
  }
  if (dp_) replicas_->all_reduce(total, comm::ReduceOp::avg);
  model_->train();
  return total.item<double>() / static_cast<double>(batches.size());
}

NamedTensors TrainStep::model_state() {
  if (dp_) dp_->gather_full_parameters();
  if (!tp_) return export_state(*model_);
  // Checkpoints hold the unsharded model (tp = 1), whatever tp saved them.
  TransformerLM full(config_.model);
  const NamedTensors gathered = gather_tensor_parallel_state(*model_, *tp_);
  at::NoGradGuard no_grad;
  auto params = full->named_parameters();
  for (const auto& [name, tensor] : gathered) params[name].copy_(tensor);
  return export_state(*full);
}

void TrainStep::load_model_state(const std::map<std::string, at::Tensor>& tensors, const std::string& source) {
  if (dp_) dp_->gather_full_parameters();
  if (tp_) {
    TransformerLM full(config_.model);
    import_state(*full, tensors, source);
    at::NoGradGuard no_grad;
    auto whole = full->named_parameters();
    for (auto& item : model_->named_parameters())
      item.value().copy_(shard_tensor(whole[item.key()], tensor_parallel_layout(config_.model, item.key()),
                                      tp_->rank(), tp_->size()));
  } else {
    import_state(*model_, tensors, source);
  }
  if (dp_) dp_->reshard_parameters();
}

// Under tensor parallelism an AdamW moment "<param>.exp_avg[_sq]" has its parameter's shape and
// split; this gives the layout of such a state tensor, or none (replicated, and the step counts).
std::optional<TensorParallelLayout> TrainStep::moment_layout(const std::string& name, const at::Tensor& t) const {
  const size_t dot = name.rfind('.');
  if (!tp_ || dot == std::string::npos || t.dim() == 0) return std::nullopt;
  const TensorParallelLayout layout = tensor_parallel_layout(config_.model, name.substr(0, dot));
  if (layout.dim < 0) return std::nullopt;
  return layout;
}

NamedTensors TrainStep::training_state() const {
  NamedTensors out;
  if (master_) append_prefixed(out, "master.", master_->master());
  NamedTensors optim = dp_ ? dp_->full_optimizer_state() : optimizer_->state();
  for (auto& [name, t] : optim)
    if (const auto layout = moment_layout(name, t)) t = gather_tensor(t.contiguous(), *layout, *tp_);
  append_prefixed(out, "optim.", optim);
  if (scaler_) append_prefixed(out, "scaler.", scaler_->state());
  return out;
}

std::vector<TensorSlice> TrainStep::training_state_slices(int64_t rank, int64_t shards) const {
  if (!dp_ || tp_ || replicas_->size() != shards) return even_slices(training_state(), rank, shards);
  std::vector<TensorSlice> out = dp_->optimizer_state_slices();
  for (TensorSlice& slice : out) slice.name = "optim." + slice.name;
  return out;
}

void TrainStep::load_training_state(const std::map<std::string, at::Tensor>& tensors, const std::string& source) {
  if (master_) load_named_state(master_->master(), with_prefix(tensors, "master."), source);
  std::map<std::string, at::Tensor> optim = with_prefix(tensors, "optim.");
  for (auto& [name, t] : optim)
    if (const auto layout = moment_layout(name, t)) t = shard_tensor(t, *layout, tp_->rank(), tp_->size());
  if (dp_ && !training_state_ranges().empty())
    dp_->load_optimizer_state_ranges(optim, source);
  else if (dp_)
    dp_->load_full_optimizer_state(optim, source);
  else
    optimizer_->load_state(optim, source);
  if (scaler_) scaler_->load_state(with_prefix(tensors, "scaler."), source);
}

OptimizerRanges TrainStep::training_state_ranges() const {
  OptimizerRanges out;
  if (!dp_ || tp_) return out;
  for (const auto& [name, range] : dp_->optimizer_state_ranges()) out.emplace("optim." + name, range);
  return out;
}

// The global gradient norm of a tensor-parallel model: split parameters' squares summed over tp,
// replicated ones (identical on every tp rank) counted once; clipping as clip_grad_norm.
double TrainStep::clip_tensor_parallel(double max_norm) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  std::vector<double> weights;
  for (const auto& item : model_->named_parameters()) {
    if (!item.value().grad().defined()) continue;
    grads.push_back(item.value().grad());
    const bool replicated = tensor_parallel_layout(config_.model, item.key()).dim < 0;
    weights.push_back(replicated ? 1.0 / static_cast<double>(tp_->size()) : 1.0);
  }
  at::Tensor squares = at::stack(at::_foreach_norm(grads, 2)).to(at::kDouble).pow(2);
  squares = (squares * at::tensor(weights, squares.options())).sum().reshape({1});
  tp_->all_reduce(squares);
  const double norm = std::sqrt(squares.item<double>());
  scale_to_max_norm(grads, norm, max_norm);
  return norm;
}

NamedTensors TrainStep::compression_state() const { return dp_ ? dp_->compression_state() : NamedTensors{}; }

void TrainStep::load_compression_state(const std::map<std::string, at::Tensor>& tensors, const std::string& source) {
  if (dp_) return dp_->load_compression_state(tensors, source);
  require(tensors.empty(), source, ": gradient-compression state given, but this run has no data parallelism");
}

}  // namespace tessera
