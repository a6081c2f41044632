// The controller's decision stage (daemon/controller/mitigation.h) on a 16-rank TP 2 x DP 4 x PP 2
// job of 8 nodes (ranks 2k and 2k+1 on node k), seen the way the controller sees it: through
// validated rank registrations. Layout inference, the candidate plans per root cause, the
// ski-rental escalation they drive, the undo of S2, and state that survives a restart.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <functional>
#include <numeric>
#include <set>

#include "analyzer/pipeline_schedule.h"
#include "daemon/controller/mitigation.h"
#include "daemon/controller/recovery_watch.h"
#include "daemon/protocol/messages.h"
#include "daemon/protocol/validate.h"

namespace falcon::controller {
namespace {

using nlohmann::json;

constexpr std::int64_t kT0 = 1'795'264'878'000'000'000;
constexpr std::int64_t kWorldRanks = 16;

std::string Host(std::int64_t rank) { return "node" + std::to_string(rank / 2); }

// Megatron numbering: rank = (pp * 4 + dp) * 2 + tp. Calls per iteration differ per family as
// in training: TP per layer and micro-batch, PP per micro-batch, DP once.
std::vector<protocol::CommSummary> CommsOf(std::int64_t r, int tp, int dp, int pp) {
  const auto rank = static_cast<std::int32_t>(r);
  const std::int32_t t = rank % tp, d = (rank / tp) % dp, p = rank / (tp * dp);
  std::vector<protocol::CommSummary> out = {{0xabcdefULL, rank, static_cast<std::int32_t>(kWorldRanks), "world", 50}};
  if (tp > 1) out.push_back({0x1000ULL + static_cast<std::uint64_t>(p * dp + d), t, tp, "tp", 4000});
  if (dp > 1) out.push_back({0x2000ULL + static_cast<std::uint64_t>(p * tp + t), d, dp, "dp", 50});
  if (pp > 1) out.push_back({0x3000ULL + static_cast<std::uint64_t>(d * tp + t), p, pp, "pp", 800});
  return out;
}

// The view as the controller has it once a mitigation started: node numbering fixed, spares
// ("spare0", ...) after the job's hosts.
// `edit` may add what a rank's agent reports beyond that (e.g. plan costs).
JobView View(int tp, int dp, int pp, int spares = 2,
             const std::function<void(protocol::RankRegistration&)>& edit = {}) {
  std::vector<json> ranks, agents;
  for (std::int64_t r = 0; r < kWorldRanks; ++r) {
    protocol::RankRegistration m;
    m.header = {"job", Host(r), kT0};
    m.rank = r;
    m.pid = 1000 + r;
    m.state = "live";
    m.started_ns = kT0 - 1;
    m.comms = CommsOf(r, tp, dp, pp);
    if (edit) edit(m);
    ranks.push_back(protocol::ParseMessage(protocol::ToJson(m).dump(), protocol::kRankRegister).value());
  }
  JobView v;
  v.Update(ranks, agents);
  std::vector<std::string> hosts;
  for (int n = 0; n < 8; ++n) hosts.push_back("node" + std::to_string(n));
  for (int i = 0; i < spares; ++i) hosts.push_back("spare" + std::to_string(i));
  v.SetNodes(hosts, {});
  return v;
}

json Gpu(std::int64_t rank, double ratio) {
  return {{"rank", rank}, {"host", Host(rank)}, {"evidence", {{"ratio", ratio}}}};
}

MitigationSettings Settings() {
  MitigationSettings s;
  s.overheads = {10, 60, 300};
  s.micro_batches = 8;
  return s;
}

TEST(MitigationLayoutTest, ShapeAndPlacementComeFromTheCommunicators) {
  for (auto [tp, dp, pp] : {std::tuple{2, 4, 2}, std::tuple{1, 8, 2}, std::tuple{2, 8, 1}, std::tuple{4, 2, 2}}) {
    SCOPED_TRACE(std::to_string(tp) + "x" + std::to_string(dp) + "x" + std::to_string(pp));
    Result<JobLayout> l = InferLayout(View(tp, dp, pp), "");
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_EQ(l.value().placement.shape.tp, tp);
    EXPECT_EQ(l.value().placement.shape.dp, dp);
    EXPECT_EQ(l.value().placement.shape.pp, pp);
    EXPECT_EQ(l.value().placement.gpus_per_node, 2);
    EXPECT_EQ(l.value().placement.num_nodes, 10);
    EXPECT_EQ(l.value().spares, (std::vector<std::int32_t>{8, 9}));
    EXPECT_EQ(l.value().placement.node_of_rank[5], 2);
    EXPECT_EQ(l.value().hosts[2], "node2");
  }
}

// Megatron makes groups with the same members under several names (dp and dp-cp, tp and tp-cp,
// pp and the embedding group when pp = 2): each member set counts once.
TEST(MitigationLayoutTest, GroupsAlikeUnderSeveralNamesCountOnce) {
  auto twins = [](protocol::RankRegistration& m) {
    const std::vector<protocol::CommSummary> comms = m.comms;
    for (const protocol::CommSummary& c : comms) {
      if (c.nranks == static_cast<std::int32_t>(kWorldRanks)) continue;
      protocol::CommSummary twin = c;
      twin.id = c.id + 0x100000ULL;
      twin.name = c.name + "-twin";
      twin.calls = c.calls / 2;
      m.comms.push_back(twin);
    }
  };
  for (auto [tp, dp, pp] : {std::tuple{2, 4, 2}, std::tuple{1, 8, 2}, std::tuple{4, 2, 2}}) {
    SCOPED_TRACE(std::to_string(tp) + "x" + std::to_string(dp) + "x" + std::to_string(pp));
    Result<JobLayout> l = InferLayout(View(tp, dp, pp, 2, twins), "");
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_EQ(l.value().placement.shape.tp, tp);
    EXPECT_EQ(l.value().placement.shape.dp, dp);
    EXPECT_EQ(l.value().placement.shape.pp, pp);
  }
}

// Megatron also makes groups it never uses in plain TP x DP x PP training: tp-dp (consecutive
// ranks, TP x DP of them, no calls) would be the quietest partition of all. Pipeline groups
// quieter than DP (few micro-batches) must not pass for DP either: their stride is no TP size.
TEST(MitigationLayoutTest, UnusedGroupsAndQuietPipelinesAreNotDataParallel) {
  for (auto [tp, dp, pp] : {std::tuple{2, 4, 2}, std::tuple{4, 2, 2}, std::tuple{2, 8, 1}}) {
    SCOPED_TRACE(std::to_string(tp) + "x" + std::to_string(dp) + "x" + std::to_string(pp));
    auto megatron = [tp, dp](protocol::RankRegistration& m) {
      const auto r = static_cast<std::int32_t>(m.rank);
      for (protocol::CommSummary& c : m.comms) {
        if (c.name == "pp") c.calls = 10;  // fewer calls than DP's 50
      }
      if (tp * dp < kWorldRanks) {
        m.comms.push_back({0x4000ULL + static_cast<std::uint64_t>(r / (tp * dp)), r % (tp * dp), tp * dp, "tp-dp", 0});
      }
    };
    Result<JobLayout> l = InferLayout(View(tp, dp, pp, 2, megatron), "");
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_EQ(l.value().placement.shape.tp, tp);
    EXPECT_EQ(l.value().placement.shape.dp, dp);
    EXPECT_EQ(l.value().placement.shape.pp, pp);
  }
}

// Pipeline traffic on stage-pair communicators of their own (falcon-train-emu --pp-comm
// per-direction; PyTorch's communicators for unbatched send/recv): the pipeline group carries no
// calls, and with TP 1 the model-parallel group has the pipeline's members and one call an
// iteration (the gradient norm), the quietest partition of all. The chained pairs give the
// stage stride, TP x DP, and so the data-parallel family.
TEST(MitigationLayoutTest, ChainedStagePairsTellThePipelineFromDataParallelism) {
  for (auto [tp, dp, pp] : {std::tuple{1, 4, 4}, std::tuple{1, 2, 8}, std::tuple{2, 2, 4}, std::tuple{1, 8, 2}}) {
    SCOPED_TRACE(std::to_string(tp) + "x" + std::to_string(dp) + "x" + std::to_string(pp));
    auto per_direction = [tp, dp, pp](protocol::RankRegistration& m) {
      const auto r = static_cast<std::int32_t>(m.rank);
      const std::int32_t stage = r / (tp * dp), stride = tp * dp;
      for (protocol::CommSummary& c : m.comms) {
        if (c.name == "pp") {
          c.calls = tp == 1 ? 1 : 0;  // with TP 1, the model-parallel group: the gradient norm
        }
      }
      // Forward and backward groups to each neighbour, one id per (pair, direction).
      for (std::int32_t next : {stage - 1, stage + 1}) {
        if (next < 0 || next >= pp) continue;
        const std::int32_t low = std::min(stage, next);
        const auto pair = static_cast<std::uint64_t>(low * stride + r % stride);
        for (std::uint64_t dir : {0ULL, 1ULL}) {
          m.comms.push_back({0x5000ULL + pair * 2 + dir, stage == low ? 0 : 1, 2, dir ? "pp-bwd" : "pp-fwd", 400});
        }
      }
    };
    Result<JobLayout> l = InferLayout(View(tp, dp, pp, 2, per_direction), "");
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_EQ(l.value().placement.shape.tp, tp);
    EXPECT_EQ(l.value().placement.shape.dp, dp);
    EXPECT_EQ(l.value().placement.shape.pp, pp);
  }
}

TEST(MitigationLayoutTest, PlacementInForceAndExcludedNodesAreHonoured) {
  JobView v = View(2, 4, 2);
  // An S4 plan moved node 2's ranks (4, 5) onto spare0 (node 8) in place.
  std::vector<std::int32_t> placement;
  for (int r = 0; r < 16; ++r) placement.push_back(r / 2 == 2 ? 8 : r / 2);
  std::vector<std::string> hosts = v.hosts();
  v.SetNodes(hosts, placement);
  EXPECT_EQ(v.NodeOf(5), 8);
  EXPECT_EQ(*v.HostOf(4), "spare0");
  // Commands still go to the agents that follow the processes; idle spares get none.
  EXPECT_EQ(*v.AgentOf(4), "node2");
  EXPECT_EQ(v.agent_hosts().size(), 8u);
  EXPECT_EQ(v.hosts().size(), 10u);
  Result<JobLayout> l = InferLayout(v, "", {2});
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l.value().placement.node_of_rank[5], 8);
  EXPECT_EQ(l.value().spares, (std::vector<std::int32_t>{9})) << "node 2 was excluded: never a spare again";
}

TEST(MitigationLayoutTest, AnOverrideWinsAndBadShapesAreRefused) {
  EXPECT_EQ(InferLayout(View(2, 4, 2), "4x2x2").value().placement.shape.tp, 4);
  EXPECT_FALSE(InferLayout(View(2, 4, 2), "3x2x2").ok()) << "12 ranks is not the job";
  for (const char* bad : {"", "2x4", "2x4x2x1", "0x8x2", "axbxc", "2x4x2 "}) {
    EXPECT_FALSE(ParseJobShape(bad).ok()) << bad;
  }
  EXPECT_FALSE(InferLayout(JobView(), "").ok()) << "no ranks";
}

TEST(MitigationTest, ComputeFaultPlansRebalanceThenConsolidationThenRestart) {
  const JobView v = View(2, 4, 2);
  // Two stragglers in different PP stages: rank 5 (stage 0, replica 2) and rank 11 (stage 1,
  // replica 1).
  const json findings = {{"gpus", {Gpu(5, 2.0), Gpu(11, 1.5)}}, {"links", json::array()}, {"nics", json::array()}};
  Result<Mitigator> m = Mitigator::Start(Settings(), "compute", findings, InferLayout(v, ""));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const json& c = m.value().candidates();
  // S2: the slow replicas 2 and 1 get fewer of the 32 micro-batches, the slower one fewest.
  ASSERT_TRUE(c["S2"].contains("plan")) << c.dump();
  const auto mb = c["S2"]["plan"]["micro_batches"].get<std::vector<int>>();
  ASSERT_EQ(mb.size(), 4u);
  EXPECT_EQ(std::accumulate(mb.begin(), mb.end(), 0), 32);
  EXPECT_LT(mb[2], mb[1]);
  EXPECT_LT(mb[1], mb[0]);
  EXPECT_EQ(mb[0], mb[3]);
  EXPECT_GT(c["S2"]["expected_gain"].get<double>(), 0.2);
  EXPECT_EQ(c["S2"]["baseline"], json({8, 8, 8, 8}));
  // S3 puts both stragglers' nodes into one stage; S4 restarts onto the spares (nodes 8 and 9)
  // in place of nodes 2 and 5.
  ASSERT_TRUE(c["S3"].contains("plan")) << c.dump();
  EXPECT_EQ(c["S3"]["kind"], "straggler consolidation");
  const auto placement = c["S3"]["plan"]["placement"].get<std::vector<int>>();
  ASSERT_EQ(placement.size(), 16u);
  EXPECT_EQ(placement[5] < 4, placement[11] < 4) << "the stragglers' nodes share a stage after S3";
  ASSERT_TRUE(c["S4"].contains("plan")) << c.dump();
  EXPECT_EQ(c["S4"]["plan"]["exclude_nodes"], json({2, 5}));
  EXPECT_EQ(c["S4"]["plan"]["placement"][5], 8);
  EXPECT_EQ(c["S4"]["plan"]["placement"][11], 9);

  // An endless 2x slowdown (healthy 1 s) fed every second: S2 after 10 s of slowdown, S3 once
  // the cost reaches 60 s, S4 at 300 s.
  Mitigator& mit = m.value();
  std::vector<std::string> seen;
  for (int t = 1; t <= 1000 && seen.size() < 3; ++t) {
    Result<std::optional<Decision>> d = mit.Observe(t, 2.0, 1.0, 1);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    if (d.value()) {
      EXPECT_TRUE(d.value()->publish_plan);
      EXPECT_EQ(d.value()->plan["strategy"], d.value()->strategy);
      seen.push_back(d.value()->strategy);
      if (seen.size() == 1) {
        EXPECT_EQ(t, 10);
      }
    }
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"S2", "S3", "S4"}));
  const Decision end = mit.End(2000).value();
  EXPECT_EQ(end.strategy, "S1");
  EXPECT_FALSE(end.publish_plan) << "a restart already reset the micro-batches";
  EXPECT_TRUE(mit.stopped());
}

