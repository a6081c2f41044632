// falcon-ctl's Redis commands end to end: the real falcon-ctl binary as a subprocess against a
// real redis-server (tests/support/redis_server.h). The test writes what agents would write, in
// the protocol's format (daemon/protocol/messages.h), and plays the agent for commands: it reads
// the command from the host's command stream and writes an ack. Waits use deadlines, never
// fixed sleeps.
#include <signal.h>
#include <sys/wait.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "daemon/protocol/keys.h"
#include "daemon/protocol/messages.h"
#include "daemon/protocol/validate.h"
#include "daemon/redis/redis_commands.h"
#include "tests/support/redis_server.h"
#include "tests/support/subprocess.h"

namespace falcon {
namespace {

using nlohmann::json;
using protocol::KeyVars;

constexpr char kJob[] = "ctljob";

std::string CtlPath() { return testing::BinDir("daemon") + "/falcon-ctl"; }

std::string Key(const protocol::KeySpec& spec, const std::string& host = "",
                std::optional<std::int64_t> rank = std::nullopt) {
  Result<std::string> k = protocol::FormatKey(spec, KeyVars{kJob, host, rank});
  EXPECT_TRUE(k.ok()) << k.status().ToString();
  return k.ok() ? k.value() : std::string();
}

std::int64_t Now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

class CtlRedisTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(server_.Start().ok()) << server_.Log();
    conn_ = std::make_unique<redis::RedisConnection>(server_.ClientOptions());
    ASSERT_TRUE(conn_->Connect().ok());
  }

  testing::ProcessResult Ctl(std::vector<std::string> args, double timeout_s = 20) {
    std::vector<std::string> argv{CtlPath()};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"--port", std::to_string(server_.port()), "--job", kJob});
    return testing::Run(argv, {}, timeout_s);
  }

  void RegisterAgent(const std::string& host, std::vector<std::int64_t> ranks) {
    protocol::AgentHeartbeat hb;
    hb.header = {kJob, host, Now()};
    hb.pid = 4242;
    hb.version = "0.1.0";
    hb.started_ns = Now() - 1000000000;
    hb.ranks = ranks;
    ASSERT_TRUE(redis::HSet(*conn_, Key(protocol::kAgentKey, host),
                            {{"msg", protocol::ToJson(hb).dump()}})
                    .ok());
    for (std::int64_t r : ranks) {
      protocol::RankRegistration reg;
      reg.header = {kJob, host, Now()};
      reg.rank = r;
      reg.pid = 5000 + static_cast<int>(r);
      reg.mode = "track";
      reg.period = 9;
      reg.iterations = 100 + static_cast<std::uint64_t>(r);
      ASSERT_TRUE(redis::HSet(*conn_, Key(protocol::kRankKey, "", r),
                              {{"msg", protocol::ToJson(reg).dump()}})
                      .ok());
    }
  }

  // Reads the next command from `host`'s stream after `*last` (plays the agent).
  std::optional<protocol::Command> NextCommand(const std::string& host, std::string* last) {
    std::optional<protocol::Command> out;
    testing::WaitUntil(
        [&] {
          auto r = redis::XRead(*conn_, {{Key(protocol::kCommandsStream, host), *last}}, 1, 100);
          if (!r.ok() || r.value().empty() || r.value()[0].entries.empty()) return false;
          const redis::StreamEntry& e = r.value()[0].entries[0];
          *last = e.id;
          Result<protocol::Command> c = protocol::ParseCommand(*e.Field("msg"));
          EXPECT_TRUE(c.ok()) << c.status().ToString();
          if (c.ok()) out = c.value();
          return true;
        },
        15);
    return out;
  }

  void WriteAck(const std::string& host, const protocol::Command& c, const std::string& status) {
    protocol::Ack ack;
    ack.header = {kJob, host, Now()};
    ack.command = c.id;
    ack.command_type = c.type;
    ack.status = status;
    ack.ranks = {0, 1};
    ASSERT_TRUE(redis::XAdd(*conn_, Key(protocol::kAcksStream), 0,
                            {{"msg", protocol::ToJson(ack).dump()}})
                    .ok());
  }

  testing::RedisServer server_;
  std::unique_ptr<redis::RedisConnection> conn_;
};

