// Residency: fetch, complete and release of units with a home, run from a plan, held by a
// schedule or driven by a swap plan (residency.h).
#include "memory/residency/residency.h"

#include "core/error.h"

namespace tessera {

Residency::Residency(Home& home, std::optional<ResidencyPlan> plan)
    : home_(home), plan_(std::move(plan)), fetches_(home.units()), before_(home.units()), readers_(home.units()),
      holds_(home.units(), 0) {
  require(!plan_ || home_.units() == plan_->ends_unit() + 1, "internal: a residency plan for ",
          plan_ ? plan_->ends_unit() + 1 : 0, " units over ", home_.units());
}

std::vector<comm::Work> Residency::take(std::vector<comm::Work>& works) {
  std::vector<comm::Work> out;
  out.swap(works);
  return out;
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
  if (fetches_[unit].pending() || home_.materialized(unit)) return;
  fetches_[unit] = home_.fetch(unit, take(before_[unit]));
}

void Residency::complete(size_t unit) {
  fetch(unit);
  comm::Work fetch = std::move(fetches_[unit]);
  fetches_[unit] = comm::Work();
  fetch.wait();
}

void Residency::release(size_t unit) {
  std::vector<comm::Work> after = take(readers_[unit]);
  if (fetches_[unit].pending()) after.push_back(std::move(fetches_[unit]));
  fetches_[unit] = comm::Work();
  comm::Work released = home_.release(unit, std::move(after));
  if (released.pending()) before_[unit].push_back(std::move(released));
}

bool Residency::resident(size_t unit) const { return home_.materialized(unit) && !fetches_[unit].pending(); }

void Residency::reads(size_t unit, comm::Work work) { readers_[unit].push_back(std::move(work)); }

void Residency::writes(size_t unit, comm::Work work) { before_[unit].push_back(std::move(work)); }

void Residency::hold(size_t unit) {
  if (holds_[unit]++ == 0) fetch(unit);
}

void Residency::drop(size_t unit) {
  require(holds_[unit] > 0, "internal: dropping residency unit ", unit, ", which is not held");
  if (--holds_[unit] == 0) release(unit);
}

void Residency::release_all() {
  for (size_t u = 0; u < holds_.size(); ++u) {
    require(holds_[u] == 0, "internal: releasing residency unit ", u, " while it is held");
    release(u);
  }
}

void Residency::reset() {
  for (size_t u = 0; u < holds_.size(); ++u) {
    require(holds_[u] == 0, "internal: resetting residency unit ", u, " while it is held");
    fetches_[u] = comm::Work();
    before_[u].clear();
    readers_[u].clear();
    if (home_.materialized(u)) home_.release(u, {});
  }
}

}  // namespace tessera