TEST(MitigationTest, EndingWhileRebalancedPublishesTheUndo) {
  Mitigator m = Mitigator::Start(Settings(), "compute", {{"gpus", {Gpu(5, 2.0)}}}, InferLayout(View(2, 4, 2), "")).value();
  EXPECT_FALSE(m.FaultFreeRatio().has_value()) << "nothing in force yet";
  std::optional<Decision> first;
  for (int t = 1; t <= 20 && !first; ++t) first = m.Observe(t, 2.0, 1.0, 1).value();
  ASSERT_TRUE(first);
  ASSERT_EQ(first->strategy, "S2");
  EXPECT_TRUE(m.rebalance_in_effect());
  // Once the GPU recovers the fullest replica sets the pace: (its micro-batches + PP - 1) over
  // the even split's (8 + 1) micro-batch periods of 1F1B.
  const std::vector<int> counts = first->plan["micro_batches"].get<std::vector<int>>();
  const int fullest = *std::max_element(counts.begin(), counts.end());
  EXPECT_GT(fullest, 8);
  ASSERT_TRUE(m.FaultFreeRatio().has_value());
  EXPECT_DOUBLE_EQ(*m.FaultFreeRatio(), (fullest + 1.0) / 9.0);
  EXPECT_DOUBLE_EQ(*Mitigator::FromJson(Settings(), m.ToJson()).value().FaultFreeRatio(), (fullest + 1.0) / 9.0)
      << "a restarted controller keeps it";
  const Decision end = m.End(30).value();
  EXPECT_TRUE(end.publish_plan);
  EXPECT_EQ(end.plan["strategy"], "S1");
  EXPECT_EQ(end.plan["micro_batches"], json({8, 8, 8, 8}));
  EXPECT_FALSE(m.FaultFreeRatio().has_value()) << "undone: no plan's pace to watch";
}

