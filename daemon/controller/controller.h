// Controller: falcon-controller's loop (DESIGN.md "The controller"; FALCON §4). One per job.
//
//   tracking ──slow alarm──▶ profiling ──profiles in──▶ validating ──done──▶ tracking
//      ▲  (incident opened:        (event timing on,        (pause at a cut, GEMM on every rank,
//      │   "detection")             classes, suspicion)       P2P passes, resume, Localize:
//      │                           ProfilingStage            "localisation")
//      │                                                     ValidationRun
//      └── every slow rank recovered: "resolution", incident closed
//   while an incident is localised: DecisionStage (S1 → S2 → S3 → S4, "decision")
//   beside them, whatever the phase: HangStage (stalls, hangs), MismatchStage (call signatures)
//
// The stages are their own units (profiling_stage.h, validation_run.h, decision_stage.h,
// hang_stage.h, mismatch_stage.h): value types that never talk to Redis or read the wall clock;
// Controller feeds them validated messages and the time, and sends and writes the commands,
// plans and incident entries they return. Controller keeps the phase transitions, the incident
// and the persisted state.
//
// Mitigation (DecisionStage over mitigation.h), unless config mitigation = off: a localisation
// starts a ski-rental Mitigator for the incident ("decision" S1: tolerate for now, with the
// candidates). While the incident is open it is fed the job's iteration time every
// plan-sample-s; each switch is a "decision" entry with its plan and expected gain, the plan goes
// to falcon:{job}:plan (with a new plan_version) and, in act mode, to every agent as a plan
// command. Resolution ends it (undoing S2 when it is in effect). With S2 in effect the job may
// look healthy while the fault persists: every recheck-s a validation round looks again, and only
// a round that finds the culprits healthy resolves the incident.
//
// A validation that names nobody (or cannot complete) is retried after retry_after_s, at most
// max_attempts rounds per incident. Incidents go to the incidents stream and, live, to the
// alerts channel; the state (controller_state.h) is written to falcon:{job}:controller at every
// transition and every heartbeat, and read back at start, so a restarted controller carries on:
// it releases a pause its predecessor may have left (resume to every agent) and re-validates.
// Redis away: the loop reconnects with backoff; an interrupted validation is redone after
// release; cursors beyond what a restarted (empty) Redis holds start over from its beginning.
// A key of the wrong type costs only itself: a rank or agent key is skipped, a stream is set
// aside and probed again with backoff; a step that keeps failing backs off (bounded), is
// logged once per distinct error, and the state is still saved every heartbeat.
//
// Thread-safety: one thread runs Run(); `stop` may be set from any thread (signal handler
// flag). The loop's only waits are XREAD BLOCK (tick_ms) and the reconnect backoff, both bounded.
// Must never: act on a message that failed validation, pause without also resuming (the shims'
// max_pause_s backs this up), or block longer than the Redis timeouts.
#pragma once

#include <spdlog/logger.h>

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "daemon/controller/controller_config.h"
#include "daemon/controller/controller_metrics.h"
#include "daemon/controller/controller_state.h"
#include "daemon/controller/decision_stage.h"
#include "daemon/controller/hang_stage.h"
#include "daemon/controller/mismatch_stage.h"
#include "daemon/controller/job_view.h"
#include "daemon/controller/profiling_stage.h"
#include "daemon/controller/validation_run.h"
#include "daemon/redis/redis_connection.h"
#include "falcon/protocol.h"

namespace falcon::controller {

inline constexpr const char* kControllerVersion = "0.1.0";

class Controller {
 public:
  Controller(ControllerConfig config, std::shared_ptr<spdlog::logger> log);

  // Runs until `stop` is true. Returns the process exit code (0).
  int Run(const std::atomic<bool>& stop);

 private:
  // Redis side (controller_io.cc).
  bool EnsureConnected(std::int64_t now_ns);
  Status LoadState(std::int64_t now_ns);
  Status CheckCursors();
  Status SaveState(std::int64_t now_ns);
  // A key Redis refuses (wrong type) is logged once, skipped, and logged again when it clears.
  Status RefreshView();
  // Reads the report streams, except those set aside as unreadable (ProbeStreams).
  Status ReadStreams(std::int64_t now_ns, int block_ms);
  // Checks with TYPE the streams set aside whose retry time has come (`all`: every stream):
  // a key that is neither a stream nor absent is set aside (logged once) and probed again with
  // bounded exponential backoff; one that reads again is taken back (logged once).
  Status ProbeStreams(std::int64_t now_ns, bool all);
  // Bounded exponential backoff after a failed step, logged when the error changes.
  void StepFailed(const Status& s);
  Status Send(const std::vector<OutgoingCommand>& commands);
  Status WritePlan(const nlohmann::json& plan_message, const std::string& strategy);
  Status Record(const std::string& stage, const std::string& summary, nlohmann::json fields,
                const char* severity);
  // The incident stream entry Record would write, validated against the schema.
  Result<nlohmann::json> IncidentEntry(const std::string& stage, const std::string& summary,
                                       nlohmann::json fields) const;
  std::string Key(const protocol::KeySpec& spec, const std::string& host = {}) const;

