// DiagnoseHang on constructed progress tables: each finding kind, the chain followed to the
// root, and the cases that must not be blamed (a healthy snapshot, work queued behind other work,
// a send whose receive is posted).
#include "analyzer/hang_diagnosis.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace falcon::analyzer {
namespace {

constexpr std::uint8_t kAllReduce = 1, kAllGather = 5, kSend = 10, kRecv = 11;
constexpr std::uint64_t kDp = 0xd0, kTp = 0x70, kPp = 0x90, kWorld = 0xa0;

// A job of `n` ranks; add() gives rank r a communicator with its progress.
struct Job {
  std::vector<RankProgress> ranks;
  explicit Job(int n) {
    for (int r = 0; r < n; ++r) {
      RankProgress p;
      p.rank = r;
      p.host = "node" + std::to_string(r / 2);
      ranks.push_back(p);
    }
  }
  void add(int r, std::uint64_t comm, int nranks, int comm_rank, std::uint64_t issued, std::uint64_t completed) {
    ranks[r].comms.push_back({comm, nranks, comm_rank, issued, completed, true, {}});
  }
  void call(int r, std::uint64_t comm, std::uint64_t seq, CallSignature sig, std::uint64_t stream, bool completed) {
    ranks[r].recent.push_back({comm, seq, sig, stream, 0, completed, 0});
  }
  std::vector<Finding> diagnose() const { return DiagnoseHang(ranks); }
};

CallSignature Sig(std::uint8_t op, std::uint64_t count, std::int32_t peer = -1) {
  CallSignature s;
  s.op = op;
  s.dtype = 7;
  s.redop = static_cast<std::int16_t>(op == kAllReduce ? 0 : -1);
  s.peer = peer;
  s.count = count;
  return s;
}

std::vector<Finding> OfKind(const std::vector<Finding>& all, FindingKind k) {
  std::vector<Finding> out;
  for (const Finding& f : all) {
    if (f.kind == k) out.push_back(f);
  }
  return out;
}

TEST(HangDiagnosisTest, HealthySnapshotHasNoFinding) {
  Job job(4);
  for (int r = 0; r < 4; ++r) {
    job.add(r, kDp, 4, r, 9, 9);
    job.call(r, kDp, 8, Sig(kAllReduce, 1024), 1, true);
  }
  EXPECT_TRUE(job.diagnose().empty());
}

TEST(HangDiagnosisTest, RankThatNeverIssuedTheCallIsNamedWithTheRanksItHolds) {
  Job job(4);
  for (int r = 0; r < 4; ++r) job.add(r, kDp, 4, r, r == 3 ? 4 : 5, 4);
  for (int r = 0; r < 3; ++r) job.call(r, kDp, 4, Sig(kAllReduce, 1024), 1, false);
  const auto found = OfKind(job.diagnose(), FindingKind::kNotIssued);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].comm, kDp);
  EXPECT_EQ(found[0].seq, 4u);
  EXPECT_EQ(found[0].culprits, (std::vector<std::int64_t>{3}));
  EXPECT_EQ(found[0].waiting, (std::vector<std::int64_t>{0, 1, 2}));
  EXPECT_NE(found[0].summary.find("blocked outside NCCL"), std::string::npos) << found[0].summary;
  EXPECT_TRUE(OfKind(job.diagnose(), FindingKind::kNotCompleting).empty()) << "the others wait: not a device hang";
}

