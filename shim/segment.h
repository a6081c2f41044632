// The shim's shared-memory segment: creation, layout, and removal at exit.
//
// A Segment owns one mapping of <dir>/falcon.<uid>.<pid> laid out as shm_abi.h describes.
// Create() reserves every byte up front (posix_fallocate), so a full /dev/shm shows up as an
// error here and never as SIGBUS on a later write. Returns false, with the reason in `error`,
// on any failure; the caller then runs in pass-through.
// Not thread-safe: created and removed by the one thread that initialises or tears down the shim.
// The mapping is never unmapped while the process runs (other threads may still write to it);
// Unlink() only removes the name.
#pragma once

#include <cstddef>
#include <cstdint>

#include "falcon/shm_abi.h"
#include "shim/config.h"

namespace falcon::shim {

struct SegmentLayout {
  uint64_t control_offset;
  uint64_t comm_offset;
  uint64_t thread_offset;
  uint64_t ring_offset;
  uint64_t size;
};

// Computes offsets (each 64-byte aligned) for the given capacities.
SegmentLayout ComputeLayout(uint32_t comm_capacity, uint32_t thread_capacity, uint64_t ring_records);

class Segment {
 public:
  // Creates, sizes, maps and initialises the segment; publishes the header magic last.
  [[nodiscard]] bool Create(const ShimConfig& config, char* error, size_t error_len);

  // Removes the segment's name (not the mapping). Idempotent.
  void Unlink();

  FalconShmHeader* header() const { return header_; }
  FalconControl* control() const { return control_; }
  FalconCommEntry* comms() const { return comms_; }
  FalconThreadSlot* threads() const { return threads_; }
  FalconRecord* ring() const { return ring_; }
  const char* path() const { return path_; }

 private:
  FalconShmHeader* header_ = nullptr;
  FalconControl* control_ = nullptr;
  FalconCommEntry* comms_ = nullptr;
  FalconThreadSlot* threads_ = nullptr;
  FalconRecord* ring_ = nullptr;
  char path_[320] = {};
  bool linked_ = false;
};

// CLOCK_MONOTONIC / CLOCK_REALTIME in nanoseconds.
int64_t MonoNowNs();
int64_t RealNowNs();

}  // namespace falcon::shim
