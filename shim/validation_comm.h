// The validation communicator: the one NCCL communicator Falcon owns in a process, for the P2P
// passes of a validation round. Validation never sends on the job's communicators: a rank that
// failed to post its side there (a failed allocation, an expired pause, a crash) would leave a
// peer's kernel waiting for ever, with the job's training queued behind it.
//
// Life cycle, within one pause (trap.h), driven by the agent's tasks (shm_abi.h):
//  1. kFalconTaskCommId on one rank: ncclGetUniqueId; the agents hand the id to every member.
//  2. kFalconTaskCommJoin on every member: a NONBLOCKING init (ncclConfig_t.blocking = 0) polled
//     until ready or the task's deadline, then the transfer buffers (device memory on a GPU,
//     else host memory). "ok" from every member means all have joined and can post at once; any
//     failure is reported before anybody posts.
//  3. kFalconTaskP2p with comm_slot FALCON_VALIDATION_COMM: transfers on it. A transfer that
//     fails or misses its deadline aborts the communicator (ncclCommAbort), so no peer waits on
//     this rank beyond its own deadline.
//  4. Release() when the pause ends: the communicator is aborted (local, bounded: never a
//     collective teardown that could wait for a peer) and the buffers freed — or left to the
//     device when a transfer on them may still be running.
// Thread-safety: only the trapped training thread calls it (one task at a time per process).
// Never blocks without a deadline; never touches a job's communicator.
#pragma once

#include <cstdint>

#include "falcon/shm_abi.h"
#include "shim/gpu_bench.h"

namespace falcon::shim {

class Tracer;
struct ThreadState;

class ValidationComm {
 public:
  // kFalconTaskCommId: writes the unique id into blob_out (FALCON_TASK_BLOB_LEN bytes).
  FalconTaskResult MakeId(FalconTaskResult r, uint8_t* blob_out);
  // kFalconTaskCommJoin: rank task.n of task.m, buffers of task.bytes. Leaves any earlier
  // validation communicator first.
  FalconTaskResult Join(const FalconTask& task, const uint8_t* blob, FalconTaskResult r, int64_t deadline_mono_ns);
  // kFalconTaskP2p on the validation communicator.
  FalconTaskResult P2p(const FalconTask& task, FalconTaskResult r, Tracer& tracer, ThreadState& ts,
                       int64_t deadline_mono_ns);
  // The pause ended: aborts the communicator and frees (or leaves) the buffers. Idempotent.
  void Release();

 private:
  void Abort(const char* why);

  void* comm_ = nullptr;  // ncclComm_t
  int32_t nranks_ = 0;
  int32_t rank_ = -1;
  uint64_t bytes_ = 0;
  bool device_ = false;         // buffers are device memory (gpu_) rather than host memory
  bool buffers_in_use_ = false; // a transfer on them missed its deadline: never free them
  GpuP2pBuffers gpu_;
  char* host_send_ = nullptr;
  char* host_recv_ = nullptr;
  // Host buffers a transfer may still touch after it missed its deadline: kept for the process's
  // life (reachable here, so not reported as leaks), at most kMaxRetired pairs, then let go.
  static constexpr int kMaxRetired = 32;
  char* retired_[2 * kMaxRetired] = {};
  int n_retired_ = 0;
};

}  // namespace falcon::shim
