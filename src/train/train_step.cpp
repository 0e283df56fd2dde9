#include "train/train_step.h"

#include <malloc.h>

#include <ATen/ATen.h>
#include <torch/torch.h>

#include "core/error.h"
#include "model/hf_names.h"
#include "optim/clipping.h"
#include "parallel/data/data_parallel.h"
#include "parallel/sequence/lasp.h"
#include "parallel/sequence/softmax_attention_sp.h"
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

c10::Device training_device(const std::string& name) {
  c10::Device device(name);
  if (device.is_cuda() && !torch::cuda::is_available())
    fail("train.device = \"", name, "\" but no CUDA device is available",
#ifdef TESSERA_WITH_CUDA
         ""
#else
         " (this build has TESSERA_CUDA=OFF)"
#endif
    );
  return device;
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
  const std::pair<const char*, int64_t> unbuilt[] = {{"tp", d.tp()}, {"pp", d.pp()}, {"ep", d.ep()}};
  for (const auto& [key, degree] : unbuilt)
    require(degree == 1, "parallel.", key, " = ", degree,
            ": this build runs data and sequence parallelism only (parallel.dp, parallel.sp); ", key,
            " is not implemented yet");
  require(d.dp() * d.sp() == 1 || config.precision.dtype != "fp16", "precision.dtype = \"fp16\" with parallel.dp = ",
          d.dp(), " and parallel.sp = ", d.sp(),
          ": fp16 master weights are not combined with data or sequence parallelism yet; use bf16 or fp32");
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
  require(method != "ulysses" || config.model.n_head % d.sp() == 0, "model.n_head = ", config.model.n_head,
          " is not a multiple of parallel.sp = ", d.sp(), " (Ulysses gives each rank whole heads); use ring");
}

TrainStep::TrainStep(const Config& config, comm::Mesh* mesh)
    : config_(config),
      device_(training_device(config.train.device)),
      autocast_(autocast_dtype(config.precision)),
      mesh_(mesh) {
  if (mesh_) check_parallel_layout(config, mesh_->dims());
  if (config.train.threads > 0) at::set_num_threads(static_cast<int>(config.train.threads));
  keep_host_heap();
  torch::manual_seed(static_cast<uint64_t>(config.train.seed));
  model_ = TransformerLM(config.model);
  model_->set_activation_checkpointing(config.memory.activation_checkpointing);
  model_->to(device_, parameter_dtype(config.precision));
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
    result.grad_norm = dp_->clip_grad_norm(config_.optim.grad_clip);
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
    result.grad_norm = clip_grad_norm(optimized_parameters(), config_.optim.grad_clip);
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
  return export_state(*model_);
}

void TrainStep::load_model_state(const std::map<std::string, at::Tensor>& tensors, const std::string& source) {
  if (dp_) dp_->gather_full_parameters();
  import_state(*model_, tensors, source);
  if (dp_) dp_->reshard_parameters();
}

NamedTensors TrainStep::training_state() const {
  NamedTensors out;
  if (master_) append_prefixed(out, "master.", master_->master());
  append_prefixed(out, "optim.", dp_ ? dp_->full_optimizer_state() : optimizer_->state());
  if (scaler_) append_prefixed(out, "scaler.", scaler_->state());
  return out;
}

void TrainStep::load_training_state(const std::map<std::string, at::Tensor>& tensors, const std::string& source) {
  if (master_) load_named_state(master_->master(), with_prefix(tensors, "master."), source);
  if (dp_)
    dp_->load_full_optimizer_state(with_prefix(tensors, "optim."), source);
  else
    optimizer_->load_state(with_prefix(tensors, "optim."), source);
  if (scaler_) scaler_->load_state(with_prefix(tensors, "scaler."), source);
}

NamedTensors TrainStep::compression_state() const { return dp_ ? dp_->compression_state() : NamedTensors{}; }

void TrainStep::load_compression_state(const std::map<std::string, at::Tensor>& tensors, const std::string& source) {
  if (dp_) return dp_->load_compression_state(tensors, source);
  require(tensors.empty(), source, ": gradient-compression state given, but this run has no data parallelism");
}

}  // namespace tessera
