// PowerSGD's step on one bucket (the algorithm and its state are described in powersgd.h).
//
// Layout of one bucket, computed from its gradients' shapes on every call:
//   acc      [bucket numel]  float32: the gradients flattened in order, + the residual
//   message  [sum over gradients of (numel if sent whole, else n r')]: what step 3 all-reduces
//   q        [sum over compressed matrices of m r']: the bucket's Qs, each a [m, r'] view
// Every rank derives the same layout from the same shapes, so the messages line up.
#include "optim/compression/powersgd.h"

#include <algorithm>
#include <set>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include "core/error.h"
#include "core/flat_tensors.h"

namespace tessera {

namespace {

const char* const kPowerSgdPrefix = "powersgd";

// One gradient of the bucket. A compressed one has r > 0 and is viewed as [n, m].
struct Part {
  size_t index = 0;
  int64_t offset = 0;          // in acc
  int64_t numel = 0;
  int64_t n = 0, m = 0, r = 0;
  int64_t message_offset = 0;  // its P [n, r] or, sent whole, its values
  int64_t q_offset = 0;        // its Q [m, r] in the bucket's q
  bool compressed() const { return r > 0; }
};

struct Layout {
  std::vector<Part> parts;
  int64_t numel = 0, message_numel = 0, q_numel = 0;
  bool any_compressed = false;
};

Layout plan(const std::vector<at::Tensor>& grads, int64_t rank) {
  Layout layout;
  for (size_t i = 0; i < grads.size(); ++i) {
    Part part;
    part.index = i;
    part.offset = layout.numel;
    part.numel = grads[i].numel();
    if (grads[i].dim() >= 2 && part.numel > 0) {
      part.n = grads[i].size(0);
      part.m = part.numel / part.n;
      const int64_t r = std::min({part.n, part.m, rank});
      if (r * (part.n + part.m) < part.numel) part.r = r;
    }
    part.message_offset = layout.message_numel;
    part.q_offset = layout.q_numel;
    layout.message_numel += part.compressed() ? part.n * part.r : part.numel;
    layout.q_numel += part.m * part.r;
    layout.any_compressed = layout.any_compressed || part.compressed();
    layout.numel += part.numel;
    layout.parts.push_back(part);
  }
  return layout;
}

// The Q factor of a reduced QR of x [rows, r]: orthonormal columns spanning x.
at::Tensor orthonormal(const at::Tensor& x) { return std::get<0>(at::linalg_qr(x, "reduced")); }

at::Tensor initial_q(int64_t numel, int64_t bucket, c10::Device device) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(bucket));
  return at::randn({numel}, generator, at::TensorOptions().dtype(at::kFloat)).to(device);
}

}  // namespace

PowerSGD::PowerSGD(int64_t rank, int64_t start_step) : rank_(rank), start_step_(start_step) {
  require(rank >= 1, "parallel.powersgd_rank must be at least 1 (got ", rank, ")");
  require(start_step >= 0, "parallel.powersgd_start_step must be >= 0 (got ", start_step, ")");
}

void PowerSGD::all_reduce_mean(std::vector<at::Tensor>& grads, int64_t bucket, comm::Group& group) {
  if (grads.empty()) return;
  at::NoGradGuard no_grad;
  Bucket& state = buckets_[bucket];
  if (state.step >= start_step_)
    compress(grads, bucket, state, group);
  else
    group.all_reduce(grads, comm::ReduceOp::avg);
  ++state.step;
}

