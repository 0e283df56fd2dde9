// Residency: fetch, complete and release of FlatUnits with a sharded home, run from a plan
// (residency.h).
#include "memory/residency/residency.h"

#include "core/error.h"

namespace tessera {

Residency::Residency(std::vector<FlatUnit>& flats, std::vector<std::vector<size_t>> members, ResidencyPlan plan)
    : flats_(flats), members_(std::move(members)), plan_(std::move(plan)), fetches_(flats.size()) {
  require(members_.size() == plan_.ends_unit() + 1, "internal: a residency plan for ", plan_.ends_unit() + 1,
          " units over ", members_.size());
  std::vector<int> seen(flats_.size(), 0);
  for (const auto& m : members_) {
    require(!m.empty(), "internal: a residency unit without FlatUnits");
    for (size_t f : m) require(f < flats_.size() && seen[f]++ == 0, "internal: FlatUnit ", f, " in two residency units");
  }
}

void Residency::at(Pass pass, const ResidencyPoint& point) {
  for (const ResidencyAction& a : plan_.at(pass, point)) {
    switch (a.kind) {
      case ResidencyAction::Kind::fetch: fetch(a.unit); break;
      case ResidencyAction::Kind::complete: complete(a.unit); break;
      case ResidencyAction::Kind::release: release(a.unit); break;
    }
  }
}

void Residency::fetch(size_t unit) {
  for (size_t f : members_[unit]) {
    if (fetches_[f].pending() || flats_[f].materialized()) continue;
    flats_[f].materialize();
    fetches_[f] = flats_[f].gather_async();
  }
}

void Residency::complete(size_t unit) {
  fetch(unit);
  for (size_t f : members_[unit]) {
    if (!fetches_[f].pending()) continue;
    fetches_[f].wait();
    fetches_[f] = comm::Work();
  }
}

void Residency::release(size_t unit) {
  for (size_t f : members_[unit]) {
    if (fetches_[f].pending()) {  // a gather in flight is completed before its storage goes
      fetches_[f].wait();
      fetches_[f] = comm::Work();
    }
    flats_[f].release();
  }
}

bool Residency::resident(size_t unit) const {
  for (size_t f : members_[unit])
    if (!flats_[f].materialized() || fetches_[f].pending()) return false;
  return true;
}

void Residency::release_all() {
  for (size_t u = 0; u < members_.size(); ++u) release(u);
}

}  // namespace tessera
