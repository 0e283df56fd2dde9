// The compressor factory, the defaults of the interface, the helpers shared by the compressors
// and the two stateless ones: 16-bit casts around a plain all-reduce.
//
// bf16: each rank casts its gradients to bfloat16, the group sums them in bfloat16 (every partial
//   sum rounded to bfloat16; bfloat16 has float32's range, so the sum does not overflow), and each
//   rank casts the sum back to the gradient's dtype and divides it by N there.
// fp16: each rank divides its gradients by N in float32 first and then casts to float16 (whose
//   largest value is 65504: dividing first means the sum overflows only where the mean itself
//   would), the group sums them in float16, and each rank casts the sum back.
// Both send half the bytes of a float32 all-reduce and keep no state.
#include "optim/compression/compressor.h"

#include <algorithm>
#include <cctype>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "core/error.h"
#include "optim/compression/powersgd.h"
#include "optim/compression/topk.h"

namespace tessera {

GradientCompressor::~GradientCompressor() = default;

NamedParams GradientCompressor::state() const { return {}; }

void GradientCompressor::load_state(const std::map<std::string, at::Tensor>& state, const std::string& source) {
  if (!state.empty())
    fail(source, ": unexpected gradient-compression state ", state.begin()->first,
         " (the configured compressor keeps none)");
}

namespace {

class CastCompressor : public GradientCompressor {
 public:
  CastCompressor(at::ScalarType wire, bool divide_before_sum) : wire_(wire), divide_before_sum_(divide_before_sum) {}

  void all_reduce_mean(std::vector<at::Tensor>& grads, int64_t bucket, comm::Group& group) override {
    if (grads.empty()) return;
    at::NoGradGuard no_grad;
    const double n = static_cast<double>(group.size());
    std::vector<at::Tensor> parts;
    parts.reserve(grads.size());
    for (const at::Tensor& g : grads) {
      at::Tensor flat = g.reshape({-1});
      parts.push_back(divide_before_sum_ ? (flat.to(at::kFloat) / n).to(wire_) : flat.to(wire_));
    }
    at::Tensor wire = at::cat(parts);
    group.all_reduce(wire, comm::ReduceOp::sum);
    int64_t offset = 0;
    for (at::Tensor& g : grads) {
      at::Tensor sum = wire.narrow(0, offset, g.numel()).view(g.sizes()).to(g.scalar_type());
      g.copy_(divide_before_sum_ ? sum : sum / n);
      offset += g.numel();
    }
  }

 private:
  at::ScalarType wire_;
  bool divide_before_sum_;
};

}  // namespace

std::unique_ptr<GradientCompressor> make_compressor(const ParallelOptions& options) {
  const std::string& name = options.grad_compression;
  if (name == "none") return nullptr;
  if (name == "bf16") return std::make_unique<CastCompressor>(at::kBFloat16, false);
  if (name == "fp16") return std::make_unique<CastCompressor>(at::kHalf, true);
  if (name == "powersgd") return std::make_unique<PowerSGD>(options.powersgd_rank, options.powersgd_start_step);
  if (name == "topk") return std::make_unique<TopK>(options.topk_ratio, options.topk_start_step, options.topk_warmup_steps);
  std::string known;
  for (const std::string& n : compressor_names()) known += (known.empty() ? "" : ", ") + n;
  fail("parallel.grad_compression must be one of ", known, " (got \"", name, "\")");
}

const std::vector<std::string>& compressor_names() {
  static const std::vector<std::string> names = {"none", "bf16", "fp16", "powersgd", "topk"};
  return names;
}

namespace compression {

std::string state_name(const std::string& prefix, int64_t bucket, const std::string& slot) {
  return prefix + ".bucket" + std::to_string(bucket) + "." + slot;
}

StateKind state_kind(const std::string& name) {
  const std::string tail = ".step";
  const bool step = name.size() > tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  return step ? StateKind::counter : StateKind::real;
}

std::pair<int64_t, std::string> parse_state_name(const std::string& name, const std::string& prefix,
                                                 const std::vector<std::string>& slots, const std::string& source) {
  const std::string head = prefix + ".bucket";
  size_t digits_end = head.size();
  if (name.compare(0, head.size(), head) == 0)
    while (digits_end < name.size() && std::isdigit(static_cast<unsigned char>(name[digits_end]))) ++digits_end;
  std::string slots_text;
  for (const std::string& slot : slots) slots_text += (slots_text.empty() ? "" : ", ") + slot;
  const bool shaped = digits_end > head.size() && digits_end < name.size() && name[digits_end] == '.' &&
                      digits_end - head.size() <= 15;
  const std::string slot = shaped ? name.substr(digits_end + 1) : "";
  require(shaped && std::find(slots.begin(), slots.end(), slot) != slots.end(), source,
          ": unexpected gradient-compression state ", name, " (expected ", prefix, ".bucket<index>.<slot> with slot ",
          slots_text, ")");
  return {std::stoll(name.substr(head.size(), digits_end - head.size())), slot};
}

std::map<std::string, at::Tensor> merge_rank_states(const std::vector<std::map<std::string, at::Tensor>>& states,
                                                    const std::string& source) {
  std::map<std::string, at::Tensor> merged;
  if (states.empty()) return merged;
  at::NoGradGuard no_grad;
  for (const auto& [name, first] : states.front()) {
    bool equal = true;
    at::Tensor sum = first.is_floating_point() ? first.to(at::kDouble) : first;
    for (size_t r = 1; r < states.size(); ++r) {
      auto it = states[r].find(name);
      require(it != states[r].end() && it->second.sizes() == first.sizes() &&
                  it->second.scalar_type() == first.scalar_type(),
              source, ": gradient-compression state ", name, " of rank ", r,
              " is missing or differs in shape or dtype from rank 0's");
      equal = equal && at::equal(it->second, first);
      if (first.is_floating_point()) sum = sum + it->second.to(at::kDouble);
    }
    require(equal || first.is_floating_point(), source, ": gradient-compression state ", name,
            " differs between ranks and cannot be averaged (", first.scalar_type(), ")");
    merged[name] = equal ? first : (sum / static_cast<double>(states.size())).to(first.scalar_type());
  }
  for (size_t r = 1; r < states.size(); ++r)
    require(states[r].size() == merged.size(), source, ": rank ", r, " saved ", states[r].size(),
            " gradient-compression tensors, rank 0 saved ", merged.size());
  return merged;
}

at::Tensor checked_state(const at::Tensor& tensor, int64_t numel, const std::string& what, const std::string& name,
                         const std::string& source, c10::Device device) {
  require(tensor.numel() == numel, source, ": gradient-compression state ", name, " has ", tensor.numel(),
          " elements, expected ", numel, " (", what, ")");
  return tensor.to(device, at::kFloat, /*non_blocking=*/false, /*copy=*/true).contiguous().reshape({-1});
}

}  // namespace compression
}  // namespace tessera
