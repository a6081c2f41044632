// falcon-controller end to end: a real redis-server, one real falcon-agent per emulated node, the
// real controller, and a 16-rank emulated trainer (TP 2 x DP 4 x PP 2, 8 emulated nodes of 2
// ranks, falcon-emu-run --node-shm-dirs) under the real shim, with a fault plan. Each test waits
// for the incidents the controller writes (validated against their schema) and checks that the
// localisation names exactly the injected culprit — the slow GPU, the slow link's two nodes, the
// slow NIC's node — and nothing else; failure tests kill the controller mid-validation, kill an
// agent, restart Redis empty and inject malformed messages, and the job must always finish with
// its data verified (--check). No fixed sleeps: every wait is a condition with a deadline.
//
// The job is made of modelled time so that it does not depend on how fast (or how shared) the
// host's cores are: 10 ms of modelled compute per layer and micro-batch, a fabric of 0.05 GB/s
// within and between nodes (so the host's real copies, which vary with load, stay far below the
// modelled transfer times), 2 MiB of DP gradients per rank (so a slow link or NIC on DP traffic
// shows in the iteration time), validation transfers of 1 MiB, emulated GPUs of 10 TFLOP/s.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "analyzer/robust.h"
#include "daemon/protocol/keys.h"
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

constexpr const char* kJob = "ctl-e2e";
constexpr int kNodes = 8;

class ControllerEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(redis_.Start().ok()) << redis_.Log();
    shm_ = dir_.path() + "/shm";
    for (int k = 0; k < kNodes; ++k) StartAgent(k);
    BeforeController();
    StartController();
  }

  // A derived fixture's set-up of Redis before the controller connects.
  virtual void BeforeController() {}
  // Environment of the controller process.
  virtual std::vector<std::string> ControllerEnv() const { return {}; }

  // Flags a derived fixture adds to the controller's command line.
  virtual std::string ControllerExtraArgs() const { return ""; }
  // The trainer's parallel layout (16 ranks).
  virtual std::string Shape() const { return "--tp 2 --dp 4 --pp 2"; }

  void TearDown() override {
    if (job_ > 0) testing::WaitFor(job_, 0);
    if (controller_ > 0) testing::WaitFor(controller_, 0);
    for (pid_t& a : agents_) {
      if (a > 0) testing::WaitFor(a, 0);
    }
    if (HasFailure()) {
      std::fprintf(stderr, "---- controller log (tail) ----\n%s\n", Tail(dir_.path() + "/controller.log").c_str());
      std::fprintf(stderr, "---- job log (tail) ----\n%s\n", Tail(dir_.path() + "/job.log").c_str());
      KeepLogs();
    } else if (std::getenv("FALCON_E2E_KEEP_LOGS") != nullptr) {  // to study a passing run
      KeepLogs();
    }
  }

  // A failed test's whole logs (controller, agents, job) and reports outlive its temporary
  // directory: copied to <build>/tests/e2e-logs/<test>/.
  void KeepLogs() const {
    namespace fs = std::filesystem;
    const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
    const fs::path to = fs::path(testing::BinDir("tests")) / "e2e-logs" / (std::string(t->test_suite_name()) + "." + t->name());
    std::error_code ec;
    fs::remove_all(to, ec);
    fs::create_directories(to, ec);
    for (const fs::directory_entry& e : fs::directory_iterator(dir_.path(), ec)) {
      const std::string ext = e.path().extension().string();
      if (e.is_regular_file() && (ext == ".log" || ext == ".json")) fs::copy_file(e.path(), to / e.path().filename(), ec);
    }
    std::fprintf(stderr, "---- logs kept in %s ----\n", to.c_str());
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
                            " --redis-backoff-max-ms 500 --log-level debug " + ControllerExtraArgs() + " 2>>'" +
                            dir_.path() + "/controller.log'";
    controller_ = testing::Spawn({"/bin/sh", "-c", cmd}, ControllerEnv());
    ASSERT_GT(controller_, 0);
  }

  // The trainer for `seconds` of job time with `faults` (the fault plan's list), data checked.
  void StartJob(const std::string& faults, double seconds, const std::string& trainer_args = "") {
    const std::string plan = R"({"faults":[)" + faults + "]}";
    const std::string train = testing::BinDir("bench/train") + "/falcon-train-emu";
    const std::string cmd =
        "exec '" + testing::BinDir("bench/emu") + "/falcon-emu-run' -n 16 --ranks-per-node 2 --job-timeout " +
        std::to_string(static_cast<int>(seconds) + 300) +
        " --node-shm-dirs '" + shm_ + "' --lib-dir '" + testing::EmuLibDir() + "' --preload '" +
        testing::PreloadValue() + "' --fault-plan '" + plan + "' -- '" + train +
        "' " + Shape() + " --compute-ms 10 --grad-bytes 2097152 --check --progress-every 100 "
        "--duration-s " +
        std::to_string(seconds) + " " + trainer_args + " >'" +
        dir_.path() + "/job.log' 2>&1";
    job_start_ns_ = testing::WallClockNs();
    job_ = testing::Spawn({"/bin/sh", "-c", cmd}, {"FALCON_JOB=" + std::string(kJob), "FALCON_EMU_INTRA_GBPS=0.05",
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

  // Localisations that named a culprit, after the job ended: all of them must be about the
  // injected fault (one incident; a false alarm before the fault may have opened and closed
  // incidents of its own, but never accused anyone).
  std::vector<json> Named() {
    std::vector<json> out;
    for (json& m : Stage("localisation")) {
      if (m.value("cause", "unknown") != "unknown") out.push_back(std::move(m));
    }
    return out;
  }

  void ExpectOneIncidentNaming(const std::set<std::int64_t>& gpus) {
    std::set<std::string> ids;
    for (const json& m : Named()) {
      ids.insert(m["id"].get<std::string>());
      EXPECT_EQ(GpuRanks(m), gpus) << m.dump();
    }
    EXPECT_EQ(ids.size(), 1u) << "one incident names the culprit";
  }

  // Every profiling stage analysed one window of each of the job's 16 ranks.
  void ExpectEveryRankProfiled() {
    const std::string log = ReadFile(dir_.path() + "/controller.log");
    std::size_t rounds = 0;
    for (std::size_t at = log.find("event=profiled "); at != std::string::npos; at = log.find("event=profiled ", at + 1)) {
      ++rounds;
      EXPECT_EQ(log.compare(at, 27, "event=profiled profiles=16 "), 0) << log.substr(at, 80);
    }
    EXPECT_GE(rounds, 1u);
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
  std::int64_t job_start_ns_ = 0;
};

TEST_F(ControllerEndToEndTest, ComputeFaultNamesExactlyThatGpu) {
  StartJob(R"({"kind":"compute","ranks":[5],"start_s":20,"factor":2})", 50);
  const json loc = AwaitLocalised(90);
  ASSERT_FALSE(loc.is_null()) << "no localisation named a culprit";
  EXPECT_EQ(loc["cause"], "compute");
  EXPECT_EQ(GpuRanks(loc), (std::set<std::int64_t>{5}));
  EXPECT_TRUE(loc["detail"]["links"].empty()) << loc.dump();
  EXPECT_TRUE(loc["detail"]["nics"].empty()) << loc.dump();
  EXPECT_EQ(FinishJob(90), 0) << "the job failed, or its --check found wrong data";
  ExpectOneIncidentNaming({5});
  ExpectEveryRankProfiled();
  EXPECT_TRUE(WaitUntil([&] {
    for (const json& m : Stage("resolution")) {
      if (m["id"] == loc["id"]) return true;
    }
    return false;
  }, 20)) << "the incident was never closed";
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
  ExpectEveryRankProfiled();
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
  ExpectOneIncidentNaming({3, 12});
}

TEST_F(ControllerEndToEndTest, ControllerKilledDuringValidationResumesTheJobAndFinishesTheIncident) {
  StartJob(R"({"kind":"compute","ranks":[9],"start_s":20,"factor":2})", 60);
  // A round after the fault began (not one of a false alarm before it).
  ASSERT_TRUE(WaitUntil([&] {
    return testing::WallClockNs() > job_start_ns_ + 21'000'000'000LL && ControllerPhase() == "validating";
  }, 60)) << "never validated";
  auto c = Connect();
  ASSERT_TRUE(c != nullptr);
  const auto state = redis::HGetAll(*c, Key(protocol::kControllerKey));
  ASSERT_TRUE(state.ok() && state.value().count("incident"));
  const std::string incident = state.value().at("incident");
  kill(controller_, SIGKILL);
  testing::WaitFor(controller_, 10);
  controller_ = -1;
  StartController();
  const json loc = AwaitLocalised(90);
  ASSERT_FALSE(loc.is_null()) << "the restarted controller did not finish the incident";
  EXPECT_EQ(loc["id"], incident) << "the restarted controller carried the same incident on";
  EXPECT_EQ(GpuRanks(loc), (std::set<std::int64_t>{9}));
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
      for (const char* bad : {"{", "[]", R"({"v":2,"type":"alarm","rank":"x"})", R"({"v":99})"}) {
        ASSERT_TRUE(redis::XAdd(*c, Key(*spec), 0, {{"msg", bad}}).ok());
      }
      ASSERT_TRUE(redis::XAdd(*c, Key(*spec), 0, {{"other", "field"}}).ok());
    }
    ASSERT_TRUE(redis::HSet(*c, std::string("falcon:{") + kJob + "}:rank:77", {{"msg", "not json"}}).ok());
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
  const std::int64_t killed_ns = testing::WallClockNs();
  json first;
  ASSERT_TRUE(WaitUntil([&] {
    for (json& m : Stage("localisation")) {
      if (m["at_ns"].get<std::int64_t>() > killed_ns + 4'000'000'000LL) {  // after the keys expired
        first = m;
        return true;
      }
    }
    return false;
  }, 90)) << "no validation outcome";
  EXPECT_EQ(first["cause"], "unknown") << "a job with ranks nobody can pause is not validated: " << first.dump();
  EXPECT_NE(first["summary"].get<std::string>().find("did not complete"), std::string::npos) << first.dump();
  EXPECT_NE(first["summary"].get<std::string>().find("no live agent"), std::string::npos) << first.dump();
  EXPECT_EQ(FinishJob(90), 0) << "the job must run on untouched";
  EXPECT_TRUE(Named().empty()) << "nobody may be accused";
}

// A healthy job for FALCON_TEST_HEALTHY_S seconds (default 600): nobody is ever accused. Early on,
// falcon-ctl asks for a manual validation round and waits for it (nothing found: exit 0), and
// falcon-ctl status shows the controller.
TEST_F(ControllerEndToEndTest, HealthyJobGetsNoLocalisedIncident) {
  const char* env = std::getenv("FALCON_TEST_HEALTHY_S");
  const double seconds = env != nullptr && std::atof(env) > 0 ? std::atof(env) : 600;
  StartJob("", seconds);
  ASSERT_TRUE(WaitUntil([&] { return ControllerPhase() == "tracking"; }, 30));
  const std::string ctl = testing::BinDir("daemon") + "/falcon-ctl";
  const std::string port = std::to_string(redis_.port());
  ASSERT_TRUE(WaitUntil([&] {  // wait for every rank to be registered and tracked
    testing::ProcessResult s = testing::Run({ctl, "status", "--json", "--port", port, "--job", kJob}, {});
    const json doc = json::parse(s.out, nullptr, false);
    return s.exit_code == 0 && doc.is_object() && doc["controller"].is_object() &&
           doc["controller"]["ranks"] == 16 && doc["ranks"].size() == 16;
  }, 40)) << "falcon-ctl status never showed the controller with 16 ranks";
  testing::ProcessResult v = testing::Run(
      {ctl, "validate", "--wait", "--reason", "drill", "--timeout", "90", "--port", port, "--job", kJob}, {}, 120);
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;  // 0: validated, nothing named
  EXPECT_NE(v.out.find("found no slow"), std::string::npos) << v.out << v.err;
  testing::ProcessResult s = testing::Run({ctl, "status", "--port", port, "--job", kJob}, {});
  EXPECT_NE(s.out.find("# controller: "), std::string::npos) << s.out;
  EXPECT_EQ(FinishJob(seconds + 120), 0);
  for (const json& m : Stage("localisation")) {
    EXPECT_EQ(m.value("cause", "unknown"), "unknown") << "a healthy job was accused: " << m.dump();
  }
  std::printf("[ healthy  ] %.0f s: %zu detection(s) (1 manual), %zu validation(s), none named a culprit\n",
              seconds, Stage("detection").size(), Stage("localisation").size());
}

// act mode: the controller's plans reach the trainer through the shim's C API
// (falcon-train-emu --falcon-plans) and are applied. The ski-rental overheads are set so that the
// strategy under test is the one chosen within a few seconds of slowdown; each rank's ground-truth
// report says which plans it applied and how long its iterations took under each.
class ControllerEndToEndActTest : public ControllerEndToEndTest {
 protected:
  std::string ControllerExtraArgs() const override {
    return "--mitigation act --micro-batches 4 --plan-sample-s 1 --spare-nodes 1 " + overheads_;
  }
  // The trainer reports what a restart would cost it after every checkpoint (falconReportCost),
  // and the controller takes that measured figure over its configured s4-overhead-s: so the
  // job's modelled restart is as dear as the tests' configured S4 (never chosen here).
  std::string TrainerArgs() const {
    return "--falcon-plans --spare-nodes 1 --restart-s 6000 --report '" + dir_.path() + "/train-{rank}.json'";
  }
  json Report(int rank) const {
    return json::parse(ReadFile(dir_.path() + "/train-" + std::to_string(rank) + ".json"), nullptr, false);
  }
  // The plans a rank applied, in order.
  static std::vector<json> Applied(const json& report) {
    std::vector<json> out;
    for (const json& p : report["plans"]) {
      if (p["status"] == "applied") out.push_back(p);
    }
    return out;
  }
  // Median duration of the rank's iterations that `pick` selects; 0 when none. A median: the
  // iterations that a validation pause (a re-check) stretched say nothing about the plan.
  template <typename Pick>
  static double MedianIteration(const json& report, Pick pick) {
    std::vector<double> d, scratch;
    for (const json& it : report["iterations"]) {
      if (pick(it)) d.push_back(it["duration_s"].get<double>());
    }
    return d.empty() ? 0.0 : analyzer::Median(d, scratch);
  }
  std::vector<std::string> Decisions() {
    std::vector<std::string> out;
    for (const json& m : Stage("decision")) out.push_back(m.value("strategy", "?"));
    return out;
  }

  std::string overheads_;
};

class ControllerEndToEndActS2Test : public ControllerEndToEndActTest {
 protected:
  void SetUp() override {
    overheads_ = "--s2-overhead-s 2 --s3-overhead-s 600 --s4-overhead-s 6000 --recheck-s 10";
    ControllerEndToEndActTest::SetUp();
  }

  struct SlowGpuRun {
    json report;              // rank 5's
    int replica = -1;         // its DP index
    std::vector<json> plans;  // the plans it applied, the S2 first
    std::vector<int> m;       // the S2 plan's micro-batches per replica
  };
  // Rank 5's GPU x2.5 from 15 s to 60 s of a 105 s job, checked: the job's data, a first plan S2
  // over `replicas` replicas that still trains all `total` micro-batches, a later plan.
  void RunSlowGpu(std::size_t replicas, int total, SlowGpuRun* run) {
    StartJob(R"({"kind":"compute","ranks":[5],"start_s":15,"duration_s":45,"factor":2.5})", 105, TrainerArgs());
    EXPECT_EQ(FinishJob(240), 0) << "the job failed, or its --check found wrong data";
    run->report = Report(5);
    ASSERT_TRUE(run->report.is_object()) << "no report from rank 5";
    run->replica = run->report["coords"]["dp"].get<int>();
    run->plans = Applied(run->report);
    ASSERT_GE(run->plans.size(), 2u) << run->report["plans"].dump()
                                     << "\ndecisions: " << ::testing::PrintToString(Decisions());
    EXPECT_EQ(run->plans[0]["strategy"], "S2") << run->plans[0].dump();
    run->m = run->plans[0]["micro_batches"].get<std::vector<int>>();
    ASSERT_EQ(run->m.size(), replicas);
    EXPECT_EQ(std::accumulate(run->m.begin(), run->m.end(), 0), total) << "every micro-batch is still trained";
  }
};

// A slow GPU: S2 gives its DP replica fewer micro-batches (all 16 still done), iterations get
// shorter while the fault lasts, and once the GPU recovers the plan is undone within a few
// iterations (the recovery watch: its TP peer no longer waits for it), never while it is slow.
// The watch also sees the GPU still slow while the fault lasts, which stands in for the recheck-s
// (10 s) rounds: the fault ends at 60 s, about 30 s after the localisation, and only the watch
// tells it (a fault ending inside a round would be that round's to tell).
TEST_F(ControllerEndToEndActS2Test, SlowGpuGetsFewerMicroBatchesAndTheRebalanceIsUndoneAfterIt) {
  SlowGpuRun run;
  ASSERT_NO_FATAL_FAILURE(RunSlowGpu(4, 16, &run));
  const json& slow = run.report;
  const int replica = run.replica;
  const std::vector<json>& plans = run.plans;
  const std::vector<int>& m = run.m;
  for (int d = 0; d < 4; ++d) {
    if (d != replica) {
      EXPECT_LT(m[static_cast<std::size_t>(replica)], m[static_cast<std::size_t>(d)]) << plans[0].dump();
    }
  }
  EXPECT_EQ(plans.back()["strategy"], "S1") << "the re-balancing was undone: " << plans.back().dump();
  EXPECT_EQ(plans.back()["micro_batches"], json({4, 4, 4, 4}));
  // While the GPU was slow: iterations under the S2 plan vs before it.
  const int s2 = plans[0]["version"].get<int>();
  const double before = MedianIteration(slow, [](const json& it) {
    return it["compute_factor"].get<double>() > 1.0 && it["plan_version"] == 0;
  });
  const double during = MedianIteration(slow, [&](const json& it) {
    return it["compute_factor"].get<double>() > 1.0 && it["plan_version"] == s2;
  });
  ASSERT_GT(before, 0.0);
  ASSERT_GT(during, 0.0) << "no slow iteration ran under the S2 plan";
  // At best the plan runs at its fullest replica's share of the healthy time (a replica doing
  // 5 of 16 micro-batches where an even split gives 4 takes 5/4 of it): at least half the way
  // from the unmitigated time to that.
  const double healthy = MedianIteration(slow, [](const json& it) {
    return it["compute_factor"].get<double>() == 1.0 && it["plan_version"] == 0;
  });
  const double even = (m[0] + m[1] + m[2] + m[3]) / 4.0;
  const double ideal = healthy * *std::max_element(m.begin(), m.end()) / even;
  EXPECT_LT(during, (before + ideal) / 2) << "S2 did not shorten the slow iterations: " << during << " s vs " << before
                                          << " s unmitigated, " << ideal << " s at best";
  // Only the recheck-s timer re-checks a lasting fault: the rounds' pauses and the plan's change
  // shift the ranks' series, and alarms about that must not start rounds of their own.
  const std::string log = ReadFile(dir_.path() + "/controller.log");
  const std::size_t revalidations = Count(log, "action=revalidate");
  EXPECT_LE(revalidations, 1u) << "re-checks started by alarms about the job's own plan and pauses";
  // After the fault: the iterations still under the re-balanced split before the undo.
  const auto healed = [&](const json& it) {
    return it["compute_factor"].get<double>() == 1.0 && it["plan_version"] == s2 && it["start_s"].get<double>() > 60;
  };
  std::size_t kept = 0;
  for (const json& it : slow["iterations"]) kept += healed(it) ? 1 : 0;
  // The recovery watch (the TP peer stops waiting for rank 5) undoes it within a few iterations
  // of the fault's end, and not while the GPU is still slow.
  const int undo = plans.back()["version"].get<int>();
  for (const json& it : slow["iterations"]) {
    EXPECT_FALSE(it["plan_version"] == undo && it["compute_factor"].get<double>() > 1.0)
        << "the re-balance was undone while the GPU was still slow: " << it.dump();
  }
  EXPECT_LE(kept, 10u) << "iterations under S2 after the GPU recovered";
  EXPECT_NE(log.find("action=undo detail="), std::string::npos);
  EXPECT_NE(log.find("action=sees_fault"), std::string::npos) << "the watch never saw the GPU still slow";
  const std::size_t rechecks = Count(log, "summary=\"re-check:");
  std::printf("[ act S2   ] slow GPU: %.0f ms per iteration unmitigated, %.0f ms under S2 %s, %.0f ms healthy, "
              "%.0f ms under S2 once healthy, for %zu iterations; %zu alarm-started re-check(s), %zu re-check round(s)\n",
              before * 1e3, during * 1e3, plans[0]["micro_batches"].dump().c_str(), healthy * 1e3,
              MedianIteration(slow, healed) * 1e3, kept, revalidations, rechecks);
}

// At TP 1 a slow GPU has no tensor-parallel group: its busiest group inside its replica is its
// pipeline's, on which it only sends and receives. The watch reads the same wait from receives
// (its pipeline neighbour waits for its activations; it finds its neighbour's gradients there)
// and undoes the re-balance within a few iterations of the fault's end, never while it lasts.
class ControllerEndToEndActS2Tp1Test : public ControllerEndToEndActS2Test {
 protected:
  std::string Shape() const override { return "--tp 1 --dp 8 --pp 2"; }
};

TEST_F(ControllerEndToEndActS2Tp1Test, SlowGpuAtTp1IsWatchedThroughItsPipelineExchanges) {
  SlowGpuRun run;
  ASSERT_NO_FATAL_FAILURE(RunSlowGpu(8, 32, &run));
  const json& slow = run.report;
  const std::vector<json>& plans = run.plans;
  const std::vector<int>& m = run.m;
  EXPECT_EQ(*std::min_element(m.begin(), m.end()), m[static_cast<std::size_t>(run.replica)]) << plans[0].dump();
  EXPECT_EQ(plans.back()["strategy"], "S1") << "the re-balancing was undone: " << plans.back().dump();
  const int s2 = plans[0]["version"].get<int>();
  const int undo = plans.back()["version"].get<int>();
  std::size_t kept = 0;
  for (const json& it : slow["iterations"]) {
    EXPECT_FALSE(it["plan_version"] == undo && it["compute_factor"].get<double>() > 1.0)
        << "the re-balance was undone while the GPU was still slow: " << it.dump();
    kept += it["compute_factor"].get<double>() == 1.0 && it["plan_version"] == s2 && it["start_s"].get<double>() > 60;
  }
  EXPECT_LE(kept, 10u) << "iterations under S2 after the GPU recovered";
  const std::string log = ReadFile(dir_.path() + "/controller.log");
  EXPECT_NE(log.find("action=sees_fault"), std::string::npos) << "the watch never saw the GPU still slow";
  EXPECT_NE(log.find("action=undo detail="), std::string::npos);
  std::printf("[ act S2 TP 1 ] plan %s, %zu iterations under S2 once healthy, %zu re-check round(s)\n",
              plans[0]["micro_batches"].dump().c_str(), kept, Count(log, "summary=\"re-check:"));
}

// The controller's Redis user may not write the plan hash until the test allows it: the S2
// decision taken meanwhile fails to publish and must be taken again once it can be.
class ControllerEndToEndActPublishTest : public ControllerEndToEndActTest {
 protected:
  void SetUp() override {
    overheads_ = "--s2-overhead-s 2 --s3-overhead-s 600 --s4-overhead-s 6000 --recheck-s 600";
    ControllerEndToEndActTest::SetUp();
  }
  std::string ControllerExtraArgs() const override {
    return ControllerEndToEndActTest::ControllerExtraArgs() + " --redis-user falcon-ctl --recovery-watch 0";
  }
  std::vector<std::string> ControllerEnv() const override { return {"FALCON_CONTROLLER_REDIS_PASSWORD=ctl-pw"}; }
  void BeforeController() override { RefusePlanWrites(); }
  // Every key of the job but the plan hash (read-only): "falcon:{ctl-e2e}:" then anything that does
  // not start with 'p', or "pr" (profiles).
  void RefusePlanWrites() {
    const std::string job = std::string("falcon:{") + kJob + "}:";
    SetUser({"on", ">ctl-pw", "resetkeys", "~" + job + "[a-oq-z]*", "~" + job + "pr*", "%R~" + job + "plan",
             "resetchannels", "&*", "+@all"});
  }
  void AllowPlanWrites() { SetUser({"allkeys"}); }
  void SetUser(const std::vector<std::string>& rules) {
    auto c = Connect();
    ASSERT_TRUE(c != nullptr);
    std::vector<std::string> argv = {"ACL", "SETUSER", "falcon-ctl"};
    argv.insert(argv.end(), rules.begin(), rules.end());
    Result<redis::RedisReply> r = c->Command(argv);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
};

TEST_F(ControllerEndToEndActPublishTest, ADecisionThatCouldNotBePublishedIsTakenAgainOnceItCan) {
  StartJob(R"({"kind":"compute","ranks":[5],"start_s":15,"factor":2.5})", 90, TrainerArgs());
  const std::string log = dir_.path() + "/controller.log";
  ASSERT_TRUE(WaitUntil([&] { return ReadFile(log).find("event=decision_deferred") != std::string::npos; }, 150))
      << "the S2 decision was never attempted";
  EXPECT_TRUE(Stage("decision").size() == 1u) << "only the S1 'ignore for now' is recorded while the plan is refused";
  AllowPlanWrites();
  EXPECT_EQ(FinishJob(240), 0) << "the job failed, or its --check found wrong data";
  const json slow = Report(5);
  ASSERT_TRUE(slow.is_object()) << "no report from rank 5";
  const std::vector<json> plans = Applied(slow);
  ASSERT_FALSE(plans.empty()) << "the deferred S2 never reached the job; decisions: "
                              << ::testing::PrintToString(Decisions());
  EXPECT_EQ(plans[0]["strategy"], "S2") << plans[0].dump();
  const std::vector<std::string> decided = Decisions();
  EXPECT_EQ(std::count(decided.begin(), decided.end(), "S2"), 1) << "published once: " << ::testing::PrintToString(decided);
}

// The slow GPU recovers and one of another DP replica turns slow while S2 holds, and the plan
// hash refuses writes when the round that names the new culprit wants to stop the old
// mitigation: that round is taken back and done again once the plan can be written, so the old
// S2 is undone and the new culprit gets its own. (The fixture turns the recovery watch off: it
// could undo the first S2 before the new culprit's round ran, and this is about that round.)
TEST_F(ControllerEndToEndActPublishTest, ACulpritChangeThatCouldNotBePublishedIsValidatedAgainOnceItCan) {
  AllowPlanWrites();
  StartJob(R"({"kind":"compute","ranks":[5],"start_s":15,"duration_s":40,"factor":2.5},)"
           R"({"kind":"compute","ranks":[9],"start_s":55,"factor":2.5})", 150, TrainerArgs());
  const auto decided = [&](const std::string& strategy) {
    const std::vector<std::string> d = Decisions();
    return std::count(d.begin(), d.end(), strategy);
  };
  ASSERT_TRUE(WaitUntil([&] { return decided("S2") >= 1; }, 120))
      << "no S2 for the first slow GPU; decisions: " << ::testing::PrintToString(Decisions());
  RefusePlanWrites();
  const std::string log = dir_.path() + "/controller.log";
  const bool deferred = WaitUntil([&] { return ReadFile(log).find("event=round_deferred") != std::string::npos; }, 150);
  AllowPlanWrites();
  ASSERT_TRUE(deferred) << "the round that found the new culprit was never refused";
  EXPECT_EQ(FinishJob(300), 0) << "the job failed, or its --check found wrong data";
  std::vector<json> changed;
  for (const json& m : Stage("decision")) {
    if (m["summary"].get<std::string>().find("the culprits changed") != std::string::npos) changed.push_back(m);
  }
  ASSERT_EQ(changed.size(), 1u) << "the first mitigation is stopped once, when it can be published; decisions: "
                                << ::testing::PrintToString(Decisions());
  std::size_t naming9 = 0;
  std::string rounds;
  for (const json& m : Named()) naming9 += GpuRanks(m).count(9);
  for (const json& m : Stage("localisation")) rounds += m.value("summary", "") + "\n";
  EXPECT_LE(naming9, 2u) << rounds << "one round finds the new GPU and one redoes it; the other ranks' alarms about the same "
                            "slowdown, arriving during the first, must not add rounds";
  const json r9 = Report(9);
  ASSERT_TRUE(r9.is_object()) << "no report from rank 9";
  const int replica = r9["coords"]["dp"].get<int>();
  ASSERT_NE(replica, Report(5)["coords"]["dp"].get<int>()) << "the two GPUs must be in different replicas";
  const std::vector<json> plans = Applied(r9);
  std::vector<json> s2;
  std::copy_if(plans.begin(), plans.end(), std::back_inserter(s2), [](const json& p) { return p["strategy"] == "S2"; });
  ASSERT_GE(s2.size(), 2u) << "an S2 for each culprit: " << r9["plans"].dump();
  const std::vector<int> m = s2.back()["micro_batches"].get<std::vector<int>>();
  for (int d = 0; d < 4; ++d) {
    if (d != replica) {
      EXPECT_LT(m[static_cast<std::size_t>(replica)], m[static_cast<std::size_t>(d)]) << s2.back().dump();
    }
  }
  EXPECT_GT(s2.back()["version"].get<int>(), changed[0]["detail"]["plan"]["plan_version"].get<int>())
      << "the new culprit's S2 comes after the old one's undo";
}

class ControllerEndToEndActS3Test : public ControllerEndToEndActTest {
 protected:
  void SetUp() override {
    overheads_ = "--s2-overhead-s 2 --s3-overhead-s 2 --s4-overhead-s 6000 --recheck-s 600";
    ControllerEndToEndActTest::SetUp();
  }
};

// A slow link on DP traffic: S3 re-places ranks so that the link carries lighter traffic and the
// iterations get shorter. A GPU that turns slow afterwards, on the new placement, is still
// detected and named (the agents' period locks survive the re-placement and the validation).
TEST_F(ControllerEndToEndActS3Test, SlowLinkIsRelievedByReplacementAndALaterSlowGpuIsStillNamed) {
  StartJob(R"({"kind":"link","nodes":[1,2],"start_s":15,"factor":4},)"
           R"({"kind":"compute","ranks":[12],"start_s":60,"factor":2.5})", 110, TrainerArgs());
  const json later = [&] {
    json found;
    WaitUntil([&] {
      for (json& m : Stage("localisation")) {
        for (const json& g : m["detail"]["gpus"]) {
          if (g["rank"] == 12) found = m;
        }
      }
      return !found.is_null();
    }, 200);
    return found;
  }();
  EXPECT_FALSE(later.is_null()) << "the slow GPU after the re-placement was never named";
  EXPECT_EQ(FinishJob(240), 0) << "the job failed, or its --check found wrong data";
  const json r0 = Report(0);
  ASSERT_TRUE(r0.is_object()) << "no report from rank 0";
  const std::vector<json> plans = Applied(r0);
  const auto s3 = std::find_if(plans.begin(), plans.end(), [](const json& p) { return p["strategy"] == "S3"; });
  ASSERT_NE(s3, plans.end()) << r0["plans"].dump() << "\ndecisions: " << ::testing::PrintToString(Decisions());
  EXPECT_FALSE((*s3)["moved_ranks"].empty()) << s3->dump();
  // Before the GPU fault: iterations with the slow link before vs after the re-placement.
  const int v = (*s3)["version"].get<int>();
  const auto slow_link = [](const json& it) {
    const double t = it["start_s"].get<double>();
    return t > 18 && t < 58;
  };
  const double before = MedianIteration(r0, [&](const json& it) { return slow_link(it) && it["plan_version"] < v; });
  const double after = MedianIteration(r0, [&](const json& it) { return slow_link(it) && it["plan_version"] == v; });
  ASSERT_GT(before, 0.0);
  ASSERT_GT(after, 0.0) << "the re-placement came after the link's window";
  EXPECT_LT(after, 0.9 * before) << "S3 did not shorten the iterations: " << after << " s vs " << before;
  std::printf("[ act S3   ] slow link: %.0f ms per iteration unmitigated, %.0f ms after moving ranks %s\n",
              before * 1e3, after * 1e3, (*s3)["moved_ranks"].dump().c_str());
}

// The binary's own checks: --help, the sample config loads and equals the defaults, bad values
// are refused with exit 2 and a message naming the option.
TEST(ControllerCliTest, HelpSampleConfigAndBadFlags) {
  const std::string bin = testing::BinDir("daemon") + "/falcon-controller";
  testing::ProcessResult r = testing::Run({bin, "--help"}, {});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--max-pause-s"), std::string::npos);
  const testing::ProcessResult defaults = testing::Run({"/usr/bin/env", "-i", bin, "--print-config"}, {});
  const testing::ProcessResult sample = testing::Run(
      {"/usr/bin/env", "-i", bin, "--config", std::string(FALCON_TEST_SOURCE_DIR) + "/config/falcon-controller.conf",
       "--print-config"}, {});
  ASSERT_EQ(sample.exit_code, 0) << sample.err;
  EXPECT_EQ(sample.out, defaults.out) << "regenerate config/falcon-controller.conf (docs/controller.md)";
  EXPECT_EQ(defaults.out.find("redis-password=\"<set>\""), std::string::npos);
  r = testing::Run({"/usr/bin/env", "-i", "FALCON_CONTROLLER_REDIS_PASSWORD=hunter2", bin, "--print-config"}, {});
  EXPECT_EQ(r.out.find("hunter2"), std::string::npos) << "the password must never be printed";
  for (const std::vector<std::string>& bad : std::vector<std::vector<std::string>>{
           {"--max-pause-s", "0.5"}, {"--job", "a:b"}, {"--gemm-size", "0"}, {"--statistic", "mean"},
           {"--max-pause-s", "2", "--pause-lead-s", "5"}, {"--no-such-flag"}}) {
    std::vector<std::string> argv = {bin};
    argv.insert(argv.end(), bad.begin(), bad.end());
    r = testing::Run(argv, {});
    EXPECT_EQ(r.exit_code, 2) << bad[0];
    EXPECT_FALSE(r.err.empty()) << bad[0];
  }
}

}  // namespace
}  // namespace falcon

namespace falcon {
namespace {

// Security basics: the controller authenticates as an ACL user with the password from the
// environment (never on the command line), refuses to run on a wrong one (it retries, logging
// why, and writes nothing), and never logs the password.
TEST(ControllerRedisAuthTest, AclUserFromTheEnvironmentAndAWrongPasswordIsRefused) {
  testing::RedisServer redis({"", "falcon-ctl", "s3cret-pw"});
  ASSERT_TRUE(redis.Start().ok()) << redis.Log();
  testing::TempDir dir;
  const std::string bin = testing::BinDir("daemon") + "/falcon-controller";
  auto run = [&](const std::string& password, const std::string& log) {
    const std::string cmd = "exec '" + bin + "' --job auth --redis-port " + std::to_string(redis.port()) +
                            " --redis-user falcon-ctl --redis-backoff-max-ms 200 --heartbeat-ms 200 --tick-ms 50 2>'" +
                            log + "'";
    return testing::Spawn({"/bin/sh", "-c", cmd}, {"FALCON_CONTROLLER_REDIS_PASSWORD=" + password});
  };
  redis::RedisOptions o = redis.ClientOptions();
  o.user = "falcon-ctl";
  o.password = "s3cret-pw";
  auto state_written = [&] {
    redis::RedisConnection c(o);
    if (!c.Connect().ok()) return false;
    auto h = redis::HGetAll(c, "falcon:{auth}:controller");
    return h.ok() && h.value().count("msg") > 0;
  };
  const std::string bad_log = dir.path() + "/bad.log";
  pid_t bad = run("wrong-pw", bad_log);
  ASSERT_GT(bad, 0);
  EXPECT_TRUE(WaitUntil([&] { return ReadFile(bad_log).find("event=redis_unavailable") != std::string::npos; }, 20));
  EXPECT_FALSE(state_written());
  kill(bad, SIGTERM);
  EXPECT_EQ(testing::WaitFor(bad, 10), 0);
  const std::string good_log = dir.path() + "/good.log";
  pid_t good = run("s3cret-pw", good_log);
  ASSERT_GT(good, 0);
  EXPECT_TRUE(WaitUntil(state_written, 20)) << ReadFile(good_log);
  EXPECT_TRUE(testing::IgnoresSignal(good, SIGPIPE)) << "a closed Redis socket would kill the controller";
  kill(good, SIGTERM);
  EXPECT_EQ(testing::WaitFor(good, 10), 0);
  for (const std::string& log : {bad_log, good_log}) {
    const std::string text = ReadFile(log);
    EXPECT_EQ(text.find("s3cret-pw"), std::string::npos) << log;
    EXPECT_EQ(text.find("wrong-pw"), std::string::npos) << log;
  }
}

}  // namespace
}  // namespace falcon