// One GPU of a TP pair in one of two stages is 2.4x slow in GEMM, but its replica as a whole
// only about 1.43x (the job's iteration, which waits for that replica). S2 sized by the GEMM
// ratio starves the replica and overloads the others ([10, 9, 4, 9]); bounded by the measured
// pace it leaves no replica more than 9 of 8.
TEST(MitigationTest, ASlowReplicaIsNoSlowerThanTheJobThatWaitsForIt) {
  const Result<JobLayout> layout = InferLayout(View(2, 4, 2), "");
  const json findings = {{"gpus", {Gpu(5, 2.4)}}, {"links", json::array()}, {"nics", json::array()}};
  auto s2 = [&](const JobTiming& timing) {
    return Mitigator::Start(Settings(), "compute", findings, layout, {}, timing).value().candidates()["S2"];
  };
  auto fullest = [](const json& c) {
    const auto mb = c["plan"]["micro_batches"].get<std::vector<int>>();
    EXPECT_EQ(std::accumulate(mb.begin(), mb.end(), 0), 32) << c.dump();
    return *std::max_element(mb.begin(), mb.end());
  };
  const json gemm = s2({});
  ASSERT_TRUE(gemm.contains("plan")) << gemm.dump();
  EXPECT_DOUBLE_EQ(gemm["replica_times"][2].get<double>(), 2.4);
  EXPECT_FALSE(gemm.contains("measured_replica_time"));
  EXPECT_EQ(fullest(gemm), 10);

  // 1F1B over 8 micro-batches and PP 2 takes 9 periods; 1.43x of that, less the one fill
  // period at the healthy pace, over 8 micro-batches.
  const json bounded = s2({1.0, 1.43});
  ASSERT_TRUE(bounded.contains("plan")) << bounded.dump();
  const double pace = (1.43 * 9 - 1) / 8;
  EXPECT_NEAR(bounded["measured_replica_time"].get<double>(), pace, 1e-12);
  EXPECT_NEAR(bounded["replica_times"][2].get<double>(), pace, 1e-12);
  EXPECT_EQ(bounded["replica_times"][0], 1.0);
  EXPECT_EQ(fullest(bounded), 9);
  EXPECT_DOUBLE_EQ(bounded["fault_free_ratio"].get<double>(), 10.0 / 9.0);
  EXPECT_LT(bounded["fault_free_ratio"].get<double>(), gemm["fault_free_ratio"].get<double>());

  // A job slowed more than the GEMM ratio explains (something else slow too): the GEMM ratio
  // still bounds the replica. A job not slower than healthy bounds nothing, nor one timed under
  // an earlier plan's re-balanced counts (the culprits changed while an S2 held).
  EXPECT_DOUBLE_EQ(s2({1.0, 3.0})["replica_times"][2].get<double>(), 2.4);
  for (const JobTiming& t : {JobTiming{1.0, 0.9}, JobTiming{0.0, 1.43}, JobTiming{1.0, 1.0},
                             JobTiming{1.0, 1.43, 0.0, /*even_split=*/false}}) {
    const json c = s2(t);
    EXPECT_DOUBLE_EQ(c["replica_times"][2].get<double>(), 2.4) << c.dump();
    EXPECT_FALSE(c.contains("measured_replica_time")) << c.dump();
  }
}

TEST(MitigationTest, LinkFaultGetsLinkReliefAndNoRebalance) {
  // node1 -> node2 carries DP ring traffic (replica 1 sends to replica 2 in stage 0).
  const json findings = {{"gpus", json::array()},
                         {"links", {{{"ranks", {2, 4}}, {"hosts", {"node1", "node2"}}, {"evidence", {{"ratio", 4.0}}}}}},
                         {"nics", json::array()}};
  Mitigator m = Mitigator::Start(Settings(), "link", findings, InferLayout(View(2, 4, 2), "")).value();
  const json& c = m.candidates();
  EXPECT_FALSE(c.contains("S2"));
  ASSERT_TRUE(c["S3"].contains("plan")) << c.dump();
  EXPECT_EQ(c["S3"]["kind"], "link relief");
  EXPECT_GT(c["S3"]["expected_gain"].get<double>(), 0);
  ASSERT_TRUE(c["S4"].contains("plan"));
  std::optional<Decision> d;
  for (int t = 1; t <= 100 && !d; ++t) d = m.Observe(t, 2.0, 1.0, 1).value();
  ASSERT_TRUE(d);
  EXPECT_EQ(d->strategy, "S3");
}

TEST(MitigationTest, SlowGpuAndSlowLinkTogetherGetLinkReliefThatAlsoRebalances) {
  // Rank 11 (node 5) is slow and so is the stage-0 DP link node1 -> node2; one straggler alone
  // cannot be consolidated, so S3 relieves the link, and its plan carries S2's counts: once the
  // planner has gone past S2 it never comes back to it.
  const json findings = {{"gpus", {Gpu(11, 2.0)}},
                         {"links", {{{"ranks", {2, 4}}, {"hosts", {"node1", "node2"}}, {"evidence", {{"ratio", 4.0}}}}}}};
  Mitigator m = Mitigator::Start(Settings(), "compute", findings, InferLayout(View(2, 4, 2), "")).value();
  const json& c = m.candidates();
  ASSERT_TRUE(c["S2"].contains("plan")) << c.dump();
  ASSERT_TRUE(c["S3"].contains("plan")) << c.dump();
  EXPECT_EQ(c["S3"]["kind"], "link relief + re-balance");
  EXPECT_EQ(c["S3"]["plan"]["micro_batches"], c["S2"]["plan"]["micro_batches"]);
  EXPECT_EQ(c["S3"]["rebalance_expected_gain"], c["S2"]["expected_gain"]);
  EXPECT_EQ(c["S4"]["plan"]["exclude_nodes"], json({2, 5})) << "the GPU's node and the link's far end";
  std::vector<std::string> seen;
  for (int t = 1; t <= 200 && seen.size() < 2; ++t) {
    if (auto d = m.Observe(t, 2.0, 1.0, 1).value()) seen.push_back(d->strategy);
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"S2", "S3"}));
  EXPECT_TRUE(m.rebalance_in_effect()) << "S3 does not undo S2";

  // A cost that covers S3 at the first sample skips S2, and S3 alone re-balances: it counts as
  // a re-balance in effect (re-checked while it holds) and its stop restores the job's counts.
  Mitigator jump = Mitigator::Start(Settings(), "compute", findings, InferLayout(View(2, 4, 2), "")).value();
  const std::optional<Decision> d = jump.Observe(100, 2.0, 1.0, 100).value();
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->strategy, "S3");
  EXPECT_EQ(d->plan["micro_batches"], c["S2"]["plan"]["micro_batches"]) << d->plan.dump();
  EXPECT_FALSE(d->plan["placement"].empty());
  EXPECT_TRUE(jump.rebalance_in_effect());
  ASSERT_TRUE(jump.FaultFreeRatio().has_value()) << "S3's counts show the GPU's recovery like S2's";
  EXPECT_EQ(json(*jump.FaultFreeRatio()), c["S2"]["fault_free_ratio"]);
  const Decision stop = jump.End(101).value();
  EXPECT_EQ(stop.strategy, "S1");
  EXPECT_TRUE(stop.publish_plan);
  EXPECT_EQ(stop.plan["micro_batches"], json(std::vector<int>(4, 8))) << stop.plan.dump();
  EXPECT_NE(stop.summary.find("undo the micro-batch re-balancing"), std::string::npos) << stop.summary;

  // A slow link alone: plain link relief, no counts.
  const json link_only = {{"links", findings["links"]}};
  Mitigator link = Mitigator::Start(Settings(), "link", link_only, InferLayout(View(2, 4, 2), "")).value();
  EXPECT_EQ(link.candidates()["S3"]["kind"], "link relief");
  EXPECT_FALSE(link.candidates()["S3"]["plan"].contains("micro_batches"));
  std::optional<Decision> relief;
  for (int t = 1; t <= 200 && !relief; ++t) relief = link.Observe(t, 2.0, 1.0, 1).value();
  ASSERT_TRUE(relief);
  EXPECT_EQ(relief->strategy, "S3");
  EXPECT_FALSE(link.FaultFreeRatio().has_value()) << "a placement alone has no pace of its own to watch";
}

