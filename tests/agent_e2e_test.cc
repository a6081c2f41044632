// falcon-agent end to end: the real agent binary, a real redis-server, and an emulated 4-rank
// job (falcon-emu-run + falcon-emu-job over the NCCL emulator) with the real shim preloaded.
// One scenario, in job order: ranks register (keys with TTL); iteration times stream in with
// the job's period; a malformed command is dropped with a log line (acked "rejected" when it
// still names its id and type) while valid commands are acked (set_mode applied by every shim; pause without a cut "rejected"); Redis is killed and restarted
// (empty) mid-run — the agent keeps analysing, buffers, and delivers the samples it made
// meanwhile; a NIC fault from the emulator's fault plan slows the job and raises `slow` alarms.
// Every message read back is validated against its schema. No fixed sleeps: every wait is a
// condition with a deadline.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
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
using testing::WaitUntil;

constexpr const char* kJob = "e2e";
constexpr const char* kHost = "node0";

using testing::ReadFile;

using testing::WallClockNs;

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

// Value of the first metric line starting with `prefix` (name{labels...), or -1.
double Metric(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) == 0) return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

std::string Key(const protocol::KeySpec& spec, std::optional<std::int64_t> rank = {}) {
  return protocol::FormatKey(spec, {kJob, kHost, rank}).value();
}

// Every message of `stream` (an entry may pack several), validated; a failed validation fails
// the test. `entries`: set to the number of entries they came in.
std::vector<json> ReadStream(redis::RedisConnection& c, const protocol::KeySpec& spec,
                             const protocol::MessageSpec& message,
                             std::vector<std::size_t>* per_entry = nullptr) {
  std::vector<json> out;
  Result<std::vector<redis::StreamEntry>> entries = redis::XRange(c, Key(spec), "-", "+", 0);
  if (!entries.ok()) return out;
  for (const redis::StreamEntry& e : entries.value()) {
    const std::vector<const std::string*> msgs = e.Values("msg");
    if (per_entry != nullptr) per_entry->push_back(msgs.size());
    EXPECT_FALSE(msgs.empty());
    EXPECT_LE(msgs.size(), protocol::kPackMessages);
    for (const std::string* msg : msgs) {
      Result<json> j = protocol::ParseMessage(*msg, message);
      EXPECT_TRUE(j.ok()) << j.status().ToString() << ": " << *msg;
      if (j.ok()) out.push_back(std::move(j).value());
    }
  }
  return out;
}

// Highest sample index per rank in the iterations stream, and whether the indices each rank
// covers are contiguous from its first entry.
std::map<std::int64_t, std::int64_t> MaxIndex(const std::vector<json>& batches) {
  std::map<std::int64_t, std::int64_t> out;
  for (const json& b : batches) {
    const std::int64_t last = b["first"].get<std::int64_t>() +
                              static_cast<std::int64_t>(b["seconds"].size()) - 1;
    auto& m = out.try_emplace(b["rank"].get<std::int64_t>(), -1).first->second;
    m = std::max(m, last);
  }
  return out;
}

