// Residency: fetch, complete and release of FlatUnits with a sharded home, run from a plan
// (residency.h).
#include "memory/residency/residency.h"

#include "core/error.h"

namespace tessera {

Residency::Residency(std::vector<FlatUnit>& units, comm::Group& home, ResidencyPlan plan)
    : units_(units), home_(home), plan_(std::move(plan)), fetches_(units.size()) {
  require(units_.size() == plan_.ends_unit() + 1, "internal: a residency plan for ", plan_.ends_unit() + 1,
          " units over ", units_.size());
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
  if (fetches_[unit].pending() || units_[unit].materialized()) return;
  units_[unit].materialize();
  fetches_[unit] = units_[unit].gather_async(home_);
}

void Residency::complete(size_t unit) {
  fetch(unit);
  if (!fetches_[unit].pending()) return;
  fetches_[unit].wait();
  fetches_[unit] = comm::Work();
}

void Residency::release(size_t unit) {
  if (fetches_[unit].pending()) complete(unit);
  units_[unit].release();
}

bool Residency::resident(size_t unit) const { return units_[unit].materialized() && !fetches_[unit].pending(); }

void Residency::release_all() {
  for (size_t u = 0; u < units_.size(); ++u) release(u);
}

}  // namespace tessera