// node1 -> node5 joins pipeline stage 0 (ranks 0-7, nodes 0-3) and stage 1 (ranks 8-15, nodes
// 4-7): adapting the warm-up counts comes first (2 s), the link's delay sized from the healthy
// and slow iteration times, the counts within the activation limit; the stop goes back to 1F1B.
TEST(MitigationTest, SlowPipelineLinkAdaptsTheWarmupCountsFirst) {
  const json pp_link = {{"links", {{{"ranks", {2, 10}}, {"hosts", {"node1", "node5"}}, {"evidence", {{"ratio", 4.0}}}}}}};
  const JobTiming timing{1.0, 1.6};
  const Result<JobLayout> layout = InferLayout(View(2, 4, 2), "");

  // The default limit (the pipeline depth, 2) leaves 1F1B's counts as the only ones.
  Mitigator tight = Mitigator::Start(Settings(), "link", pp_link, layout, {}, timing).value();
  ASSERT_TRUE(tight.candidates()["pipeline"].contains("unavailable")) << tight.candidates().dump();
  EXPECT_NE(tight.candidates()["pipeline"]["unavailable"].get<std::string>().find("activation limit"), std::string::npos);

  MitigationSettings s = Settings();
  s.pipeline_activation_limit = 4;
  Mitigator m = Mitigator::Start(s, "link", pp_link, layout, {}, timing).value();
  const json& c = m.candidates()["pipeline"];
  ASSERT_TRUE(c.contains("plan")) << m.candidates().dump();
  EXPECT_EQ(c["plan"]["strategy"], "pipeline");
  const auto warmup = c["plan"]["warmup"].get<std::vector<int>>();
  ASSERT_EQ(warmup.size(), 2u);
  EXPECT_GT(warmup[0], 1) << "more slack than 1F1B's [1, 0] across the slow link";
  EXPECT_LE(warmup[0] + 1, 4) << "within the activation limit";
  EXPECT_GE(warmup[0], warmup[1]);
  EXPECT_EQ(c["links"], json({0}));
  EXPECT_GT(c["link_delay_s"].get<double>(), 0);
  EXPECT_NEAR(c["baseline_iteration_s"].get<double>(), 1.6, 0.01) << "the delay explains the slow iteration";
  EXPECT_GT(c["expected_gain"].get<double>(), 0.05);
  EXPECT_LT(c["iteration_s"].get<double>(), c["baseline_iteration_s"].get<double>());
  EXPECT_EQ(c["overhead_s"], 2.0);

  // 0.6 s of slowdown per sample: the 2 s overhead is covered at the fourth.
  std::optional<Decision> d;
  int at = 0;
  for (int t = 1; t <= 20 && !d; ++t) {
    d = m.Observe(t, 1.6, 1.0, 1).value();
    at = t;
  }
  ASSERT_TRUE(d);
  EXPECT_EQ(at, 4);
  EXPECT_EQ(d->strategy, "pipeline");
  EXPECT_TRUE(d->publish_plan);
  EXPECT_EQ(d->plan["warmup"], c["plan"]["warmup"]);
  EXPECT_TRUE(m.pipeline_in_effect());
  EXPECT_FALSE(m.rebalance_in_effect());
  EXPECT_EQ(m.FaultFreeRatio(), 1.0) << "adapted counts only add slack: healthy without the delay";

  EXPECT_EQ(c["link_delay_source"], "iteration time") << "no profile timed the link";
  EXPECT_EQ(c["link_delay_fitted_s"], c["link_delay_s"]);

  // A restarted controller carries on with the counts in force.
  Mitigator again = Mitigator::FromJson(s, m.ToJson()).value();
  EXPECT_TRUE(again.pipeline_in_effect());
  EXPECT_EQ(again.current(), "pipeline");
  const Decision stop = again.End(30).value();
  EXPECT_EQ(stop.strategy, "S1");
  EXPECT_TRUE(stop.publish_plan) << "frameworks go back to their own warm-up counts";
  EXPECT_FALSE(stop.plan.contains("micro_batches"));
  EXPECT_NE(stop.summary.find("warm-up"), std::string::npos) << stop.summary;

  // The same link with nothing to size it from, and a link inside one stage: no pipeline plan.
  Mitigator untimed = Mitigator::Start(s, "link", pp_link, layout).value();
  EXPECT_TRUE(untimed.candidates()["pipeline"].contains("unavailable"));
  const json dp_link = {{"links", {{{"ranks", {2, 4}}, {"hosts", {"node1", "node2"}}, {"evidence", {{"ratio", 4.0}}}}}}};
  Mitigator inside = Mitigator::Start(s, "link", dp_link, layout, {}, timing).value();
  EXPECT_EQ(inside.candidates()["pipeline"]["unavailable"], "no slow link joins two pipeline stages");
  std::optional<Decision> first;
  for (int t = 1; t <= 100 && !first; ++t) first = inside.Observe(t, 1.6, 1.0, 1).value();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->strategy, "S3");
}

// The delay the pipeline candidate sizes is the one that made the job slow: a job simulated with
// a known delay on the node1 <-> node5 pipeline link, its healthy and slow iteration times handed
// over, the delay comes back within 1 %.
TEST(MitigationTest, PipelineLinkDelayIsSizedFromTheIterationTimes) {
  const json pp_link = {{"links", {{{"ranks", {2, 10}}, {"hosts", {"node1", "node5"}}}}}};
  MitigationSettings s = Settings();
  s.pipeline_activation_limit = 6;
  const double healthy = 0.9;  // N + S - 1 = 9 periods of 0.1 s
  const double period = healthy / 9;
  for (const double c : {0.25, 0.5, 1.0, 2.0, 4.0}) {
    SCOPED_TRACE("delay " + std::to_string(c) + " periods");
    analyzer::PipelineModel truth;
    truth.stages.assign(2, {period / 3, 2 * period / 3, 0});
    truth.link_delay_s = {c * period};
    const double slow = analyzer::WarmupIterationTime(truth, analyzer::StandardWarmup(2, 8).value(), 8).value();
    ASSERT_GT(slow, healthy);
    Mitigator m = Mitigator::Start(s, "link", pp_link, InferLayout(View(2, 4, 2), ""), {}, {healthy, slow}).value();
    const json& cand = m.candidates()["pipeline"];
    ASSERT_TRUE(cand.contains("link_delay_s")) << cand.dump();
    EXPECT_NEAR(cand["link_delay_s"].get<double>(), c * period, 0.01 * c * period);
    EXPECT_NEAR(cand["stage_period_s"].get<double>(), period, 1e-12);
  }
}

TEST(MitigationTest, AReplacedSlowLinkThatNoLongerShowsIsNoChangeOfCulprits) {
  const json link = {{"ranks", {12, 14}}, {"hosts", {"node7", "node6"}}, {"evidence", {{"ratio", 4.0}}}};
  const json gpu_and_link = {{"gpus", {Gpu(11, 2.0)}}, {"links", {link}}};
  const json gpu = {{"gpus", {Gpu(11, 2.0)}}};
  const json other_gpu = {{"gpus", {Gpu(3, 2.0)}}};
  const json link_only = {{"links", {link}}};
  EXPECT_EQ(Culprits(gpu_and_link), (std::set<std::string>{"gpu 11", R"(link ["node6","node7"])"}));
  struct Case {
    const char* name;
    json before, after;
    const char* strategy;
    bool changed;
  } cases[] = {
      {"the same", gpu_and_link, gpu_and_link, "S3", false},
      {"the link hidden by S3", gpu_and_link, gpu, "S3", false},
      {"the link hidden by S4", gpu_and_link, gpu, "S4", false},
      {"the link gone under S2: it recovered", gpu_and_link, gpu, "S2", true},
      {"the GPU recovered", gpu_and_link, link_only, "S3", true},
      {"someone new", gpu, gpu_and_link, "S3", true},
      {"another GPU", gpu, other_gpu, "S2", true},
      {"a link hidden, another GPU", gpu_and_link, other_gpu, "S3", true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(CulpritsChanged(c.before, c.after, c.strategy), c.changed);
  }
}

TEST(MitigationTest, UnplannableCandidatesAreUnavailableWithAReason) {
  MitigationSettings s = Settings();
  s.micro_batches = 0;
  const json nic = {{"nics", {{{"host", "node4"}}}}};
  Mitigator m = Mitigator::Start(s, "nic", nic, InferLayout(View(2, 4, 2, /*spares=*/0), "")).value();
  EXPECT_TRUE(m.candidates()["S3"].contains("unavailable"));
  // No spare: the restart shrinks DP to 3 replicas, which the remaining 14 GPUs hold.
  EXPECT_EQ(m.candidates()["S4"]["kind"], "shrink data parallel") << m.candidates().dump();
  Mitigator g = Mitigator::Start(s, "compute", {{"gpus", {Gpu(5, 2.0)}}}, InferLayout(View(2, 4, 2), "")).value();
  EXPECT_NE(g.candidates()["S2"]["unavailable"].get<std::string>().find("micro-batches"), std::string::npos);
  // Without a layout only the reasons remain, and the planner never switches.
  Mitigator blind = Mitigator::Start(Settings(), "compute", {{"gpus", {Gpu(5, 2.0)}}},
                                     Status::InvalidArgument("no ranks")).value();
  for (const char* k : {"S2", "S3", "S4"}) EXPECT_TRUE(blind.candidates()[k].contains("unavailable")) << k;
  for (int t = 1; t <= 5000; ++t) ASSERT_FALSE(blind.Observe(t, 3.0, 1.0, 1).value().has_value());
  EXPECT_FALSE(Mitigator::Start(Settings(), "unknown", json::object(), InferLayout(View(2, 4, 2), "")).ok());
  EXPECT_FALSE(Mitigator::Start(Settings(), "compute", {{"gpus", json::array()}}, InferLayout(View(2, 4, 2), "")).ok());
}

TEST(MitigationTest, StateSurvivesARestartAndGarbageIsRefused) {
  Mitigator m = Mitigator::Start(Settings(), "compute", {{"gpus", {Gpu(5, 2.0), Gpu(11, 2.0)}}}, InferLayout(View(2, 4, 2), "")).value();
  for (int t = 1; t <= 30; ++t) (void)m.Observe(t, 2.0, 1.0, 1).value();
  ASSERT_EQ(m.current(), "S2");
  const json doc = json::parse(m.ToJson().dump());
  Result<Mitigator> back = Mitigator::FromJson(Settings(), doc);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back.value().ToJson(), m.ToJson());
  // Both go on to S3 at the same sample.
  int a = 0, b = 0;
  for (int t = 31; t <= 200 && (a == 0 || b == 0); ++t) {
    if (!a && m.Observe(t, 2.0, 1.0, 1).value()) a = t;
    if (!b && back.value().Observe(t, 2.0, 1.0, 1).value()) b = t;
  }
  EXPECT_GT(a, 0);
  EXPECT_EQ(a, b);
  for (const json& bad : {json(), json::object(), json{{"cause", "compute"}}, json{{"cause", "x"}}}) {
    EXPECT_FALSE(Mitigator::FromJson(Settings(), bad).ok()) << bad.dump();
  }
  json twice = doc;
  twice["applied"] = {"S2", "S2"};
  EXPECT_FALSE(Mitigator::FromJson(Settings(), twice).ok());
}

