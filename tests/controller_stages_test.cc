// The controller's stages on their own, without Redis: the tracking stage (tracking_stage.h:
// slow ranks, outbreaks, the job's iteration time), the validation stage (validation_stage.h: a
// round planned from the suspicion, the verdict worded by host), the profiling stage
// (daemon/controller/profiling_stage.h: set_mode commands and their acks, the profile window, the
// suspicion document) and the decision stage (decision_stage.h: the S1 decision, the planner fed
// at most once per sample, publication, the rollback of a decision that could not be published).
// Messages are built with the protocol's ToJson and validated as the controller gets them; the
// stages' log lines are captured and their event names checked.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/controller/decision_stage.h"
#include "daemon/controller/profiling_stage.h"
#include "daemon/controller/tracking_stage.h"
#include "daemon/controller/validation_stage.h"
#include "daemon/protocol/messages.h"
#include "daemon/protocol/validate.h"
#include "tests/support/controller_job.h"

namespace falcon::controller {
namespace {

using nlohmann::json;
using namespace testjob;  // the test job (tests/support/controller_job.h)

// Rank r's profile window from since_ns, in `mode`; communicator `slow` takes twice as long.
json Profile(std::int64_t r, std::int64_t since_ns, const std::string& mode = "profile", std::uint64_t slow = 0) {
  protocol::CommProfileReport m;
  m.header = {"job", HostOfRank(r), since_ns + 10 * kSec};
  m.rank = r;
  m.pid = 1000 + r;
  m.since_ns = since_ns;
  m.mode = mode;
  const auto rank = static_cast<std::int32_t>(r);
  auto comm = [&](std::uint64_t id, std::int32_t comm_rank, std::int32_t nranks, const char* op, double us) {
    protocol::SignatureProfile p{op, 1 << 20, -1, 100 + static_cast<std::uint64_t>(r % 3), {}, {}, {}};
    if (mode != "track") p.mean_us = p.median_us = id == slow ? 2 * us : us;
    return protocol::CommProfile{id, comm_rank, nranks, {p}};
  };
  m.comms = {comm(TpId(r / 2), rank % 2, 2, "AllReduce", 400), comm(DpId(r % 2), rank / 2, 4, "ReduceScatter", 2000)};
  return Validated(protocol::ToJson(m), protocol::kCommProfile);
}

json Ack(const protocol::Command& c, const std::string& host, std::int64_t at_ns, const char* status = "ok") {
  protocol::Ack a;
  a.header = {"job", host, at_ns};
  a.command = c.id;
  a.command_type = c.type;
  a.status = status;
  return Validated(protocol::ToJson(a), protocol::kAck);
}

// A logger whose lines land in `out`.
std::shared_ptr<spdlog::logger> LogTo(std::ostringstream& out) {
  auto log = std::make_shared<spdlog::logger>("stage", std::make_shared<spdlog::sinks::ostream_sink_st>(out));
  log->set_level(spdlog::level::debug);
  return log;
}

std::vector<std::string> Strings(const json& a) { return a.get<std::vector<std::string>>(); }

// ---------------------------------------------------------------------------------------------
// ProfilingStage

TEST(ProfilingStageTest, ASwitchIsOneSetModeCommandPerAgentHostWithItsDeadline) {
  std::ostringstream log;
  ProfilingStage p({"ctl-7", 5, 1.1}, LogTo(log));
  EXPECT_EQ(p.mode(), "track");
  const JobView v = RunningJob();
  const std::vector<OutgoingCommand> out = p.SetMode("profile", v, kT0);
  ASSERT_EQ(out.size(), 2u);
  std::set<std::string> hosts, ids;
  for (const OutgoingCommand& c : out) {
    hosts.insert(c.host);
    ids.insert(c.command.id);
    EXPECT_EQ(c.command.type, "set_mode");
    EXPECT_EQ(c.command.mode, "profile");
    EXPECT_EQ(c.command.issued_ns, kT0);
    EXPECT_EQ(c.command.deadline_ns.value_or(0), kT0 + 5 * kSec);
  }
  EXPECT_EQ(hosts, (std::set<std::string>{"node0", "node1"}));
  EXPECT_EQ(ids, (std::set<std::string>{"ctl-7-m1", "ctl-7-m2"}));
  EXPECT_EQ(p.mode(), "profile");
  EXPECT_EQ(p.awaiting_acks(), 2u);

  // A second switch: the first one's acks no longer count, and its ids are new.
  const std::vector<OutgoingCommand> back = p.SetMode("track", v, kT0 + kSec);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].command.id, "ctl-7-m3");
  EXPECT_EQ(p.mode(), "track");
  std::int64_t from = kT0;
  EXPECT_FALSE(p.OnAck(Ack(out[0].command, out[0].host, kT0 + 2 * kSec), &from)) << "an earlier switch's ack";
  EXPECT_EQ(from, kT0);
  EXPECT_EQ(p.awaiting_acks(), 2u);

  p.AssumeMode("profile");  // a predecessor switched the shims: nothing goes out
  EXPECT_EQ(p.mode(), "profile");
}

