// Tests for the ski-rental planner on simulated fail-slows: each strategy leaves a known
// per-iteration slowdown, the fail-slow lasts a given number of iterations, and the online cost
// (slowdown suffered + overheads paid) is checked against the offline optimum (the best single
// strategy applied at the onset, knowing the duration): short, medium, endless, a sweep of
// durations, recovery, measured overheads, FALCON's slowdown-only rule, and bad input.
#include "analyzer/ski_rental.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

namespace falcon::analyzer {
namespace {

constexpr double kHealthy = 1.0;
// S1..S4 and pipeline adaptation (Strategy's order): iteration time, seconds.
constexpr double kSlowByStrategy[] = {1.5, 1.1, 1.05, 1.0, 1.2};
constexpr double kLastStep = 0.5;                            // one sample's largest slowdown

double Slow(Strategy s) { return kSlowByStrategy[static_cast<int>(s)]; }

SkiRentalOptions Options(SwitchRule rule = SwitchRule::kCostSinceOnset) {
  SkiRentalOptions o;
  o.overheads = {10, 60, 300};
  // No slow pipeline link in these scenarios: the communication chain is S3, S4.
  o.overheads.pipeline_s = std::numeric_limits<double>::infinity();
  o.rule = rule;
  return o;
}

// A slow link between pipeline stages: adapting the warm-up counts (2 s) comes first.
SkiRentalOptions PipelineOptions() {
  SkiRentalOptions o = Options();
  o.overheads.pipeline_s = 2;
  return o;
}

struct Outcome {
  double cost = 0;  // slowdown suffered + overheads paid
  std::vector<MitigationDecision> decisions;
};

// A fail-slow of `iterations` iterations, one sample each, then End().
Outcome Simulate(RootCause cause, std::int64_t iterations, const SkiRentalOptions& options) {
  SkiRentalPlanner planner = SkiRentalPlanner::Create(cause, options).value();
  Outcome run;
  double now = 0;
  for (std::int64_t i = 0; i < iterations; ++i) {
    const double t = Slow(planner.current());
    now += t;
    run.cost += t - kHealthy;
    const auto decision = planner.Observe({now, t, kHealthy, 1}).value();
    if (decision) {
      EXPECT_EQ(decision->kind, DecisionKind::kSwitch);
      run.cost += decision->overhead_s;
      now += decision->overhead_s;
      run.decisions.push_back(*decision);
    }
  }
  run.decisions.push_back(planner.End(now).value());
  return run;
}

double Overhead(Strategy s, const SkiRentalOptions& o) {
  switch (s) {
    case Strategy::kIgnore: return 0;
    case Strategy::kRebalanceMicrobatches: return o.overheads.rebalance_s;
    case Strategy::kAdjustTopology: return o.overheads.topology_s;
    case Strategy::kCheckpointRestart: return o.overheads.restart_s;
    case Strategy::kAdaptPipeline: return o.overheads.pipeline_s;
  }
  return 0;
}

double OfflineOptimum(RootCause cause, std::int64_t iterations, const SkiRentalOptions& o) {
  double best = std::numeric_limits<double>::infinity();
  for (const Strategy s : {Strategy::kIgnore, Strategy::kRebalanceMicrobatches,
                           Strategy::kAdjustTopology, Strategy::kCheckpointRestart, Strategy::kAdaptPipeline}) {
    if (cause == RootCause::kCommunication && s == Strategy::kRebalanceMicrobatches) continue;
    if (cause == RootCause::kCompute && s == Strategy::kAdaptPipeline) continue;
    best = std::min(best, Overhead(s, o) + static_cast<double>(iterations) * (Slow(s) - kHealthy));
  }
  return best;
}

std::vector<Strategy> Switches(const Outcome& run) {
  std::vector<Strategy> out;
  for (const auto& d : run.decisions) {
    if (d.kind == DecisionKind::kSwitch) out.push_back(d.to);
  }
  return out;
}

TEST(SkiRentalTest, ShortFailSlowNeverPays) {
  const Outcome run = Simulate(RootCause::kCompute, 10, Options());
  EXPECT_TRUE(Switches(run).empty());
  EXPECT_DOUBLE_EQ(run.cost, 5.0);  // the slowdown itself
  EXPECT_DOUBLE_EQ(run.cost, OfflineOptimum(RootCause::kCompute, 10, Options()));
  EXPECT_EQ(run.decisions.back().kind, DecisionKind::kStop);
  EXPECT_FALSE(run.decisions.back().undo_rebalance);
}

TEST(SkiRentalTest, MediumFailSlowSwitchesToRebalanceOnly) {
  const Outcome run = Simulate(RootCause::kCompute, 200, Options());
  EXPECT_EQ(Switches(run), std::vector<Strategy>{Strategy::kRebalanceMicrobatches});
  const MitigationDecision& s2 = run.decisions.front();
  EXPECT_EQ(s2.from, Strategy::kIgnore);
  EXPECT_GE(s2.accumulated_slowdown_s, 10.0);
  EXPECT_LT(s2.accumulated_slowdown_s, 10.0 + kLastStep);
  EXPECT_NE(s2.reason.find("S2"), std::string::npos) << s2.reason;
  EXPECT_TRUE(run.decisions.back().undo_rebalance);
  EXPECT_LE(run.cost, 2 * OfflineOptimum(RootCause::kCompute, 200, Options()) + kLastStep);
}

TEST(SkiRentalTest, EndlessFailSlowEscalatesToRestartWithinTwiceTheOptimum) {
  for (const RootCause cause : {RootCause::kCompute, RootCause::kCommunication}) {
    const Outcome run = Simulate(cause, 1000000, Options());
    const std::vector<Strategy> expected =
        cause == RootCause::kCompute
            ? std::vector<Strategy>{Strategy::kRebalanceMicrobatches, Strategy::kAdjustTopology,
                                    Strategy::kCheckpointRestart}
            : std::vector<Strategy>{Strategy::kAdjustTopology, Strategy::kCheckpointRestart};
    EXPECT_EQ(Switches(run), expected);
    const double optimum = OfflineOptimum(cause, 1000000, Options());
    EXPECT_DOUBLE_EQ(optimum, 300.0);  // restart at once
    EXPECT_LE(run.cost, 2 * optimum + kLastStep);
    EXPECT_FALSE(run.decisions.back().undo_rebalance) << "the restart reset micro-batches";
  }
}

// Against one candidate (S3 unavailable, a communication fail-slow: ignore or restart) the rule
// is classic ski rental: at most 2x the optimum + one step, whatever the duration.
TEST(SkiRentalTest, OneCandidateCostsAtMostTwiceTheOptimumForEveryDuration) {
  SkiRentalOptions options = Options();
  options.overheads.topology_s = std::numeric_limits<double>::infinity();
  int checked = 0;
  for (double d = 1; d < 2e5; d *= 1.07) {
    const auto iterations = static_cast<std::int64_t>(d);
    const Outcome run = Simulate(RootCause::kCommunication, iterations, options);
    const double optimum = OfflineOptimum(RootCause::kCommunication, iterations, options);
    EXPECT_LE(run.cost, 2 * optimum + kLastStep) << iterations << " iterations";
    ++checked;
  }
  EXPECT_GT(checked, 150);
}

// Along the whole chain, a fail-slow that ends just after an escalation can cost more than 2x
// the optimum (a cheaper, partial strategy applied at once would have been enough): multi-slope
// ski rental has no 2x guarantee at every duration. On this scenario the worst is 2.26x
// (compute) and 2.38x (communication); the test pins that it stays below 2.5x.
TEST(SkiRentalTest, ChainCostStaysWithinTwoAndAHalfTimesTheOptimum) {
  double worst = 0;
  for (const RootCause cause : {RootCause::kCompute, RootCause::kCommunication}) {
    for (double d = 1; d < 2e5; d *= 1.07) {
      const auto iterations = static_cast<std::int64_t>(d);
      const Outcome run = Simulate(cause, iterations, Options());
      const double optimum = OfflineOptimum(cause, iterations, Options());
      EXPECT_LE(run.cost, 2.5 * optimum + kLastStep) << iterations << " iterations";
      worst = std::max(worst, (run.cost - kLastStep) / optimum);
    }
  }
  EXPECT_GT(worst, 2.0) << "the scenario should show the multi-slope gap";
  EXPECT_LT(worst, 2.4);
}

TEST(SkiRentalTest, SlowdownOnlyRuleIgnoresWhatSwitchesCost) {
  const SkiRentalOptions falcon = Options(SwitchRule::kSlowdownSinceOnset);
  const Outcome run = Simulate(RootCause::kCompute, 1000000, falcon);
  ASSERT_EQ(Switches(run).size(), 3U);
  const MitigationDecision& restart = run.decisions[2];
  EXPECT_EQ(restart.to, Strategy::kCheckpointRestart);
  EXPECT_GE(restart.accumulated_slowdown_s, 300.0);
  EXPECT_LT(restart.accumulated_slowdown_s, 300.0 + kLastStep);
  EXPECT_DOUBLE_EQ(restart.overheads_paid_s, 70.0);
  // 2 c4 + c2 + c3 + one step: more than twice the optimum (300 s).
  EXPECT_GT(run.cost, 2 * 300.0);
  EXPECT_LE(run.cost, 2 * 300.0 + 70.0 + kLastStep);
}

TEST(SkiRentalTest, RecoveryStopsAndUndoesTheRebalancing) {
  SkiRentalPlanner planner = SkiRentalPlanner::Create(RootCause::kCompute, Options()).value();
  double now = 0;
  std::optional<MitigationDecision> d;
  while (!d) d = planner.Observe({now += 1.5, 1.5, kHealthy, 1}).value();
  EXPECT_EQ(d->to, Strategy::kRebalanceMicrobatches);
  // Mitigated iterations look healthy; that alone does not end the fail-slow.
  for (int i = 0; i < 10; ++i) {
    EXPECT_FALSE(planner.Observe({now += 1.0, 1.0, kHealthy, 1}).value().has_value());
  }
  const MitigationDecision stop = planner.End(now).value();
  EXPECT_EQ(stop.kind, DecisionKind::kStop);
  EXPECT_EQ(stop.from, Strategy::kRebalanceMicrobatches);
  EXPECT_TRUE(stop.undo_rebalance);
  EXPECT_NE(stop.reason.find("undo"), std::string::npos);
  EXPECT_TRUE(planner.stopped());
  EXPECT_FALSE(planner.Observe({now + 1, 1.0, kHealthy, 1}).ok());
  EXPECT_FALSE(planner.End(now + 1).ok());
}

TEST(SkiRentalTest, UnmitigatedFailSlowThatGoesAwayStopsByItself) {
  SkiRentalPlanner planner = SkiRentalPlanner::Create(RootCause::kCommunication, Options()).value();
  EXPECT_FALSE(planner.Observe({1.5, 1.5, kHealthy, 1}).value().has_value());
  EXPECT_FALSE(planner.Observe({2.5, 1.02, kHealthy, 1}).value().has_value());
  EXPECT_FALSE(planner.Observe({3.5, 1.01, kHealthy, 1}).value().has_value());
  const auto stop = planner.Observe({4.5, 1.0, kHealthy, 1}).value();
  ASSERT_TRUE(stop.has_value());
  EXPECT_EQ(stop->kind, DecisionKind::kStop);
  EXPECT_FALSE(stop->undo_rebalance);
  EXPECT_NEAR(stop->accumulated_slowdown_s, 0.53, 1e-12);
}

TEST(SkiRentalTest, MeasuredOverheadsReorderTheCandidates) {
  SkiRentalPlanner planner = SkiRentalPlanner::Create(RootCause::kCompute, Options()).value();
  EXPECT_EQ(planner.remaining(),
            (std::vector<Strategy>{Strategy::kRebalanceMicrobatches, Strategy::kAdjustTopology,
                                   Strategy::kCheckpointRestart}));
  ASSERT_TRUE(planner.SetOverhead(Strategy::kAdjustTopology, 1000).ok());
  ASSERT_TRUE(planner.SetOverhead(Strategy::kRebalanceMicrobatches, 0.5).ok());
  EXPECT_EQ(planner.remaining(),
            (std::vector<Strategy>{Strategy::kRebalanceMicrobatches, Strategy::kCheckpointRestart,
                                   Strategy::kAdjustTopology}));
  // A 0.5 s overhead is paid after the first slow iteration.
  const auto d = planner.Observe({1.5, 1.5, kHealthy, 1}).value();
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->to, Strategy::kRebalanceMicrobatches);
  EXPECT_DOUBLE_EQ(d->overhead_s, 0.5);
  // No checkpoint: restart unavailable, so an endless fail-slow stops escalating at S3.
  ASSERT_TRUE(
      planner.SetOverhead(Strategy::kCheckpointRestart, std::numeric_limits<double>::infinity())
          .ok());
  double now = 1.5;
  for (int i = 0; i < 100000; ++i) {
    const auto next = planner.Observe({now += 1.1, 1.1, kHealthy, 1}).value();
    if (next) {
      EXPECT_EQ(next->to, Strategy::kAdjustTopology);
    }
  }
  EXPECT_EQ(planner.current(), Strategy::kAdjustTopology);
}

TEST(SkiRentalTest, SamplesCoveringManyIterationsCount) {
  SkiRentalPlanner planner = SkiRentalPlanner::Create(RootCause::kCompute, Options()).value();
  // 100 iterations at 1.2 s: 20 s of slowdown, enough for S2 (10 s) but not S3 (60 s).
  const auto d = planner.Observe({120, 1.2, kHealthy, 100}).value();
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->to, Strategy::kRebalanceMicrobatches);
  EXPECT_DOUBLE_EQ(planner.accumulated_slowdown_s(), 20.0);
  // Faster than healthy earns no credit.
  EXPECT_FALSE(planner.Observe({200, 0.5, kHealthy, 10}).value().has_value());
  EXPECT_DOUBLE_EQ(planner.accumulated_slowdown_s(), 20.0);
}