// The first switch an endless 2x slowdown (healthy 1 s, a sample a second from t0 + 1) leads to,
// and when; {"", 0} when none within `until`.
std::pair<std::string, int> FirstSwitch(Mitigator& m, int t0, int until) {
  for (int t = t0 + 1; t <= until; ++t) {
    Result<std::optional<Decision>> d = m.Observe(t, 2.0, 1.0, 1);
    if (d.ok() && d.value()) return {d.value()->strategy, t};
  }
  return {"", 0};
}

TEST(MitigationTest, OverheadsTheJobMeasuredReplaceTheConfiguredOnes) {
  // Ranks 3 and 7 report what S3 cost them, rank 0 what a restart would cost: the slowest
  // rank's figure is the job's (everyone waits for it); S2 was never reported.
  const JobView v = View(2, 4, 2, 2, [](protocol::RankRegistration& m) {
    if (m.rank == 3) m.cost_s3 = 1.5;
    if (m.rank == 7) m.cost_s3 = 2.5;
    if (m.rank == 0) m.cost_s4 = 100;
    if (m.rank == 2) m.cost_s5 = 0.25;
  });
  const MeasuredOverheads measured = MeasuredFrom(v);
  EXPECT_FALSE(measured.rebalance_s);
  ASSERT_TRUE(measured.topology_s && measured.restart_s);
  EXPECT_DOUBLE_EQ(*measured.topology_s, 2.5);
  EXPECT_DOUBLE_EQ(*measured.restart_s, 100);
  ASSERT_TRUE(measured.pipeline_s);
  EXPECT_DOUBLE_EQ(*measured.pipeline_s, 0.25);
  EXPECT_TRUE(MeasuredFrom(View(2, 4, 2)).empty());

  const json findings = {{"gpus", {Gpu(5, 2.0), Gpu(11, 1.5)}}};
  Mitigator m = Mitigator::Start(Settings(), "compute", findings, InferLayout(v, ""), measured).value();
  const json& c = m.candidates();
  EXPECT_EQ(c["S2"]["overhead_s"], 10);
  EXPECT_EQ(c["S2"]["overhead_source"], "configured");
  EXPECT_EQ(c["S3"]["overhead_s"], 2.5);
  EXPECT_EQ(c["S3"]["overhead_source"], "measured");
  EXPECT_EQ(c["S4"]["overhead_s"], 100);
  // Measured this cheap, S3 comes first: after 2.5 s of slowdown, at the third sample.
  EXPECT_EQ(FirstSwitch(m, 0, 100), (std::pair<std::string, int>{"S3", 3}));

  MeasuredOverheads bad;
  bad.topology_s = -1;
  EXPECT_FALSE(Mitigator::Start(Settings(), "compute", findings, InferLayout(v, ""), bad).ok());
}

TEST(MitigationTest, AMeasurementDuringAMitigationMovesTheNextSwitchAndSurvivesARestart) {
  const json findings = {{"gpus", {Gpu(5, 2.0), Gpu(11, 2.0)}}};
  Mitigator configured = Mitigator::Start(Settings(), "compute", findings, InferLayout(View(2, 4, 2), "")).value();
  Mitigator m = Mitigator::Start(Settings(), "compute", findings, InferLayout(View(2, 4, 2), "")).value();
  ASSERT_EQ(FirstSwitch(m, 0, 100), (std::pair<std::string, int>{"S2", 10}));
  ASSERT_EQ(FirstSwitch(configured, 0, 100), (std::pair<std::string, int>{"S2", 10}));
  // The framework applied S2 and has since reported what an S3 move costs it: 15 s, not 60.
  MeasuredOverheads measured;
  measured.topology_s = 15;
  Result<std::vector<std::string>> changes = m.UseMeasured(measured);
  ASSERT_TRUE(changes.ok()) << changes.status().ToString();
  EXPECT_EQ(changes.value(), (std::vector<std::string>{"S3 60.00 s -> 15.00 s (measured)"}));
  EXPECT_EQ(m.candidates()["S3"]["overhead_source"], "measured");
  EXPECT_TRUE(m.UseMeasured(measured).value().empty()) << "the same figure again changes nothing";
  measured.topology_s = 15.05;
  EXPECT_TRUE(m.UseMeasured(measured).value().empty()) << "within 1 %: no churn";
  measured.topology_s = -3;
  EXPECT_FALSE(m.UseMeasured(measured).ok());
  EXPECT_EQ(m.candidates()["S3"]["overhead_s"], 15);

  // A restarted controller goes on with the measured figure, not the configured one.
  Mitigator back = Mitigator::FromJson(Settings(), json::parse(m.ToJson().dump())).value();
  const auto next = FirstSwitch(m, 10, 200), next_back = FirstSwitch(back, 10, 200);
  const auto next_configured = FirstSwitch(configured, 10, 200);
  EXPECT_EQ(next.first, "S3");
  EXPECT_EQ(next, next_back);
  // Cost since onset (slowdown + S2's 10 s paid) covers 15 s at once, 60 s only at t = 50.
  EXPECT_EQ(next.second, 11);
  EXPECT_EQ(next_configured, (std::pair<std::string, int>{"S3", 50}));
}

// The round's profile timed the stage pair across the slow link (node1 - node5: ranks 2 and 10,
// communicator 0x3002) at 31 ms a transfer against its class's 2.6 ms: that 28.4 ms is the
// delay the pipeline candidate plans with. Communicators elsewhere, or not suspicious, do not
// count; without a profile the delay is fitted to the slow iteration time.
TEST(MitigationTest, ThePipelineLinksDelayComesFromTheProfileWhenItTimedIt) {
  json findings = {{"links", {{{"ranks", {2, 10}}, {"hosts", {"node1", "node5"}}, {"evidence", {{"ratio", 12.0}}}}}}};
  findings["suspicion"]["comms"] = {
      {{"comm", protocol::CommIdHex(0x3002)}, {"verdict", "suspicious"}, {"metric_s", 0.031}, {"baseline_s", 0.0026}},
      {{"comm", protocol::CommIdHex(0x3003)}, {"verdict", "healthy"}, {"metric_s", 0.0027}, {"baseline_s", 0.0026}},
      {{"comm", protocol::CommIdHex(0x1002)}, {"verdict", "suspicious"}, {"metric_s", 1.0}, {"baseline_s", 0.1}}};
  const JobView view = View(2, 4, 2);
  EXPECT_NEAR(ProfiledLinkDelay(findings, view), 0.0284, 1e-12);
  EXPECT_EQ(ProfiledLinkDelay({{"links", findings["links"]}}, view), 0.0) << "no profile";
  json garbled = findings;  // a state document someone edited: skipped, never thrown on
  garbled["suspicion"]["comms"][0]["metric_s"] = "31 ms";
  garbled["suspicion"]["comms"][1]["verdict"] = 7;
  EXPECT_EQ(ProfiledLinkDelay(garbled, view), 0.0);
  json elsewhere = findings;
  elsewhere["links"][0]["hosts"] = {"node0", "node4"};
  EXPECT_EQ(ProfiledLinkDelay(elsewhere, view), 0.0) << "the timed pair is not across this link";

  MitigationSettings s = Settings();
  s.pipeline_activation_limit = 4;
  const JobTiming timing{1.0, 1.6, ProfiledLinkDelay(findings, view)};
  Mitigator m = Mitigator::Start(s, "link", findings, InferLayout(view, ""), {}, timing).value();
  const json& c = m.candidates()["pipeline"];
  EXPECT_EQ(c["link_delay_source"], "profile") << c.dump();
  EXPECT_NEAR(c["link_delay_s"].get<double>(), 0.0284, 1e-12);
  EXPECT_GT(c["link_delay_fitted_s"].get<double>(), c["link_delay_s"].get<double>())
      << "the fit to 1.6 s needs a longer delay than 28 ms in a 1 s iteration of this model";

  // Timed under an earlier S2's counts (the culprits changed from a GPU to this link): the
  // profile's delay still sizes the plan, the fit is not reported, and without a profile there
  // is nothing to size it from.
  JobTiming uneven = timing;
  uneven.even_split = false;
  Mitigator under = Mitigator::Start(s, "link", findings, InferLayout(view, ""), {}, uneven).value();
  const json& u = under.candidates()["pipeline"];
  EXPECT_EQ(u["link_delay_source"], "profile") << u.dump();
  EXPECT_NEAR(u["link_delay_s"].get<double>(), 0.0284, 1e-12);
  EXPECT_TRUE(u["link_delay_fitted_s"].is_null()) << u.dump();
  EXPECT_EQ(u.value("plan", json()), c.value("plan", json())) << "the same delay, the same plan";
  uneven.profiled_link_delay_s = 0;
  Mitigator unsized = Mitigator::Start(s, "link", findings, InferLayout(view, ""), {}, uneven).value();
  const json& n = unsized.candidates()["pipeline"];
  EXPECT_NE(n.value("unavailable", std::string()).find("re-balanced micro-batch counts"), std::string::npos)
      << n.dump();
  JobTiming even_unprofiled = uneven;
  even_unprofiled.even_split = true;
  Mitigator fitted = Mitigator::Start(s, "link", findings, InferLayout(view, ""), {}, even_unprofiled).value();
  EXPECT_EQ(fitted.candidates()["pipeline"]["link_delay_source"], "iteration time")
      << fitted.candidates()["pipeline"].dump();
}

