// The controller's hang stage (daemon/controller/hang_stage.h) on constructed messages, validated
// as the controller gets them: stall reports open an episode, every agent is asked for its ranks'
// progress, the answers are diagnosed once per finding, silent agents are waited for only up to
// the deadline, reports of processes that are gone are dropped, and the episode ends when the
// stalled ranks make progress again.
#include <gtest/gtest.h>

#include <set>

#include "daemon/controller/hang_stage.h"
#include "daemon/controller/mismatch_stage.h"
#include "daemon/protocol/messages.h"
#include "daemon/protocol/validate.h"
#include "falcon/shm_abi.h"

namespace falcon::controller {
namespace {

using nlohmann::json;

constexpr std::int64_t kT0 = 1'795'264'878'000'000'000;  // wall ns
constexpr std::int64_t kSec = 1'000'000'000;

// 4 ranks: TP pairs {0,1} (comm aa) and {2,3} (bb), DP pairs {0,2} (cc) and {1,3} (dd); ranks 0
// and 1 on node0, 2 and 3 on node1.
constexpr std::uint64_t kTp01 = 0xaa, kTp23 = 0xbb, kDp02 = 0xcc, kDp13 = 0xdd;

json Validated(const json& m, const protocol::MessageSpec& spec) {
  Result<json> r = protocol::ParseMessage(m.dump(), spec);
  EXPECT_TRUE(r.ok()) << r.status().ToString() << ": " << m.dump();
  return r.ok() ? std::move(r).value() : json::object();
}

std::string Host(std::int64_t r) { return r < 2 ? "node0" : "node1"; }

JobView View() {
  std::vector<json> ranks;
  for (std::int64_t r = 0; r < 4; ++r) {
    protocol::RankRegistration m;
    m.header = {"job", Host(r), kT0};
    m.rank = r;
    m.pid = 1000 + r;
    m.started_ns = kT0 - 60 * kSec;
    m.comms = {{r < 2 ? kTp01 : kTp23, static_cast<std::int32_t>(r % 2), 2, "tp", 10},
               {r % 2 == 0 ? kDp02 : kDp13, static_cast<std::int32_t>(r / 2), 2, "dp", 10}};
    ranks.push_back(Validated(protocol::ToJson(m), protocol::kRankRegister));
  }
  std::vector<json> agents;
  for (const char* h : {"node0", "node1"}) {
    protocol::AgentHeartbeat a;
    a.header = {"job", h, kT0};
    a.pid = 42;
    a.version = "0.1.0";
    agents.push_back(Validated(protocol::ToJson(a), protocol::kAgentHeartbeat));
  }
  JobView v;
  v.Update(ranks, agents);
  return v;
}

json Stall(std::int64_t rank, const char* kind, std::int64_t pid = 0) {
  protocol::StallReport m;
  m.header = {"job", Host(rank), kT0};
  m.rank = rank;
  m.pid = pid != 0 ? pid : 1000 + rank;
  m.kind = kind;
  m.age_s = 6;
  m.bound_s = 5;
  return Validated(protocol::ToJson(m), protocol::kStall);
}

// A rank's progress: per communicator {id, comm rank, issued, completed}; the latest call of
// each is an AllReduce, completed unless it is the pending one.
json Progress(std::int64_t rank, const std::vector<std::array<std::uint64_t, 4>>& comms) {
  json c = json::array(), recent = json::array();
  for (const auto& [id, comm_rank, issued, completed] : comms) {
    c.push_back({{"comm", protocol::CommIdHex(id)}, {"nranks", 2}, {"comm_rank", comm_rank},
                 {"issued", issued}, {"completed", completed}});
    recent.push_back({{"comm", protocol::CommIdHex(id)}, {"seq", issued - 1}, {"op", "AllReduce"},
                      {"dtype", "float32"}, {"redop", "sum"}, {"count", 1024}, {"completed", completed == issued},
                      {"issue_ns", kT0 + static_cast<std::int64_t>(id)}});
  }
  return {{"rank", rank}, {"host", Host(rank)}, {"in_call", nullptr}, {"comms", c}, {"recent", recent}};
}

// Rank 3's host stopped before its 6th TP and DP calls: rank 1 waits in DP dd #5, rank 2 in TP
// bb #5; rank 0 is idle with everything done.
json Answer(const OutgoingCommand& c) {
  protocol::Ack a;
  a.header = {"job", c.host, kT0};
  a.command = c.command.id;
  a.command_type = c.command.type;
  a.status = "ok";
  const std::vector<std::int64_t> ranks = c.host == "node0" ? std::vector<std::int64_t>{0, 1} : std::vector<std::int64_t>{2, 3};
  a.ranks = ranks;
  for (std::int64_t r : ranks) {
    protocol::AckRankResult res;
    res.rank = r;
    res.state = "ok";
    switch (r) {
      case 0: res.progress = Progress(0, {{kTp01, 0, 5, 5}, {kDp02, 0, 5, 5}}); break;
      case 1: res.progress = Progress(1, {{kTp01, 1, 5, 5}, {kDp13, 0, 6, 5}}); break;
      case 2: res.progress = Progress(2, {{kTp23, 0, 6, 5}, {kDp02, 1, 5, 5}}); break;
      default: res.progress = Progress(3, {{kTp23, 1, 5, 5}, {kDp13, 1, 5, 5}}); break;
    }
    a.results.push_back(std::move(res));
  }
  return Validated(protocol::ToJson(a), protocol::kAck);
}

TEST(HangStageTest, StallsLeadToOneDiagnosisOfTheWholeJobNamingTheStuckRank) {
  const JobView view = View();
  HangStage stage(HangStageOptions{5, 30, 8});
  EXPECT_TRUE(stage.Next(view, kT0).empty()) << "nothing stalled: nothing asked";
  stage.OnStall(Stall(1, "stalled"));
  stage.OnStall(Stall(2, "stalled"));
  const std::vector<OutgoingCommand> asked = stage.Next(view, kT0 + kSec);
  ASSERT_EQ(asked.size(), 2u);
  std::set<std::string> hosts;
  for (const OutgoingCommand& c : asked) {
    hosts.insert(c.host);
    EXPECT_EQ(c.command.type, "progress");
    EXPECT_EQ(c.command.calls, 8);
    ASSERT_TRUE(c.command.deadline_ns);
    EXPECT_EQ(*c.command.deadline_ns, kT0 + 6 * kSec);
    EXPECT_TRUE(protocol::ValidateMessage(protocol::ToJson(c.command), protocol::kProgressCommand).ok());
  }
  EXPECT_EQ(hosts, (std::set<std::string>{"node0", "node1"}));
  EXPECT_FALSE(stage.episode().empty());
  EXPECT_TRUE(stage.investigating());
  EXPECT_TRUE(stage.Next(view, kT0 + 2 * kSec).empty()) << "waits for the answers";
  EXPECT_TRUE(stage.TakeRecords().empty());
  // Someone else's ack is not taken.
  OutgoingCommand other = asked[0];
  other.command.id = "ctl-1-2-3";
  EXPECT_FALSE(stage.OnAck(Answer(other)));
  for (const OutgoingCommand& c : asked) EXPECT_TRUE(stage.OnAck(Answer(c)));
  EXPECT_TRUE(stage.Next(view, kT0 + 2 * kSec).empty());
  const std::vector<HangRecord> records = stage.TakeRecords();
  // One root cause, two calls it never issued (TP bb #5, DP dd #5): one entry with both.
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].fields["comms"], json::array({protocol::CommIdHex(kTp23), protocol::CommIdHex(kDp13)}));
  EXPECT_EQ(records[0].fields["detail"]["findings"].size(), 2u);
  EXPECT_NE(records[0].summary.find("1 more call(s)"), std::string::npos) << records[0].summary;
  std::set<std::int64_t> waiting;
  for (const HangRecord& r : records) {
    EXPECT_EQ(r.stage, "hang") << r.summary;
    EXPECT_EQ(r.fields["id"], stage.episode());
    EXPECT_EQ(r.fields["ranks"], json::array({3})) << r.fields.dump();
    EXPECT_EQ(r.fields["detail"]["kind"], "not_issued");
    EXPECT_EQ(r.fields["detail"]["hosts"][0]["host"], "node1");
    EXPECT_NE(r.summary.find("rank 3 on node1"), std::string::npos) << r.summary;
    for (const json& w : r.fields["detail"]["waiting"]) waiting.insert(w.get<std::int64_t>());
    // What the controller writes must be a valid incident entry.
    json entry = r.fields;
    entry.update({{"v", protocol::kSchemaVersion}, {"type", "incident"}, {"job", "job"}, {"stage", r.stage}, {"summary", r.summary}});
    EXPECT_TRUE(protocol::ValidateMessage(entry, protocol::kIncident).ok()) << entry.dump();
  }
  EXPECT_EQ(waiting, (std::set<std::int64_t>{1, 2}));
  // Seen again 30 s later: asked again, the same findings are not written twice.
  const std::vector<OutgoingCommand> again = stage.Next(view, kT0 + 33 * kSec);
  ASSERT_EQ(again.size(), 2u);
  for (const OutgoingCommand& c : again) EXPECT_TRUE(stage.OnAck(Answer(c)));
  EXPECT_TRUE(stage.Next(view, kT0 + 34 * kSec).empty());
  EXPECT_TRUE(stage.TakeRecords().empty());
  EXPECT_EQ(stage.diagnoses(), 2u);
  // Both make progress again: the episode ends with a resolution under its id.
  const std::string id = stage.episode();
  stage.OnStall(Stall(1, "progressing"));
  EXPECT_TRUE(stage.Next(view, kT0 + 40 * kSec).empty());
  EXPECT_TRUE(stage.TakeRecords().empty()) << "rank 2 is still stalled";
  stage.OnStall(Stall(2, "progressing"));
  EXPECT_TRUE(stage.Next(view, kT0 + 41 * kSec).empty());
  const std::vector<HangRecord> end = stage.TakeRecords();
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].stage, "resolution");
  EXPECT_EQ(end[0].fields["id"], id);
  EXPECT_TRUE(stage.episode().empty());
}

