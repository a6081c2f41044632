// Communicator creation as progress-engine state machines: rendezvous on a fresh segment
// (InitRank, InitAll, and the second half of Split/Shrink), Split (an internal all-gather of
// color/key on the parent, then a child rendezvous) and Shrink (membership computed locally from
// the exclude list; only surviving ranks call it, as NCCL specifies).
//
// Thread-safety: owned by the submitting thread. Invariants:
//  1. A child communicator's key is derived deterministically from the parent key, the parent's
//     split/shrink counter and the color (or exclude list), so all members meet on one segment.
//  2. *newcomm is written only by the submitting thread: at submission for InitRank, at launch
//     for Split/Shrink (a NCCL_SPLIT_NOCOLOR split writes NULL), with a release store, so that
//     another thread may read it to abort a blocked init. A split child's rank and size
//     are filled in later, by whichever thread drives the split, before it becomes ready.
// Must never: block, or leave a half-initialised communicator usable (state stays kInitializing
// or becomes kFailed).
#ifndef FALCON_BENCH_EMU_INIT_OP_H_
#define FALCON_BENCH_EMU_INIT_OP_H_

#include <memory>
#include <vector>

#include "op.h"

namespace falcon::emu {

// Joins `comm` (state kInitializing, rank/nranks/key set) to its segment. `global_rank` is this
// member's global rank.
[[nodiscard]] std::unique_ptr<Op> MakeInitOp(ncclComm* comm, int global_rank);
// `child_blocking`: the child's ncclConfig_t.blocking (inherited from the parent without a config).
[[nodiscard]] std::unique_ptr<Op> MakeSplitOp(ncclComm* parent, int color, int key, bool child_blocking,
                                              ncclComm** newcomm);
[[nodiscard]] std::unique_ptr<Op> MakeShrinkOp(ncclComm* parent, std::vector<int> exclude, bool child_blocking,
                                               ncclComm** newcomm);

}  // namespace falcon::emu

#endif  // FALCON_BENCH_EMU_INIT_OP_H_