// ---- The recovery watch (daemon/controller/recovery_watch.h) ---------------------------------

namespace watch {

// Rank `rank`'s comm_profile window on its TP group (Megatron numbering above): its busiest
// collective and a rarer one, taken in `mode` from since_ns.
json TpWindow(std::int64_t rank, std::int64_t since_ns, double median_us, const std::string& mode = "profile",
              std::uint64_t calls = 64) {
  const std::uint64_t tp_comm = 0x1000ULL + static_cast<std::uint64_t>((rank / 2) % 4 + (rank / 8) * 4);
  return {{"v", 2}, {"type", "comm_profile"}, {"job", "job"}, {"host", Host(rank)}, {"at_ns", since_ns + 2'000'000'000},
          {"rank", rank}, {"pid", 1000 + rank}, {"since_ns", since_ns}, {"mode", mode},
          {"comms", {{{"id", protocol::CommIdHex(tp_comm)}, {"rank", rank % 2}, {"nranks", 2},
                      {"sigs", {{{"op", "AllReduce"}, {"bytes", 65536}, {"peer", -1}, {"count", calls},
                                 {"median_us", median_us}, {"mean_us", median_us}},
                                {{"op", "AllGather"}, {"bytes", 512}, {"peer", -1}, {"count", 2},
                                 {"median_us", 9000.0}, {"mean_us", 9000.0}}}}}}}};
}

// Observes the first window after arming (taken from `since`) of each culprit's TP pair
// {culprit - 1, culprit}, the peer waiting 40x: it spans what armed the watch, and is never read
// as the level.
void FirstWindows(RecoveryWatch& w, const std::vector<std::int64_t>& culprits, std::int64_t since) {
  std::map<std::int64_t, json> p;
  for (const std::int64_t c : culprits) {
    p[c - 1] = TpWindow(c - 1, since, 2000);
    p[c] = TpWindow(c, since, 50);
  }
  EXPECT_TRUE(w.Observe(p).readings.empty()) << "the first window after arming is no level";
}

// Rank `rank`'s window on a pipeline communicator where it is comm rank `own` and exchanges
// with comm rank `peer` only: its receives from the peer take recv_us, its sends send_us.
json PpWindow(std::int64_t rank, std::uint64_t comm, std::int64_t own, std::int64_t peer, std::int64_t since_ns,
              double recv_us, double send_us = 40, std::uint64_t calls = 16) {
  return {{"v", 2}, {"type", "comm_profile"}, {"job", "job"}, {"host", Host(rank)}, {"at_ns", since_ns + 2'000'000'000},
          {"rank", rank}, {"pid", 1000 + rank}, {"since_ns", since_ns}, {"mode", "profile"},
          {"comms", {{{"id", protocol::CommIdHex(comm)}, {"rank", own}, {"nranks", 2},
                      {"sigs", {{{"op", "Recv"}, {"bytes", 32768}, {"peer", peer}, {"count", calls},
                                 {"median_us", recv_us}, {"mean_us", recv_us}},
                                {{"op", "Send"}, {"bytes", 32768}, {"peer", peer}, {"count", calls},
                                 {"median_us", send_us}, {"mean_us", send_us}}}}}}}};
}

}  // namespace watch

// A slow GPU's busiest small group is its TP pair: the watch profiles just those two ranks.
TEST(RecoveryWatchTest, WatchesTheCulpritsBusiestSmallGroup) {
  const JobView view = View(2, 4, 2);
  const std::vector<WatchTarget> t = WatchTargets(view, {5, 11, 99});  // 99: no such rank
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].culprit, 5);
  EXPECT_EQ(t[0].comm, 0x1002ULL) << "rank 5 = stage 0, replica 2, TP rank 1";
  EXPECT_EQ(t[0].members, (std::vector<std::int64_t>{4, 5}));
  EXPECT_EQ(t[1].members, (std::vector<std::int64_t>{10, 11}));
  EXPECT_TRUE(WatchTargets(view, {5}, 1).empty()) << "no group small enough";
  // TP 1: the pipeline pair is the busiest small group (it carries sends and receives only: the
  // watch reads the wait from its receives, below).
  const std::vector<WatchTarget> pp = WatchTargets(View(1, 4, 2), {5}, 3);
  ASSERT_EQ(pp.size(), 1u);
  EXPECT_EQ(pp[0].members, (std::vector<std::int64_t>{1, 5})) << "rank 5 = stage 1 of replica 1";

  RecoveryWatch w(RecoveryWatchOptions{"t", 5, 2});
  const std::vector<OutgoingCommand> on = w.Arm(view, {5}, kT0);
  ASSERT_EQ(on.size(), 1u);
  EXPECT_EQ(on[0].host, "node2");
  EXPECT_EQ(on[0].command.type, "set_mode");
  EXPECT_EQ(on[0].command.mode, "profile");
  EXPECT_EQ(on[0].command.ranks, (std::vector<std::int64_t>{4, 5}));
  EXPECT_TRUE(w.armed());
  const std::vector<OutgoingCommand> off = w.Disarm(view, kT0 + 1);
  ASSERT_EQ(off.size(), 1u);
  EXPECT_EQ(off[0].command.mode, "track");
  EXPECT_EQ(off[0].command.ranks, on[0].command.ranks);
  EXPECT_NE(off[0].command.id, on[0].command.id);
  EXPECT_FALSE(w.armed());
  // Until the caller says the switch back went out, the ranks are owed it: sent again.
  const std::vector<OutgoingCommand> again = w.Disarm(view, kT0 + 2);
  ASSERT_EQ(again.size(), 1u) << "a lost switch back would leave the pair profiling";
  EXPECT_EQ(again[0].command.mode, "track");
  EXPECT_EQ(again[0].command.ranks, on[0].command.ranks);
  EXPECT_NE(again[0].command.id, off[0].command.id);
  w.Delivered();
  EXPECT_TRUE(w.Disarm(view, kT0 + 3).empty()) << "nothing to switch back twice";
  EXPECT_TRUE(w.Arm(view, {99}, kT0).empty());
  EXPECT_FALSE(w.armed()) << "no target: nothing watched";
  EXPECT_TRUE(w.Arm(view, {5, 99}, kT0).empty());
  EXPECT_FALSE(w.armed()) << "a culprit without a group: its recovery could not be seen, so none is watched";
}

// Under re-balanced micro-batches a group spanning the DP replicas loses its wait (the replicas
// are evened out): where the job's shape is known, only groups inside the culprit's replica are
// watched, however busy the data-parallel group is.
TEST(RecoveryWatchTest, WatchesAGroupInsideTheCulpritsReplicaWhereTheShapeIsKnown) {
  const JobView busy_dp = View(1, 4, 4, 2, [](protocol::RankRegistration& m) {
    for (protocol::CommSummary& c : m.comms) {
      if (c.name == "dp") c.calls = 5000;
    }
  });
  const std::vector<WatchTarget> any = WatchTargets(busy_dp, {5});
  ASSERT_EQ(any.size(), 1u);
  EXPECT_EQ(any[0].members, (std::vector<std::int64_t>{4, 5, 6, 7})) << "the busiest: data parallel";
  const std::vector<WatchTarget> inside = WatchTargets(busy_dp, {5}, 64, analyzer::JobShape{1, 4, 4});
  ASSERT_EQ(inside.size(), 1u);
  EXPECT_EQ(inside[0].members, (std::vector<std::int64_t>{1, 5, 9, 13})) << "the pipeline group of replica 1";
  // A shape that does not fit the job is ignored, as is one without data parallelism.
  EXPECT_EQ(WatchTargets(busy_dp, {5}, 64, analyzer::JobShape{1, 2, 2})[0].members, any[0].members);
  EXPECT_EQ(WatchTargets(View(2, 4, 2), {5}, 64, analyzer::JobShape{2, 4, 2})[0].members,
            (std::vector<std::int64_t>{4, 5})) << "the TP pair is inside the replica";
}