class AgentEndToEndTest : public ::testing::Test {
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
      (void)testing::WaitFor(job_, 10);  // the job's status is not under test
    }
    if (agent_ > 0) {
      ::kill(agent_, SIGTERM);
      // A clean stop (and, in sanitizer builds, no leak or error report) exits 0.
      EXPECT_EQ(testing::WaitFor(agent_, 15), 0) << ReadFile(agent_log_);
    }
  }

  // Starts the agent (logging to agent_log_) and waits until it serves /healthz.
  void StartAgent() {
    SpawnAgent();
    ASSERT_TRUE(WaitUntil([&] { return HttpGet(metrics_port_, "/healthz").find("ok") != std::string::npos; }, 20))
        << ReadFile(agent_log_);
  }
  // Starts the agent without waiting for it.
  void SpawnAgent() {
    const std::string agent = testing::BinDir("daemon") + "/falcon-agent";
    std::string cmd = "exec '" + agent + "' --job " + kJob + " --host " + kHost + " --shm-dir '" +
                      shm_ + "' --redis-port " + std::to_string(redis_.port()) +
                      " --metrics-port " + std::to_string(metrics_port_) +
                      " --poll-ms 50 --flush-ms 200 --heartbeat-ms 500 --key-ttl-s 5"
                      " --profile-ms 1000 --command-block-ms 200 --redis-backoff-min-ms 50"
                      " --redis-backoff-max-ms 200 --log-level debug 2>'" + agent_log_ + "'";
    agent_ = testing::Spawn({"/bin/sh", "-c", cmd}, {});
    ASSERT_GT(agent_, 0);
  }

  // 4 ranks, 2 per emulated node; inter-node links slow enough that a NIC fault on node 1 from
  // `fault_s` (job seconds) multiplies them by 50: iterations 2-10x slower, whatever the load.
  void StartJob(int iters, double fault_s) {
    const std::string plan = R"({"faults":[{"kind":"nic","nodes":[1],"start_s":)" +
                             std::to_string(fault_s) + R"(,"factor":50}]})";
    job_start_ns_ = WallClockNs();
    job_ = testing::Spawn(
        {testing::BinDir("bench/emu") + "/falcon-emu-run", "-n", "4", "--ranks-per-node", "2",
         "--job-timeout", "300", "--lib-dir", testing::EmuLibDir(), "--preload", testing::PreloadValue(),
         "--fault-plan", plan, "--", testing::BinDir("bench/emu") + "/falcon-emu-job", "--iters",
         std::to_string(iters), "--compute-ms", "3"},
        {"FALCON_SHM_DIR=" + shm_, "FALCON_JOB=e2e", "FALCON_EMU_INTER_GBPS=0.5"});
    ASSERT_GT(job_, 0);
  }

  testing::RedisServer redis_;
  testing::TempDir dir_;
  std::string shm_, agent_log_;
  int metrics_port_ = 0;
  pid_t agent_ = -1, job_ = -1;
  std::int64_t job_start_ns_ = 0;
};

// SIGTERM while the agent is still connecting: Stop() shuts down the Redis sockets to wake
// their threads, and a thread writing a command on one then gets EPIPE. The agent ignores
// SIGPIPE, so that is a transport error and the stop stays clean (exit 0), however the signal
// falls against the start.
TEST_F(AgentEndToEndTest, ASignalDuringTheStartStopsItCleanly) {
  StartAgent();
  EXPECT_TRUE(testing::IgnoresSignal(agent_, SIGPIPE)) << "a closed Redis socket would kill the agent";
  for (int i = 0; i < 10; ++i) {
    ::kill(agent_, SIGTERM);
    ASSERT_EQ(testing::WaitFor(agent_, 15), 0) << ReadFile(agent_log_);
    agent_ = -1;
    agent_log_ = dir_.path() + "/agent" + std::to_string(i) + ".log";  // never its predecessor's lines
    SpawnAgent();
    // Its handlers are in place once it logs the start; it is signalled at a different point of
    // its connecting each time: right away, then 2 ms later, ...
    ASSERT_TRUE(WaitUntil([&] { return ReadFile(agent_log_).find("event=start ") != std::string::npos; }, 20))
        << ReadFile(agent_log_);
    ::usleep(static_cast<useconds_t>(2000 * i));
  }
}