TEST(SkiRentalTest, RejectsInvalidInputNamingTheFault) {
  SkiRentalOptions bad = Options();
  bad.overheads.topology_s = -1;
  EXPECT_FALSE(SkiRentalPlanner::Create(RootCause::kCompute, bad).ok());
  bad = Options();
  bad.recovery_samples = 0;
  EXPECT_FALSE(SkiRentalPlanner::Create(RootCause::kCompute, bad).ok());
  bad = Options();
  bad.recovery_tolerance = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(SkiRentalPlanner::Create(RootCause::kCompute, bad).ok());

  SkiRentalPlanner planner = SkiRentalPlanner::Create(RootCause::kCommunication, Options()).value();
  const Status s2 = planner.SetOverhead(Strategy::kRebalanceMicrobatches, 1);
  EXPECT_NE(s2.message().find("not a candidate"), std::string::npos) << s2.message();
  EXPECT_FALSE(planner.SetOverhead(Strategy::kAdjustTopology, -2).ok());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(planner.Observe({1, nan, kHealthy, 1}).ok());
  EXPECT_FALSE(planner.Observe({1, 1.5, 0, 1}).ok());
  EXPECT_FALSE(planner.Observe({1, 1.5, kHealthy, 0}).ok());
  ASSERT_TRUE(planner.Observe({5, 1.5, kHealthy, 1}).ok());
  const auto back = planner.Observe({4, 1.5, kHealthy, 1});
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("goes back"), std::string::npos);
}

}  // namespace
}  // namespace falcon::analyzer

