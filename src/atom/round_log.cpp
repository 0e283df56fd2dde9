// The averaged gradients of the last rounds, served to peers that replay them (round_log.h).
#include "atom/round_log.h"

#include <cstring>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "atom/messages.h"
#include "core/flat_tensors.h"

namespace tessera::atom {

void RoundLog::add(int64_t swarm_step, const at::Tensor& mean) {
  const int64_t bytes = mean.numel() * static_cast<int64_t>(sizeof(float));
  std::lock_guard<std::mutex> lock(mutex_);
  if (bytes > max_bytes_ || (!rounds_.empty() && rounds_.back().first + 1 != swarm_step)) {
    rounds_.clear();  // a gap (this peer took the others' state) or a vector past the budget
    bytes_ = 0;
  }
  if (bytes > max_bytes_) return;
  rounds_.emplace_back(swarm_step, mean.to(at::kFloat).contiguous());  // kept as given: never written again
  bytes_ += bytes;
  while (bytes_ > max_bytes_) {
    bytes_ -= rounds_.front().second.numel() * static_cast<int64_t>(sizeof(float));
    rounds_.pop_front();
  }
}

int64_t RoundLog::rounds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(rounds_.size());
}

bool RoundLog::serve(Channel& channel, const Message& first) {
  if (first.type != kRound) return false;
  const RoundRequest request = parse_round_request(first.body, channel.address());
  at::Tensor held;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [step, mean] : rounds_)
      if (step == request.swarm_step) held = mean;  // never written again: safe to read unlocked
  }
  std::string bytes;
  if (held.defined()) {
    bytes.resize(static_cast<size_t>(held.numel()) * sizeof(float));
    std::memcpy(bytes.data(), held.data_ptr<float>(), bytes.size());
  }
  channel.send(kRoundReply, bytes, Deadline::in(60));
  return true;
}

at::Tensor fetch_round(const std::string& address, const SwarmKey& key, const std::string& my_id, int64_t swarm_step,
                       int64_t numel, size_t max_bytes, Deadline deadline) {
  const auto [host, port] = split_address(address, "a donor");
  auto c = Channel::connect(host, port, key, my_id, deadline, max_bytes);
  c->send(kRound, nlohmann::json{{"swarm_step", swarm_step}}.dump(), deadline);
  const Message m = c->receive(deadline, kRoundReply);
  if (m.body.empty()) return {};
  if (static_cast<int64_t>(m.body.size()) != numel * static_cast<int64_t>(sizeof(float)))
    throw WireError("peer " + address + " sent round " + std::to_string(swarm_step) + " as " +
                    std::to_string(m.body.size()) + " bytes where " + std::to_string(numel) + " float32 values are " +
                    std::to_string(numel * static_cast<int64_t>(sizeof(float))));
  at::Tensor mean = at::empty({numel}, at::kFloat);
  std::memcpy(mean.data_ptr<float>(), m.body.data(), m.body.size());
  if (!all_finite(mean))
    throw WireError("peer " + address + " sent round " + std::to_string(swarm_step) + " with values not finite");
  return mean;
}

}  // namespace tessera::atom
