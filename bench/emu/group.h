// Group semantics (ncclGroupStart/End/SimulateEnd); the engine that runs the ops is engine.h.
//
// Thread-safety: group state is per thread (as in NCCL). Invariants:
//  1. Outside a group, Submit() runs the op at once: to completion on a blocking communicator,
//     in the background on a nonblocking one (ncclInProgress).
//  2. Inside a group (depth > 0), Submit() only queues; the outermost GroupEnd launches all queued
//     ops in submission order and runs them together: in this thread until every one is done or
//     failed if every communicator involved is blocking, as one background job returning
//     ncclInProgress if every one is nonblocking; a group mixing both fails with
//     ncclInvalidArgument (as in NCCL) and runs nothing.
// Must never: throw; wait without polling for aborts (Op::Poll).
#ifndef FALCON_BENCH_EMU_GROUP_H_
#define FALCON_BENCH_EMU_GROUP_H_

#include <nccl.h>

#include <memory>
#include <vector>

#include "op.h"

namespace falcon::emu {

// Queues (in a group) or runs (outside) `op`. Returns the op's result when run now.
[[nodiscard]] ncclResult_t Submit(std::unique_ptr<Op> op);
// Records a call-time validation failure inside a group; GroupEnd returns it.
void NoteGroupError(ncclResult_t code);
[[nodiscard]] bool InGroup();
// True if the calling thread's open group holds an op on `comm`.
[[nodiscard]] bool GroupHasOpsOn(const ncclComm* comm);

ncclResult_t GroupStart();
ncclResult_t GroupEnd();
ncclResult_t GroupSimulateEnd(ncclSimInfo_t* info);

}  // namespace falcon::emu

#endif  // FALCON_BENCH_EMU_GROUP_H_
