// Tests for PlanCut: the cut is checked by replaying each rank's explicit call stream with the
// shim's stopping rule (stop before the first call that reaches a trigger; inside a group, right
// after the group), not with the planner's own arithmetic.
#include "analyzer/cut_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <tuple>

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
    p.comms.push_back({id, n, 0, -1, {}});
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

// A failure at options.iteration names a later iteration: it plans, and the one before it (if
// after the one asked for) does not.
void ExpectFirstLaterIteration(const std::vector<RankCallPattern>& in, const CutOptions& options) {
  const CutPlan failed = PlanCut(in, options);
  ASSERT_FALSE(failed.ok());
  ASSERT_TRUE(failed.later_iteration.has_value()) << failed.failure;
  const std::uint64_t later = *failed.later_iteration;
  EXPECT_GT(later, *options.iteration);
  EXPECT_NE(failed.failure.find("iteration " + std::to_string(later) + " has a cut"), std::string::npos)
      << failed.failure;
  CutOptions at = options;
  at.iteration = later;
  EXPECT_TRUE(PlanCut(in, at).ok()) << PlanCut(in, at).failure;
  if (later - 1 > *options.iteration) {
    at.iteration = later - 1;
    const CutPlan before = PlanCut(in, at);
    EXPECT_FALSE(before.ok()) << "iteration " << later - 1 << " has a cut too";
    EXPECT_EQ(before.later_iteration, later);
  }
}

