// The progress of every traced process on this machine, from the shim segments in a directory:
// what `falcon-ctl dump` prints and `falcon-ctl hang --shm-dir` diagnoses.
// Single-threaded; reads segments only.
#pragma once

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
};

// Live processes' progress (and exited ones' with include_exited), ordered by rank then pid.
// Unreadable segments are skipped with a line on stderr; the directory missing is an error.
Result<std::vector<LocalRank>> ReadLocalProgress(const LocalProgressOptions& options);

}  // namespace falcon::ctl
