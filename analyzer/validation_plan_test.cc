// Tests for validation pass plans: exhaustive over group sizes 2..64 (every link covered exactly
// once, every pass a matching, the stated pass counts), executor tasks and their limits.
#include "analyzer/validation_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <utility>

namespace falcon::analyzer {
namespace {

using Link = std::pair<std::int32_t, std::int32_t>;

std::multiset<Link> Covered(const ValidationPlan& plan) {
  std::multiset<Link> out;
  for (const ValidationPass& pass : plan.passes) {
    for (const PlannedTransfer& t : pass.transfers) out.insert({t.sender, t.receiver});
  }
  return out;
}

std::multiset<Link> AsSet(const std::vector<PlannedTransfer>& links) {
  std::multiset<Link> out;
  for (const PlannedTransfer& t : links) out.insert({t.sender, t.receiver});
  return out;
}

TEST(ValidationPlanTest, RingCoversEveryLinkOnceInTwoOrThreeMatchings) {
  for (std::size_t n = 2; n <= 64; ++n) {
    const Result<ValidationPlan> plan = PlanRing(n);
    ASSERT_TRUE(plan.ok()) << n;
    EXPECT_TRUE(CheckPlan(plan.value()).ok()) << n << ": " << CheckPlan(plan.value()).ToString();
    EXPECT_EQ(plan.value().passes.size(), n % 2 == 0 ? 2U : 3U) << n;
    const std::multiset<Link> links = AsSet(RingLinks(n));
    EXPECT_EQ(links.size(), n);
    EXPECT_EQ(std::set<Link>(links.begin(), links.end()).size(), n) << "ring links distinct";
    EXPECT_EQ(Covered(plan.value()), links) << n;
    std::size_t smallest = n, largest = 0;
    for (const ValidationPass& pass : plan.value().passes) {
      smallest = std::min(smallest, pass.transfers.size());
      largest = std::max(largest, pass.transfers.size());
    }
    EXPECT_LE(largest - smallest, 1U) << "passes balanced, n = " << n;
  }
}

TEST(ValidationPlanTest, TreeCoversEveryLinkOnceInAtMostFourMatchings) {
  for (std::size_t n = 2; n <= 64; ++n) {
    const Result<ValidationPlan> plan = PlanTree(n);
    ASSERT_TRUE(plan.ok()) << n;
    EXPECT_TRUE(CheckPlan(plan.value()).ok()) << n << ": " << CheckPlan(plan.value()).ToString();
    EXPECT_EQ(plan.value().passes.size(), std::min<std::size_t>(n - 1, 4)) << n;
    const std::multiset<Link> links = AsSet(TreeLinks(n));
    EXPECT_EQ(links.size(), n - 1);
    EXPECT_EQ(Covered(plan.value()), links) << n;
    // A tree: every rank but the root has exactly one parent, and parents precede children.
    std::vector<int> parents(n, 0);
    for (const auto& [p, c] : links) {
      ++parents[static_cast<std::size_t>(c)];
      EXPECT_LT(p, c);
    }
    EXPECT_EQ(parents[0], 0);
    for (std::size_t r = 1; r < n; ++r) EXPECT_EQ(parents[r], 1) << n << " rank " << r;
  }
}

TEST(ValidationPlanTest, LargeGroupsKeepTheirPassCounts) {
  for (const std::size_t n : {255U, 256U, 1000U, 4097U}) {
    EXPECT_EQ(PlanRing(n).value().passes.size(), n % 2 == 0 ? 2U : 3U) << n;
    EXPECT_EQ(PlanTree(n).value().passes.size(), 4U) << n;
    EXPECT_TRUE(CheckPlan(PlanRing(n).value()).ok()) << n;
    EXPECT_TRUE(CheckPlan(PlanTree(n).value()).ok()) << n;
  }
}

TEST(ValidationPlanTest, RejectsGroupsTooSmallOrTooLarge) {
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, kMaxPlanRanks + 1}) {
    EXPECT_FALSE(PlanRing(n).ok()) << n;
    EXPECT_FALSE(PlanTree(n).ok()) << n;
  }
}

TEST(ValidationPlanTest, CheckPlanFindsEachFault) {
  struct Case {
    const char* what;
    std::vector<std::vector<PlannedTransfer>> passes;
    bool ok;
  };
  const Case cases[] = {
      {"valid", {{{0, 1}, {2, 3}}, {{1, 2}}}, true},
      {"rank twice in a pass", {{{0, 1}, {1, 2}}}, false},
      {"self transfer", {{{2, 2}}}, false},
      {"rank out of range", {{{0, 4}}}, false},
      {"negative rank", {{{-1, 0}}}, false},
      {"empty pass", {{{0, 1}}, {}}, false},
  };
  for (const Case& c : cases) {
    ValidationPlan plan;
    plan.nranks = 4;
    for (const auto& transfers : c.passes) plan.passes.push_back({transfers});
    EXPECT_EQ(CheckPlan(plan).ok(), c.ok) << c.what;
  }
}