// Ranks 2 and 3's TP all-reduce bb #5 never completes on their devices (a GPU or link hang);
// rank 1 waits in DP dd #5, which rank 3 never issued because it is held behind that work. One
// root cause: one entry, not_completing on bb, with rank 1's wait in its detail.
TEST(HangStageTest, RanksHeldBehindWorkThatDoesNotCompleteAreThatEntrys) {
  const JobView view = View();
  HangStage stage;
  stage.OnStall(Stall(1, "stalled"));
  stage.OnStall(Stall(2, "stalled"));
  stage.OnStall(Stall(3, "stalled"));
  const std::vector<OutgoingCommand> asked = stage.Next(view, kT0);
  ASSERT_EQ(asked.size(), 2u);
  for (const OutgoingCommand& c : asked) {
    json ack = Answer(c);
    for (json& r : ack["results"]) {
      const std::int64_t rank = r["rank"].get<std::int64_t>();
      if (rank == 2) r["progress"] = Progress(2, {{kTp23, 0, 6, 5}, {kDp02, 1, 5, 5}});
      if (rank == 3) r["progress"] = Progress(3, {{kTp23, 1, 6, 5}, {kDp13, 1, 5, 5}});
    }
    EXPECT_TRUE(stage.OnAck(Validated(ack, protocol::kAck)));
  }
  EXPECT_TRUE(stage.Next(view, kT0 + kSec).empty());
  const std::vector<HangRecord> records = stage.TakeRecords();
  ASSERT_EQ(records.size(), 1u) << records[0].summary;
  EXPECT_EQ(records[0].stage, "hang");
  EXPECT_EQ(records[0].fields["detail"]["kind"], "not_completing");
  EXPECT_EQ(records[0].fields["ranks"], json::array({2, 3}));
  EXPECT_EQ(records[0].fields["comms"], json::array({protocol::CommIdHex(kTp23), protocol::CommIdHex(kDp13)}));
  EXPECT_EQ(records[0].fields["detail"]["waiting"], json::array({1, 2, 3}));
  EXPECT_EQ(records[0].fields["detail"]["findings"].size(), 2u);
}

