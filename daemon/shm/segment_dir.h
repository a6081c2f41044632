// Discovery of shim segments in a directory (default /dev/shm): listing, liveness, reaping.
//
// A segment is "live" while its owner process runs: the pid exists AND its start time equals
// the one recorded in the segment (a reused pid is not the owner). A segment whose owner is gone
// is "orphaned" (the process crashed or was killed) or "exited" (it ran its exit handlers but
// was asked to keep the segment); orphaned and exited segments may be reaped (unlinked).
// Thread-compatible. Never modifies a live segment.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "falcon/status.h"

namespace falcon::daemon {

struct SegmentInfo {
  std::string path;
  int32_t pid = -1;
  uint32_t uid = 0;
  enum class State { kLive, kExited, kOrphaned, kUnreadable } state = State::kUnreadable;
  std::string error;  // why kUnreadable
  std::string exe;
  std::string job;
  std::string host;
  int32_t rank_hint = -1;
  uint64_t records = 0;  // ring head
  uint64_t lost = 0;
  uint32_t comms = 0;
  int64_t created_real_ns = 0;
  int64_t heartbeat_real_ns = 0;
};

const char* SegmentStateName(SegmentInfo::State s);

// The default directory: $FALCON_SHM_DIR if set, else /dev/shm.
std::string DefaultSegmentDir();

// Path of the segment of `pid` for user `uid` in `dir`.
std::string SegmentPath(const std::string& dir, uint32_t uid, int32_t pid);

// Lists segments in `dir` named falcon.<uid>.<pid>; only `uid`'s unless all_users.
Result<std::vector<SegmentInfo>> ListSegments(const std::string& dir, uint32_t uid, bool all_users);

// True if `pid` runs and started at `start_ticks` (0 = do not compare).
bool ProcessMatches(int32_t pid, uint64_t start_ticks);

// Unlinks a segment that is not live. Returns an error for a live segment.
Status ReapSegment(const SegmentInfo& info);

}  // namespace falcon::daemon
