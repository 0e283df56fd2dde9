// ShardedHome: fetch and release of FlatUnits sharded over their groups (sharded_home.h).
#include "memory/residency/sharded_home.h"

#include <future>
#include <memory>

#include "core/error.h"

namespace tessera {

ShardedHome::ShardedHome(std::vector<FlatUnit>& flats, std::vector<std::vector<size_t>> members)
    : flats_(flats), members_(std::move(members)) {
  std::vector<int> seen(flats_.size(), 0);
  for (const auto& m : members_)
    for (size_t f : m) require(f < flats_.size() && seen[f]++ == 0, "internal: FlatUnit ", f, " in two residency units");
}

bool ShardedHome::materialized(size_t unit) const {
  for (size_t f : members_[unit])
    if (!flats_[f].materialized()) return false;
  return true;
}

comm::Work ShardedHome::fetch(size_t unit, std::vector<comm::Work> after) {
  for (comm::Work& w : after) w.wait();
  auto gathers = std::make_shared<std::vector<comm::Work>>();
  for (size_t f : members_[unit]) {
    if (flats_[f].materialized()) continue;
    flats_[f].materialize();
    comm::Work gather = flats_[f].gather_async();
    if (gather.pending()) gathers->push_back(std::move(gather));  // a one-rank gather is done at once
  }
  if (gathers->empty()) return {};
  if (gathers->size() == 1) return gathers->front();
  // One Work for the unit's gathers: waiting on it waits on each, in order.
  return comm::Work(std::async(std::launch::deferred, [gathers] {
                      for (comm::Work& g : *gathers) g.wait();
                    }).share());
}

comm::Work ShardedHome::release(size_t unit, std::vector<comm::Work> after) {
  for (comm::Work& w : after) w.wait();  // a gather in flight is completed before its storage goes
  for (size_t f : members_[unit]) flats_[f].release();
  return {};
}

}  // namespace tessera