// Ranks 1 and 3's DP all-reduce #5 never completes; rank 0's TP call #5 with rank 1 is stuck
// behind rank 1's device, so rank 0 never issues its DP call #5 that rank 2 waits in. Rank 0
// looks like a second root (its device work does not complete), but it shares a communicator
// with a member of the stuck call: still one entry.
TEST(HangStageTest, ARankWhoseDeviceWaitsForAStuckPeerIsNotASecondCause) {
  constexpr std::uint64_t kD13 = 0x10, kB23 = 0x20, kA01 = 0x30, kC02 = 0x40;  // issue order follows the id
  const JobView view = View();
  HangStage stage;
  for (std::int64_t r : {0, 1, 2, 3}) stage.OnStall(Stall(r, "stalled"));
  const std::vector<OutgoingCommand> asked = stage.Next(view, kT0);
  ASSERT_EQ(asked.size(), 2u);
  for (const OutgoingCommand& c : asked) {
    json ack = Answer(c);
    for (json& r : ack["results"]) {
      switch (r["rank"].get<std::int64_t>()) {
        case 0: r["progress"] = Progress(0, {{kA01, 0, 6, 5}, {kC02, 0, 5, 5}}); break;
        case 1: r["progress"] = Progress(1, {{kD13, 0, 6, 5}, {kA01, 1, 6, 5}}); break;
        case 2: r["progress"] = Progress(2, {{kB23, 0, 5, 5}, {kC02, 1, 6, 5}}); break;
        default: r["progress"] = Progress(3, {{kB23, 1, 5, 5}, {kD13, 1, 6, 5}}); break;
      }
    }
    EXPECT_TRUE(stage.OnAck(Validated(ack, protocol::kAck)));
  }
  EXPECT_TRUE(stage.Next(view, kT0 + kSec).empty());
  const std::vector<HangRecord> records = stage.TakeRecords();
  ASSERT_EQ(records.size(), 1u) << records[0].summary << " | " << records.back().summary;
  EXPECT_EQ(records[0].fields["detail"]["kind"], "not_completing");
  EXPECT_EQ(records[0].fields["detail"]["comm"], protocol::CommIdHex(kD13));
  EXPECT_EQ(records[0].fields["ranks"], json::array({1, 3}));
  EXPECT_EQ(records[0].fields["detail"]["findings"].size(), 2u);
}