// Agents that all read the broadcast stream get one set_mode for all of them; each host's ack
// is awaited and opens that host's window.
TEST(ProfilingStageTest, ASwitchForAgentsThatReadTheBroadcastStreamIsOneCommand) {
  std::ostringstream log;
  ProfilingStage p({"ctl-8", 5, 1.1}, LogTo(log));
  const JobView v = RunningJob({}, true);
  const std::vector<OutgoingCommand> out = p.SetMode("profile", v, kT0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].host, "");
  EXPECT_EQ(out[0].command.id, "ctl-8-m1");
  EXPECT_FALSE(out[0].command.ranks.has_value()) << "every agent's ranks";
  EXPECT_EQ(p.awaiting_acks(), 2u) << "one ack from each host";
  std::int64_t from = kT0;
  EXPECT_TRUE(p.OnAck(Ack(out[0].command, "node1", kT0 + 2 * kSec), &from));
  EXPECT_FALSE(p.OnAck(Ack(out[0].command, "node1", kT0 + 3 * kSec), &from)) << "taken already";
  EXPECT_FALSE(p.OnAck(Ack(out[0].command, "node7", kT0 + 3 * kSec), &from)) << "not a host of the job";
  EXPECT_EQ(p.awaiting_acks(), 1u);
  EXPECT_TRUE(p.OnAck(Ack(out[0].command, "node0", kT0 + kSec), &from));
  EXPECT_EQ(p.awaiting_acks(), 0u);
  EXPECT_EQ(from, kT0 + 2 * kSec);
}

TEST(ProfilingStageTest, AcksAreTakenAndMoveTheWindowToTheLastSwitch) {
  std::ostringstream log;
  ProfilingStage p({"ctl", 5, 1.1}, LogTo(log));
  const JobView v = RunningJob();
  const std::vector<OutgoingCommand> out = p.SetMode("profile", v, kT0);
  ASSERT_EQ(out.size(), 2u);
  std::int64_t from = kT0;
  EXPECT_TRUE(p.OnAck(Ack(out[1].command, out[1].host, kT0 + 3 * kSec), &from));
  EXPECT_EQ(from, kT0 + 3 * kSec);
  EXPECT_EQ(p.awaiting_acks(), 1u);
  EXPECT_FALSE(p.OnAck(Ack(out[1].command, out[1].host, kT0 + 4 * kSec), &from)) << "taken already";
  EXPECT_TRUE(p.OnAck(Ack(out[0].command, out[0].host, kT0 + 2 * kSec, "failed"), &from));
  EXPECT_EQ(from, kT0 + 3 * kSec) << "an earlier ack does not move the window back";
  EXPECT_EQ(p.awaiting_acks(), 0u);
  EXPECT_NE(log.str().find("event=set_mode_not_ok host=node0 status=failed"), std::string::npos) << log.str();

  protocol::Command other;
  other.type = "pause";
  other.id = "inc-1-v1-1";
  EXPECT_FALSE(p.OnAck(Ack(other, "node0", kT0 + 9 * kSec), &from)) << "not a set_mode of this stage";
  EXPECT_EQ(from, kT0 + 3 * kSec);
}

TEST(ProfilingStageTest, ReadyOnlyWhenEveryLiveRankHasAProfileModeWindowSinceItsAgentsAck) {
  std::ostringstream log;
  ProfilingStage p({"ctl", 5, 1.1}, LogTo(log));
  const JobView v = RunningJob();
  EXPECT_FALSE(p.Ready(JobView(), kT0)) << "no live rank";
  const std::vector<OutgoingCommand> out = p.SetMode("profile", v, kT0);
  ASSERT_EQ(out.size(), 2u);
  // node0 (ranks 0-3) switched at +1 s, node1 (ranks 4-7) at +3 s; each opened a window then.
  const std::map<std::string, std::int64_t> acked = {{"node0", kT0 + kSec}, {"node1", kT0 + 3 * kSec}};
  for (std::int64_t r = 0; r < kRanks; ++r) p.OnProfile(Profile(r, acked.at(HostOfRank(r))));
  EXPECT_FALSE(p.Ready(v, kT0)) << "set_mode acks outstanding";
  std::int64_t from = kT0;
  for (const OutgoingCommand& c : out) ASSERT_TRUE(p.OnAck(Ack(c.command, c.host, acked.at(c.host)), &from));
  EXPECT_EQ(from, kT0 + 3 * kSec);
  EXPECT_TRUE(p.Ready(v, from)) << "node0's windows began before node1's ack, but after node0's own";

  p.OnProfile(Profile(5, kT0 + 3 * kSec - 1));  // rank 5's newest began before its agent switched
  EXPECT_FALSE(p.Ready(v, from));
  p.OnProfile(Profile(5, kT0 + 3 * kSec, "track"));  // in the window, but untimed
  EXPECT_FALSE(p.Ready(v, from));
  p.OnProfile(Profile(5, kT0 + 4 * kSec));
  EXPECT_TRUE(p.Ready(v, from));
  EXPECT_EQ(p.Analyze(v, from)["profiles"], kRanks);

  // The switch back to track (then the analysis) keeps every window the profile switch opened.
  const std::vector<OutgoingCommand> back = p.SetMode("track", v, kT0 + 14 * kSec);
  EXPECT_EQ(p.Analyze(v, from)["profiles"], kRanks) << "before the track acks";
  for (const OutgoingCommand& c : back) ASSERT_TRUE(p.OnAck(Ack(c.command, c.host, kT0 + 15 * kSec), &from));
  EXPECT_EQ(p.Analyze(v, kT0 + 3 * kSec)["profiles"], kRanks) << "after them";
  p.OnProfile(Profile(1, kT0));  // rank 1's newest began before node0's ack
  EXPECT_EQ(p.Analyze(v, kT0 + 3 * kSec)["profiles"], kRanks - 1);

  // A switch forgets the last one's acks: until its own acks, windows count from `from`.
  (void)p.SetMode("profile", v, kT0 + 5 * kSec);
  for (std::int64_t r = 0; r < kRanks; ++r) p.OnProfile(Profile(r, kT0 + 4 * kSec));
  EXPECT_EQ(p.Analyze(v, kT0 + 5 * kSec)["profiles"], 0) << "windows of the last switch";
  EXPECT_EQ(p.Analyze(v, kT0 + 4 * kSec)["profiles"], kRanks);
  ProfilingStage restarted({"ctl", 5, 1.1}, LogTo(log));  // a controller restarted while profiling
  for (std::int64_t r = 0; r < kRanks; ++r) restarted.OnProfile(Profile(r, kT0 + 6 * kSec));
  EXPECT_TRUE(restarted.Ready(v, kT0 + 6 * kSec));
  EXPECT_FALSE(restarted.Ready(v, kT0 + 7 * kSec)) << "every window is older than that";
  EXPECT_EQ(restarted.Analyze(v, kT0 + 7 * kSec)["profiles"], 0);
  EXPECT_EQ(restarted.Analyze(v, kT0 + 6 * kSec)["profiles"], kRanks);
}

