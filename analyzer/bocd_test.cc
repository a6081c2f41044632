// Tests for BOCD: change localisation, quiet stationary data, pruning bounds, numerical stability.
#include "analyzer/bocd.h"

#include <gtest/gtest.h>

#include <cmath>

#include "analyzer/test_util.h"

namespace falcon::analyzer {
namespace {

NormalGammaPrior PriorFor(double mu, double sigma) {
  NormalGammaPrior p;
  p.mu = mu;
  p.beta = sigma * sigma;
  return p;
}

TEST(BocdTest, LocatesMeanShift) {
  testing::Rng rng(1);
  Bocd bocd({}, PriorFor(0.0, 0.01));
  for (int i = 0; i < 200; ++i) {
    (void)bocd.Update(0.01 * rng.Gauss());
  }
  for (int i = 0; i < 5; ++i) {
    (void)bocd.Update(0.2 + 0.01 * rng.Gauss());
  }
  EXPECT_GT(bocd.ProbRunShorterThan(32), 0.99);
  EXPECT_EQ(bocd.MapRunLengthBelow(32), 5U);
}

TEST(BocdTest, StationaryDataKeepsChangeProbabilityLow) {
  testing::Rng rng(2);
  Bocd bocd({}, PriorFor(0.0, 0.02));
  double worst = 0.0;
  for (int i = 0; i < 5000; ++i) {
    (void)bocd.Update(0.02 * rng.Gauss());
    if (i > 50) worst = std::max(worst, bocd.ProbRunShorterThan(8));
  }
  EXPECT_LT(worst, 0.9);
}

TEST(BocdTest, PruningBoundsHypothesesAndMemory) {
  BocdOptions options;
  options.max_hypotheses = 40;
  testing::Rng rng(3);
  Bocd bocd(options, PriorFor(0.0, 0.05));
  std::size_t memory_after_warmup = 0;
  for (int i = 0; i < 20000; ++i) {
    (void)bocd.Update(0.05 * rng.Gauss() + (i / 500 % 2 == 0 ? 0.0 : 0.3));
    ASSERT_LE(bocd.hypotheses(), 50U);  // amortised pruning: at most 1.25 x max
    if (i == 100) memory_after_warmup = bocd.MemoryBytes();
  }
  EXPECT_EQ(bocd.MemoryBytes(), memory_after_warmup);  // no growth once warm
}

TEST(BocdTest, NumericallyStableOverMillionsOfSamples) {
  // The benchmark runs 10^7 samples; the test keeps a 2 * 10^6 version fast enough for CI.
  testing::Rng rng(4);
  Bocd bocd({}, PriorFor(3.0, 0.01));
  for (int i = 0; i < 2000000; ++i) {
    const double lp = bocd.Update(3.0 + 0.01 * rng.Gauss());
    ASSERT_TRUE(std::isfinite(lp)) << i;
  }
  const double total = bocd.ProbRunShorterThan(~std::uint64_t{0});
  EXPECT_NEAR(total, 1.0, 1e-3);  // kept mass: pruning drops a little each step
  for (int i = 0; i < 6; ++i) {
    (void)bocd.Update(3.1 + 0.01 * rng.Gauss());
  }
  EXPECT_GT(bocd.ProbRunShorterThan(16), 0.9);  // still detects after a very long run
}

}  // namespace
}  // namespace falcon::analyzer