TEST(HangStageTest, SilentAgentsAreWaitedForOnlyUntilTheDeadline) {
  const JobView view = View();
  HangStage stage(HangStageOptions{5, 30, 16});
  stage.OnStall(Stall(2, "stalled"));
  const std::vector<OutgoingCommand> asked = stage.Next(view, kT0);
  ASSERT_EQ(asked.size(), 2u);
  EXPECT_TRUE(stage.Next(view, kT0 + 4 * kSec).empty());
  EXPECT_TRUE(stage.TakeRecords().empty()) << "still within the wait";
  EXPECT_TRUE(stage.Next(view, kT0 + 6 * kSec).empty());
  const std::vector<HangRecord> records = stage.TakeRecords();
  ASSERT_EQ(records.size(), 1u) << "nothing read, nothing named: said once";
  EXPECT_EQ(records[0].stage, "hang");
  EXPECT_EQ(records[0].fields["detail"]["kind"], "unexplained");
  EXPECT_EQ(records[0].fields["detail"]["agents_silent"].size(), 2u);
  EXPECT_EQ(records[0].fields["ranks"], json::array({2}));
  EXPECT_FALSE(stage.investigating());
}

TEST(HangStageTest, ReportsOfProcessesThatAreGoneAreDropped) {
  const JobView view = View();
  HangStage stage;
  stage.OnStall(Stall(2, "stalled", /*pid=*/4242));  // rank 2 is now another process
  stage.OnStall(Stall(9, "stalled"));                // no such rank any more
  EXPECT_TRUE(stage.Next(view, kT0).empty());
  EXPECT_TRUE(stage.stalled().empty());
  EXPECT_TRUE(stage.episode().empty());
  EXPECT_TRUE(stage.TakeRecords().empty());
  // Before the view is read (a restarted controller replaying the stalls stream) nothing is dropped.
  HangStage early;
  early.OnStall(Stall(2, "stalled"));
  EXPECT_TRUE(early.Next(JobView{}, kT0).empty()) << "no agent to ask yet";
  EXPECT_EQ(early.stalled().size(), 1u);
  EXPECT_EQ(early.Next(view, kT0 + kSec).size(), 2u) << "asked once the view has the rank";
}

TEST(HangStageTest, AFindingsStageFollowsItsKind) {
  EXPECT_STREQ(HangStageName(analyzer::FindingKind::kNotIssued), "hang");
  EXPECT_STREQ(HangStageName(analyzer::FindingKind::kNotCompleting), "hang");
  EXPECT_STREQ(HangStageName(analyzer::FindingKind::kMismatch), "mismatch");
  EXPECT_STREQ(HangStageName(analyzer::FindingKind::kDeadlock), "deadlock");
  EXPECT_STREQ(HangStageName(analyzer::FindingKind::kDisorder), "disorder");
}

// ---- MismatchStage: call_signatures compared across members --------------------------------

