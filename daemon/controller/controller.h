// Controller: falcon-controller's loop (DESIGN.md "The controller"; FALCON §4). One per job.
//
//   tracking ──slow alarm──▶ profiling ──profiles in──▶ validating ──done──▶ tracking
//      ▲  (incident opened:        (event timing on,        (pause at a cut, GEMM on every rank,
//      │   "detection")             classes, suspicion)       P2P passes, resume, Localize:
//      │  TrackingStage            ProfilingStage            "localisation")
//      │                                                     ValidationStage (ValidationRun)
//      └── every slow rank recovered: "resolution", incident closed
//   while an incident is localised: DecisionStage (S1 → S2 → S3 → S4, "decision")
//   beside them, whatever the phase: HangStage (stalls, hangs), MismatchStage (call signatures)
//
// The stages are their own units (tracking_stage.h, profiling_stage.h, validation_stage.h,
// decision_stage.h, hang_stage.h, mismatch_stage.h): value types that never talk to Redis or read
// the wall clock; Controller feeds them validated messages and the time, and sends and writes
// the commands, plans and incident entries they return. Controller keeps the phase transitions,
// the incident and the persisted state.
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
// The busy report streams are trimmed behind the cursors of the last state written, less
// stream-retention-s (TrimStreams), so a restarted controller never misses what it reads on from.
// A key of the wrong type costs only itself: a rank or agent key is skipped, a stream is set
// aside and probed again with backoff; a step that keeps failing backs off (bounded), is
// logged once per distinct error, and the state is still saved every heartbeat.
//
// The loop is an event loop (Boost.Asio, on the thread that calls Run()): a turn timer (every
// tick-ms, every 50 ms while a validation runs, or after the step or reconnect backoff) runs the
// stages; the blocking read of the report streams (XREAD BLOCK tick-ms) runs on a worker thread
// of its own ("redis-read") and its entries, parsed and validated there, come back as an event
// that is dispatched to the stages and followed by a turn at once. One read is in flight at a
// time, started when a turn is done (so it takes in what arrived during the turn); a read
// started before a reconnect (whose cursors may have been reset) is discarded.
// Thread-safety: one thread runs Run(); `stop` may be set from any thread (signal handler
// flag), and is looked at every 50 ms. Every wait of the loop thread is a timer or a Redis write
// bounded by its timeout.
// Must never: act on a message that failed validation, pause without also resuming (the shims'
// max_pause_s backs this up), or block longer than the Redis timeouts.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <spdlog/logger.h>

#include <atomic>
#include <functional>
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
#include "daemon/controller/tracking_stage.h"
#include "daemon/controller/job_view.h"
#include "daemon/controller/profiling_stage.h"
#include "daemon/controller/rank_key_cache.h"
#include "daemon/controller/recovery_watch.h"
#include "daemon/controller/validation_stage.h"
#include "daemon/redis/redis_connection.h"
#include "daemon/redis/redis_worker.h"
#include "falcon/protocol.h"

namespace falcon::controller {

inline constexpr const char* kControllerVersion = "0.1.0";

class Controller {
 public:
  Controller(ControllerConfig config, std::shared_ptr<spdlog::logger> log);

  // Runs until `stop` is true. Returns the process exit code (0).
  int Run(const std::atomic<bool>& stop);

 private:
  static std::int64_t WallNs();  // CLOCK_REALTIME, ns: what every message and entry carries

