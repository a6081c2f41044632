// Validation benchmarks on the rank's GPU: a cuBLAS GEMM (SGEMM, or GemmEx in bf16 / fp16) and
// NCCL send/recv between device buffers, timed with CUDA events. Used by the benchmark executor
// (bench_executor.h) when the process drives a GPU: libcuda.so.1 is already loaded and the
// trapped thread has a current context. Nothing here loads the CUDA driver into a process that
// has not loaded it itself.
//
//  - Driver entry points come from the loaded libcuda.so.1 (cuda_driver.h). cuBLAS is the
//    process's own if it has one loaded, else the first of FALCON_CUBLAS (a path),
//    libcublas.so.13/.12/.11, libcublas.so that loads; without cuBLAS a GEMM task reports
//    kFalconTaskUnsupported (one log line).
//  - Work goes to a non-blocking stream of Falcon's own, kept per context for the process's life
//    like the cuBLAS handle (creating them for every round would lengthen each pause). Buffers
//    are allocated per task and freed after it.
//  - Every wait has a deadline (`deadline_mono_ns`): the executor polls the last event. When it
//    passes, the task fails and its buffers are deliberately leaked: the device may still be
//    using them.
// Thread-safety: called only from the trapped training thread (one task at a time per process).
#pragma once

#include <cstddef>
#include <cstdint>

#include "falcon/shm_abi.h"
#include "shim/cuda_driver.h"

namespace falcon::shim {

// True when the process has the CUDA driver loaded and the calling thread has a current
// context: NCCL then needs device buffers (host buffers would fault on a GPU communicator), and
// the GEMM belongs on the GPU.
bool GpuBenchWanted();

// The streams the job's NCCL calls used (Tracer::JobStreams; null = the legacy stream).
struct GpuJobStreams {
  void* const* streams;
  size_t n;
};

// GEMM m x n x k of task.dtype (FalconGemmType) on Falcon's stream, `task.repeats` times after
// one warm-up, each timed between CUDA events on that stream (device time); fills the timing
// fields and the status of `r`. Fenced: before anything is queued, an event is recorded on each of `job`'s
// streams in this context and the GEMMs wait for them; the task fails (and runs nothing) if the
// job's work queued before it has not finished by the deadline.
FalconTaskResult GpuGemm(const FalconTask& task, FalconTaskResult r, const GpuJobStreams& job,
                         int64_t deadline_mono_ns);

// Called once per repetition of a P2P exchange (the warm-up included) with the host times around
// its enqueue, the bytes it moved and the NCCL result, for the benchmark records.
struct GpuP2pObserver {
  void (*on_call)(void* ctx, int64_t t0_ns, int64_t t1_ns, uint64_t bytes, int nccl_result);
  void* ctx;
};

// The result of a group whose end (or a nonblocking init) returned `end_result`: if
// ncclInProgress, polls ncclCommGetAsyncError on `comm` until the work is done or the deadline
// passes (then ncclInProgress is returned: the caller must abort `comm`).
int FinishNonblockingGroup(void* comm, int end_result, int64_t deadline_mono_ns);

// A send and a receive buffer on the calling thread's current device.
struct GpuP2pBuffers {
  CuDevicePtr send = 0;
  CuDevicePtr recv = 0;
};
// Allocates both (`bytes` each, the send buffer filled); false, with nothing allocated, if the
// device refuses. REQUIRES: GpuBenchWanted().
bool GpuAllocP2pBuffers(uint64_t bytes, GpuP2pBuffers* out);
// Frees both; for buffers the device no longer uses (no task on them missed its deadline).
void GpuFreeP2pBuffers(const GpuP2pBuffers& buffers);

// One exchange on `comm` (send to task.send_peer, receive from task.recv_peer, either may be
// -1) between `buffers` (of at least task.bytes), timed per repetition between events around
// the group. On a nonblocking communicator a group end that returns ncclInProgress is polled
// (ncclCommGetAsyncError) until it completes or the deadline passes. On failure the caller
// must abort `comm`: a peer may be waiting on this rank.
FalconTaskResult GpuP2p(const FalconTask& task, FalconTaskResult r, void* comm, const GpuP2pBuffers& buffers,
                        const GpuP2pObserver& observer, int64_t deadline_mono_ns);

}  // namespace falcon::shim
