// Collective operations of the emulator as progress-engine state machines.
//
// Every collective runs as R >= 1 rounds over the communicator's staging slots (shm_segment.h):
// in each round every rank posts one slot (its share of the round, possibly empty), waits until
// all ranks posted, computes its output piece from the slots, and marks the step consumed. Each
// round moves at most slot_bytes per rank, so any message size works with bounded memory.
// Reductions fold the slots in rank order 0..n-1, so every rank computes bit-identical results.
// Round 0 also carries each rank's arrival time and call signature. As NCCL, which compares
// nothing: calls whose op, byte size (count x element size), nranks and root agree run, even if
// their datatypes or reductions differ (each rank computes with its own: silent garbage, within
// its own buffers; a round moves the same bytes whatever the datatype); any other mismatch never
// completes on any member: until the lenient deadline (FALCON_EMU_TIMEOUT_S), where it fails
// with ncclInvalidUsage and a "call mismatch" message naming both signatures, else until
// ncclCommAbort. After the data moves, a rank leaves at max(arrival) + modelled duration
// (fabric_model.h).
//
// Thread-safety: owned by the submitting thread (op.h). Invariants:
//  1. A CollOp starts only when all earlier collectives of its communicator (in this rank) are
//     done (colls_done == coll_index), so a rank's steps are posted in order.
//  2. A slot of step s is written only after every rank consumed step s-2 (double buffering).
// Must never: write outside the user's buffers (count, datatype and nranks bound every copy), block.
#ifndef FALCON_BENCH_EMU_COLL_OP_H_
#define FALCON_BENCH_EMU_COLL_OP_H_

#include <memory>

#include "datatypes.h"
#include "fabric_model.h"
#include "op.h"

namespace falcon::emu {

// A reduction as the data path sees it.
struct RedSpec {
  int code = 0;  // ncclRedOp_t base: 0..4 builtin, 5 = PreMulSum (compared across ranks)
  RedKind kind = RedKind::kSum;
  bool premul = false;         // multiply inputs by `scalar` (or by *device_ptr) before the sum
  const void* device_ptr = nullptr;
  Scalar scalar;
  bool int_avg = false;        // integer Avg: divide the sum by nranks
};

struct CollArgs {
  CollKind kind = CollKind::kAllReduce;
  const char* name = "";  // NCCL function name for messages
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  // per-rank block count (AllGather: sendcount, ReduceScatter: recvcount)
  DType dtype = DType::kFloat32;
  RedSpec red;
  int root = 0;
};

[[nodiscard]] std::unique_ptr<Op> MakeCollOp(ncclComm* comm, const CollArgs& args);

}  // namespace falcon::emu

#endif  // FALCON_BENCH_EMU_COLL_OP_H_