// Ranks owed a switch back to track stay owed across a new arming (unless profiled again by it)
// and are forgotten only when a round switches every shim's mode.
TEST(RecoveryWatchTest, ASwitchBackNotDeliveredIsOwedUntilItIs) {
  const JobView view = View(2, 4, 2);
  RecoveryWatch w(RecoveryWatchOptions{"t", 5, 2});
  ASSERT_EQ(w.Arm(view, {5}, kT0).size(), 1u);
  ASSERT_EQ(w.Disarm(view, kT0 + 1).size(), 1u);  // {4, 5}: not delivered
  // Armed on rank 11 ({10, 11}, another host) before the switch back went out: 4 and 5 stay owed.
  const std::vector<OutgoingCommand> on = w.Arm(view, {11}, kT0 + 2);
  ASSERT_EQ(on.size(), 1u);
  EXPECT_EQ(on[0].command.ranks, (std::vector<std::int64_t>{10, 11}));
  std::set<std::int64_t> back;
  for (const OutgoingCommand& c : w.Disarm(view, kT0 + 3)) {
    EXPECT_EQ(c.command.mode, "track");
    back.insert(c.command.ranks->begin(), c.command.ranks->end());
  }
  EXPECT_EQ(back, (std::set<std::int64_t>{4, 5, 10, 11}));
  // Armed again on rank 5 with {4, 5} owed: profiled again, they are no longer owed.
  ASSERT_EQ(w.Arm(view, {5}, kT0 + 4).size(), 1u);
  back.clear();
  for (const OutgoingCommand& c : w.Disarm(view, kT0 + 5)) back.insert(c.command.ranks->begin(), c.command.ranks->end());
  EXPECT_EQ(back, (std::set<std::int64_t>{4, 5, 10, 11})) << "10 and 11 still owed, 4 and 5 watched";
  w.Forget();
  EXPECT_TRUE(w.Disarm(view, kT0 + 6).empty()) << "a round switches every shim: nothing owed";
}

