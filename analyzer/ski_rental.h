// The ski-rental mitigation planner (FALCON §5, Algorithm 1): when to stop tolerating a
// fail-slow and pay for a mitigation. Candidates by root cause, each with an overhead (seconds
// of lost training it costs to apply):
//   compute fail-slow:       S2 re-balance micro-batches, S3 adjust topology, S4 restart;
//   communication fail-slow: adapt the pipeline (new warm-up counts, Adaptra), S3, S4.
// S1 (ignore) is where every fail-slow starts. Candidates are tried in order of overhead. The
// planner is fed iteration samples from the onset on; each adds its slowdown
// iterations x max(0, t - t_healthy) to the accumulated slowdown. When the switch budget reaches
// the overhead of a strategy not yet applied, the planner recommends the most expensive such
// strategy it can afford (cheaper ones are skipped), pays its overhead, and goes on from there.
// The budget (SwitchRule):
//   kCostSinceOnset (default): accumulated slowdown + overheads already paid, i.e. everything
//     the fail-slow has cost so far, so no switch comes before the fail-slow has cost as much
//     as the switch. Against one candidate this is classic ski rental: at most 2 x the offline
//     optimum (the best single strategy chosen at the onset knowing the duration) + one
//     sample's slowdown. Along a chain, an endless fail-slow costs at most 2 x the last
//     overhead + one sample when each overhead is at least twice the one before (the usual
//     seconds / minutes / tens of minutes); one that ends just after an escalation can cost
//     more than 2 x the optimum (multi-slope ski rental has no 2x rule; 2.4x in the tests).
//   kSlowdownSinceOnset: accumulated slowdown alone, FALCON's Algorithm 1 as we read it; it
//     ignores what earlier switches cost, so escalating to S4 can cost 2 c4 + c2 + c3 + one
//     sample's slowdown.
// The fail-slow ends by End() (the detector saw the fault go away; with a mitigation in place
// the iteration times alone cannot tell), or, while nothing has been applied, when
// recovery_samples samples in a row are within recovery_tolerance of healthy. Either way the
// planner says stop, and whether S2's re-balancing is still in effect and must be undone
// (MicrobatchPlan's UndoMicrobatchPlan), and likewise whether adapted warm-up counts are; a
// restart (S4) resets both by itself.
// Thread-safety: a SkiRentalPlanner is a plain value; callers serialise access to one instance.
// Must never: do I/O, read clocks or globals (time arrives in the samples), or recommend a
// strategy outside the root cause's candidates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "falcon/status.h"

