// DecisionStage: the controller's ski-rental decision stage (DESIGN.md "The controller", FALCON
// §5; the planner itself is mitigation.h's Mitigator). Its own unit with its own state and log
// events (event=mitigation_*, overhead_*, decision_deferred); Controller feeds it the open
// incident and the job's iteration time, and carries out what it returns (plan written, plan
// commands sent, decision entries recorded).
//  - Start: a localised incident gets a Mitigator; the decision is "S1: tolerate for now", its
//    entry naming the candidates with their overheads. How long preparing the plans took
//    (plan_s, S2's solve among them) counts towards S2's overhead from then on.
//  - Feed: while the incident is open, the planner is fed the job's iteration time at most once
//    per sample_s (the first sample covers the time since detection), after taking the overheads
//    the frameworks measured. A switch is a Decision to publish.
//  - End: the stop decision (undoing S2 when it is in effect).
//  - Publish: what a decision takes to go out: the `decision` entry, the plan message (with the
//    plan_version it is given) and, in act mode, one plan command per agent.
//  - A decision that could not be published is rolled back (Unpublished): the planner returns to
//    its state before the step, so it decides it again (and it is published) on a later try.
// The planner's state is persisted by the caller in the incident (Incident::mitigation, and
// last_feed_ns); the stage keeps the Mitigator built from it and rebuilds it after a restart or a
// rollback.
// Thread-safety: a value type for one thread (the controller loop). Must never: write or send
// anything (what goes out is returned), read the wall clock (times are the caller's; the
// monotonic clock it is given only times its own planning), or use a message it was not given
// validated. Its only side effect is its log lines.
#pragma once

#include <nlohmann/json.hpp>
#include <spdlog/logger.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/controller/controller_state.h"
#include "daemon/controller/job_view.h"
#include "daemon/controller/mitigation.h"
#include "daemon/controller/validation_run.h"

namespace falcon::controller {

struct DecisionStageOptions {
  MitigationSettings settings;
  std::string job;                      // the plan message's job
  std::string command_prefix = "ctl";   // plan command ids are <prefix>-p<n>
  // Monotonic ns: times the planning (plan_s). Must not be empty.
  std::function<std::int64_t()> monotonic_ns;
};

// One `decision` incident entry (Controller::Record writes it).
struct DecisionRecord {
  std::string summary;
  nlohmann::json fields;  // at_ns, ranks, cause, strategy, detail
  const char* severity = "info";
};

// What publishing a decision takes, in this order: write `plan` (when not null) to
// falcon:{job}:plan, send `commands` (act mode only), record `record`.
struct DecisionPublication {
  DecisionRecord record;
  nlohmann::json plan;                    // the mitigation_plan message, or null
  std::vector<OutgoingCommand> commands;  // one plan command per agent
};

class DecisionStage {
 public:
  // `log` must not be null.
  DecisionStage(DecisionStageOptions options, std::shared_ptr<spdlog::logger> log);

  // The open incident's planner, or nullptr: no mitigation, or a persisted planner that cannot be
  // read, which is dropped (logged; inc.mitigation is nulled). The stage keeps one planner: a
  // closed incident's is dropped with Forget().
  Mitigator* Current(Incident& inc);
  // Starts the mitigation of localised `inc` (its cause and findings) at S1: the entry to
  // record, or nullopt when no mitigation could start (logged; `inc` unchanged).
  // `iteration_s`: the job's iteration time now, if known; `even_split`: measured under the
  // job's own micro-batch counts (JobTiming::even_split).
  std::optional<DecisionRecord> Start(Incident& inc, const Result<JobLayout>& layout, const JobView& view,
                                      std::optional<double> iteration_s, std::int64_t now_ns, bool even_split = true);
  // Feeds the running planner of `inc` the iteration time when a sample is due: the decision to
  // publish, if it switches. Nothing without a running planner, a known iteration time or a
  // healthy time.
  std::optional<Decision> Feed(Incident& inc, const JobView& view, std::optional<double> iteration_s,
                               std::int64_t now_ns);
  // The stop decision of `inc`'s planner. REQUIRES: Current(&inc) runs (not stopped).
  Result<Decision> End(Incident& inc, std::int64_t now_ns);
  // What publishing `d` (from Start's planner, Feed or End) of `inc` takes; `plan_version`: the
  // version its plan gets, if it has one.
  DecisionPublication Publish(const Decision& d, const Incident& inc, const JobView& view, std::int32_t plan_version,
                              std::int64_t now_ns);
  // The last decision of Feed or End could not be published (`why`): `inc`'s planner goes back to
  // its state before that step.
  void Unpublished(Incident& inc, const Status& why);
  // Drops the planner: the next Current() rebuilds it from the incident.
  void Forget() { mitigator_.reset(); }
  // Whether the stage changed the incident's persisted state since the last call (to be saved).
  bool TakeChanged();

  // The overheads the job measured: MeasuredFrom(view), S2's plus plan_s().
  [[nodiscard]] MeasuredOverheads Measured(const JobView& view) const;
  [[nodiscard]] double plan_s() const { return plan_s_; }

 private:
  // One plan command of `plan` (with its plan_version) per agent of `view`.
  std::vector<OutgoingCommand> PlanCommands(const std::string& strategy, const nlohmann::json& plan, const JobView& view,
                                            std::int64_t now_ns);
  // What the frameworks measured replaces the configured overheads (logged per change).
  void TakeMeasuredOverheads(Mitigator& m, Incident& inc, const JobView& view);

  const DecisionStageOptions options_;
  const std::shared_ptr<spdlog::logger> log_;
  std::optional<Mitigator> mitigator_;  // the open incident's; mirrors its `mitigation`
  double plan_s_ = 0;  // how long preparing the last mitigation's plans took (S2's solve among them), s
  std::uint64_t commands_ = 0;  // plan commands issued
  bool changed_ = false;
  // The incident's planner state before the last Feed or End step, for Unpublished.
  nlohmann::json mitigation_before_;
  std::int64_t last_feed_before_ns_ = 0;
};

}  // namespace falcon::controller
