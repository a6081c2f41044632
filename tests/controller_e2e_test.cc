// falcon-controller end to end: a real redis-server, one real falcon-agent per emulated node, the
// real controller, and a 16-rank emulated trainer (TP 2 x DP 4 x PP 2, 8 emulated nodes of 2
// ranks, falcon-emu-run --node-shm-dirs) under the real shim, with a fault plan. Each test waits
// for the incidents the controller writes (validated against their schema) and checks that the
// localisation names exactly the injected culprit — the slow GPU, the slow link's two nodes, the
// slow NIC's node — and nothing else; failure tests kill the controller mid-validation, kill an
// agent, restart Redis empty and inject malformed messages, and the job must always finish with
// its data verified (--check). No fixed sleeps: every wait is a condition with a deadline.
//
// Fabric (chosen so modelled times dominate the host's real copies, which vary with load):
// intra-node 0.2 GB/s, inter-node 0.05 GB/s; validation transfers 1 MiB; emulated GPUs 10 TFLOP/s.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <set>
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
using testing::ReadFile;
using testing::WaitUntil;

constexpr const char* kJob = "ctl-e2e";
constexpr int kNodes = 8;

class ControllerEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(redis_.Start().ok()) << redis_.Log();
    shm_ = dir_.path() + "/shm";
    for (int k = 0; k < kNodes; ++k) StartAgent(k);
    StartController();
  }

  void TearDown() override {
    if (job_ > 0) testing::WaitFor(job_, 0);
    if (controller_ > 0) testing::WaitFor(controller_, 0);
    for (pid_t& a : agents_) {
      if (a > 0) testing::WaitFor(a, 0);
    }
    if (HasFailure()) {
      std::fprintf(stderr, "---- controller log (tail) ----\n%s\n", Tail(dir_.path() + "/controller.log").c_str());
      std::fprintf(stderr, "---- job log (tail) ----\n%s\n", Tail(dir_.path() + "/job.log").c_str());
    }
  }

  static std::string Tail(const std::string& path) {
    const std::string all = ReadFile(path);
    return all.size() > 6000 ? all.substr(all.size() - 6000) : all;
  }

  void StartAgent(int node) {
    const std::string agent = testing::BinDir("daemon") + "/falcon-agent";
    const std::string cmd =
        "exec '" + agent + "' --job " + kJob + " --host node" + std::to_string(node) + " --shm-dir '" + shm_ +
        "/node" + std::to_string(node) + "' --redis-port " + std::to_string(redis_.port()) +
        " --metrics-port 0 --poll-ms 100 --flush-ms 250 --heartbeat-ms 500 --key-ttl-s 3 --profile-ms 2000"
        " --command-block-ms 200 --redis-backoff-min-ms 50 --redis-backoff-max-ms 500 2>>'" + dir_.path() +
        "/agent" + std::to_string(node) + ".log'";
    if (agents_.size() <= static_cast<size_t>(node)) agents_.resize(static_cast<size_t>(node) + 1, -1);
    agents_[static_cast<size_t>(node)] = testing::Spawn({"/bin/sh", "-c", cmd}, {});
    ASSERT_GT(agents_[static_cast<size_t>(node)], 0);
  }

  void StartController() {
    const std::string ctl = testing::BinDir("daemon") + "/falcon-controller";
    const std::string cmd = "exec '" + ctl + "' --job " + kJob + " --redis-port " + std::to_string(redis_.port()) +
                            " --view-ms 500 --heartbeat-ms 1000 --p2p-bytes 1048576 --retry-after-s 10"
                            " --redis-backoff-max-ms 500 --log-level debug 2>>'" + dir_.path() + "/controller.log'";
    controller_ = testing::Spawn({"/bin/sh", "-c", cmd}, {});
    ASSERT_GT(controller_, 0);
  }

  // The trainer for `seconds` of job time with `faults` (the fault plan's list), data checked.
  void StartJob(const std::string& faults, double seconds) {
    const std::string plan = R"({"faults":[)" + faults + "]}";
    const std::string train = testing::BinDir("bench/train") + "/falcon-train-emu";
    const std::string cmd =
        "exec '" + testing::BinDir("bench/emu") + "/falcon-emu-run' -n 16 --ranks-per-node 2 --timeout 120"
        " --node-shm-dirs '" + shm_ + "' --lib-dir '" + testing::EmuLibDir() + "' --preload '" +
        testing::PreloadValue() + "' --fault-plan '" + plan + "' -- '" + train +
        "' --tp 2 --dp 4 --pp 2 --check --progress-every 100 --duration-s " + std::to_string(seconds) + " >'" +
        dir_.path() + "/job.log' 2>&1";
    job_ = testing::Spawn({"/bin/sh", "-c", cmd}, {"FALCON_JOB=" + std::string(kJob), "FALCON_EMU_INTRA_GBPS=0.2",
                                                  "FALCON_EMU_INTER_GBPS=0.05", "FALCON_EMU_GPU_TFLOPS=10"});
    ASSERT_GT(job_, 0);
  }

  std::unique_ptr<redis::RedisConnection> Connect() {
    auto c = std::make_unique<redis::RedisConnection>(redis_.ClientOptions());
    if (!c->Connect().ok()) return nullptr;
    return c;
  }

  std::string Key(const protocol::KeySpec& spec) {
    return protocol::FormatKey(spec, {kJob, "", std::nullopt}).value();
  }

  // Every incident entry so far, validated (a bad one fails the test).
  std::vector<json> Incidents() {
    std::vector<json> out;
    auto c = Connect();
    if (!c) return out;
    auto entries = redis::XRange(*c, Key(protocol::kIncidentsStream), "-", "+", 0);
    if (!entries.ok()) return out;
    for (const redis::StreamEntry& e : entries.value()) {
      const std::string* text = e.Field("msg");
      if (text == nullptr) continue;
      Result<json> m = protocol::ParseMessage(*text, protocol::kIncident);
      EXPECT_TRUE(m.ok()) << m.status().ToString();
      if (m.ok()) out.push_back(m.value());
    }
    return out;
  }

  std::vector<json> Stage(const std::string& stage) {
    std::vector<json> out;
    for (json& m : Incidents()) {
      if (m["stage"] == stage) out.push_back(std::move(m));
    }
    return out;
  }

  // The first localisation that named a culprit, waiting up to timeout_s.
  json AwaitLocalised(double timeout_s) {
    json found;
    WaitUntil([&] {
      for (json& m : Stage("localisation")) {
        if (m.value("cause", "unknown") != "unknown") {
          found = m;
          return true;
        }
      }
      return false;
    }, timeout_s);
    return found;
  }

  std::string ControllerPhase() {
    auto c = Connect();
    if (!c) return "";
    auto h = redis::HGetAll(*c, Key(protocol::kControllerKey));
    if (!h.ok() || !h.value().count("state")) return "";
    return h.value().at("state");
  }

  static std::set<std::int64_t> GpuRanks(const json& loc) {
    std::set<std::int64_t> out;
    for (const json& g : loc["detail"]["gpus"]) out.insert(g["rank"].get<std::int64_t>());
    return out;
  }

  int FinishJob(double timeout_s) {
    const int rc = testing::WaitFor(job_, timeout_s);
    job_ = -1;
    return rc;
  }

  testing::RedisServer redis_;
  testing::TempDir dir_;
  std::string shm_;
  std::vector<pid_t> agents_;
  pid_t controller_ = -1, job_ = -1;
};

