// Tests for the S2 micro-batch planner: optimality against a brute force over every allocation
// on seeded random small cases (n <= 5 groups, M <= 12), against the O(n) optimality certificate
// IsOptimalMicrobatchAllocation on large ones (up to 100,000 groups), the certificate itself
// against the brute force on every small allocation, ties, the even split, slow groups, undo,
// and the errors.
#include "analyzer/microbatch_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include "analyzer/test_util.h"

namespace falcon::analyzer {
namespace {

using testing::Rng;

double Max(const std::vector<double>& times, const std::vector<std::int64_t>& alloc) {
  double worst = 0;
  for (std::size_t i = 0; i < times.size(); ++i) {
    worst = std::max(worst, static_cast<double>(alloc[i]) * times[i]);
  }
  return worst;
}

// The least bottleneck over every allocation (m_i >= 1, sum = total), by enumeration.
double BruteForce(const std::vector<double>& times, std::int64_t total) {
  std::vector<std::int64_t> alloc(times.size(), 1);
  double best = std::numeric_limits<double>::infinity();
  // Recursive enumeration of compositions: group i takes 1..(left - groups after it).
  auto rec = [&](auto&& self, std::size_t i, std::int64_t left) -> void {
    if (i + 1 == times.size()) {
      alloc[i] = left;
      best = std::min(best, Max(times, alloc));
      return;
    }
    const auto rest = static_cast<std::int64_t>(times.size() - i - 1);
    for (std::int64_t m = 1; m <= left - rest; ++m) {
      alloc[i] = m;
      self(self, i + 1, left - m);
    }
  };
  rec(rec, 0, total);
  return best;
}

// The plan's allocation passes the solver-independent O(n) certificate.
void ExpectCertifiedOptimal(const MicrobatchPlan& plan, const std::vector<double>& times,
                            std::int64_t total) {
  const Result<bool> optimal = IsOptimalMicrobatchAllocation(times, total, plan.microbatches);
  ASSERT_TRUE(optimal.ok()) << optimal.status().ToString();
  EXPECT_TRUE(optimal.value()) << times.size() << " groups, M " << total;
}

void ExpectValidPlan(const MicrobatchPlan& plan, const std::vector<double>& times,
                     std::int64_t total) {
  ASSERT_EQ(plan.microbatches.size(), times.size());
  EXPECT_EQ(plan.total, total);
  EXPECT_EQ(std::accumulate(plan.microbatches.begin(), plan.microbatches.end(), std::int64_t{0}),
            total);
  EXPECT_EQ(std::accumulate(plan.baseline.begin(), plan.baseline.end(), std::int64_t{0}), total);
  for (const std::int64_t m : plan.microbatches) EXPECT_GE(m, 1);
  EXPECT_EQ(plan.bottleneck_after_s, Max(times, plan.microbatches));
  EXPECT_EQ(plan.bottleneck_before_s, Max(times, plan.baseline));
  EXPECT_EQ(
      static_cast<double>(plan.microbatches[plan.bottleneck_group]) * times[plan.bottleneck_group],
      plan.bottleneck_after_s);
  EXPECT_LE(plan.lower_bound_s, plan.bottleneck_after_s * (1 + 1e-12));
  EXPECT_LE(plan.bottleneck_after_s, plan.bottleneck_before_s);
  double weights = 0;
  for (std::size_t i = 0; i < times.size(); ++i) {
    EXPECT_DOUBLE_EQ(plan.gradient_weights[i],
                     static_cast<double>(plan.microbatches[i]) / static_cast<double>(total));
    weights += plan.gradient_weights[i];
  }
  EXPECT_NEAR(weights, 1.0, 1e-9);
}

TEST(MicrobatchPlanTest, MatchesBruteForceOnRandomSmallCases) {
  Rng rng(7);
  const double ladder[] = {0.5, 1.0, 1.5, 2.0, 3.0};  // drawn from to force ties
  int cases = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const std::size_t n = 1 + rng.Next() % 5;
    for (auto total = static_cast<std::int64_t>(n); total <= 12; ++total) {
      std::vector<double> times(n);
      for (double& t : times) {
        t = trial % 2 == 0 ? ladder[rng.Next() % 5] : 0.1 + 4.9 * rng.Uniform();
      }
      const Result<MicrobatchPlan> plan = PlanMicrobatches(times, total);
      ASSERT_TRUE(plan.ok()) << plan.status().ToString();
      ExpectValidPlan(plan.value(), times, total);
      EXPECT_EQ(plan.value().bottleneck_after_s, BruteForce(times, total))
          << "trial " << trial << " n " << n << " M " << total;
      ++cases;
    }
  }
  EXPECT_GT(cases, 1500);
}

TEST(MicrobatchPlanTest, EqualTimesGiveTheEvenSplit) {
  const std::vector<double> times(4, 0.3);
  const MicrobatchPlan even = PlanMicrobatches(times, 12).value();
  EXPECT_EQ(even.microbatches, (std::vector<std::int64_t>{3, 3, 3, 3}));
  EXPECT_EQ(even.bottleneck_after_s, even.bottleneck_before_s);
  // 14 over 4: two groups run 4, two run 3, whichever the solver picks; nothing better exists.
  const MicrobatchPlan uneven = PlanMicrobatches(times, 14).value();
  ExpectValidPlan(uneven, times, 14);
  EXPECT_EQ(*std::max_element(uneven.microbatches.begin(), uneven.microbatches.end()), 4);
  EXPECT_EQ(*std::min_element(uneven.microbatches.begin(), uneven.microbatches.end()), 3);
}

TEST(MicrobatchPlanTest, TiesAreBrokenDeterministically) {
  const std::vector<double> times = {1.0, 2.0, 1.0, 2.0};
  const MicrobatchPlan a = PlanMicrobatches(times, 7).value();
  const MicrobatchPlan b = PlanMicrobatches(times, 7).value();
  EXPECT_EQ(a.microbatches, b.microbatches);
  EXPECT_EQ(a.bottleneck_after_s, BruteForce(times, 7));
  ExpectValidPlan(a, times, 7);
}

TEST(MicrobatchPlanTest, OneSlowGroupRunsFewerMicrobatches) {
  std::vector<double> times(8, 1.0);
  times[3] = 2.0;  // a 2x compute straggler in DP group 3
  const MicrobatchPlan plan = PlanMicrobatches(times, 64).value();
  ExpectValidPlan(plan, times, 64);
  EXPECT_EQ(plan.bottleneck_before_s, 16.0);  // 8 micro-batches at 2 s
  EXPECT_EQ(plan.bottleneck_after_s, 9.0);    // slow group 4 (8 s), the others 8 or 9
  EXPECT_EQ(plan.microbatches[3], 4);
  EXPECT_NEAR(plan.lower_bound_s, 64.0 / 7.5, 1e-12);
}

TEST(MicrobatchPlanTest, GroupsSlowerThanTheBoundKeepOneMicrobatch) {
  const std::vector<double> times = {100.0, 100.0, 1.0};
  const MicrobatchPlan at_n = PlanMicrobatches(times, 3).value();
  EXPECT_EQ(at_n.microbatches, (std::vector<std::int64_t>{1, 1, 1}));
  const MicrobatchPlan plan = PlanMicrobatches(times, 10).value();
  EXPECT_EQ(plan.microbatches, (std::vector<std::int64_t>{1, 1, 8}));
  EXPECT_EQ(plan.bottleneck_after_s, 100.0);
  EXPECT_EQ(plan.bottleneck_after_s, BruteForce(times, 10));
  EXPECT_LE(plan.lower_bound_s, 100.0);
}

TEST(MicrobatchPlanTest, HugeGroupCountsAreOptimalByCertificate) {
  Rng rng(11);
  for (const std::size_t n : {std::size_t{512}, std::size_t{10000}, std::size_t{100000}}) {
    std::vector<double> times(n);
    for (double& t : times) t = 1.0 + 2.0 * rng.Uniform();
    times[n / 2] = 7.5;  // one far slower group
    const auto total = static_cast<std::int64_t>(4 * n + 12345);
    const Result<MicrobatchPlan> plan = PlanMicrobatches(times, total);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    ExpectValidPlan(plan.value(), times, total);
    ExpectCertifiedOptimal(plan.value(), times, total);
    EXPECT_LT(plan.value().bottleneck_after_s, plan.value().bottleneck_before_s) << n;
  }
}

TEST(MicrobatchPlanTest, LargeTotalsAreOptimalByCertificate) {
  Rng rng(13);
  std::vector<double> times(1000);
  for (double& t : times) t = 0.01 + rng.Uniform();
  const std::int64_t total = kMaxMicrobatches - 17;
  const MicrobatchPlan plan = PlanMicrobatches(times, total).value();
  ExpectValidPlan(plan, times, total);
  ExpectCertifiedOptimal(plan, times, total);
}

// Every allocation of every small case: the certificate says optimal exactly when the
// allocation's bottleneck is the brute-force minimum.
TEST(MicrobatchPlanTest, CertificateAgreesWithBruteForceOnEveryAllocation) {
  Rng rng(17);
  const double ladder[] = {0.5, 1.0, 1.5, 2.0, 3.0};
  int optimal = 0;
  int not_optimal = 0;
  for (int trial = 0; trial < 120; ++trial) {
    const std::size_t n = 1 + rng.Next() % 4;
    const auto total = static_cast<std::int64_t>(n + rng.Next() % 7);
    std::vector<double> times(n);
    for (double& t : times) t = trial % 2 == 0 ? ladder[rng.Next() % 5] : 0.1 + 4.9 * rng.Uniform();
    const double best = BruteForce(times, total);
    std::vector<std::int64_t> alloc(n, 1);
    auto rec = [&](auto&& self, std::size_t i, std::int64_t left) -> void {
      if (i + 1 == n) {
        alloc[i] = left;
        const Result<bool> certified = IsOptimalMicrobatchAllocation(times, total, alloc);
        ASSERT_TRUE(certified.ok()) << certified.status().ToString();
        EXPECT_EQ(certified.value(), Max(times, alloc) == best) << "trial " << trial;
        ++(certified.value() ? optimal : not_optimal);
        return;
      }
      for (std::int64_t m = 1; m <= left - static_cast<std::int64_t>(n - i - 1); ++m) {
        alloc[i] = m;
        self(self, i + 1, left - m);
      }
    };
    rec(rec, 0, total);
  }
  EXPECT_GT(optimal, 120);
  EXPECT_GT(not_optimal, 1000);
}

TEST(MicrobatchPlanTest, CertificateRefusesNonAllocationsAndInvalidInput) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Case {
    std::vector<double> times;
    std::int64_t total;
    std::vector<std::int64_t> microbatches;
    int want;  // 1 optimal, 0 not optimal, -1 InvalidArgument
  };
  const Case cases[] = {
      {{1.0, 2.0}, 6, {4, 2}, 1},
      {{1.0, 2.0}, 6, {3, 3}, 0},            // bottleneck 6 where 4 is possible
      {{1.0, 2.0}, 6, {5, 2}, 0},            // sums to 7
      {{1.0, 2.0}, 6, {6, 0}, 0},            // a group with no micro-batch
      {{1.0, 2.0}, 6, {7, -1}, 0},           // a negative count
      {{1e-300, 1.0}, 5, {4, 1}, 1},         // a group far faster than the other: k capped
      {{1e-300, 1.0}, 5, {3, 2}, 0},         // ... and the slow group must still fit one
      {{1e-300, 1e-300}, kMaxMicrobatches, {kMaxMicrobatches / 2, kMaxMicrobatches / 2}, 1},
      {{1.0, 2.0}, 6, {6}, -1},              // wrong size
      {{1.0, nan}, 6, {4, 2}, -1},
      {{1.0, 2.0}, 1, {1, 1}, -1},           // total below one per group
      {{1e303, 1.0}, 10000000, {1, 9999999}, -1},  // M x slowest overflows
  };
  for (const Case& c : cases) {
    const Result<bool> optimal = IsOptimalMicrobatchAllocation(c.times, c.total, c.microbatches);
    if (c.want < 0) {
      ASSERT_FALSE(optimal.ok()) << c.total;
      EXPECT_EQ(optimal.status().code(), Status::Code::kInvalidArgument);
      continue;
    }
    ASSERT_TRUE(optimal.ok()) << optimal.status().ToString();
    EXPECT_EQ(optimal.value(), c.want == 1) << c.microbatches[0] << " " << c.microbatches[1];
  }
}

