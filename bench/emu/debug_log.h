// NCCL's own debug log of calls, as the emulator writes it: with NCCL_DEBUG=INFO and COLL in
// NCCL_DEBUG_SUBSYS (or ALL), one "NCCL INFO <Op>: opCount ..." line per collective and per
// send/recv that passed its argument checks, in the real NCCL's format (src/enqueue.cc,
// ncclEnqueueCheck), to NCCL_DEBUG_FILE (%h host, %p pid substituted) or stdout. Graph-captured
// calls are logged once, when captured, as NCCL does: replays make no API call. Tools (the GPU
// kit) count these lines as an independent count of the calls a job made.
//
// Thread-safety: any thread; each line is written by one fprintf. Must never: throw, or fail a
// call because the log cannot be written (it is then skipped).
#ifndef FALCON_BENCH_EMU_DEBUG_LOG_H_
#define FALCON_BENCH_EMU_DEBUG_LOG_H_

#include <cstddef>

struct ncclComm;

namespace falcon::emu {

// `op` as NCCL names it ("AllReduce", "Send", ...); `root` is the root or the peer.
void LogCall(const char* op, const void* send, const void* recv, size_t count, int datatype, int red, int root,
             const ncclComm* comm, const void* stream);

}  // namespace falcon::emu

#endif  // FALCON_BENCH_EMU_DEBUG_LOG_H_
