// The shim's shared-memory segment: creation, layout, and removal at exit.
//
// A Segment owns one mapping of <dir>/falcon.<uid>.<boot>.<pidns>.<pid> laid out as shm_abi.h
// describes, and the descriptor that holds the segment's liveness lock (shm_abi.h, "Segment
// liveness") until the process dies. Create() reserves every byte up front (posix_fallocate),
// so a full /dev/shm shows up as an error here and never as SIGBUS on a later write. Returns
// false, with the reason in `error`, on any failure; the caller then runs in pass-through.
// Create() never removes or overwrites a segment whose lock is held: a file left under this
// name is replaced only once the lock shows its writer is dead (a process with our pid in our
// PID namespace cannot be alive, so only a name with unknown parts can meet a live one).
// Not thread-safe: created and removed by the one thread that initialises or tears down the shim.
// The mapping is never unmapped while the process runs (other threads may still write to it);
// Unlink() only removes the name.
#pragma once

#include <time.h>

#include <cstddef>
#include <cstdint>

#include "falcon/shm_abi.h"
#include "shim/config.h"
#include "shim/fast_clock.h"

namespace falcon::shim {

struct SegmentLayout {
  uint64_t control_offset;
  uint64_t plan_offset;
  uint64_t comm_offset;
  uint64_t thread_offset;
  uint64_t lane_offset;
  uint64_t ring_offset;
  uint64_t size;
};

// Computes offsets (each 64-byte aligned) for the given capacities.
SegmentLayout ComputeLayout(const ShimConfig& config);

class Segment {
 public:
  // Creates, sizes, maps and initialises the segment; publishes the header magic last.
  [[nodiscard]] bool Create(const ShimConfig& config, char* error, size_t error_len);

  // Removes the segment's name (not the mapping). Idempotent.
  void Unlink();

  // Tells readers that the heartbeat is kept (kFalconShimHeartbeat): call once the service
  // thread runs. REQUIRES: Create() succeeded.
  void MarkHeartbeatKept();

  // In a forked child: closes the inherited lock descriptor (the lock stays the parent's) and
  // forgets the parent's segment without touching it. Async-signal-safe.
  void ForgetInForkChild();

  FalconShmHeader* header() const { return header_; }
  FalconControl* control() const { return control_; }
  FalconPlanBlock* plan() const { return plan_; }
  FalconCommEntry* comms() const { return comms_; }
  FalconThreadSlot* threads() const { return threads_; }
  FalconLane* lanes() const { return lanes_; }
  // First record slot of lane `lane`.
  FalconRecord* lane_ring(uint32_t lane) const { return ring_ + uint64_t{lane} * lane_capacity_; }
  const char* path() const { return path_; }

 private:
  FalconShmHeader* header_ = nullptr;
  FalconControl* control_ = nullptr;
  FalconPlanBlock* plan_ = nullptr;
  FalconCommEntry* comms_ = nullptr;
  FalconThreadSlot* threads_ = nullptr;
  FalconLane* lanes_ = nullptr;
  FalconRecord* ring_ = nullptr;
  uint64_t lane_capacity_ = 0;
  char path_[320] = {};
  int lock_fd_ = -1;  // open for the life of the process: its OFD lock is the liveness signal
  bool linked_ = false;
};

// CLOCK_MONOTONIC / CLOCK_REALTIME in nanoseconds (vDSO: no syscall).
inline int64_t MonoNowNs() { return SystemMonoNs(); }
inline int64_t RealNowNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

}  // namespace falcon::shim
