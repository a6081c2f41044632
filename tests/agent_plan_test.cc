// Mitigation plans end to end: the real falcon-agent, a real redis-server, and a 2-rank job of
// falcon-test-plan (tests/progs/plan_prog.cc) over the NCCL emulator with the real shim preloaded;
// the test plays the controller. Proves, in order: a plan command reaches every rank's shim and
// the framework reads it through falcon.h at an iteration boundary; its acks come back in the
// rank registrations (plan_applied / plan_rejected) and in /metrics; a plan that is not newer
// than what a rank holds leaves it alone ("stale"); an oversized plan and malformed plan
// commands are acked "rejected" with the reason and logged, garbage is dropped, and the agent
// goes on; a plan for a rank that is not running is held and handed to that rank's process when
// it starts, and to no other. Every message read back is validated against its schema. No fixed
// sleeps: every wait is a condition with a deadline.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "daemon/protocol/keys.h"
#include "daemon/protocol/messages.h"
#include "daemon/protocol/validate.h"
#include "daemon/redis/redis_commands.h"
#include "falcon/shm_abi.h"
#include "tests/support/redis_server.h"
#include "tests/support/subprocess.h"

namespace falcon {
namespace {

using nlohmann::json;
using testing::ReadFile;
using testing::WaitUntil;
using testing::WallClockNs;

constexpr const char* kJob = "plan";
constexpr const char* kHost = "node0";

std::string Key(const protocol::KeySpec& spec, std::optional<std::int64_t> rank = {}) {
  return protocol::FormatKey(spec, {kJob, kHost, rank}).value();
}

// GET http://127.0.0.1:port/path; "" on any failure.
std::string HttpGet(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    if (::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return out;
}

// The value of the plan_version metric line of `rank` in `state`, or -1.
double PlanMetric(const std::string& text, int rank, const std::string& state) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("falcon_agent_plan_version{", 0) == 0 &&
        line.find("rank=\"" + std::to_string(rank) + "\"") != std::string::npos &&
        line.find("state=\"" + state + "\"") != std::string::npos) {
      return std::stod(line.substr(line.rfind(' ') + 1));
    }
  }
  return -1;
}

void Touch(const std::string& path) { std::ofstream(path).put('\n'); }

class AgentPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(redis_.Start().ok()) << redis_.Log();
    metrics_port_ = testing::FreeLoopbackPort();
    shm_ = dir_.path() + "/shm";
    ASSERT_EQ(::mkdir(shm_.c_str(), 0700), 0);
    c_ = std::make_unique<redis::RedisConnection>(redis_.ClientOptions());
    ASSERT_TRUE(c_->Connect().ok());
    StartAgent();
  }
  void StartAgent() {
    // A log file per agent process: a restarted agent's waits never see its predecessor's lines.
    agent_log_ = dir_.path() + "/agent" + std::to_string(++agents_started_) + ".log";
    const std::string agent = testing::BinDir("daemon") + "/falcon-agent";
    const std::string cmd = "exec '" + agent + "' --job " + kJob + " --host " + kHost + " --shm-dir '" + shm_ +
                            "' --redis-port " + std::to_string(redis_.port()) + " --metrics-port " +
                            std::to_string(metrics_port_) +
                            " --poll-ms 20 --flush-ms 100 --heartbeat-ms 300 --key-ttl-s 30"
                            " --command-block-ms 100 --log-level debug 2>'" + agent_log_ + "'";
    agent_ = testing::Spawn({"/bin/sh", "-c", cmd}, {});
    ASSERT_GT(agent_, 0);
  }
  // SIGTERM, a clean exit, and a new agent process in its place.
  void RestartAgent() {
    // Up (its loop runs, so SIGTERM is handled) once it has reported its command connection.
    ASSERT_TRUE(AgentLogged("event=redis_up role=commands")) << ReadFile(agent_log_);
    ASSERT_EQ(::kill(agent_, SIGTERM), 0);
    ASSERT_EQ(testing::WaitFor(agent_, 15), 0) << ReadFile(agent_log_);
    agent_ = -1;
    StartAgent();
  }
  void TearDown() override {
    Touch(dir_.path() + "/stop");  // lets the programs end by themselves
    for (std::thread* t : {&job_, &late_}) {
      if (t->joinable()) t->join();
    }
    if (agent_ > 0) {
      ::kill(agent_, SIGTERM);
      // A clean stop (and, in sanitizer builds, no leak or error report) exits 0.
      EXPECT_EQ(testing::WaitFor(agent_, 15), 0) << ReadFile(agent_log_);
    }
  }

  std::vector<std::string> ProgEnv() const { return {"FALCON_SHM_DIR=" + shm_, "FALCON_JOB=" + std::string(kJob)}; }

  // The 2-rank job; its output is in job_out_ once it has exited.
  void StartJob() {
    std::vector<std::string> argv{testing::BinDir("bench/emu") + "/falcon-emu-run", "-n", "2", "--ranks-per-node", "2",
                                  "--job-timeout", "110", "--lib-dir", testing::EmuLibDir(), "--preload",
                                  testing::PreloadValue(), "--", testing::BinDir("tests") + "/falcon-test-plan",
                                  "train", "--reject-status", "5", "--stop-file", dir_.path() + "/stop",
                                  "--timeout", "90"};
    job_ = std::thread([this, argv] { job_out_ = testing::Run(argv, ProgEnv(), 120); });
  }

  // A process started after the plans, as rank 7 with the shim over the no-op NCCL: it waits for
  // plan `want` through falcon.h (falcon-test-plan api --late); its output in late_out_.
  void StartLateRank7(int want) {
    std::vector<std::string> env = ProgEnv();
    env.push_back("RANK=7");
    env.push_back("LD_LIBRARY_PATH=" + testing::NoopLibDir());
    env.push_back("LD_PRELOAD=" + testing::PreloadValue());
    const std::vector<std::string> argv{testing::BinDir("tests") + "/falcon-test-plan", "api", "--want",
                                        std::to_string(want), "--late", "1", "--stop-file", dir_.path() + "/stop",
                                        "--timeout", "60"};
    late_ = std::thread([this, argv, env] { late_out_ = testing::Run(argv, env, 90); });
  }

  // True once the current agent's log holds `text` (within timeout_s).
  bool AgentLogged(const std::string& text, double timeout_s = 20) {
    return WaitUntil([&] { return ReadFile(agent_log_).find(text) != std::string::npos; }, timeout_s);
  }

  // The registration of `rank` (validated), or null.
  json Registration(int rank) {
    auto h = redis::HGetAll(*c_, Key(protocol::kRankKey, rank));
    if (!h.ok() || h.value().count("msg") == 0) return json();
    auto m = protocol::ParseMessage(h.value()["msg"], protocol::kRankRegister);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? m.value() : json();
  }
  bool RegisteredWith(int rank, const char* field, int value) {
    const json m = Registration(rank);
    return m.is_object() && m.value(field, -1) == value;
  }

  protocol::Command Plan(int version, const std::string& strategy) {
    protocol::Command c;
    c.type = "plan";
    c.id = "plan-" + std::to_string(++commands_);
    c.issued_ns = WallClockNs();
    c.plan_version = version;
    c.strategy = strategy;
    return c;
  }

  // XADDs `payload` as a command and returns the ack for `id` (validated), or null.
  json Send(const std::string& id, const std::string& payload) {
    EXPECT_TRUE(redis::XAdd(*c_, Key(protocol::kCommandsStream), 0, {{"msg", payload}}).ok());
    json ack;
    const bool got = WaitUntil([&] {
      auto entries = redis::XRange(*c_, Key(protocol::kAcksStream), "-", "+", 0);
      if (!entries.ok()) return false;
      for (const auto& e : entries.value()) {
        const std::string* msg = e.Field("msg");
        if (msg == nullptr) continue;
        auto j = protocol::ParseMessage(*msg, protocol::kAck);
        EXPECT_TRUE(j.ok()) << j.status().ToString() << ": " << *msg;
        if (j.ok() && j.value()["command"] == id) {
          ack = j.value();
          return true;
        }
      }
      return false;
    }, 30);
    EXPECT_TRUE(got) << "no ack for " << id << "\n" << ReadFile(agent_log_);
    return ack;
  }
  json Send(const protocol::Command& c) { return Send(c.id, protocol::ToJson(c).dump()); }

  testing::RedisServer redis_;
  testing::TempDir dir_;
  std::unique_ptr<redis::RedisConnection> c_;
  std::string shm_, agent_log_;
  int metrics_port_ = 0;
  pid_t agent_ = -1;
  std::thread job_, late_;
  testing::ProcessResult job_out_, late_out_;
  int commands_ = 0;
  int agents_started_ = 0;
};

