// Hang detection through the agent and Redis, end to end: the real falcon-agent, a real
// redis-server and falcon-train-emu's 8 ranks (TP2 x DP2 x PP2) over the strict NCCL emulator
// under the real shim. The job takes long checkpoints (every rank idle outside NCCL for longer
// than the stall bound: never a stall), then one rank's host stops issuing NCCL calls. The agent
// must report its waiting peers as stalled on the stalls stream (and nothing before), expose them
// on /metrics, and `falcon-ctl hang --agents` must name the stuck rank alone from the progress
// the agent sends back through Redis; the real falcon-controller, reading the stall reports,
// must open a hang incident naming that rank and its host. No fixed sleeps: every wait is a condition with a deadline.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/protocol/keys.h"
#include "daemon/protocol/validate.h"
#include "daemon/redis/redis_commands.h"
#include "tests/support/redis_server.h"
#include "tests/support/subprocess.h"

namespace falcon {
namespace {

using nlohmann::json;
using testing::WaitUntil;

constexpr const char* kJob = "hang";
constexpr const char* kHost = "node0";
constexpr int kRanks = 8;
constexpr int kStuckRank = 5;
constexpr double kFloorS = 2.0;        // the agent's stall floor here
constexpr double kCheckpointS = 4.0;   // each checkpoint's save: twice the floor

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

class AgentHangTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(redis_.Start().ok()) << redis_.Log();
    metrics_port_ = testing::FreeLoopbackPort();
    agent_log_ = dir_.path() + "/agent.log";
    shm_ = dir_.path() + "/shm";
    ASSERT_EQ(::mkdir(shm_.c_str(), 0700), 0);
  }
  void TearDown() override {
    if (job_ > 0) {
      ::kill(job_, SIGTERM);
      (void)testing::WaitFor(job_, 30);
    }
    if (controller_ > 0) {
      ::kill(controller_, SIGTERM);
      EXPECT_EQ(testing::WaitFor(controller_, 15), 0) << testing::ReadFile(controller_log_);
    }
    if (agent_ > 0) {
      ::kill(agent_, SIGTERM);
      EXPECT_EQ(testing::WaitFor(agent_, 15), 0) << testing::ReadFile(agent_log_);
    }
  }

  void StartAgent() {
    const std::string agent = testing::BinDir("daemon") + "/falcon-agent";
    const std::string cmd = "exec '" + agent + "' --job " + kJob + " --host " + kHost + " --shm-dir '" + shm_ +
                            "' --redis-port " + std::to_string(redis_.port()) + " --metrics-port " +
                            std::to_string(metrics_port_) +
                            " --poll-ms 50 --flush-ms 200 --heartbeat-ms 500 --key-ttl-s 5 --profile-ms 0"
                            " --command-block-ms 200 --stall-check-ms 250 --stall-floor-s " +
                            std::to_string(kFloorS) + " --stall-startup-s " + std::to_string(kFloorS) + " 2>'" +
                            agent_log_ + "'";
    agent_ = testing::Spawn({"/bin/sh", "-c", cmd}, {});
    ASSERT_GT(agent_, 0);
    ASSERT_TRUE(WaitUntil([&] { return HttpGet(metrics_port_, "/healthz").find("ok") != std::string::npos; }, 20))
        << testing::ReadFile(agent_log_);
  }

  // The controller, with the fail-slow path held back (an incident needs every rank slow, no
  // mitigation): the hang stage is under test.
  void StartController() {
    controller_log_ = dir_.path() + "/controller.log";
    const std::string ctl = testing::BinDir("daemon") + "/falcon-controller";
    const std::string cmd = "exec '" + ctl + "' --job " + kJob + " --redis-port " + std::to_string(redis_.port()) +
                            " --view-ms 500 --heartbeat-ms 1000 --min-slow-fraction 1 --mitigation off"
                            " --hang-wait-s 5 --log-level debug 2>'" + controller_log_ + "'";
    controller_ = testing::Spawn({"/bin/sh", "-c", cmd}, {});
    ASSERT_GT(controller_, 0);
  }

  std::vector<json> Incidents(redis::RedisConnection& c) {
    std::vector<json> out;
    const std::string key = protocol::FormatKey(protocol::kIncidentsStream, {kJob, kHost, {}}).value();
    Result<std::vector<redis::StreamEntry>> entries = redis::XRange(c, key, "-", "+", 0);
    if (!entries.ok()) return out;
    for (const redis::StreamEntry& e : entries.value()) {
      const std::string* msg = e.Field("msg");
      if (msg == nullptr) continue;
      Result<json> j = protocol::ParseMessage(*msg, protocol::kIncident);
      EXPECT_TRUE(j.ok()) << j.status().ToString() << ": " << *msg;
      if (j.ok()) out.push_back(std::move(j).value());
    }
    return out;
  }