TEST_F(AgentEndToEndTest, FollowsAJobThroughCommandsARedisRestartAndAFault) {
  StartAgent();
  // The fault must start after the detector's warm-up (16 samples after the period lock); the
  // sanitizer builds run the job several times slower.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  const double fault_s = 30.0;
#else
  const double fault_s = 9.0;
#endif
  StartJob(900, fault_s);
  redis::RedisConnection c(redis_.ClientOptions());
  ASSERT_TRUE(c.Connect().ok());

  // 1. Every rank registers, with a TTL, its communicators and the job's period.
  ASSERT_TRUE(WaitUntil([&] {
    for (int r = 0; r < 4; ++r) {
      auto h = redis::HGetAll(c, Key(protocol::kRankKey, r));
      if (!h.ok() || h.value().count("msg") == 0) return false;
      auto m = protocol::ParseMessage(h.value()["msg"], protocol::kRankRegister);
      if (!m.ok() || !m.value().contains("period")) return false;
    }
    return true;
  }, 40)) << ReadFile(agent_log_);
  for (int r = 0; r < 4; ++r) {
    auto h = redis::HGetAll(c, Key(protocol::kRankKey, r)).value();
    const json m = protocol::ParseMessage(h["msg"], protocol::kRankRegister).value();
    EXPECT_EQ(m["rank"], r);
    EXPECT_EQ(m["period"], 9) << "3 TP all-reduces, all-gather, reduce-scatter, send, recv, DP all-reduce, broadcast";
    EXPECT_EQ(m["comms"].size(), 3u) << "world, TP pair, DP group";
    EXPECT_EQ(m["state"], "live");
    const auto ttl = redis::Ttl(c, Key(protocol::kRankKey, r)).value();
    EXPECT_GT(ttl, 0);
    EXPECT_LE(ttl, 5);
  }
  EXPECT_TRUE(WaitUntil([&] { return redis::HGetAll(c, Key(protocol::kAgentKey)).value().count("msg") == 1; }, 10));
  // The counters move every heartbeat (500 ms) in the agent key's beats, against the content the
  // rank key holds (its at_ns); the rank key is rewritten only when that content changes.
  std::set<std::string> texts;
  std::set<std::int64_t> records;
  for (int i = 0; i < 12; ++i) {
    const json a = protocol::ParseMessage(redis::HGetAll(c, Key(protocol::kAgentKey)).value()["msg"],
                                          protocol::kAgentHeartbeat).value();
    const std::string text = redis::HGetAll(c, Key(protocol::kRankKey, 0)).value()["msg"];
    texts.insert(text);
    ASSERT_TRUE(a.contains("beats")) << a.dump();
    ASSERT_EQ(a["beats"].size(), 4u) << a.dump();
    for (const json& b : a["beats"]) {
      if (b["rank"] != 0) continue;
      records.insert(b["records"].get<std::int64_t>());
      EXPECT_EQ(b["calls"].size(), 3u);
    }
    ::usleep(250'000);
  }
  EXPECT_GE(records.size(), 4u) << "3 s of beats, 500 ms apart, while the job runs";
  EXPECT_LE(texts.size(), 2u) << "the rank key was rewritten with every heartbeat";
  {
    const json a = protocol::ParseMessage(redis::HGetAll(c, Key(protocol::kAgentKey)).value()["msg"],
                                          protocol::kAgentHeartbeat).value();
    std::vector<json> ranks;
    for (int r = 0; r < 4; ++r) {
      ranks.push_back(protocol::ParseMessage(redis::HGetAll(c, Key(protocol::kRankKey, r)).value()["msg"],
                                             protocol::kRankRegister).value());
    }
    const std::vector<json> keys = ranks;
    protocol::ApplyBeats(ranks, {a});
    for (int r = 0; r < 4; ++r) {  // each beat goes with its key's content (unless it just changed)
      EXPECT_TRUE(ranks[r]["at_ns"] == a["at_ns"] || ranks[r] == keys[r]) << ranks[r].dump();
      EXPECT_GE(ranks[r]["records"].get<std::int64_t>(), keys[r]["records"].get<std::int64_t>());
    }
  }

  // 2. Iteration times stream in, per rank, with the job's period and plausible values.
  ASSERT_TRUE(WaitUntil([&] {
    const auto m = MaxIndex(ReadStream(c, protocol::kIterationsStream, protocol::kIterations));
    return m.size() == 4 && std::all_of(m.begin(), m.end(), [](auto& kv) { return kv.second >= 10; });
  }, 60)) << ReadFile(agent_log_);
  std::vector<std::size_t> per_entry;
  const std::vector<json> batches = ReadStream(c, protocol::kIterationsStream, protocol::kIterations, &per_entry);
  // One flush's batches of the node's ranks share an entry: one XADD, not one per rank. How many
  // ranks have new iterations at a given flush depends on the machine's load, so this asks for
  // one shared entry, not for an average.
  ASSERT_FALSE(per_entry.empty());
  EXPECT_GE(*std::max_element(per_entry.begin(), per_entry.end()), 2u)
      << per_entry.size() << " entries for " << batches.size() << " batches";
  for (const json& b : batches) {
    EXPECT_EQ(b["period"], 9);
    EXPECT_EQ(b["start_ns"].size(), b["seconds"].size());
    for (double s : b["seconds"]) {
      EXPECT_GT(s, 0.004);
      EXPECT_LT(s, 2.0);
    }
  }

  // 3. Commands: garbage is dropped with a log line, an invalid command that names its id and
  //    type is acked "rejected"; the agent keeps serving valid ones.
  const std::string commands = Key(protocol::kCommandsStream);
  ASSERT_TRUE(redis::XAdd(c, commands, 0, {{"msg", "{not json"}}).ok());
  ASSERT_TRUE(redis::XAdd(c, commands, 0, {{"msg", R"({"v":2,"type":"set_mode","id":"x"})"}}).ok());
  ASSERT_TRUE(redis::XAdd(c, commands, 0, {{"other", "field"}}).ok());
  protocol::Command mode;
  mode.type = "set_mode";
  mode.id = "mode-1";
  mode.issued_ns = WallClockNs();
  mode.mode = "profile";
  protocol::Command pause = mode;
  pause.type = "pause";
  pause.id = "pause-1";
  pause.at_iteration = 1000;
  pause.max_pause_s = 5;
  ASSERT_TRUE(redis::XAdd(c, commands, 0, {{"msg", protocol::ToJson(mode).dump()}}).ok());
  ASSERT_TRUE(redis::XAdd(c, commands, 0, {{"msg", protocol::ToJson(pause).dump()}}).ok());
  std::map<std::string, json> acks;
  ASSERT_TRUE(WaitUntil([&] {
    for (const json& a : ReadStream(c, protocol::kAcksStream, protocol::kAck)) acks[a["command"]] = a;
    return acks.size() == 3;
  }, 30)) << ReadFile(agent_log_);
  EXPECT_EQ(acks["x"]["status"], "rejected") << acks["x"].dump();
  EXPECT_EQ(acks["x"]["command_type"], "set_mode");
  EXPECT_EQ(acks["mode-1"]["status"], "ok") << acks["mode-1"].dump();
  EXPECT_EQ(acks["mode-1"]["ranks"].size(), 4u);
  // No comm / comm_seq: the shim trap cannot choose a cut (tests/agent_trap_test.cc drives it).
  EXPECT_EQ(acks["pause-1"]["status"], "rejected") << acks["pause-1"].dump();
  const std::string log = ReadFile(agent_log_);
  std::size_t dropped = 0;
  for (std::size_t p = 0; (p = log.find("event=command_dropped", p)) != std::string::npos; ++p) ++dropped;
  EXPECT_EQ(dropped, 2u) << log;
  EXPECT_NE(log.find("event=command_rejected"), std::string::npos) << log;
  EXPECT_TRUE(WaitUntil([&] {
    auto h = redis::HGetAll(c, Key(protocol::kRankKey, 0)).value();
    return h.count("msg") && json::parse(h["msg"])["mode"] == "profile";
  }, 10)) << "the shims applied the mode";
  // The switch closed each rank's window (taken in track mode) and opened one at the ack: the
  // first profile-mode window begins exactly at the ack's at_ns, and none spans the switch.
  const std::int64_t switched_ns = acks["mode-1"]["at_ns"].get<std::int64_t>();
  std::map<std::int64_t, json> first_profile;
  ASSERT_TRUE(WaitUntil([&] {
    for (const json& p : ReadStream(c, protocol::kProfilesStream, protocol::kCommProfile)) {
      if (p["mode"] == "profile") first_profile.try_emplace(p["rank"].get<std::int64_t>(), p);
    }
    return first_profile.size() == 4;
  }, 20)) << ReadFile(agent_log_);
  for (const auto& [rank, p] : first_profile) {
    EXPECT_EQ(p["since_ns"].get<std::int64_t>(), switched_ns) << p.dump();
    EXPECT_GE(p["at_ns"].get<std::int64_t>() - switched_ns, 900'000'000) << "a whole --profile-ms window";
  }
  for (const json& p : ReadStream(c, protocol::kProfilesStream, protocol::kCommProfile)) {
    const std::int64_t since = p["since_ns"].get<std::int64_t>();
    if (since < switched_ns) {
      EXPECT_EQ(p["mode"], "track") << p.dump();
      EXPECT_LT(p["at_ns"].get<std::int64_t>() - switched_ns, 200'000'000) << "closed at the switch: " << p.dump();
    }
  }

  // 4. Redis dies: the agent keeps analysing and queues; after a restart it delivers the backlog.
  // Freeze writes first, so that nothing lands between the snapshot and the kill: the agent's
  // blocked pipeline then fails with the server and its entries stay queued.
  ASSERT_TRUE(c.Command({"CLIENT", "PAUSE", "30000", "WRITE"}).ok());
  const auto before = MaxIndex(ReadStream(c, protocol::kIterationsStream, protocol::kIterations));
  redis_.Kill();
  c.Close();
  ASSERT_TRUE(WaitUntil([&] {
    const std::string m = HttpGet(metrics_port_, "/metrics");
    return Metric(m, "falcon_agent_redis_connected{") == 0 && Metric(m, "falcon_agent_outbox_messages{") >= 8;
  }, 40)) << ReadFile(agent_log_);
  const double iterations_during_outage = Metric(HttpGet(metrics_port_, "/metrics"), "falcon_agent_iterations_total{");
  ASSERT_TRUE(redis_.Start().ok()) << redis_.Log();
  ASSERT_TRUE(c.Connect().ok());
  ASSERT_TRUE(WaitUntil([&] {
    const auto m = MaxIndex(ReadStream(c, protocol::kIterationsStream, protocol::kIterations));
    return m.size() == 4 && Metric(HttpGet(metrics_port_, "/metrics"), "falcon_agent_outbox_messages{") < 8;
  }, 40)) << ReadFile(agent_log_);
  // The restarted server holds what was queued while it was down: each rank's first batch there
  // starts right after the last index the old server got.
  std::map<std::int64_t, std::int64_t> first_after;
  for (const json& b : ReadStream(c, protocol::kIterationsStream, protocol::kIterations)) {
    auto [it, fresh] = first_after.try_emplace(b["rank"].get<std::int64_t>(), b["first"].get<std::int64_t>());
    if (!fresh) it->second = std::min(it->second, b["first"].get<std::int64_t>());
  }
  for (const auto& [rank, max_before] : before) {
    EXPECT_LE(first_after[rank], max_before + 1) << "rank " << rank << ": no gap across the outage";
  }
  EXPECT_GT(iterations_during_outage, 0);
  EXPECT_EQ(Metric(HttpGet(metrics_port_, "/metrics"), "falcon_agent_outbox_dropped_total{"), 0);

  // 5. The NIC fault slows every rank (they wait on each other): slow alarms after its onset.
  const std::int64_t fault_ns = job_start_ns_ + static_cast<std::int64_t>(fault_s * 1e9);
  std::vector<json> slow;
  ASSERT_TRUE(WaitUntil([&] {
    slow.clear();
    for (const json& a : ReadStream(c, protocol::kAlarmsStream, protocol::kAlarm)) {
      if (a["kind"] == "slow" && a.value("onset_ns", std::int64_t{0}) > fault_ns - 500000000 &&
          a["ratio"].get<double>() > 1.3) {
        slow.push_back(a);
      }
    }
    return !slow.empty();
  }, 60)) << ReadFile(agent_log_);
  EXPECT_NE(ReadFile(agent_log_).find("event=alarm kind=slow"), std::string::npos);
  std::printf("# first slow alarm after the fault (%.2f s after job start): %s\n",
              static_cast<double>(slow[0]["onset_ns"].get<std::int64_t>() - job_start_ns_) * 1e-9,
              slow[0].dump().c_str());

  // 6. Profiles were published per communicator, with host durations once in profile mode.
  bool timed = false;
  for (const json& p : ReadStream(c, protocol::kProfilesStream, protocol::kCommProfile)) {
    for (const json& comm : p["comms"]) {
      for (const json& s : comm["sigs"]) timed = timed || s.contains("median_us");
    }
  }
  EXPECT_TRUE(timed) << "profile mode gives host durations";
  const std::string metrics = HttpGet(metrics_port_, "/metrics");
  EXPECT_GT(Metric(metrics, "falcon_agent_records_read_total{"), 1000);
  EXPECT_EQ(Metric(metrics, "falcon_agent_records_lost_total{"), 0);
  EXPECT_GE(Metric(metrics, "falcon_agent_cpu_seconds_total{"), 0);
  EXPECT_NE(HttpGet(metrics_port_, "/nope").find("404"), std::string::npos);
}

TEST(AgentCliTest, HelpPrintConfigAndBadFlags) {
  const std::string agent = testing::BinDir("daemon") + "/falcon-agent";
  testing::ProcessResult r = testing::Run({agent, "--help"}, {});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--redis-password"), std::string::npos);
  r = testing::Run({agent, "--print-config", "--poll-ms", "250"}, {"FALCON_AGENT_JOB=fromenv",
                                                                  "FALCON_AGENT_REDIS_PASSWORD=pw"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\npoll_ms = 250\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\njob = fromenv\n"), std::string::npos);
  EXPECT_EQ(r.out.find("pw\n"), std::string::npos) << "password never printed";
  r = testing::Run({agent, "--poll-ms", "1"}, {});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("poll_ms"), std::string::npos);
  r = testing::Run({agent}, {"FALCON_AGENT_LOG_LEVEL=loud"});
  EXPECT_EQ(r.exit_code, 2);
}

}  // namespace
}  // namespace falcon
