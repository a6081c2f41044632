// RankFollower: the agent's view of one traced process (one shim segment): reads its new call
// records every poll (SegmentReader::Read with a ReadCursor, then PublishCursor so the shim
// counts only real losses), feeds them to the rank's RankAnalysis and CommProfiler, and carries
// the rank's identity for reports. Opens the segment read-write (cursor publishing, mode
// requests); if that is refused it follows read-only and says so (writable() false).
// Thread-safety: one owner (the agent loop). Must never: write to the segment anything but the
// reader cursor, the control block's agent→shim words and the plan block's plan; block; throw.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/agent/call_pattern.h"
#include "daemon/agent/comm_profiler.h"
#include "daemon/agent/rank_analysis.h"
#include "daemon/agent/signature_log.h"
#include "daemon/protocol/messages.h"
#include "daemon/shm/progress_reader.h"
#include "daemon/shm/record_json.h"
#include "daemon/shm/segment_dir.h"
#include "daemon/shm/segment_reader.h"
#include "falcon/status.h"

namespace falcon::agent {

struct FollowerOptions {
  RankAnalysisOptions analysis;
  SignatureLogOptions signatures;
  std::size_t read_batch = 65536;  // records per lane per poll
};

struct FollowerUpdate {
  RankUpdate analysis;
  daemon::ReadStats stats;
};

class RankFollower {
 public:
  static Result<std::unique_ptr<RankFollower>> Open(const daemon::SegmentInfo& info,
                                                    const FollowerOptions& options);

  // Reads what is new. kFinal once the process is gone (drains torn records too).
  void Poll(daemon::SegmentReader::ReadMode mode, FollowerUpdate* out);

  // Agent → shim mode request; returns the command sequence the shim will ack, 0 if read-only.
  std::uint64_t RequestMode(std::uint32_t mode, std::uint32_t sample_every);
  bool ModeApplied(std::uint64_t seq) const;

  // The plan block (shm_abi.h contract 7). DeliverPlan: Unavailable when read-only, or the
  // reason the plan does not fit; plan_version: the version the segment holds, 0 if none.
  [[nodiscard]] Status DeliverPlan(const daemon::ShmPlan& plan) { return seg_.WritePlan(plan); }
  std::uint32_t plan_version() const { return seg_.plan_version(); }
  daemon::PlanAcks plan_acks() const { return seg_.plan_acks(); }

  // Identity and state for reports (header fields left for the caller).
  protocol::RankRegistration Registration() const;
  std::vector<CommStats> TakeProfile() { return profiler_.TakeWindow(); }
  // The collectives issued since the last call (call_signatures; signature_log.h).
  bool has_signatures() const { return signatures_.empty() == false; }
  TakenSignatures TakeSignatures() { return signatures_.Take(); }
  // One period of the rank's ordered calls for a consistent cut (cut_info; call_pattern.h):
  // Unavailable with the reason when no period is locked or the calls are not periodic.
  Result<CallPatternReport> CutPattern() const;

  // Its progress on its communicators now (progress_reader.h); `now_mono_ns`: CLOCK_MONOTONIC.
  daemon::SegmentProgress Progress(std::int64_t now_mono_ns, std::size_t per_comm = 16) const;

  std::int64_t rank() const;  // rank hint, else rank in the largest communicator, else -1
  std::int32_t pid() const { return pid_; }
  const std::string& path() const { return seg_.path(); }
  const std::string& job() const { return job_; }
  bool writable() const { return writable_; }
  // The segment, for the trap's control-block words (ShimTrap). REQUIRES: writable().
  daemon::SegmentReader& segment() { return seg_; }
  const RankAnalysis& analysis() const { return analysis_; }
  std::string mode_name() const;
  // CLOCK_REALTIME - CLOCK_MONOTONIC as last published by the shim (ns).
  std::int64_t real_minus_mono_ns() const;
  std::uint64_t records() const { return records_; }
  std::uint64_t lost() const { return lost_; }
  std::string state = "live";  // live | exited | orphaned, set by the agent

 private:
  RankFollower(daemon::SegmentReader seg, bool writable, const FollowerOptions& options);
  void RefreshComms();

  daemon::SegmentReader seg_;
  bool writable_;
  FollowerOptions options_;
  daemon::ReadCursor cursor_;
  RankAnalysis analysis_;
  CommProfiler profiler_;
  CallPatternLog pattern_;
  SignatureLog signatures_;
  daemon::CommTable comms_;
  std::uint32_t comms_seen_ = 0;  // comm_used when comms_ was refreshed
  std::vector<FalconRecord> buf_;
  std::int32_t pid_;
  std::string job_;
  std::uint64_t records_ = 0;
  std::uint64_t lost_ = 0;
};

const char* ModeName(std::uint32_t mode);                 // "track", ... or "off"
std::optional<std::uint32_t> ModeFromName(std::string_view name);

}  // namespace falcon::agent