void PowerSGD::compress(std::vector<at::Tensor>& grads, int64_t index, Bucket& state, comm::Group& group) {
  const Layout layout = plan(grads, rank_);
  if (!layout.any_compressed) {
    group.all_reduce(grads, comm::ReduceOp::avg);
    return;
  }
  const c10::Device device = grads.front().device();
  if (!state.loaded_from.empty()) {
    const std::string bucket_text = "bucket " + std::to_string(index);
    state.residual = compression::checked_state(state.residual, layout.numel, bucket_text + "'s gradient elements",
                                                compression::state_name(kPowerSgdPrefix, index, "residual"),
                                                state.loaded_from, device);
    state.q = compression::checked_state(state.q, layout.q_numel, "the Q factors of " + bucket_text + "'s matrices",
                                         compression::state_name(kPowerSgdPrefix, index, "q"), state.loaded_from, device);
    state.loaded_from.clear();
  }
  at::Tensor acc = flatten_float(grads);
  if (state.residual.defined()) acc.add_(state.residual);
  if (!state.q.defined()) state.q = initial_q(layout.q_numel, index, device);

  auto matrix = [&](const Part& p) { return acc.narrow(0, p.offset, p.numel).view({p.n, p.m}); };
  auto q_of = [&](const Part& p) { return state.q.narrow(0, p.q_offset, p.m * p.r).view({p.m, p.r}); };
  at::Tensor message = at::empty({layout.message_numel}, acc.options());
  auto p_of = [&](const Part& p) { return message.narrow(0, p.message_offset, p.n * p.r).view({p.n, p.r}); };

  // Steps 1-3: P = M orthonormalise(Q), all-reduced together with the gradients sent whole.
  for (const Part& part : layout.parts) {
    if (!part.compressed()) {
      message.narrow(0, part.message_offset, part.numel).copy_(acc.narrow(0, part.offset, part.numel));
      continue;
    }
    at::Tensor q = q_of(part);
    q.copy_(orthonormal(q));
    at::Tensor p = p_of(part);
    at::mm_out(p, matrix(part), q);
  }
  group.all_reduce(message, comm::ReduceOp::avg);

  // Steps 4-5: Q = M^T orthonormalise(P), all-reduced.
  for (const Part& part : layout.parts) {
    if (!part.compressed()) continue;
    at::Tensor p = p_of(part);
    p.copy_(orthonormal(p));
    at::Tensor q = q_of(part);
    at::mm_out(q, matrix(part).t(), p);
  }
  group.all_reduce(state.q, comm::ReduceOp::avg);

  // Step 6: decompress; acc becomes the residual.
  for (const Part& part : layout.parts) {
    at::Tensor& grad = grads[part.index];
    if (!part.compressed()) {
      grad.copy_(message.narrow(0, part.message_offset, part.numel).view(grad.sizes()));
      acc.narrow(0, part.offset, part.numel).zero_();
      continue;
    }
    const at::Tensor approximation = at::mm(p_of(part), q_of(part).t());
    grad.copy_(approximation.view(grad.sizes()));
    matrix(part).sub_(approximation);
  }
  state.residual = acc;
}

NamedParams PowerSGD::state() const {
  NamedParams out;
  for (const auto& [index, bucket] : buckets_) {
    out.emplace_back(compression::state_name(kPowerSgdPrefix, index, "step"), at::scalar_tensor(bucket.step, at::kLong));
    if (!bucket.residual.defined()) continue;
    out.emplace_back(compression::state_name(kPowerSgdPrefix, index, "residual"), bucket.residual);
    out.emplace_back(compression::state_name(kPowerSgdPrefix, index, "q"), bucket.q);
  }
  return out;
}

void PowerSGD::load_state(const std::map<std::string, at::Tensor>& state, const std::string& source) {
  std::map<int64_t, Bucket> loaded;
  std::map<int64_t, std::set<std::string>> slots;
  for (const auto& [name, tensor] : state) {
    const auto [index, slot] = compression::parse_state_name(name, kPowerSgdPrefix, {"step", "residual", "q"}, source);
    slots[index].insert(slot);
    Bucket& bucket = loaded[index];
    if (slot == "step") {
      require(tensor.dim() == 0 && !at::isFloatingType(tensor.scalar_type()) && tensor.item<int64_t>() >= 0, source,
              ": gradient-compression state ", name, " must be a non-negative integer scalar");
      bucket.step = tensor.item<int64_t>();
      continue;
    }
    require(tensor.dim() == 1 && at::isFloatingType(tensor.scalar_type()), source, ": gradient-compression state ",
            name, " must be a 1-D floating tensor (got ", tensor.sizes(), " ", tensor.scalar_type(), ")");
    (slot == "q" ? bucket.q : bucket.residual) = tensor;
    bucket.loaded_from = source;
  }
  for (const auto& [index, present] : slots) {
    require(present.count("step") > 0, source, ": gradient-compression state ",
            compression::state_name(kPowerSgdPrefix, index, "step"), " is missing");
    require(present.count("residual") == present.count("q"), source, ": gradient-compression state ",
            compression::state_name(kPowerSgdPrefix, index, present.count("q") ? "residual" : "q"),
            " is missing (residual and q come together)");
  }
  buckets_ = std::move(loaded);
}

}  // namespace tessera
