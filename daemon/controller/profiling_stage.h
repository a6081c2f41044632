// ProfilingStage: the controller's profiling phase (DESIGN.md "The controller", FALCON §4.3). Its
// own unit with its own state and log events (event=profiled, profile_analysis_failed,
// set_mode_not_ok); Controller keeps the phase transitions, feeds it messages and sends the
// commands it returns.
//  - Mode: the shims' timing mode, track (cheap) or profile (event timing on). A switch is one
//    set_mode command per agent host of the view; its acks are awaited, and acks still missing
//    from an earlier switch no longer count.
//  - Window: a rank's profile must cover only time after its own agent switched its shims,
//    that is, begin at or after that agent's set_mode ack (`at_ns`, on the agent's own clock, so
//    clock skew between hosts does not matter). The agent opens a window at that ack, so its
//    first window after the switch counts: the stage waits one window, not one plus the spread
//    of the agents' acks. Every ack also raises `from_ns` (persisted by the caller in
//    ControllerState::profile_from_ns), the start used for a rank whose agent's ack this stage
//    did not see (a controller restarted while profiling).
//  - Ready: every set_mode ack is in and every live rank's newest profile was taken in profile
//    mode from its window start on.
//  - Analyze: AnalyzeProfiles over the live ranks' profiles of the window, as the `suspicion`
//    document (ControllerState::suspicion): suspicious communicators, their class mates (peers),
//    compute suspects, the evidence. When nothing is suspicious (or nothing could be timed), every
//    communicator of two or more members is, each against its own members (`sweep`).
//  - Size: the document is persisted with every state write and published in the incident, so
//    it grows with what is suspicious, not with the job. Past kListedComms communicators, the
//    evidence keeps the suspicious ones and counts the others by verdict (`omitted`), and a
//    sweep's list gives way to its count (`suspicious_count`): the validation stage expands it
//    again from the view (SweepComms). At 16,384 ranks a sweep listed 17,536 communicators with
//    their evidence: 3 MB in every state write of the incident, twice (the suspicion, and the
//    incident's findings).
// Thread-safety: a value type for one thread (the controller loop). Must never: send or write
// anything (commands go out through SetMode's return value), read a clock (times are the
// caller's), or use a message it was not given validated. Its only side effect is its log lines.
#pragma once

#include <nlohmann/json.hpp>
#include <spdlog/logger.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "daemon/controller/job_view.h"
#include "daemon/controller/validation_run.h"
#include "daemon/protocol/messages.h"

namespace falcon::controller {

// One set_mode command: `mode` for `ranks` (every rank of the host when absent), due within
// ack_timeout_s of now_ns. The profiling stage's switches and the recovery watch's share it.
[[nodiscard]] protocol::Command SetModeCommand(std::string id, const std::string& mode, std::int64_t now_ns,
                                               double ack_timeout_s,
                                               std::optional<std::vector<std::int64_t>> ranks = std::nullopt);

struct ProfilingStageOptions {
  std::string command_prefix = "ctl";  // set_mode command ids are <prefix>-m<n>
  double ack_timeout_s = 5;            // a set_mode command's deadline, from its issue
  double suspicious_ratio = 1.1;       // slower than this x its class median: suspicious
};

class ProfilingStage {
 public:
  // Lists and evidence longer than this are cut to what is suspicious (see "Size" above).
  static constexpr std::size_t kListedComms = 256;

  // `log` must not be null.
  ProfilingStage(ProfilingStageOptions options, std::shared_ptr<spdlog::logger> log);

  // Switches the shims to `mode` (track | profile): the set_mode commands to send, one per
  // agent host of `view` (or one broadcast for all, ToEveryAgent), each host's ack awaited.
  // mode() is `mode` from now on, whether or not they could be sent.
  std::vector<OutgoingCommand> SetMode(const std::string& mode, const JobView& view, std::int64_t now_ns);
  // The shims are in `mode` already (a predecessor switched them): nothing is sent.
  void AssumeMode(const std::string& mode) { mode_ = mode; }
  // A validated comm_profile message: the newest per rank is kept.
  void OnProfile(const nlohmann::json& m);
  // A validated ack: true when it answers one of this stage's set_mode commands (then taken:
  // its agent's window start is the ack's at_ns, and *from_ns is raised to it).
  bool OnAck(const nlohmann::json& m, std::int64_t* from_ns);
  // Whether every set_mode ack is in and every live rank of `view` (at least one) has a profile
  // taken in profile mode since its window start (its agent's ack, else `from_ns`).
  [[nodiscard]] bool Ready(const JobView& view, std::int64_t from_ns) const;
  // The suspicion document of the live ranks' profiles taken since their window starts (see above).
  [[nodiscard]] nlohmann::json Analyze(const JobView& view, std::int64_t from_ns) const;

  [[nodiscard]] const std::string& mode() const { return mode_; }
  // The newest validated comm_profile per rank, whatever the mode.
  [[nodiscard]] const std::map<std::int64_t, nlohmann::json>& profiles() const { return profiles_; }
  [[nodiscard]] std::size_t awaiting_acks() const { return mode_commands_.size(); }

 private:
  const ProfilingStageOptions options_;
  const std::shared_ptr<spdlog::logger> log_;
  std::string mode_ = "track";
  std::set<std::pair<std::string, std::string>> mode_commands_;  // (set_mode id, host) awaiting acks
  std::uint64_t commands_ = 0;                       // set_mode commands issued
  std::map<std::int64_t, nlohmann::json> profiles_;  // newest per rank
  std::map<std::string, std::int64_t> acked_at_;     // agent host -> its ack of the last switch to profile, at_ns

  // `rank`'s newest profile if it began at or after its window start, else nullptr.
  [[nodiscard]] const nlohmann::json* Current(std::int64_t rank, const RankInfo& info, std::int64_t from_ns) const;
};

}  // namespace falcon::controller
