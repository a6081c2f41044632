// falcon-controller against a real redis-server holding what a careless or hostile client left
// there: keys of the wrong type where the protocol expects a hash or a stream, and messages whose
// numbers are out of bounds. No job and no agents: the test writes the agents' keys itself (with
// the protocol's own ToJson) and watches the controller's persisted state and its log. The
// controller must skip what it cannot read, log it once, back off, go on with everything else,
// and keep saving its state. Every wait is a condition with a deadline.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "daemon/protocol/keys.h"
#include "daemon/protocol/messages.h"
#include "daemon/protocol/rank_beat.h"
#include "daemon/protocol/validate.h"
#include "daemon/redis/redis_commands.h"
#include "tests/support/redis_server.h"
#include "tests/support/subprocess.h"

namespace falcon {
namespace {

using nlohmann::json;
using testing::Count;
using testing::ReadFile;
using testing::WaitUntil;

constexpr const char* kJob = "hostile";

std::int64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

class ControllerRedisTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(redis_.Start().ok()) << redis_.Log();
    conn_ = std::make_unique<redis::RedisConnection>(redis_.ClientOptions());
    ASSERT_TRUE(conn_->Connect().ok());
    log_ = dir_.path() + "/controller.log";
  }
  void TearDown() override {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      EXPECT_EQ(testing::WaitFor(pid_, 20), 0);
    }
  }

  void StartController(const std::string& flags = "") {
    const std::string bin = testing::BinDir("daemon") + "/falcon-controller";
    const std::string cmd = "exec '" + bin + "' --job " + kJob + " --redis-port " + std::to_string(redis_.port()) +
                            " --tick-ms 50 --view-ms 100 --heartbeat-ms 200 " + flags + " 2>'" + log_ + "'";
    pid_ = testing::Spawn({"/bin/sh", "-c", cmd}, {});
    ASSERT_GT(pid_, 0);
  }

  std::string Key(const protocol::KeySpec& spec, const std::string& host = "", std::optional<std::int64_t> rank = {}) {
    return protocol::FormatKey(spec, {kJob, host, rank}).value();
  }

  // A live rank (pid 100 + rank), as its agent writes it.
  void WriteRank(std::int64_t rank, std::vector<protocol::CommSummary> comms = {}, const std::string& host = "node0") {
    protocol::RankRegistration r;
    r.header = {kJob, host, NowNs()};
    r.rank = rank;
    r.pid = 100 + rank;
    r.started_ns = 1;
    r.comms = std::move(comms);
    ASSERT_TRUE(redis::HSet(*conn_, Key(protocol::kRankKey, "", rank), {{"msg", protocol::ToJson(r).dump()}}).ok());
  }

  // Waits until the controller's view holds `ranks` ranks, then zeroes Redis's command counters.
  bool RanksInViewThenResetStats(std::int64_t ranks) {
    return WaitUntil([&] {
             const json s = State();
             return s.is_object() && s["ranks"] == ranks;
           }, 20) &&
           conn_->Command({"CONFIG", "RESETSTAT"}).ok();
  }

  // A host's agent, as it writes itself.
  void WriteAgent(const std::string& host, std::vector<std::int64_t> ranks) {
    protocol::AgentHeartbeat a;
    a.header = {kJob, host, NowNs()};
    a.pid = 7;
    a.version = "0.1.0";
    a.ranks = std::move(ranks);
    ASSERT_TRUE(redis::HSet(*conn_, Key(protocol::kAgentKey, host), {{"msg", protocol::ToJson(a).dump()}}).ok());
  }

  // A live rank 0 on node0 and node0's agent, as an agent writes them.
  void RegisterRank0() {
    WriteRank(0, {{0xabcdef0123456789ull, 0, 1, "world", 10}});
    WriteAgent("node0", {0});
  }

  // A live rank 1 on node0 (after RegisterRank0: its agent is node0's).
  void RegisterRank1() { WriteRank(1); }

  // An iterations batch of a rank on a host as an entry with the given id ("*": Redis's clock).
  void AddIterations(const json& seconds, const std::string& id, std::int64_t rank = 0,
                     const std::string& host = "node0") {
    protocol::IterationBatch b;
    b.header = {kJob, host, NowNs()};
    b.rank = rank;
    b.pid = 100 + rank;
    b.period = 9;
    for (std::size_t i = 0; i < seconds.size(); ++i) b.start_ns.push_back(NowNs());
    json m = protocol::ToJson(b);
    m["seconds"] = seconds;
    ASSERT_TRUE(conn_->Command({"XADD", Key(protocol::kIterationsStream), id, "msg", m.dump()}).ok());
  }

  std::int64_t XLen(const std::string& key) {
    Result<redis::RedisReply> r = conn_->Command({"XLEN", key});
    return r.ok() ? r.value().integer : -1;
  }

  void AddIterations(const json& seconds) { AddIterations(seconds, "*"); }

  // Rank's slow alarm as its agent writes it.
  json SlowAlarm(std::int64_t rank) {
    protocol::AlarmReport a;
    a.header = {kJob, "node0", NowNs()};
    a.rank = rank;
    a.pid = 100 + rank;
    a.kind = "slow";
    a.ratio = 2;
    a.probability = 0.99;
    a.level_s = 1;
    a.baseline_s = 0.5;
    return protocol::ToJson(a);
  }

  void SetString(const std::string& key) {
    ASSERT_TRUE(conn_->Command({"SET", key, "not what the protocol says"}).ok());
  }

  // The state message a controller started with `flags` saves once it sees the two registered
  // ranks, read back after it stopped: a test edits it to start the next controller from.
  json StoppedControllerState(const std::string& flags = "") {
    StartController(flags);
    EXPECT_TRUE(WaitUntil([&] { const json s = State(); return s.is_object() && s["ranks"] == 2; }, 20))
        << ReadFile(log_);
    kill(pid_, SIGTERM);
    EXPECT_EQ(testing::WaitFor(pid_, 20), 0);
    pid_ = -1;
    auto h = redis::HGetAll(*conn_, Key(protocol::kControllerKey));
    if (!h.ok() || h.value().count("msg") == 0) {
      ADD_FAILURE() << "no saved state";
      return json::object();
    }
    return json::parse(h.value().at("msg"));
  }

  // What a controller leaves after localising rank 1's GPU (its TP pair with rank 0 on `group`,
  // rank 0 on node0, rank 1 on node1) and putting S2 in force in act mode: the plan's level to
  // be measured now, the last round just ended. Written as the controller's saved state.
  void ReBalancedState(std::uint64_t group) {
    RegisterTpPair(group);
    json msg = StoppedControllerState("--mitigation act");
    if (HasFailure()) return;
    const std::int64_t now = NowNs();
    msg["state_doc"]["plan_version"] = 1;
    msg["state_doc"]["incident"] = {
        {"id", "inc-1"}, {"opened_ns", now}, {"ranks", {1}}, {"healthy_s", 0.1}, {"localised", true},
        {"attempts", 1}, {"next_attempt_ns", 0}, {"cause", "compute"}, {"findings", {{"gpus", {{{"rank", 1}}}}}},
        {"last_round_ns", now}, {"plan_level_after_ns", 1},
        {"mitigation", {{"cause", "compute"}, {"candidates", {{"S2", {{"overhead_s", 1}, {"plan", {{"strategy", "S2"}}}}}}},
                        {"applied", {"S2"}}, {"rebalance_in_effect", true}, {"pipeline_in_effect", false},
                        {"stopped", false}, {"slowdown_s", 0}, {"paid_s", 0}, {"last_time_s", 0},
                        {"calm_samples", 0}}}};
    ASSERT_TRUE(redis::HSet(*conn_, Key(protocol::kControllerKey), {{"msg", msg.dump()}}).ok());
  }

  // Ranks 0 (node0) and 1 (node1), a TP pair on `group`, and their agents, as agents write them.
  void RegisterTpPair(std::uint64_t group) {
    WriteRank(0, {{group, 0, 2, "tp", 10}}, "node0");
    WriteRank(1, {{group, 1, 2, "tp", 10}}, "node1");
    WriteAgent("node0", {0});
    WriteAgent("node1", {1});
  }

  // Rank's comm_profile window on the TP pair `group`, taken in profile mode from since_ns to
  // now: its busiest collective took median_us a call.
  void AddTpWindow(std::int64_t rank, std::uint64_t group, std::int64_t since_ns, double median_us) {
    const json m = {{"v", 2}, {"type", "comm_profile"}, {"job", kJob}, {"host", rank == 0 ? "node0" : "node1"},
                    {"at_ns", NowNs()}, {"rank", rank}, {"pid", 100 + rank}, {"since_ns", since_ns}, {"mode", "profile"},
                    {"comms", {{{"id", protocol::CommIdHex(group)}, {"rank", rank}, {"nranks", 2},
                                {"sigs", {{{"op", "AllReduce"}, {"bytes", 65536}, {"peer", -1}, {"count", 64},
                                           {"median_us", median_us}, {"mean_us", median_us}}}}}}}};
    ASSERT_TRUE(conn_->Command({"XADD", Key(protocol::kProfilesStream), "*", "msg", m.dump()}).ok());
  }

  // The controller's persisted state, validated; null while there is none.
  json State() {
    auto h = redis::HGetAll(*conn_, Key(protocol::kControllerKey));
    if (!h.ok() || h.value().count("msg") == 0) return nullptr;
    Result<json> m = protocol::ParseMessage(h.value().at("msg"), protocol::kControllerState);
    return m.ok() ? m.value() : json();
  }

  // True once the state was saved again after now (the heartbeat goes on).
  bool SavedAfter(std::int64_t t_ns) {
    return WaitUntil([&] {
      const json s = State();
      return s.is_object() && s["at_ns"].get<std::int64_t>() > t_ns;
    }, 20);
  }

  testing::RedisServer redis_;
  testing::TempDir dir_;
  std::unique_ptr<redis::RedisConnection> conn_;
  std::string log_;
  pid_t pid_ = -1;
};