// Rank 3 never issued the DP all-reduce because it waits itself, in a PP exchange with rank 5,
// whose host never issued its side: the chain leads past rank 3 to rank 5.
TEST(HangDiagnosisTest, ChainIsFollowedToTheRankThatWaitsForNobody) {
  Job job(6);
  for (int r = 0; r < 4; ++r) job.add(r, kDp, 4, r, r == 3 ? 10 : 11, 10);
  job.add(3, kPp, 2, 0, 7, 6);
  job.add(5, kPp, 2, 1, 6, 6);
  job.call(3, kPp, 6, Sig(kSend, 4096, 1), 2, false);
  const auto found = OfKind(job.diagnose(), FindingKind::kNotIssued);
  ASSERT_EQ(found.size(), 2u);  // the DP all-reduce #10 and the PP call #6
  const Finding& dp = found[0].comm == kDp ? found[0] : found[1];
  EXPECT_EQ(dp.culprits, (std::vector<std::int64_t>{5}));
  EXPECT_EQ(dp.waiting, (std::vector<std::int64_t>{0, 1, 2}));
  ASSERT_EQ(dp.chain.size(), 2u);
  EXPECT_EQ(dp.chain[0], (CallRef{3, kPp, 6}));
  EXPECT_EQ(dp.chain[1].rank, 5);
  EXPECT_NE(dp.summary.find("they wait themselves, for rank(s) 5"), std::string::npos) << dp.summary;
}

TEST(HangDiagnosisTest, RootBlockedInsideAnNcclCallSaysSo) {
  Job job(2);
  job.add(0, kWorld, 2, 0, 3, 2);
  job.add(1, kWorld, 2, 1, 2, 2);
  job.ranks[1].in_call = kTp;  // e.g. a split of another communicator waiting for its peers
  const auto found = OfKind(job.diagnose(), FindingKind::kNotIssued);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].culprits, (std::vector<std::int64_t>{1}));
  EXPECT_NE(found[0].summary.find("blocked inside an NCCL call"), std::string::npos) << found[0].summary;
}

TEST(HangDiagnosisTest, IssuedEverywhereAndNotCompletingNamesTheCommunicatorOrTheStuckRanks) {
  Job all_stuck(4);
  for (int r = 0; r < 4; ++r) {
    all_stuck.add(r, kTp, 4, r, 8, 7);
    all_stuck.call(r, kTp, 7, Sig(kAllGather, 512), 1, false);
  }
  auto found = OfKind(all_stuck.diagnose(), FindingKind::kNotCompleting);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].seq, 7u);
  EXPECT_TRUE(found[0].culprits.empty()) << "no rank to blame: the communicator's GPUs or links";
  EXPECT_EQ(found[0].waiting.size(), 4u);

  Job one_stuck(4);
  for (int r = 0; r < 4; ++r) {
    one_stuck.add(r, kTp, 4, r, 8, r == 2 ? 7 : 8);
    one_stuck.call(r, kTp, 7, Sig(kAllGather, 512), 1, r != 2);
  }
  found = OfKind(one_stuck.diagnose(), FindingKind::kNotCompleting);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].culprits, (std::vector<std::int64_t>{2}));
}

TEST(HangDiagnosisTest, MismatchNamesTheRankThatDiffersFromTheOthers) {
  Job job(4);
  for (int r = 0; r < 4; ++r) {
    job.add(r, kDp, 4, r, 3, 3);
    job.call(r, kDp, 2, Sig(kAllReduce, r == 1 ? 2048 : 1024), 1, true);
  }
  const auto found = OfKind(job.diagnose(), FindingKind::kMismatch);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].seq, 2u);
  EXPECT_EQ(found[0].culprits, (std::vector<std::int64_t>{1}));
  EXPECT_EQ(found[0].signatures.size(), 4u);
  EXPECT_NE(found[0].summary.find("rank 1 issued AllReduce count 2048"), std::string::npos) << found[0].summary;

  Job tie(2);  // one against one: the lowest rank's signature is taken as intended
  for (int r = 0; r < 2; ++r) {
    tie.add(r, kPp, 2, r, 1, 1);
    tie.call(r, kPp, 0, Sig(r == 0 ? kAllReduce : kAllGather, 64), 1, true);
  }
  const auto t = OfKind(tie.diagnose(), FindingKind::kMismatch);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].culprits, (std::vector<std::int64_t>{1}));
}

