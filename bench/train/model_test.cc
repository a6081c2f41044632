// Tests of the payload model (exactness, sensitivity, sampled verification, weighted gradients)
// and of the compute model's use of the factor.
#include "model.h"

#include <gtest/gtest.h>

#include <vector>

namespace falcon::train {
namespace {

TEST(ModelTest, PayloadsAreSmallIntegersThatDependOnEveryField) {
  const std::uint64_t k = PayloadKey(PayloadTag::kTpForward, {3, 1, 0, 2});
  EXPECT_NE(k, PayloadKey(PayloadTag::kTpForward, {4, 1, 0, 2}));
  EXPECT_NE(k, PayloadKey(PayloadTag::kTpBackward, {3, 1, 0, 2}));
  EXPECT_NE(k, PayloadKey(PayloadTag::kTpForward, {3, 1, 2, 0}));
  int differ = 0;
  for (std::size_t i = 0; i < 1000; ++i) {
    const float v = PayloadValue(k, i);
    EXPECT_GE(v, 0.0f);
    EXPECT_LT(v, 251.0f);
    EXPECT_EQ(v, static_cast<float>(static_cast<int>(v)));
    differ += v != PayloadValue(PayloadKey(PayloadTag::kTpForward, {4, 1, 0, 2}), i);
  }
  EXPECT_GT(differ, 950);  // another iteration's data is caught almost everywhere
}

TEST(ModelTest, VerifySampleFindsAnyCorruptedRegion) {
  const std::uint64_t k = PayloadKey(PayloadTag::kActivation, {1});
  std::vector<float> buf(100000);
  FillPayload(buf, k);
  auto expect = [k](std::size_t i) { return PayloadValue(k, i); };
  EXPECT_FALSE(VerifySample(buf, expect, 0, 0).has_value());
  buf.back() += 1;  // the last element is always checked
  ASSERT_TRUE(VerifySample(buf, expect, 0, 0).has_value());
  EXPECT_EQ(VerifySample(buf, expect, 0, 0)->index, buf.size() - 1);
  FillPayload(buf, k);
  buf[12345] = -1;  // a single element is found by some rotation within `stride` iterations
  bool found = false;
  for (std::uint64_t rot = 0; rot < 64 && !found; ++rot) found = VerifySample(buf, expect, rot, 0).has_value();
  EXPECT_TRUE(found);
  std::vector<float> small(10, 1.0f);
  EXPECT_FALSE(VerifySample(small, [](std::size_t) { return 1.000001f; }, 0, 1e-5).has_value());
  EXPECT_TRUE(VerifySample(small, [](std::size_t) { return 1.001f; }, 0, 1e-5).has_value());
}

TEST(ModelTest, WeightedGradientsMatchTheFoldedSum) {
  const std::vector<int> m = {2, 6, 4};
  std::vector<GradKeyFn> keys;
  for (int d = 0; d < 3; ++d) keys.push_back([d](int mb) { return PayloadKey(PayloadTag::kDpGrad, {0, mb, d}); });
  EXPECT_FLOAT_EQ(ReplicaWeight(6, m), 0.5f);
  for (std::size_t i = 0; i < 50; ++i) {
    float acc = 0;
    for (std::size_t d = 0; d < 3; ++d) acc += GradValue(keys[d], m[d], i) * ReplicaWeight(m[d], m);
    EXPECT_EQ(WeightedGradSum(keys, m, i), acc);
  }
  // Equal counts: the weighted sum is the plain mean.
  const std::vector<int> eq = {4, 4};
  const float mean = (GradValue(keys[0], 4, 7) + GradValue(keys[1], 4, 7)) / 2;
  EXPECT_NEAR(WeightedGradSum({keys[0], keys[1]}, eq, 7), mean, 1e-4);
}

TEST(ModelTest, ComputeUsesTheFactorAtThePhaseStart) {
  std::vector<double> asked;
  ComputeModel c([&asked](double t) { asked.push_back(t); return t > 5 ? 3.0 : 0.5; }, [] { return 7.0; });
  const double t0 = MonotonicSeconds();
  EXPECT_EQ(c.Run(10), 3.0);
  EXPECT_GE(MonotonicSeconds() - t0, 0.029);
  EXPECT_EQ(c.TakeMaxFactor(), 3.0);
  EXPECT_EQ(c.TakeMaxFactor(), 1.0);
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0], 7.0);
  ComputeModel slow_never([](double) { return 0.5; }, [] { return 0.0; });
  EXPECT_EQ(slow_never.Run(1), 1.0);  // factors below 1 are clamped
}

}  // namespace
}  // namespace falcon::train
