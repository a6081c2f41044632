// Tests for PlanCut: the cut is checked by replaying each rank's explicit call stream with the
// shim's stopping rule (stop before the first call that reaches a trigger; inside a group, right
// after the group), not with the planner's own arithmetic.
#include "analyzer/cut_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

namespace falcon::analyzer {
namespace {

// A rank's program: one period of units over global communicator ids, repeated forever.
struct Unit {
  bool group = false;
  std::vector<std::uint64_t> comms;  // one entry per call
};
struct Program {
  std::int64_t rank = 0;
  std::vector<Unit> units;
  std::map<std::uint64_t, std::int64_t> nranks;  // every communicator of the rank
};

// The pattern as an agent would report it: the period starting `offset` units into the stream.
RankCallPattern PatternOf(const Program& prog, std::uint64_t offset, std::uint64_t min_position) {
  RankCallPattern p;
  p.rank = prog.rank;
  std::map<std::uint64_t, std::uint32_t> index;
  for (const auto& [id, n] : prog.nranks) {
    index[id] = static_cast<std::uint32_t>(p.comms.size());
    p.comms.push_back({id, n, 0});
  }
  for (std::uint64_t u = 0; u < offset; ++u) {
    for (std::uint64_t c : prog.units[u % prog.units.size()].comms) ++p.comms[index[c]].base_seq;
  }
  for (std::size_t k = 0; k < prog.units.size(); ++k) {
    const Unit& unit = prog.units[(offset + k) % prog.units.size()];
    CallUnit cu{unit.group, {}};
    for (std::uint64_t c : unit.comms) {
      auto it = std::find_if(cu.calls.begin(), cu.calls.end(), [&](const UnitCalls& x) { return x.comm == index[c]; });
      if (it == cu.calls.end()) cu.calls.push_back({index[c], 1});
      else ++it->count;
    }
    p.units.push_back(cu);
  }
  p.min_position = min_position;
  return p;
}

// Replays the stream from `offset` with the shim's rule; returns the counts per communicator
// at the stop, or an empty map if no trigger fired within `limit` units.
std::map<std::uint64_t, std::uint64_t> Replay(const Program& prog, std::uint64_t offset, const RankCut& cut,
                                              std::uint64_t limit = 100000) {
  std::map<std::uint64_t, std::uint64_t> issued;
  for (const auto& [id, n] : prog.nranks) issued[id] = 0;
  std::map<std::uint64_t, std::uint64_t> trigger;
  for (const CutTarget& t : cut.targets) trigger[t.comm] = t.trigger_seq;
  for (std::uint64_t u = 0; u < offset + limit; ++u) {
    const Unit& unit = prog.units[u % prog.units.size()];
    bool hit = false;
    for (std::uint64_t c : unit.comms) {
      if (u >= offset && issued[c] == trigger[c]) hit = true;
      if (hit && !unit.group) return issued;  // stop before the ungrouped call
      ++issued[c];
    }
    if (hit) return issued;  // after the group
  }
  return {};
}

void ExpectConsistent(const std::vector<Program>& progs, const std::vector<std::uint64_t>& offsets,
                      const CutPlan& plan) {
  ASSERT_TRUE(plan.ok()) << plan.failure;
  ASSERT_EQ(plan.ranks.size(), progs.size());
  std::map<std::uint64_t, std::set<std::uint64_t>> counts;
  for (std::size_t i = 0; i < progs.size(); ++i) {
    const auto at_stop = Replay(progs[i], offsets[i], plan.ranks[i]);
    ASSERT_FALSE(at_stop.empty()) << "rank " << progs[i].rank << " never stopped";
    for (const CutTarget& t : plan.ranks[i].targets) {
      EXPECT_EQ(at_stop.at(t.comm), t.expect_seq) << "rank " << progs[i].rank << " comm " << t.comm;
      counts[t.comm].insert(at_stop.at(t.comm));
    }
  }
  for (const auto& [comm, values] : counts) EXPECT_EQ(values.size(), 1u) << "comm " << comm << " members disagree";
}

// TP x PP (dp = 1) 1F1B-like programs: per micro-batch forward = a TP all-reduce per layer and a
// grouped send to the next stage; the last stage starts with a grouped receive.
std::vector<Program> PipelineJob(int tp, int pp, int micro, int layers) {
  std::vector<Program> progs;
  for (int s = 0; s < pp; ++s) {
    for (int t = 0; t < tp; ++t) {
      Program p;
      p.rank = s * tp + t;
      const std::uint64_t tp_comm = 100 + static_cast<std::uint64_t>(s);
      const std::uint64_t pp_comm = 200 + static_cast<std::uint64_t>(t);
      const std::uint64_t world = 1;
      p.nranks = {{world, tp * pp}, {pp_comm, pp}};
      if (tp > 1) p.nranks[tp_comm] = tp;
      for (int m = 0; m < micro; ++m) {
        if (s > 0) p.units.push_back({true, {pp_comm}});  // receive activations
        for (int l = 0; l < layers && tp > 1; ++l) p.units.push_back({false, {tp_comm}});
        if (s < pp - 1) p.units.push_back({true, {pp_comm}});  // send activations
      }
      for (int m = 0; m < micro; ++m) {
        if (s < pp - 1) p.units.push_back({true, {pp_comm}});  // receive gradients
        for (int l = 0; l < layers && tp > 1; ++l) p.units.push_back({false, {tp_comm}});
        if (s > 0) p.units.push_back({true, {pp_comm}});  // send gradients
      }
      progs.push_back(p);
    }
  }
  return progs;
}

TEST(CutPlanTest, TwoRanksOneCommunicatorAgreeOnTheSameCall) {
  Program a{0, {{false, {7}}, {false, {7}}, {false, {7}}}, {{7, 2}}};
  Program b = a;
  b.rank = 1;
  const std::vector<RankCallPattern> in = {PatternOf(a, 3, 2), PatternOf(b, 6, 1)};
  const CutPlan plan = PlanCut(in);
  ExpectConsistent({a, b}, {3, 6}, plan);
  // b is 3 calls ahead: a stops at least 3 positions later than b.
  EXPECT_EQ(plan.ranks[0].position, plan.ranks[1].position + 3);
  EXPECT_GE(plan.ranks[1].position, 1u);
  EXPECT_GE(plan.ranks[0].position, 2u);
}

TEST(CutPlanTest, PipelineWithGroupsAndPhaseOffsetsIsConsistent) {
  const std::vector<Program> progs = PipelineJob(2, 3, 4, 3);
  std::vector<std::uint64_t> offsets;
  std::vector<RankCallPattern> in;
  for (std::size_t i = 0; i < progs.size(); ++i) {
    offsets.push_back(5 * progs[i].units.size() + 7 * i);  // every rank reports a different phase
    in.push_back(PatternOf(progs[i], offsets.back(), 3 + i));
  }
  const CutPlan plan = PlanCut(in);
  ExpectConsistent(progs, offsets, plan);
  for (std::size_t i = 0; i < progs.size(); ++i) EXPECT_GE(plan.ranks[i].position, 3 + i);
}

TEST(CutPlanTest, RanksWithOnlyGroupedCallsStopAfterAGroup) {
  const std::vector<Program> progs = PipelineJob(1, 4, 3, 2);  // tp = 1: every call is grouped
  std::vector<std::uint64_t> offsets;
  std::vector<RankCallPattern> in;
  for (std::size_t i = 0; i < progs.size(); ++i) {
    offsets.push_back(2 * progs[i].units.size() + i);
    in.push_back(PatternOf(progs[i], offsets.back(), 1));
  }
  ExpectConsistent(progs, offsets, PlanCut(in));
}

TEST(CutPlanTest, AMissingMemberFailsWithItsCommunicator) {
  const std::vector<Program> progs = PipelineJob(2, 2, 2, 2);
  std::vector<RankCallPattern> in;
  for (std::size_t i = 0; i + 1 < progs.size(); ++i) in.push_back(PatternOf(progs[i], 0, 1));
  const CutPlan plan = PlanCut(in);
  EXPECT_FALSE(plan.ok());
  EXPECT_NE(plan.failure.find("members have a call pattern"), std::string::npos) << plan.failure;
}

TEST(CutPlanTest, DisagreeingPatternsHaveNoCut) {
  // Rank 1 calls the communicator twice per period, rank 0 once, and rank 0 is ahead: the
  // counts drift apart and never meet within the horizon.
  Program a{0, {{false, {7}}, {false, {8}}}, {{7, 2}, {8, 1}}};
  Program b{1, {{false, {7}}, {false, {7}}}, {{7, 2}}};
  CutOptions options;
  options.horizon_periods = 4;
  const CutPlan plan = PlanCut(std::vector<RankCallPattern>{PatternOf(a, 40, 1), PatternOf(b, 0, 1)}, options);
  EXPECT_FALSE(plan.ok());
  EXPECT_NE(plan.failure.find("no consistent cut"), std::string::npos) << plan.failure;
}

TEST(CutPlanTest, ARankWithoutCallsCannotBeCut) {
  Program a{0, {{false, {7}}}, {{7, 2}}};
  RankCallPattern idle;
  idle.rank = 1;
  idle.comms = {{7, 2, 0}};
  const CutPlan plan = PlanCut(std::vector<RankCallPattern>{PatternOf(a, 0, 1), idle});
  EXPECT_FALSE(plan.ok());
  EXPECT_NE(plan.failure.find("rank 1"), std::string::npos) << plan.failure;
}

TEST(CutPlanTest, IterationStopsTheLowestRankAtThatIterationsStart) {
  const std::vector<Program> progs = PipelineJob(2, 2, 2, 2);
  std::vector<std::uint64_t> offsets;
  std::vector<RankCallPattern> in;
  for (std::size_t i = 0; i < progs.size(); ++i) {
    offsets.push_back(3 * progs[i].units.size());
    in.push_back(PatternOf(progs[i], offsets.back(), 1));
    in.back().iteration_at_start = 3;
  }
  CutOptions options;
  options.iteration = 5;
  const CutPlan plan = PlanCut(in, options);
  ExpectConsistent(progs, offsets, plan);
  // Rank 0's iteration starts with an ungrouped TP call: it stops exactly two periods ahead.
  EXPECT_EQ(plan.ranks[0].position, 2 * progs[0].units.size());

  options.iteration = 2;
  EXPECT_NE(PlanCut(in, options).failure.find("has passed"), std::string::npos);
  in[0].min_position = 5 * progs[0].units.size();
  options.iteration = 4;
  EXPECT_NE(PlanCut(in, options).failure.find("too soon"), std::string::npos);
  in[0].iteration_at_start.reset();
  EXPECT_NE(PlanCut(in, options).failure.find("no iteration boundary"), std::string::npos);
}

// The lowest rank could still stop at the iteration, but another rank will be past the matching
// point by the time a pause reaches it: that is "too soon" on that rank, not a disagreement.
TEST(CutPlanTest, AnotherRankAlreadyPastTheIterationIsTooSoonNamingIt) {
  const std::vector<Program> progs = PipelineJob(2, 2, 2, 2);
  std::vector<RankCallPattern> in;
  for (const Program& p : progs) {
    in.push_back(PatternOf(p, 1, 1));
    in.back().iteration_at_start = 10;
  }
  CutOptions options;
  options.iteration = 12;
  ASSERT_TRUE(PlanCut(in, options).ok());
  in[3].min_position = 6 * progs[3].units.size();  // rank 3 will be five iterations further on
  const CutPlan plan = PlanCut(in, options);
  EXPECT_FALSE(plan.ok());
  EXPECT_NE(plan.failure.find("too soon"), std::string::npos) << plan.failure;
  EXPECT_NE(plan.failure.find("rank " + std::to_string(in[3].rank)), std::string::npos) << plan.failure;
  options.iteration = 20;  // a later iteration is fine
  EXPECT_TRUE(PlanCut(in, options).ok()) << PlanCut(in, options).failure;
}

// The validation cut prefers an iteration start on the lowest rank (little device work queued
// there); without an iteration boundary it is the earliest cut.
TEST(CutPlanTest, IterationStartTriesStopTheLowestRankAtTheNextIterationStart) {
  const std::vector<Program> progs = PipelineJob(2, 2, 2, 2);
  const std::uint64_t units = progs[0].units.size();
  for (std::uint64_t min : {std::uint64_t{1}, units / 2, units, 3 * units + 1}) {
    SCOPED_TRACE(min);
    std::vector<std::uint64_t> offsets;
    std::vector<RankCallPattern> in;
    for (std::size_t i = 0; i < progs.size(); ++i) {
      offsets.push_back(0);
      in.push_back(PatternOf(progs[i], 0, min));
      in.back().iteration_at_start = 7;
    }
    CutOptions options;
    options.iteration_start_tries = 3;
    const CutPlan plan = PlanCut(in, options);
    ExpectConsistent(progs, offsets, plan);
    ASSERT_TRUE(plan.ok()) << plan.failure;
    EXPECT_EQ(plan.ranks[0].position % units, 0u) << "an iteration start";
    EXPECT_GE(plan.ranks[0].position, min);
    EXPECT_LT(plan.ranks[0].position, std::max<std::uint64_t>(min, 1) + units);
    for (RankCallPattern& p : in) p.iteration_at_start.reset();
    const CutPlan earliest = PlanCut(in, options);
    ASSERT_TRUE(earliest.ok()) << earliest.failure;
    EXPECT_EQ(earliest.ranks[0].position, PlanCut(in).ranks[0].position) << "no boundary: the earliest cut";
  }
}

// Random SPMD programs: a global order of collectives on random communicators, projected onto
// each rank (so the members of every communicator issue the same calls), with random groups.
// The plan must be consistent and the earliest one: brute force over small domains.
TEST(CutPlanTest, RandomProgramsGetTheEarliestConsistentCut) {
  std::mt19937_64 rng(20261125);
  int infeasible = 0;
  const int trials = 60;
  for (int trial = 0; trial < trials; ++trial) {
    const int n = 3;
    const std::vector<std::vector<int>> comm_members = {{0, 1}, {1, 2}, {0, 2}, {0, 1, 2}};
    std::vector<Program> progs(n);
    for (int r = 0; r < n; ++r) progs[r].rank = r;
    const int events = 3 + static_cast<int>(rng() % 6);
    for (int e = 0; e < events; ++e) {
      const std::size_t c = rng() % comm_members.size();
      for (int r : comm_members[c]) progs[r].units.push_back({false, {10 + c}});
    }
    for (int r = 0; r < n; ++r) {
      if (progs[r].units.empty()) progs[r].units.push_back({false, {10 + 3}});  // keep everyone busy
    }
    // Every rank takes part in comm 13 (all three) as often: make the world call universal.
    for (int r = 0; r < n; ++r) {
      progs[r].units.push_back({false, {13}});
      for (std::size_t c = 0; c < comm_members.size(); ++c) {
        if (std::find(comm_members[c].begin(), comm_members[c].end(), r) != comm_members[c].end()) {
          progs[r].nranks[10 + c] = static_cast<std::int64_t>(comm_members[c].size());
        }
      }
      // Random groups: merge adjacent units.
      std::vector<Unit> merged;
      for (const Unit& u : progs[r].units) {
        if (!merged.empty() && merged.back().group && rng() % 2 == 0) {
          merged.back().comms.insert(merged.back().comms.end(), u.comms.begin(), u.comms.end());
        } else {
          merged.push_back({rng() % 3 == 0, u.comms});
        }
      }
      progs[r].units = merged;
    }
    std::vector<std::uint64_t> offsets;
    std::vector<RankCallPattern> in;
    for (int r = 0; r < n; ++r) {
      offsets.push_back(rng() % (3 * progs[r].units.size()) + progs[r].units.size());
      in.push_back(PatternOf(progs[r], offsets.back(), 1 + rng() % 4));
    }
    const CutPlan plan = PlanCut(in);
    SCOPED_TRACE("trial " + std::to_string(trial));
    // Brute force within the planner's horizon (8 periods of >= 2 units): the earliest stop
    // position of each rank over all consistent vectors. Random groups can leave none at all.
    std::vector<std::uint64_t> best(n, ~std::uint64_t{0});
    const std::uint64_t span = 16;
    for (std::uint64_t x0 = in[0].min_position; x0 < in[0].min_position + span; ++x0) {
      for (std::uint64_t x1 = in[1].min_position; x1 < in[1].min_position + span; ++x1) {
        for (std::uint64_t x2 = in[2].min_position; x2 < in[2].min_position + span; ++x2) {
          const std::uint64_t xs[3] = {x0, x1, x2};
          bool ok = true;
          for (int r = 0; r < n && ok; ++r) {
            const auto& u = in[r].units;
            ok = xs[r] >= 1 && (!u[xs[r] % u.size()].group || u[(xs[r] + u.size() - 1) % u.size()].group);
          }
          for (const auto& [id, members] : std::map<std::uint64_t, int>{{10, 0}, {11, 0}, {12, 0}, {13, 0}}) {
            std::set<std::uint64_t> seen;
            for (int r = 0; r < n && ok; ++r) {
              for (std::uint32_t c = 0; c < in[r].comms.size(); ++c) {
                if (in[r].comms[c].id == id) seen.insert(IssuedBefore(in[r], c, xs[r]));
              }
            }
            ok = ok && seen.size() <= 1;
          }
          if (!ok) continue;
          for (int r = 0; r < n; ++r) best[r] = std::min(best[r], xs[r]);
        }
      }
    }
    if (!plan.ok()) {
      for (int r = 0; r < n; ++r) EXPECT_EQ(best[r], ~std::uint64_t{0}) << plan.failure;
      ++infeasible;
      continue;
    }
    ExpectConsistent(progs, offsets, plan);
    for (int r = 0; r < n; ++r) {
      if (best[r] != ~std::uint64_t{0}) {
        EXPECT_EQ(plan.ranks[r].position, best[r]) << "rank " << r;
      }
    }
  }
  EXPECT_LT(infeasible, trials / 4);  // most random programs have a cut: the test tests something
}

}  // namespace
}  // namespace falcon::analyzer