namespace falcon::analyzer {
namespace {

// A planner restored from a snapshot taken mid-way decides exactly as the one that went on.
TEST(SkiRentalTest, RestoredPlannerDecidesAsTheOriginal) {
  SkiRentalPlanner original = SkiRentalPlanner::Create(RootCause::kCompute, Options()).value();
  double now = 0;
  std::optional<SkiRentalPlanner> restored;
  std::vector<Strategy> a, b;
  for (int i = 0; i < 1000; ++i) {
    now += 1;
    const IterationSample s{now, 1.5, kHealthy, 1};
    if (i == 50) {  // after S2 (10 s of slowdown at 0.5 s per sample), before S3
      ASSERT_EQ(original.current(), Strategy::kRebalanceMicrobatches);
      restored = SkiRentalPlanner::Restore(RootCause::kCompute, Options(), original.Snapshot()).value();
      EXPECT_EQ(restored->remaining(), original.remaining());
    }
    if (auto d = original.Observe(s).value()) a.push_back(d->to);
    if (restored) {
      if (auto d = restored->Observe(s).value()) b.push_back(d->to);
    }
  }
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(b, std::vector<Strategy>(a.begin() + 1, a.end()));
  EXPECT_DOUBLE_EQ(restored->accumulated_slowdown_s(), original.accumulated_slowdown_s());
  EXPECT_DOUBLE_EQ(restored->overheads_paid_s(), original.overheads_paid_s());
  EXPECT_EQ(restored->End(now + 1).value().undo_rebalance, original.End(now + 1).value().undo_rebalance);
}

// A slow pipeline link: the chain is pipeline adaptation, S3, S4, each when the fail-slow has
// cost as much; a stop while the adapted counts hold undoes them, one after the restart does not.
TEST(SkiRentalTest, SlowPipelineLinkAdaptsThePipelineFirst) {
  SkiRentalPlanner planner = SkiRentalPlanner::Create(RootCause::kCommunication, PipelineOptions()).value();
  EXPECT_EQ(planner.remaining(), (std::vector<Strategy>{Strategy::kAdaptPipeline, Strategy::kAdjustTopology,
                                                        Strategy::kCheckpointRestart}));
  double now = 0;
  std::optional<MitigationDecision> d;
  while (!d) d = planner.Observe({now += 1.5, 1.5, kHealthy, 1}).value();
  EXPECT_EQ(d->to, Strategy::kAdaptPipeline);
  EXPECT_GE(d->accumulated_slowdown_s, 2.0);
  EXPECT_NE(d->reason.find("pipeline adaptation"), std::string::npos) << d->reason;
  SkiRentalPlanner copy = SkiRentalPlanner::Restore(RootCause::kCommunication, PipelineOptions(),
                                                    planner.Snapshot()).value();
  EXPECT_TRUE(copy.Snapshot().pipeline_in_effect);
  const MitigationDecision stop = copy.End(now).value();
  EXPECT_TRUE(stop.undo_pipeline);
  EXPECT_FALSE(stop.undo_rebalance);
  EXPECT_NE(stop.reason.find("warm-up"), std::string::npos) << stop.reason;

  const Outcome endless = Simulate(RootCause::kCommunication, 1000000, PipelineOptions());
  EXPECT_EQ(Switches(endless), (std::vector<Strategy>{Strategy::kAdaptPipeline, Strategy::kAdjustTopology,
                                                      Strategy::kCheckpointRestart}));
  EXPECT_FALSE(endless.decisions.back().undo_pipeline) << "the restart runs the job's own schedule";
  for (double n = 1; n < 2e5; n *= 1.07) {
    const auto iterations = static_cast<std::int64_t>(n);
    const Outcome run = Simulate(RootCause::kCommunication, iterations, PipelineOptions());
    EXPECT_LE(run.cost, 2.5 * OfflineOptimum(RootCause::kCommunication, iterations, PipelineOptions()) + kLastStep)
        << iterations << " iterations";
  }
  SkiRentalPlanner compute = SkiRentalPlanner::Create(RootCause::kCompute, PipelineOptions()).value();
  EXPECT_FALSE(compute.SetOverhead(Strategy::kAdaptPipeline, 1).ok()) << "no pipeline link is slow";
}

TEST(SkiRentalTest, RestoreRejectsImpossibleSnapshots) {
  SkiRentalSnapshot s;
  s.applied = {Strategy::kRebalanceMicrobatches};
  EXPECT_FALSE(SkiRentalPlanner::Restore(RootCause::kCommunication, Options(), s).ok())
      << "S2 is no candidate for a communication fail-slow";
  s.applied = {Strategy::kAdjustTopology, Strategy::kAdjustTopology};
  EXPECT_FALSE(SkiRentalPlanner::Restore(RootCause::kCompute, Options(), s).ok()) << "applied twice";
  s.applied = {Strategy::kIgnore};
  EXPECT_FALSE(SkiRentalPlanner::Restore(RootCause::kCompute, Options(), s).ok());
  s.applied = {};
  s.slowdown_s = -1;
  EXPECT_FALSE(SkiRentalPlanner::Restore(RootCause::kCompute, Options(), s).ok());
  s.slowdown_s = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(SkiRentalPlanner::Restore(RootCause::kCompute, Options(), s).ok());
}

}  // namespace
}  // namespace falcon::analyzer