constexpr std::uint64_t kWorld = 0xee;  // all 4 ranks

// Rank `rank` issued AllReduces seq .. seq + n - 1 on the world communicator with `count`.
json Signatures(std::int64_t rank, std::uint64_t seq, std::uint64_t n, std::uint64_t count, std::int32_t dtype = 7) {
  protocol::CallSignatures m;
  m.header = {"job", Host(rank), kT0};
  m.rank = rank;
  m.pid = 1000 + rank;
  m.comms = {{kWorld, 4, {{seq, n, "AllReduce", dtype, count, 0, -1}}}};
  return Validated(protocol::ToJson(m), protocol::kCallSignatures);
}

TEST(MismatchStageTest, AgreeingCallsRaiseNothing) {
  const JobView view = View();
  MismatchStage stage;
  for (std::int64_t r = 0; r < 4; ++r) stage.OnSignatures(Signatures(r, 0, 500, 4096), kT0);
  EXPECT_TRUE(stage.Next(view, kT0 + 10 * kSec).empty());
  EXPECT_EQ(stage.ledger().compared(), 500u);
  EXPECT_EQ(stage.ledger().pending(), 0u);
  EXPECT_EQ(stage.calls(), 2000u);
  EXPECT_EQ(stage.messages(), 4u);
}

TEST(MismatchStageTest, ACountMismatchIsOneEntryNamingTheRankAndItsHost) {
  const JobView view = View();
  MismatchStage stage;
  for (std::int64_t r = 0; r < 4; ++r) stage.OnSignatures(Signatures(r, 0, 10, 4096), kT0);
  for (std::int64_t r = 0; r < 4; ++r) stage.OnSignatures(Signatures(r, 10, 1, r == 3 ? 4097 : 4096), kT0 + kSec / 10);
  const std::vector<HangRecord> out = stage.Next(view, kT0 + kSec / 10);
  ASSERT_EQ(out.size(), 1u);
  const HangRecord& e = out[0];
  EXPECT_EQ(e.stage, "mismatch");
  EXPECT_STREQ(e.severity, "critical");
  EXPECT_EQ(e.fields["id"], "mismatch-00000000000000ee-10");
  EXPECT_EQ(e.fields["ranks"], json({3}));
  EXPECT_EQ(e.fields["comms"], json({"00000000000000ee"}));
  EXPECT_EQ(e.fields["detail"]["kind"], "mismatch");
  EXPECT_EQ(e.fields["detail"]["seq"], 10);
  EXPECT_EQ(e.fields["detail"]["hosts"], json::parse(R"([{"rank": 3, "host": "node1"}])"));
  ASSERT_EQ(e.fields["detail"]["signatures"].size(), 4u);
  EXPECT_EQ(e.fields["detail"]["signatures"][3]["count"], 4097);
  EXPECT_NE(e.summary.find("rank 3 on node1"), std::string::npos) << e.summary;
  EXPECT_NE(e.summary.find("count 4097"), std::string::npos) << e.summary;
  EXPECT_TRUE(stage.Recorded(kWorld, 10));
  EXPECT_FALSE(stage.Recorded(kWorld, 9));
  EXPECT_TRUE(stage.Next(view, kT0 + 5 * kSec).empty()) << "raised once";
}

TEST(MismatchStageTest, AMemberNotHeardFromHoldsItBackOnlyForTheGrace) {
  const JobView view = View();
  MismatchStage stage(MismatchStageOptions{0.5, 8});
  stage.OnSignatures(Signatures(0, 0, 1, 64), kT0);
  stage.OnSignatures(Signatures(1, 0, 1, 64, /*dtype=*/6), kT0);
  stage.OnSignatures(Signatures(2, 0, 1, 64), kT0);
  EXPECT_TRUE(stage.Next(view, kT0 + kSec / 4).empty());
  const std::vector<HangRecord> out = stage.Next(view, kT0 + kSec / 2);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].fields["ranks"], json({1}));
  EXPECT_EQ(out[0].fields["detail"]["signatures"].size(), 3u);
}

TEST(MismatchStageTest, AnEntryThatCouldNotBeWrittenComesBackFirst) {
  const JobView view = View();
  MismatchStage stage;
  for (std::int64_t r = 0; r < 4; ++r) stage.OnSignatures(Signatures(r, 0, 1, r == 0 ? 1 : 2), kT0);
  std::vector<HangRecord> out = stage.Next(view, kT0);
  ASSERT_EQ(out.size(), 1u);
  stage.Unwritten(std::move(out));
  for (std::int64_t r = 0; r < 4; ++r) stage.OnSignatures(Signatures(r, 1, 1, r == 1 ? 1 : 2), kT0);
  out = stage.Next(view, kT0);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].fields["detail"]["seq"], 0);
  EXPECT_EQ(out[1].fields["detail"]["seq"], 1);
}

