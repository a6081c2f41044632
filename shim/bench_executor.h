// The benchmark executor: validation tasks run on a trapped thread (trap.h) — a GEMM on this
// rank's compute device, and point-to-point transfers on the validation communicator Falcon
// owns (validation_comm.h), never on the job's communicators — timed, with results for the
// agent (FalconTaskResult).
//
// Runs only on the trapped training thread, so no other NCCL call of that thread is in flight.
// NCCL calls go straight to the real library and are logged with kFalconFlagBenchmark and no
// per-communicator sequence number, so they are never mistaken for training traffic.
//  - A process that drives a GPU (CUDA driver loaded, a current context on this thread): the
//    GEMM is a cuBLAS SGEMM and the transfers move device buffers, both timed with CUDA events
//    (gpu_bench.h). A CUDA process without a current context gets kFalconTaskUnsupported for
//    the validation communicator: host buffers could fault on a GPU communicator.
//    The GEMM is fenced against the job's device work queued before it (gpu_bench.h GpuGemm).
//  - Otherwise the GEMM is a host GEMM and the buffers host memory; the GEMM's time is measured
//    on the host, nothing else.
#pragma once

#include <cstdint>

#include "falcon/shm_abi.h"

namespace falcon::shim {

class Tracer;
struct ThreadState;

// The control block's task blobs (FALCON_TASK_BLOB_LEN bytes each): `in` the agent's (a copy,
// taken after task_seq), `out` the shim's answer.
struct TaskBlobs {
  const uint8_t* in;
  uint8_t* out;
};

// Runs `task` and returns its result (task_seq filled in). Never throws; errors are statuses.
// Waits end at `deadline_mono_ns` (CLOCK_MONOTONIC): the task then fails.
FalconTaskResult RunBenchmarkTask(const FalconTask& task, uint64_t task_seq, const TaskBlobs& blobs, Tracer& tracer,
                                  ThreadState& ts, int64_t deadline_mono_ns);

}  // namespace falcon::shim