  // Redis side (controller_io.cc).
  bool EnsureConnected(std::int64_t now_ns);
  Status LoadState(std::int64_t now_ns);
  Status CheckCursors();
  Status SaveState(std::int64_t now_ns);
  // A key Redis refuses (wrong type) is logged once, skipped, and logged again when it clears.
  Status RefreshView();
  Status ReadViewKeys(const protocol::KeySpec& spec, const protocol::MessageSpec& msg,
                      const std::function<bool(const std::string&)>& wanted,
                      const std::function<void(nlohmann::json)>& take, std::set<std::string>& seen_bad,
                      std::vector<std::string>* scanned);
  // One turn of the loop: connect (or wait for the backoff), refresh the view when due, start a
  // read, advance every stage, save the state when due; schedules the next turn.
  void Turn();
  void ScheduleTurn(int after_ms);
  // A failed step: logged (StepFailed), the connection dropped when Redis is away or garbled.
  void Failed(const Status& s);
  // The stream entries a read brought back, parsed and validated on the reader's thread.
  struct StreamMessage {
    const char* stream = "";  // cursor name
    std::string id;
    Result<nlohmann::json> message = Status::Unavailable("unread");
  };
  struct ReadOutcome {
    Status status;
    std::vector<StreamMessage> entries;
    std::vector<const char*> streams;           // the cursor names read
    std::map<std::string, std::string> behind;  // of those, each read that stopped at its page: its last id
  };
  // Starts a read of the report streams on the reader (none in flight, connected, some stream
  // readable: ProbeStreams sets aside the others).
  void StartRead();
  // The read's outcome, back on the loop: entries dispatched, cursors moved, then a turn.
  void OnRead(ReadOutcome r, std::uint64_t generation);
  void Dispatch(StreamMessage& e, std::int64_t now_ns);  // may move e's message out
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
  void OnAck(nlohmann::json m);  // moved on to the validation round
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
  Status Resolve(std::int64_t now_ns, const std::string& why);
  // The profiling stage's switch of the shims to `mode`, sent.
  Status SetMode(const std::string& mode, std::int64_t now_ns);
  // The decision stage's start, feed and publication, carried out. A decision that could not be
  // published is rolled back in the stage (DecisionStage::Unpublished), so the planner decides it
  // again (and it is published) once Redis answers.
  // `even_split`: the job runs its own micro-batch counts now (no re-balance of an earlier plan).
  Status StartMitigation(std::int64_t now_ns, bool even_split = true);
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
  // Plan level (controller_state.h): measure it again from kPlanSettleSamples samples on; a new
  // plan forgets the old level, a round keeps it until then.
  void SettlePlanLevel(Incident& inc, std::int64_t now_ns, bool keep_level) const;
  // What the job's pace under a plan in force says of its fault (controller_state.h, plan level).
  enum class UnderPlan {
    kNothing,
    kRecheck,  // faster than the plan's level allows: re-check the culprits now
    kUndo,     // a plan whose fault-free pace is known, and the job back at it: the fault ended
  };
  UnderPlan FasterUnderPlan(std::int64_t now_ns);
  // Slow alarms from before the last resolution (onset at or before the returned time) open no
  // incident while the job runs at its healthy pace: kSettleIterations healthy iterations for
  // an undone plan to take effect, then as long as the last kJudgeIterations are within the
  // suspicious ratio of healthy. 0: every alarm counts.
  static constexpr double kSettleIterations = 10;
  static constexpr std::size_t kJudgeIterations = 5;
  std::int64_t StaleBefore(std::int64_t now_ns);
  void AdoptAppliedPlacement();
  void Enter(Phase p, std::int64_t now_ns);
  const std::vector<std::int64_t>& LiveSlow() const;
  std::optional<double> CurrentIterationS() const;

  const ControllerConfig config_;
  const std::shared_ptr<spdlog::logger> log_;
  const std::int64_t started_ns_;
  const std::string command_prefix_;  // "ctl-<start ms>": every command id this controller issues

  boost::asio::io_context io_;
  boost::asio::steady_timer turn_{io_};
  boost::asio::steady_timer stop_poll_{io_};
  std::unique_ptr<redis::RedisWorker> reader_;  // the blocking stream reads (Run() starts it)
  bool read_in_flight_ = false;
  std::optional<bool> stale_held_;  // StaleBefore's last answer since the resolution, for its log
  std::uint64_t read_generation_ = 0;  // bumped at every (re)connect: older reads are stale

  std::unique_ptr<redis::RedisConnection> conn_;
  std::int64_t next_connect_ns_ = 0;
  int backoff_ms_ = 0;
  int step_backoff_ms_ = 0;       // after consecutive failed steps; 0 after a good one
  std::uint64_t step_failures_ = 0;
  std::string step_error_;        // the failure last logged
  std::set<std::string> bad_keys_;  // rank/agent keys Redis refused at the last refresh
  // What Redis refused (a key of the wrong type) is tried again after 1 s, doubling to 60 s per
  // refusal: a stream set aside, the recovery watch's commands.
  struct RefusedRetry {
    static constexpr int kMinMs = 1000;
    static constexpr int kMaxMs = 60000;
    std::int64_t retry_ns = 0;  // wall ns of the next try
    int backoff_ms = 0;
    void Refused(std::int64_t now_ns) {
      backoff_ms = std::clamp(backoff_ms * 2, kMinMs, kMaxMs);
      retry_ns = now_ns + std::int64_t{backoff_ms} * 1'000'000;
    }
    [[nodiscard]] bool Due(std::int64_t now_ns) const { return now_ns >= retry_ns; }
  };
  std::map<std::string, RefusedRetry> unreadable_;  // streams set aside, by cursor name
  bool state_loaded_ = false;

