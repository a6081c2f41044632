// Tests for pipeline schedules and the simulator: standard 1F1B against the textbook iteration
// time, the builder's own timeline against the simulator on seeded random pipelines (fused and
// split backward, custom warm-up counts), every dependency and the one-op-at-a-time rule checked
// on the simulated timeline, peak activations equal to the warm-up counts, a validator that
// rejects broken and deadlocking schedules, and the errors.
#include "analyzer/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
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

PipelineModel RandomModel(Rng& rng, std::int32_t stages, BackwardMode mode) {
  PipelineModel m = Uniform(stages, {}, mode);
  for (StageTimes& t : m.stages) {
    t = {0.5 + rng.Uniform(), 0.5 + 1.5 * rng.Uniform(),
         mode == BackwardMode::kSplit ? 0.8 * rng.Uniform() : 0.0};
  }
  for (double& c : m.link_delay_s) c = rng.Uniform() < 0.5 ? 0.0 : 3 * rng.Uniform();
  return m;
}

// A random non-increasing vector in [1, N], last stage free to exceed 1.
std::vector<std::int32_t> RandomWarmup(Rng& rng, std::int32_t stages, std::int32_t n) {
  std::vector<std::int32_t> x(static_cast<std::size_t>(stages));
  std::int32_t high = n;
  for (auto& v : x) {
    v = 1 + static_cast<std::int32_t>(rng.Next() % static_cast<std::uint64_t>(high));
    high = v;
  }
  return x;
}

PipelineSimulation Simulate(const PipelineModel& m, const PipelineSchedule& s) {
  Result<PipelineSimulation> r = SimulatePipeline(m, s);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r.value() : PipelineSimulation{};
}

// Every op starts after its dependency (plus the link delay) and after the stage's previous op.
void ExpectTimelineRespectsDependencies(const PipelineModel& m, const PipelineSchedule& sched,
                                        const PipelineSimulation& sim) {
  const auto stages = static_cast<std::int32_t>(sched.stages.size());
  const std::int32_t n = sched.microbatches;
  auto end_of = [&](std::int32_t s, PipelineOpKind kind, std::int32_t j) {
    const auto& ops = sched.stages[static_cast<std::size_t>(s)];
    const auto it = std::find(ops.begin(), ops.end(), PipelineOp{kind, j});
    return sim.end_s[static_cast<std::size_t>(s)][static_cast<std::size_t>(it - ops.begin())];
  };
  for (std::int32_t s = 0; s < stages; ++s) {
    const auto us = static_cast<std::size_t>(s);
    for (std::size_t k = 0; k < sched.stages[us].size(); ++k) {
      const PipelineOp op = sched.stages[us][k];
      const double start = sim.start_s[us][k];
      if (k > 0) {
        EXPECT_GE(start, sim.end_s[us][k - 1]);
      }
      double dep = 0;
      if (op.kind == PipelineOpKind::kForward && s > 0) {
        dep = end_of(s - 1, op.kind, op.microbatch) + m.link_delay_s[us - 1];
      } else if (op.kind == PipelineOpKind::kBackward) {
        dep = s == stages - 1 ? end_of(s, PipelineOpKind::kForward, op.microbatch)
                              : end_of(s + 1, op.kind, op.microbatch) + m.link_delay_s[us];
      } else if (op.kind == PipelineOpKind::kWeight) {
        dep = end_of(s, PipelineOpKind::kBackward, op.microbatch);
      }
      EXPECT_GE(start, dep) << "stage " << s << " op " << k;
    }
  }
  EXPECT_GT(n, 0);
}

TEST(PipelineScheduleTest, StandardOneFOneBHasTextbookIterationTime) {
  // (N + S - 1)(F + B) for equal stages and no delays, whatever F and B.
  for (const StageTimes times :
       {StageTimes{1, 1, 0}, StageTimes{1, 2, 0}, StageTimes{0.3, 0.5, 0.2}}) {
    for (std::int32_t stages = 1; stages <= 8; ++stages) {
      for (const std::int32_t n : {stages, 2 * stages, 12, 32}) {
        const PipelineModel m = Uniform(stages, times, BackwardMode::kFused);
        const std::vector<std::int32_t> x = StandardWarmup(stages, n).value();
        const Result<PipelineSchedule> sched = BuildPipelineSchedule(m, x, n);
        ASSERT_TRUE(sched.ok()) << sched.status().ToString();
        const PipelineSimulation sim = Simulate(m, sched.value());
        const double per = times.forward_s + times.backward_s + times.weight_s;
        EXPECT_NEAR(sim.iteration_s, (n + stages - 1) * per, 1e-9) << "S " << stages << " N " << n;
        for (std::size_t s = 0; s < sim.stages.size(); ++s) {
          EXPECT_NEAR(sim.stages[s].busy_s, n * per, 1e-9);
          EXPECT_NEAR(sim.stages[s].bubble_s, (stages - 1) * per, 1e-9);
          EXPECT_EQ(sim.stages[s].peak_activations, x[s]);
        }
      }
    }
  }
}

