#include "train/train_step.h"

#include <thread>

#include <ATen/ATen.h>
#include <torch/utils.h>

#include "comm/device.h"
#include "core/error.h"
#include "core/host_heap.h"
#include "model/init.h"
#include "parallel/layout_check.h"
#include "plan/memory_estimate.h"
#include "plan/swap_cut.h"
#include "precision/autocast.h"

namespace tessera {

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
  // The layout, once: under pipeline parallelism each rank builds its stages of the cut (its
  // parameters equal the whole model's: they depend on the seed and their names only), under
  // memory.swap the model is built in host memory and the swap plan brings parts of it over.
  if (mesh) check_parallel_layout(config_, mesh->dims());
  const ParallelDims dims = mesh ? mesh->dims() : ParallelDims(config_.parallel, 1, "train");
  const Layout layout = make_layout(config_, dims, measure_layout(config_, mesh, device_));
  if (layout.swapped()) check_swap_host_memory(config_, layout.swap_plan(), host_memory_available());
  // The model on the meta device: parallelize() materialises this rank's parts only, with the
  // values the whole model built after torch::manual_seed(train.seed) would have.
  torch::manual_seed(static_cast<uint64_t>(config_.train.seed));
  const uint64_t init_seed = draw_model_seed();
  TransformerLM model(config_.model, layout.stage_of(mesh ? mesh->coord().pp : 0), at::TensorOptions().device(at::kMeta));
  parallel_ = parallelize(model, mesh, config_, layout, device_, init_seed);
}

TrainStep::~TrainStep() = default;

void TrainStep::set_outer_reduction(OuterReduction reduce) {
  require(parallel_->gradient_holder(), "an outer reduction (the ATOM swarm) needs one process holding its gradients "
          "whole: this run's layout shards them over ", parallel_->data_ranks(), " data-parallel ranks");
  outer_ = std::move(reduce);
}

std::vector<Batch> TrainStep::local_batches(const std::vector<Batch>& batches) {
  std::vector<Batch> out;
  for (const Batch& b : batches) out.push_back({parallel_->local_tokens(b.inputs), parallel_->local_tokens(b.targets)});
  return out;
}

c10::ScalarType TrainStep::compute_dtype() const {
  return config_.precision.dtype == "fp16" ? at::kHalf : autocast_.value_or(at::kFloat);
}

StepResult TrainStep::run(const std::vector<Batch>& micro_batches, double lr, const GradientObserver& observe) {
  parallel_->reset_moe_statistics();  // evaluation since the last step counted too
  GradientsReady ready;  // none without a reader: a swapped step then keeps its overlapped updates
  if (observe || outer_)
    ready = [&] {
      int64_t samples = 0;
      for (const Batch& b : micro_batches) samples += b.inputs.size(0);
      if (outer_ && !outer_(parallel_->gradient_holder()->final_gradients(), samples)) return false;
      if (observe) observe(parallel_->gradients());
      return true;
    };
  const StepLosses step = parallel_->runner().run(local_batches(micro_batches), lr, ready);
  // The step's one read from its device: the losses and the gradient norm in one copy, at its end.
  const at::Device where = step.ce_sum.device();
  const at::Tensor norm = step.update.grad_norm.defined() ? step.update.grad_norm : at::zeros({}, at::kDouble);
  const at::Tensor read = at::stack({step.ce_sum.to(where, at::kDouble), step.aux_sum.to(where, at::kDouble),
                                     norm.to(where, at::kDouble)}).to(at::kCPU);
  at::Tensor losses = read.narrow(0, 0, 2).clone();
  parallel_->average_over_replicas(losses);
  const double n = static_cast<double>(micro_batches.size());
  StepResult result;
  result.ce_loss = losses[0].item<double>() / n;
  result.aux_loss = losses[1].item<double>() / n;
  result.grad_norm = read[2].item<double>();
  result.skipped = step.update.skipped;
  result.applied = step.update.applied;
  result.moe = parallel_->moe_statistics();
  parallel_->balance_experts(result.moe);
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
  at::Tensor total =
      at::full({}, parallel_->runner().evaluate(local_batches(mine)) * static_cast<double>(mine.size()), at::kDouble);
  parallel_->average_over_replicas(total);
  return total.item<double>() / static_cast<double>(batches.size());
}

}  // namespace tessera
