// Tensor lists as one flat float32 vector (flat_tensors.h).
#include "core/flat_tensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

namespace tessera {
namespace {

// One word into the hash (a multiply-rotate round, as xxHash64's).
uint64_t mix(uint64_t hash, uint64_t word) {
  word *= 0xc2b2ae3d27d4eb4full;
  word = (word << 31) | (word >> 33);
  word *= 0x9e3779b185ebca87ull;
  hash ^= word;
  return ((hash << 27) | (hash >> 37)) * 0x9e3779b185ebca87ull + 0x85ebca77c2b2ae63ull;
}

}  // namespace

at::Tensor flatten_float(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> parts;
  parts.reserve(tensors.size());
  for (const at::Tensor& t : tensors) parts.push_back(t.detach().reshape({-1}).to(at::kFloat));
  return at::cat(parts);
}

void unflatten_into(const at::Tensor& flat, const std::vector<at::Tensor>& tensors) {
  at::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const at::Tensor& t : tensors) {
    t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

std::string tensors_digest(const std::vector<at::Tensor>& tensors) {
  uint64_t hash = 0x27d4eb2f165667c5ull;
  for (const at::Tensor& t : tensors) {
    const at::Tensor c = t.detach().to(at::kCPU).contiguous();
    hash = mix(hash, static_cast<uint64_t>(c.scalar_type()));
    for (const int64_t d : c.sizes()) hash = mix(hash, static_cast<uint64_t>(d));
    const auto* bytes = static_cast<const unsigned char*>(c.data_ptr());
    const size_t n = c.nbytes();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t word;
      std::memcpy(&word, bytes + i, 8);
      hash = mix(hash, word);
    }
    uint64_t tail = 0;
    std::memcpy(&tail, bytes + i, n - i);
    hash = mix(hash, tail ^ (static_cast<uint64_t>(n - i) << 56));
  }
  char out[17];
  std::snprintf(out, sizeof(out), "%016llx", static_cast<unsigned long long>(hash));
  return out;
}

namespace {

// A float32 is NaN or infinite exactly when its eight exponent bits are all set: the largest
// exponent field of a block is then kExponent.
constexpr uint32_t kExponent = 0x7f800000u;
// Words tested between checks, so a non-finite value ends the pass early. The block's trip count is
// a constant, which lets the compiler's cheap vectorisation (-O2) take the loop.
constexpr int64_t kFiniteBlock = 4096;

bool block_finite(const uint32_t* words) {
  uint32_t top = 0;
  for (int64_t i = 0; i < kFiniteBlock; ++i) top = std::max(top, words[i] & kExponent);
  return top != kExponent;
}

}  // namespace

bool all_finite(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> others;
  for (const at::Tensor& t : tensors) {
    if (!(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous())) {
      others.push_back(at::isfinite(t).all());
      continue;
    }
    const auto* words = static_cast<const uint32_t*>(t.data_ptr());
    const int64_t n = t.numel(), whole = n / kFiniteBlock * kFiniteBlock;
    for (int64_t b = 0; b < whole; b += kFiniteBlock)
      if (!block_finite(words + b)) return false;
    uint32_t top = 0;
    for (int64_t i = whole; i < n; ++i) top = std::max(top, words[i] & kExponent);
    if (top == kExponent) return false;
  }
  if (others.empty()) return true;
  const bool one_device = std::all_of(others.begin(), others.end(),
                                      [&](const at::Tensor& o) { return o.device() == others.front().device(); });
  if (one_device) return at::stack(others).all().item<bool>();
  return std::all_of(others.begin(), others.end(), [](const at::Tensor& o) { return o.item<bool>(); });
}

bool all_finite(const at::Tensor& t) { return all_finite(std::vector<at::Tensor>{t}); }

}  // namespace tessera
