// Reentrant activation checkpointing as a torch::autograd::Function (activation_checkpointing.h).
//
// The segment callable cannot be stored in an IValue directly; it travels in an IValue capsule
// (a CustomClassHolder), so it is freed together with the autograd node.
#include "memory/activation_checkpointing.h"

#include <optional>
#include <utility>

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/autograd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "core/error.h"
#include "core/random_streams.h"
#include "precision/autocast.h"

namespace tessera {
namespace {

// Every random stream's state (core/random_streams.h: torch's default generators and the
// model-parallel stream) on the CPU and on the CUDA device the inputs live on.
struct RngState {
  std::optional<at::Device> cuda;
  std::vector<std::pair<std::string, at::Tensor>> states;

  static RngState capture(const TensorList& inputs) {
    RngState r;
    for (const auto& t : inputs)
      if (t.defined() && t.is_cuda()) {
        require(!r.cuda || *r.cuda == t.device(), "activation checkpointing: a segment's inputs on two GPUs (",
                *r.cuda, ", ", t.device(), ")");
        r.cuda = t.device();
      }
    r.states = random::states(r.cuda);
    return r;
  }
  void restore() const { random::load_states(states, cuda, "activation checkpointing"); }
};

// Autocast enabled flag and dtype for CPU and CUDA.
struct AutocastState {
  bool cpu_enabled = false, cuda_enabled = false;
  at::ScalarType cpu_dtype = at::kBFloat16, cuda_dtype = at::kHalf;

  static AutocastState capture() {
    AutocastState s;
    s.cpu_enabled = at::autocast::is_autocast_enabled(at::kCPU);
    s.cuda_enabled = at::autocast::is_autocast_enabled(at::kCUDA);
    s.cpu_dtype = at::autocast::get_autocast_dtype(at::kCPU);
    s.cuda_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
    return s;
  }
  void apply() const {
    at::autocast::set_autocast_enabled(at::kCPU, cpu_enabled);
    at::autocast::set_autocast_enabled(at::kCUDA, cuda_enabled);
    at::autocast::set_autocast_dtype(at::kCPU, cpu_dtype);
    at::autocast::set_autocast_dtype(at::kCUDA, cuda_dtype);
  }
};

// Segments being recomputed on this thread (recomputing()).
thread_local int recompute_depth = 0;

// What the backward pass needs besides the saved inputs.
struct Segment : torch::CustomClassHolder {
  SegmentFn fn;
  RngState rng;
  AutocastState autocast;
};

struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  // `inputs` is an ArrayRef so that apply() registers each tensor as an autograd input.
  static TensorList forward(torch::autograd::AutogradContext* ctx, const SegmentFn& fn, at::TensorList inputs) {
    auto segment = c10::make_intrusive<Segment>();
    segment->fn = fn;
    segment->rng = RngState::capture(inputs.vec());
    segment->autocast = AutocastState::capture();
    ctx->save_for_backward(inputs.vec());
    ctx->saved_data["segment"] = c10::IValue::make_capsule(segment);
    torch::NoGradGuard no_grad;
    return fn(inputs.vec());
  }

  static TensorList backward(torch::autograd::AutogradContext* ctx, TensorList grad_outputs) {
    auto segment = c10::static_intrusive_pointer_cast<Segment>(ctx->saved_data["segment"].toCapsule());
    TensorList inputs;
    for (const auto& saved : ctx->get_saved_variables())
      inputs.push_back(saved.detach().requires_grad_(saved.requires_grad()));

    TensorList outputs;
    {
      const RngState outer_rng = RngState::capture(inputs);
      const AutocastState outer_autocast = AutocastState::capture();
      // The recomputation's cast weights go with it: it runs in the backward, outside the forward's
      // autocast region, so what autocast caches here would otherwise reach the next step's
      // forward after the optimizer changed the weights.
      const AutocastCacheScope autocast_cache;
      segment->rng.restore();
      segment->autocast.apply();
      at::AutoGradMode grad_mode(true);
      ++recompute_depth;
      try {
        outputs = segment->fn(inputs);
      } catch (...) {
        --recompute_depth;
        throw;
      }
      --recompute_depth;
      outer_autocast.apply();
      outer_rng.restore();
    }

    TensorList roots, grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].defined() && outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    if (!roots.empty()) torch::autograd::backward(roots, grads);

    TensorList input_grads{at::Tensor()};  // fn is not a tensor
    for (const auto& input : inputs) input_grads.push_back(input.requires_grad() ? input.grad() : at::Tensor());
    return input_grads;
  }
};

}  // namespace

TensorList checkpoint(SegmentFn fn, const TensorList& inputs) {
  return CheckpointFunction::apply(fn, at::TensorList(inputs));
}

at::Tensor checkpoint(std::function<at::Tensor(const at::Tensor&)> fn, const at::Tensor& input) {
  return checkpoint([fn = std::move(fn)](const TensorList& in) { return TensorList{fn(in[0])}; }, TensorList{input})[0];
}

bool recomputing() { return recompute_depth > 0; }

bool checkpoint_applies(const at::Tensor& x) { return at::GradMode::is_enabled() && x.requires_grad(); }

CheckpointMode parse_checkpoint_mode(const std::string& mode) {
  if (mode == "none") return CheckpointMode::none;
  if (mode == "full") return CheckpointMode::full;
  if (mode == "selective") return CheckpointMode::selective;
  fail("memory.activation_checkpointing must be none, full or selective (got '", mode, "')");
}

}  // namespace tessera