namespace falcon::analyzer {

enum class Strategy : std::uint8_t {
  kIgnore,                 // S1
  kRebalanceMicrobatches,  // S2
  kAdjustTopology,         // S3
  kCheckpointRestart,      // S4
  kAdaptPipeline,          // per-stage warm-up counts for a slow pipeline link (between S2 and S3)
};
// "S1 ignore", "S2 re-balance micro-batches", "S3 adjust topology", "S4 checkpoint-restart",
// "pipeline adaptation".
[[nodiscard]] const char* StrategyName(Strategy strategy);

enum class RootCause : std::uint8_t { kCompute, kCommunication };
enum class SwitchRule : std::uint8_t { kCostSinceOnset, kSlowdownSinceOnset };

// Seconds of lost training per strategy, >= 0; +infinity marks a strategy unavailable (e.g. no
// checkpoint). Defaults are rough figures for a large job; feed measured ones through
// SetOverhead: S2 = solve time + pause to apply, S3 = pause + communicator rebuild, S4 =
// checkpoint save + restart + load + warm-up.
struct StrategyOverheads {
  double rebalance_s = 10;
  double topology_s = 120;
  double restart_s = 900;
  double pipeline_s = 2;  // a switch of schedule at an iteration boundary: no pause, no state moved
};

struct SkiRentalOptions {
  StrategyOverheads overheads;
  SwitchRule rule = SwitchRule::kCostSinceOnset;
  double recovery_tolerance = 0.05;  // t <= (1 + this) x t_healthy counts as recovered (S1 only)
  std::int32_t recovery_samples = 3;
};

// One observation: `iterations` iterations that ended at time_s took iteration_s each (mean),
// where a healthy one takes healthy_iteration_s.
struct IterationSample {
  double time_s = 0;
  double iteration_s = 0;
  double healthy_iteration_s = 0;
  std::int64_t iterations = 1;
};

enum class DecisionKind : std::uint8_t { kSwitch, kStop };

struct MitigationDecision {
  DecisionKind kind = DecisionKind::kSwitch;
  Strategy from = Strategy::kIgnore;
  Strategy to = Strategy::kIgnore;  // kIgnore for kStop
  double time_s = 0;
  double accumulated_slowdown_s = 0;  // since the onset, when the decision was taken
  double overheads_paid_s = 0;        // before this decision
  double overhead_s = 0;              // of `to` (0 for kStop)
  bool undo_rebalance = false;        // kStop only: S2's plan is in effect; undo it
  bool undo_pipeline = false;         // kStop only: adapted warm-up counts are in effect; undo them
  std::string reason;
};

// Everything a planner has learnt since the onset, so a restarted controller carries on where its
// predecessor stopped (the controller keeps it in Redis). Overheads come from the options.
struct SkiRentalSnapshot {
  std::vector<Strategy> applied;  // in the order they were applied
  bool rebalance_in_effect = false;
  bool pipeline_in_effect = false;
  bool stopped = false;
  double slowdown_s = 0;
  double paid_s = 0;
  double last_time_s = 0;
  std::int32_t calm_samples = 0;
};

class SkiRentalPlanner {
 public:
  // InvalidArgument for a negative or NaN overhead, a negative or non-finite tolerance, or
  // recovery_samples < 1.
  [[nodiscard]] static Result<SkiRentalPlanner> Create(RootCause cause,
                                                       const SkiRentalOptions& options = {});

  // A planner in the state of `snapshot`. Create's errors, plus InvalidArgument for an applied
  // strategy that is not a candidate of `cause` (or kIgnore), one applied twice, or negative or
  // non-finite sums.
  [[nodiscard]] static Result<SkiRentalPlanner> Restore(RootCause cause,
                                                        const SkiRentalOptions& options,
                                                        const SkiRentalSnapshot& snapshot);
  [[nodiscard]] SkiRentalSnapshot Snapshot() const;

  // Adds a sample; returns a decision when one is due, nullopt otherwise. InvalidArgument for a
  // non-finite or non-positive time, iterations < 1, time going backwards, or after a stop.
  [[nodiscard]] Result<std::optional<MitigationDecision>> Observe(const IterationSample& sample);

  // The fail-slow is over: the stop decision. InvalidArgument after a stop or for a bad time.
  [[nodiscard]] Result<MitigationDecision> End(double time_s);

  // A measured overhead. Candidates not yet applied are re-sorted. InvalidArgument for a
  // strategy that is not a candidate of this root cause, or a negative or NaN value.
  [[nodiscard]] Status SetOverhead(Strategy strategy, double seconds);

  Strategy current() const { return current_; }
  bool stopped() const { return stopped_; }
  double accumulated_slowdown_s() const { return slowdown_s_; }
  double overheads_paid_s() const { return paid_s_; }
  // The candidates not yet applied, cheapest first.
  std::vector<Strategy> remaining() const;

 private:
  struct Candidate {
    Strategy strategy;
    double overhead_s;
  };
  SkiRentalPlanner(RootCause cause, const SkiRentalOptions& options);
  Status CheckTime(double time_s) const;
  std::optional<MitigationDecision> MaybeSwitch(double time_s);
  MitigationDecision Stop(double time_s, const std::string& why);

  // Fixed after construction.
  SkiRentalOptions options_;
  // State, changed by Observe / End / SetOverhead.
  std::vector<Candidate> candidates_;  // [0, next_) applied; [next_, end) sorted by overhead
  std::size_t next_ = 0;
  Strategy current_ = Strategy::kIgnore;
  bool rebalance_in_effect_ = false;
  bool pipeline_in_effect_ = false;
  bool stopped_ = false;
  double slowdown_s_ = 0;
  double paid_s_ = 0;
  double last_time_s_ = 0;
  std::int32_t calm_samples_ = 0;
};

}  // namespace falcon::analyzer
