// What a tensor of a run's saved state holds, declared by the component that owns it (the
// optimizer for its slots, the loss scaler, the compressor, the random streams), so that a
// checkpoint reader checks every tensor without knowing any component's names.
//
// The checks each kind gets when read (checkpoint/checkpoint_read.cpp, check_state_tensor):
//   real          floating point, finite: parameters, first moments, master weights
//   non_negative  floating point, finite, no entry below zero: second moments (a negative one
//                 resumes into NaN)
//   counter       an integer >= 0 (or floating point, finite): an optimizer's step, the loss
//                 scaler's good steps
//   bytes         not checked: random-generator states, whose validity their owner checks
//   unknown       what a reader that runs no component sees (`tessera export`): finite where
//                 floating point, any integer
#pragma once

#include <functional>
#include <string>

namespace tessera {

enum class StateKind { real, non_negative, counter, bytes, unknown };

// A state tensor's kind, by its name in the checkpoint.
using StateKindOf = std::function<StateKind(const std::string& name)>;

}  // namespace tessera