TEST(MicrobatchPlanTest, ReplanStartsFromTheCurrentAllocation) {
  const std::vector<double> times = {1.0, 1.0, 3.0};
  const std::vector<std::int64_t> current = {2, 2, 8};
  const MicrobatchPlan plan = ReplanMicrobatches(times, current).value();
  ExpectValidPlan(plan, times, 12);
  EXPECT_EQ(plan.baseline, current);
  EXPECT_EQ(plan.bottleneck_before_s, 24.0);
  EXPECT_EQ(plan.bottleneck_after_s, BruteForce(times, 12));
}

TEST(MicrobatchPlanTest, UndoRestoresTheBaselineAtTheTimesNow) {
  std::vector<double> times = {1.0, 1.0, 2.0, 1.0};
  const MicrobatchPlan plan = PlanMicrobatches(times, 16).value();
  times[2] = 1.0;  // the fail-slow ended
  const MicrobatchPlan undo = UndoMicrobatchPlan(times, plan).value();
  EXPECT_EQ(undo.microbatches, (std::vector<std::int64_t>{4, 4, 4, 4}));
  EXPECT_EQ(undo.baseline, plan.microbatches);
  EXPECT_EQ(undo.bottleneck_after_s, 4.0);
  EXPECT_EQ(undo.bottleneck_before_s, Max(times, plan.microbatches));
  for (const double w : undo.gradient_weights) EXPECT_EQ(w, 0.25);
  MicrobatchPlan broken = plan;
  broken.baseline[0] += 1;
  EXPECT_FALSE(UndoMicrobatchPlan(times, broken).ok());
  EXPECT_FALSE(UndoMicrobatchPlan(std::vector<double>{1.0, 1.0}, plan).ok());
}

