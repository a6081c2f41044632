// Tests for the S3 topology planners: Megatron rank order, the cost model against hand-computed
// times, link relief (the congested DP link ends on PP or no traffic; the best over every
// placement two swaps can reach, by brute force on seeded random small jobs), consolidation (k
// straggler nodes in the fewest stages, interior first), placements stay node permutations, and
// invalid inputs.
#include "analyzer/topology_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <tuple>

#include "analyzer/test_util.h"

namespace falcon::analyzer {
namespace {

using testing::Rng;

// Megatron's default placement: consecutive ranks fill a node, plus `spares` empty nodes.
JobPlacement Consecutive(JobShape shape, std::int32_t gpus_per_node, std::int32_t spares = 0) {
  JobPlacement p;
  p.shape = shape;
  p.gpus_per_node = gpus_per_node;
  const std::int32_t world = shape.tp * shape.dp * shape.pp;
  p.num_nodes = world / gpus_per_node + spares;
  for (std::int32_t r = 0; r < world; ++r) p.node_of_rank.push_back(r / gpus_per_node);
  return p;
}

// The same job with its nodes relabelled at random (a random physical placement).
JobPlacement Shuffled(JobPlacement p, Rng& rng) {
  std::vector<std::int32_t> perm(static_cast<std::size_t>(p.num_nodes));
  std::iota(perm.begin(), perm.end(), 0);
  for (std::size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[rng.Next() % i]);
  for (std::int32_t& n : p.node_of_rank) n = perm[static_cast<std::size_t>(n)];
  return p;
}

// True when `after` is `before` with node ids permuted (ranks that shared a node still do).
bool IsNodePermutation(const JobPlacement& before, const std::vector<std::int32_t>& after) {
  if (after.size() != before.node_of_rank.size()) return false;
  std::vector<std::int32_t> map(static_cast<std::size_t>(before.num_nodes), -1);
  std::vector<std::int32_t> inverse(static_cast<std::size_t>(before.num_nodes), -1);
  for (std::size_t r = 0; r < after.size(); ++r) {
    auto& to = map[static_cast<std::size_t>(before.node_of_rank[r])];
    auto& from = inverse[static_cast<std::size_t>(after[r])];
    if ((to != -1 && to != after[r]) || (from != -1 && from != before.node_of_rank[r])) {
      return false;
    }
    to = after[r];
    from = before.node_of_rank[r];
  }
  return true;
}

auto LoadKey(const LinkLoad& load) {
  return std::tuple(load.traffic, load.dp_bytes + load.pp_bytes);
}

TEST(TopologyPlanTest, RankOrderIsTensorThenDataThenPipeline) {
  const JobShape shape{2, 3, 4};
  EXPECT_EQ(CoordOf(shape, 1), (RankCoord{0, 0, 1}));
  EXPECT_EQ(CoordOf(shape, 2), (RankCoord{0, 1, 0}));
  EXPECT_EQ(CoordOf(shape, 6), (RankCoord{1, 0, 0}));
  for (std::int32_t r = 0; r < 24; ++r) EXPECT_EQ(RankOf(shape, CoordOf(shape, r)), r);
}

TEST(TopologyPlanTest, CostModelMatchesHandComputedTimes) {
  JobCostModel model;
  // One rank: m micro-batches of compute, nothing else.
  EXPECT_DOUBLE_EQ(ExpectedIterationTime(Consecutive({1, 1, 1}, 1), model, {}).value(), 32 * 0.05);
  // dp = 2 over two nodes: plus a ring all-reduce of V_dp = 12 L h^2 x 2 bytes at 25 GB/s.
  const double v_dp = 12.0 * 32 * 4096 * 4096 * 2;
  const JobPlacement dp2 = Consecutive({1, 2, 1}, 1);
  EXPECT_DOUBLE_EQ(ExpectedIterationTime(dp2, model, {}).value(), 1.6 + v_dp / 25e9);
  JobFaults slow_link;
  slow_link.slow_link = NodePair{0, 1};
  EXPECT_DOUBLE_EQ(ExpectedIterationTime(dp2, model, slow_link).value(), 1.6 + v_dp / 2.5e9);
  // pp = 2 over two nodes: each step adds one PP send of b n_ctx h x 2 bytes.
  const double step = 0.05 + 2048.0 * 4096 * 2 / 25e9;
  EXPECT_DOUBLE_EQ(ExpectedIterationTime(Consecutive({1, 1, 2}, 1), model, {}).value(),
                   2 * step + 31 * step);
  // A straggler doubles its stage's compute.
  JobFaults straggler;
  straggler.slow_gpus = {GpuId{1, 0}};
  const double slow_step = 0.1 + 2048.0 * 4096 * 2 / 25e9;
  EXPECT_DOUBLE_EQ(ExpectedIterationTime(Consecutive({1, 1, 2}, 1), model, straggler).value(),
                   step + slow_step + 31 * slow_step);
}

TEST(TopologyPlanTest, CongestedDataParallelLinkMovesOffDataTraffic) {
  // tp 2, dp 4, pp 4 on 8 nodes of 4 GPUs: node 0 holds stage 0, d 0-1; node 1 stage 0, d 2-3,
  // so the link 0-1 carries the stage-0 DP rings.
  const JobPlacement placement = Consecutive({2, 4, 4}, 4);
  const JobCostModel model;
  const TopologyPlan plan = PlanLinkRelief(placement, model, {0, 1}).value();
  EXPECT_EQ(plan.link_before.traffic, LinkTraffic::kData);
  EXPECT_TRUE(plan.link_after.traffic == LinkTraffic::kIdle ||
              plan.link_after.traffic == LinkTraffic::kPipeline);
  EXPECT_EQ(plan.link_after.traffic, LinkTraffic::kIdle);  // 8 nodes leave room for no traffic
  EXPECT_EQ(plan.swaps.size(), 1U);
  EXPECT_TRUE(IsNodePermutation(placement, plan.node_of_rank));
  EXPECT_EQ(ApplySwaps(placement, plan.swaps).value(), plan.node_of_rank);
  JobPlacement after = placement;
  after.node_of_rank = plan.node_of_rank;
  EXPECT_EQ(LoadKey(LoadBetween(after, model, {0, 1}).value()), LoadKey(plan.link_after));
  EXPECT_LT(plan.iteration_after_s, plan.iteration_before_s);
  EXPECT_DOUBLE_EQ(plan.iteration_after_s, ExpectedIterationTime(placement, model, {}).value());
}

TEST(TopologyPlanTest, LinkReliefIsTheBestTwoSwapsCanReach) {
  Rng rng(5);
  const JobCostModel model;
  int pipeline_answers = 0, idle_answers = 0, unchanged = 0, slower_skipped = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const JobShape shape{1 + static_cast<std::int32_t>(rng.Next() % 2),
                         1 + static_cast<std::int32_t>(rng.Next() % 3),
                         1 + static_cast<std::int32_t>(rng.Next() % 3)};
    const std::int32_t world = shape.tp * shape.dp * shape.pp;
    const std::int32_t g = world % 2 == 0 && rng.Next() % 2 == 0 ? 2 : 1;
    const JobPlacement placement = Shuffled(Consecutive(shape, g), rng);
    if (placement.num_nodes < 2) continue;
    const auto a =
        static_cast<std::int32_t>(rng.Next() % static_cast<std::uint64_t>(placement.num_nodes));
    const auto b = (a + 1) % placement.num_nodes;
    const TopologyPlan plan = PlanLinkRelief(placement, model, {a, b}).value();
    // Two swaps put any two nodes' ranks on a and b: the best pair of nodes, by brute force.
    auto best = LoadKey(plan.link_before);
    for (std::int32_t x = 0; x < placement.num_nodes; ++x) {
      for (std::int32_t y = 0; y < placement.num_nodes; ++y) {
        if (x != y) best = std::min(best, LoadKey(LoadBetween(placement, model, {x, y}).value()));
      }
    }
    if (plan.swaps.empty()) {
      // Stays only when nothing is lighter or the lighter traffic is not faster.
      EXPECT_EQ(plan.iteration_after_s, plan.iteration_before_s);
      EXPECT_EQ(LoadKey(plan.link_after), LoadKey(plan.link_before));
      slower_skipped += best < LoadKey(plan.link_before) ? 1 : 0;
    } else {
      EXPECT_EQ(LoadKey(plan.link_after), best) << "trial " << trial;
      EXPECT_LT(plan.iteration_after_s, plan.iteration_before_s);
    }
    EXPECT_LE(plan.swaps.size(), 2U);
    EXPECT_TRUE(IsNodePermutation(placement, plan.node_of_rank));
    EXPECT_LE(plan.iteration_after_s, plan.iteration_before_s * (1 + 1e-12));
    pipeline_answers += plan.link_after.traffic == LinkTraffic::kPipeline ? 1 : 0;
    idle_answers += plan.link_after.traffic == LinkTraffic::kIdle ? 1 : 0;
    unchanged += plan.swaps.empty() ? 1 : 0;
  }
  EXPECT_GT(pipeline_answers, 0);
  EXPECT_GT(idle_answers, 0);
  EXPECT_GT(unchanged, 0);
  EXPECT_LT(slower_skipped, 30) << "lighter traffic is almost always faster";
}

TEST(TopologyPlanTest, SpareNodeTakesTheCongestedLinkOffAllTraffic) {
  // dp 3 on 3 nodes: every pair carries DP, so only the spare node 3 helps.
  const JobPlacement placement = Consecutive({1, 3, 1}, 1, 1);
  const TopologyPlan plan = PlanLinkRelief(placement, {}, {0, 2}).value();
  EXPECT_EQ(plan.link_after.traffic, LinkTraffic::kIdle);
  ASSERT_EQ(plan.swaps.size(), 1U);
  EXPECT_EQ(plan.swaps[0].b, 3);
  JobPlacement no_spare = Consecutive({1, 3, 1}, 1);
  const TopologyPlan stuck = PlanLinkRelief(no_spare, {}, {0, 2}).value();
  EXPECT_TRUE(stuck.swaps.empty());
  EXPECT_EQ(stuck.node_of_rank, no_spare.node_of_rank);
  EXPECT_EQ(stuck.iteration_after_s, stuck.iteration_before_s);
}

TEST(TopologyPlanTest, ConsolidationUsesInteriorStagesAlreadyHoldingStragglers) {
  // tp 2, dp 2, pp 4, 2 GPUs per node: node 2s + d holds stage s of pipeline d.
  const JobPlacement placement = Consecutive({2, 2, 4}, 2);
  JobCostModel model;
  model.edge_stage_compute_factor = 1.2;
  const std::vector<std::int32_t> nodes = {0, 3, 7};  // stages 0, 1, 3
  const std::vector<GpuId> gpus = GpusOfNodes(placement, nodes).value();
  const TopologyPlan plan = PlanStragglerConsolidation(placement, model, gpus).value();
  EXPECT_EQ(plan.straggler_stages_before, (std::vector<std::int32_t>{0, 1, 3}));
  EXPECT_EQ(plan.straggler_stages_after, (std::vector<std::int32_t>{1, 2}));
  EXPECT_EQ(plan.swaps, (std::vector<NodeSwap>{{0, 2}, {7, 4}}));
  EXPECT_TRUE(IsNodePermutation(placement, plan.node_of_rank));
  EXPECT_LT(plan.iteration_after_s, plan.iteration_before_s);
}

TEST(TopologyPlanTest, ConsolidationNeedsTheFewestStagesInteriorFirst) {
  Rng rng(9);
  for (int trial = 0; trial < 200; ++trial) {
    const JobShape shape{1 + static_cast<std::int32_t>(rng.Next() % 2),
                         2 + static_cast<std::int32_t>(rng.Next() % 3),
                         3 + static_cast<std::int32_t>(rng.Next() % 4)};
    // One node per (stage, pipeline) or one node per stage: nodes never straddle stages.
    const std::int32_t g = trial % 2 == 0 ? shape.tp : shape.tp * shape.dp;
    const JobPlacement placement = Shuffled(Consecutive(shape, g), rng);
    const std::int32_t nodes_per_stage = shape.tp * shape.dp / g;
    const auto k =
        1 + static_cast<std::int32_t>(rng.Next() % static_cast<std::uint64_t>(placement.num_nodes));
    std::vector<std::int32_t> nodes(static_cast<std::size_t>(placement.num_nodes));
    std::iota(nodes.begin(), nodes.end(), 0);
    for (std::size_t i = nodes.size(); i > 1; --i) std::swap(nodes[i - 1], nodes[rng.Next() % i]);
    nodes.resize(static_cast<std::size_t>(k));
    // One slow GPU per straggler node, at a random local index.
    std::vector<GpuId> gpus;
    for (const std::int32_t n : nodes) {
      gpus.push_back({n, static_cast<std::int32_t>(rng.Next() % static_cast<std::uint64_t>(g))});
    }
    const TopologyPlan plan = PlanStragglerConsolidation(placement, {}, gpus).value();
    const std::size_t stages =
        static_cast<std::size_t>((k + nodes_per_stage - 1) / nodes_per_stage);
    EXPECT_EQ(plan.straggler_stages_after.size(), stages) << "trial " << trial;
    if (stages <= static_cast<std::size_t>(shape.pp - 2)) {
      for (const std::int32_t s : plan.straggler_stages_after) {
        EXPECT_TRUE(s != 0 && s != shape.pp - 1) << "trial " << trial << " stage " << s;
      }
    }
    EXPECT_LE(plan.swaps.size(), static_cast<std::size_t>(k));
    EXPECT_TRUE(IsNodePermutation(placement, plan.node_of_rank));
    EXPECT_EQ(ApplySwaps(placement, plan.swaps).value(), plan.node_of_rank);
  }
}

TEST(TopologyPlanTest, StragglerRanksFollowTheirGpus) {
  const JobPlacement placement = Consecutive({1, 2, 3}, 1);  // node r hosts rank r
  const std::vector<GpuId> gpus = GpusOfRanks(placement, std::vector<std::int32_t>{0}).value();
  ASSERT_EQ(gpus.size(), 1U);
  EXPECT_EQ(gpus[0], (GpuId{0, 0}));
  const TopologyPlan plan = PlanStragglerConsolidation(placement, {}, gpus).value();
  EXPECT_EQ(plan.straggler_stages_after, (std::vector<std::int32_t>{1}));
  // Node 0 (the slow GPU) now runs a stage-1 rank.
  const std::int32_t rank = static_cast<std::int32_t>(
      std::find(plan.node_of_rank.begin(), plan.node_of_rank.end(), 0) - plan.node_of_rank.begin());
  EXPECT_EQ(CoordOf(placement.shape, rank).pp_stage, 1);
  // Already in an interior stage: nothing to do.
  const TopologyPlan none =
      PlanStragglerConsolidation(placement, {}, std::vector<GpuId>{{2, 0}}).value();
  EXPECT_TRUE(none.swaps.empty());
}

TEST(TopologyPlanTest, RejectsInvalidInputNamingTheFault) {
  const JobPlacement good = Consecutive({2, 2, 2}, 2, 1);
  const JobCostModel model;
  auto expect_error = [](const Status& s, const char* needle) {
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << needle;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  JobPlacement p = good;
  p.shape.dp = 0;
  expect_error(CheckPlacement(p), "must be >= 1");
  p = good;
  p.node_of_rank.pop_back();
  expect_error(CheckPlacement(p), "nodes listed");
  p = good;
  p.node_of_rank[0] = 9;
  expect_error(CheckPlacement(p), "rank 0 on node 9");
  p = good;
  p.node_of_rank[0] = 1;
  expect_error(CheckPlacement(p), "hosts");
  p = good;
  p.shape = {4096, 4096, 4096};
  expect_error(CheckPlacement(p), "at most");
  expect_error(PlanLinkRelief(good, model, {1, 1}).status(), "both ends");
  expect_error(PlanLinkRelief(good, model, {0, 7}).status(), "node 7");
  JobCostModel bad = model;
  bad.hidden = -1;
  expect_error(PlanLinkRelief(good, bad, {0, 1}).status(), "hidden must be finite and > 0");
  bad = model;
  bad.slow_compute_factor = 0.5;
  expect_error(CheckCostModel(bad), ">= 1");
  expect_error(PlanStragglerConsolidation(good, model, {}).status(), "no straggler");
  expect_error(PlanStragglerConsolidation(good, model, std::vector<GpuId>{{4, 0}}).status(),
               "runs no rank");
  expect_error(GpusOfNodes(good, std::vector<std::int32_t>{4}).status(), "hosts no rank");
  expect_error(GpusOfRanks(good, std::vector<std::int32_t>{8}).status(), "rank 8");
  expect_error(ApplySwaps(good, std::vector<NodeSwap>{{0, 5}}).status(), "node 5");
}

}  // namespace
}  // namespace falcon::analyzer
