// Tests for period detection: exact, sub-patterned, noisy and long periods with known answers.
#include "analyzer/period.h"

#include <gtest/gtest.h>

#include <vector>

#include "analyzer/test_util.h"

namespace falcon::analyzer {
namespace {

// `cycles` repetitions of a pattern of `period` symbols; pattern symbol j is pattern[j].
std::vector<std::uint32_t> Repeat(const std::vector<std::uint32_t>& pattern, std::size_t cycles) {
  std::vector<std::uint32_t> out;
  for (std::size_t c = 0; c < cycles; ++c) {
    out.insert(out.end(), pattern.begin(), pattern.end());
  }
  return out;
}

std::vector<std::uint32_t> RandomPattern(std::size_t period, std::uint32_t alphabet,
                                         std::uint64_t seed) {
  testing::Rng rng(seed);
  std::vector<std::uint32_t> p(period);
  for (auto& v : p) {
    v = static_cast<std::uint32_t>(rng.Next() % alphabet);
  }
  return p;
}

TEST(PeriodTest, FindsExactPeriods) {
  struct Case {
    std::size_t period;
    std::uint32_t alphabet;
    std::size_t cycles;
  };
  const Case cases[] = {{1, 1, 50}, {2, 2, 40}, {7, 5, 30}, {24, 6, 20},
                        {333, 40, 10}, {1000, 300, 8}};
  for (const Case& c : cases) {
    auto pattern = RandomPattern(c.period, c.alphabet, c.period);
    if (c.period == 2) pattern = {0, 1};
    const PeriodResult r = FindPeriod(Repeat(pattern, c.cycles));
    ASSERT_TRUE(r.found) << c.period;
    EXPECT_EQ(r.period, c.period);
    EXPECT_DOUBLE_EQ(r.acf, 1.0);
  }
}

TEST(PeriodTest, PerLayerSubPatternDoesNotWin) {
  // 48 layers x (AllGather, ReduceScatter) then 2 DP all-reduces: the per-layer lag 2 matches
  // ~98 % of positions, above 0.95, but the iteration is 98 calls.
  std::vector<std::uint32_t> pattern;
  for (int layer = 0; layer < 48; ++layer) {
    pattern.push_back(0);
    pattern.push_back(1);
  }
  pattern.push_back(2);
  pattern.push_back(3);
  const auto seq = Repeat(pattern, 30);
  EXPECT_GT(MatchRate(seq, 2), 0.95);
  const PeriodResult r = FindPeriod(seq);
  ASSERT_TRUE(r.found);
  EXPECT_EQ(r.period, 98U);
}

TEST(PeriodTest, ToleratesOccasionalCalls) {
  // A logging all-reduce every 5 iterations: the paper's first-lag rule sees at best 0.8.
  const auto pattern = RandomPattern(40, 10, 7);
  std::vector<std::uint32_t> seq;
  for (int it = 0; it < 60; ++it) {
    seq.insert(seq.end(), pattern.begin(), pattern.end());
    if (it % 5 == 4) seq.push_back(99);
  }
  const PeriodResult r = FindPeriod(seq);
  ASSERT_TRUE(r.found);
  EXPECT_EQ(r.period, 40U);
  ASSERT_GT(r.ignored.size(), 99U);
  EXPECT_TRUE(r.ignored[99]);
}

TEST(PeriodTest, DominantSymbolOfAMixedWindowIsNoPeriod) {
  // A window that holds no clean repetition (the tail of one pattern, then a burst of one call
  // repeated many times, then another pattern): the burst's symbol outnumbers every other call
  // more than twice, so a "filter the occasional calls" pass would keep only it and find period
  // 1. Those calls are no small block inside an iteration: no period, not period 1.
  std::vector<std::uint32_t> seq = Repeat(RandomPattern(26, 8, 3), 3);
  seq.insert(seq.end(), 400, 50);
  const auto after = Repeat(RandomPattern(32, 8, 4), 2);
  seq.insert(seq.end(), after.begin(), after.end());
  const PeriodResult r = FindPeriod(seq);
  EXPECT_FALSE(r.found && r.period == 1) << "locked onto the burst";
}

TEST(PeriodTest, NoisySequenceStillLocks) {
  testing::Rng rng(3);
  auto seq = Repeat(RandomPattern(120, 20, 11), 40);
  for (auto& v : seq) {
    if (rng.Uniform() < 0.01) v = 500;  // 1 % corrupted calls
  }
  const PeriodResult r = FindPeriod(seq);
  ASSERT_TRUE(r.found);
  EXPECT_EQ(r.period, 120U);
  EXPECT_GT(r.acf, 0.97);
}

TEST(PeriodTest, RandomSequenceHasNoPeriod) {
  EXPECT_FALSE(FindPeriod(RandomPattern(5000, 50, 5)).found);
  EXPECT_FALSE(FindPeriod(std::vector<std::uint32_t>{}).found);
  EXPECT_FALSE(FindPeriod(std::vector<std::uint32_t>{1, 2, 3}).found);
}

TEST(PeriodTest, LongPeriodInLargeWindow) {
  // Pipeline schedule with many micro-batches: 20,000 calls per iteration, 5 iterations.
  const PeriodResult r = FindPeriod(Repeat(RandomPattern(20000, 64, 13), 5));
  ASSERT_TRUE(r.found);
  EXPECT_EQ(r.period, 20000U);
}

}  // namespace
}  // namespace falcon::analyzer
