// Residency: fetch, complete and release of FlatUnits with a sharded home, run from a plan or held
// by a schedule (residency.h).
#include "memory/residency/residency.h"

#include "core/error.h"

namespace tessera {

Residency::Residency(std::vector<FlatUnit>& flats, std::vector<std::vector<size_t>> members,
                     std::optional<ResidencyPlan> plan)
    : flats_(flats), members_(std::move(members)), plan_(std::move(plan)), fetches_(flats.size()),
      holds_(members_.size(), 0) {
  require(!plan_ || members_.size() == plan_->ends_unit() + 1, "internal: a residency plan for ",
          plan_ ? plan_->ends_unit() + 1 : 0, " units over ", members_.size());
  std::vector<int> seen(flats_.size(), 0);
  for (const auto& m : members_) {
    require(!plan_ || !m.empty(), "internal: a planned residency unit without FlatUnits");
    for (size_t f : m) require(f < flats_.size() && seen[f]++ == 0, "internal: FlatUnit ", f, " in two residency units");
  }
}

void Residency::at(Pass pass, const ResidencyPoint& point) {
  require(plan_.has_value(), "internal: a residency driven by a schedule has no plan to run");
  for (const ResidencyAction& a : plan_->at(pass, point)) {
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

void Residency::hold(size_t unit) {
  if (holds_[unit]++ == 0) fetch(unit);
}

void Residency::drop(size_t unit) {
  require(holds_[unit] > 0, "internal: dropping residency unit ", unit, ", which is not held");
  if (--holds_[unit] == 0) release(unit);
}

void Residency::release_all() {
  for (size_t u = 0; u < members_.size(); ++u) {
    require(holds_[u] == 0, "internal: releasing residency unit ", u, " while it is held");
    release(u);
  }
}

}  // namespace tessera