TEST_F(CtlRedisTest, StatusWithNoDataExitsInput) {
  testing::ProcessResult r = Ctl({"status"});
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_NE(r.err.find("no agents or ranks registered for job 'ctljob'"), std::string::npos) << r.err;
}

TEST_F(CtlRedisTest, StatusShowsRanksAndSkipsMalformed) {
  RegisterAgent("node0", {0, 1});
  protocol::IterationBatch b;
  b.header = {kJob, "node0", Now()};
  b.rank = 1;
  b.pid = 5001;
  b.period = 9;
  b.start_ns = {Now() - 2000000, Now() - 1000000};
  b.seconds = {0.030, 0.045};
  ASSERT_TRUE(redis::XAdd(*conn_, Key(protocol::kIterationsStream), 0,
                          {{"msg", protocol::ToJson(b).dump()}})
                  .ok());
  ASSERT_TRUE(redis::HSet(*conn_, Key(protocol::kRankKey, "", 7), {{"msg", "{not json"}}).ok());
  ASSERT_TRUE(redis::XAdd(*conn_, Key(protocol::kIterationsStream), 0,
                          {{"msg", R"({"v":2,"type":"iterations"})"}})
                  .ok());

  testing::ProcessResult r = Ctl({"status"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("no controller"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("node0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("45.00"), std::string::npos) << "rank 1's current iteration time\n" << r.out;
  EXPECT_NE(r.err.find("warning"), std::string::npos) << r.err;

  testing::ProcessResult j = Ctl({"status", "--json"});
  ASSERT_EQ(j.exit_code, 0) << j.err;
  json doc = json::parse(j.out);
  ASSERT_EQ(doc["ranks"].size(), 2u) << j.out;
  EXPECT_EQ(doc["ranks"][0]["rank"], 0);
  EXPECT_EQ(doc["ranks"][1]["period"], 9);
  EXPECT_DOUBLE_EQ(doc["ranks"][1]["current_s"].get<double>(), 0.045);
  EXPECT_EQ(doc["agents"].size(), 1u);
}

TEST_F(CtlRedisTest, StatusSkipsKeysOfTheWrongType) {
  RegisterAgent("node0", {0, 1});
  for (const std::string& key : {Key(protocol::kRankKey, "", 5), Key(protocol::kAgentKey, "node9"),
                                 Key(protocol::kIterationsStream), Key(protocol::kAlarmsStream)}) {
    ASSERT_TRUE(conn_->Command({"SET", key, "not what the protocol says"}).ok());
  }
  testing::ProcessResult j = Ctl({"status", "--json"});
  ASSERT_EQ(j.exit_code, 0) << j.err;
  EXPECT_EQ(json::parse(j.out)["ranks"].size(), 2u) << j.out;
  for (const char* key : {"rank:5", "agent:node9", "iterations", "alarms"}) {
    EXPECT_NE(j.err.find(std::string(key) + ": redis: WRONGTYPE"), std::string::npos) << key << "\n" << j.err;
  }
}

TEST_F(CtlRedisTest, IncidentsListedNewestLastAndMalformedSkipped) {
  for (int i = 0; i < 3; ++i) {
    json inc = {{"v", protocol::kSchemaVersion}, {"type", "incident"}, {"id", "inc-" + std::to_string(i)},
                {"job", kJob}, {"stage", "detection"}, {"at_ns", Now()},
                {"summary", "rank 3 slow " + std::to_string(i)}, {"ranks", {3}}};
    ASSERT_TRUE(protocol::ValidateMessage(inc, protocol::kIncident).ok());
    ASSERT_TRUE(redis::XAdd(*conn_, Key(protocol::kIncidentsStream), 0, {{"msg", inc.dump()}}).ok());
    if (i == 1) {
      ASSERT_TRUE(redis::XAdd(*conn_, Key(protocol::kIncidentsStream), 0,
                              {{"msg", R"({"v":2,"type":"incident","id":"bad"})"}})
                      .ok());
    }
  }
  testing::ProcessResult r = Ctl({"incidents"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_LT(r.out.find("inc-0"), r.out.find("inc-2")) << r.out;
  EXPECT_NE(r.err.find("bad incident message skipped"), std::string::npos) << r.err;

  testing::ProcessResult j = Ctl({"incidents", "--json", "-n", "2"});
  ASSERT_EQ(j.exit_code, 0) << j.err;
  json doc = json::parse(j.out);
  ASSERT_EQ(doc["incidents"].size(), 1u) << "the newest 2 entries hold one bad one\n" << j.out;
  EXPECT_EQ(doc["incidents"][0]["msg"]["id"], "inc-2");
}

TEST_F(CtlRedisTest, PlanShowsThePlanInForceItsAcksAndTheDecisions) {
  testing::ProcessResult none = Ctl({"plan"});
  EXPECT_EQ(none.exit_code, 3) << none.out << none.err;
  EXPECT_NE(none.err.find("nothing is known about job 'ctljob'"), std::string::npos) << none.err;

  RegisterAgent("node0", {0, 1});
  testing::ProcessResult empty = Ctl({"plan"});
  ASSERT_EQ(empty.exit_code, 0) << empty.err;
  EXPECT_NE(empty.out.find("no mitigation plan has been published"), std::string::npos) << empty.out;

  // Rank 1's framework applied plan 3; rank 0 has not yet.
  json reg = json::parse(redis::HGetAll(*conn_, Key(protocol::kRankKey, "", 1)).value().at("msg"));
  reg["plan_applied"] = 3;
  ASSERT_TRUE(redis::HSet(*conn_, Key(protocol::kRankKey, "", 1), {{"msg", reg.dump()}}).ok());
  const json plan = {{"v", protocol::kSchemaVersion}, {"type", "mitigation_plan"}, {"job", kJob}, {"at_ns", Now()},
                     {"incident", "inc-7"}, {"mode", "act"}, {"plan_version", 3}, {"strategy", "S2"},
                     {"micro_batches", {8, 8, 5, 11}}, {"expected_gain", 0.31}, {"reason", "rank 5 is 2x slow"}};
  ASSERT_TRUE(protocol::ValidateMessage(plan, protocol::kMitigationPlan).ok());
  ASSERT_TRUE(redis::HSet(*conn_, Key(protocol::kPlanKey), {{"msg", plan.dump()}}).ok());
  for (const char* strategy : {"S1", "S2"}) {
    json d = {{"v", protocol::kSchemaVersion}, {"type", "incident"}, {"id", "inc-7"}, {"job", kJob},
              {"stage", "decision"}, {"at_ns", Now()}, {"summary", std::string(strategy) + " chosen"},
              {"strategy", strategy}};
    ASSERT_TRUE(redis::XAdd(*conn_, Key(protocol::kIncidentsStream), 0, {{"msg", d.dump()}}).ok());
  }
  testing::ProcessResult r = Ctl({"plan", "--history"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("plan v3  S2  mode act  incident inc-7"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[8,8,5,11] per DP replica"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("31% shorter"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("applied by 1 rank(s), rejected by 0, pending 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("# 2 decision(s)"), std::string::npos) << r.out;

  testing::ProcessResult j = Ctl({"plan", "--json", "--history"});
  ASSERT_EQ(j.exit_code, 0) << j.err;
  const json doc = json::parse(j.out);
  EXPECT_EQ(doc["plan"]["micro_batches"], json({8, 8, 5, 11}));
  EXPECT_EQ(doc["acks"]["applied"], json({1}));
  EXPECT_EQ(doc["acks"]["pending"], json({0}));
  ASSERT_EQ(doc["decisions"].size(), 2u);
  EXPECT_EQ(doc["decisions"][1]["strategy"], "S2");

  // A corrupt plan hash is reported and treated as no plan, never used.
  ASSERT_TRUE(redis::HSet(*conn_, Key(protocol::kPlanKey), {{"msg", R"({"v":2,"type":"mitigation_plan","job":"x"})"}}).ok());
  testing::ProcessResult bad = Ctl({"plan", "--json"});
  ASSERT_EQ(bad.exit_code, 0) << bad.err;
  EXPECT_TRUE(json::parse(bad.out)["plan"].is_null()) << bad.out;
  EXPECT_NE(bad.err.find("warning"), std::string::npos) << bad.err;
}

TEST_F(CtlRedisTest, EventsFollowPrintsPublishedAlert) {
  testing::TempDir dir;
  const std::string out = dir.path() + "/events.out";
  const pid_t pid = testing::Spawn(
      {"/bin/sh", "-c",
       "exec " + CtlPath() + " events --follow --json --port " + std::to_string(server_.port()) +
           " --job " + kJob + " > " + out},
      {});
  ASSERT_GT(pid, 0);
  protocol::Alert a;
  a.job = kJob;
  a.at_ns = Now();
  a.severity = "warning";
  a.source = "agent";
  a.summary = "rank 2 slow: 2.1x baseline";
  a.rank = 2;
  const std::string channel = Key(protocol::kAlertsChannel);
  // Publish (a bad one, then a good one) until the subscriber has received one.
  EXPECT_TRUE(testing::WaitUntil(
      [&] {
        (void)redis::Publish(*conn_, channel, "{\"v\":1}");  // skipped with a warning
        Result<std::int64_t> n = redis::Publish(*conn_, channel, protocol::ToJson(a).dump());
        return n.ok() && n.value() > 0;
      },
      15));
  std::string line;
  EXPECT_TRUE(testing::WaitUntil(
      [&] {
        std::ifstream f(out);
        return static_cast<bool>(std::getline(f, line)) && !line.empty();
      },
      10));
  kill(pid, SIGINT);
  EXPECT_EQ(testing::WaitFor(pid, 10), 0);
  json got = json::parse(line);
  EXPECT_EQ(got["summary"], a.summary);
  EXPECT_EQ(got["rank"], 2);
}

TEST_F(CtlRedisTest, ModeCommandWrittenAndAckAwaited) {
  RegisterAgent("node0", {0, 1});
  testing::ProcessResult r;
  std::thread ctl([&] { r = Ctl({"mode", "profile", "--json", "--timeout", "15"}); });
  std::string last = "0-0";
  std::optional<protocol::Command> c = NextCommand("node0", &last);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->type, "set_mode");
  EXPECT_EQ(c->mode, "profile");
  EXPECT_FALSE(c->ranks.has_value()) << "no --ranks: every rank of the agent";
  WriteAck("node0", *c, "ok");
  ctl.join();
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  json doc = json::parse(r.out);
  EXPECT_EQ(doc["targets"][0]["ack"]["status"], "ok");
  EXPECT_EQ(doc["targets"][0]["command"], c->id);
}

TEST_F(CtlRedisTest, PauseAckNotOkExitsOne) {
  RegisterAgent("node0", {0, 1});
  testing::ProcessResult r;
  std::thread ctl([&] {
    r = Ctl({"pause", "--iteration", "5", "--comm", "00000000000000cd", "--seq", "120", "--ranks",
             "1", "--timeout", "15"});
  });
  std::string last = "0-0";
  std::optional<protocol::Command> c = NextCommand("node0", &last);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->type, "pause");
  EXPECT_EQ(c->at_iteration, 5u);
  EXPECT_EQ(c->comm, std::optional<std::string>("00000000000000cd"));
  EXPECT_EQ(c->comm_seq, std::optional<std::uint64_t>(120));
  ASSERT_TRUE(c->ranks.has_value());
  EXPECT_EQ(*c->ranks, std::vector<std::int64_t>{1});
  // A malformed ack first: reported and skipped.
  ASSERT_TRUE(redis::XAdd(*conn_, Key(protocol::kAcksStream), 0, {{"msg", "[]"}}).ok());
  WriteAck("node0", *c, "unsupported");
  ctl.join();
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("unsupported"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("warning"), std::string::npos) << r.err;
}

TEST_F(CtlRedisTest, ValidateCommandCarriesItsFieldsToEveryAgent) {
  RegisterAgent("node0", {0, 1});
  RegisterAgent("node1", {2, 3});
  testing::ProcessResult r;
  std::thread ctl([&] {
    r = Ctl({"validate", "--task", "p2p", "--comm", "00000000000000ab", "--peer", "1", "--bytes",
             "1048576", "--timeout", "15"});
  });
  for (const char* host : {"node0", "node1"}) {
    std::string last = "0-0";
    std::optional<protocol::Command> c = NextCommand(host, &last);
    ASSERT_TRUE(c.has_value()) << host;
    EXPECT_EQ(c->type, "validate");
    EXPECT_EQ(c->task, "p2p");
    EXPECT_EQ(c->comm, std::optional<std::string>("00000000000000ab"));
    EXPECT_EQ(c->peer, std::optional<std::int64_t>(1));
    EXPECT_EQ(c->bytes, std::optional<std::int64_t>(1048576));
    WriteAck(host, *c, "ok");
  }
  ctl.join();
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("node1"), std::string::npos) << r.out;
}

TEST_F(CtlRedisTest, NoAckInTimeExitsUnreachable) {
  RegisterAgent("node0", {0});
  testing::ProcessResult r = Ctl({"resume", "--timeout", "0.5"});
  EXPECT_EQ(r.exit_code, 4) << r.out << r.err;
  EXPECT_NE(r.out.find("NO ACK"), std::string::npos) << r.out;
}

TEST_F(CtlRedisTest, PauseWithoutACutIsAUsageError) {
  RegisterAgent("node0", {0});
  testing::ProcessResult r = Ctl({"pause"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("--iteration"), std::string::npos) << r.err;
}

TEST(CtlRedisUnreachableTest, ExitsFourWithClearMessage) {
  const int port = testing::FreeLoopbackPort();
  for (const char* cmd : {"status", "incidents", "mode"}) {
    std::vector<std::string> argv{CtlPath(), cmd, "--port", std::to_string(port), "--timeout", "1"};
    if (std::string(cmd) == "mode") argv.push_back("track");
    testing::ProcessResult r = testing::Run(argv, {}, 20);
    EXPECT_EQ(r.exit_code, 4) << cmd << ": " << r.err;
    EXPECT_NE(r.err.find("cannot reach Redis at 127.0.0.1:" + std::to_string(port)), std::string::npos)
        << r.err;
  }
}

// Every usage error exits 2, the documented code (CLI11's own are 100 and up), whatever the
// parser's complaint; --help and --version exit 0. Numbers that would wrap or never end are
// usage errors too: --timeout nan/inf (a wait without end), incidents -n -1 (2^64-1 entries).
TEST(CtlUsageTest, EveryUsageErrorExitsTwo) {
  const int port = testing::FreeLoopbackPort();  // nothing listens: a command that ran would exit 4
  const std::string p = std::to_string(port);
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {},                                         // no subcommand
           {"no-such-command"},                        // unknown subcommand
           {"status", "--no-such-flag", "--port", p},  // unknown flag
           {"status", "--port"},                       // flag without its value
           {"status", "--port", "http"},               // not a number
           {"status", "--port", "70000"},              // out of range
           {"status", "--port", p, "--timeout", "nan"},
           {"status", "--port", p, "--timeout", "inf"},
           {"status", "--port", p, "--timeout", "-1"},
           {"incidents", "--port", p, "-n", "-1"},
           {"events", "--port", p, "-n", "-5"},
           {"incidents", "--port", p, "-n", "nan"},
           {"mode", "--port", p},  // its positional argument missing
           {"mode", "fast", "--port", p},
           {"pause", "--port", p, "--iteration", "-1"},
           {"pause", "--port", p, "--iteration", "5", "--max-pause", "nan"},
           {"analyze-trace"},
           {"analyze-trace", "f.csv", "--hazard", "nan"},
           {"trace", "--limit", "-1", "1"},
       }) {
    std::vector<std::string> argv{CtlPath()};
    argv.insert(argv.end(), args.begin(), args.end());
    const testing::ProcessResult r = testing::Run(argv, {}, 20);
    std::string line;
    for (const std::string& a : args) line += a + " ";
    EXPECT_FALSE(r.timed_out) << line;
    EXPECT_EQ(r.exit_code, 2) << line << "\n" << r.err;
    EXPECT_FALSE(r.err.empty()) << line;
  }
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{{"--help"}, {"--version"},
                                                                                   {"status", "--help"}}) {
    std::vector<std::string> argv{CtlPath()};
    argv.insert(argv.end(), args.begin(), args.end());
    EXPECT_EQ(testing::Run(argv, {}, 20).exit_code, 0) << args[0];
  }
}

// analyze-trace on numbers that used to pass: a 1e308 iteration time (an infinite ratio, printed
// as inf, null in JSON) and start times of 1e26 ns (0 s iterations) are refused naming the line;
// times that are valid but make implausible iterations are left out with a warning; the extremes
// of the plausible range still give finite ratios.
TEST(CtlAnalyzeTraceTest, ImplausibleNumbersAreRefusedOrWarnedAboutAndRatiosStayFinite) {
  testing::TempDir dir;
  auto write = [&](const std::string& name, const std::string& text) {
    const std::string path = dir.path() + "/" + name;
    std::ofstream(path) << text;
    return path;
  };
  std::string csv = "iter,seconds\n";
  for (int i = 0; i < 150; ++i) csv += std::to_string(i) + "," + (i < 100 ? "0.5" : "1e308") + "\n";
  testing::ProcessResult r = testing::Run({CtlPath(), "analyze-trace", write("huge.csv", csv), "--json"}, {}, 60);
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_NE(r.err.find("line 102: iteration time 1e+308 s is implausible"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("null"), std::string::npos) << r.out;
  // The plausible extremes: a ratio of 1e15 at most, finite in the table and in JSON.
  csv = "iter,seconds\n";
  for (int i = 0; i < 300; ++i) csv += std::to_string(i) + "," + (i < 150 ? "1e-9" : "1e6") + "\n";
  const std::string extremes = write("extremes.csv", csv);
  r = testing::Run({CtlPath(), "analyze-trace", extremes, "--json"}, {}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("null"), std::string::npos) << r.out;
  const json j = json::parse(r.out);
  ASSERT_FALSE(j["alarms"].empty()) << r.out;
  for (const json& a : j["alarms"]) EXPECT_TRUE(a["ratio"].is_number()) << a.dump();
  r = testing::Run({CtlPath(), "analyze-trace", extremes}, {}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find(" inf"), std::string::npos) << r.out;
  // Call records: a 1e26 start time is refused; records 1e16 ns apart (1e7 s iterations) are read,
  // and their iterations left out with a warning.
  std::string records;
  for (int i = 0; i < 400; ++i) {
    const std::string t = std::to_string(static_cast<long long>(i) * 10'000'000'000'000'000LL / 2);
    records += R"({"op":"ncclAllReduce","comm":"00000000000abcde","bytes":4096,"t_start_ns":)" + t + R"(,"pid":9})" "\n";
    records += R"({"op":"ncclBroadcast","comm":"00000000000abcde","bytes":64,"t_start_ns":)" + t + R"(,"pid":9})" "\n";
  }
  r = testing::Run({CtlPath(), "analyze-trace", "--records", "--json", write("far.jsonl", records)}, {}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("warning: pid 9: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("iteration time(s) outside 1e-09..1e+06 s left out"), std::string::npos) << r.err;
  const json far = json::parse(r.out);
  EXPECT_TRUE(far["processes"][0]["iteration_seconds"].empty()) << r.out;
  EXPECT_GT(far["processes"][0]["implausible_iterations"].get<int>(), 0) << r.out;
  records = R"({"op":"ncclAllReduce","comm":"00000000000abcde","bytes":4096,"t_start_ns":1e26,"pid":9})" "\n";
  r = testing::Run({CtlPath(), "analyze-trace", "--records", write("e26.jsonl", records)}, {}, 60);
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_NE(r.err.find("line 1: bad call record: \"t_start_ns\" must be a whole number"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace falcon
