// The benchmark executor: validation tasks run on a trapped thread (trap.h) — a GEMM on this
// rank's compute device and point-to-point transfers on the job's own communicators — timed,
// with results for the agent (FalconTaskResult).
//
// Runs only on the trapped training thread, so no other NCCL call of that thread is in flight.
// Allocates its buffers per task (off the hot path) and frees them. NCCL calls go straight to
// the real library and are logged with kFalconFlagBenchmark and no per-communicator sequence
// number, so they are never mistaken for training traffic. Without a GPU the GEMM is a host
// GEMM; over the NCCL emulator, a slow-compute fault of the emulator's plan (falconEmuComputeFactor,
// looked up at run time if the process has it) stretches the measured time as it stretches the
// trainer's compute. GPU buffers and GPU GEMM are not implemented yet: such tasks report
// kFalconTaskUnsupported when the process has a CUDA driver loaded.
#pragma once

#include <cstdint>

#include "falcon/shm_abi.h"

namespace falcon::shim {

class Tracer;
struct ThreadState;

// Runs `task` and returns its result (task_seq filled in). Never throws; errors are statuses.
FalconTaskResult RunBenchmarkTask(const FalconTask& task, uint64_t task_seq, Tracer& tracer, ThreadState& ts);

}  // namespace falcon::shim
