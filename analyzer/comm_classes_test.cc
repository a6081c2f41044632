// Tests for communicator classes, suspicion and the compute suspect on constructed jobs with
// known answers: a TP2 x DP4 x PP2 job's signatures give exactly its TP groups, DP groups and PP
// pairs; a slow DP group is flagged; the compute suspect is found under jitter and refused when
// ambiguous or when clocks disagree.
#include "analyzer/comm_classes.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "analyzer/test_util.h"

namespace falcon::analyzer {
namespace {

constexpr std::uint64_t kMiB = 1 << 20;

// TP2 x DP4 x PP2: global rank = pp * 8 + dp * 2 + tp.
struct Job {
  std::vector<CommProfile> comms;
  std::vector<std::set<std::int32_t>> tp, dp, pp;  // expected member sets
};

Job MakeJob(std::uint64_t dp_bucket_stage1 = 25 * kMiB, bool unidirectional_pp = false) {
  Job job;
  std::uint64_t next_id = 100;
  const auto add = [&](std::vector<std::int32_t> members, std::vector<SignatureTerm> sig) {
    CommProfile c;
    c.id = next_id++;
    c.nranks = static_cast<std::uint32_t>(members.size());
    c.members = std::move(members);
    c.signature = std::move(sig);
    job.comms.push_back(std::move(c));
  };
  for (int pp = 0; pp < 2; ++pp) {
    for (int dp = 0; dp < 4; ++dp) {
      const std::int32_t base = pp * 8 + dp * 2;
      add({base, base + 1}, {{OpKind::kAllReduce, 8 * kMiB, 24}, {OpKind::kAllGather, 2 * kMiB, 8},
                             {OpKind::kAllReduce, 8 * kMiB, 24}});  // repeated term: summed
      job.tp.push_back({base, base + 1});
    }
  }
  for (int pp = 0; pp < 2; ++pp) {
    for (int tp = 0; tp < 2; ++tp) {
      std::vector<std::int32_t> members;
      for (int dp = 0; dp < 4; ++dp) members.push_back(pp * 8 + dp * 2 + tp);
      const std::uint64_t bucket = pp == 0 ? 25 * kMiB : dp_bucket_stage1;
      add(members, {{OpKind::kAllReduce, bucket, 4}, {OpKind::kAllReduce, 12 * kMiB, 1}});
      job.dp.push_back({members.begin(), members.end()});
    }
  }
  for (int dp = 0; dp < 4; ++dp) {
    for (int tp = 0; tp < 2; ++tp) {
      const std::int32_t first = dp * 2 + tp;
      // Profiles come from either end of the pair: mirror images of each other.
      std::vector<SignatureTerm> sig;
      if (unidirectional_pp) {
        sig = {{(dp + tp) % 2 == 0 ? OpKind::kSend : OpKind::kRecv, 4 * kMiB, 8}};
      } else if ((dp + tp) % 2 == 0) {
        sig = {{OpKind::kSend, 4 * kMiB, 8}, {OpKind::kRecv, 4 * kMiB, 8}};
      } else {
        sig = {{OpKind::kRecv, 4 * kMiB, 8}, {OpKind::kSend, 4 * kMiB, 8}};
      }
      add({first, first + 8}, sig);
      job.pp.push_back({first, first + 8});
    }
  }
  add({}, {});  // placeholder replaced below: the world communicator
  job.comms.back().nranks = 16;
  job.comms.back().signature = {{OpKind::kAllReduce, 4, 1}, {OpKind::kOther, 0, 3}};
  CommProfile idle;
  idle.id = 7;
  idle.nranks = 2;
  job.comms.push_back(idle);
  return job;
}

std::set<std::set<std::int32_t>> MemberSets(const Job& job, const CommClass& c) {
  std::set<std::set<std::int32_t>> out;
  for (const std::size_t i : c.comms) {
    out.insert({job.comms[i].members.begin(), job.comms[i].members.end()});
  }
  return out;
}

TEST(CommClassesTest, TpDpPpJobGivesExactlyItsGroups) {
  const Job job = MakeJob();
  const Result<CommClassification> r = ClassifyCommunicators(job.comms);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const CommClassification& c = r.value();
  ASSERT_EQ(c.classes.size(), 4U);  // TP, DP, PP, world
  EXPECT_EQ(MemberSets(job, c.classes[0]),
            std::set<std::set<std::int32_t>>(job.tp.begin(), job.tp.end()));
  EXPECT_EQ(MemberSets(job, c.classes[1]),
            std::set<std::set<std::int32_t>>(job.dp.begin(), job.dp.end()));
  EXPECT_EQ(MemberSets(job, c.classes[2]),
            std::set<std::set<std::int32_t>>(job.pp.begin(), job.pp.end()));
  EXPECT_EQ(c.classes[0].comms.size(), 8U);
  EXPECT_EQ(c.classes[1].comms.size(), 4U);
  EXPECT_EQ(c.classes[2].comms.size(), 8U);
  EXPECT_EQ(c.classes[3].comms.size(), 1U);
  EXPECT_EQ(c.classes[3].nranks, 16U);
  // Canonical TP signature: the repeated term summed, sorted by op.
  const std::vector<SignatureTerm> tp_sig = {{OpKind::kAllReduce, 8 * kMiB, 48},
                                             {OpKind::kAllGather, 2 * kMiB, 8}};
  EXPECT_EQ(c.classes[0].signature, tp_sig);
  ASSERT_EQ(c.idle.size(), 1U);
  EXPECT_EQ(c.class_of[c.idle[0]], kNoClass);
}

TEST(CommClassesTest, OptionsDecideWhatCountsAsTheSameWork) {
  struct Case {
    const char* what;
    std::uint64_t stage1_bucket;
    bool unidirectional_pp;
    ClassOptions options;
    std::size_t classes;  // TP + DP + PP + world, DP or PP split in two when they differ
  };
  const Case cases[] = {
      {"balanced stages", 25 * kMiB, false, {}, 4},
      {"stage 1 buckets differ: DP splits", 26 * kMiB, false, {}, 5},
      {"within a size class: DP stays one", 26 * kMiB, false, {SizeMatch::kSizeClass}, 4},
      {"one-way PP pairs, Send = Recv", 25 * kMiB, true, {}, 4},
      {"one-way PP pairs, distinguished", 25 * kMiB, true,
       {SizeMatch::kExact, P2pMatch::kDistinguish}, 5},
  };
  for (const Case& c : cases) {
    const Job job = MakeJob(c.stage1_bucket, c.unidirectional_pp);
    const Result<CommClassification> r = ClassifyCommunicators(job.comms, c.options);
    ASSERT_TRUE(r.ok()) << c.what;
    EXPECT_EQ(r.value().classes.size(), c.classes) << c.what;
  }
}

TEST(CommClassesTest, RejectsMalformedProfiles) {
  struct Case {
    const char* what;
    std::vector<CommProfile> comms;
  };
  const Case cases[] = {
      {"zero ranks", {{1, 0, {}, {{OpKind::kAllReduce, 8, 1}}}}},
      {"member count", {{1, 2, {0, 1, 2}, {{OpKind::kAllReduce, 8, 1}}}}},
      {"duplicate id", {{1, 2, {}, {{OpKind::kAllReduce, 8, 1}}}, {1, 2, {}, {}}}},
  };
  for (const Case& c : cases) EXPECT_FALSE(ClassifyCommunicators(c.comms).ok()) << c.what;
}

TEST(CommClassesTest, SlowDpGroupIsTheOnlySuspect) {
  const Job job = MakeJob();
  const CommClassification classes = ClassifyCommunicators(job.comms).value();
  for (std::uint64_t seed = 1; seed <= 50; ++seed) {
    testing::Rng rng(seed);
    const std::size_t slow = classes.classes[1].comms[rng.Next() % 4];
    std::vector<double> metric(job.comms.size());
    for (std::size_t i = 0; i < metric.size(); ++i) {
      metric[i] = 0.05 * (1.0 + 0.02 * rng.Gauss()) * (i == slow ? 1.3 : 1.0);
    }
    metric[classes.idle[0]] = std::nan("");
    const Result<std::vector<CommAssessment>> r = FlagSuspicious(classes, metric);
    ASSERT_TRUE(r.ok());
    for (const CommAssessment& a : r.value()) {
      const std::size_t cls = classes.class_of[a.comm];
      if (a.comm == slow) {
        EXPECT_EQ(a.verdict, CommVerdict::kSuspicious) << seed;
        EXPECT_NEAR(a.ratio, 1.3, 0.15);  // 2 % noise on both sides
        EXPECT_EQ(a.peers, 3U);
      } else if (cls == kNoClass) {
        EXPECT_EQ(a.verdict, CommVerdict::kNoData);
      } else if (classes.classes[cls].comms.size() == 1) {
        EXPECT_EQ(a.verdict, CommVerdict::kNoPeers) << "world communicator";
      } else {
        EXPECT_EQ(a.verdict, CommVerdict::kHealthy) << seed << " comm " << a.comm;
      }
    }
  }
}

TEST(CommClassesTest, SuspicionBaselinesOnSmallClasses) {
  struct Case {
    std::vector<double> metric;
    SuspicionBaseline baseline;
    std::vector<CommVerdict> expected;
  };
  using V = CommVerdict;
  const auto kClass = SuspicionBaseline::kClassMedian;
  const auto kPeer = SuspicionBaseline::kPeerMedian;
  const double nan = std::nan("");
  const Case cases[] = {
      {{1.0, 1.5}, kClass, {V::kHealthy, V::kSuspicious}},   // 1.5 / 1.25 = 1.2
      {{1.0, 1.15}, kClass, {V::kHealthy, V::kHealthy}},     // 1.15 / 1.075 = 1.07
      {{1.0, 1.15}, kPeer, {V::kHealthy, V::kSuspicious}},   // 1.15 / 1.0
      {{1.0, nan}, kClass, {V::kNoPeers, V::kNoData}},
      {{1.0, -1.0}, kPeer, {V::kNoPeers, V::kNoData}},
      {{1.0, 1.0, 1.0, 1.11}, kClass, {V::kHealthy, V::kHealthy, V::kHealthy, V::kSuspicious}},
  };
  for (const Case& c : cases) {
    CommClassification classes;
    classes.classes.push_back({2, {{OpKind::kAllReduce, 8, 1}}, {}});
    for (std::size_t i = 0; i < c.metric.size(); ++i) {
      classes.classes[0].comms.push_back(i);
      classes.class_of.push_back(0);
    }
    const Result<std::vector<CommAssessment>> r =
        FlagSuspicious(classes, c.metric, {1.1, c.baseline});
    ASSERT_TRUE(r.ok());
    for (std::size_t i = 0; i < c.expected.size(); ++i) {
      EXPECT_EQ(r.value()[i].verdict, c.expected[i]) << c.metric[0] << "," << c.metric[1] << " #" << i;
    }
  }
  CommClassification one;
  one.class_of = {kNoClass};
  const double m[] = {1.0, 2.0};
  EXPECT_FALSE(FlagSuspicious(one, m).ok()) << "size mismatch";
  EXPECT_FALSE(FlagSuspicious(one, std::span<const double>(m, 1), {0.9}).ok()) << "ratio < 1";
}

// Collective timings: every rank computes, enters the call, and the call ends for all at the
// latest arrival + transfer time. Delays (seconds) add compute before the call per rank.
struct Timings {
  std::vector<std::int64_t> arrival_ns;
  std::vector<double> wait_s;
};

Timings Simulate(std::size_t n, std::size_t calls, const std::vector<double>& delay_s,
                 const std::vector<double>& clock_offset_s, double jitter_s, std::uint64_t seed) {
  testing::Rng rng(seed);
  Timings t;
  const double transfer_s = 0.005;
  for (std::size_t k = 0; k < calls; ++k) {
    const double start = 0.1 * static_cast<double>(k);
    std::vector<double> arrive(n);
    for (std::size_t r = 0; r < n; ++r) {
      arrive[r] = start + delay_s[r] + jitter_s * std::fabs(rng.Gauss());
      if (rng.Uniform() < 0.01) arrive[r] += 0.01;  // a hiccup on 1 % of ranks x calls
    }
    const double end = *std::max_element(arrive.begin(), arrive.end()) + transfer_s;
    for (std::size_t r = 0; r < n; ++r) {
      const double seen = arrive[r] + clock_offset_s[r];
      t.arrival_ns.push_back(1'700'000'000'000'000'000 + static_cast<std::int64_t>(seen * 1e9));
      t.wait_s.push_back(end - arrive[r] + 0.1 * jitter_s * std::fabs(rng.Gauss()));
    }
  }
  return t;
}

TEST(CommClassesTest, ComputeSuspectIsFoundUnderJitter) {
  for (const std::size_t n : {2U, 4U, 8U}) {
    for (std::uint64_t seed = 1; seed <= 40; ++seed) {
      testing::Rng rng(seed * 977);
      const std::size_t suspect = rng.Next() % n;
      std::vector<double> delay(n, 0.0), offset(n, 0.0);
      delay[suspect] = 0.003;
      const Timings t = Simulate(n, 32, delay, offset, 0.0003, seed);
      const Result<ComputeSuspect> r = FindComputeSuspect({n, t.arrival_ns, t.wait_s});
      ASSERT_TRUE(r.ok());
      EXPECT_EQ(r.value().verdict, SuspectVerdict::kFound) << n << " seed " << seed;
      EXPECT_EQ(r.value().rank, static_cast<std::int32_t>(suspect)) << n << " seed " << seed;
      EXPECT_NEAR(r.value().wait_advantage_s, 0.003, 0.001);
      EXPECT_NEAR(r.value().lateness_s, 0.003, 0.001);
      EXPECT_GE(r.value().confidence, 0.75);
    }
  }
}

TEST(CommClassesTest, ComputeSuspectRefusesWhenAmbiguous) {
  struct Case {
    const char* what;
    std::vector<double> delay, offset;
    bool arrivals;
    std::vector<SuspectVerdict> allowed;
  };
  using S = SuspectVerdict;
  const Case cases[] = {
      {"healthy", {0, 0, 0, 0}, {0, 0, 0, 0}, true, {S::kNoSuspect, S::kInconsistent}},
      {"two equal stragglers", {0.003, 0.003, 0, 0}, {0, 0, 0, 0}, true,
       {S::kNoSuspect, S::kInconsistent}},
      {"straggler's clock 20 ms behind", {0, 0, 0.003, 0}, {0, 0, -0.02, 0}, true,
       {S::kClockDisagrees}},
      {"same, arrivals ignored", {0, 0, 0.003, 0}, {0, 0, -0.02, 0}, false, {S::kFound}},
      {"tiny lead next to the transfer", {0, 0.0001, 0, 0}, {0, 0, 0, 0}, true,
       {S::kNoSuspect, S::kInconsistent}},
  };
  for (const Case& c : cases) {
    for (std::uint64_t seed = 1; seed <= 40; ++seed) {
      const Timings t = Simulate(4, 32, c.delay, c.offset, 0.0003, seed);
      CollectiveTimings in{4, {}, t.wait_s};
      if (c.arrivals) in.arrival_ns = t.arrival_ns;
      const Result<ComputeSuspect> r = FindComputeSuspect(in);
      ASSERT_TRUE(r.ok());
      EXPECT_NE(std::find(c.allowed.begin(), c.allowed.end(), r.value().verdict), c.allowed.end())
          << c.what << " seed " << seed << " verdict " << static_cast<int>(r.value().verdict);
    }
  }
}

TEST(CommClassesTest, ComputeSuspectValidatesInput) {
  const std::vector<double> waits(8 * 4, 0.01);
  const std::vector<std::int64_t> arrivals(8 * 4, 0);
  EXPECT_FALSE(FindComputeSuspect({1, {}, waits}).ok());
  EXPECT_FALSE(FindComputeSuspect({3, {}, waits}).ok()) << "not whole rows";
  EXPECT_FALSE(FindComputeSuspect({4, std::span(arrivals).first(4), waits}).ok());
  std::vector<double> bad = waits;
  bad[5] = -1.0;
  EXPECT_FALSE(FindComputeSuspect({4, {}, bad}).ok());
  const Result<ComputeSuspect> few = FindComputeSuspect({4, {}, std::span(waits).first(12)});
  ASSERT_TRUE(few.ok());
  EXPECT_EQ(few.value().verdict, SuspectVerdict::kTooFewCalls);
  const Result<ComputeSuspect> flat = FindComputeSuspect({4, arrivals, waits});
  ASSERT_TRUE(flat.ok());
  EXPECT_EQ(flat.value().verdict, SuspectVerdict::kNoSuspect) << "all equal";
}

}  // namespace
}  // namespace falcon::analyzer