TEST_F(ControllerRedisTest, WrongTypeRankOrAgentKeyIsSkippedAndLoggedOnce) {
  RegisterRank0();
  SetString(Key(protocol::kRankKey, "", 1));
  SetString(Key(protocol::kAgentKey, "node9"));
  StartController();
  ASSERT_TRUE(WaitUntil([&] {
    const json s = State();
    return s.is_object() && s["ranks"] == 1 && s["agents"] == 1;
  }, 20)) << "the good keys must still count\n" << ReadFile(log_);
  const std::int64_t t = NowNs();
  ASSERT_TRUE(SavedAfter(t + 1'000'000'000));  // ten refreshes or more later
  std::string text = ReadFile(log_);
  EXPECT_EQ(Count(text, "event=bad_key key=falcon:{hostile}:rank:1 "), 1u) << text;
  EXPECT_EQ(Count(text, "event=bad_key key=falcon:{hostile}:agent:node9 "), 1u) << text;
  EXPECT_EQ(Count(text, "step_failed"), 0u) << text;
  ASSERT_TRUE(redis::Del(*conn_, Key(protocol::kRankKey, "", 1)).ok());
  EXPECT_TRUE(WaitUntil([&] { return ReadFile(log_).find("event=bad_key_cleared key=falcon:{hostile}:rank:1") !=
                                     std::string::npos; }, 20));
}

TEST_F(ControllerRedisTest, AnEntryPackingSeveralMessagesIsReadMessageByMessage) {
  RegisterRank0();
  RegisterRank1();
  StartController();
  ASSERT_TRUE(WaitUntil([&] { const json s = State(); return s.is_object() && s["ranks"] == 2; }, 20))
      << ReadFile(log_);
  // One entry as an agent packs a flush: rank 0's alarm, a message that fails validation, rank
  // 1's alarm. The bad one is dropped alone; the others count.
  redis::FieldList fields;
  for (std::int64_t rank : {0, -7, 1}) {
    json m = SlowAlarm(rank < 0 ? 0 : rank);
    if (rank < 0) m["ratio"] = "fast";
    fields.emplace_back("msg", m.dump());
  }
  ASSERT_TRUE(redis::XAdd(*conn_, Key(protocol::kAlarmsStream), 0, fields).ok());
  ASSERT_TRUE(WaitUntil([&] { const json s = State(); return s.is_object() && s["slow_ranks"] == json({0, 1}); }, 20))
      << State().dump() << "\n" << ReadFile(log_);
}

// The slow ranks are a field of their own in the controller's hash, written when an alarm changes
// them and not with every heartbeat (at 16,384 slow ranks they are 1.5 MB). A restarted
// controller reads them back from it; one whose field is unreadable reads the alarms again
// rather than lose a slow rank.
TEST_F(ControllerRedisTest, TheSlowRanksAreWrittenWhenTheyChangeAndReadBackOnRestart) {
  const std::string key = Key(protocol::kControllerKey);
  const std::string field(protocol::kControllerSlowField);
  auto register_ranks = [&] {
    RegisterRank0();
    RegisterRank1();
  };
  auto slow_field = [&]() -> std::string {
    auto h = redis::HGetAll(*conn_, key);
    return h.ok() && h.value().count(field) ? h.value().at(field) : std::string();
  };
  auto restart = [&] {
    kill(pid_, SIGTERM);
    ASSERT_EQ(testing::WaitFor(pid_, 20), 0);
    pid_ = -1;
    register_ranks();
    StartController();
  };
  register_ranks();
  StartController();
  ASSERT_TRUE(WaitUntil([&] { const json s = State(); return s.is_object() && s["ranks"] == 2; }, 20))
      << ReadFile(log_);
  ASSERT_TRUE(redis::XAdd(*conn_, Key(protocol::kAlarmsStream), 0, {{"msg", SlowAlarm(0).dump()}}).ok());
  ASSERT_TRUE(WaitUntil([&] { const json s = State(); return s.is_object() && s["slow_ranks"] == json({0}); }, 20))
      << State().dump() << "\n" << ReadFile(log_);
  json written = json::parse(slow_field());
  ASSERT_TRUE(written.is_object() && written.size() == 1 && written.contains("0")) << written.dump();
  EXPECT_EQ(written["0"]["ratio"], 2.0);
  EXPECT_FALSE(State()["state_doc"].contains("slow")) << "the document does not carry them";
  // Unchanged slow ranks are not written again: a stand-in stays through several heartbeats.
  ASSERT_TRUE(redis::HSet(*conn_, key, {{field, "{}"}}).ok());
  ASSERT_TRUE(SavedAfter(NowNs() + 600'000'000));
  EXPECT_EQ(slow_field(), "{}") << "rewritten although no alarm changed them";
  // An alarm changes them: written whole.
  ASSERT_TRUE(redis::XAdd(*conn_, Key(protocol::kAlarmsStream), 0, {{"msg", SlowAlarm(1).dump()}}).ok());
  ASSERT_TRUE(WaitUntil([&] {
    const std::string text = slow_field();
    return text.find("\"0\"") != std::string::npos && text.find("\"1\"") != std::string::npos;
  }, 20)) << slow_field() << "\n" << ReadFile(log_);
  ASSERT_TRUE(WaitUntil([&] { return State()["slow_ranks"] == json({0, 1}); }, 20)) << State().dump();
  // Restarted: what the field says is what it starts with (the alarms are not read again, so a
  // field naming rank 1 alone gives rank 1 alone).
  written = json::parse(slow_field());
  written.erase("0");
  ASSERT_TRUE(redis::HSet(*conn_, key, {{field, written.dump()}}).ok());
  restart();
  ASSERT_TRUE(WaitUntil([&] {
    const json s = State();
    return s.is_object() && s["pid"] == pid_ && s["ranks"] == 2;
  }, 20)) << ReadFile(log_);
  EXPECT_EQ(State()["slow_ranks"], json({1})) << ReadFile(log_);
  // An unreadable field: the alarms are read again from the stream's start.
  ASSERT_TRUE(redis::HSet(*conn_, key, {{field, "[not json"}}).ok());
  restart();
  ASSERT_TRUE(WaitUntil([&] { return ReadFile(log_).find("event=state_unreadable part=slow action=replay_alarms") !=
                                     std::string::npos; }, 20)) << ReadFile(log_);
  ASSERT_TRUE(WaitUntil([&] {
    const json s = State();
    return s.is_object() && s["pid"] == pid_ && s["slow_ranks"] == json({0, 1});
  }, 20)) << State().dump() << "\n" << ReadFile(log_);
  EXPECT_EQ(json::parse(slow_field()).size(), 2u) << "the replayed slow ranks are written back";
  // Redis restarted without persistence: the controller writes what it has again, though no
  // alarm changed it.
  redis_.Kill();
  ASSERT_TRUE(redis_.Start().ok()) << redis_.Log();
  conn_ = std::make_unique<redis::RedisConnection>(redis_.ClientOptions());
  ASSERT_TRUE(conn_->Connect().ok());
  register_ranks();
  ASSERT_TRUE(WaitUntil([&] { return !slow_field().empty(); }, 20)) << ReadFile(log_);
  written = json::parse(slow_field());
  EXPECT_TRUE(written.contains("0") && written.contains("1")) << written.dump();
}

// The recovery watch's commands are best effort. Here node1's commands key is a string, so Redis
// refuses every command to it while the job runs under a re-balance (act mode) whose culprit is
// on node1. The refusal is logged once and retried with a backoff. It does not fail the turn:
// the rest of tracking goes on (the plan's level is measured), no step fails, and node0's ranks
// are not switched every turn. Once the key is mended, the arming goes out.
TEST_F(ControllerRedisTest, ARefusedWatchCommandIsLoggedOnceAndTrackingGoesOn) {
  const std::uint64_t group = 0x1234abcd5678ef01ull;
  ReBalancedState(group);
  ASSERT_FALSE(HasFailure());
  const std::string node0 = Key(protocol::kCommandsStream, "node0");
  const std::string node1 = Key(protocol::kCommandsStream, "node1");
  SetString(node1);
  const std::int64_t node0_before = std::max<std::int64_t>(0, XLen(node0));

  RegisterTpPair(group);
  const std::int64_t started_ns = NowNs();
  StartController("--mitigation act --recheck-s 3600");
  for (int i = 0; i < 3; ++i) {
    AddIterations({0.1, 0.1, 0.1, 0.1}, "*", 0, "node0");
    AddIterations({0.1, 0.1, 0.1, 0.1}, "*", 1, "node1");
  }
  // Tracking goes on past the watch: the plan's level is measured and saved.
  ASSERT_TRUE(WaitUntil([&] {
    const json s = State();
    return s.is_object() && s["pid"] == pid_ && s["state_doc"].contains("incident") &&
           s["state_doc"]["incident"]["plan_level_s"].get<double>() > 0;
  }, 20)) << State().dump() << "\n" << ReadFile(log_);
  // Some turns later (50 ms each): one warning, no failed step, and node0's rank switched once
  // per retry (after 1 s, 2 s, 4 s, ...: 1 + log2(1 + T) sends in T seconds), not once per turn.
  ASSERT_TRUE(WaitUntil([&] { return Count(ReadFile(log_), "event=recovery_watch_unsent action=arm") == 1; }, 20))
      << ReadFile(log_);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  std::string log = ReadFile(log_);
  EXPECT_EQ(Count(log, "event=recovery_watch_unsent"), 1u) << log;
  EXPECT_NE(log.find("WRONGTYPE"), std::string::npos) << log;
  EXPECT_EQ(log.find("event=step_failed"), std::string::npos) << log;
  EXPECT_EQ(log.find("event=recovery_watch incident"), std::string::npos) << "armed although refused\n" << log;
  const std::int64_t sent = XLen(node0) - node0_before;
  const double elapsed_s = static_cast<double>(NowNs() - started_ns) / 1e9;
  EXPECT_GE(sent, 2) << "the refused arming is sent again";
  EXPECT_LE(static_cast<double>(sent), 2 + std::log2(1 + elapsed_s)) << "sent again every turn, in " << elapsed_s << " s";

  // Mended: the next retry arms the watch, on both hosts.
  ASSERT_TRUE(conn_->Command({"DEL", node1}).ok());
  ASSERT_TRUE(WaitUntil([&] {
    return ReadFile(log_).find("event=recovery_watch incident=inc-1 action=armed") != std::string::npos;
  }, 20)) << ReadFile(log_);
  log = ReadFile(log_);
  EXPECT_NE(log.find("event=recovery_watch_sent action=arm"), std::string::npos) << log;
  EXPECT_EQ(XLen(node1), 1);
  EXPECT_EQ(log.find("event=step_failed"), std::string::npos) << log;
}

// While S2 holds, a re-check round pauses the job to learn whether the slow GPU is still slow.
// The recovery watch learns that without a pause: rank 1's TP peer still waits 16x its time per
// call. While its windows say so, no round runs (recheck-s 6 s here, 12 s of windows); once they
// stop, the timer runs from the last one (not from the last round, long past by then) and a
// round re-checks the culprit. recheck-s leaves a loaded machine (sanitizers) time to start the
// controller and arm the watch before the first re-check falls due.
TEST_F(ControllerRedisTest, TheRecoveryWatchSeeingTheFaultStandsInForReCheckRounds) {
  const std::uint64_t group = 0x1234abcd5678ef01ull;
  ReBalancedState(group);
  ASSERT_FALSE(HasFailure());
  StartController("--mitigation act --recheck-s 6");
  ASSERT_TRUE(WaitUntil([&] {
    return ReadFile(log_).find("event=recovery_watch incident=inc-1 action=armed") != std::string::npos;
  }, 20)) << ReadFile(log_);
  const std::int64_t armed_ns = NowNs();
  const auto round = [&] { return ReadFile(log_).find("event=phase from=tracking to=profiling") != std::string::npos; };
  while (NowNs() - armed_ns < 12'000'000'000 && !round()) {
    RegisterTpPair(group);
    AddIterations({0.1, 0.1}, "*", 0, "node0");
    AddIterations({0.1, 0.1}, "*", 1, "node1");
    AddTpWindow(0, group, armed_ns, 800);
    AddTpWindow(1, group, armed_ns, 50);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  std::string log = ReadFile(log_);
  EXPECT_NE(log.find("event=recovery_watch incident=inc-1 action=sees_fault"), std::string::npos) << log;
  EXPECT_FALSE(round()) << "a round re-checked a fault the watch saw all along\n" << log;
  const json saved = State();
  ASSERT_TRUE(saved.is_object() && saved["state_doc"].contains("incident")) << saved.dump();
  EXPECT_GT(saved["state_doc"]["incident"].value("watch_seen_ns", std::int64_t{0}), armed_ns) << saved.dump();
  EXPECT_EQ(log.find("action=undo"), std::string::npos) << "still slow: nothing to undo\n" << log;
  // The windows stop (a watch that sees nothing): the timer re-checks.
  const std::int64_t quiet_ns = NowNs();
  ASSERT_TRUE(WaitUntil([&] {
    RegisterTpPair(group);
    return round();
  }, 30)) << ReadFile(log_);
  EXPECT_GT(NowNs() - quiet_ns, 3'000'000'000) << "the timer runs from the watch's last window, not the last round";
}

// The busy report streams are trimmed behind what the controller has read and saved, keeping
// stream-retention-s before it; what it has not read, and the rare streams (alarms), never are.
// After an incident is resolved (a plan undone), the agents' detectors can take tens of seconds to
// call the ranks recovered: their slow alarms from before the resolution open no new incident
// while the job runs at its healthy pace, and do once it is slow again.
TEST_F(ControllerRedisTest, AlarmsFromBeforeTheLastResolutionOpenNothingWhileTheJobIsHealthy) {
  RegisterRank0();
  RegisterRank1();
  json msg = StoppedControllerState();
  ASSERT_FALSE(HasFailure());
  const std::string key = Key(protocol::kControllerKey);
  const std::int64_t resolved = NowNs();
  msg["state_doc"]["resolved_ns"] = resolved;
  msg["state_doc"]["healthy_s"] = 0.1;
  ASSERT_TRUE(redis::HSet(*conn_, key, {{"msg", msg.dump()}}).ok());

  RegisterRank0();
  RegisterRank1();
  StartController();
  auto iterations = [&](double s) {
    for (std::int64_t r : {0, 1}) AddIterations(json(std::vector<double>(6, s)), "*", r);
  };
  iterations(0.1);
  for (std::int64_t r : {0, 1}) {
    json a = SlowAlarm(r);
    a["onset_ns"] = resolved - 10'000'000'000;  // the incident's own slowdown
    ASSERT_TRUE(redis::XAdd(*conn_, Key(protocol::kAlarmsStream), 0, {{"msg", a.dump()}}).ok());
  }
  ASSERT_TRUE(WaitUntil([&] { const json s = State(); return s.is_object() && s["slow_ranks"] == json({0, 1}); }, 20))
      << State().dump() << "\n" << ReadFile(log_);
  // Past the settling time (10 healthy iterations, at least 1 s) at the healthy pace: held.
  ASSERT_TRUE(WaitUntil([&] { return NowNs() - resolved > 2'500'000'000; }, 10));
  iterations(0.1);
  ASSERT_TRUE(SavedAfter(NowNs()));
  ASSERT_TRUE(SavedAfter(NowNs()));
  std::string log = ReadFile(log_);
  EXPECT_EQ(Count(log, "event=stale_alarms action=held"), 1u) << log;
  EXPECT_EQ(log.find("stage=detection"), std::string::npos) << log;
  EXPECT_FALSE(State()["state_doc"].contains("incident")) << State().dump();
  // Three times the healthy pace: the slowdown is still there, and the incident opens.
  iterations(0.3);
  ASSERT_TRUE(WaitUntil([&] { return ReadFile(log_).find("stage=detection") != std::string::npos; }, 20))
      << ReadFile(log_);
  log = ReadFile(log_);
  EXPECT_NE(log.find("event=stale_alarms action=released"), std::string::npos) << log;
  EXPECT_LT(log.find("event=stale_alarms action=released"), log.find("stage=detection")) << log;
}

TEST_F(ControllerRedisTest, ReadReportsAreTrimmedBehindTheSavedCursorAndTheRetentionKept) {
  // One entry per macro node, so that MINID ~ trims entry by entry, as it does a long stream.
  ASSERT_TRUE(conn_->Command({"CONFIG", "SET", "stream-node-max-entries", "1"}).ok());
  RegisterRank0();
  const std::int64_t old_ms = NowNs() / 1'000'000 - 600'000;  // ten minutes of history
  for (int i = 0; i < 10; ++i) AddIterations({1.0}, std::to_string(old_ms + i) + "-0");
  ASSERT_TRUE(conn_->Command({"XADD", Key(protocol::kAlarmsStream), std::to_string(old_ms) + "-0", "msg",
                              SlowAlarm(0).dump()}).ok());
  StartController("--stream-retention-s 5");
  ASSERT_TRUE(SavedAfter(NowNs()));
  // A fresh controller starts at the stream's end: the history is within 5 s of its cursor.
  ASSERT_TRUE(SavedAfter(NowNs() + 1'500'000'000)) << ReadFile(log_);
  EXPECT_EQ(XLen(Key(protocol::kIterationsStream)), 10);
  for (int i = 0; i < 3; ++i) AddIterations({1.0}, "*");  // read, saved: the cursor moves to now
  ASSERT_TRUE(WaitUntil([&] { return XLen(Key(protocol::kIterationsStream)) == 3; }, 20))
      << XLen(Key(protocol::kIterationsStream)) << "\n" << ReadFile(log_);
  EXPECT_EQ(XLen(Key(protocol::kAlarmsStream)), 1) << "the alarms stream is the agents' cap's alone";
  // What came after the cursor stays: the three read ones are within the retention, a new one unread.
  AddIterations({1.0}, "*");
  EXPECT_GE(XLen(Key(protocol::kIterationsStream)), 4);
  EXPECT_EQ(Count(ReadFile(log_), "stream_trim_refused"), 0u);
}

// A controller that falls behind a stream by more than 10 s is warned about once (the agents' cap
// of 100,000 messages is seconds of signatures at 16,384 ranks: it would lose what it had not
// read), and its catching up is logged.
TEST_F(ControllerRedisTest, FallingBehindAStreamIsWarnedOnceAndCatchingUpLogged) {
  RegisterRank0();
  StartController();
  ASSERT_TRUE(SavedAfter(NowNs())) << ReadFile(log_);
  // Stopped, so that its next read finds the whole backlog: 2,500 batches a minute old.
  ASSERT_EQ(kill(pid_, SIGSTOP), 0);
  protocol::IterationBatch b;
  b.header = {kJob, "node0", NowNs()};
  b.rank = 0;
  b.pid = 100;
  b.period = 9;
  b.start_ns = {NowNs()};
  b.seconds = {1.0};
  const std::string m = protocol::ToJson(b).dump();
  const std::int64_t old_ms = NowNs() / 1'000'000 - 60'000;
  std::vector<std::vector<std::string>> xadds;
  for (int i = 0; i < 2500; ++i) {
    xadds.push_back({"XADD", Key(protocol::kIterationsStream), std::to_string(old_ms + i) + "-0", "msg", m});
  }
  ASSERT_TRUE(redis::PipelineInRounds(*conn_, xadds).ok());
  ASSERT_EQ(kill(pid_, SIGCONT), 0);
  ASSERT_TRUE(WaitUntil([&] { return Count(ReadFile(log_), "event=stream_caught_up stream=iterations") == 1; }, 20))
      << ReadFile(log_);
  const std::string text = ReadFile(log_);
  const std::string warned = "event=stream_lagging stream=iterations lag_s=";
  ASSERT_EQ(Count(text, warned), 1u) << text;
  EXPECT_EQ(Count(text, "event=stream_lagging"), 1u) << text;
  const double lag = std::stod(text.substr(text.find(warned) + warned.size()));
  EXPECT_GE(lag, 58) << "the first page's last batch was written 59 s ago";
  EXPECT_LE(lag, 75) << text;
  EXPECT_LT(text.find("event=stream_lagging"), text.find("event=stream_caught_up")) << text;
}

TEST_F(ControllerRedisTest, AZeroRetentionLeavesTheStreamsToTheAgentsCap) {
  ASSERT_TRUE(conn_->Command({"CONFIG", "SET", "stream-node-max-entries", "1"}).ok());
  RegisterRank0();
  const std::int64_t old_ms = NowNs() / 1'000'000 - 600'000;
  for (int i = 0; i < 10; ++i) AddIterations({1.0}, std::to_string(old_ms + i) + "-0");
  StartController("--stream-retention-s 0");
  for (int i = 0; i < 3; ++i) AddIterations({1.0}, "*");
  ASSERT_TRUE(SavedAfter(NowNs() + 2'500'000'000)) << ReadFile(log_);  // past a trim's 1 s period, twice
  EXPECT_EQ(XLen(Key(protocol::kIterationsStream)), 13);
}

// A server that refuses XTRIM MINID (before Redis 6.2, or an ACL without it) leaves the streams to
// the agents' cap: warned once, never asked again, and the controller goes on.
TEST_F(ControllerRedisTest, ARefusedTrimIsWarnedOnceAndTheControllerGoesOn) {
  ASSERT_TRUE(conn_->Command({"ACL", "SETUSER", "default", "-xtrim"}).ok());
  RegisterRank0();
  AddIterations({1.0}, std::to_string(NowNs() / 1'000'000 - 600'000) + "-0");
  StartController("--stream-retention-s 1");
  AddIterations({1.0});
  ASSERT_TRUE(WaitUntil([&] { return Count(ReadFile(log_), "event=stream_trim_refused") == 1; }, 20))
      << ReadFile(log_);
  ASSERT_TRUE(SavedAfter(NowNs() + 3'000'000'000)) << ReadFile(log_);  // three trim periods on
  const std::string text = ReadFile(log_);
  EXPECT_EQ(Count(text, "event=stream_trim_refused"), 1u) << text;
  EXPECT_EQ(Count(text, "step_failed"), 0u) << text;
  EXPECT_EQ(XLen(Key(protocol::kIterationsStream)), 2);
}

TEST_F(ControllerRedisTest, WrongTypeStreamIsSetAsideWithBackoffAndTheRestGoesOn) {
  struct Case {
    const protocol::KeySpec* stream;
    const char* name;
  };
  for (const Case& c : {Case{&protocol::kRequestsStream, "requests"}, Case{&protocol::kAlarmsStream, "alarms"}}) {
    SCOPED_TRACE(c.name);
    ASSERT_TRUE(conn_->Command({"FLUSHALL"}).ok());
    RegisterRank0();
    SetString(Key(*c.stream));
    StartController();
    ASSERT_TRUE(WaitUntil([&] { return State().is_object(); }, 20)) << ReadFile(log_);  // cursors set
    AddIterations({0.5, 0.5, 0.5});
    ASSERT_TRUE(WaitUntil([&] {
      const json s = State();
      return s.is_object() && s.contains("current_s") && s["current_s"] == 0.5;
    }, 20)) << "the other streams must still be read\n" << ReadFile(log_);
    ASSERT_TRUE(SavedAfter(NowNs() + 2'000'000'000));
    const std::string text = ReadFile(log_);
    EXPECT_EQ(Count(text, std::string("event=stream_unreadable stream=") + c.name), 1u) << text;
    EXPECT_LT(Count(text, "\n"), 40u) << "the log must not grow with every tick:\n" << text.substr(0, 4000);
    ASSERT_TRUE(redis::Del(*conn_, Key(*c.stream)).ok());
    EXPECT_TRUE(WaitUntil([&] {
      return ReadFile(log_).find(std::string("event=stream_readable stream=") + c.name) != std::string::npos;
    }, 20)) << "probed again within the backoff bound";
    kill(pid_, SIGTERM);
    EXPECT_EQ(testing::WaitFor(pid_, 20), 0);
    pid_ = -1;
  }
}

TEST_F(ControllerRedisTest, OutOfBoundNumbersAreDroppedAndTheStateStillSaves) {
  RegisterRank0();
  StartController();
  ASSERT_TRUE(WaitUntil([&] { return State().is_object(); }, 20)) << ReadFile(log_);
  AddIterations({1e300, 1e300, 1e300, 1e300});
  AddIterations({-1.0});
  AddIterations({0.25});
  ASSERT_TRUE(WaitUntil([&] {
    const json s = State();
    return s.is_object() && s.contains("current_s") && s["current_s"] == 0.25;
  }, 20)) << ReadFile(log_);
  ASSERT_TRUE(SavedAfter(NowNs() + 500'000'000));
  const std::string text = ReadFile(log_);
  EXPECT_EQ(Count(text, "event=bad_message stream=iterations"), 2u) << text;
  EXPECT_NE(text.find("iterations.seconds: element 0 out of bounds"), std::string::npos) << text;
  EXPECT_EQ(text.find("controller_state would be invalid"), std::string::npos) << text;
}

// A request's id and author travel into the controller's log (event=request): values holding
// newlines and quotes are escaped and forge no line.
TEST_F(ControllerRedisTest, RequestIdsAndAuthorsCannotForgeLogLines) {
  RegisterRank0();
  StartController();
  ASSERT_TRUE(WaitUntil([&] { return State().is_object(); }, 20)) << ReadFile(log_);  // cursors set
  const json request = {{"v", protocol::kSchemaVersion}, {"type", "controller_request"}, {"id", "r1\"\nevent=forged kind=\"id"},
                        {"issued_ns", NowNs()}, {"action", "validate"},
                        {"by", "mallory\nevent=forged kind=by"}, {"reason", "test"}};
  ASSERT_TRUE(redis::XAdd(*conn_, Key(protocol::kRequestsStream), 0, {{"msg", request.dump()}}).ok());
  ASSERT_TRUE(WaitUntil([&] { return ReadFile(log_).find("event=request ") != std::string::npos; }, 20))
      << ReadFile(log_);
  const std::string text = ReadFile(log_);
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    EXPECT_EQ(line.rfind("event=forged", 0), std::string::npos) << "a forged line:\n" << text;
  }
  EXPECT_NE(text.find("event=request id=\"r1\\\"\\nevent=forged kind=\\\"id\" action=validate "
                      "by=\"mallory\\nevent=forged kind=by\""),
            std::string::npos)
      << text;
}

// Two agents claim rank 0 (node0's pid 100, then node1's pid 200), overwriting each other's
// registration in the rank's key: the controller keeps the first, warns once naming both, and
// hands the rank over only once the first has been silent for the hold time.
TEST_F(ControllerRedisTest, ASecondClaimOfARankIsWarnedOnceAndDoesNotFlipFlop) {
  auto claim = [&](const std::string& host, std::int64_t pid, std::int64_t at_ns) {
    protocol::RankRegistration r;
    r.header = {kJob, host, at_ns};
    r.rank = 0;
    r.pid = pid;
    r.started_ns = 1;
    ASSERT_TRUE(redis::HSet(*conn_, Key(protocol::kRankKey, "", 0), {{"msg", protocol::ToJson(r).dump()}}).ok());
  };
  const std::string conflict =
      "event=rank_claim_conflict rank=0 holder_host=node0 holder_pid=100 claimant_host=node1 claimant_pid=200";
  claim("node0", 100, NowNs());
  StartController();
  ASSERT_TRUE(WaitUntil([&] {
    const json s = State();
    return s.is_object() && s["ranks"] == 1;
  }, 20)) << ReadFile(log_);
  claim("node1", 200, NowNs());
  ASSERT_TRUE(WaitUntil([&] { return ReadFile(log_).find(conflict) != std::string::npos; }, 20)) << ReadFile(log_);
  // They alternate, as two agents' heartbeats do; each write is seen by a refresh (view-ms 100).
  for (int i = 0; i < 6; ++i) {
    const bool first = i % 2 == 1;
    claim(first ? "node0" : "node1", first ? 100 : 200, NowNs());
    ASSERT_TRUE(SavedAfter(NowNs() + 300'000'000));  // refreshed since
  }
  std::string text = ReadFile(log_);
  EXPECT_EQ(Count(text, "event=rank_claim_conflict"), 1u) << text;
  EXPECT_EQ(Count(text, "event=rank_claim_handover"), 0u) << text;
  // node0 falls silent; node1's next registration comes after the hold: it takes the rank over.
  claim("node1", 200, NowNs() + 11'000'000'000);
  ASSERT_TRUE(WaitUntil([&] {
    return ReadFile(log_).find("event=rank_claim_handover rank=0 from_host=node0 from_pid=100 to_host=node1 "
                               "to_pid=200") != std::string::npos;
  }, 20)) << ReadFile(log_);
  text = ReadFile(log_);
  EXPECT_EQ(Count(text, "event=rank_claim_conflict"), 1u) << text;
}

// The rank and agent keys are re-read at most view-keys-per-s keys a second, however fast a
// re-read is: 201 keys at 201 a second is a re-read a second, where view-ms alone (100 ms) would
// ask Redis ten times as often.
TEST_F(ControllerRedisTest, TheViewsReReadsStayWithinTheirKeysPerSecond) {
  constexpr std::int64_t kRanks = 200;
  for (std::int64_t r = 0; r < kRanks; ++r) WriteRank(r);
  std::vector<std::int64_t> all(kRanks);
  std::iota(all.begin(), all.end(), 0);
  WriteAgent("node0", all);
  StartController("--view-keys-per-s 201");
  ASSERT_TRUE(RanksInViewThenResetStats(kRanks)) << ReadFile(log_);
  std::this_thread::sleep_for(std::chrono::seconds(4));
  const long long calls = testing::InfoCounter(*conn_, "commandstats", "cmdstat_hgetall", "calls");
  // Four seconds: at most five re-reads (one may fall at each end), at least two.
  EXPECT_LE(calls, 5 * (kRanks + 1)) << ReadFile(log_);
  EXPECT_GE(calls, 2 * (kRanks + 1)) << ReadFile(log_);
}

// `ranks` live ranks 0.. on node0, each key written at `written`, and node0's agent key with a
// beat per rank naming that content, as an agent writes them (rank_beat.h).
protocol::AgentHeartbeat WriteBeatingRanks(redis::RedisConnection& c, std::int64_t ranks, std::int64_t written) {
  protocol::AgentHeartbeat a;
  a.header = {kJob, "node0", written};
  a.pid = 7;
  a.version = "0.1.0";
  a.beats.emplace();
  for (std::int64_t r = 0; r < ranks; ++r) {
    protocol::RankRegistration m;
    m.header = {kJob, "node0", written};
    m.rank = r;
    m.pid = 100 + r;
    m.started_ns = 1;
    EXPECT_TRUE(redis::HSet(c, protocol::FormatKey(protocol::kRankKey, {kJob, "", r}).value(),
                            {{"msg", protocol::ToJson(m).dump()}})
                    .ok());
    a.ranks.push_back(r);
    a.beats->push_back(protocol::BeatOf(m, written));
  }
  return a;
}

// The agent's next heartbeat: later, its counters moved.
void Beat(redis::RedisConnection& c, protocol::AgentHeartbeat& a) {
  a.header.at_ns = NowNs();
  for (protocol::RankBeat& b : *a.beats) b.records += 10;
  EXPECT_TRUE(redis::HSet(c, protocol::FormatKey(protocol::kAgentKey, {kJob, "node0", {}}).value(),
                          {{"msg", protocol::ToJson(a).dump()}})
                  .ok());
}

// With beats in the agent key, a re-read reads the agent key and no rank key whose content it
// holds: 200 ranks re-read for four seconds cost a handful of HGETALLs, not 200 per re-read. A
// rank whose beat names new content is read again (here: it exited, and leaves the view).
TEST_F(ControllerRedisTest, RankKeysAreReadAgainOnlyWhenTheirBeatNamesNewContent) {
  constexpr std::int64_t kRanks = 200;
  const std::int64_t written = NowNs();
  protocol::AgentHeartbeat a = WriteBeatingRanks(*conn_, kRanks, written);
  Beat(*conn_, a);
  StartController("--view-keys-per-s 100000");  // re-reads every 100 ms (view-ms)
  ASSERT_TRUE(RanksInViewThenResetStats(kRanks)) << ReadFile(log_);
  for (int i = 0; i < 8; ++i) {
    Beat(*conn_, a);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  const long long calls = testing::InfoCounter(*conn_, "commandstats", "cmdstat_hgetall", "calls");
  // Re-reads at most every 100 ms: up to ~40 of them, one HGETALL each (the agent key).
  EXPECT_GE(calls, 4) << ReadFile(log_);
  EXPECT_LT(calls, kRanks) << "a re-read read the rank keys again: " << ReadFile(log_);

  protocol::RankRegistration gone;
  gone.header = {kJob, "node0", written + 1};
  gone.rank = 7;
  gone.pid = 107;
  gone.started_ns = 1;
  gone.state = "exited";
  ASSERT_TRUE(redis::HSet(*conn_, Key(protocol::kRankKey, "", 7), {{"msg", protocol::ToJson(gone).dump()}}).ok());
  (*a.beats)[7].written_ns = gone.header.at_ns;
  Beat(*conn_, a);
  EXPECT_TRUE(WaitUntil([&] {
    const json s = State();
    return s.is_object() && s["ranks"] == kRanks - 1;
  }, 20)) << State().dump() << ReadFile(log_);
}

// A rank whose content is held still counts against view-keys-per-s: the view is rebuilt from
// every registration, so 201 keys at 201 a second is a re-read a second (two SCANs each, one
// per key pattern), not one every view-ms (100 ms).
TEST_F(ControllerRedisTest, HeldRanksCountAgainstTheViewsKeysPerSecond) {
  constexpr std::int64_t kRanks = 200;
  protocol::AgentHeartbeat a = WriteBeatingRanks(*conn_, kRanks, NowNs());
  Beat(*conn_, a);
  StartController("--view-keys-per-s 201");
  ASSERT_TRUE(RanksInViewThenResetStats(kRanks)) << ReadFile(log_);
  std::this_thread::sleep_for(std::chrono::seconds(4));
  const long long scans = testing::InfoCounter(*conn_, "commandstats", "cmdstat_scan", "calls");
  const long long reads = testing::InfoCounter(*conn_, "commandstats", "cmdstat_hgetall", "calls");
  EXPECT_LE(scans, 2 * 5) << ReadFile(log_);  // four seconds: two to five re-reads
  EXPECT_GE(scans, 2 * 2) << ReadFile(log_);
  EXPECT_LE(reads, 5) << "the rank keys' contents are held";
}

// The config file is read as the agent reads its own: anything but a small regular text file,
// unknown or agent-only names, and non-finite numbers are refused (exit 2, at once, naming the
// file and what is wrong); a file holding the password that others may read is warned about.
TEST_F(ControllerRedisTest, ConfigFilesAreCheckedAsTheAgentChecksItsOwn) {
  const std::string bin = testing::BinDir("daemon") + "/falcon-controller";
  auto file = [&](const std::string& name, const std::string& text) {
    const std::string path = dir_.path() + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    ::chmod(path.c_str(), 0600);
    return path;
  };
  struct Case {
    std::string path;
    std::string why;
  } cases[] = {
      {"/dev/zero", "is a character device"},
      {dir_.path(), "is a directory"},
      {file("big.conf", std::string((1 << 20) + 1, '#')), "larger than"},
      {file("binary.conf", std::string("\x7f" "ELF\x02\x01\x01\0\0\0", 10)), "control character"},
      {file("garbage.conf", "this is not a config\n"), "expected 'name = value'"},
      {file("unknown.conf", "job = \"a\"\nno-such-option = 1\n"), ":2: unknown option 'no-such-option'"},
      {file("agent.conf", "tick_ms = 5\n"), "unknown option 'tick_ms'"},
      {file("nan.conf", "max-pause-s = nan\n"), ":1: max-pause-s: "},
      {file("inf.conf", "gemm-ratio = inf\n"), ":1: gemm-ratio: "},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path);
    for (const std::vector<std::string>& how : std::vector<std::vector<std::string>>{
             {bin, "--config", c.path, "--print-config"}, {bin, "--print-config"}}) {
      const std::vector<std::string> env =
          how.size() == 2 ? std::vector<std::string>{"FALCON_CONTROLLER_CONFIG=" + c.path} : std::vector<std::string>{};
      const testing::ProcessResult r = testing::Run(how, env, 20);
      EXPECT_FALSE(r.timed_out);
      EXPECT_EQ(r.exit_code, 2) << r.err;
      EXPECT_NE(r.err.find(c.why), std::string::npos) << r.err;
      EXPECT_NE(r.err.find(c.path), std::string::npos) << "names the file: " << r.err;
    }
  }
  for (const char* value : {"nan", "inf"}) {  // from a flag and from the environment too
    testing::ProcessResult r = testing::Run({bin, "--max-pause-s", value, "--print-config"}, {}, 20);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("--max-pause-s"), std::string::npos) << r.err;
    r = testing::Run({bin, "--print-config"}, {std::string("FALCON_CONTROLLER_GEMM_RATIO=") + value}, 20);
    EXPECT_EQ(r.exit_code, 2) << r.err;
  }
  // Read, and a flag beats it; a password file open to others is warned about, and used.
  const std::string conf = file("ok.conf", "job = \"fromfile\"\nmax-pause-s = 30\nredis-password = \"\"\n");
  testing::ProcessResult r = testing::Run({bin, "--config", conf, "--max-pause-s", "40", "--print-config"}, {}, 20);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("job=\"fromfile\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("max-pause-s=40"), std::string::npos) << r.out;
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << "no password in it: " << r.err;
  const std::string secret = file("secret.conf", "job = \"hostile\"\nredis-password = \"hunter2\"\n");
  for (const mode_t mode : {0644, 0600}) {
    ASSERT_EQ(::chmod(secret.c_str(), mode), 0);
    r = testing::Run({bin, "--config", secret, "--print-config"}, {}, 20);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out.find("hunter2"), std::string::npos);
    EXPECT_EQ(r.err.find("chmod 600") != std::string::npos, mode == 0644) << r.err;
  }
  // The running controller logs it as a warning, first thing (this Redis has no password: the
  // controller then retries its AUTH, which does not matter here).
  ASSERT_EQ(::chmod(secret.c_str(), 0644), 0);
  const std::string cmd = "exec '" + bin + "' --config '" + secret + "' --redis-port " + std::to_string(redis_.port()) +
                          " --tick-ms 50 2>'" + log_ + "'";
  pid_ = testing::Spawn({"/bin/sh", "-c", cmd}, {});
  ASSERT_GT(pid_, 0);
  ASSERT_TRUE(WaitUntil([&] { return ReadFile(log_).find("event=config_exposed") != std::string::npos; }, 20))
      << ReadFile(log_);
  EXPECT_EQ(ReadFile(log_).find("hunter2"), std::string::npos);
}

}  // namespace
}  // namespace falcon