TEST_F(ControllerEndToEndTest, ComputeFaultNamesExactlyThatGpu) {
  StartJob(R"({"kind":"compute","ranks":[5],"start_s":20,"factor":2})", 50);
  const json loc = AwaitLocalised(90);
  ASSERT_FALSE(loc.is_null()) << "no localisation named a culprit";
  EXPECT_EQ(loc["cause"], "compute");
  EXPECT_EQ(GpuRanks(loc), (std::set<std::int64_t>{5}));
  EXPECT_TRUE(loc["detail"]["links"].empty()) << loc.dump();
  EXPECT_TRUE(loc["detail"]["nics"].empty()) << loc.dump();
  EXPECT_EQ(Stage("detection").size(), 1u) << "one incident";
  EXPECT_EQ(FinishJob(90), 0) << "the job failed, or its --check found wrong data";
  EXPECT_TRUE(WaitUntil([&] { return !Stage("resolution").empty(); }, 20)) << "the incident was never closed";
}

TEST_F(ControllerEndToEndTest, LinkFaultNamesExactlyThatLink) {
  // Nodes 0 and 1 hold DP peers (ranks 0-2 and 1-3): the link carries DP traffic.
  StartJob(R"({"kind":"link","nodes":[0,1],"start_s":20,"factor":4})", 50);
  const json loc = AwaitLocalised(90);
  ASSERT_FALSE(loc.is_null()) << "no localisation named a culprit";
  EXPECT_EQ(loc["cause"], "link");
  ASSERT_FALSE(loc["detail"]["links"].empty());
  for (const json& l : loc["detail"]["links"]) {
    const std::set<std::string> hosts = {l["hosts"][0].get<std::string>(), l["hosts"][1].get<std::string>()};
    EXPECT_EQ(hosts, (std::set<std::string>{"node0", "node1"})) << l.dump();
  }
  EXPECT_TRUE(loc["detail"]["gpus"].empty()) << loc.dump();
  EXPECT_TRUE(loc["detail"]["nics"].empty()) << loc.dump();
  EXPECT_EQ(FinishJob(90), 0);
}

