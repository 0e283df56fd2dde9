// The next step's micro-batches drawn ahead (batch_prefetcher.h).
#include "data/batch_prefetcher.h"

#include <ATen/ATen.h>

namespace tessera {
namespace {

std::vector<Batch> draw(BatchSampler& sampler, int64_t position, bool pin) {
  sampler.seek(position);
  std::vector<Batch> batches = sampler.next();
  for (Batch& b : batches) b = prepared_for_copy(b, pin);
  return batches;
}

}  // namespace

Batch prepared_for_copy(const Batch& batch, bool pin) {
  auto prepared = [pin](const at::Tensor& t) { return pin ? t.contiguous().pin_memory() : t.contiguous(); };
  return {prepared(batch.inputs), prepared(batch.targets)};
}

BatchPrefetcher::BatchPrefetcher(BatchSampler& sampler, bool pin)
    : sampler_(sampler), ahead_sampler_(sampler), pin_(pin) {}

BatchPrefetcher::~BatchPrefetcher() {
  if (ahead_.valid()) ahead_.wait();
}

std::vector<Batch> BatchPrefetcher::next() {
  const int64_t position = sampler_.position();
  std::vector<Batch> batches;
  if (ahead_.valid()) {
    std::vector<Batch> drawn = ahead_.get();  // rethrows what the thread threw
    if (ahead_position_ == position) batches = std::move(drawn);
  }
  if (batches.empty()) batches = draw(ahead_sampler_, position, pin_);
  sampler_.seek(position + 1);
  ahead_position_ = position + 1;
  ahead_ = std::async(std::launch::async, [this, next = position + 1] { return draw(ahead_sampler_, next, pin_); });
  return batches;
}

}  // namespace tessera