  ControllerState state_;
  TrackingStage tracking_{state_.slow};  // slow ranks and iteration times (tracking_stage.h)
  JobView view_;
  RankKeyCache rank_keys_;  // the rank keys' contents between re-reads
  std::int64_t next_view_ns_ = 0;
  std::int64_t view_refresh_ns_ = 0;  // how long the last re-read of the rank and agent keys took
  std::size_t view_keys_ = 0;         // agent keys it read and registrations it took in
  static constexpr std::int64_t kViewShareInverse = 4;  // re-reads take at most a quarter of the loop
  std::int64_t next_save_ns_ = 0;
  std::int64_t state_save_ns_ = 0;       // how long the last write of the state document took
  std::int64_t save_not_before_ns_ = 0;  // a dirty state is written from then on
  static constexpr std::int64_t kSaveShareInverse = 4;  // writes take at most a quarter of the loop
  // tracking_.slow_version() of the slow ranks last written to the hash (0: none since connecting;
  // a Redis restarted without persistence has lost them).
  std::uint64_t slow_written_version_ = 0;
  // The busy report streams trimmed behind what was read (TrimStreams): the cursors of the last
  // state written, so that nothing a restarted controller would read on from is trimmed.
  std::map<std::string, std::string> saved_cursors_;
  std::int64_t next_trim_ns_ = 0;
  bool trim_refused_ = false;        // Redis refused XTRIM MINID (before 6.2, an ACL): not asked again
  std::uint64_t trimmed_total_ = 0;  // entries removed
  void TrimStreams(std::int64_t now_ns);
  // How far the reading is behind each stream, s: the age of the last entry read (its id's time
  // on Redis's clock) when the read stopped at its page, 0 when it reached the stream's end.
  // A lag past kLagWarnS is warned once (event=stream_lagging) until it is under kLagClearS.
  std::map<std::string, double> stream_lag_s_;
  std::set<std::string> lagging_;
  static constexpr double kLagWarnS = 10;
  static constexpr double kLagClearS = 1;
  void NoteLag(const ReadOutcome& r, std::int64_t now_ns);
  bool dirty_ = true;
  ProfilingStage profiling_;  // the shims' mode and the profiles (profiling_stage.h)
  // While re-balanced micro-batches hold for slow GPUs: their groups profiled, their recovery
  // read from the peers' waits (recovery_watch.h). Not persisted: re-armed after a restart or a
  // round (which switches every shim's mode itself).
  RecoveryWatch watch_;
  std::string watch_key_;     // the incident, plan version and round the watch was armed for
  std::string arming_key_;    // the one whose arming Redis has not taken yet (sent again as is)
  std::string watch_logged_;  // the watch's readings last logged (debug), to log each change once
  // The watch's commands are best effort: one that Redis refuses (a commands stream of the wrong
  // type) must not fail the rest of every tracking turn, nor go again each turn (every set_mode
  // restarts its ranks' profile windows). After a refusal they wait for watch_retry_; a lost
  // connection is the turn's failure, as anywhere else.
  RefusedRetry watch_retry_;
  std::string watch_unsent_;  // the refusal last logged (event=recovery_watch_unsent), once each
  // Arms, re-arms or disarms the watch for the plan in force; the verdict's line when the
  // culprits' GPUs have all recovered (then the plan is undone), else nullopt.
  Result<std::optional<std::string>> Watch(std::int64_t now_ns);
  // Sends the watch's commands: true when Redis took them all, false when it refused some (logged
  // and backed off), an error only for a lost connection.
  Result<bool> SendWatch(const std::vector<OutgoingCommand>& commands, const char* action, std::int64_t now_ns);
  ValidationStage validation_;  // the round under way and its verdict (validation_stage.h)
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