// Ranks 0 and 1 share the TP and DP communicators; rank 0 queued TP #4 then DP #9 on its stream,
// rank 1 the other way round: each head waits for a copy queued behind the other head.
TEST(HangDiagnosisTest, OppositeOrdersOnOneStreamAreADeadlockWithItsCycle) {
  Job job(2);
  for (int r = 0; r < 2; ++r) {
    job.add(r, kTp, 2, r, 5, 4);
    job.add(r, kDp, 2, r, 10, 9);
  }
  job.call(0, kTp, 4, Sig(kAllReduce, 64), 11, false);
  job.call(0, kDp, 9, Sig(kAllReduce, 64), 11, false);
  job.call(1, kDp, 9, Sig(kAllReduce, 64), 22, false);
  job.call(1, kTp, 4, Sig(kAllReduce, 64), 22, false);
  const auto all = job.diagnose();
  const auto found = OfKind(all, FindingKind::kDeadlock);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].culprits, (std::vector<std::int64_t>{0, 1}));
  EXPECT_EQ(found[0].chain.size(), 4u);
  EXPECT_EQ(all.front().kind, FindingKind::kDeadlock) << "the most severe finding comes first";
  EXPECT_TRUE(OfKind(all, FindingKind::kNotCompleting).empty()) << "work queued behind the cycle is not a device hang";
  EXPECT_TRUE(OfKind(all, FindingKind::kDisorder).empty()) << "the inversion is reported once, as the deadlock";
}

// The same cycle, and a third rank: ranks 0 and 1 then wait on the host for their stuck work
// (the grad norm's .item()), so their next world call is never issued and rank 2 waits in it. That
// is the deadlock's doing, not a culprit of its own: one finding, holding all three ranks.
TEST(HangDiagnosisTest, CallsNeverIssuedBecauseOfADeadlockJoinIt) {
  Job job(3);
  for (int r = 0; r < 2; ++r) {
    job.add(r, kTp, 2, r, 5, 4);
    job.add(r, kDp, 2, r, 10, 9);
    job.add(r, kWorld, 3, r, 7, 7);
  }
  job.add(2, kWorld, 3, 2, 8, 7);
  job.call(0, kTp, 4, Sig(kAllReduce, 64), 11, false);
  job.call(0, kDp, 9, Sig(kAllReduce, 64), 11, false);
  job.call(1, kDp, 9, Sig(kAllReduce, 64), 22, false);
  job.call(1, kTp, 4, Sig(kAllReduce, 64), 22, false);
  job.call(2, kWorld, 7, Sig(kAllReduce, 8), 33, false);
  const auto all = job.diagnose();
  ASSERT_EQ(all.size(), 1u) << all.back().summary;
  EXPECT_EQ(all[0].kind, FindingKind::kDeadlock);
  EXPECT_EQ(all[0].culprits, (std::vector<std::int64_t>{0, 1}));
  EXPECT_EQ(all[0].waiting, (std::vector<std::int64_t>{0, 1, 2}));
  EXPECT_NE(all[0].summary.find("3 rank(s) held in all"), std::string::npos) << all[0].summary;

  Job idle = job;  // rank 0's work completes: no cycle, and rank 0 is named for the world call
  idle.ranks[0].recent.clear();
  idle.ranks[0].comms[0].completed = 5;
  idle.ranks[0].comms[1].completed = 10;
  const auto found = OfKind(idle.diagnose(), FindingKind::kNotIssued);
  ASSERT_FALSE(found.empty());
  EXPECT_TRUE(OfKind(idle.diagnose(), FindingKind::kDeadlock).empty());
}