TEST(PipelineScheduleTest, OneFOneBOrderAlternatesAfterWarmup) {
  const PipelineModel m = Uniform(4, {1, 1, 0}, BackwardMode::kFused);
  const PipelineSchedule sched =
      BuildPipelineSchedule(m, std::vector<std::int32_t>{4, 3, 2, 1}, 6).value();
  const std::vector<PipelineOp> stage1 = {
      {PipelineOpKind::kForward, 0},  {PipelineOpKind::kForward, 1},
      {PipelineOpKind::kForward, 2},  {PipelineOpKind::kBackward, 0},
      {PipelineOpKind::kForward, 3},  {PipelineOpKind::kBackward, 1},
      {PipelineOpKind::kForward, 4},  {PipelineOpKind::kBackward, 2},
      {PipelineOpKind::kForward, 5},  {PipelineOpKind::kBackward, 3},
      {PipelineOpKind::kBackward, 4}, {PipelineOpKind::kBackward, 5}};
  EXPECT_EQ(sched.stages[1], stage1);
}

TEST(PipelineScheduleTest, BuilderTimelineIsTheSimulatorsOnRandomPipelines) {
  Rng rng(2024);
  for (int c = 0; c < 300; ++c) {
    const auto stages = static_cast<std::int32_t>(1 + rng.Next() % 6);
    const auto n = static_cast<std::int32_t>(1 + rng.Next() % 16);
    const BackwardMode mode = c % 2 == 0 ? BackwardMode::kFused : BackwardMode::kSplit;
    const PipelineModel m = RandomModel(rng, stages, mode);
    const std::vector<std::int32_t> x = RandomWarmup(rng, stages, n);
    const Result<PipelineSchedule> sched = BuildPipelineSchedule(m, x, n);
    ASSERT_TRUE(sched.ok()) << sched.status().ToString();
    ASSERT_TRUE(ValidatePipelineSchedule(sched.value(), mode).ok());
    const PipelineSimulation sim = Simulate(m, sched.value());
    const Result<double> own = WarmupIterationTime(m, x, n);
    ASSERT_TRUE(own.ok());
    EXPECT_DOUBLE_EQ(own.value(), sim.iteration_s) << "case " << c;
    ExpectTimelineRespectsDependencies(m, sched.value(), sim);
    for (std::size_t s = 0; s < x.size(); ++s) {
      EXPECT_EQ(sim.stages[s].peak_activations, x[s]) << "case " << c << " stage " << s;
      // The first x_s ops are the warm-up forwards.
      for (std::int32_t k = 0; k < x[s]; ++k) {
        EXPECT_EQ(sched.value().stages[s][static_cast<std::size_t>(k)],
                  (PipelineOp{PipelineOpKind::kForward, k}));
      }
    }
  }
}

struct BadSchedule {
  const char* name;
  BackwardMode mode;
  std::vector<std::vector<PipelineOp>> stages;
  const char* message;  // a part of the error
};

constexpr PipelineOp F(std::int32_t j) { return {PipelineOpKind::kForward, j}; }
constexpr PipelineOp B(std::int32_t j) { return {PipelineOpKind::kBackward, j}; }
constexpr PipelineOp W(std::int32_t j) { return {PipelineOpKind::kWeight, j}; }

