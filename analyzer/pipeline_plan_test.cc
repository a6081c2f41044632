// Tests for the delay model and the warm-up planners: Theorem 1 and the general tolerance, the
// tolerance threshold reproduced by the simulator (below it a delay costs only its fill and
// drain, above it every micro-batch pays), the steady period, initial planning against a brute
// force over every warm-up vector (leximin slackness, S <= 5, N <= 12), adaptation against an
// exhaustive search of the simulated iteration time on seeded random pipelines, memory limits
// respected by every plan, and the errors.
#include "analyzer/pipeline_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "analyzer/test_util.h"

namespace falcon::analyzer {
namespace {

using testing::Rng;

PipelineModel Uniform(std::int32_t stages, StageTimes times, BackwardMode mode) {
  PipelineModel m;
  m.stages.assign(static_cast<std::size_t>(stages), times);
  m.link_delay_s.assign(static_cast<std::size_t>(stages - 1), 0.0);
  m.backward = mode;
  return m;
}

// Calls `visit` with every non-increasing vector with 1 <= x_s <= min(limit_s, N).
void ForEachWarmup(std::span<const std::int32_t> limit, std::int32_t n,
                   const std::function<void(const std::vector<std::int32_t>&)>& visit) {
  std::vector<std::int32_t> x(limit.size());
  std::function<void(std::size_t, std::int32_t)> rec = [&](std::size_t s, std::int32_t high) {
    if (s == x.size()) {
      visit(x);
      return;
    }
    for (std::int32_t v = 1; v <= std::min({high, limit[s], n}); ++v) {
      x[s] = v;
      rec(s + 1, v);
    }
  };
  rec(0, n);
}

std::vector<std::int32_t> SortedSlackness(const std::vector<std::int32_t>& x) {
  std::vector<std::int32_t> d;
  for (std::size_t i = 0; i + 1 < x.size(); ++i) d.push_back(x[i] - x[i + 1]);
  std::sort(d.begin(), d.end());
  return d;
}

void ExpectWithinLimits(const std::vector<std::int32_t>& x, std::span<const std::int32_t> limit,
                        std::int32_t n) {
  ASSERT_EQ(x.size(), limit.size());
  for (std::size_t s = 0; s < x.size(); ++s) {
    EXPECT_GE(x[s], 1);
    EXPECT_LE(x[s], std::min(limit[s], n)) << "stage " << s;
    if (s > 0) {
      EXPECT_LE(x[s], x[s - 1]);
    }
  }
}

TEST(PipelinePlanTest, UniformToleranceIsTheorem1) {
  // F = B = t: (D - 1) t when fused.
  for (std::int32_t d = 0; d <= 6; ++d) {
    EXPECT_DOUBLE_EQ(UniformDelayTolerance(d, {1.5, 1.5, 0}, BackwardMode::kFused).value(),
                     (d - 1) * 1.5);
    // W moved out of B keeps the fused total but lets the gradient leave earlier.
    EXPECT_DOUBLE_EQ(UniformDelayTolerance(d, {1.5, 1.0, 0.5}, BackwardMode::kSplit).value(),
                     ((d - 1) * 2.5 + d * 0.5) / 2);
  }
  // The general tolerance reduces to Theorem 1 on equal stages.
  const PipelineModel m = Uniform(5, {1, 1, 0}, BackwardMode::kFused);
  const std::vector<std::int32_t> x = {12, 9, 8, 4, 1};
  const std::vector<double> tol = LinkDelayTolerance(m, x).value();
  ASSERT_EQ(tol.size(), 4U);
  for (std::size_t i = 0; i < tol.size(); ++i)
    EXPECT_DOUBLE_EQ(tol[i], (x[i] - x[i + 1] - 1) * 1.0);
  EXPECT_TRUE(
      LinkDelayTolerance(Uniform(1, {1, 1, 0}, BackwardMode::kFused), std::vector<std::int32_t>{1})
          .value()
          .empty());
}

TEST(PipelinePlanTest, SteadyPeriodOfOneFOneB) {
  PipelineModel m = Uniform(4, {1, 2, 0}, BackwardMode::kFused);
  const std::vector<std::int32_t> x = {4, 3, 2, 1};
  EXPECT_DOUBLE_EQ(SteadyPeriod(m, x).value(), 3.0);
  // Slackness 1 absorbs nothing: a delay c on one link adds c to every period.
  m.link_delay_s[1] = 0.75;
  EXPECT_DOUBLE_EQ(SteadyPeriod(m, x).value(), 3.75);
  EXPECT_DOUBLE_EQ(LinkDelayTolerance(m, x).value()[1], 0.0);
}

// A delay up to the tolerance ((D - 1) t when fused) costs only its fill and drain, 2 c; above
// it the iteration grows by N x the stretch of the steady period, the cascade the model
// predicts. Checked two ways: the order the builder makes for the delayed link (the planner's
// objective), and a fixed order built without the delay and then run with it (a framework whose
// link slows). The fixed order keeps its slackness only while the backwards it runs after the
// warm-up come one at a time: built without a delay, a stage whose slackness exceeds the round
// trip finds several backwards waiting after its warm-up and runs them first (B > F), so it
// holds fewer micro-batches in flight than x says (D = 5 here). It is checked for D <= 3.
TEST(PipelinePlanTest, ToleranceThresholdReproducedBySimulator) {
  const std::int32_t n = 48;
  for (const BackwardMode mode : {BackwardMode::kFused, BackwardMode::kSplit}) {
    const StageTimes times =
        mode == BackwardMode::kFused ? StageTimes{1, 1, 0} : StageTimes{1, 0.7, 0.3};
    for (const std::int32_t d : {1, 2, 3, 5}) {
      PipelineModel m = Uniform(4, times, mode);
      const std::vector<std::int32_t> x = {d + 3, d + 2, 2, 1};  // slackness d on link 1
      const PipelineSchedule fixed = BuildPipelineSchedule(m, x, n).value();
      const double base = WarmupIterationTime(m, x, n).value();
      ASSERT_DOUBLE_EQ(SimulatePipeline(m, fixed).value().iteration_s, base);
      const double tol = std::max(0.0, UniformDelayTolerance(d, times, mode).value());
      EXPECT_DOUBLE_EQ(LinkDelayTolerance(m, x).value()[1], tol);
      for (const double c : {0.25 * tol, 0.5 * tol, tol, tol + 0.5, tol + 1, tol + 2, tol + 4}) {
        m.link_delay_s[1] = c;
        const double stretch = n * (SteadyPeriod(m, x).value() - 2.0);  // P = 2
        const double greedy = WarmupIterationTime(m, x, n).value() - base;
        const double held = SimulatePipeline(m, fixed).value().iteration_s - base;
        if (c <= tol) {
          EXPECT_NEAR(stretch, 0, 1e-9);
          EXPECT_LE(greedy, 2 * c + 1e-9) << "D " << d << " c " << c;
          if (d <= 3) {
            EXPECT_LE(held, 2 * c + 1e-9) << "D " << d << " c " << c;
          }
        } else {
          EXPECT_GT(greedy, 2 * c) << "D " << d << " c " << c;
          EXPECT_GE(greedy, 0.5 * stretch) << "D " << d << " c " << c;
          if (d <= 3) {
            EXPECT_GE(held, stretch - 1e-9) << "D " << d << " c " << c;
            EXPECT_LE(held, stretch + 2 * c + 1e-9) << "D " << d << " c " << c;
          }
        }
      }
    }
  }
}

TEST(PipelinePlanTest, InitialPlanIsLeximinOptimal) {
  Rng rng(11);
  for (int c = 0; c < 400; ++c) {
    const auto stages = static_cast<std::size_t>(1 + rng.Next() % 5);
    const auto n = static_cast<std::int32_t>(1 + rng.Next() % 12);
    std::vector<std::int32_t> limit(stages);
    for (auto& l : limit) l = static_cast<std::int32_t>(1 + rng.Next() % 14);
    const Result<std::vector<std::int32_t>> plan = PlanInitialWarmup(limit, n);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    ExpectWithinLimits(plan.value(), limit, n);
    EXPECT_EQ(plan.value().back(), 1);
    std::vector<std::int32_t> best;
    ForEachWarmup(limit, n, [&](const std::vector<std::int32_t>& x) {
      best = std::max(best, SortedSlackness(x));
    });
    EXPECT_EQ(SortedSlackness(plan.value()), best) << "case " << c;
  }
  // Room for S activations on every stage gives standard 1F1B.
  for (std::int32_t s = 1; s <= 8; ++s) {
    EXPECT_EQ(
        PlanInitialWarmup(std::vector<std::int32_t>(static_cast<std::size_t>(s), s), 64).value(),
        StandardWarmup(s, 64).value());
  }
  // Twice that doubles every slackness but the last stage's.
  EXPECT_EQ(PlanInitialWarmup(std::vector<std::int32_t>{7, 7, 7, 7}, 64).value(),
            (std::vector<std::int32_t>{7, 5, 3, 1}));
}

PipelineAdaptRequest RandomRequest(Rng& rng, int c) {
  PipelineAdaptRequest r;
  const auto stages = static_cast<std::int32_t>(2 + rng.Next() % 4);
  r.microbatches =
      static_cast<std::int32_t>(stages + rng.Next() % static_cast<std::uint64_t>(13 - stages));
  r.model = Uniform(stages, {}, c % 3 == 2 ? BackwardMode::kSplit : BackwardMode::kFused);
  const bool uneven = c % 2 == 1;
  for (StageTimes& t : r.model.stages) {
    t.forward_s = uneven ? 0.6 + 0.8 * rng.Uniform() : 1.0;
    t.backward_s = uneven ? 1.2 + 1.2 * rng.Uniform() : 2.0;
    t.weight_s = r.model.backward == BackwardMode::kSplit ? 0.2 + 0.6 * rng.Uniform() : 0.0;
  }
  // One or two slow links, 0.5-8x a forward; the others a little latency or none.
  for (double& d : r.model.link_delay_s) d = rng.Uniform() < 0.5 ? 0.0 : 0.05 * rng.Uniform();
  for (int k = 0; k < 1 + c % 2; ++k) {
    const auto link = static_cast<std::size_t>(rng.Next() % static_cast<std::uint64_t>(stages - 1));
    r.model.link_delay_s[link] = 0.5 + 7.5 * rng.Uniform();
  }
  r.activation_limit.resize(static_cast<std::size_t>(stages));
  for (std::size_t s = 0; s < r.activation_limit.size(); ++s) {
    // Sometimes below 1F1B's need, sometimes roomy.
    r.activation_limit[s] = static_cast<std::int32_t>(1 + rng.Next() % 12);
  }
  return r;
}

void ExpectPlanHoldsItsCounts(const PipelineAdaptRequest& r, const PipelinePlan& plan) {
  ExpectWithinLimits(plan.warmup, r.activation_limit, r.microbatches);
  EXPECT_DOUBLE_EQ(plan.iteration_s,
                   WarmupIterationTime(r.model, plan.warmup, r.microbatches).value());
  bool baseline_fits = true;
  for (std::size_t s = 0; s < plan.baseline_warmup.size(); ++s) {
    baseline_fits = baseline_fits && plan.baseline_warmup[s] <= r.activation_limit[s];
  }
  if (baseline_fits) {
    EXPECT_LE(plan.iteration_s, plan.baseline_iteration_s * (1 + 1e-12));
  }
  const PipelineSchedule sched =
      BuildPipelineSchedule(r.model, plan.warmup, r.microbatches).value();
  const PipelineSimulation sim = SimulatePipeline(r.model, sched).value();
  for (std::size_t s = 0; s < sim.stages.size(); ++s) {
    EXPECT_EQ(sim.stages[s].peak_activations, plan.warmup[s]);
    EXPECT_LE(sim.stages[s].peak_activations, r.activation_limit[s]);
  }
}

// Small pipelines (S <= 5, N <= 12): the default planner enumerates and must find the optimum
// exactly; the local search alone (exhaustive_budget 0) must come close.
TEST(PipelinePlanTest, AdaptationAgainstExhaustiveSearch) {
  Rng rng(20);
  int local_exact = 0;
  double local_worst = 1;
  const int cases = 120;
  for (int c = 0; c < cases; ++c) {
    PipelineAdaptRequest r = RandomRequest(rng, c);
    double best = std::numeric_limits<double>::infinity();
    ForEachWarmup(r.activation_limit, r.microbatches, [&](const std::vector<std::int32_t>& x) {
      best = std::min(best, WarmupIterationTime(r.model, x, r.microbatches).value());
    });
    const Result<PipelinePlan> plan = AdaptPipeline(r);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_TRUE(plan.value().exhaustive);
    EXPECT_LE(plan.value().iteration_s, best * (1 + 1e-12))
        << "case " << c;  // ties within rounding
    ExpectPlanHoldsItsCounts(r, plan.value());

    r.exhaustive_budget = 0;
    const Result<PipelinePlan> local = AdaptPipeline(r);
    ASSERT_TRUE(local.ok()) << local.status().ToString();
    EXPECT_FALSE(local.value().exhaustive);
    ExpectPlanHoldsItsCounts(r, local.value());
    EXPECT_LE(local.value().iteration_s, best * 1.05) << "case " << c;
    local_exact += local.value().iteration_s <= best * (1 + 1e-12) ? 1 : 0;
    local_worst = std::max(local_worst, local.value().iteration_s / best);
  }
  // Measured at this seed: 118 of 120 exact, the worst 0.44 % above the optimum (over 900
  // cases at other seeds: 99.3 % exact, worst 3.8 %).
  EXPECT_GE(local_exact, cases * 97 / 100) << "worst " << local_worst;
}

TEST(PipelinePlanTest, AdaptationAbsorbsASlowLink) {
  // S = 8, N = 32, F = 1, B = 2 (t = 1.5), a link 4 x F slow: 1F1B pays every micro-batch; with
  // room for the slackness the plan restores the stage period.
  PipelineAdaptRequest r;
  r.model = Uniform(8, {1, 2, 0}, BackwardMode::kFused);
  r.model.link_delay_s[3] = 4.0;
  r.microbatches = 32;
  r.activation_limit.assign(8, 16);
  r.max_evaluations = 16;  // the model's start is the answer here; keep the test quick
  const PipelinePlan plan = AdaptPipeline(r).value();
  EXPECT_EQ(plan.baseline_warmup, StandardWarmup(8, 32).value());
  EXPECT_LT(plan.iteration_s, 0.8 * plan.baseline_iteration_s);
  EXPECT_DOUBLE_EQ(plan.steady_period_s, plan.stage_period_s);
  // ceil(4 / 1.5) + 1 = 4 periods of slackness on link 3 make the chain.
  EXPECT_GE(plan.warmup[3] - plan.warmup[4], 4);
  EXPECT_GE(LinkDelayTolerance(r.model, plan.warmup).value()[3], 4.0);
  ExpectWithinLimits(plan.warmup, r.activation_limit, r.microbatches);
  // No delay, no change: 1F1B is already optimal.
  r.model.link_delay_s[3] = 0;
  const PipelinePlan calm = AdaptPipeline(r).value();
  EXPECT_DOUBLE_EQ(calm.iteration_s, calm.baseline_iteration_s);
  EXPECT_DOUBLE_EQ(calm.iteration_s, (32 + 8 - 1) * 3.0);
  // A tight limit: the plan stays inside it and still beats 1F1B.
  r.model.link_delay_s[3] = 4.0;
  r.activation_limit.assign(8, 8);
  const PipelinePlan tight = AdaptPipeline(r).value();
  ExpectWithinLimits(tight.warmup, r.activation_limit, r.microbatches);
  EXPECT_LT(tight.iteration_s, tight.baseline_iteration_s);
  EXPECT_GT(tight.steady_period_s, tight.stage_period_s);
}

TEST(PipelinePlanTest, AdaptationKeepsCurrentWhenBest) {
  PipelineAdaptRequest r;
  r.model = Uniform(4, {1, 1, 0}, BackwardMode::kFused);
  r.microbatches = 12;
  r.activation_limit.assign(4, 4);
  r.current_warmup = {4, 3, 2, 1};
  const PipelinePlan plan = AdaptPipeline(r).value();
  EXPECT_EQ(plan.warmup, r.current_warmup);
  EXPECT_EQ(plan.min_slackness, 1);
  EXPECT_GT(plan.evaluations, 0);
  // A current plan above today's limit is the baseline; the plan fits the limit.
  r.current_warmup = {8, 6, 4, 1};
  r.model.link_delay_s[2] = 2.5;
  const PipelinePlan moved = AdaptPipeline(r).value();
  EXPECT_EQ(moved.baseline_warmup, r.current_warmup);
  ExpectWithinLimits(moved.warmup, r.activation_limit, r.microbatches);
}

TEST(PipelinePlanTest, Errors) {
  EXPECT_FALSE(UniformDelayTolerance(-1, {1, 1, 0}, BackwardMode::kFused).ok());
  EXPECT_FALSE(UniformDelayTolerance(2, {0, 1, 0}, BackwardMode::kFused).ok());
  const PipelineModel m = Uniform(3, {1, 1, 0}, BackwardMode::kFused);
  EXPECT_FALSE(SteadyPeriod(m, std::vector<std::int32_t>{1, 2, 1}).ok());
  EXPECT_FALSE(LinkDelayTolerance(m, std::vector<std::int32_t>{2, 1}).ok());
  // Initial planning: no stages, a limit below one activation, N out of range.
  EXPECT_FALSE(PlanInitialWarmup({}, 4).ok());
  EXPECT_EQ(PlanInitialWarmup(std::vector<std::int32_t>{4, 0, 2}, 4).status().code(),
            Status::Code::kInvalidArgument);
  EXPECT_FALSE(PlanInitialWarmup(std::vector<std::int32_t>{4, 3}, 0).ok());
  EXPECT_FALSE(PlanInitialWarmup(std::vector<std::int32_t>(kMaxPipelineStages + 1, 4), 4).ok());
  // Adaptation.
  PipelineAdaptRequest r;
  r.model = m;
  r.microbatches = 6;
  r.activation_limit = {3, 2, 1};
  ASSERT_TRUE(AdaptPipeline(r).ok());
  std::vector<PipelineAdaptRequest> bad(7, r);
  bad[0].activation_limit = {3, 2};
  bad[1].activation_limit = {3, 0, 1};
  bad[2].microbatches = 0;
  bad[3].current_warmup = {2, 3, 1};
  bad[4].model.link_delay_s[0] = std::numeric_limits<double>::quiet_NaN();
  bad[5].max_evaluations = -1;
  bad[6].model.stages[0].backward_s = -2;
  for (std::size_t i = 0; i < bad.size(); ++i) {
    EXPECT_EQ(AdaptPipeline(bad[i]).status().code(), Status::Code::kInvalidArgument) << i;
  }
}

}  // namespace
}  // namespace falcon::analyzer