TEST(MicrobatchPlanTest, UniformSplitAndBottleneck) {
  EXPECT_EQ(UniformMicrobatches(4, 10).value(), (std::vector<std::int64_t>{3, 3, 2, 2}));
  EXPECT_EQ(UniformMicrobatches(1, 5).value(), (std::vector<std::int64_t>{5}));
  EXPECT_FALSE(UniformMicrobatches(0, 5).ok());
  EXPECT_FALSE(UniformMicrobatches(6, 5).ok());
  const std::vector<double> times = {1.0, 2.5};
  EXPECT_EQ(MicrobatchBottleneck(times, std::vector<std::int64_t>{3, 2}).value(), 5.0);
  EXPECT_FALSE(MicrobatchBottleneck(times, std::vector<std::int64_t>{3}).ok());
  EXPECT_FALSE(MicrobatchBottleneck(times, std::vector<std::int64_t>{3, 0}).ok());
}

TEST(MicrobatchPlanTest, RejectsInvalidInputNamingTheFault) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  struct Case {
    std::vector<double> times;
    std::int64_t total;
    const char* needle;  // a word the message must contain
  };
  const Case cases[] = {
      {{}, 4, "no DP groups"},
      {{1.0, 1.0, 1.0}, 2, "need one per group"},
      {{1.0, nan}, 4, "DP group 1"},
      {{1.0, inf}, 4, "DP group 1"},
      {{0.0, 1.0}, 4, "DP group 0"},
      {{-1.0, 1.0}, 4, "DP group 0"},
      {{1e-320, 1.0}, 4, "reciprocal"},
      {{1e303, 1.0}, 10000000, "overflows"},
      {{1.0}, kMaxMicrobatches + 1, "at most"},
  };
  for (const Case& c : cases) {
    const Result<MicrobatchPlan> plan = PlanMicrobatches(c.times, c.total);
    ASSERT_FALSE(plan.ok()) << c.needle;
    EXPECT_EQ(plan.status().code(), Status::Code::kInvalidArgument);
    EXPECT_NE(plan.status().message().find(c.needle), std::string::npos) << plan.status().message();
  }
  const std::vector<double> times = {1.0, 1.0};
  EXPECT_FALSE(ReplanMicrobatches(times, std::vector<std::int64_t>{1, 0}).ok());
  EXPECT_FALSE(ReplanMicrobatches(times, std::vector<std::int64_t>{1, 1, 1}).ok());
  EXPECT_FALSE(ReplanMicrobatches(times, std::vector<std::int64_t>{kMaxMicrobatches, 1}).ok());
}

}  // namespace
}  // namespace falcon::analyzer
