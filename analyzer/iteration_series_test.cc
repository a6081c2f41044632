// Tests for iteration-time extraction: accuracy against known iteration times, insertions.
#include "analyzer/iteration_series.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "analyzer/test_util.h"

namespace falcon::analyzer {
namespace {

struct Trace {
  std::vector<std::uint32_t> symbols;
  std::vector<std::int64_t> t_ns;
  std::vector<double> truth;   // true iteration times, seconds
  std::vector<double> starts;  // true iteration start times, seconds
};

// Iterations of `period` calls: compute before the first call (the boundary), calls spread
// over the rest of the iteration; every `extra_every` iterations an extra call (symbol 999).
Trace MakeTrace(std::size_t period, std::size_t iterations, std::size_t extra_every,
                std::uint64_t seed) {
  testing::Rng rng(seed);
  Trace t;
  double now = 0.0;
  for (std::size_t it = 0; it < iterations; ++it) {
    const double length = 1.0 * (1.0 + 0.03 * rng.Gauss()) * (it >= iterations / 2 ? 1.4 : 1.0);
    t.truth.push_back(length);
    t.starts.push_back(now);
    const double first = 0.6 * length;  // optimizer + forward before the first collective
    for (std::size_t j = 0; j < period; ++j) {
      const double at = now + first + 0.35 * length * static_cast<double>(j) /
                                          static_cast<double>(period);
      t.symbols.push_back(static_cast<std::uint32_t>(j % 7 + (j == 0 ? 100 : 0)));
      t.t_ns.push_back(std::llround(at * 1e9));
      if (extra_every != 0 && it % extra_every == 1 && j == period / 2) {
        t.symbols.push_back(999);
        t.t_ns.push_back(std::llround(at * 1e9) + 1000);
      }
    }
    now += length;
  }
  return t;
}

TEST(IterationSeriesTest, MatchesTrueIterationTimes) {
  struct Case {
    std::size_t period, extra_every;
  };
  const Case cases[] = {{12, 0}, {50, 0}, {50, 10}, {3, 0}, {200, 7}};
  for (const Case& c : cases) {
    const Trace t = MakeTrace(c.period, 200, c.extra_every, c.period);
    const auto samples = ExtractIterations(t.symbols, t.t_ns, c.period);
    ASSERT_GE(samples.size(), 195U) << c.period;
    double worst = 0.0;
    for (const IterationSample& s : samples) {
      // Anchors sit at start_k + 0.6 T_k, so anchor-to-anchor truth is 0.4 T_k + 0.6 T_{k+1}.
      const auto next = std::upper_bound(t.starts.begin(), t.starts.end(),
                                         static_cast<double>(s.start_ns) * 1e-9);
      const auto k = static_cast<std::size_t>(next - t.starts.begin()) - 1;
      ASSERT_LT(k + 1, t.truth.size());
      const double truth = 0.4 * t.truth[k] + 0.6 * t.truth[k + 1];
      worst = std::max(worst, std::fabs(s.seconds - truth) / truth);
    }
    EXPECT_LT(worst, 0.005) << "period " << c.period;
  }
}

TEST(IterationSeriesTest, ChoosesTheIterationBoundaryAsAnchor) {
  const Trace t = MakeTrace(20, 50, 0, 3);
  const auto samples = ExtractIterations(t.symbols, t.t_ns, 20);
  ASSERT_FALSE(samples.empty());
  EXPECT_EQ(samples[0].first_call % 20, 0U);  // first call of an iteration
}

TEST(IterationSeriesTest, NoExactRepetitionGivesNoSamples) {
  const std::vector<std::uint32_t> s{1, 2, 3, 4, 5, 6};
  const std::vector<std::int64_t> t{1, 2, 3, 4, 5, 6};
  EXPECT_TRUE(ExtractIterations(s, t, 2).empty());
  EXPECT_TRUE(ExtractIterations(s, t, 0).empty());
}

// The two halves of ExtractIterations: the boundary search, then the walk from the anchor it
// found, give the same samples; a walk from a position that is not the anchor gives none.
TEST(IterationSeriesTest, TheAnchorSearchAndTheWalkFromItAreExtractIterations) {
  for (const std::size_t extra_every : {0U, 7U}) {
    const Trace t = MakeTrace(30, 120, extra_every, 17 + extra_every);
    const auto whole = ExtractIterations(t.symbols, t.t_ns, 30);
    const auto anchor = FindIterationAnchor(t.symbols, t.t_ns, 30);
    ASSERT_TRUE(anchor.has_value());
    EXPECT_EQ(anchor->context.size(), IterationSeriesOptions{}.context);
    const auto walked = ExtractIterationsAt(t.symbols, t.t_ns, 30, *anchor);
    ASSERT_EQ(walked.size(), whole.size());
    ASSERT_GE(whole.size(), 110U);
    for (std::size_t k = 0; k < whole.size(); ++k) {
      EXPECT_EQ(walked[k].first_call, whole[k].first_call);
      EXPECT_EQ(walked[k].seconds, whole[k].seconds);
    }
    // Started later at another occurrence, the walk gives the rest of the same samples.
    IterationAnchor later = *anchor;
    later.position = whole[50].first_call;
    const auto rest = ExtractIterationsAt(t.symbols, t.t_ns, 30, later);
    ASSERT_EQ(rest.size(), whole.size() - 50);
    EXPECT_EQ(rest.front().start_ns, whole[50].start_ns);
    EXPECT_EQ(rest.back().seconds, whole.back().seconds);
    later.position = whole[50].first_call + 1;  // not an occurrence of the anchor
    EXPECT_TRUE(ExtractIterationsAt(t.symbols, t.t_ns, 30, later).empty());
  }
  const std::vector<std::uint32_t> s{1, 2, 3, 4, 5, 6};
  const std::vector<std::int64_t> t{1, 2, 3, 4, 5, 6};
  EXPECT_FALSE(FindIterationAnchor(s, t, 2).has_value());
}

}  // namespace
}  // namespace falcon::analyzer
