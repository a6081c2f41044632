// The progress of every traced process on this machine, from the shim segments in a directory:
// what `falcon-ctl dump` prints and `falcon-ctl hang --shm-dir` diagnoses.
// Single-threaded; reads segments only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/shm/progress_reader.h"
#include "daemon/shm/segment_dir.h"
#include "falcon/status.h"

namespace falcon::ctl {

struct LocalProgressOptions {
  std::string dir;            // "" = DefaultSegmentDir()
  std::string job;            // only segments of this $FALCON_JOB ("" = every job)
  bool all_users = false;
  bool include_exited = false;  // exited processes too (their last state: a post-mortem)
  daemon::ProgressReadOptions read;
};

struct LocalRank {
  daemon::SegmentInfo info;
  daemon::SegmentProgress progress;
  std::int64_t read_mono_ns = 0;  // CLOCK_MONOTONIC when it was read: the ages' reference
  // Seconds from `mono_ns` (a CLOCK_MONOTONIC time of the writer's, such as
  // progress.last_call_mono_ns) to the read; -1 when mono_ns is 0 (never).
  double AgeSeconds(std::int64_t mono_ns) const {
    return mono_ns == 0 ? -1.0 : static_cast<double>(read_mono_ns - mono_ns) / 1e9;
  }
};

// Live processes' progress (and exited ones' with include_exited), ordered by rank then pid.
// Unreadable segments are skipped with a line on stderr; the directory missing is an error.
Result<std::vector<LocalRank>> ReadLocalProgress(const LocalProgressOptions& options);

}  // namespace falcon::ctl