  void StartJob(const std::vector<std::string>& extra) {
    std::vector<std::string> argv{testing::BinDir("bench/emu") + "/falcon-emu-run", "-n", std::to_string(kRanks),
                                  "--ranks-per-node", "4", "--job-timeout", "150", "--lib-dir", testing::EmuLibDir(),
                                  "--preload", testing::PreloadValue(), "--", testing::BinDir("bench/train") +
                                  "/falcon-train-emu", "--tp", "2", "--dp", "2", "--pp", "2", "--compute-ms", "2",
                                  "--iters", "100000", "--progress-every", "0"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    job_start_ns_ = testing::WallClockNs();
    job_ = testing::Spawn(argv, {"FALCON_SHM_DIR=" + shm_, std::string("FALCON_JOB=") + kJob});
    ASSERT_GT(job_, 0);
  }

  std::vector<json> Stalls(redis::RedisConnection& c) {
    std::vector<json> out;
    const std::string key = protocol::FormatKey(protocol::kStallsStream, {kJob, kHost, {}}).value();
    Result<std::vector<redis::StreamEntry>> entries = redis::XRange(c, key, "-", "+", 0);
    if (!entries.ok()) return out;
    for (const redis::StreamEntry& e : entries.value()) {
      const std::string* msg = e.Field("msg");
      EXPECT_NE(msg, nullptr);
      if (msg == nullptr) continue;
      Result<json> j = protocol::ParseMessage(*msg, protocol::kStall);
      EXPECT_TRUE(j.ok()) << j.status().ToString() << ": " << *msg;
      if (j.ok()) out.push_back(std::move(j).value());
    }
    return out;
  }

  testing::RedisServer redis_;
  testing::TempDir dir_;
  std::string shm_, agent_log_, controller_log_;
  int metrics_port_ = 0;
  pid_t agent_ = -1, job_ = -1, controller_ = -1;
  std::int64_t job_start_ns_ = 0;
};

TEST_F(AgentHangTest, StalledPeersAreReportedAndTheStuckRankIsNamedThroughRedis) {
  StartAgent();
  StartController();
  // Checkpoints at iterations 20 and 40, each a 4 s save on every rank; rank 5 stops before
  // iteration 60.
  StartJob({"--checkpoint-every", "20", "--checkpoint-save-ms", std::to_string(static_cast<int>(kCheckpointS * 1000)),
            "--inject-stall", std::to_string(kStuckRank) + ":60"});
  redis::RedisConnection c(redis_.ClientOptions());
  ASSERT_TRUE(c.Connect().ok());
  std::vector<json> stalls;
  ASSERT_TRUE(WaitUntil([&] { return !(stalls = Stalls(c)).empty(); }, 120))
      << "no stall reported\n" << testing::ReadFile(agent_log_);
  // Let every waiting peer's report arrive.
  (void)WaitUntil([&] { return false; }, 2 * kFloorS);
  stalls = Stalls(c);
  std::set<std::int64_t> stalled;
  for (const json& s : stalls) {
    // Two long checkpoints went by without a report: every entry is of the hang, none ended.
    EXPECT_EQ(s["kind"], "stalled") << s.dump();
    EXPECT_NE(s["rank"].get<std::int64_t>(), kStuckRank) << "the stuck rank has nothing outstanding: " << s.dump();
    EXPECT_TRUE(stalled.insert(s["rank"].get<std::int64_t>()).second) << "reported twice: " << s.dump();
    EXPECT_GT(s["age_s"].get<double>(), kFloorS) << s.dump();
    EXPECT_LT(s["age_s"].get<double>(), kFloorS + 3) << "detected late: " << s.dump();
    ASSERT_TRUE(s.contains("last_call_ns")) << s.dump();
    EXPECT_GT(s["last_call_ns"].get<std::int64_t>() - job_start_ns_, static_cast<std::int64_t>(2 * kCheckpointS * 1e9))
        << "the hang comes after both checkpoints: " << s.dump();
    EXPECT_TRUE(s.contains("comm")) << s.dump();
    std::printf("stalled: rank %lld reported %.2f s after its latest call (bound %.1f s), waiting in %s #%s\n",
                static_cast<long long>(s["rank"].get<std::int64_t>()), s["age_s"].get<double>(),
                s["bound_s"].get<double>(), s.value("op", std::string("?")).c_str(),
                s.contains("seq") ? std::to_string(s["seq"].get<std::uint64_t>()).c_str() : "?");
  }
  EXPECT_FALSE(stalled.empty());
  // /metrics shows the stalled ranks.
  const std::string metrics = HttpGet(metrics_port_, "/metrics");
  for (std::int64_t r : stalled) {
    EXPECT_NE(metrics.find("falcon_agent_rank_stalled{job=\"hang\",host=\"node0\",rank=\"" + std::to_string(r) + "\""),
              std::string::npos)
        << metrics;
  }
  EXPECT_NE(metrics.find("falcon_agent_stalls_total{job=\"hang\",host=\"node0\",kind=\"stalled\"} " +
                         std::to_string(stalled.size())),
            std::string::npos)
      << metrics;
  // The job-wide picture through Redis: every rank's progress from the agent, diagnosed.
  const testing::ProcessResult ctl = testing::Run(
      {testing::BinDir("daemon") + "/falcon-ctl", "hang", "--agents", "--job", kJob, "--redis",
       "redis://127.0.0.1:" + std::to_string(redis_.port()), "--json"},
      {}, 60);
  EXPECT_EQ(ctl.exit_code, 1) << ctl.out << ctl.err;  // findings
  const json doc = json::parse(ctl.out, nullptr, false);
  ASSERT_TRUE(doc.is_object()) << ctl.out << ctl.err;
  EXPECT_EQ(doc["ranks"].size(), static_cast<size_t>(kRanks)) << ctl.out;
  EXPECT_GE(doc["quiet_s"].get<double>(), kFloorS) << ctl.out;
  std::set<std::int64_t> named;
  for (const json& f : doc["findings"]) {
    EXPECT_EQ(f["kind"], "not_issued") << f.dump();
    for (const json& r : f["culprits"]) named.insert(r.get<std::int64_t>());
  }
  EXPECT_EQ(named, (std::set<std::int64_t>{kStuckRank})) << ctl.out;
  // And for people: the same verdict in the report, with the longest history asked for (more
  // than an ack holds for 8 ranks: the agent cuts it down to fit rather than fail to answer).
  const testing::ProcessResult text = testing::Run(
      {testing::BinDir("daemon") + "/falcon-ctl", "hang", "--agents", "--job", kJob, "--redis",
       "redis://127.0.0.1:" + std::to_string(redis_.port()), "--calls", "256"},
      {}, 60);
  EXPECT_EQ(text.exit_code, 1) << text.out << text.err;
  EXPECT_NE(text.out.find("culprit rank(s): 5"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("agent(s) of job hang (Redis)"), std::string::npos) << text.out;
  // The controller opened a hang incident from the stall reports: rank 5, on its host.
  std::vector<json> hangs;
  ASSERT_TRUE(WaitUntil(
      [&] {
        hangs.clear();
        for (json& m : Incidents(c)) {
          if (m["stage"] == "hang") hangs.push_back(std::move(m));
        }
        return !hangs.empty();
      },
      30))
      << testing::ReadFile(controller_log_);
  EXPECT_EQ(hangs.size(), 1u) << "one root cause, one entry";
  for (const json& h : hangs) {
    EXPECT_EQ(h["ranks"], json::array({kStuckRank})) << h.dump();
    EXPECT_EQ(h["detail"]["kind"], "not_issued") << h.dump();
    EXPECT_EQ(h["detail"]["hosts"][0]["host"], kHost) << h.dump();
    EXPECT_EQ(h["id"].get<std::string>().rfind("hang-", 0), 0u) << h.dump();
    std::printf("incident: %s (%.2f s after the first stall report)\n", h["summary"].get<std::string>().c_str(),
                static_cast<double>(h["at_ns"].get<std::int64_t>() - stalls.front()["at_ns"].get<std::int64_t>()) / 1e9);
  }
}

// No agent for the job: a clear error and exit 3, not a hang or an empty verdict.
TEST_F(AgentHangTest, HangAgentsWithoutAgentsSaysSo) {
  const testing::ProcessResult ctl = testing::Run(
      {testing::BinDir("daemon") + "/falcon-ctl", "hang", "--agents", "--job", "nobody", "--redis",
       "redis://127.0.0.1:" + std::to_string(redis_.port()), "--agent-timeout", "1"},
      {}, 30);
  EXPECT_EQ(ctl.exit_code, 3) << ctl.out << ctl.err;
  EXPECT_NE(ctl.err.find("no agent registered for job 'nobody'"), std::string::npos) << ctl.err;
  // Redis not there: exit 4, said so.
  const testing::ProcessResult down = testing::Run(
      {testing::BinDir("daemon") + "/falcon-ctl", "hang", "--agents", "--job", "nobody", "--redis",
       "redis://127.0.0.1:" + std::to_string(testing::FreeLoopbackPort()), "--agent-timeout", "1"},
      {}, 30);
  EXPECT_EQ(down.exit_code, 4) << down.out << down.err;
  EXPECT_NE(down.err.find("falcon-ctl hang:"), std::string::npos) << down.err;
  // --redis means nothing without --agents: refused, not ignored.
  const testing::ProcessResult usage = testing::Run(
      {testing::BinDir("daemon") + "/falcon-ctl", "hang", "--live", "--redis", "redis://127.0.0.1:1"}, {}, 30);
  EXPECT_EQ(usage.exit_code, 2) << usage.out << usage.err;
}

}  // namespace
}  // namespace falcon