TEST_F(AgentPlanTest, PlansReachFrameworksAcksComeBackAndLateRanksCatchUp) {
  StartJob();
  ASSERT_TRUE(WaitUntil([&] { return Registration(0).is_object() && Registration(1).is_object(); }, 40))
      << ReadFile(agent_log_);
  EXPECT_FALSE(Registration(0).contains("plan_delivered")) << "no plan yet";

  // 1. A plan for every rank: delivered to both shims; rank 0's framework applies it, rank 1's
  //    rejects it (status 5); both answers come back in the registrations and in /metrics.
  protocol::Command v1 = Plan(1, "S2");
  v1.micro_batches = {3, 5};
  json ack = Send(v1);
  ASSERT_EQ(ack["status"], "ok") << ack.dump();
  EXPECT_EQ(ack["ranks"].size(), 2u) << ack.dump();
  ASSERT_EQ(ack["results"].size(), 2u);
  for (const json& r : ack["results"]) EXPECT_EQ(r["state"], "delivered") << ack.dump();
  ASSERT_TRUE(WaitUntil([&] { return RegisteredWith(0, "plan_applied", 1) && RegisteredWith(1, "plan_rejected", 1); },
                        30))
      << Registration(0).dump() << "\n" << Registration(1).dump() << "\n" << ReadFile(agent_log_);
  EXPECT_EQ(Registration(0).value("plan_delivered", 0), 1);
  EXPECT_FALSE(Registration(0).contains("plan_rejected"));
  EXPECT_FALSE(Registration(1).contains("plan_applied"));
  // Rank 0's framework reported what applying S2 cost it (falconReportCost: 0.1 s); rank 1
  // rejected the plan and reported nothing.
  EXPECT_DOUBLE_EQ(Registration(0).value("cost_s2", -1.0), 0.1) << Registration(0).dump();
  EXPECT_FALSE(Registration(0).contains("cost_s3"));
  EXPECT_FALSE(Registration(1).contains("cost_s2"));
  ASSERT_TRUE(WaitUntil([&] {
    const std::string m = HttpGet(metrics_port_, "/metrics");
    return PlanMetric(m, 0, "applied") == 1 && PlanMetric(m, 1, "rejected") == 1;
  }, 10)) << HttpGet(metrics_port_, "/metrics");
  const std::string metrics = HttpGet(metrics_port_, "/metrics");
  EXPECT_EQ(PlanMetric(metrics, 0, "delivered"), 1);
  EXPECT_EQ(PlanMetric(metrics, 1, "applied"), 0);
  EXPECT_NE(metrics.find("falcon_agent_plan_cost_seconds{"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("strategy=\"S2\"} 0.10000000000000001"), std::string::npos) << metrics;
  EXPECT_NE(ReadFile(agent_log_).find("event=plan_ack"), std::string::npos);

  // 2. The same version again (with other counts): every rank already holds it, left alone.
  protocol::Command again = Plan(1, "S2");
  again.micro_batches = {4, 4};
  ack = Send(again);
  EXPECT_EQ(ack["status"], "ok") << ack.dump();
  EXPECT_TRUE(ack["ranks"].empty()) << ack.dump();
  for (const json& r : ack["results"]) EXPECT_EQ(r["state"], "stale") << ack.dump();
  EXPECT_NE(ack["detail"].get<std::string>().find("left alone"), std::string::npos) << ack.dump();

  // 3. Oversized and malformed plans are rejected with the reason; garbage is dropped.
  protocol::Command huge = Plan(2, "S3");
  huge.placement.assign(FALCON_PLAN_MAX_PLACEMENT + 1, 0);
  ack = Send(huge);
  EXPECT_EQ(ack["status"], "rejected") << ack.dump();
  EXPECT_NE(ack["detail"].get<std::string>().find("FALCON_PLAN_MAX_PLACEMENT"), std::string::npos) << ack.dump();
  json bad = protocol::ToJson(Plan(2, "S2"));
  bad["id"] = "bad-range";
  bad["micro_batches"] = {2, 0};  // each must be 1..4096
  ack = Send("bad-range", bad.dump());
  EXPECT_EQ(ack["status"], "rejected") << ack.dump();
  EXPECT_EQ(ack["command_type"], "plan");
  EXPECT_NE(ack["detail"].get<std::string>().find("micro_batches"), std::string::npos) << ack.dump();
  ack = Send("no-version", R"({"v":2,"type":"plan","id":"no-version","issued_ns":1,"strategy":"S2"})");
  EXPECT_EQ(ack["status"], "rejected") << ack.dump();
  ASSERT_TRUE(redis::XAdd(*c_, Key(protocol::kCommandsStream), 0, {{"msg", "{not json"}}).ok());

  // 4. The agent goes on: plan 2 reaches both ranks.
  protocol::Command v2 = Plan(2, "S2");
  v2.micro_batches = {2, 6};
  ack = Send(v2);
  EXPECT_EQ(ack["status"], "ok") << ack.dump();
  EXPECT_EQ(ack["ranks"].size(), 2u);
  ASSERT_TRUE(WaitUntil([&] { return RegisteredWith(0, "plan_applied", 2) && RegisteredWith(1, "plan_rejected", 2); },
                        30))
      << ReadFile(agent_log_);
  const std::string log = ReadFile(agent_log_);
  EXPECT_NE(log.find("event=command_rejected"), std::string::npos) << log;
  EXPECT_NE(log.find("event=command_dropped"), std::string::npos) << log;
  EXPECT_NE(log.find("status=rejected"), std::string::npos);

  // 5. A plan for rank 7, which is not running: held. When rank 7's process starts, it gets
  //    plan 3 at once (no new command); ranks 0 and 1 keep plan 2.
  protocol::Command v3 = Plan(3, "S2");
  v3.micro_batches = {1, 7};
  v3.ranks = std::vector<std::int64_t>{7};
  ack = Send(v3);
  EXPECT_EQ(ack["status"], "ok") << ack.dump();
  EXPECT_TRUE(ack["ranks"].empty());
  EXPECT_NE(ack["detail"].get<std::string>().find("held"), std::string::npos) << ack.dump();
  StartLateRank7(3);
  ASSERT_TRUE(WaitUntil([&] { return RegisteredWith(7, "plan_applied", 3); }, 30))
      << Registration(7).dump() << "\n" << ReadFile(agent_log_);
  EXPECT_EQ(Registration(7).value("plan_delivered", 0), 3);
  EXPECT_NE(ReadFile(agent_log_).find("event=plan_delivered"), std::string::npos);
  EXPECT_EQ(Registration(0).value("plan_delivered", 0), 2) << "plan 3 was for rank 7 only";

  // 6. Everything ends cleanly; the frameworks saw exactly what was sent.
  Touch(dir_.path() + "/stop");
  job_.join();
  late_.join();
  EXPECT_EQ(job_out_.exit_code, 0) << job_out_.out << job_out_.err;
  EXPECT_NE(job_out_.out.find("rank 0 plan 1 strategy 2 mb [3,5]"), std::string::npos) << job_out_.out;
  EXPECT_NE(job_out_.out.find("rank 1 plan 2 strategy 2 mb [2,6]"), std::string::npos) << job_out_.out;
  EXPECT_NE(job_out_.out.find("ack 5 rc 0"), std::string::npos) << job_out_.out;
  EXPECT_EQ(job_out_.out.find("plan 3"), std::string::npos) << job_out_.out;
  EXPECT_EQ(late_out_.exit_code, 0) << late_out_.out << late_out_.err;
  EXPECT_EQ(late_out_.out.find("FAIL"), std::string::npos) << late_out_.out;
  EXPECT_NE(late_out_.out.find("mb version 3 count 2 [1,7]"), std::string::npos) << late_out_.out;
}

// The plan hash is the plan in force: an agent that starts (or restarts) reads it once and, in
// act mode, hands it to the ranks that start after it, as if the controller had just sent it.
// An advised plan is not the agent's to apply; a malformed one is dropped with a log line.
TEST_F(AgentPlanTest, ARestartedAgentHandsThePlanInForceToRanksThatStartLater) {
  const std::string key = Key(protocol::kPlanKey);
  auto set_plan = [&](const std::string& msg) {
    ASSERT_TRUE(redis::HSet(*c_, key, {{"msg", msg}}).ok());
  };
  auto plan = [&](const std::string& mode, int version) {
    return json{{"v", protocol::kSchemaVersion}, {"type", "mitigation_plan"}, {"job", kJob}, {"at_ns", WallClockNs()}, {"mode", mode},
                {"plan_version", version}, {"strategy", "S2"}, {"micro_batches", {2, 6}}}
        .dump();
  };
  set_plan("{\"v\": 1, \"type\": \"mitigation_plan\"");
  RestartAgent();
  ASSERT_TRUE(AgentLogged("event=plan_in_force_dropped")) << ReadFile(agent_log_);
  json out_of_range = json::parse(plan("act", 4));
  out_of_range["micro_batches"] = {2, -6};
  set_plan(out_of_range.dump());
  RestartAgent();
  ASSERT_TRUE(AgentLogged("event=plan_in_force_dropped")) << ReadFile(agent_log_);
  set_plan(plan("advise", 4));
  RestartAgent();
  ASSERT_TRUE(AgentLogged("event=plan_in_force_skipped")) << ReadFile(agent_log_);
  set_plan(plan("act", 4));
  RestartAgent();
  ASSERT_TRUE(AgentLogged("event=plan_in_force version=4")) << ReadFile(agent_log_);

  StartLateRank7(4);
  ASSERT_TRUE(WaitUntil([&] { return RegisteredWith(7, "plan_applied", 4); }, 30))
      << Registration(7).dump() << "\n" << ReadFile(agent_log_);
  Touch(dir_.path() + "/stop");
  late_.join();
  EXPECT_EQ(late_out_.exit_code, 0) << late_out_.out << late_out_.err;
  EXPECT_NE(late_out_.out.find("mb version 4 count 2 [2,6]"), std::string::npos) << late_out_.out;
}

}  // namespace
}  // namespace falcon