// The peer waits 16x the culprit's time per call while the GPU is slow; once the two arrive
// together the imbalance falls below the geometric midpoint (4) and the watch says so. Windows
// from before the watch, in track mode, or missing a member say nothing.
TEST(RecoveryWatchTest, TellsTheRecoveryFromThePeersWaitsOnly) {
  const JobView view = View(2, 4, 2);
  RecoveryWatch w(RecoveryWatchOptions{"t", 5, 2});
  (void)w.Arm(view, {5}, kT0);
  std::map<std::int64_t, json> p;
  EXPECT_FALSE(w.Observe(p).recovered);
  watch::FirstWindows(w, {5}, kT0);
  p[4] = watch::TpWindow(4, kT0 - 1, 800);  // began before the watch
  p[5] = watch::TpWindow(5, kT0 + 10, 50);
  EXPECT_TRUE(w.Observe(p).readings.empty());
  p[4] = watch::TpWindow(4, kT0 + 10, 800, "track");
  EXPECT_TRUE(w.Observe(p).readings.empty());
  p[4] = watch::TpWindow(4, kT0 + 10, 800);
  RecoveryWatch::Verdict v = w.Observe(p);
  ASSERT_EQ(v.readings.size(), 1u);
  EXPECT_DOUBLE_EQ(v.readings[0].level, 16.0);
  EXPECT_FALSE(v.recovered) << "the level's own window is no recovery";
  // Still slow in the next windows: 14x, then 5x (noisy, but above the midpoint).
  for (const double peer : {700.0, 250.0}) {
    p[4] = watch::TpWindow(4, kT0 + 2'000'000'000, peer);
    p[5] = watch::TpWindow(5, kT0 + 2'000'000'000, 50);
    EXPECT_FALSE(w.Observe(p).recovered) << peer;
  }
  // Too few calls of the busiest signature in the culprit's window: not read.
  p[4] = watch::TpWindow(4, kT0 + 4'000'000'000, 60);
  p[5] = watch::TpWindow(5, kT0 + 4'000'000'000, 55, "profile", 4);
  EXPECT_FALSE(w.Observe(p).recovered);
  p[5] = watch::TpWindow(5, kT0 + 4'000'000'000, 55);
  v = w.Observe(p);
  EXPECT_TRUE(v.recovered);
  EXPECT_NEAR(v.readings[0].imbalance, 60.0 / 55.0, 1e-9);
  // A round forgets the watch: nothing is read until it is armed again.
  w.Forget();
  EXPECT_FALSE(w.Observe(p).recovered);
}

// At TP 1 the culprit's group is its pipeline pair, which only exchanges: its neighbour's
// receives from it wait while it is slow, its own receives find the data there. Their ratio is
// the level, and it falls back towards 1 once the GPU recovers. Sends say nothing (a send may
// complete into the peer's buffer before the peer arrives); too few receives are not read.
TEST(RecoveryWatchTest, TellsTheRecoveryAtTp1FromThePipelinesReceives) {
  const JobView view = View(1, 4, 2);
  const std::vector<WatchTarget> t = WatchTargets(view, {5}, 64, analyzer::JobShape{1, 4, 2});
  ASSERT_EQ(t.size(), 1u);
  ASSERT_EQ(t[0].members, (std::vector<std::int64_t>{1, 5})) << "rank 5 is comm rank 1 of its pipeline pair";
  const std::uint64_t comm = t[0].comm;
  RecoveryWatch w(RecoveryWatchOptions{"t", 5, 2});
  ASSERT_FALSE(w.Arm(view, {5}, kT0, "inc", analyzer::JobShape{1, 4, 2}).empty());
  std::map<std::int64_t, json> p;
  p[1] = watch::PpWindow(1, comm, 0, 1, kT0, 3000);  // spans the plan's switch: no level
  p[5] = watch::PpWindow(5, comm, 1, 0, kT0, 60);
  EXPECT_TRUE(w.Observe(p).readings.empty());
  p[1] = watch::PpWindow(1, comm, 0, 1, kT0 + 10, 900, 3000);
  p[5] = watch::PpWindow(5, comm, 1, 0, kT0 + 10, 60, 3000, 4);  // 4 receives: too few
  EXPECT_TRUE(w.Observe(p).readings.empty());
  p[5] = watch::PpWindow(5, comm, 1, 0, kT0 + 10, 60, 3000);
  RecoveryWatch::Verdict v = w.Observe(p);
  ASSERT_EQ(v.readings.size(), 1u);
  EXPECT_DOUBLE_EQ(v.readings[0].level, 15.0) << "900 us waiting for rank 5 against its 60 us";
  EXPECT_FALSE(v.recovered);
  EXPECT_NE(v.seen_ns, 0) << "a visible level is the fault seen";
  // Still slow, then recovered: the neighbour's receives are as short as rank 5's.
  p[1] = watch::PpWindow(1, comm, 0, 1, kT0 + 2'000'000'000, 500);
  p[5] = watch::PpWindow(5, comm, 1, 0, kT0 + 2'000'000'000, 55);
  EXPECT_FALSE(w.Observe(p).recovered);
  // 3x is below the midpoint (3.9x) but not a pair that waits alike: receives wait in bursts.
  p[1] = watch::PpWindow(1, comm, 0, 1, kT0 + 3'000'000'000, 180);
  p[5] = watch::PpWindow(5, comm, 1, 0, kT0 + 3'000'000'000, 60);
  EXPECT_FALSE(w.Observe(p).recovered) << "3x read from receives";
  // Nor is a window where rank 5 waits for its neighbour (0.1x).
  p[1] = watch::PpWindow(1, comm, 0, 1, kT0 + 3'500'000'000, 6);
  p[5] = watch::PpWindow(5, comm, 1, 0, kT0 + 3'500'000'000, 60);
  EXPECT_FALSE(w.Observe(p).recovered) << "0.1x read from receives";
  p[1] = watch::PpWindow(1, comm, 0, 1, kT0 + 4'000'000'000, 70);
  p[5] = watch::PpWindow(5, comm, 1, 0, kT0 + 4'000'000'000, 60);
  v = w.Observe(p);
  EXPECT_TRUE(v.recovered);
  EXPECT_NEAR(v.readings[0].imbalance, 70.0 / 60.0, 1e-9);
  // Receives from someone else than the culprit are not a wait for it.
  RecoveryWatch other(RecoveryWatchOptions{"t", 5, 2});
  (void)other.Arm(view, {5}, kT0, "inc", analyzer::JobShape{1, 4, 2});
  p[1] = watch::PpWindow(1, comm, 0, 7, kT0, 900);
  p[5] = watch::PpWindow(5, comm, 1, 0, kT0, 60);
  EXPECT_TRUE(other.Observe(p).readings.empty());
  p[1] = watch::PpWindow(1, comm, 0, 7, kT0 + 10, 900);
  p[5] = watch::PpWindow(5, comm, 1, 0, kT0 + 10, 60);
  EXPECT_TRUE(other.Observe(p).readings.empty());
}

// A round re-checks the culprits in the middle of a plan and the watch is armed again after it.
// The fault may end during that round. Then the first window after it is healthy, and read as
// the level it would never show a recovery. So a level read earlier in the same episode (the
// incident) on the same group is kept. Another episode, or another group, reads it afresh.
TEST(RecoveryWatchTest, ALevelOutlivesARoundOfTheSameEpisodeOnly) {
  const JobView view = View(2, 4, 2);
  RecoveryWatch w(RecoveryWatchOptions{"t", 5, 2});
  (void)w.Arm(view, {5}, kT0, "inc-1");
  watch::FirstWindows(w, {5}, kT0);
  std::map<std::int64_t, json> p = {{4, watch::TpWindow(4, kT0 + 1, 800)}, {5, watch::TpWindow(5, kT0 + 1, 50)}};
  ASSERT_FALSE(w.Observe(p).recovered);
  ASSERT_EQ(w.LevelOf(5), 16.0);
  // The round: every shim switched, the watch forgotten; the fault ends meanwhile.
  w.Forget();
  const std::int64_t after = kT0 + 10'000'000'000;
  (void)w.Arm(view, {5}, after, "inc-1");
  EXPECT_EQ(w.LevelOf(5), 16.0) << "kept through the round";
  p = {{4, watch::TpWindow(4, after + 1, 52)}, {5, watch::TpWindow(5, after + 1, 50)}};
  RecoveryWatch::Verdict v = w.Observe(p);
  EXPECT_TRUE(v.recovered) << "the first window after the round is the recovery, not the level";
  ASSERT_EQ(v.readings.size(), 1u);
  EXPECT_DOUBLE_EQ(v.readings[0].level, 16.0);
  // Still slow after the round: no recovery.
  (void)w.Arm(view, {5}, after, "inc-1");
  p = {{4, watch::TpWindow(4, after + 1, 700)}, {5, watch::TpWindow(5, after + 1, 50)}};
  EXPECT_FALSE(w.Observe(p).recovered);
  // Another incident: the level is read afresh (here from a healthy window: nothing visible).
  (void)w.Arm(view, {5}, after, "inc-2");
  EXPECT_FALSE(w.LevelOf(5).has_value());
  watch::FirstWindows(w, {5}, after);
  p = {{4, watch::TpWindow(4, after + 1, 52)}, {5, watch::TpWindow(5, after + 1, 50)}};
  EXPECT_FALSE(w.Observe(p).recovered);
  EXPECT_NEAR(*w.LevelOf(5), 52.0 / 50.0, 1e-9);
  // No episode: never kept.
  (void)w.Arm(view, {5}, after, "");
  EXPECT_FALSE(w.LevelOf(5).has_value());
  // Another culprit in the same episode: its own level; rank 5's is dropped with its target.
  (void)w.Arm(view, {5}, kT0, "inc-3");
  watch::FirstWindows(w, {5}, kT0);
  p = {{4, watch::TpWindow(4, kT0 + 1, 800)}, {5, watch::TpWindow(5, kT0 + 1, 50)}};
  (void)w.Observe(p);
  ASSERT_TRUE(w.LevelOf(5).has_value());
  (void)w.Arm(view, {11}, after, "inc-3");
  EXPECT_FALSE(w.LevelOf(5).has_value());
  EXPECT_FALSE(w.LevelOf(11).has_value());
}

// The watch says when it last saw every culprit's group still waiting for it (what a re-check
// round would find): the level's own window counts; a window below the midpoint, a culprit
// without a level, or a level too mild to be visible says nothing.
TEST(RecoveryWatchTest, SaysWhenItLastSawTheWholeFault) {
  const JobView view = View(2, 4, 2);
  RecoveryWatch w(RecoveryWatchOptions{"t", 5, 2});
  (void)w.Arm(view, {5, 11}, kT0);
  watch::FirstWindows(w, {5, 11}, kT0);
  std::map<std::int64_t, json> p = {{4, watch::TpWindow(4, kT0 + 1, 800)}, {5, watch::TpWindow(5, kT0 + 1, 50)}};
  EXPECT_EQ(w.Observe(p).seen_ns, 0) << "rank 11 has no level yet";
  p[10] = watch::TpWindow(10, kT0 + 5, 900);
  p[11] = watch::TpWindow(11, kT0 + 5, 50);
  EXPECT_EQ(w.Observe(p).seen_ns, kT0 + 1 + 2'000'000'000) << "the older of the two level windows";
  // Newer windows, one noisy but above the midpoint (4): the older of the two again.
  p[4] = watch::TpWindow(4, kT0 + 4'000'000'000, 250);
  p[5] = watch::TpWindow(5, kT0 + 4'000'000'000, 50);
  p[10] = watch::TpWindow(10, kT0 + 3'000'000'000, 900);
  p[11] = watch::TpWindow(11, kT0 + 3'000'000'000, 50);
  EXPECT_EQ(w.Observe(p).seen_ns, kT0 + 5'000'000'000);
  // Rank 5 recovers: the whole fault is no longer seen (and rank 11 keeps it from a recovery).
  p[4] = watch::TpWindow(4, kT0 + 6'000'000'000, 52);
  p[5] = watch::TpWindow(5, kT0 + 6'000'000'000, 50);
  RecoveryWatch::Verdict v = w.Observe(p);
  EXPECT_EQ(v.seen_ns, 0);
  EXPECT_FALSE(v.recovered);

  RecoveryWatch mild(RecoveryWatchOptions{"t", 5, 2});
  (void)mild.Arm(view, {5}, kT0);
  watch::FirstWindows(mild, {5}, kT0);
  p = {{4, watch::TpWindow(4, kT0 + 1, 75)}, {5, watch::TpWindow(5, kT0 + 1, 50)}};
  EXPECT_EQ(mild.Observe(p).seen_ns, 0) << "1.5x is not visible: it tells nothing either way";
}

// A level below min_level (a mild fault, or transfers that dwarf the compute) is not visible: the
// watch never calls it recovered, and the caller keeps its re-check timer. With two culprits both
// must recover.
TEST(RecoveryWatchTest, AMildLevelOrOneCulpritStillSlowIsNoRecovery) {
  const JobView view = View(2, 4, 2);
  RecoveryWatch mild(RecoveryWatchOptions{"t", 5, 2});
  (void)mild.Arm(view, {5}, kT0);
  watch::FirstWindows(mild, {5}, kT0);
  std::map<std::int64_t, json> p = {{4, watch::TpWindow(4, kT0 + 1, 75)}, {5, watch::TpWindow(5, kT0 + 1, 50)}};
  EXPECT_FALSE(mild.Observe(p).recovered);
  p = {{4, watch::TpWindow(4, kT0 + 2'000'000'000, 50)}, {5, watch::TpWindow(5, kT0 + 2'000'000'000, 50)}};
  EXPECT_FALSE(mild.Observe(p).recovered) << "1.5x was never visible";

  RecoveryWatch two(RecoveryWatchOptions{"t", 5, 2});
  (void)two.Arm(view, {5, 11}, kT0);
  watch::FirstWindows(two, {5, 11}, kT0);
  p = {{4, watch::TpWindow(4, kT0 + 1, 800)}, {5, watch::TpWindow(5, kT0 + 1, 50)},
       {10, watch::TpWindow(10, kT0 + 1, 900)}, {11, watch::TpWindow(11, kT0 + 1, 50)}};
  EXPECT_FALSE(two.Observe(p).recovered);
  p[4] = watch::TpWindow(4, kT0 + 2'000'000'000, 50);
  p[5] = watch::TpWindow(5, kT0 + 2'000'000'000, 50);
  EXPECT_FALSE(two.Observe(p).recovered) << "rank 11 is still slow";
  p[10] = watch::TpWindow(10, kT0 + 2'000'000'000, 52);
  p[11] = watch::TpWindow(11, kT0 + 2'000'000'000, 50);
  EXPECT_TRUE(two.Observe(p).recovered);
}

}  // namespace
}  // namespace falcon::controller