TEST(HangDiagnosisTest, InversionThatDidNotBlockIsADisorderWarning) {
  Job job(2);
  for (int r = 0; r < 2; ++r) {
    job.add(r, kTp, 2, r, 5, 5);
    job.add(r, kDp, 2, r, 10, 10);
  }
  job.call(0, kTp, 4, Sig(kAllReduce, 64), 11, true);
  job.call(0, kDp, 9, Sig(kAllReduce, 64), 11, true);
  job.call(1, kDp, 9, Sig(kAllReduce, 64), 22, true);
  job.call(1, kTp, 4, Sig(kAllReduce, 64), 22, true);
  const auto all = job.diagnose();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].kind, FindingKind::kDisorder);
  EXPECT_EQ(all[0].culprits, (std::vector<std::int64_t>{0, 1}));
  EXPECT_NE(all[0].summary.find("the other way round by rank(s) 1"), std::string::npos) << all[0].summary;

  Job other_streams = job;  // the same order inversion on different streams of rank 1: no order
  other_streams.ranks[1].recent[1].stream = 23;
  EXPECT_TRUE(other_streams.diagnose().empty());
}

// A pipeline exchange (Megatron's batch_isend_irecv): both ranks send, then receive, in one
// group; NCCL launches the group as one, so neither send waits behind its own rank's receive.
TEST(HangDiagnosisTest, CallsOfOneGroupAreNotOrderedAmongThemselves) {
  Job job(2);
  for (int r = 0; r < 2; ++r) job.add(r, kPp, 2, r, 2, 0);
  job.call(0, kPp, 0, Sig(kSend, 4096, 1), 7, false);
  job.call(0, kPp, 1, Sig(kRecv, 4096, 1), 7, false);
  job.call(1, kPp, 0, Sig(kSend, 4096, 0), 9, false);
  job.call(1, kPp, 1, Sig(kRecv, 4096, 0), 9, false);
  Job grouped = job;
  for (auto& r : grouped.ranks) {
    for (auto& c : r.recent) c.group = 1;
  }
  EXPECT_TRUE(OfKind(grouped.diagnose(), FindingKind::kDeadlock).empty());
  EXPECT_TRUE(OfKind(grouped.diagnose(), FindingKind::kDisorder).empty());
  // Issued one by one on each stream, each send waits for a receive queued behind the peer's send.
  EXPECT_EQ(OfKind(job.diagnose(), FindingKind::kDeadlock).size(), 1u);
}

// A device hang in the TP all-reduce of ranks 0 and 1; rank 1's DP all-reduce, issued later on
// another stream that waits for the compute stream (an event the shim does not see), is pending
// too, and so is its DP peer's. Only the communicator where the ranks' first pending calls are
// is named.
TEST(HangDiagnosisTest, WorkIssuedAfterAStuckCallIsNotItsOwnDeviceHang) {
  Job job(3);
  job.add(0, kTp, 2, 0, 5, 4);
  job.add(1, kTp, 2, 1, 5, 4);
  job.add(1, kDp, 2, 0, 8, 7);
  job.add(2, kDp, 2, 1, 8, 7);
  job.call(0, kTp, 4, Sig(kAllReduce, 64), 11, false);
  job.call(1, kTp, 4, Sig(kAllReduce, 64), 11, false);
  job.call(1, kDp, 7, Sig(kAllReduce, 64), 12, false);
  job.call(2, kDp, 7, Sig(kAllReduce, 64), 13, false);
  job.ranks[0].recent[0].issue_ns = 100;
  job.ranks[1].recent[0].issue_ns = 110;
  job.ranks[1].recent[1].issue_ns = 120;
  job.ranks[2].recent[0].issue_ns = 90;  // issued first, but its peer's side came after the stuck call
  const auto found = OfKind(job.diagnose(), FindingKind::kNotCompleting);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].comm, kTp);
  EXPECT_EQ(found[0].waiting, (std::vector<std::int64_t>{0, 1}));
}

