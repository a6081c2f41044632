#include "analyzer/call_ledger.h"

#include <gtest/gtest.h>

namespace falcon::analyzer {
namespace {

constexpr std::uint64_t kComm = 0xabcdef0123456789ULL;
constexpr std::int64_t kMs = 1'000'000;

CallSignature AllReduce(std::uint64_t count, std::uint8_t dtype = 7) {
  CallSignature s;
  s.op = 1;  // kFalconOpAllReduce
  s.dtype = dtype;
  s.redop = 0;
  s.count = count;
  return s;
}

TEST(CallLedger, AgreeingMembersAreComparedAndForgotten) {
  CallLedger l;
  for (std::int64_t r = 0; r < 4; ++r) l.Add(r, kComm, 4, 0, 100, AllReduce(1024), 0);
  EXPECT_TRUE(l.Take(0).empty());
  EXPECT_EQ(l.compared(), 100u);
  EXPECT_EQ(l.pending(), 0u);
  EXPECT_EQ(l.raised(), 0u);
}

TEST(CallLedger, CountMismatchNamesTheOddRankOnceAllReported) {
  CallLedger l;
  for (std::int64_t r = 0; r < 4; ++r) l.Add(r, kComm, 4, 0, 10, AllReduce(1024), 0);
  l.Add(0, kComm, 4, 10, 1, AllReduce(1024), kMs);
  l.Add(1, kComm, 4, 10, 1, AllReduce(1024), kMs);
  l.Add(2, kComm, 4, 10, 1, AllReduce(1025), kMs);
  EXPECT_TRUE(l.Take(2 * kMs).empty()) << "rank 3 has not reported and the grace has not passed";
  l.Add(3, kComm, 4, 10, 1, AllReduce(1024), 3 * kMs);
  const std::vector<Finding> f = l.Take(3 * kMs);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].kind, FindingKind::kMismatch);
  EXPECT_EQ(f[0].comm, kComm);
  EXPECT_EQ(f[0].seq, 10u);
  EXPECT_EQ(f[0].culprits, std::vector<std::int64_t>{2});
  ASSERT_EQ(f[0].signatures.size(), 4u);
  EXPECT_EQ(f[0].signatures[2].first, 2);
  EXPECT_EQ(f[0].signatures[2].second.count, 1025u);
  EXPECT_NE(f[0].summary.find("count 1025"), std::string::npos) << f[0].summary;
  EXPECT_TRUE(l.Take(10 * kMs).empty()) << "raised once";
  EXPECT_EQ(l.pending(), 0u);
}

TEST(CallLedger, GraceDecidesWithoutAMemberThatNeverReports) {
  CallLedgerOptions o;
  o.grace_ns = 500 * kMs;
  CallLedger l(o);
  l.Add(0, kComm, 4, 7, 1, AllReduce(64), 0);
  l.Add(1, kComm, 4, 7, 1, AllReduce(64, 6), 10 * kMs);  // dtype differs
  l.Add(2, kComm, 4, 7, 1, AllReduce(64), 20 * kMs);
  EXPECT_TRUE(l.Take(500 * kMs).empty());
  const std::vector<Finding> f = l.Take(510 * kMs);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].culprits, std::vector<std::int64_t>{1});
  EXPECT_EQ(f[0].signatures.size(), 3u);
}

TEST(CallLedger, RunsAreSplitPerSeq) {
  CallLedger l;
  l.Add(0, kComm, 2, 0, 100, AllReduce(8), 0);
  l.Add(1, kComm, 2, 0, 50, AllReduce(8), 0);
  l.Add(1, kComm, 2, 50, 1, AllReduce(16), 0);
  l.Add(1, kComm, 2, 51, 49, AllReduce(8), 0);
  EXPECT_TRUE(l.Take(0).empty()) << "a tie waits for the grace";
  const std::vector<Finding> f = l.Take(CallLedgerOptions{}.grace_ns);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].seq, 50u);
  // Two members, one each, and no like communicator to ask: the lower rank's is taken as intended.
  EXPECT_EQ(f[0].culprits, std::vector<std::int64_t>{1});
  EXPECT_EQ(l.compared(), 99u);
}

