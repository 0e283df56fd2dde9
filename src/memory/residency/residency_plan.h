// ResidencyPlan: when each unit of parameters is brought onto the compute device and when it
// leaves, as data (DESIGN.md rule 5): a table of actions at the points of a pass, run by one
// executor (Residency, residency.h), printable and checked without running a model.
//
// Parts and units. A model stage with L blocks is used in parts:
//   forward:   embedding, block 0, ..., block L-1, head
//   backward:  head, block L-1, ..., block 0, embedding
// Block l's parameters are unit l; the parameters outside the blocks (wte, wpe, ln_f) are unit L,
// "ends": wte serves the embedding and the tied head, so both ends use unit L. The embedding's
// backward reads no parameter value (the gradient of a lookup needs only the indices), so unit L
// is needed in backward only by the head's.
//
// Points, in the order a training pass meets them:
//   before_forward(p), after_forward(p)   around part p's forward
//   before_backward(l)                    backward reached block l's output (the head's backward,
//                                         or block l + 1's, is done)
//   after_reduction(u)                    unit u's gradients were handed to their reduction (the
//                                         unit's values are no longer needed by this pass)
// An inference pass (no backward) meets only the forward points.
//
// Actions: fetch u (start bringing u in; nothing if resident or in flight), complete u (u is
// resident when it returns, fetching it first if needed), release u (u's device storage is freed;
// a fetch in flight is completed first).
//
// validate() simulates both passes and refuses a plan in which a part runs (forward, or a block's
// or the head's backward) without its unit completed, or a pass ends with a unit resident or a
// fetch in flight.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/model_part.h"

namespace tessera {

enum class Pass { training, inference };

struct ResidencyPoint {
  enum class Kind { before_forward, after_forward, before_backward, after_reduction };
  Kind kind = Kind::before_forward;
  ModelPart part;  // before_backward: a block; after_reduction: the part whose unit was reduced
                   // (a block, or the embedding for the ends)
  bool operator<(const ResidencyPoint& o) const { return kind != o.kind ? kind < o.kind : part < o.part; }
};

struct ResidencyAction {
  enum class Kind { fetch, complete, release };
  Kind kind;
  size_t unit;
};

class ResidencyPlan {
 public:
  // A plan for `blocks` blocks with the ends' unit; no actions yet.
  explicit ResidencyPlan(int64_t blocks);

  int64_t blocks() const { return blocks_; }
  size_t ends_unit() const { return static_cast<size_t>(blocks_); }
  size_t unit_of(const ModelPart& part) const;

  void add(Pass pass, const ResidencyPoint& point, ResidencyAction action);
  // The actions at `point` of `pass`, in order (empty if none).
  const std::vector<ResidencyAction>& at(Pass pass, const ResidencyPoint& point) const;

  // Throws tessera::Error naming the pass, the point and the unit of the first violation.
  void validate() const;
  // One line per point with actions, in pass order: "training  before forward block 3: complete 3, fetch 4".
  std::string describe() const;

 private:
  int64_t blocks_;
  std::map<ResidencyPoint, std::vector<ResidencyAction>> training_, inference_;
};

// ZeRO-3 (Rajbhandari et al., 2020): each unit resident only around its uses, with the next unit
// fetched while the current one runs (one unit of prefetch); the ends are released between the
// embedding and the head and after the head's backward.
ResidencyPlan zero3_plan(int64_t blocks);

}  // namespace tessera
