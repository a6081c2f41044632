// Tests of the control word (summed over ranks as the all-reduce sums it) and the plan payload.
#include "control_word.h"

#include <gtest/gtest.h>

namespace falcon::train {
namespace {

// What the world all-reduce yields: rank 0's proposal plus empty words of the others.
std::vector<std::int32_t> Summed(const ControlDecision& rank0, int world, int dp) {
  std::vector<std::int32_t> sum = PackControl(rank0, dp);
  for (int r = 1; r < world; ++r) {
    const std::vector<std::int32_t> w = PackControl(ControlDecision{}, dp);
    for (std::size_t i = 0; i < w.size(); ++i) sum[i] += w[i];
  }
  return sum;
}

TEST(ControlWordTest, StopAndNoPlan) {
  const Result<ControlDecision> d = UnpackControl(Summed({true, std::nullopt}, 4, 2), 4, 2);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_TRUE(d.value().stop);
  EXPECT_FALSE(d.value().plan.has_value());
  const Result<ControlDecision> quiet = UnpackControl(Summed({}, 4, 2), 4, 2);
  ASSERT_TRUE(quiet.ok());
  EXPECT_FALSE(quiet.value().stop);
  EXPECT_EQ(UnpackControl(Summed({}, 4, 2), 5, 2).status().code(), Status::Code::kCorrupt);  // a rank missing
}

TEST(ControlWordTest, AppliedPlanWithPayloadRoundTrips) {
  Announcement a;
  a.version = 7;
  a.strategy = Strategy::kRestart;
  a.effect = {{3, 5}, {0, 0, 4, 4}, true, {}};
  a.exclude_nodes = {1};
  const Result<ControlDecision> d = UnpackControl(Summed({false, a}, 4, 2), 4, 2);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_TRUE(d.value().plan.has_value());
  Announcement got = *d.value().plan;
  EXPECT_EQ(got.version, 7);
  EXPECT_EQ(got.strategy, Strategy::kRestart);
  EXPECT_EQ(got.verdict, Verdict::kApply);
  EXPECT_TRUE(got.effect.restart);
  EXPECT_EQ(got.effect.micro_batches, (std::vector<int>{3, 5}));
  ASSERT_EQ(PayloadSize(got), 5u);
  const std::vector<std::int32_t> payload = PackPayload(a);
  ASSERT_TRUE(UnpackPayload(payload, &got).ok());
  EXPECT_EQ(got.effect.placement, (std::vector<int>{0, 0, 4, 4}));
  EXPECT_EQ(got.exclude_nodes, (std::vector<int>{1}));
  EXPECT_EQ(UnpackPayload(std::vector<std::int32_t>{1, 2}, &got).code(), Status::Code::kCorrupt);
  EXPECT_EQ(UnpackPayload(std::vector<std::int32_t>{0, 0, -4, 4, 1}, &got).code(), Status::Code::kCorrupt);
}

TEST(ControlWordTest, PipelinePlanCarriesItsWarmupCountsInThePayload) {
  Announcement a;
  a.version = 9;
  a.strategy = Strategy::kPipeline;
  a.effect = {{4, 4}, {}, false, {5, 3, 0}};
  const Result<ControlDecision> d = UnpackControl(Summed({false, a}, 6, 2), 6, 2);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  Announcement got = *d.value().plan;
  EXPECT_EQ(got.strategy, Strategy::kPipeline);
  ASSERT_EQ(PayloadSize(got), 3u);
  ASSERT_TRUE(UnpackPayload(PackPayload(a), &got).ok());
  EXPECT_EQ(got.effect.warmup, (std::vector<int>{5, 3, 0}));
  EXPECT_TRUE(got.effect.placement.empty());
  EXPECT_EQ(UnpackPayload(std::vector<std::int32_t>{5, -1, 0}, &got).code(), Status::Code::kCorrupt);
  EXPECT_EQ(UnpackPayload(std::vector<std::int32_t>{5, 70000, 0}, &got).code(), Status::Code::kCorrupt);
  // An S1 after it goes back to standard 1F1B: no warm-up entries at all.
  a.strategy = Strategy::kIgnore;
  a.effect.warmup.clear();
  const Result<ControlDecision> undo = UnpackControl(Summed({false, a}, 6, 2), 6, 2);
  ASSERT_TRUE(undo.ok());
  EXPECT_EQ(PayloadSize(*undo.value().plan), 0u);
}

TEST(ControlWordTest, RejectedPlansCarryNoEffectAndMayHaveAnUnknownStrategy) {
  Announcement a;
  a.version = 3;
  a.verdict = Verdict::kReject;
  a.effect = {{1, 1}, {9}, true, {3, 1}};  // ignored for a rejection
  const Result<ControlDecision> d = UnpackControl(Summed({false, a}, 2, 2), 2, 2);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_TRUE(d.value().plan.has_value());
  EXPECT_EQ(d.value().plan->verdict, Verdict::kReject);
  EXPECT_FALSE(d.value().plan->strategy.has_value());
  EXPECT_EQ(PayloadSize(*d.value().plan), 0u);
  EXPECT_TRUE(d.value().plan->effect.micro_batches.empty());
}

TEST(ControlWordTest, MalformedWordsAreCorrupt) {
  Announcement a;
  a.version = 2;
  a.strategy = Strategy::kRebalance;
  a.effect = {{2, 6}, {}, false, {}};
  const std::vector<std::int32_t> good = Summed({false, a}, 2, 2);
  ASSERT_TRUE(UnpackControl(good, 2, 2).ok());
  auto broken = [&](std::size_t field, std::int32_t value) {
    std::vector<std::int32_t> w = good;
    w[field] = value;
    return UnpackControl(w, 2, 2).status().code();
  };
  EXPECT_EQ(broken(0, 2), Status::Code::kCorrupt);   // stop flag
  EXPECT_EQ(broken(3, 0), Status::Code::kCorrupt);   // applied plan without a strategy
  EXPECT_EQ(broken(3, 6), Status::Code::kCorrupt);   // strategy
  EXPECT_EQ(broken(4, 3), Status::Code::kCorrupt);   // verdict
  EXPECT_EQ(broken(6, 1), Status::Code::kCorrupt);   // placement count neither 0 nor world
  EXPECT_EQ(broken(8, -1), Status::Code::kCorrupt);  // warm-up count
  EXPECT_EQ(broken(8, 1025), Status::Code::kCorrupt);
  EXPECT_EQ(broken(9, 0), Status::Code::kCorrupt);   // micro-batch count
  EXPECT_EQ(UnpackControl(std::vector<std::int32_t>(3, 0), 2, 2).status().code(), Status::Code::kCorrupt);
}

}  // namespace
}  // namespace falcon::train
