// Tests for SimAgents over a real redis-server: a pause holds the simulated job's clock at its
// cut, and worker processes that read the resume at different moments keep one clock.
#include "bench/sim/sim_agents.h"

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <utility>

#include <gtest/gtest.h>

#include "daemon/protocol/keys.h"
#include "falcon/protocol.h"
#include "tests/support/redis_server.h"

namespace falcon::sim {
namespace {

std::int64_t WallNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void SleepUntil(std::int64_t wall_ns) {
  while (WallNs() < wall_ns) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

class SimAgentsRedisTest : public ::testing::Test {
 protected:
  static constexpr double kIterationS = 0.2;

  void SetUp() override {
    ASSERT_TRUE(redis_.Start().ok()) << redis_.Log();
    shape_.tp = 2;
    shape_.pp = 2;
    shape_.dp = 4;  // 16 ranks: node0 and node1
    shape_.micro_batches = 2;
    shape_.iteration_s = kIterationS;
    shape_.noise = 0;
    start_ns_ = WallNs() - 2'000'000'000;
    for (int w = 0; w < 2; ++w) {  // one worker process per node, as falcon-sim --processes 2 makes them
      auto conn = std::make_unique<redis::RedisConnection>(redis_.ClientOptions());
      ASSERT_TRUE(conn->Connect().ok());
      workers_.push_back(std::make_unique<SimAgents>(SimJob(shape_, {}, start_ns_), "j", w, w + 1, w,
                                                     AgentCadence{}, DeviceModel{}, std::move(conn)));
      ASSERT_TRUE(workers_.back()->Tick(WallNs()).ok());  // makes the command groups
    }
    auto conn = std::make_unique<redis::RedisConnection>(redis_.ClientOptions());
    ASSERT_TRUE(conn->Connect().ok());
    ctl_ = std::move(conn);
  }

  // The controller's side: one command to one host's stream.
  void Send(std::int64_t node, const protocol::Command& c) {
    Result<std::string> key = protocol::FormatKey(protocol::kCommandsStream, {"j", "node" + std::to_string(node), {}});
    ASSERT_TRUE(key.ok());
    Result<redis::RedisReply> r =
        ctl_->Command({"XADD", key.value(), "*", std::string(protocol::kPayloadField), protocol::ToJson(c).dump()});
    ASSERT_TRUE(r.ok()) << r.status().message();
  }

  // A pause of node's ranks before iteration k: each rank's cut on its first communicator.
  protocol::Command Pause(std::int64_t node, std::uint64_t k, std::int64_t issued_ns, double max_pause_s) {
    protocol::Command c;
    c.type = "pause";
    c.id = "p" + std::to_string(node);
    c.issued_ns = issued_ns;
    c.max_pause_s = max_pause_s;
    c.at_iteration = k;
    SimJob job(shape_, {}, start_ns_);
    for (std::int64_t r = node * shape_.gpus_per_node; r < (node + 1) * shape_.gpus_per_node; ++r) {
      const SimComm first = job.Comms(r).front();
      const std::uint64_t seq = k * first.calls_per_iteration;
      c.targets.push_back({r, {{first.id, seq, seq}}});
    }
    return c;
  }

  protocol::Command Resume(std::int64_t node, std::int64_t issued_ns) {
    protocol::Command c;
    c.type = "resume";
    c.id = "r" + std::to_string(node);
    c.issued_ns = issued_ns;
    return c;
  }

  testing::RedisServer redis_;
  SimShape shape_;
  std::int64_t start_ns_ = 0;
  std::vector<std::unique_ptr<SimAgents>> workers_;
  std::unique_ptr<redis::RedisConnection> ctl_;
};

// The job stops at the cut until the first resume any worker reads; the iteration before the
// cut lasts its own time plus the pause, as an agent measures it between two boundaries; every
// later iteration moves with it. Without the hold the sim's job ran on through the pause.
TEST_F(SimAgentsRedisTest, APauseHoldsTheJobClockUntilTheFirstResumeReadInEveryProcess) {
  SimJob& a = workers_[0]->job();
  SimJob& b = workers_[1]->job();
  const std::int64_t issued = WallNs();
  const std::uint64_t k = a.IterationsBefore(issued) + 1;  // a boundary 0.2..0.4 s ahead
  const std::int64_t planned = a.IterationAt(k).start_ns;
  const std::int64_t planned_next = a.IterationAt(k + 1).start_ns;
  for (int node = 0; node < 2; ++node) Send(node, Pause(node, k, issued, 30));
  for (auto& w : workers_) ASSERT_TRUE(w->Tick(WallNs()).ok());
  // Held until the trap's own deadline while no resume has come: k has not started.
  const std::int64_t deadline = issued + 30'000'000'000;
  EXPECT_EQ(a.IterationAt(k).start_ns, deadline);
  EXPECT_EQ(b.IterationAt(k).start_ns, deadline);
  EXPECT_EQ(a.IterationAt(k - 1).start_ns, planned - static_cast<std::int64_t>(kIterationS * 1e9))
      << "iterations before the cut keep their times";

  SleepUntil(planned + 150'000'000);  // the job is at its cut, held
  Send(0, Resume(0, WallNs()));
  const std::int64_t before = WallNs();
  ASSERT_TRUE(workers_[0]->Tick(WallNs()).ok());
  const std::int64_t after = WallNs();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // worker 1 reads its resume later
  Send(1, Resume(1, WallNs()));
  ASSERT_TRUE(workers_[1]->Tick(WallNs()).ok());

  const std::int64_t resumed = a.IterationAt(k).start_ns;
  EXPECT_GE(resumed, before);
  EXPECT_LE(resumed, after);
  EXPECT_EQ(b.IterationAt(k).start_ns, resumed) << "both processes keep one clock";
  EXPECT_GE(resumed - planned, 150'000'000) << "the iteration before the cut includes the pause";
  EXPECT_EQ(a.IterationAt(k + 1).start_ns - resumed, planned_next - planned) << "later iterations move with it";
  EXPECT_EQ(b.IterationAt(k + 1).start_ns, a.IterationAt(k + 1).start_ns);
  EXPECT_EQ(a.IterationsBefore(resumed), k);
  EXPECT_EQ(a.IterationsBefore(resumed + 1), k + 1);
}

// A resume before any rank reached the cut (a pause given up) leaves the clock as it was; so
// does a pause read after its deadline (acked expired, never trapped).
TEST_F(SimAgentsRedisTest, APauseReleasedBeforeItsCutOrExpiredLeavesTheClockAlone) {
  SimJob& a = workers_[0]->job();
  std::int64_t now = WallNs();
  std::uint64_t k = a.IterationsBefore(now) + 3;  // 0.4..0.6 s ahead
  std::int64_t planned = a.IterationAt(k).start_ns;
  Send(0, Pause(0, k, now, 30));
  ASSERT_TRUE(workers_[0]->Tick(WallNs()).ok());
  EXPECT_GT(a.IterationAt(k).start_ns, planned);
  Send(0, Resume(0, WallNs()));
  ASSERT_TRUE(workers_[0]->Tick(WallNs()).ok());
  EXPECT_EQ(a.IterationAt(k).start_ns, planned);

  now = WallNs();
  k = a.IterationsBefore(now) + 3;
  planned = a.IterationAt(k).start_ns;
  protocol::Command late = Pause(0, k, now - 2'000'000'000, 30);
  late.deadline_ns = now - 1'000'000'000;
  Send(0, late);
  ASSERT_TRUE(workers_[0]->Tick(WallNs()).ok());
  EXPECT_EQ(a.IterationAt(k).start_ns, planned);
  EXPECT_EQ(workers_[0]->counters().late_traps, 0u);
}

// A pause the sim reads after its cut has passed (the sim behind) still traps, and says so: a
// real agent would have answered `missed`, and the bench reports the count beside the pause.
TEST_F(SimAgentsRedisTest, APauseReadAfterItsCutIsCountedLate) {
  SimJob& a = workers_[0]->job();
  const std::int64_t now = WallNs();
  const std::uint64_t k = a.IterationsBefore(now) - 2;  // started 0.2..0.4 s ago
  Send(0, Pause(0, k, now, 30));
  ASSERT_TRUE(workers_[0]->Tick(WallNs()).ok());
  EXPECT_EQ(workers_[0]->counters().late_traps, static_cast<std::uint64_t>(shape_.gpus_per_node));
  EXPECT_EQ(a.IterationAt(k).start_ns, now + 30'000'000'000) << "held at the cut all the same";
}

// A command on the broadcast stream is every node's: each worker process answers it for each of
// its nodes (one ack per host, with that node's ranks), and a broadcast resume releases the job.
TEST_F(SimAgentsRedisTest, ABroadcastCommandIsAnsweredByEveryNodeOfEveryProcess) {
  SimJob& a = workers_[0]->job();
  const std::int64_t issued = WallNs();
  const std::uint64_t k = a.IterationsBefore(issued) + 1;
  for (int node = 0; node < 2; ++node) Send(node, Pause(node, k, issued, 30));
  for (auto& w : workers_) ASSERT_TRUE(w->Tick(WallNs()).ok());
  SleepUntil(a.IterationAt(k - 1).start_ns + static_cast<std::int64_t>(kIterationS * 1e9) + 50'000'000);
  auto broadcast = [&](const protocol::Command& c) {
    Result<std::string> key = protocol::FormatKey(protocol::kBroadcastStream, {"j", "", {}});
    ASSERT_TRUE(key.ok());
    ASSERT_TRUE(ctl_->Command({"XADD", key.value(), "*", std::string(protocol::kPayloadField), protocol::ToJson(c).dump()}).ok());
  };
  protocol::Command gemm;
  gemm.type = "validate";
  gemm.id = "g";
  gemm.issued_ns = WallNs();
  gemm.task = "gemm";
  gemm.size = 1024;
  gemm.repeats = 3;
  broadcast(gemm);
  protocol::Command resume = Resume(0, WallNs());
  resume.id = "r";
  broadcast(resume);
  std::map<std::pair<std::string, std::string>, std::set<std::int64_t>> acked;  // (command, host) -> ranks
  const std::int64_t give_up = WallNs() + 10'000'000'000;
  while (acked.size() < 4 && WallNs() < give_up) {
    for (auto& w : workers_) ASSERT_TRUE(w->Tick(WallNs()).ok());
    Result<std::string> acks = protocol::FormatKey(protocol::kAcksStream, {"j", "", {}});
    Result<std::vector<redis::StreamEntry>> e = redis::XRange(*ctl_, acks.value(), "-", "+", 0);
    ASSERT_TRUE(e.ok());
    acked.clear();
    for (const redis::StreamEntry& entry : e.value()) {
      for (const std::string* msg : entry.Values(std::string(protocol::kPayloadField))) {
        const nlohmann::json j = nlohmann::json::parse(*msg);
        if (j["command"] != "g" && j["command"] != "r") continue;
        auto& ranks = acked[{j["command"].get<std::string>(), j["host"].get<std::string>()}];
        for (const nlohmann::json& r : j.value("results", nlohmann::json::array())) ranks.insert(r["rank"].get<std::int64_t>());
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::int64_t gpn = shape_.gpus_per_node;
  for (const char* id : {"g", "r"}) {
    for (std::int64_t node = 0; node < 2; ++node) {
      const auto it = acked.find({id, "node" + std::to_string(node)});
      ASSERT_NE(it, acked.end()) << id << " on node" << node;
      std::set<std::int64_t> want;
      for (std::int64_t r = node * gpn; r < (node + 1) * gpn; ++r) want.insert(r);
      EXPECT_EQ(it->second, want) << id << " on node" << node;
    }
  }
  EXPECT_LT(a.IterationAt(k).start_ns, issued + 30'000'000'000) << "the broadcast resume released the job";
  EXPECT_EQ(workers_[1]->job().IterationAt(k).start_ns, a.IterationAt(k).start_ns);
}

}  // namespace
}  // namespace falcon::sim
