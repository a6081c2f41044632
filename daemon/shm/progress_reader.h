// A rank's progress on its communicators (analyzer::RankProgress, the hang diagnosis's input)
// read from its live shim segment (shm_abi.h contract 8), plus the facts a stall detector needs.
//
// completed, per communicator: the calls before device_done. completion_known is false where
// calls were never tracked (no CUDA driver in the process, FALCON_DEVICE_PROGRESS=0, or calls at
// or after `marked` that were never marked: graph capture, a nonblocking call in progress, a busy
// event pool): the count is then a lower bound and the diagnosis judges nothing on the device
// there. Destroyed communicators are left out.
// recent: the latest calls with device work (collectives, sends, receives) of each communicator
// found in the last `lane_window` records of every lane, oldest first, at most `per_comm` each
// and the communicator's first pending call (if still in the window); calls of one
// ncclGroupStart/End share a group id.
// in_call: a thread inside an NCCL call that has not returned for at least `in_call_min_ns`
// (0 = the communicator is unknown: an ncclGroupEnd or an init).
// Thread-compatible (one reader per thread). Never writes to the segment.
#pragma once

#include <cstddef>
#include <cstdint>

#include "analyzer/hang_diagnosis.h"
#include "daemon/shm/segment_reader.h"

namespace falcon::daemon {

struct ProgressReadOptions {
  std::size_t lane_window = 512;  // records read back per lane
  std::size_t per_comm = 16;      // latest calls kept per communicator
  std::int64_t in_call_min_ns = 0;
};

struct SegmentProgress {
  analyzer::RankProgress progress;
  std::int64_t last_call_mono_ns = 0;  // latest ordered call on any communicator, destroyed ones too; 0: none
  std::int64_t in_call_since_mono_ns = 0;  // the oldest call in flight, 0: none
  bool device_tracked = false;  // some communicator's completion is tracked (a CUDA driver)
  bool paused = false;          // held by a Falcon pause (never a hang)
  std::uint32_t phase = 0;      // the framework's phase (FalconPhase, falcon.h)
};

// `now_mono_ns`: the reader's CLOCK_MONOTONIC (same host as the writer).
SegmentProgress ReadProgress(const SegmentReader& seg, std::int64_t now_mono_ns, const ProgressReadOptions& options = {});

}  // namespace falcon::daemon
