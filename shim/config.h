// Shim configuration, read from the environment once, on the process's first NCCL call.
//
// Every variable is optional. A malformed or out-of-range value is reported once (one log line
// naming the variable, the bad value and the default used) and replaced by its default: bad
// configuration never stops the job and never disables pass-through.
//
//   FALCON_DISABLE=1          record nothing; every call passes straight through
//   FALCON_MODE               track | profile | sample | off        (default track)
//   FALCON_SAMPLE_EVERY       1..1000000, for sample mode           (default 100)
//   FALCON_SHM_DIR            directory for the segment             (default /dev/shm)
//   FALCON_RING_RECORDS       records per lane, power of two, 64..16777216 (default 32768)
//   FALCON_LANES              lanes, 2..64: each of the first LANES-1 threads that call NCCL
//                             gets its own lane; later threads share the last (default 4;
//                             default segment: 4 x 32768 x 128 B = 16 MiB)
//   FALCON_COMM_CAPACITY      16..65536 communicator entries        (default 1024)
//   FALCON_THREAD_CAPACITY    4..4096 calling-thread slots          (default 256)
//   FALCON_KEEP_SEGMENT=1     keep the segment after a normal exit  (default: removed)
//   FALCON_DEVICE_PROGRESS=0  do not track device completion per call (shm_abi.h contract 8;
//                             default 1: one event per ordered call where a CUDA driver is loaded)
//   FALCON_JOB                job name stored in the segment        (default empty)
//   FALCON_LOG                quiet | warn | info | debug           (default warn)
//   FALCON_NCCL_LIBRARY       library to forward to when RTLD_NEXT finds no NCCL
//                             (default: an already-loaded libnccl.so.2)
//
// Not thread-safe by itself: LoadShimConfig runs on the one thread that initialises the shim.
#pragma once

#include <cstdint>

#include "falcon/shm_abi.h"

namespace falcon::shim {

struct ShimConfig {
  bool disabled = false;
  FalconMode mode = kFalconModeTrack;
  uint32_t sample_every = 100;
  char shm_dir[256] = FALCON_SHM_DEFAULT_DIR;
  uint64_t ring_records = 32768;  // per lane
  uint32_t lanes = 4;
  uint32_t comm_capacity = 1024;
  uint32_t thread_capacity = 256;
  bool keep_segment = false;
  bool device_progress = true;  // FALCON_DEVICE_PROGRESS
  char job[FALCON_NAME_LEN] = {};
  char nccl_library[256] = {};
  int32_t rank_hint = -1;
  int32_t local_rank_hint = -1;
};

// Reads the FALCON_* variables above (and RANK-style hints). Never fails: see file comment.
ShimConfig LoadShimConfig();

// Parses a mode name; returns false (and leaves *mode alone) for an unknown name.
bool ParseMode(const char* text, FalconMode* mode);

}  // namespace falcon::shim