TEST(PipelineScheduleTest, ValidatorRejectsBrokenSchedules) {
  const std::vector<BadSchedule> cases = {
      {"missing op", BackwardMode::kFused, {{F(0), F(1), B(0), B(1)}, {F(0), B(0), F(1)}}, "ops"},
      {"duplicate",
       BackwardMode::kFused,
       {{F(0), F(1), B(0), B(1)}, {F(0), B(0), F(0), B(1)}},
       "twice"},
      {"W when fused",
       BackwardMode::kFused,
       {{F(0), F(1), B(0), B(1)}, {F(0), B(0), F(1), W(1)}},
       "fused"},
      {"no W when split",
       BackwardMode::kSplit,
       {{F(0), F(1), B(0), B(1), W(0), W(1)}, {F(0), B(0), F(1), B(1)}},
       "ops"},
      {"bad micro-batch",
       BackwardMode::kFused,
       {{F(0), F(1), B(0), B(1)}, {F(0), B(0), F(2), B(1)}},
       "micro-batch"},
      {"B before own F",
       BackwardMode::kFused,
       {{F(0), F(1), B(0), B(1)}, {B(0), F(0), F(1), B(1)}},
       "deadlocks"},
      {"W before its B",
       BackwardMode::kSplit,
       {{F(0), F(1), B(0), W(0), B(1), W(1)}, {F(0), W(0), B(0), F(1), B(1), W(1)}},
       "deadlocks"},
      // Stage 0 waits for B1 before sending F1; stage 1 needs F1 for B1: a cycle across stages.
      {"cross-stage cycle",
       BackwardMode::kFused,
       {{F(0), B(1), F(1), B(0)}, {F(0), B(0), F(1), B(1)}},
       "deadlocks"},
      // Warm-up counts that increase along the pipeline: stage 1 wants F1 before B0, stage 0
      // sends F1 only after B0.
      {"increasing warm-up",
       BackwardMode::kFused,
       {{F(0), B(0), F(1), B(1)}, {F(0), F(1), B(0), B(1)}},
       "deadlocks"},
  };
  for (const BadSchedule& c : cases) {
    PipelineSchedule sched{2, c.stages};
    const Status s = ValidatePipelineSchedule(sched, c.mode);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << c.name;
    EXPECT_NE(s.message().find(c.message), std::string::npos) << c.name << ": " << s.message();
    const PipelineModel m = Uniform(2, {1, 1, 0.5}, c.mode);
    EXPECT_FALSE(SimulatePipeline(m, sched).ok()) << c.name;
  }
  // The same shapes, fixed, pass.
  PipelineSchedule good{2, {{F(0), F(1), B(0), B(1)}, {F(0), B(0), F(1), B(1)}}};
  EXPECT_TRUE(ValidatePipelineSchedule(good, BackwardMode::kFused).ok());
  EXPECT_FALSE(ValidatePipelineSchedule(good, BackwardMode::kSplit).ok());
  EXPECT_FALSE(ValidatePipelineSchedule(PipelineSchedule{2, {}}, BackwardMode::kFused).ok());
  EXPECT_FALSE(SimulatePipeline(Uniform(3, {1, 1, 0}, BackwardMode::kFused), good).ok());
}

TEST(PipelineScheduleTest, Errors) {
  const PipelineModel m = Uniform(3, {1, 1, 0}, BackwardMode::kFused);
  const std::vector<std::int32_t> ok = {3, 2, 1};
  EXPECT_TRUE(BuildPipelineSchedule(m, ok, 4).ok());
  // Warm-up counts: wrong size, < 1, > N, increasing.
  for (const std::vector<std::int32_t>& x :
       std::vector<std::vector<std::int32_t>>{{3, 2}, {3, 2, 0}, {5, 2, 1}, {2, 3, 1}}) {
    EXPECT_EQ(BuildPipelineSchedule(m, x, 4).status().code(), Status::Code::kInvalidArgument);
  }
  // N out of range.
  EXPECT_FALSE(BuildPipelineSchedule(m, ok, 0).ok());
  EXPECT_FALSE(BuildPipelineSchedule(m, ok, kMaxPipelineMicrobatches + 1).ok());
  EXPECT_FALSE(StandardWarmup(0, 4).ok());
  EXPECT_FALSE(StandardWarmup(kMaxPipelineStages + 1, 4).ok());
  EXPECT_FALSE(StandardWarmup(kMaxPipelineStages, kMaxPipelineMicrobatches).ok());  // too many ops
  // Bad models: no stages, wrong delay count, bad times and delays.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<PipelineModel> bad(8, m);
  bad[0].stages.clear();
  bad[0].link_delay_s.clear();
  bad[1].link_delay_s.push_back(0);
  bad[2].stages[1].forward_s = 0;
  bad[3].stages[1].backward_s = -1;
  bad[4].stages[0].weight_s = nan;
  bad[5].stages[2].forward_s = inf;
  bad[6].link_delay_s[0] = -0.5;
  bad[7].link_delay_s[1] = inf;
  for (std::size_t i = 0; i < bad.size(); ++i) {
    EXPECT_EQ(ValidatePipelineModel(bad[i]).code(), Status::Code::kInvalidArgument) << i;
    EXPECT_FALSE(BuildPipelineSchedule(bad[i], ok, 4).ok()) << i;
    EXPECT_FALSE(WarmupIterationTime(bad[i], ok, 4).ok()) << i;
  }
}

}  // namespace
}  // namespace falcon::analyzer
