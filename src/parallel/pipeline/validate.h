// Checking a schedule table before any work runs. validate_schedule throws tessera::Error naming
// the rank and the action, followed by the table's grid with the action marked ([0F3]), when:
//   - the table has another number of rows than pp, or an action names a stage or micro-batch
//     outside the run, or sits on a rank that does not hold its stage;
//   - a (stage, micro-batch) lacks its F, or its backward (one B, or one I and one W: each
//     backward chooses, DualPipeV splits only some), or has one twice;
//   - on its rank, a B/I comes before its F, or a W before its I;
//   - a transfer between ranks lacks its SEND after the producer or its RECV before the consumer,
//     has one twice, or a SEND/RECV stands where no transfer is (same rank, first/last stage);
//   - replayed (simulate.h), some rank can never go on: a receive whose send comes after a
//     receive the sender itself waits on, i.e. a cycle across ranks (a deadlock), named with
//     every blocked rank and what it waits for;
//   - a rank holds more activations than the schedule states (Schedule::peak_limit);
//   - parameter actions: in a table with any GATHER, a compute action on a stage that is not
//     gathered on its rank (GATHERs and RELEASEs are holds, counted per stage: none left since
//     its last RELEASE), a RELEASE of a stage not held, a stage left held at the end; an OPTIM
//     twice on a rank, before one of the rank's compute actions, or on some ranks only.
#pragma once

#include "parallel/pipeline/schedule.h"

namespace tessera::pipeline {

void validate_schedule(const Schedule& schedule);

}  // namespace tessera::pipeline