// Without device tracking on the members that wait, the issued counts still say who is behind;
// nothing is judged on the device.
TEST(HangDiagnosisTest, UnknownCompletionStillNamesTheLaggardAndNoDeviceHang) {
  Job job(3);
  for (int r = 0; r < 3; ++r) job.add(r, kDp, 3, r, r == 2 ? 6 : 7, r == 2 ? 6 : 0);
  job.call(0, kDp, 6, Sig(kAllReduce, 64), 1, false);
  job.call(1, kDp, 6, Sig(kAllReduce, 64), 1, false);
  for (int r = 0; r < 2; ++r) job.ranks[r].comms[0].completion_known = false;
  const auto all = job.diagnose();
  const auto laggards = OfKind(all, FindingKind::kNotIssued);
  ASSERT_EQ(laggards.size(), 1u);
  EXPECT_EQ(laggards[0].culprits, (std::vector<std::int64_t>{2}));
  EXPECT_EQ(laggards[0].waiting, (std::vector<std::int64_t>{0, 1}));
  Job all_issued(2);
  for (int r = 0; r < 2; ++r) {
    all_issued.add(r, kTp, 2, r, 5, 0);
    all_issued.ranks[r].comms[0].completion_known = false;
    all_issued.call(r, kTp, 4, Sig(kAllReduce, 64), 1, false);
  }
  EXPECT_TRUE(all_issued.diagnose().empty()) << "no verdict on work whose completion is not tracked";
}

// A split's arguments (colour, key) differ between members by design: never a mismatch.
TEST(HangDiagnosisTest, SplitsAndInitsAreNeverMismatches) {
  constexpr std::uint8_t kCommSplit = 19;
  Job job(2);
  for (int r = 0; r < 2; ++r) {
    job.add(r, kWorld, 2, r, 1, 1);
    job.call(r, kWorld, 0, Sig(kCommSplit, static_cast<std::uint64_t>(r), r), 0, true);
  }
  EXPECT_TRUE(job.diagnose().empty());
}

// Point-to-point on a communicator of four (the world used for PP sends): sequence numbers are
// not alike across members, so a send waits only for its peer's receive.
TEST(HangDiagnosisTest, SendWaitsForItsPeersReceiveOnly) {
  Job job(4);
  for (int r = 0; r < 4; ++r) job.add(r, kWorld, 4, r, r == 0 ? 6 : 3, r == 0 ? 5 : 3);
  job.call(0, kWorld, 5, Sig(kSend, 4096, 2), 1, false);
  auto found = OfKind(job.diagnose(), FindingKind::kNotIssued);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].culprits, (std::vector<std::int64_t>{2}));
  EXPECT_EQ(found[0].waiting, (std::vector<std::int64_t>{0}));

  job.call(2, kWorld, 2, Sig(kRecv, 4096, 0), 1, false);  // rank 2 posted it: both in flight
  found = OfKind(job.diagnose(), FindingKind::kNotIssued);
  EXPECT_TRUE(found.empty());
}

TEST(HangDiagnosisTest, RankListedTwiceCountsOnceAndFindingsAreCapped) {
  Job job(3);
  for (int r = 0; r < 3; ++r) {
    for (std::uint64_t c = 1; c <= 5; ++c) {
      job.add(r, c, 3, r, 1, 1);
      job.call(r, c, 0, Sig(kAllReduce, r == 2 ? 9 : 8), 1, true);
    }
  }
  std::vector<RankProgress> twice = job.ranks;
  twice.push_back(job.ranks[0]);
  EXPECT_EQ(OfKind(DiagnoseHang(twice), FindingKind::kMismatch).size(), 5u);
  EXPECT_EQ(OfKind(DiagnoseHang(twice, HangDiagnosisOptions{2}), FindingKind::kMismatch).size(), 2u);
  EXPECT_EQ(CallOpName(kSend), "Send");
  EXPECT_EQ(CallOpName(99), "op 99");
  EXPECT_STREQ(FindingKindName(FindingKind::kNotCompleting), "not_completing");
}

}  // namespace
}  // namespace falcon::analyzer