TEST_F(ControllerEndToEndTest, NicFaultNamesThatNode) {
  StartJob(R"({"kind":"nic","nodes":[2],"start_s":20,"factor":4})", 50);
  const json loc = AwaitLocalised(90);
  ASSERT_FALSE(loc.is_null()) << "no localisation named a culprit";
  EXPECT_EQ(loc["cause"], "nic");
  ASSERT_EQ(loc["detail"]["nics"].size(), 1u) << loc.dump();
  EXPECT_EQ(loc["detail"]["nics"][0]["host"], "node2");
  EXPECT_TRUE(loc["detail"]["links"].empty()) << loc.dump();
  EXPECT_TRUE(loc["detail"]["gpus"].empty()) << loc.dump();
  EXPECT_EQ(FinishJob(90), 0);
}

TEST_F(ControllerEndToEndTest, TwoComputeFaultsAreBothNamed) {
  StartJob(R"({"kind":"compute","ranks":[3],"start_s":20,"factor":2},)"
           R"({"kind":"compute","ranks":[12],"start_s":20,"factor":2})", 50);
  const json loc = AwaitLocalised(90);
  ASSERT_FALSE(loc.is_null()) << "no localisation named a culprit";
  EXPECT_EQ(GpuRanks(loc), (std::set<std::int64_t>{3, 12}));
  EXPECT_TRUE(loc["detail"]["links"].empty() && loc["detail"]["nics"].empty()) << loc.dump();
  EXPECT_EQ(FinishJob(90), 0);
}

TEST_F(ControllerEndToEndTest, ControllerKilledDuringValidationResumesTheJobAndFinishesTheIncident) {
  StartJob(R"({"kind":"compute","ranks":[9],"start_s":20,"factor":2})", 60);
  ASSERT_TRUE(WaitUntil([&] { return ControllerPhase() == "validating"; }, 60)) << "never validated";
  kill(controller_, SIGKILL);
  testing::WaitFor(controller_, 10);
  controller_ = -1;
  const std::string incident = Stage("detection").at(0)["id"].get<std::string>();
  StartController();
  const json loc = AwaitLocalised(90);
  ASSERT_FALSE(loc.is_null()) << "the restarted controller did not finish the incident";
  EXPECT_EQ(loc["id"], incident) << "the restarted controller carried the same incident on";
  EXPECT_EQ(GpuRanks(loc), (std::set<std::int64_t>{9}));
  EXPECT_EQ(Stage("detection").size(), 1u);
  EXPECT_EQ(FinishJob(90), 0) << "a pause was left behind, or data went wrong";
}