TEST(ProfilingStageTest, ASlowGroupIsSuspiciousAndItsClassMatesArePeers) {
  std::ostringstream log;
  ProfilingStage p({"ctl", 5, 1.1}, LogTo(log));
  const JobView v = RunningJob();
  for (std::int64_t r = 0; r < kRanks; ++r) p.OnProfile(Profile(r, kT0, "profile", TpId(2)));
  const json s = p.Analyze(v, kT0);
  EXPECT_EQ(s["profiles"], kRanks);
  EXPECT_EQ(Strings(s["suspicious"]), std::vector<std::string>{protocol::CommIdHex(TpId(2))});
  const std::vector<std::string> peers = Strings(s["peers"]);
  EXPECT_EQ(std::set<std::string>(peers.begin(), peers.end()),
            (std::set<std::string>{protocol::CommIdHex(TpId(0)), protocol::CommIdHex(TpId(1)),
                                   protocol::CommIdHex(TpId(3))}));
  EXPECT_TRUE(s["compute_suspects"].empty());
  EXPECT_EQ(s["comms"].size(), 6u) << s.dump();
  EXPECT_FALSE(s.contains("sweep"));
  EXPECT_NE(log.str().find("event=profiled profiles=8 suspicious=1 peers=3 compute_suspects=0"), std::string::npos)
      << log.str();
}

TEST(ProfilingStageTest, NothingSuspiciousSweepsEveryCommunicatorOfTwoOrMore) {
  std::ostringstream log;
  ProfilingStage p({"ctl", 5, 1.1}, LogTo(log));
  const JobView v = RunningJob();
  for (std::int64_t r = 0; r < kRanks; ++r) p.OnProfile(Profile(r, kT0));
  p.OnProfile(Profile(3, kT0 - kSec, "profile", TpId(1)));  // rank 3's newest counts; this one is older
  p.OnProfile(Profile(3, kT0));
  const json s = p.Analyze(v, kT0);
  EXPECT_EQ(s["sweep"], true);
  std::vector<std::string> want;
  for (const auto& [id, c] : v.comms()) want.push_back(protocol::CommIdHex(id));
  EXPECT_EQ(want.size(), 7u) << "world, 4 TP, 2 DP";
  EXPECT_EQ(Strings(s["suspicious"]), want);
  EXPECT_TRUE(s["peers"].empty());

  // Windows from before `from` do not count: no profiles, nothing timed, still a sweep.
  const json none = p.Analyze(v, kT0 + kSec);
  EXPECT_EQ(none["profiles"], 0);
  EXPECT_EQ(none["sweep"], true);
  EXPECT_EQ(Strings(none["suspicious"]), want);
}

// A job of `pairs` TP pairs and a world communicator, 8 ranks a node, every rank profiled with
// the same AllReduce time in its pair (nothing suspicious); pair `slow` (if any) twice as long.
struct WideJob {
  JobView view;
  std::map<std::int64_t, json> profiles;
};
WideJob Wide(std::int64_t pairs, std::int64_t slow = -1) {
  const std::int64_t n = 2 * pairs;
  std::vector<json> ranks;
  std::set<std::string> hosts;
  for (std::int64_t r = 0; r < n; ++r) {
    const auto rank = static_cast<std::int32_t>(r);
    const std::string host = "node" + std::to_string(r / 8);
    hosts.insert(host);
    ranks.push_back(RankMsg({.rank = r,
                             .host = host,
                             .comms = {{kWorld, rank, static_cast<std::int32_t>(n), "world", 100},
                                       {TpId(r / 2), rank % 2, 2, "tp", 100}}}));
  }
  std::vector<json> agents;
  for (const std::string& h : hosts) agents.push_back(AgentMsg(h));
  WideJob j;
  j.view.Update(ranks, agents);
  for (std::int64_t r = 0; r < n; ++r) {
    protocol::CommProfileReport m;
    m.header = {"job", "node" + std::to_string(r / 8), kT0 + 10 * kSec};
    m.rank = r;
    m.pid = 1000 + r;
    m.since_ns = kT0;
    m.mode = "profile";
    protocol::SignatureProfile p{"AllReduce", 1 << 20, -1, 100, {}, {}, {}};
    p.mean_us = p.median_us = r / 2 == slow ? 800 : 400;
    m.comms = {protocol::CommProfile{TpId(r / 2), static_cast<std::int32_t>(r % 2), 2, {p}}};
    j.profiles[r] = Validated(protocol::ToJson(m), protocol::kCommProfile);
  }
  return j;
}