  // Inputs.
  void OnAlarm(const nlohmann::json& m);
  void OnProfile(const nlohmann::json& m);
  void OnAck(const nlohmann::json& m);
  void OnIterations(const nlohmann::json& m);
  void OnRequest(const nlohmann::json& m);

  // The state machine (controller.cc).
  // One turn of the state machine (AdvancePhase); what it changed in the decision stage's
  // planner state (persisted in the incident) marks the state to be saved.
  Status Advance(std::int64_t now_ns);
  Status AdvancePhase(std::int64_t now_ns);
  Status Track(std::int64_t now_ns);
  Status ServeRequests(std::int64_t now_ns);
  Status OpenIncident(std::int64_t now_ns, const std::vector<std::int64_t>& slow);
  Status StartProfiling(std::int64_t now_ns);
  Status FinishProfiling(std::int64_t now_ns);
  Status StartValidation(std::int64_t now_ns, bool release_first);
  Status FinishValidation(std::int64_t now_ns);
  // What counts as a slow GPU or link (config ratios): for the round's re-measuring and its verdict.
  [[nodiscard]] analyzer::LocalizationOptions LocalizationOptions() const;
  Status Resolve(std::int64_t now_ns, const std::string& why);
  // The profiling stage's switch of the shims to `mode`, sent.
  Status SetMode(const std::string& mode, std::int64_t now_ns);
  // The decision stage's start, feed and publication, carried out. A decision that could not be
  // published is rolled back in the stage (DecisionStage::Unpublished), so the planner decides it
  // again (and it is published) once Redis answers.
  Status StartMitigation(std::int64_t now_ns);
  Status FeedMitigation(std::int64_t now_ns);
  Status PublishDecision(const Decision& d, std::int64_t now_ns);
  [[nodiscard]] bool CoveredByTheRound(std::int64_t onset_ns) const;
  // Part of a round's outcome (its localisation entry, a mitigation it started, stopped or
  // switched) could not be written: the incident goes back to `before` the round, which is then
  // done again, so no localisation or decision is lost to an outage. Returns `why`.
  Status RoundUnpublished(Incident before, std::int64_t now_ns, const Status& why);
  // The wait before the incident's next re-check while S2 holds: recheck-s, doubled per round
  // that found the culprits still slow.
  [[nodiscard]] double RecheckIntervalS(const Incident& inc) const;
  // Iteration times kept per rank; the job's current iteration time is their median's worst.
  static constexpr std::size_t kRecentIterations = 8;
  // Plan level (controller_state.h): measure it again from kPlanSettleSamples samples on.
  void SettlePlanLevel(Incident& inc, std::int64_t now_ns) const;
  // The job has run faster than the plan level allows for two samples: re-check now.
  bool FasterUnderPlan(std::int64_t now_ns);
  void AdoptAppliedPlacement();
  void Enter(Phase p, std::int64_t now_ns);
  std::vector<std::int64_t> LiveSlow() const;
  std::optional<double> CurrentIterationS() const;

  const ControllerConfig config_;
  const std::shared_ptr<spdlog::logger> log_;
  const std::int64_t started_ns_;

  std::unique_ptr<redis::RedisConnection> conn_;
  std::int64_t next_connect_ns_ = 0;
  int backoff_ms_ = 0;
  int step_backoff_ms_ = 0;       // after consecutive failed steps; 0 after a good one
  std::uint64_t step_failures_ = 0;
  std::string step_error_;        // the failure last logged
  std::set<std::string> bad_keys_;  // rank/agent keys Redis refused at the last refresh
  struct Unreadable {
    std::int64_t retry_ns = 0;  // wall ns of the next probe
    int backoff_ms = 0;
  };
  std::map<std::string, Unreadable> unreadable_;  // streams set aside, by cursor name
  bool state_loaded_ = false;

  ControllerState state_;
  JobView view_;
  std::int64_t next_view_ns_ = 0;
  std::int64_t next_save_ns_ = 0;
  bool dirty_ = true;
  ProfilingStage profiling_;  // the shims' mode and the profiles (profiling_stage.h)
  std::map<std::int64_t, std::deque<double>> recent_;      // last iteration samples per rank
  std::unique_ptr<ValidationRun> run_;
  MismatchStage mismatch_;  // mismatches while the job runs (mismatch_stage.h), fed and run the same way
  HangStage hang_;  // hang diagnosis (hang_stage.h): its own unit, fed here, run by AdvanceHang
  Status AdvanceHang(std::int64_t now_ns);
  DecisionStage decision_;  // the open incident's ski-rental planner (decision_stage.h)
  std::vector<nlohmann::json> requests_;  // validated controller_request messages not yet served
  std::uint64_t dropped_messages_ = 0;
  std::uint64_t step_failures_total_ = 0;
  // /metrics (controller_metrics.h): counters of what was written, and the endpoint (null: off).
  ControllerMetrics counted_;
  std::unique_ptr<MetricsEndpoint> metrics_;
  void PublishMetrics();
};

}  // namespace falcon::controller
