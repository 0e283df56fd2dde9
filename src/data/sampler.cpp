// BatchSampler and evaluation_batches (see sampler.h).
#include "data/sampler.h"

#include <algorithm>

#include <ATen/ops/empty.h>

#include "core/error.h"
#include "core/splitmix.h"

namespace tessera {
namespace {

void check_shape(const TokenFile& file, int64_t batch, int64_t seq_len) {
  require(batch > 0, file.path(), ": batch size must be > 0 (got ", batch, ")");
  require(seq_len > 0, file.path(), ": sequence length must be > 0 (got ", seq_len, ")");
  require(file.size() >= seq_len + 1, file.path(), ": ", file.size(), " tokens, need at least ", seq_len + 1,
          " for train.seq_len = ", seq_len);
}

// Windows starting at `offsets`, each T + 1 tokens: inputs [B, T] and targets [B, T] shifted by one.
Batch gather(const TokenFile& file, const std::vector<int64_t>& offsets, int64_t seq_len) {
  const int64_t b = static_cast<int64_t>(offsets.size());
  Batch out{at::empty({b, seq_len}, at::kLong), at::empty({b, seq_len}, at::kLong)};
  int64_t* inputs = out.inputs.data_ptr<int64_t>();
  int64_t* targets = out.targets.data_ptr<int64_t>();
  for (int64_t row = 0; row < b; ++row) {
    const int64_t start = offsets[static_cast<size_t>(row)];
    for (int64_t t = 0; t < seq_len; ++t) {
      inputs[row * seq_len + t] = file[start + t];
      targets[row * seq_len + t] = file[start + t + 1];
    }
  }
  return out;
}

}  // namespace

BatchSampler::BatchSampler(const TokenFile& file, int64_t batch, int64_t seq_len, uint64_t seed, int64_t first_row,
                           int64_t rows)
    : file_(file), batch_(batch), seq_len_(seq_len), seed_(seed), first_row_(first_row), rows_(rows > 0 ? rows : batch) {
  check_shape(file, batch, seq_len);
  require(first_row_ >= 0 && first_row_ + rows_ <= batch_, "internal: rows [", first_row_, ", ", first_row_ + rows_,
          ") outside a batch of ", batch_);
}

int64_t BatchSampler::offset(int64_t k, int64_t i) const {
  const uint64_t valid = static_cast<uint64_t>(file_.size() - seq_len_);  // starts 0 .. N - T - 1
  const uint64_t counter = static_cast<uint64_t>(k) * static_cast<uint64_t>(batch_) + static_cast<uint64_t>(i);
  return static_cast<int64_t>(splitmix64(splitmix64(seed_) + counter) % valid);
}

Batch BatchSampler::next() {
  std::vector<int64_t> offsets(static_cast<size_t>(rows_));
  for (int64_t i = 0; i < rows_; ++i) offsets[static_cast<size_t>(i)] = offset(position_, first_row_ + i);
  ++position_;
  return gather(file_, offsets, seq_len_);
}

void BatchSampler::seek(int64_t position) {
  require(position >= 0, file_.path(), ": sampler position must be >= 0 (got ", position, ")");
  position_ = position;
}

std::vector<Batch> evaluation_batches(const TokenFile& file, int64_t n_batches, int64_t batch, int64_t seq_len) {
  check_shape(file, batch, seq_len);
  require(n_batches > 0, file.path(), ": number of evaluation batches must be > 0 (got ", n_batches, ")");
  const int64_t disjoint = (file.size() - 1) / seq_len;  // windows that share at most one token
  const int64_t batches = std::max<int64_t>(1, std::min(n_batches, disjoint / batch));
  const int64_t windows = batches * batch;
  const int64_t last = file.size() - seq_len - 1;  // the last valid start
  std::vector<Batch> out;
  for (int64_t k = 0; k < batches; ++k) {
    std::vector<int64_t> offsets(static_cast<size_t>(batch));
    for (int64_t i = 0; i < batch; ++i) {
      const int64_t w = k * batch + i;
      offsets[static_cast<size_t>(i)] = windows == 1 ? 0 : w * last / (windows - 1);
    }
    out.push_back(gather(file, offsets, seq_len));
  }
  return out;
}

}  // namespace tessera
