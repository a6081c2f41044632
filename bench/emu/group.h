// Group semantics and the progress engine (ncclGroupStart/End/SimulateEnd).
//
// Thread-safety: group state is per thread (as in NCCL); the engine drives only the calling
// thread's ops. Invariants:
//  1. Outside a group, Submit() runs the op to completion before returning.
//  2. Inside a group (depth > 0), Submit() only queues; the outermost GroupEnd launches all queued
//     ops in submission order, then polls them round-robin until every one is done or failed.
//  3. The engine never sleeps while an op made progress in the last sweep; idle sweeps back off
//     from spinning to sched_yield to nanosleep (<= 200 us), or sleep to the earliest wake time.
// Must never: spin forever (ops enforce their deadlines), throw.
#ifndef FALCON_BENCH_EMU_GROUP_H_
#define FALCON_BENCH_EMU_GROUP_H_

#include <nccl.h>

#include <memory>
#include <vector>

#include "op.h"

namespace falcon::emu {

// Queues (in a group) or runs (outside) `op`. Returns the op's result when run now.
[[nodiscard]] ncclResult_t Submit(std::unique_ptr<Op> op);
// Runs `ops` to completion; returns the first failure (or ncclSuccess).
[[nodiscard]] ncclResult_t RunOps(std::vector<std::unique_ptr<Op>>& ops);
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
