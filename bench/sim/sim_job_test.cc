// Tests for SimJob: the simulated job's communicators agree across members, its call pattern
// admits the consistent cuts the controller plans, its clock and faults, and the fault plan's
// errors.
#include "bench/sim/sim_job.h"
#include "bench/sim/sim_agents.h"

#include <map>

#include <gtest/gtest.h>

namespace falcon::sim {
namespace {

SimShape Shape(int tp, int pp, int dp) {
  SimShape s;
  s.tp = tp;
  s.pp = pp;
  s.dp = dp;
  s.micro_batches = 4;
  return s;
}

// The sim's latency figures stay bounded over a long run: n and max exact, quantiles from a
// uniform sample.
TEST(LatencySampleTest, KeepsEveryValueUpToItsCapacityThenAUniformSample) {
  LatencySample small(8);
  for (double v : {5.0, 1.0, 3.0}) small.Add(v);
  EXPECT_EQ(LatencySummary(small), LatencySummary(std::vector<double>{5.0, 1.0, 3.0}));
  EXPECT_EQ(LatencySummary(LatencySample()), nlohmann::json({{"n", 0}}));

  // A million values rising 0..999,999, 4,096 kept: a sample of the first ones would show it.
  LatencySample big(4096);
  constexpr std::uint64_t kN = 1'000'000;
  for (std::uint64_t i = 0; i < kN; ++i) big.Add(static_cast<double>(i));
  EXPECT_EQ(big.n(), kN);
  EXPECT_EQ(big.kept().size(), 4096u);
  const nlohmann::json s = LatencySummary(big);
  EXPECT_EQ(s["n"], kN);
  EXPECT_DOUBLE_EQ(s["max"].get<double>(), 999'999.0) << "the maximum is exact, sampled or not";
  EXPECT_NEAR(s["p50"].get<double>(), 500'000.0, 30'000.0);
  EXPECT_NEAR(s["p99"].get<double>(), 990'000.0, 8'000.0);
  // Neither early nor late values are favoured: the sample's mean is the whole stream's.
  double sum = 0;
  for (double v : big.kept()) sum += v;
  EXPECT_NEAR(sum / 4096.0, 499'999.5, 15'000.0);
}

TEST(SimJobTest, EveryMemberOfACommunicatorAgreesOnItsIdSizeAndCallsPerIteration) {
  for (const SimShape& shape : {Shape(8, 4, 2), Shape(2, 3, 4), Shape(1, 2, 8), Shape(4, 1, 4), Shape(8, 8, 1)}) {
    SimJob job(shape, {}, 0);
    struct Seen {
      std::int32_t nranks = 0;
      std::uint64_t calls = 0;
      std::map<std::int32_t, std::int64_t> members;  // rank in comm -> global rank
    };
    std::map<std::uint64_t, Seen> comms;
    for (std::int64_t r = 0; r < shape.ranks(); ++r) {
      for (const SimComm& c : job.Comms(r)) {
        Seen& s = comms[c.id];
        if (s.nranks == 0) {
          s.nranks = c.nranks;
          s.calls = c.calls_per_iteration;
        }
        EXPECT_EQ(s.nranks, c.nranks) << "rank " << r;
        EXPECT_EQ(s.calls, c.calls_per_iteration) << "rank " << r;
        EXPECT_TRUE(s.members.emplace(c.rank, r).second) << "two members with rank " << c.rank << " in it";
      }
    }
    const std::int64_t expected = (shape.tp > 1 ? std::int64_t{shape.pp} * shape.dp : 0) +
                                  (shape.dp > 1 ? std::int64_t{shape.pp} * shape.tp : 0) +
                                  std::int64_t{shape.pp - 1} * shape.tp * shape.dp;
    EXPECT_EQ(static_cast<std::int64_t>(comms.size()), expected);
    for (const auto& [id, s] : comms) EXPECT_EQ(static_cast<std::int32_t>(s.members.size()), s.nranks);
  }
}

TEST(SimJobTest, PatternsIssueOneIterationsCallsAndAdmitAConsistentCut) {
  const SimShape shape = Shape(2, 3, 2);
  SimJob job(shape, {}, 0);
  std::vector<analyzer::RankCallPattern> patterns;
  for (std::int64_t r = 0; r < shape.ranks(); ++r) {
    // Ranks report from different iterations, as agents polled at different times do.
    analyzer::RankCallPattern p = job.Pattern(r, 10 + static_cast<std::uint64_t>(r % 2));
    const std::vector<SimComm> comms = job.Comms(r);
    ASSERT_EQ(p.comms.size(), comms.size());
    std::uint64_t calls = 0;
    for (std::uint32_t c = 0; c < comms.size(); ++c) {
      EXPECT_EQ(analyzer::IssuedBefore(p, c, p.units.size()) - p.comms[c].base_seq, comms[c].calls_per_iteration);
      calls += comms[c].calls_per_iteration;
    }
    EXPECT_EQ(calls, job.Period(r));
    patterns.push_back(std::move(p));
  }
  const analyzer::CutPlan plan = analyzer::PlanCut(patterns);
  ASSERT_TRUE(plan.ok()) << plan.failure;
  // Every communicator's members stop with the same calls issued.
  std::map<std::uint64_t, std::uint64_t> expect;
  for (const analyzer::RankCut& cut : plan.ranks) {
    for (const analyzer::CutTarget& t : cut.targets) {
      auto [it, fresh] = expect.emplace(t.comm, t.expect_seq);
      EXPECT_EQ(it->second, t.expect_seq) << "rank " << cut.rank;
    }
  }
}

TEST(SimJobTest, AComputeFaultSlowsTheWholeJobWhileItLasts) {
  SimShape shape = Shape(2, 2, 2);
  shape.noise = 0;
  shape.iteration_s = 1.0;
  SimFault f{"compute", {3}, {}, 10.0, 20.0, 3.0};
  SimJob job(shape, {f}, 0);
  EXPECT_DOUBLE_EQ(job.Slowdown(5'000'000'000), 1.0);
  EXPECT_DOUBLE_EQ(job.Slowdown(15'000'000'000), 1.0 + 2.0 * shape.compute_share);
  EXPECT_DOUBLE_EQ(job.Slowdown(31'000'000'000), 1.0);
  // Iterations tile the time line; those started in the fault are slower.
  for (std::uint64_t k = 1; k < 40; ++k) {
    const SimJob::Iteration a = job.IterationAt(k - 1), b = job.IterationAt(k);
    EXPECT_EQ(b.start_ns, a.start_ns + static_cast<std::int64_t>(a.seconds * 1e9));
  }
  EXPECT_DOUBLE_EQ(job.IterationAt(5).seconds, 1.0);
  EXPECT_GT(job.IterationAt(12).seconds, 2.0);
  EXPECT_EQ(job.IterationsBefore(0), 0u);
  EXPECT_EQ(job.IterationsBefore(1), 1u);
  EXPECT_EQ(job.IterationsBefore(3'500'000'000), 4u);
}

TEST(SimJobTest, ALinkFaultSlowsTheJobOnlyWhenTheLinkCarriesItsTraffic) {
  SimShape shape = Shape(8, 2, 2);  // 4 nodes: node = stage * 2 + dp replica
  SimJob job(shape, {}, 0);
  EXPECT_TRUE(job.LinkCarriesTraffic(0, 1));   // DP peers
  EXPECT_TRUE(job.LinkCarriesTraffic(0, 2));   // pipeline neighbours
  EXPECT_FALSE(job.LinkCarriesTraffic(0, 3));  // neither
  SimJob idle(shape, {{"link", {}, {0, 3}, 0, 0, 4.0}}, 0);
  EXPECT_DOUBLE_EQ(idle.Slowdown(1), 1.0);
  SimJob busy(shape, {{"link", {}, {1, 0}, 0, 0, 4.0}}, 0);
  EXPECT_DOUBLE_EQ(busy.Slowdown(1), 1.0 + 3.0 * shape.comm_share);
}

TEST(SimJobTest, FaultPlansAreCheckedWithAReason) {
  const SimShape shape = Shape(8, 2, 2);  // 32 ranks, 4 nodes
  struct Case {
    const char* text;
    const char* error;  // nullptr: valid
  };
  const Case cases[] = {
      {R"({"faults": [{"kind": "compute", "ranks": [3], "start_s": 5, "duration_s": 10, "factor": 2}]})", nullptr},
      {R"({"faults": [{"kind": "link", "nodes": [0, 1], "factor": 3}, {"kind": "nic", "nodes": [2]}]})", nullptr},
      {R"({"faults": []})", nullptr},
      {"not json", "expected a JSON object"},
      {R"({"faults": [{"kind": "hang", "ranks": [1]}]})", "not modelled"},
      {R"({"faults": [{"kind": "disk"}]})", "compute, link or nic"},
      {R"({"faults": [{"kind": "compute", "ranks": [32]}]})", "rank 32 is not in the job"},
      {R"({"faults": [{"kind": "compute"}]})", "compute needs"},
      {R"({"faults": [{"kind": "link", "nodes": [1, 1]}]})", "two different nodes"},
      {R"({"faults": [{"kind": "nic", "nodes": [4]}]})", "node 4 is not in the job"},
      {R"({"faults": [{"kind": "compute", "ranks": [1], "factor": 0.5}]})", "factor in [1, 1000]"},
      {R"({"faults": [{"kind": "compute", "ranks": [1], "start_s": "soon"}]})", "start_s must be a number"},
  };
  for (const Case& c : cases) {
    Result<std::vector<SimFault>> r = ParseFaultPlan(c.text, shape);
    if (c.error == nullptr) {
      EXPECT_TRUE(r.ok()) << c.text << ": " << r.status().message();
    } else {
      ASSERT_FALSE(r.ok()) << c.text;
      EXPECT_NE(r.status().message().find(c.error), std::string::npos) << r.status().message();
    }
  }
}

}  // namespace
}  // namespace falcon::sim