// Rank `rank` completed blocks first .. first + blocks - 1 of AllReduces of `count` (block `odd`
// with one call of count + 1), sent as digests.
json Digests(std::int64_t rank, std::uint64_t first, std::uint64_t blocks, std::uint64_t count,
             std::uint64_t odd = ~std::uint64_t{0}) {
  protocol::CallSignatures m;
  m.header = {"job", Host(rank), kT0};
  m.rank = rank;
  m.pid = 1000 + rank;
  protocol::CommDigests c{kWorld, 4, {}};
  for (std::uint64_t b = first; b < first + blocks; ++b) {
    protocol::SignatureBlock block{b * protocol::kSignatureBlockCalls, protocol::kSignatureBlockCalls, 0};
    for (std::uint64_t s = block.seq; s < block.seq + block.n; ++s) {
      const std::uint64_t k = b == odd && s == block.seq + 7 ? count + 1 : count;
      block.digest += protocol::SignatureDigestTerm(s, kFalconOpAllReduce, 7, k, 0, -1);
    }
    c.blocks.push_back(block);
  }
  m.digests = {c};
  return Validated(protocol::ToJson(m), protocol::kCallSignatures);
}

TEST(MismatchStageTest, BlocksAreComparedByDigestAndADifferenceNamesTheRankAndTheBlock) {
  const JobView view = View();
  MismatchStage stage;
  for (std::int64_t r = 0; r < 4; ++r) stage.OnSignatures(Digests(r, 4, 3, 4096, r == 2 ? 5 : ~std::uint64_t{0}), kT0);
  const std::vector<HangRecord> out = stage.Next(view, kT0 + kSec);
  ASSERT_EQ(out.size(), 1u);
  const HangRecord& e = out[0];
  EXPECT_EQ(e.stage, "mismatch");
  EXPECT_EQ(e.fields["id"], "mismatch-00000000000000ee-5120-block");
  EXPECT_EQ(e.fields["ranks"], json({2}));
  EXPECT_EQ(e.fields["detail"]["first_seq"], 5120);
  EXPECT_EQ(e.fields["detail"]["last_seq"], 6143);
  ASSERT_EQ(e.fields["detail"]["signatures"].size(), 4u);
  EXPECT_EQ(e.fields["detail"]["signatures"][2]["calls"], 1024);
  EXPECT_NE(e.fields["detail"]["signatures"][2]["digest"], e.fields["detail"]["signatures"][0]["digest"]);
  EXPECT_EQ(e.fields["detail"]["signatures"][1]["digest"], e.fields["detail"]["signatures"][0]["digest"]);
  EXPECT_NE(e.summary.find("rank 2 on node1"), std::string::npos) << e.summary;
  EXPECT_NE(e.summary.find("calls #5120..#6143"), std::string::npos) << e.summary;
  EXPECT_NE(e.summary.find("signature_full_seqs"), std::string::npos) << e.summary;
  EXPECT_EQ(stage.blocks().compared(), 2u);
  EXPECT_EQ(stage.calls(), 4u * 3 * protocol::kSignatureBlockCalls);
  EXPECT_TRUE(stage.ledger().pending() == 0 && stage.blocks().pending() == 0);
  EXPECT_TRUE(stage.Next(view, kT0 + 5 * kSec).empty()) << "raised once";
}

TEST(MismatchStageTest, ABlockWithACallMissingDiffersToo) {
  const JobView view = View();
  MismatchStage stage;
  for (std::int64_t r = 0; r < 4; ++r) {
    json m = Digests(r, 1, 1, 64);
    if (r == 1) {
      m["digests"][0]["blocks"][0]["n"] = 1023;  // one call fewer, the same digest
    }
    stage.OnSignatures(m, kT0);
  }
  const std::vector<HangRecord> out = stage.Next(view, kT0 + kSec);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].fields["ranks"], json({1}));
  EXPECT_NE(out[0].summary.find("1023 calls"), std::string::npos) << out[0].summary;
}

}  // namespace
}  // namespace falcon::controller