TEST_F(ControllerEndToEndTest, RedisRestartAndMalformedMessagesAreSurvived) {
  StartJob(R"({"kind":"compute","ranks":[14],"start_s":25,"factor":2})", 55);
  ASSERT_TRUE(WaitUntil([&] { return ControllerPhase() == "tracking"; }, 30));
  redis_.Kill();
  ASSERT_TRUE(redis_.Start().ok()) << redis_.Log();  // empty, same port
  {
    auto c = Connect();
    ASSERT_TRUE(c != nullptr);
    for (const auto* spec : {&protocol::kAlarmsStream, &protocol::kAcksStream, &protocol::kProfilesStream}) {
      for (const char* bad : {"{", "[]", R"({"v":1,"type":"alarm","rank":"x"})", R"({"v":99})"}) {
        ASSERT_TRUE(redis::XAdd(*c, Key(*spec), 0, {{"msg", bad}}).ok());
      }
      ASSERT_TRUE(redis::XAdd(*c, Key(*spec), 0, {{"other", "field"}}).ok());
    }
    ASSERT_TRUE(redis::HSet(*c, std::string("falcon:") + kJob + ":rank:77", {{"msg", "not json"}}).ok());
  }
  const json loc = AwaitLocalised(100);
  ASSERT_FALSE(loc.is_null()) << "no localisation after the Redis restart";
  EXPECT_EQ(GpuRanks(loc), (std::set<std::int64_t>{14}));
  EXPECT_EQ(FinishJob(90), 0);
  EXPECT_NE(ReadFile(dir_.path() + "/controller.log").find("event=bad_message"), std::string::npos);
}

TEST_F(ControllerEndToEndTest, AgentKilledLeavesTheJobAloneAndIsReported) {
  StartJob(R"({"kind":"compute","ranks":[6],"start_s":20,"factor":2})", 50);
  ASSERT_TRUE(WaitUntil([&] { return ControllerPhase() == "tracking"; }, 30));
  // The agent of node 3 (ranks 6 and 7) dies before the fault: nobody can pause those ranks.
  kill(agents_[3], SIGKILL);
  testing::WaitFor(agents_[3], 10);
  agents_[3] = -1;
  ASSERT_TRUE(WaitUntil([&] { return !Stage("localisation").empty(); }, 90)) << "no validation outcome";
  const json first = Stage("localisation").at(0);
  EXPECT_EQ(first["cause"], "unknown") << "a job with ranks nobody can pause is not validated: " << first.dump();
  EXPECT_NE(first["summary"].get<std::string>().find("did not complete"), std::string::npos) << first.dump();
  EXPECT_EQ(FinishJob(90), 0) << "the job must run on untouched";
}

// A healthy job for FALCON_TEST_HEALTHY_S seconds (default 600): nobody is ever accused.
TEST_F(ControllerEndToEndTest, HealthyJobGetsNoLocalisedIncident) {
  const char* env = std::getenv("FALCON_TEST_HEALTHY_S");
  const double seconds = env != nullptr && std::atof(env) > 0 ? std::atof(env) : 600;
  StartJob("", seconds);
  EXPECT_EQ(FinishJob(seconds + 120), 0);
  for (const json& m : Stage("localisation")) {
    EXPECT_EQ(m.value("cause", "unknown"), "unknown") << "a healthy job was accused: " << m.dump();
  }
  std::printf("[ healthy  ] %.0f s: %zu detection(s), %zu validation(s), none named a culprit\n", seconds,
              Stage("detection").size(), Stage("localisation").size());
}

}  // namespace
}  // namespace falcon