TEST(ProfilingStageTest, ALargeJobsSuspicionGrowsWithWhatIsSuspiciousNotWithTheJob) {
  constexpr std::int64_t kPairs = 300;  // 301 communicators: past kListedComms
  static_assert(kPairs + 1 > ProfilingStage::kListedComms);
  {
    // Nothing suspicious: a sweep of every communicator, counted, not listed; the evidence of
    // 300 healthy pairs counted by verdict.
    std::ostringstream log;
    ProfilingStage p({"ctl", 5, 1.1}, LogTo(log));
    WideJob j = Wide(kPairs);
    for (const auto& [r, m] : j.profiles) p.OnProfile(m);
    const json s = p.Analyze(j.view, kT0);
    EXPECT_EQ(s["sweep"], true);
    EXPECT_FALSE(s.contains("suspicious")) << "a sweep past kListedComms is its count";
    EXPECT_EQ(s["suspicious_count"], kPairs + 1);
    ASSERT_TRUE(s["comms"].is_array());
    EXPECT_TRUE(s["comms"].empty()) << s["comms"].dump();
    EXPECT_EQ(s["omitted"].value("healthy", 0), kPairs) << s["omitted"].dump();
    EXPECT_LT(s.dump().size(), 1000u);
    EXPECT_NE(log.str().find("event=profiled profiles=600 suspicious=301 peers="), std::string::npos) << log.str();

    // The round plans the same steps from the count as from the list it stands for.
    ValidationStage counted(ValidationSettings{}, StepOptions{}), listed(ValidationSettings{}, StepOptions{});
    json full = s;
    full["suspicious"] = json::array();
    for (std::uint64_t id : SweepComms(j.view)) full["suspicious"].push_back(protocol::CommIdHex(id));
    ASSERT_EQ(full["suspicious"].size(), static_cast<std::size_t>(kPairs + 1));
    ASSERT_TRUE(counted.Start(j.view, s, "inc-1-v1", false).ok());
    ASSERT_TRUE(listed.Start(j.view, full, "inc-1-v1", false).ok());
    const json a = counted.Finish(j.view).detail["validation"], b = listed.Finish(j.view).detail["validation"];
    EXPECT_GT(a["steps_planned"].get<int>(), 1);
    EXPECT_EQ(a["steps_planned"], b["steps_planned"]);
    ValidationStage none(ValidationSettings{}, StepOptions{});
    ASSERT_TRUE(none.Start(j.view, {{"sweep", true}, {"suspicious", json::array()}}, "inc-1-v1", false).ok());
    EXPECT_LT(none.Finish(j.view).detail["validation"]["steps_planned"].get<int>(), a["steps_planned"].get<int>())
        << "an empty list is not a sweep's count";
  }
  {
    // One slow pair: its evidence is kept whole, the healthy pairs' counted; no sweep.
    std::ostringstream log;
    ProfilingStage p({"ctl", 5, 1.1}, LogTo(log));
    WideJob j = Wide(kPairs, 7);
    for (const auto& [r, m] : j.profiles) p.OnProfile(m);
    const json s = p.Analyze(j.view, kT0);
    EXPECT_FALSE(s.contains("sweep"));
    EXPECT_EQ(Strings(s["suspicious"]), std::vector<std::string>{protocol::CommIdHex(TpId(7))});
    ASSERT_EQ(s["comms"].size(), 1u) << s["comms"].dump();
    EXPECT_EQ(s["comms"][0]["comm"], protocol::CommIdHex(TpId(7)));
    EXPECT_EQ(s["comms"][0]["verdict"], "suspicious");
    std::size_t omitted = 0;
    for (const auto& [verdict, n] : s["omitted"].items()) omitted += n.get<std::size_t>();
    EXPECT_EQ(omitted + 1, static_cast<std::size_t>(kPairs)) << s["omitted"].dump();
  }
}

// ---------------------------------------------------------------------------------------------
// DecisionStage

MitigationSettings Settings(const std::string& mode = "advise") {
  MitigationSettings s;
  s.mode = mode;
  s.overheads = {10, 60, 300};
  s.micro_batches = 8;
  s.sample_s = 1;
  return s;
}

// Its planning takes 250 ms by this clock.
DecisionStage Stage(std::ostringstream& log, const std::string& mode = "advise") {
  auto clock = [t = std::int64_t{0}]() mutable { return t += 250'000'000; };
  return DecisionStage({Settings(mode), "job", "ctl-7", clock}, LogTo(log));
}

// Rank 5's GPU is slow; the job's healthy iteration is 1 s. Opened at kT0.
Incident SlowGpuIncident() {
  Incident inc;
  inc.id = "inc-1";
  inc.opened_ns = kT0;
  inc.ranks = {5};
  inc.healthy_s = 1.0;
  inc.localised = true;
  inc.cause = "compute";
  inc.findings = {{"gpus", {{{"rank", 5}, {"host", HostOfRank(5)}, {"evidence", {{"ratio", 2.0}}}}}}};
  return inc;
}

