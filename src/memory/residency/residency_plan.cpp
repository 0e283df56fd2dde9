// ResidencyPlan: the action table, its check by simulation, its printout and the ZeRO-3 plan
// (residency_plan.h).
#include "memory/residency/residency_plan.h"

#include <sstream>

#include "core/error.h"

namespace tessera {
namespace {

using Point = ResidencyPoint;
using Action = ResidencyAction;

ModelPart embedding() { return ModelPart::embedding(); }
ModelPart head() { return ModelPart::head(); }
ModelPart block(int64_t l) { return ModelPart::block(l); }

std::string name_of(const Point& p) {
  switch (p.kind) {
    case Point::Kind::before_forward: return "before forward " + p.part.name();
    case Point::Kind::after_forward: return "after forward " + p.part.name();
    case Point::Kind::before_backward: return "before backward " + p.part.name();
    case Point::Kind::after_reduction: return "after reduction " + p.part.name();
  }
  return "";
}

const char* name_of(Pass pass) { return pass == Pass::training ? "training" : "inference"; }

// The points of a pass in the order the pass meets them.
std::vector<Point> sequence(Pass pass, int64_t blocks) {
  std::vector<Point> points{{Point::Kind::before_forward, embedding()}, {Point::Kind::after_forward, embedding()}};
  for (int64_t l = 0; l < blocks; ++l) {
    points.push_back({Point::Kind::before_forward, block(l)});
    points.push_back({Point::Kind::after_forward, block(l)});
  }
  points.push_back({Point::Kind::before_forward, head()});
  points.push_back({Point::Kind::after_forward, head()});
  if (pass == Pass::inference) return points;
  for (int64_t l = blocks - 1; l >= 0; --l) {
    points.push_back({Point::Kind::before_backward, block(l)});
    points.push_back({Point::Kind::after_reduction, block(l)});
  }
  points.push_back({Point::Kind::after_reduction, embedding()});
  return points;
}

}  // namespace

ResidencyPlan::ResidencyPlan(int64_t blocks) : blocks_(blocks) {
  require(blocks >= 1, "internal: a residency plan needs at least one block (got ", blocks, ")");
}

size_t ResidencyPlan::unit_of(const ModelPart& part) const {
  return part.kind == ModelPart::Kind::block ? static_cast<size_t>(part.layer) : ends_unit();
}

void ResidencyPlan::add(Pass pass, const ResidencyPoint& point, ResidencyAction action) {
  require(action.unit <= ends_unit(), "internal: residency action on unit ", action.unit, " of ", ends_unit() + 1);
  (pass == Pass::training ? training_ : inference_)[point].push_back(action);
}

const std::vector<ResidencyAction>& ResidencyPlan::at(Pass pass, const ResidencyPoint& point) const {
  static const std::vector<ResidencyAction> none;
  const auto& table = pass == Pass::training ? training_ : inference_;
  const auto it = table.find(point);
  return it == table.end() ? none : it->second;
}

void ResidencyPlan::validate() const {
  enum class State { released, in_flight, resident };
  for (Pass pass : {Pass::training, Pass::inference}) {
    std::vector<State> state(ends_unit() + 1, State::released);
    auto need = [&](const Point& point, size_t unit, const char* use) {
      require(state[unit] == State::resident, "residency plan (", name_of(pass), "): unit ", unit,
              " is not resident for ", use, " at ", name_of(point));
    };
    for (const Point& point : sequence(pass, blocks_)) {
      for (const Action& a : at(pass, point)) {
        State& s = state[a.unit];
        switch (a.kind) {
          case Action::Kind::fetch: if (s == State::released) s = State::in_flight; break;
          case Action::Kind::complete: s = State::resident; break;
          case Action::Kind::release: s = State::released; break;
        }
      }
      if (point.kind == Point::Kind::before_forward) need(point, unit_of(point.part), "its forward");
      if (point.kind == Point::Kind::before_backward) need(point, unit_of(point.part), "its backward");
      if (pass == Pass::training && point.kind == Point::Kind::after_forward && point.part == head())
        need(point, ends_unit(), "the head's backward");
    }
    for (size_t u = 0; u < state.size(); ++u)
      require(state[u] == State::released, "residency plan (", name_of(pass), "): unit ", u,
              state[u] == State::resident ? " is still resident" : " is still being fetched", " when the pass ends");
  }
}

std::string ResidencyPlan::describe() const {
  std::ostringstream out;
  for (Pass pass : {Pass::training, Pass::inference})
    for (const Point& point : sequence(pass, blocks_)) {
      const auto& actions = at(pass, point);
      if (actions.empty()) continue;
      out << name_of(pass) << "  " << name_of(point) << ":";
      const char* sep = " ";
      for (const Action& a : actions) {
        out << sep << (a.kind == Action::Kind::fetch ? "fetch " : a.kind == Action::Kind::complete ? "complete " : "release ")
            << a.unit;
        sep = ", ";
      }
      out << "\n";
    }
  return out.str();
}

ResidencyPlan zero3_plan(int64_t blocks) {
  ResidencyPlan plan(blocks);
  const size_t ends = plan.ends_unit();
  auto unit = [](int64_t l) { return static_cast<size_t>(l); };
  for (Pass pass : {Pass::training, Pass::inference}) {
    auto add = [&](Point::Kind kind, ModelPart part, Action::Kind action, size_t u) {
      plan.add(pass, {kind, part}, {action, u});
    };
    add(Point::Kind::before_forward, embedding(), Action::Kind::complete, ends);
    add(Point::Kind::before_forward, embedding(), Action::Kind::fetch, 0);
    add(Point::Kind::after_forward, embedding(), Action::Kind::release, ends);
    for (int64_t l = 0; l < blocks; ++l) {
      add(Point::Kind::before_forward, block(l), Action::Kind::complete, unit(l));
      add(Point::Kind::before_forward, block(l), Action::Kind::fetch, l + 1 < blocks ? unit(l + 1) : ends);
      add(Point::Kind::after_forward, block(l), Action::Kind::release, unit(l));
    }
    add(Point::Kind::before_forward, head(), Action::Kind::complete, ends);
    if (pass == Pass::inference) {
      add(Point::Kind::after_forward, head(), Action::Kind::release, ends);
      continue;
    }
    for (int64_t l = blocks - 1; l >= 0; --l) {
      if (l == blocks - 1) add(Point::Kind::before_backward, block(l), Action::Kind::release, ends);
      add(Point::Kind::before_backward, block(l), Action::Kind::complete, unit(l));
      if (l > 0) add(Point::Kind::before_backward, block(l), Action::Kind::fetch, unit(l - 1));
      add(Point::Kind::after_reduction, block(l), Action::Kind::release, unit(l));
    }
  }
  plan.validate();
  return plan;
}

}  // namespace tessera