TEST(CallLedger, ATieGoesToWhatLikeCommunicatorsIssuedAtThatSeq) {
  CallLedger l;
  // Pair {0, 1} splits at seq 7; pairs {2, 3} and {4, 5} (as many members) agree on count 8.
  l.Add(0, kComm, 2, 7, 1, AllReduce(9), 0);
  l.Add(1, kComm, 2, 7, 1, AllReduce(8), 0);
  l.Add(2, kComm + 1, 2, 7, 1, AllReduce(8), 100 * kMs);
  l.Add(3, kComm + 1, 2, 7, 1, AllReduce(8), 100 * kMs);
  const std::vector<Finding> f = l.Take(CallLedgerOptions{}.grace_ns);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].culprits, std::vector<std::int64_t>{0}) << "rank 0 issued what no other pair did";
  // A communicator of another size is no guide.
  CallLedger other;
  other.Add(0, kComm, 2, 7, 1, AllReduce(9), 0);
  other.Add(1, kComm, 2, 7, 1, AllReduce(8), 0);
  for (std::int64_t r = 2; r < 5; ++r) other.Add(r, kComm + 1, 3, 7, 1, AllReduce(8), 0);
  const std::vector<Finding> g = other.Take(CallLedgerOptions{}.grace_ns);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].culprits, std::vector<std::int64_t>{1});
}

TEST(CallLedger, ARankReportedTwiceCountsOnce) {
  CallLedger l;
  l.Add(0, kComm, 3, 5, 1, AllReduce(8), 0);
  l.Add(0, kComm, 3, 5, 1, AllReduce(9), 0);  // a repeat (even a different one) is ignored
  l.Add(1, kComm, 3, 5, 1, AllReduce(8), 0);
  EXPECT_EQ(l.compared(), 0u);
  EXPECT_EQ(l.pending(), 1u);
  l.Add(2, kComm, 3, 5, 1, AllReduce(8), 0);
  EXPECT_TRUE(l.Take(0).empty());
  EXPECT_EQ(l.compared(), 1u);
}

TEST(CallLedger, IncompleteEntriesLeaveByWindowAndAge) {
  CallLedgerOptions o;
  o.window = 100;
  o.max_age_ns = 1000 * kMs;
  CallLedger l(o);
  l.Add(0, kComm, 2, 0, 50, AllReduce(8), 0);  // rank 1 is never followed
  EXPECT_EQ(l.pending(), 50u);
  l.Add(0, kComm, 2, 50, 100, AllReduce(8), 0);
  EXPECT_EQ(l.pending(), 101u) << "seqs 49..149 are within the window of 149";
  EXPECT_EQ(l.expired(), 49u);
  EXPECT_TRUE(l.Take(1001 * kMs).empty());
  EXPECT_EQ(l.pending(), 0u);
  EXPECT_EQ(l.expired(), 150u);
}

TEST(CallLedger, ADifferenceLeavingTheWindowIsStillRaised) {
  CallLedgerOptions o;
  o.window = 10;
  o.grace_ns = 1000 * kMs;
  CallLedger l(o);
  l.Add(0, kComm, 3, 0, 1, AllReduce(8), 0);
  l.Add(1, kComm, 3, 0, 1, AllReduce(4), 0);
  l.Add(0, kComm, 3, 1, 20, AllReduce(8), 0);
  const std::vector<Finding> f = l.Take(0);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].seq, 0u);
}

TEST(CallLedger, MismatchesPerCommunicatorAreCapped) {
  CallLedgerOptions o;
  o.max_per_comm = 3;
  CallLedger l(o);
  for (std::uint64_t s = 0; s < 10; ++s) {
    l.Add(0, kComm, 2, s, 1, AllReduce(8), 0);
    l.Add(1, kComm, 2, s, 1, AllReduce(9), 0);
  }
  l.Add(0, kComm + 1, 2, 0, 1, AllReduce(8), 0);
  l.Add(1, kComm + 1, 2, 0, 1, AllReduce(9), 0);
  EXPECT_EQ(l.Take(o.grace_ns).size(), 4u);
  EXPECT_EQ(l.raised(), 4u);
  EXPECT_EQ(l.suppressed(), 7u);
}

TEST(CallLedger, ForgetRankDropsItsComparisons) {
  CallLedger l;
  l.Add(0, kComm, 2, 0, 5, AllReduce(8), 0);
  l.Add(1, kComm, 2, 5, 5, AllReduce(8), 0);
  EXPECT_EQ(l.pending(), 10u);
  l.ForgetRank(0);
  EXPECT_EQ(l.pending(), 5u);
}

TEST(CallLedger, DegenerateReportsAreHarmless) {
  CallLedger l;
  l.Add(0, kComm, 1, 0, 10, AllReduce(8), 0);  // a communicator of one: nothing to compare
  l.Add(0, kComm + 1, 4, 0, 0, AllReduce(8), 0);
  EXPECT_EQ(l.pending(), 0u);
  // A huge run keeps only the newest window of seqs (bounded work and memory).
  l.Add(0, kComm + 2, 2, 0, std::uint64_t{1} << 62, AllReduce(8), 0);
  EXPECT_EQ(l.pending(), CallLedgerOptions{}.window);
  // A communicator reported with another size starts over.
  l.Add(1, kComm + 2, 3, 0, 1, AllReduce(8), 0);
  EXPECT_EQ(l.pending(), 1u);
}

}  // namespace
}  // namespace falcon::analyzer