TEST(DecisionStageTest, StartIsAnS1DecisionNamingTheCandidates) {
  std::ostringstream log;
  DecisionStage d = Stage(log);
  const JobView v = RunningJob();
  Incident inc = SlowGpuIncident();
  const std::optional<DecisionRecord> r = d.Start(inc, InferLayout(v, ""), v, 2.0, kT0 + 5 * kSec);
  ASSERT_TRUE(r) << log.str();
  EXPECT_EQ(r->summary.rfind("S1 ignore for now; candidates: S2 after 10 s of slowdown", 0), 0u) << r->summary;
  EXPECT_STREQ(r->severity, "info");
  EXPECT_EQ(r->fields["strategy"], "S1");
  EXPECT_EQ(r->fields["cause"], "compute");
  EXPECT_EQ(r->fields["ranks"], json({5}));
  EXPECT_EQ(r->fields["at_ns"], kT0 + 5 * kSec);
  const json& detail = r->fields["detail"];
  EXPECT_EQ(detail["mode"], "advise");
  EXPECT_DOUBLE_EQ(detail["planning_s"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(d.plan_s(), 0.25);
  ASSERT_TRUE(detail["candidates"].contains("S2")) << detail.dump();
  EXPECT_TRUE(detail["candidates"]["S2"].contains("plan")) << detail.dump();
  EXPECT_EQ(inc.mitigation["candidates"], detail["candidates"]) << "the planner is persisted in the incident";
  EXPECT_EQ(inc.last_feed_ns, 0);
  EXPECT_TRUE(d.TakeChanged());
  EXPECT_FALSE(d.TakeChanged());
  ASSERT_NE(d.Current(inc), nullptr);
  EXPECT_EQ(d.Current(inc)->current(), "S1");

  Incident nothing = SlowGpuIncident();
  nothing.findings = json::object();  // a cause without culprits: no mitigation
  EXPECT_FALSE(d.Start(nothing, InferLayout(v, ""), v, 2.0, kT0));
  EXPECT_TRUE(nothing.mitigation.is_null());
  EXPECT_NE(log.str().find("event=mitigation_not_started incident=inc-1"), std::string::npos) << log.str();
}

TEST(DecisionStageTest, TheFeedWaitsForEachSampleAndSwitchesOnceTheSlowdownPaysForS2) {
  std::ostringstream log;
  DecisionStage d = Stage(log);
  const JobView v = RunningJob();
  Incident inc = SlowGpuIncident();
  ASSERT_TRUE(d.Start(inc, InferLayout(v, ""), v, 2.0, kT0 + 3 * kSec));
  EXPECT_FALSE(d.Feed(inc, v, std::nullopt, kT0 + 3 * kSec)) << "no iteration time yet";
  EXPECT_EQ(inc.last_feed_ns, 0);
  // The first sample covers the 4 s since detection: 2 iterations, 2 s of slowdown.
  EXPECT_FALSE(d.Feed(inc, v, 2.0, kT0 + 4 * kSec));
  EXPECT_EQ(inc.last_feed_ns, kT0 + 4 * kSec);
  EXPECT_FALSE(d.Feed(inc, v, 2.0, kT0 + 4 * kSec + kSec / 2)) << "before sample_s";
  EXPECT_EQ(inc.last_feed_ns, kT0 + 4 * kSec) << "a sample not due is not taken";
  // Then 1 s of slowdown per sample: S2 (10 s) at the 8th.
  std::optional<Decision> s2;
  int samples = 0;
  for (std::int64_t t = kT0 + 5 * kSec; !s2 && t <= kT0 + 30 * kSec; t += kSec, ++samples) s2 = d.Feed(inc, v, 2.0, t);
  ASSERT_TRUE(s2);
  EXPECT_EQ(samples, 8);
  EXPECT_EQ(s2->strategy, "S2");
  EXPECT_TRUE(s2->publish_plan);
  EXPECT_EQ(d.Current(inc)->current(), "S2");
}

TEST(DecisionStageTest, AnUnpublishedDecisionRollsBackAndIsDecidedAgain) {
  std::ostringstream log;
  DecisionStage d = Stage(log);
  const JobView v = RunningJob();
  Incident inc = SlowGpuIncident();
  ASSERT_TRUE(d.Start(inc, InferLayout(v, ""), v, 2.0, kT0));
  std::optional<Decision> first;
  std::int64_t t = kT0;
  while (!first && t < kT0 + 30 * kSec) {
    t += kSec;
    first = d.Feed(inc, v, 2.0, t);
  }
  ASSERT_TRUE(first);
  ASSERT_EQ(first->strategy, "S2");
  const json decided = inc.mitigation;
  d.TakeChanged();

  d.Unpublished(inc, Status::Unavailable("redis away"));
  EXPECT_TRUE(d.TakeChanged());
  EXPECT_EQ(inc.last_feed_ns, t - kSec) << "the sample is taken again";
  EXPECT_NE(inc.mitigation, decided);
  ASSERT_NE(d.Current(inc), nullptr);
  EXPECT_EQ(d.Current(inc)->current(), "S1") << "rebuilt from the state before the decision";
  EXPECT_NE(log.str().find("event=decision_deferred incident=inc-1 error=\"redis away\""), std::string::npos)
      << log.str();

  const std::optional<Decision> again = d.Feed(inc, v, 2.0, t);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->strategy, "S2");
  EXPECT_EQ(again->plan, first->plan);
  EXPECT_EQ(inc.mitigation, decided);

  // The stop: unpublished, it is decided again too (S2's undo with it).
  const Result<Decision> end = d.End(inc, t + kSec);
  ASSERT_TRUE(end.ok()) << end.status().ToString();
  EXPECT_EQ(end.value().strategy, "S1");
  EXPECT_TRUE(end.value().publish_plan) << "S2 is undone";
  EXPECT_TRUE(d.Current(inc)->stopped());
  d.Unpublished(inc, Status::Unavailable("redis away"));
  EXPECT_FALSE(d.Current(inc)->stopped());
  EXPECT_EQ(inc.mitigation, decided);
}

TEST(DecisionStageTest, PublicationHasThePlanItsVersionAndInActModeOneCommandPerAgent) {
  for (const std::string mode : {"advise", "act"}) {
    SCOPED_TRACE(mode);
    std::ostringstream log;
    DecisionStage d = Stage(log, mode);
    const JobView v = RunningJob();
    Incident inc = SlowGpuIncident();
    ASSERT_TRUE(d.Start(inc, InferLayout(v, ""), v, 2.0, kT0));
    std::optional<Decision> s2;
    for (std::int64_t t = kT0 + kSec; !s2 && t < kT0 + 30 * kSec; t += kSec) s2 = d.Feed(inc, v, 2.0, t);
    ASSERT_TRUE(s2);
    const DecisionPublication p = d.Publish(*s2, inc, v, 4, kT0 + 40 * kSec);
    EXPECT_EQ(p.record.summary, s2->summary);
    EXPECT_STREQ(p.record.severity, "warning");
    EXPECT_EQ(p.record.fields["strategy"], "S2");
    EXPECT_EQ(p.record.fields["detail"]["plan"]["plan_version"], 4);
    EXPECT_EQ(p.record.fields["detail"]["mode"], mode);
    ASSERT_TRUE(p.plan.is_object());
    EXPECT_TRUE(protocol::ValidateMessage(p.plan, protocol::kMitigationPlan).ok()) << p.plan.dump();
    EXPECT_EQ(p.plan["plan_version"], 4);
    EXPECT_EQ(p.plan["incident"], "inc-1");
    EXPECT_EQ(p.plan["job"], "job");
    EXPECT_EQ(p.plan["micro_batches"], s2->plan["micro_batches"]);
    if (mode == "advise") {
      EXPECT_TRUE(p.commands.empty());
      continue;
    }
    ASSERT_EQ(p.commands.size(), 2u);
    EXPECT_EQ(p.commands[0].host, "node0");
    EXPECT_EQ(p.commands[1].host, "node1");
    EXPECT_EQ(p.commands[0].command.id, "ctl-7-p1");
    EXPECT_EQ(p.commands[1].command.type, "plan");
    EXPECT_EQ(p.commands[1].command.plan_version, 4);
    EXPECT_EQ(p.commands[1].command.strategy, "S2");
  }
}

TEST(DecisionStageTest, APersistedPlannerIsRebuiltAndAnUnreadableOneDropped) {
  std::ostringstream log;
  const JobView v = RunningJob();
  Incident inc = SlowGpuIncident();
  {
    DecisionStage first = Stage(log);
    ASSERT_TRUE(first.Start(inc, InferLayout(v, ""), v, 2.0, kT0));
  }
  DecisionStage restarted = Stage(log);
  ASSERT_NE(restarted.Current(inc), nullptr);
  EXPECT_EQ(restarted.Current(inc)->current(), "S1");
  EXPECT_FALSE(restarted.TakeChanged());

  DecisionStage other = Stage(log);
  inc.mitigation = {{"not", "a planner"}};
  EXPECT_EQ(other.Current(inc), nullptr);
  EXPECT_TRUE(inc.mitigation.is_null());
  EXPECT_TRUE(other.TakeChanged());
  EXPECT_NE(log.str().find("event=mitigation_state_dropped incident=inc-1"), std::string::npos) << log.str();
}

// ---------------------------------------------------------------------------------------------
// TrackingStage

json Alarm(std::int64_t rank, const std::string& kind, double level_s, std::int64_t onset_ns) {
  protocol::AlarmReport m;
  m.header = {"job", HostOfRank(rank), onset_ns + kSec};
  m.rank = rank;
  m.pid = 1000 + rank;
  m.kind = kind;
  m.onset = 10;
  m.at = 12;
  m.onset_ns = onset_ns;
  m.ratio = level_s / 0.1;
  m.probability = 0.9;
  m.level_s = level_s;
  m.baseline_s = 0.1;
  return Validated(protocol::ToJson(m), protocol::kAlarm);
}

json Iterations(std::int64_t rank, const std::vector<double>& seconds) {
  protocol::IterationBatch m;
  m.header = {"job", HostOfRank(rank), kT0};
  m.rank = rank;
  m.pid = 1000 + rank;
  m.period = 9;
  for (std::size_t i = 0; i < seconds.size(); ++i) m.start_ns.push_back(kT0 + static_cast<std::int64_t>(i) * kSec);
  m.seconds = seconds;
  return Validated(protocol::ToJson(m), protocol::kIterations);
}

TEST(TrackingStageTest, ARankIsSlowFromItsSlowAlarmUntilItRecoversAndItsLastReportWins) {
  std::map<std::int64_t, SlowRank> slow;
  TrackingStage t(slow);
  const JobView view = RunningJob();
  const std::optional<SlowRank> first = t.OnAlarm(Alarm(5, "slow", 0.2, kT0));
  ASSERT_TRUE(first.has_value());
  EXPECT_DOUBLE_EQ(first->level_s, 0.2);
  EXPECT_EQ(first->onset_ns, kT0);
  const std::optional<SlowRank> again = t.OnAlarm(Alarm(5, "slow", 0.3, kT0 + 5 * kSec));
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(t.LiveSlow(view), std::vector<std::int64_t>{5});
  EXPECT_DOUBLE_EQ(slow.at(5).level_s, 0.3) << "the map the caller persists holds the last report";
  EXPECT_DOUBLE_EQ(slow.at(5).ratio, 3.0);
  EXPECT_FALSE(t.OnAlarm(Alarm(5, "recovered", 0.1, kT0 + 9 * kSec)).has_value());
  EXPECT_TRUE(t.LiveSlow(view).empty());
  EXPECT_TRUE(slow.empty());
}

TEST(TrackingStageTest, OnlyLiveRanksCountAndAnOutbreakNeedsTheMinimumFraction) {
  std::map<std::int64_t, SlowRank> slow;
  TrackingStage t(slow);
  const JobView view = RunningJob({{7, "exited"}});  // 7 of 8 ranks live
  for (std::int64_t r : {1, 2, 3, 7}) ASSERT_TRUE(t.OnAlarm(Alarm(r, "slow", 0.2, kT0)).has_value());
  EXPECT_EQ(t.LiveSlow(view), (std::vector<std::int64_t>{1, 2, 3})) << "rank 7 exited";
  EXPECT_EQ(t.Outbreak(view, 3.0 / 7.0), (std::vector<std::int64_t>{1, 2, 3}));
  EXPECT_TRUE(t.Outbreak(view, 0.5).empty()) << "3 of 7 live ranks is under half";
  ASSERT_TRUE(t.OnAlarm(Alarm(4, "slow", 0.2, kT0)).has_value());
  EXPECT_EQ(t.Outbreak(view, 0.5), (std::vector<std::int64_t>{1, 2, 3, 4}));
}

// Alarms whose slowdown began before a time (the last resolution) are left out of an outbreak
// when the caller asks; later ones count as usual.
TEST(TrackingStageTest, AnOutbreakCanLeaveOutSlowdownsThatBeganBeforeATime) {
  std::map<std::int64_t, SlowRank> slow;
  TrackingStage t(slow);
  const JobView view = RunningJob();  // 8 ranks
  for (std::int64_t r : {0, 1, 2, 3}) ASSERT_TRUE(t.OnAlarm(Alarm(r, "slow", 0.2, kT0)).has_value());
  EXPECT_EQ(t.Outbreak(view, 0.5).size(), 4u);
  EXPECT_TRUE(t.Outbreak(view, 0.5, kT0).empty()) << "onset at the resolution: about that incident";
  EXPECT_EQ(t.Outbreak(view, 0.5, kT0 - 1).size(), 4u);
  for (std::int64_t r : {4, 5, 6, 7}) ASSERT_TRUE(t.OnAlarm(Alarm(r, "slow", 0.2, kT0 + kSec)).has_value());
  EXPECT_EQ(t.Outbreak(view, 0.5, kT0), (std::vector<std::int64_t>{4, 5, 6, 7})) << "began since: news";
  EXPECT_TRUE(t.Outbreak(view, 0.75, kT0).empty()) << "and still needs the minimum fraction";
  EXPECT_EQ(t.LiveSlow(view).size(), 8u) << "the slow ranks themselves are kept";
}

// LiveSlow is kept between questions (tracking_stage.h): it follows every alarm, every view
// update, a view it was not asked about before, and a slow-rank map replaced from outside.
TEST(TrackingStageTest, TheLiveSlowRanksFollowAlarmsViewsAndAReloadedMap) {
  std::map<std::int64_t, SlowRank> slow;
  TrackingStage t(slow);
  JobView seven = RunningJob({{7, "exited"}});
  const JobView all = RunningJob();
  for (std::int64_t r : {5, 7}) ASSERT_TRUE(t.OnAlarm(Alarm(r, "slow", 0.2, kT0)).has_value());
  EXPECT_EQ(t.LiveSlow(seven), std::vector<std::int64_t>{5});
  EXPECT_EQ(t.LiveSlow(all), (std::vector<std::int64_t>{5, 7})) << "another view";
  EXPECT_EQ(t.LiveSlow(seven), std::vector<std::int64_t>{5}) << "and back";
  seven.Update(JobRanks(1200, kT0 + 2 * kSec, {{5, "exited"}}), JobAgents());
  EXPECT_EQ(t.LiveSlow(seven), std::vector<std::int64_t>{7}) << "the same view, updated: 5 exited, 7 is back";
  EXPECT_FALSE(t.OnAlarm(Alarm(5, "recovered", 0.1, kT0 + 3 * kSec)).has_value());
  EXPECT_EQ(t.LiveSlow(all), std::vector<std::int64_t>{7}) << "an alarm";
  slow = {{2, SlowRank{2.0, 0.4, 0.2, kT0}}};  // a restored state
  t.Reload();
  EXPECT_EQ(t.LiveSlow(all), std::vector<std::int64_t>{2});
}

TEST(TrackingStageTest, IterationTimeIsTheWorstLiveRanksMedianOfItsLastSamples) {
  std::map<std::int64_t, SlowRank> slow;
  TrackingStage t(slow);
  const JobView view = RunningJob({{6, "exited"}});
  EXPECT_FALSE(t.CurrentIterationS(view).has_value());
  t.OnIterations(Iterations(0, {0.1, 0.1, 0.1}));
  t.OnIterations(Iterations(1, {0.2, 0.9, 0.2}));  // median 0.2: one outlier does not count
  t.OnIterations(Iterations(6, {5.0, 5.0, 5.0}));  // not live
  ASSERT_TRUE(t.CurrentIterationS(view).has_value());
  EXPECT_DOUBLE_EQ(*t.CurrentIterationS(view), 0.2);
  // Only the last kRecentIterations samples count: eight slow ones push the fast ones out.
  t.OnIterations(Iterations(0, std::vector<double>(TrackingStage::kRecentIterations, 0.4)));
  EXPECT_DOUBLE_EQ(*t.CurrentIterationS(view), 0.4);
  // Fewer of the last samples follow a change sooner: two fast iterations of the last three.
  t.OnIterations(Iterations(0, {0.1, 0.1}));
  EXPECT_DOUBLE_EQ(*t.CurrentIterationS(view), 0.4) << "six of eight are still slow";
  EXPECT_DOUBLE_EQ(*t.CurrentIterationS(view, 3), 0.2) << "rank 1's 0.2 is now the worst";
  EXPECT_DOUBLE_EQ(*t.CurrentIterationS(view, 0), *t.CurrentIterationS(view, 1)) << "at least one";
  EXPECT_DOUBLE_EQ(*t.CurrentIterationS(view, 100), 0.4) << "at most kRecentIterations";
}

// The iteration time is kept up to date as reports arrive (tracking_stage.h): against a
// recomputation from every rank's samples, over random reports, windows asked for at any
// moment (a window asked late is built from what came before), ties and ranks out of the view.
TEST(TrackingStageTest, IterationTimeKeptAsReportsArriveMatchesARecomputation) {
  std::map<std::int64_t, SlowRank> slow;
  TrackingStage t(slow);
  const JobView view = RunningJob({{6, "exited"}, {3, "exited"}});
  std::map<std::int64_t, std::vector<double>> all;  // every sample, per rank
  auto expected = [&](std::size_t last) -> std::optional<double> {
    last = std::clamp<std::size_t>(last, 1, TrackingStage::kRecentIterations);
    std::optional<double> worst;
    for (const auto& [rank, v] : all) {
      if (v.empty() || !view.ranks().count(rank)) continue;
      std::vector<double> tail(v.end() - static_cast<std::ptrdiff_t>(std::min(last, v.size())), v.end());
      std::sort(tail.begin(), tail.end());
      const std::size_t n = tail.size();
      const double m = n % 2 ? tail[n / 2] : (tail[n / 2 - 1] + tail[n / 2]) / 2;
      if (!worst || m > *worst) worst = m;
    }
    return worst;
  };
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::int64_t> rank_of(0, kRanks - 1);
  std::uniform_int_distribution<int> count_of(1, 11), level_of(1, 6), ask(0, 9);  // a batch has a sample
  for (int step = 0; step < 2000; ++step) {
    const std::int64_t r = rank_of(rng);
    std::vector<double> batch;
    for (int i = count_of(rng); i > 0; --i) batch.push_back(0.1 * level_of(rng));  // coarse: ties
    t.OnIterations(Iterations(r, batch));
    all[r].insert(all[r].end(), batch.begin(), batch.end());
    if (ask(rng) != 0) continue;
    for (std::size_t last : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{5},
                             std::size_t{8}, std::size_t{100}}) {
      if (step < 300 && last == 5) continue;  // the 5-sample window is first asked for late
      const std::optional<double> got = t.CurrentIterationS(view, last), want = expected(last);
      ASSERT_EQ(got.has_value(), want.has_value()) << "step " << step << " last " << last;
      if (want) {
        ASSERT_DOUBLE_EQ(*got, *want) << "step " << step << " last " << last;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// ValidationStage

TEST(ValidationStageTest, RoundIsPlannedFromTheSuspicionAndPausesBeforeItsSteps) {
  const JobView view = RunningJob();
  ValidationStage v(ValidationSettings{}, StepOptions{});
  EXPECT_FALSE(v.running());
  EXPECT_TRUE(v.Next(view, kT0).empty()) << "no round, nothing to send";
  const json suspicion = {{"suspicious", {protocol::CommIdHex(DpId(0)), "not hex", 7}},
                          {"peers", {protocol::CommIdHex(DpId(1))}}};
  ASSERT_TRUE(v.Start(view, suspicion, "inc-1-v1", false).ok());
  EXPECT_TRUE(v.running());
  EXPECT_FALSE(v.done());
  const std::vector<OutgoingCommand> first = v.Next(view, kT0 + 2 * kSec);
  ASSERT_FALSE(first.empty());
  EXPECT_FALSE(v.holding()) << "asked, not paused: the job runs until every rank acks its cut";
  std::set<std::string> hosts;
  for (const OutgoingCommand& c : first) {
    EXPECT_EQ(c.command.id.rfind("inc-1-v1-", 0), 0u) << c.command.id;
    hosts.insert(c.host);
  }
  EXPECT_EQ(hosts, (std::set<std::string>{"node0", "node1"}));
  v.Abandon();
  EXPECT_FALSE(v.running());
  const std::vector<OutgoingCommand> release = v.Release("ctl-stop", view, kT0);
  ASSERT_EQ(release.size(), 2u) << "a resume to every agent";
  for (const OutgoingCommand& c : release) EXPECT_EQ(c.command.type, "resume") << c.command.type;
}

TEST(ValidationStageTest, VerdictNamesCulpritsByHostInOrderAndRanksOnce) {
  const JobView view = RunningJob();  // node0 = node index 0, node1 = 1
  const ValidationRun run("r", {}, ValidationSettings{}, false);
  analyzer::Localization l;
  analyzer::SlowLink own;  // rank 5's own transfer, slowed by its GPU: not a culprit of its own
  own.sender = 4;
  own.receiver = 5;
  own.sender_node = own.receiver_node = 1;
  own.evidence = {1.5e-9, 1e-9, 1.5, 1e-10, 6};
  l.gpus.push_back({5, 1, {0.02, 0.01, 2.0, 0.001, 8}, {own}});
  analyzer::SlowLink link;
  link.sender = 5;
  link.receiver = 1;
  link.sender_node = 1;
  link.receiver_node = 0;
  link.evidence = {4e-9, 1e-9, 4.0, 1e-10, 6};
  l.links.push_back(link);
  l.gemms_unassessed = 1;
  const RoundVerdict v = VerdictOf(l, run, view);
  EXPECT_TRUE(v.localised);
  EXPECT_EQ(v.cause, "compute") << "a slow GPU comes first";
  EXPECT_EQ(v.ranks, (std::vector<std::int64_t>{1, 5}));
  EXPECT_EQ(v.summary, "slow GPU: rank 5 on node1 (GEMM 2.00x median); slow link: node1 <-> node0 (ranks 5-1, 4.00x median)");
  ASSERT_EQ(v.detail["gpus"].size(), 1u);
  EXPECT_EQ(v.detail["gpus"][0]["host"], "node1");
  EXPECT_DOUBLE_EQ(v.detail["gpus"][0]["evidence"]["ratio"].get<double>(), 2.0);
  ASSERT_EQ(v.detail["gpus"][0]["explains_links"].size(), 1u);
  EXPECT_EQ(v.detail["gpus"][0]["explains_links"][0]["ranks"], json({4, 5}));
  EXPECT_EQ(v.detail["links"].size(), 1u) << "an explained link is listed under its GPU only";
  EXPECT_EQ(v.detail["links"][0]["hosts"], json({"node1", "node0"}));
  EXPECT_EQ(v.detail["unassessed"]["gemms"], 1);
  EXPECT_TRUE(v.detail.contains("validation"));
  EXPECT_TRUE(v.failure.empty());

  const RoundVerdict refused = VerdictOf(Status::InvalidArgument("no GEMM results"), run, view);
  EXPECT_FALSE(refused.localised);
  EXPECT_EQ(refused.cause, "unknown");
  EXPECT_EQ(refused.detail["error"], "no GEMM results");
  EXPECT_FALSE(refused.detail.contains("gpus"));
  const RoundVerdict none = VerdictOf(analyzer::Localization{}, run, view);
  EXPECT_FALSE(none.localised);
  EXPECT_TRUE(none.summary.empty());
  EXPECT_TRUE(none.ranks.empty());
}

}  // namespace
}  // namespace falcon::controller