TEST(ValidationPlanTest, RemapRelabelsEveryRank) {
  const ValidationPlan plan = PlanRing(4).value();
  const std::int32_t labels[] = {10, 20, 30, 40};
  const Result<ValidationPlan> mapped = RemapPlan(plan, labels);
  ASSERT_TRUE(mapped.ok());
  EXPECT_EQ(mapped.value().passes[0].transfers[0], (PlannedTransfer{10, 20}));
  EXPECT_EQ(mapped.value().passes[1].transfers[1], (PlannedTransfer{40, 10}));
  EXPECT_FALSE(RemapPlan(plan, std::span<const std::int32_t>(labels, 3)).ok());
}

TEST(ValidationPlanTest, PassTasksGiveEachRankOneSendOrReceive) {
  for (std::size_t n = 2; n <= 64; ++n) {
    for (const PlanTopology topology : {PlanTopology::kRing, PlanTopology::kTree}) {
      const ValidationPlan plan = MakePlan(topology, n).value();
      for (const ValidationPass& pass : plan.passes) {
        const Result<std::vector<RankTask>> tasks = PassTasks(pass, {1 << 20, 5});
        ASSERT_TRUE(tasks.ok());
        EXPECT_EQ(tasks.value().size(), 2 * pass.transfers.size());
        std::set<std::int32_t> ranks;
        for (const RankTask& rt : tasks.value()) {
          EXPECT_TRUE(ranks.insert(rt.rank).second) << "rank " << rt.rank << " has two tasks";
          EXPECT_EQ(rt.task.kind, static_cast<std::uint32_t>(kFalconTaskP2p));
          EXPECT_EQ(rt.task.repeats, 5U);
          EXPECT_EQ(rt.task.bytes, 1U << 20);
          // Exactly one direction per task, and the peer's task mirrors it.
          EXPECT_NE(rt.task.send_peer == -1, rt.task.recv_peer == -1);
        }
        for (const PlannedTransfer& t : pass.transfers) {
          const auto find = [&](std::int32_t r) {
            return *std::find_if(tasks.value().begin(), tasks.value().end(),
                                 [&](const RankTask& rt) { return rt.rank == r; });
          };
          EXPECT_EQ(find(t.sender).task.send_peer, t.receiver);
          EXPECT_EQ(find(t.receiver).task.recv_peer, t.sender);
        }
      }
    }
  }
}

TEST(ValidationPlanTest, TaskLimitsFollowTheAbi) {
  const ValidationPass pass{{{0, 1}}};
  struct P2pCase {
    std::uint64_t bytes;
    std::uint32_t repeats;
    bool ok;
  };
  const P2pCase p2p[] = {{1, 1, true},           {kMaxP2pBytes, 1000, true}, {0, 1, false},
                         {kMaxP2pBytes + 1, 1, false}, {64, 0, false}, {64, 1001, false}};
  for (const P2pCase& c : p2p) {
    EXPECT_EQ(PassTasks(pass, {c.bytes, c.repeats}).ok(), c.ok) << c.bytes << " x" << c.repeats;
  }
  struct GemmCase {
    GemmTaskOptions options;
    bool ok;
  };
  const GemmCase gemm[] = {{{4096, 4096, 4096, 10}, true}, {{1, 1, 1, 1}, true},
                           {{8192, 8192, 8192, 1000}, true}, {{0, 16, 16, 1}, false},
                           {{16, 8193, 16, 1}, false},      {{16, 16, 16, 0}, false}};
  for (const GemmCase& c : gemm) {
    const Result<FalconTask> task = GemmTask(c.options);
    ASSERT_EQ(task.ok(), c.ok) << c.options.m << "x" << c.options.n << "x" << c.options.k;
    if (!task.ok()) continue;
    EXPECT_EQ(task.value().kind, static_cast<std::uint32_t>(kFalconTaskGemm));
    EXPECT_EQ(task.value().m, c.options.m);
    EXPECT_EQ(task.value().k, c.options.k);
    EXPECT_EQ(task.value().repeats, c.options.repeats);
    EXPECT_EQ(task.value().send_peer, -1);
  }
}

}  // namespace
}  // namespace falcon::analyzer
