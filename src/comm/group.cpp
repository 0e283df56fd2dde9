// comm::Group (group.h): construction, the communication thread's lifetime, and the traffic
// counters; the operations are in group_collectives.cpp, the shared state in group_impl.h.
#include "comm/group.h"

#include "comm/group_impl.h"

namespace tessera::comm {

void Work::wait() {
  if (done_.valid()) done_.get();
}

Group::Group(std::string name, std::vector<int64_t> ranks, int64_t rank, c10::intrusive_ptr<c10d::Backend> backend,
             std::chrono::milliseconds timeout, c10::Device device)
    : impl_(std::make_shared<Impl>()) {
  require(!ranks.empty() && rank >= 0 && rank < static_cast<int64_t>(ranks.size()),
          "internal: group '", name, "' rank ", rank, " outside its ", ranks.size(), " members");
  require(backend || ranks.size() == 1, "internal: group '", name, "' of ", ranks.size(), " ranks has no backend");
  require(device.is_cpu() || (device.is_cuda() && device.has_index()), "internal: group '", name, "' on device ",
          device, " (cpu or an indexed cuda device expected)");
  impl_->name = std::move(name);
  impl_->ranks = std::move(ranks);
  impl_->rank = rank;
  impl_->backend = std::move(backend);
  impl_->timeout = timeout;
  impl_->device = device;
  flight_group(impl_->name, impl_->ranks);
  impl_->thread = std::thread([impl = impl_] { impl->run_queue(); });
}

Group::~Group() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->ready.notify_one();
  // After a failure the thread may be blocked in the backend until its timeout: leave it.
  if (impl_->failed) {
    impl_->thread.detach();
    return;
  }
  impl_->thread.join();
  // NCCL's normal exit (what destroy_process_group does in Python): finish and free the
  // communicator now, while every member is also tearing its mesh down.
  if (impl_->backend && impl_->on_cuda()) impl_->backend->shutdown();
}

const std::string& Group::name() const { return impl_->name; }
int64_t Group::rank() const { return impl_->rank; }
int64_t Group::size() const { return impl_->size(); }
int64_t Group::global_rank_of(int64_t rank) const { return impl_->ranks.at(rank); }
const std::vector<int64_t>& Group::ranks() const { return impl_->ranks; }
c10::Device Group::device() const { return impl_->device; }

std::map<std::string, int64_t> Group::traffic() const {
  std::lock_guard<std::mutex> lock(impl_->traffic_mutex);
  return impl_->traffic;
}

int64_t Group::bytes_sent() const {
  int64_t total = 0;
  for (const auto& [op, bytes] : traffic()) total += bytes;
  return total;
}

int64_t Group::inter_node_bytes() const {
  std::lock_guard<std::mutex> lock(impl_->traffic_mutex);
  return impl_->inter_node_bytes;
}

double Group::busy_seconds() const {
  std::lock_guard<std::mutex> lock(impl_->traffic_mutex);
  return impl_->busy_seconds;
}

void Group::set_failure_diagnosis(std::function<std::string()> diagnose) { impl_->diagnose = std::move(diagnose); }

void Group::set_member_nodes(std::vector<int64_t> node_of_member) {
  require(static_cast<int64_t>(node_of_member.size()) == size(), "internal: ", node_of_member.size(),
          " member nodes for group '", name(), "' of ", size());
  impl_->node_of_member = std::move(node_of_member);
}

void Group::reset_traffic() {
  std::lock_guard<std::mutex> lock(impl_->traffic_mutex);
  impl_->traffic.clear();
  impl_->inter_node_bytes = 0;
  impl_->busy_seconds = 0;
}

}  // namespace tessera::comm
