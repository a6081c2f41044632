// Point-to-point send/recv of the emulator as progress-engine state machines over the
// per-ordered-pair channels of the communicator segment (shm_segment.h, invariant 4).
//
// A message of B bytes travels as max(1, ceil(B / p2p_chunk_bytes)) chunks through a
// double-buffered channel; each chunk header names the message index and total size. A receive
// whose byte size differs from the send's behaves as in NCCL, which does not check: it never
// completes (nor does the send), until the lenient deadline (FALCON_EMU_TIMEOUT_S), where it fails
// with ncclInvalidUsage and a "size mismatch" message, else until ncclCommAbort; it never writes
// past the receiver's count. Equal byte sizes with different datatypes just copy the bytes.
// Messages between a pair are matched in order, as in NCCL. Both sides leave at
// max(send arrival, recv arrival) + modelled p2p time.
//
// Thread-safety: owned by the submitting thread. Invariant: a rank runs its sends to one peer
// (and its receives from one peer) strictly in launch order (sends_done[peer] == msg index).
// Must never: block, or copy more than the receiver's count into its buffer.
#ifndef FALCON_BENCH_EMU_P2P_OP_H_
#define FALCON_BENCH_EMU_P2P_OP_H_

#include <memory>

#include "datatypes.h"
#include "op.h"

namespace falcon::emu {

struct P2pArgs {
  bool is_send = true;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  DType dtype = DType::kFloat32;
  int peer = 0;
};

[[nodiscard]] std::unique_ptr<Op> MakeP2pOp(ncclComm* comm, const P2pArgs& args);

}  // namespace falcon::emu

#endif  // FALCON_BENCH_EMU_P2P_OP_H_
