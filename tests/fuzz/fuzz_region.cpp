// libFuzzer target: region records (checkpoint/region.h), as a checkpoint shard's metadata gives
// them. The first two bytes are the stored piece's element count (0-4095, so an accepted region
// is small); the rest is two records, one per line. Each must parse or end in tessera::Error; two
// that parse with one shape then tile or not, overlap or not, and their overlap copies without
// touching memory outside either piece, at most as many elements as the smaller holds.
#include <cstddef>
#include <cstdint>
#include <string>

#include <ATen/ATen.h>

#include "checkpoint/region.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int64_t numel = (data[0] | (data[1] << 8)) % 4096;
  const std::string text(reinterpret_cast<const char*>(data) + 2, size - 2);
  const size_t newline = text.find('\n');
  using tessera::Region;
  try {
    const Region a = Region::parse(text.substr(0, newline), numel, "fuzz: 'a'");
    a.for_each_run([&](int64_t offset, int64_t position, int64_t length) {
      if (offset < 0 || position < 0 || length <= 0 || offset + length > a.whole_numel() || position + length > a.numel())
        __builtin_trap();
    });
    if (newline == std::string::npos) return 0;
    const Region b = Region::parse(text.substr(newline + 1), numel, "fuzz: 'b'");
    if (a.shape != b.shape) return 0;
    tessera::tiles({a, b});
    tessera::overlaps(a, b);
    const at::Tensor from = at::arange(a.numel(), at::kFloat);
    at::Tensor to = at::zeros({b.numel()});
    if (tessera::copy_overlap(a, from, b, to) > std::min(a.numel(), b.numel())) __builtin_trap();
  } catch (const tessera::Error&) {
  }
  return 0;
}
