// BatchSampler and evaluation_batches (see sampler.h).
#include "data/sampler.h"

#include <algorithm>

#include <ATen/ops/empty.h>

#include "core/error.h"
#include "core/splitmix.h"

namespace tessera {
namespace {

void check_shape(const TokenStream& data, int64_t batch, int64_t seq_len) {
  require(batch > 0, data.name(), ": batch size must be > 0 (got ", batch, ")");
  require(seq_len > 0, data.name(), ": sequence length must be > 0 (got ", seq_len, ")");
  require(data.size() >= seq_len + 1, data.name(), ": ", data.size(), " tokens, need at least ", seq_len + 1,
          " for train.seq_len = ", seq_len);
}

// Windows starting at `offsets`, each T + 1 tokens: inputs [B, T] and targets [B, T] shifted by one.
Batch gather(const TokenStream& data, const std::vector<int64_t>& offsets, int64_t seq_len) {
  const int64_t b = static_cast<int64_t>(offsets.size());
  Batch out{at::empty({b, seq_len}, at::kLong), at::empty({b, seq_len}, at::kLong)};
  int64_t* inputs = out.inputs.data_ptr<int64_t>();
  int64_t* targets = out.targets.data_ptr<int64_t>();
  std::vector<int64_t> window(static_cast<size_t>(seq_len + 1));
  for (int64_t row = 0; row < b; ++row) {
    data.read(offsets[static_cast<size_t>(row)], seq_len + 1, window.data());
    std::copy(window.begin(), window.end() - 1, inputs + row * seq_len);
    std::copy(window.begin() + 1, window.end(), targets + row * seq_len);
  }
  return out;
}

}  // namespace

BatchSampler::BatchSampler(const TokenStream& data, const BatchLayout& layout, int64_t seq_len, uint64_t seed)
    : data_(data), layout_(layout), seq_len_(seq_len), seed_(seed) {
  check_shape(data, layout.micro_batch, seq_len);
  require(layout.dp >= 1 && layout.dp_rank >= 0 && layout.dp_rank < layout.dp && layout.accumulation >= 1,
          "internal: data-parallel rank ", layout.dp_rank, " of ", layout.dp, " with ", layout.accumulation,
          " micro-batches");
}

int64_t BatchSampler::offset(int64_t step, int64_t g) const {
  const uint64_t valid = static_cast<uint64_t>(data_.size() - seq_len_);  // starts 0 .. N - T - 1
  const uint64_t counter =
      static_cast<uint64_t>(step) * static_cast<uint64_t>(layout_.global_batch()) + static_cast<uint64_t>(g);
  return static_cast<int64_t>(splitmix64(splitmix64(seed_) + counter) % valid);
}

std::vector<Batch> BatchSampler::next() {
  const int64_t b = layout_.micro_batch;
  std::vector<Batch> micro_batches;
  for (int64_t m = 0; m < layout_.accumulation; ++m) {
    const int64_t first = (m * layout_.dp + layout_.dp_rank) * b;
    std::vector<int64_t> offsets(static_cast<size_t>(b));
    for (int64_t i = 0; i < b; ++i) offsets[static_cast<size_t>(i)] = offset(position_, first + i);
    micro_batches.push_back(gather(data_, offsets, seq_len_));
  }
  ++position_;
  return micro_batches;
}

void BatchSampler::seek(int64_t position) {
  require(position >= 0, data_.name(), ": sampler position must be >= 0 (got ", position, ")");
  position_ = position;
}

std::vector<Batch> evaluation_batches(const TokenStream& data, int64_t n_batches, int64_t batch, int64_t seq_len) {
  check_shape(data, batch, seq_len);
  require(n_batches > 0, data.name(), ": number of evaluation batches must be > 0 (got ", n_batches, ")");
  const int64_t disjoint = (data.size() - 1) / seq_len;  // windows that share at most one token
  const int64_t batches = std::max<int64_t>(1, std::min(n_batches, disjoint / batch));
  const int64_t windows = batches * batch;
  const int64_t last = data.size() - seq_len - 1;  // the last valid start
  std::vector<Batch> out;
  for (int64_t k = 0; k < batches; ++k) {
    std::vector<int64_t> offsets(static_cast<size_t>(batch));
    for (int64_t i = 0; i < batch; ++i) {
      const int64_t w = k * batch + i;
      offsets[static_cast<size_t>(i)] = windows == 1 ? 0 : w * last / (windows - 1);
    }
    out.push_back(gather(data, offsets, seq_len));
  }
  return out;
}

}  // namespace tessera