// TP x PP (dp = 1) 1F1B-like programs: per micro-batch forward = a TP all-reduce per layer and a
// grouped send to the next stage; the last stage starts with a grouped receive. Neighbouring
// stages exchange on a 2-rank communicator of their own (as unbatched send/recv do in PyTorch).
std::vector<Program> PipelineJob(int tp, int pp, int micro, int layers) {
  std::vector<Program> progs;
  for (int s = 0; s < pp; ++s) {
    for (int t = 0; t < tp; ++t) {
      Program p;
      p.rank = s * tp + t;
      const std::uint64_t tp_comm = 100 + static_cast<std::uint64_t>(s);
      auto pair = [&](int lower) { return 1000 + static_cast<std::uint64_t>(t * pp + lower); };  // stages lower, lower + 1
      const std::uint64_t world = 1;
      p.nranks = {{world, tp * pp}};
      if (s > 0) p.nranks[pair(s - 1)] = 2;
      if (s < pp - 1) p.nranks[pair(s)] = 2;
      if (tp > 1) p.nranks[tp_comm] = tp;
      for (int m = 0; m < micro; ++m) {
        if (s > 0) p.units.push_back({true, {pair(s - 1)}});  // receive activations
        for (int l = 0; l < layers && tp > 1; ++l) p.units.push_back({false, {tp_comm}});
        if (s < pp - 1) p.units.push_back({true, {pair(s)}});  // send activations
      }
      for (int m = 0; m < micro; ++m) {
        if (s < pp - 1) p.units.push_back({true, {pair(s)}});  // receive gradients
        for (int l = 0; l < layers && tp > 1; ++l) p.units.push_back({false, {tp_comm}});
        if (s > 0) p.units.push_back({true, {pair(s - 1)}});  // send gradients
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
  // Rank 0 is 40 calls ahead on the communicator, and rank 1 cannot catch up within the
  // horizon of 4 periods.
  Program a{0, {{false, {7}}, {false, {8}}}, {{7, 2}, {8, 1}}};
  Program b{1, {{false, {7}}, {false, {9}}}, {{7, 2}, {9, 1}}};
  CutOptions options;
  options.horizon_periods = 4;
  const CutPlan plan = PlanCut(std::vector<RankCallPattern>{PatternOf(a, 80, 1), PatternOf(b, 0, 1)}, options);
  EXPECT_FALSE(plan.ok());
  EXPECT_NE(plan.failure.find("no consistent cut"), std::string::npos) << plan.failure;
  EXPECT_NE(plan.failure.find("communicator 0000000000000007 cannot agree on a call count"), std::string::npos)
      << plan.failure;
  // Rank 1 calls it twice per period, rank 0 once: by totals (no channels) there is no telling
  // where a cut is, even where the counts meet.
  Program twice{1, {{false, {7}}, {false, {7}}}, {{7, 2}}};
  const CutPlan differ = PlanCut(std::vector<RankCallPattern>{PatternOf(a, 2, 1), PatternOf(twice, 0, 1)});
  EXPECT_FALSE(differ.ok());
  EXPECT_NE(differ.failure.find("1 calls per period on it, rank 1 2"), std::string::npos) << differ.failure;
}

TEST(CutPlanTest, ARankWithoutCallsCannotBeCut) {
  Program a{0, {{false, {7}}}, {{7, 2}}};
  RankCallPattern idle;
  idle.rank = 1;
  idle.comms = {{7, 2, 0, -1, {}}};
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
  ExpectFirstLaterIteration(in, options);
  in[0].min_position = 5 * progs[0].units.size();
  options.iteration = 4;
  EXPECT_NE(PlanCut(in, options).failure.find("too soon"), std::string::npos);
  ExpectFirstLaterIteration(in, options);
  EXPECT_EQ(FirstReachableIteration(in), 8u) << "iteration 3 starts at 0: the first at or after 5 periods is 8";
  in[0].iteration_at_start.reset();
  EXPECT_FALSE(FirstReachableIteration(in).has_value());
  EXPECT_NE(PlanCut(in, options).failure.find("no iteration boundary"), std::string::npos);
  EXPECT_FALSE(PlanCut(in, options).later_iteration.has_value()) << "no iteration is reachable without a boundary";
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
  ExpectFirstLaterIteration(in, options);
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

// A try whose iteration has no cut (a rank reported a period later than the others: it will be
// past that iteration's matching point) moves on to the next iteration, planned from the same
// preparation: the same cut as asking for that iteration.
TEST(CutPlanTest, IterationStartTriesPassAnIterationWithoutACut) {
  const std::vector<Program> progs = PipelineJob(2, 2, 2, 2);
  const std::uint64_t units = progs[0].units.size();
  std::vector<std::uint64_t> offsets(progs.size(), 0);
  std::vector<RankCallPattern> in;
  for (const Program& p : progs) {
    in.push_back(PatternOf(p, 0, 1));
    in.back().iteration_at_start = 0;
  }
  in.back().min_position = units + 1;
  CutOptions options;
  options.iteration = 1;
  EXPECT_FALSE(PlanCut(in, options).ok()) << "iteration 1 has no cut: the last rank is past it";
  options.iteration.reset();
  options.iteration_start_tries = 2;
  const CutPlan plan = PlanCut(in, options);
  ExpectConsistent(progs, offsets, plan);
  ASSERT_TRUE(plan.ok()) << plan.failure;
  EXPECT_EQ(plan.ranks[0].position, 2 * units) << "the second iteration tried";
  CutOptions at;
  at.iteration = 2;
  const CutPlan asked = PlanCut(in, at);
  ASSERT_TRUE(asked.ok()) << asked.failure;
  for (std::size_t i = 0; i < in.size(); ++i) EXPECT_EQ(plan.ranks[i].position, asked.ranks[i].position) << i;
  options.iteration_start_tries = 1;  // the one iteration tried has none: the earliest cut
  const CutPlan earliest = PlanCut(in, options);
  ASSERT_TRUE(earliest.ok()) << earliest.failure;
  EXPECT_EQ(earliest.ranks[0].position, PlanCut(in).ranks[0].position);
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

// Programs with point-to-point calls: each call names its communicator and, for a send or a
// receive, the peer's comm rank. The agent's report counts them per channel.
struct P2pCall {
  std::uint64_t comm = 0;
  ChannelKind kind = ChannelKind::kCollective;
  std::int32_t peer = -1;
};
struct P2pUnit {
  bool group = false;
  std::vector<P2pCall> calls;
};
struct P2pProgram {
  std::int64_t rank = 0;
  std::vector<P2pUnit> units;
  std::map<std::uint64_t, std::pair<std::int64_t, std::int32_t>> comms;  // id -> (nranks, own comm rank)
};
using ChannelKey = std::tuple<std::uint64_t, ChannelKind, std::int32_t>;

ChannelKey KeyOf(const P2pCall& c) { return {c.comm, c.kind, c.kind == ChannelKind::kCollective ? -1 : c.peer}; }

// As the agent reports it: per channel the calls before the period that starts `offset` units
// into the stream; `channels` false: an older agent's report (totals only).
RankCallPattern PatternOf(const P2pProgram& prog, std::uint64_t offset, std::uint64_t min_position,
                          bool channels = true) {
  RankCallPattern p;
  p.rank = prog.rank;
  std::map<std::uint64_t, std::uint32_t> index;
  for (const auto& [id, info] : prog.comms) {
    index[id] = static_cast<std::uint32_t>(p.comms.size());
    p.comms.push_back({id, info.first, 0, channels ? info.second : -1, {}});
  }
  auto channel = [&](const P2pCall& c) {  // the channel's index, listed on first use
    auto& list = p.comms[index[c.comm]].channels;
    const ChannelKey key = KeyOf(c);
    for (std::uint32_t k = 0; k < list.size(); ++k) {
      if (ChannelKey{c.comm, list[k].kind, list[k].peer} == key) return k;
    }
    list.push_back({c.kind, std::get<2>(key), 0});
    return static_cast<std::uint32_t>(list.size() - 1);
  };
  for (std::uint64_t u = 0; u < offset + prog.units.size(); ++u) {
    for (const P2pCall& c : prog.units[u % prog.units.size()].calls) {
      const std::uint32_t k = channel(c);
      if (u < offset) {
        ++p.comms[index[c.comm]].base_seq;
        ++p.comms[index[c.comm]].channels[k].base;
      }
    }
  }
  for (std::size_t k = 0; k < prog.units.size(); ++k) {
    const P2pUnit& unit = prog.units[(offset + k) % prog.units.size()];
    CallUnit cu{unit.group, {}};
    for (const P2pCall& c : unit.calls) {
      const std::uint32_t ch = channel(c);
      auto it = std::find_if(cu.calls.begin(), cu.calls.end(),
                             [&](const UnitCalls& x) { return x.comm == index[c.comm] && x.channel == ch; });
      if (it == cu.calls.end()) cu.calls.push_back({index[c.comm], 1, ch});
      else ++it->count;
    }
    p.units.push_back(cu);
  }
  if (!channels) {
    for (PatternComm& c : p.comms) c.channels.clear();
    for (CallUnit& u : p.units) {  // one entry per communicator, as older agents send
      std::vector<UnitCalls> merged;
      for (const UnitCalls& c : u.calls) {
        auto it = std::find_if(merged.begin(), merged.end(), [&](const UnitCalls& x) { return x.comm == c.comm; });
        if (it == merged.end()) merged.push_back({c.comm, c.count, 0});
        else it->count += c.count;
      }
      u.calls = merged;
    }
  }
  p.min_position = min_position;
  return p;
}

// The units each rank runs before it stops: the shim's rule (stop before the first call that
// reaches a trigger; inside a group, right after the group), replayed from unit 0, with the
// stream's first `offset` units already run when the pattern was taken. -1: never stopped.
std::int64_t StopUnit(const P2pProgram& prog, std::uint64_t offset, const RankCut& cut, std::uint64_t limit = 100000) {
  std::map<std::uint64_t, std::uint64_t> issued, trigger;
  for (const CutTarget& t : cut.targets) trigger[t.comm] = t.trigger_seq;
  for (std::uint64_t u = 0; u < offset + limit; ++u) {
    const P2pUnit& unit = prog.units[u % prog.units.size()];
    bool hit = false;
    for (const P2pCall& c : unit.calls) {
      if (u >= offset && trigger.contains(c.comm) && issued[c.comm] == trigger[c.comm]) hit = true;
      if (hit && !unit.group) return static_cast<std::int64_t>(u);
      ++issued[c.comm];
    }
    if (hit) return static_cast<std::int64_t>(u + 1);
  }
  return -1;
}

// Runs the ranks' streams up to their stops as NCCL would: each rank's units in order, a unit's
// calls launched together and each finishing once its partners have launched the matching call
// (the k-th collective of every member; the k-th send from a to b with b's k-th receive from
// a). Returns the ranks that cannot finish: a cut leaves none, the stopped job waits on nothing.
std::vector<std::int64_t> Stuck(const std::vector<P2pProgram>& progs, const std::vector<std::int64_t>& stops) {
  const std::size_t n = progs.size();
  // Per rank: the calls up to its stop, numbered per channel, and its units' call ranges.
  struct Op {
    ChannelKey key;
    std::uint64_t nth = 0;
    bool done = false;
  };
  std::vector<std::vector<Op>> ops(n);
  std::vector<std::vector<std::size_t>> unit_end(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::map<ChannelKey, std::uint64_t> seen;
    for (std::int64_t u = 0; u < stops[i]; ++u) {
      for (const P2pCall& c : progs[i].units[static_cast<std::size_t>(u) % progs[i].units.size()].calls) {
        ops[i].push_back({KeyOf(c), seen[KeyOf(c)]++, false});
      }
      unit_end[i].push_back(ops[i].size());
    }
  }
  std::map<std::pair<std::uint64_t, std::int32_t>, std::size_t> rank_of;  // (comm, comm rank) -> rank
  for (std::size_t i = 0; i < n; ++i) {
    for (const auto& [id, info] : progs[i].comms) rank_of[{id, info.second}] = i;
  }
  std::vector<std::size_t> head(n, 0);  // the unit each rank runs
  auto launched = [&](std::size_t i, const ChannelKey& key, std::uint64_t nth) {  // now or before
    const std::size_t upto = head[i] < unit_end[i].size() ? unit_end[i][head[i]] : ops[i].size();
    for (std::size_t k = 0; k < upto; ++k) {
      if (ops[i][k].key == key && ops[i][k].nth == nth) return true;
    }
    return false;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t i = 0; i < n; ++i) {
      if (head[i] >= unit_end[i].size()) continue;
      const std::size_t from = head[i] == 0 ? 0 : unit_end[i][head[i] - 1];
      bool all = true;
      for (std::size_t k = from; k < unit_end[i][head[i]]; ++k) {
        Op& op = ops[i][k];
        if (op.done) continue;
        const auto& [comm, kind, peer] = op.key;
        bool ok = true;
        if (kind == ChannelKind::kCollective) {
          for (std::size_t j = 0; j < n && ok; ++j) {
            if (progs[j].comms.contains(comm)) ok = launched(j, op.key, op.nth);
          }
        } else {
          const std::int32_t me = progs[i].comms.at(comm).second;
          const std::size_t j = rank_of.at({comm, peer});
          const ChannelKey mate{comm, kind == ChannelKind::kSend ? ChannelKind::kRecv : ChannelKind::kSend, me};
          ok = launched(j, mate, op.nth);
        }
        op.done = ok;
        all = all && ok;
      }
      if (all) {
        ++head[i];
        progress = true;
      }
    }
  }
  std::vector<std::int64_t> stuck;
  for (std::size_t i = 0; i < n; ++i) {
    if (head[i] < unit_end[i].size()) stuck.push_back(progs[i].rank);
  }
  return stuck;
}

void ExpectNothingWaits(const std::vector<P2pProgram>& progs, const std::vector<std::uint64_t>& offsets,
                        const CutPlan& plan) {
  ASSERT_TRUE(plan.ok()) << plan.failure;
  ASSERT_EQ(plan.ranks.size(), progs.size());
  std::vector<std::int64_t> stops;
  for (std::size_t i = 0; i < progs.size(); ++i) {
    stops.push_back(StopUnit(progs[i], offsets[i], plan.ranks[i]));
    ASSERT_GE(stops.back(), 0) << "rank " << progs[i].rank << " never stopped";
    EXPECT_EQ(static_cast<std::uint64_t>(stops.back()), offsets[i] + plan.ranks[i].position) << "rank " << i;
  }
  const std::vector<std::int64_t> stuck = Stuck(progs, stops);
  EXPECT_TRUE(stuck.empty()) << "rank " << stuck.front() << " waits on a stopped peer";
}

// A 1F1B pipeline whose stages exchange activations and gradients on one communicator of all
// stages (batched sends: PyTorch's batch_isend_irecv puts them on the group's communicator),
// with a TP all-reduce per layer and a world all-reduce per iteration. A middle stage calls the
// pipeline communicator twice as often as an end stage.
std::vector<P2pProgram> BatchedPipeline(int pp, int micro, bool tp_calls) {
  std::vector<P2pProgram> progs;
  const std::uint64_t pp_comm = 200, world = 1;
  for (int s = 0; s < pp; ++s) {
    P2pProgram p;
    p.rank = s;
    p.comms = {{pp_comm, {pp, s}}, {world, {pp, s}}};
    const std::uint64_t tp_comm = 100 + static_cast<std::uint64_t>(s);  // a 1-rank TP group
    if (tp_calls) p.comms[tp_comm] = {1, 0};
    const auto send = [&](int to) { return P2pCall{pp_comm, ChannelKind::kSend, to}; };
    const auto recv = [&](int from) { return P2pCall{pp_comm, ChannelKind::kRecv, from}; };
    auto compute = [&] {
      if (tp_calls) p.units.push_back({false, {{tp_comm, ChannelKind::kCollective, -1}}});
    };
    const int warm = std::min(micro, pp - 1 - s);
    int f = 0, b = 0;
    if (s > 0) p.units.push_back({true, {recv(s - 1)}});
    for (; f < warm; ++f) {  // warm-up forwards
      compute();
      P2pUnit u{true, {}};
      if (s < pp - 1) u.calls.push_back(send(s + 1));
      if (s > 0 && f + 1 < micro) u.calls.push_back(recv(s - 1));
      if (!u.calls.empty()) p.units.push_back(u);
    }
    for (; f < micro; ++f, ++b) {  // steady state: one forward, one backward
      compute();
      P2pUnit u{true, {}};
      if (s < pp - 1) u.calls = {send(s + 1), recv(s + 1)};
      if (!u.calls.empty()) p.units.push_back(u);
      compute();
      P2pUnit v{true, {}};
      if (s > 0) v.calls.push_back(send(s - 1));
      if (s > 0 && f + 1 < micro) v.calls.push_back(recv(s - 1));
      if (!v.calls.empty()) p.units.push_back(v);
    }
    for (; b < micro; ++b) {  // cool-down backwards
      if (s < pp - 1) p.units.push_back({true, {recv(s + 1)}});
      compute();
      if (s > 0) p.units.push_back({true, {send(s - 1)}});
    }
    p.units.push_back({false, {{world, ChannelKind::kCollective, -1}}});  // the gradient all-reduce
    progs.push_back(p);
  }
  return progs;
}

TEST(CutPlanTest, ABatchedPipelineIsCutPerChannel) {
  for (int pp : {3, 4, 5}) {
    for (bool tp_calls : {false, true}) {
      SCOPED_TRACE("pp " + std::to_string(pp) + (tp_calls ? " with TP calls" : ""));
      const std::vector<P2pProgram> progs = BatchedPipeline(pp, 6, tp_calls);
      std::vector<std::int64_t> iterations;  // 40 whole iterations on every stage
      for (const P2pProgram& p : progs) iterations.push_back(40 * static_cast<std::int64_t>(p.units.size()));
      ASSERT_TRUE(Stuck(progs, iterations).empty()) << "the job itself runs";
      std::vector<std::uint64_t> offsets;
      std::vector<RankCallPattern> in, legacy;
      for (std::size_t i = 0; i < progs.size(); ++i) {
        offsets.push_back(3 * progs[i].units.size() + 5 * i);  // every stage at its own phase
        in.push_back(PatternOf(progs[i], offsets.back(), 2 + i));
        legacy.push_back(PatternOf(progs[i], offsets.back(), 2 + i, false));
      }
      const CutPlan plan = PlanCut(in);
      ExpectNothingWaits(progs, offsets, plan);
      // Counted by its totals, the pipeline communicator's counts can meet where the stages are
      // iterations apart: older agents' reports get a refusal, never that cut.
      const CutPlan old = PlanCut(legacy);
      EXPECT_FALSE(old.ok());
      EXPECT_NE(old.failure.find("calls per period"), std::string::npos) << old.failure;
    }
  }
}

// A member whose report has no channels (an older agent, or one that lost count) makes its
// communicators count by their totals, whatever the others report.
TEST(CutPlanTest, AMemberWithoutChannelsCountsItsCommunicatorsByTotals) {
  const std::vector<P2pProgram> progs = BatchedPipeline(3, 4, false);
  std::vector<RankCallPattern> in;
  for (std::size_t i = 0; i < progs.size(); ++i) in.push_back(PatternOf(progs[i], 0, 1, i != 1));
  const CutPlan plan = PlanCut(in);
  EXPECT_FALSE(plan.ok());
  EXPECT_NE(plan.failure.find("calls per period"), std::string::npos) << plan.failure;
  // Two stages only: the totals agree, channels or not.
  const std::vector<P2pProgram> two = BatchedPipeline(2, 4, true);
  std::vector<RankCallPattern> mixed = {PatternOf(two[0], 0, 1, true), PatternOf(two[1], 0, 1, false)};
  ExpectNothingWaits(two, {0, 0}, PlanCut(mixed));
}

TEST(CutPlanTest, BadChannelReportsFallBackToTotalsOrFailNamingTheChannel) {
  const std::vector<P2pProgram> progs = BatchedPipeline(3, 4, false);
  std::vector<RankCallPattern> in;
  for (const P2pProgram& p : progs) in.push_back(PatternOf(p, 0, 1));
  ASSERT_TRUE(PlanCut(in).ok());
  ASSERT_EQ(in[0].comms[1].id, 200u) << "comms are listed by id: the world's, then the pipeline's";
  {
    std::vector<RankCallPattern> bad = in;
    bad[2].comms[1].rank = 0;  // two members claim comm rank 0: counted by totals, which differ
    EXPECT_NE(PlanCut(bad).failure.find("calls per period"), std::string::npos) << PlanCut(bad).failure;
  }
  {
    std::vector<RankCallPattern> bad = in;  // stage 0 sent to stage 2, which never received it
    bad[0].comms[1].channels.push_back({ChannelKind::kSend, 2, 5});
    const CutPlan plan = PlanCut(bad);
    EXPECT_FALSE(plan.ok());
    EXPECT_NE(plan.failure.find("cannot agree on the sends from 0 to 2"), std::string::npos) << plan.failure;
  }
  {
    std::vector<RankCallPattern> bad = in;
    bad[0].comms[1].channels.push_back({ChannelKind::kSend, 7, 0});  // no member is comm rank 7
    EXPECT_NE(PlanCut(bad).failure.find("calls per period"), std::string::npos) << PlanCut(bad).failure;
  }
}

// Random programs with point-to-point calls: a global order of events (a collective on a random
// communicator, or a send from one member to another on it), projected onto each rank, some
// adjacent calls of a rank merged into groups. The plan must leave nothing waiting, and be the
// earliest cut: brute force over small domains with the channels' counts.
TEST(CutPlanTest, RandomProgramsWithSendsGetTheEarliestCutThatLeavesNothingWaiting) {
  std::mt19937_64 rng(20261130);
  int infeasible = 0;
  const int trials = 80;
  const int n = 3;
  const std::vector<std::vector<int>> comm_members = {{0, 1}, {1, 2}, {0, 1, 2}};
  for (int trial = 0; trial < trials; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    std::vector<P2pProgram> progs(n);
    for (int r = 0; r < n; ++r) {
      progs[r].rank = r;
      for (std::size_t c = 0; c < comm_members.size(); ++c) {
        const auto& m = comm_members[c];
        const auto at = std::find(m.begin(), m.end(), r);
        if (at != m.end()) progs[r].comms[10 + c] = {static_cast<std::int64_t>(m.size()), static_cast<std::int32_t>(at - m.begin())};
      }
    }
    const int events = 3 + static_cast<int>(rng() % 6);
    for (int e = 0; e <= events; ++e) {
      const std::size_t c = e == events ? 2 : rng() % comm_members.size();  // last: a world collective
      const auto& m = comm_members[c];
      if (e < events && rng() % 2 == 0) {
        const std::size_t a = rng() % m.size(), b = (a + 1 + rng() % (m.size() - 1)) % m.size();
        progs[m[a]].units.push_back({false, {{10 + c, ChannelKind::kSend, static_cast<std::int32_t>(b)}}});
        progs[m[b]].units.push_back({false, {{10 + c, ChannelKind::kRecv, static_cast<std::int32_t>(a)}}});
      } else {
        for (int r : m) progs[r].units.push_back({false, {{10 + c, ChannelKind::kCollective, -1}}});
      }
    }
    for (P2pProgram& p : progs) {  // random groups: merge adjacent calls
      std::vector<P2pUnit> merged;
      for (const P2pUnit& u : p.units) {
        if (!merged.empty() && merged.back().group && rng() % 2 == 0) {
          merged.back().calls.insert(merged.back().calls.end(), u.calls.begin(), u.calls.end());
        } else {
          merged.push_back({rng() % 3 == 0, u.calls});
        }
      }
      p.units = merged;
    }
    std::vector<std::uint64_t> offsets;
    std::vector<RankCallPattern> in;
    for (int r = 0; r < n; ++r) {
      offsets.push_back(rng() % (3 * progs[r].units.size()) + progs[r].units.size());
      in.push_back(PatternOf(progs[r], offsets.back(), 1 + rng() % 4));
    }
    const CutPlan plan = PlanCut(in);
    // Brute force: the earliest stop position of each rank over all vectors whose channels agree.
    std::vector<std::uint64_t> best(n, ~std::uint64_t{0});
    const std::uint64_t span = 16;
    std::uint64_t xs[3];
    for (xs[0] = in[0].min_position; xs[0] < in[0].min_position + span; ++xs[0]) {
      for (xs[1] = in[1].min_position; xs[1] < in[1].min_position + span; ++xs[1]) {
        for (xs[2] = in[2].min_position; xs[2] < in[2].min_position + span; ++xs[2]) {
          bool ok = true;
          for (int r = 0; r < n && ok; ++r) {
            const auto& u = in[r].units;
            ok = xs[r] >= 1 && (!u[xs[r] % u.size()].group || u[(xs[r] + u.size() - 1) % u.size()].group);
          }
          // Per communicator: collectives alike; per (sender, receiver) comm ranks: sends = receives.
          std::map<std::tuple<std::uint64_t, int, int>, std::set<std::uint64_t>> counts;
          std::map<std::tuple<std::uint64_t, int, int>, int> sides_seen;
          for (int r = 0; r < n && ok; ++r) {
            for (std::uint32_t c = 0; c < in[r].comms.size(); ++c) {
              const PatternComm& pc = in[r].comms[c];
              bool has_coll = false;
              for (std::uint32_t k = 0; k < pc.channels.size(); ++k) {
                const PatternChannel& ch = pc.channels[k];
                const std::uint64_t v = IssuedOnChannelBefore(in[r], c, k, xs[r]);
                std::tuple<std::uint64_t, int, int> key{pc.id, -1, -1};
                if (ch.kind == ChannelKind::kSend) key = {pc.id, pc.rank, ch.peer};
                if (ch.kind == ChannelKind::kRecv) key = {pc.id, ch.peer, pc.rank};
                has_coll = has_coll || ch.kind == ChannelKind::kCollective;
                counts[key].insert(v);
                ++sides_seen[key];
              }
              if (!has_coll) counts[{pc.id, -1, -1}].insert(0);
            }
          }
          for (const auto& [key, values] : counts) {
            const bool one_sided = std::get<1>(key) >= 0 && sides_seen[key] < 2;
            ok = ok && values.size() == 1 && (!one_sided || *values.begin() == 0);
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
    ExpectNothingWaits(progs, offsets, plan);
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
