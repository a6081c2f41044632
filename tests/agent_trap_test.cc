// The agent's trap backend (ShimTrap) end to end: the real falcon-agent, a real redis-server and
// a 4-rank emulated job (falcon-emu-run + falcon-emu-job over the NCCL emulator) with the real
// shim preloaded. The test plays the controller: it XADDs pause / validate / resume commands and
// reads the acks back (each validated against its schema). It computes the cut from the ranks'
// progress (segments opened read-only, as shim_trap_test.cc does): a call of the world
// communicator some way ahead of the furthest rank. Proves: every rank traps at that same call;
// GEMM and a P2P ring pass run and report their timings; resume lets the job finish and its
// --check passes; a pause that is never reached is acked expired and training goes on; malformed
// or misdirected trap commands are rejected with a reason. No fixed sleeps: deadlines only.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "analyzer/cut_plan.h"
#include "daemon/protocol/keys.h"
#include "daemon/protocol/messages.h"
#include "daemon/protocol/validate.h"
#include "daemon/redis/redis_commands.h"
#include "daemon/shm/segment_dir.h"
#include "daemon/shm/segment_reader.h"
#include "tests/support/redis_server.h"
#include "tests/support/subprocess.h"

namespace falcon {
namespace {

using nlohmann::json;
using testing::WaitUntil;

constexpr const char* kJob = "trap";
constexpr const char* kHost = "node0";
constexpr int kRanks = 4;

using testing::ReadFile;

using testing::WallClockNs;

std::string Key(const protocol::KeySpec& spec, std::optional<std::int64_t> rank = {}) {
  return protocol::FormatKey(spec, {kJob, kHost, rank}).value();
}

class AgentTrapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(redis_.Start().ok()) << redis_.Log();
    agent_log_ = dir_.path() + "/agent.log";
    shm_ = dir_.path() + "/shm";
    ASSERT_EQ(::mkdir(shm_.c_str(), 0700), 0);
    c_ = std::make_unique<redis::RedisConnection>(redis_.ClientOptions());
    ASSERT_TRUE(c_->Connect().ok());
  }
  void TearDown() override {
    if (job_ > 0) {
      ::kill(job_, SIGTERM);
      (void)testing::WaitFor(job_, 10);  // killed early: its status is not under test
    }
    if (agent_ > 0) {
      ::kill(agent_, SIGTERM);
      EXPECT_EQ(testing::WaitFor(agent_, 15), 0) << ReadFile(agent_log_);
    }
  }

  // The agent and the job; returns once the agent follows all 4 ranks (their keys exist) and
  // the test has every rank's segment, ordered by world rank.
  // `program`: the job's command line instead of falcon-emu-job's (then `iters` and `job_args`
  // are not used).
  void Start(int iters, int poll_ms = 20, int flush_ms = 100, std::vector<std::string> job_args = {},
             std::vector<std::string> program = {}) {
    const std::string agent = testing::BinDir("daemon") + "/falcon-agent";
    const std::string cmd = "exec '" + agent + "' --job " + kJob + " --host " + kHost + " --shm-dir '" + shm_ +
                            "' --redis-port " + std::to_string(redis_.port()) +
                            " --metrics-port 0 --poll-ms " + std::to_string(poll_ms) + " --flush-ms " +
                            std::to_string(flush_ms) + " --heartbeat-ms 300"
                            " --command-block-ms 100 --trap-wait-ms 20000 --log-level debug 2>'" +
                            agent_log_ + "'";
    agent_ = testing::Spawn({"/bin/sh", "-c", cmd}, {});
    ASSERT_GT(agent_, 0);
    std::vector<std::string> argv = {testing::BinDir("bench/emu") + "/falcon-emu-run", "-n", std::to_string(kRanks),
                                     "--ranks-per-node", "2", "--job-timeout", "300", "--lib-dir", testing::EmuLibDir(),
                                     "--preload", testing::PreloadValue(), "--"};
    if (program.empty()) {
      program = {testing::BinDir("bench/emu") + "/falcon-emu-job", "--iters", std::to_string(iters),
                 "--compute-ms", "2", "--bytes", "65536", "--check"};
      program.insert(program.end(), job_args.begin(), job_args.end());
    }
    argv.insert(argv.end(), program.begin(), program.end());
    job_ = testing::Spawn(argv, {"FALCON_SHM_DIR=" + shm_, "FALCON_JOB=" + std::string(kJob)});
    ASSERT_GT(job_, 0);
    ASSERT_TRUE(WaitUntil([&] { return OpenAll(); }, 30)) << "segments did not appear";
    ASSERT_TRUE(WaitUntil([&] {
      for (int r = 0; r < kRanks; ++r) {
        auto h = redis::HGetAll(*c_, Key(protocol::kRankKey, r));
        if (!h.ok() || h.value().count("msg") == 0) return false;
      }
      return true;
    }, 30)) << ReadFile(agent_log_);
  }

  bool OpenAll() {
    auto listed = daemon::ListSegments(shm_, static_cast<uint32_t>(getuid()), false);
    if (!listed.ok() || listed.value().size() != kRanks) return false;
    std::vector<std::pair<int, daemon::SegmentReader>> found;
    for (const auto& info : listed.value()) {
      auto seg = daemon::SegmentReader::Open(info.path);
      if (!seg.ok()) return false;
      auto comms = seg.value().Comms();
      if (comms.empty() || comms[0].entry.nranks != kRanks) return false;  // world not created yet
      world_id_ = comms[0].entry.comm_id;
      found.emplace_back(comms[0].entry.rank, std::move(seg.value()));
    }
    std::sort(found.begin(), found.end(), [](auto& a, auto& b) { return a.first < b.first; });
    segs_.clear();
    for (auto& f : found) segs_.push_back(std::move(f.second));
    return true;
  }

  // Every rank issues 50 more world calls within timeout_s.
  bool TrainingGoesOn(double timeout_s) const {
    const uint64_t after = WorldCalls();
    return WaitUntil([&] {
      for (const auto& s : segs_) {
        if (s.CommCalls(0) < after + 50) return false;
      }
      return true;
    }, timeout_s);
  }

  // The furthest rank's next call number on the world communicator (slot 0).
  uint64_t WorldCalls() const {
    uint64_t n = 0;
    for (const auto& s : segs_) n = std::max(n, s.CommCalls(0));
    return n;
  }

  protocol::Command NewCommand(const std::string& type) {
    protocol::Command c;
    c.type = type;
    c.id = type + "-" + std::to_string(++commands_);
    c.issued_ns = WallClockNs();
    return c;
  }

  // XADDs every command first (they may wait on one another: joins of one communicator), then
  // returns their acks in order.
  std::vector<json> SendAll(const std::vector<protocol::Command>& cmds, double timeout_s) {
    for (const protocol::Command& c : cmds) {
      EXPECT_TRUE(redis::XAdd(*c_, Key(protocol::kCommandsStream), 0, {{"msg", protocol::ToJson(c).dump()}}).ok());
    }
    std::vector<json> acks;
    for (const protocol::Command& c : cmds) acks.push_back(AwaitAck(c, timeout_s));
    return acks;
  }

  // A GEMM validation of `size` x `size` matrices, `repeats` times, on every paused rank.
  protocol::Command Gemm(std::int64_t size, std::int64_t repeats) {
    protocol::Command c = NewCommand("validate");
    c.task = "gemm";
    c.size = size;
    c.repeats = repeats;
    return c;
  }

  // One cut_info: every rank's pattern, its minimum position 3 s of its pace past where it is
  // (true once the agent has locked every rank's period, after a few iterations).
  bool CutPatterns(std::vector<analyzer::RankCallPattern>* patterns) {
    const json info = Send(NewCommand("cut_info"), 15);
    if (info["status"] != "ok") return false;
    patterns->clear();
    for (const json& r : info["results"]) {
      auto m = protocol::ParseCutPattern(r["pattern"]);
      EXPECT_TRUE(m.ok()) << m.status().ToString();
      if (!m.ok()) return false;
      analyzer::RankCallPattern p = m.value().pattern;
      p.min_position = m.value().position + static_cast<std::uint64_t>(m.value().units_per_s * 3.0) + 1;
      patterns->push_back(p);
    }
    return patterns->size() == kRanks;
  }

  // XADDs `c` and returns its ack (validated), or a null json after `timeout_s`.
  json Send(const protocol::Command& c, double timeout_s) {
    EXPECT_TRUE(redis::XAdd(*c_, Key(protocol::kCommandsStream), 0, {{"msg", protocol::ToJson(c).dump()}}).ok());
    return AwaitAck(c, timeout_s);
  }

  json AwaitAck(const protocol::Command& c, double timeout_s) {
    json ack;
    const bool got = WaitUntil([&] {
      auto entries = redis::XRange(*c_, Key(protocol::kAcksStream), "-", "+", 0);
      if (!entries.ok()) return false;
      for (const auto& e : entries.value()) {
        const std::string* msg = e.Field("msg");
        if (msg == nullptr) continue;
        auto j = protocol::ParseMessage(*msg, protocol::kAck);
        EXPECT_TRUE(j.ok()) << j.status().ToString() << ": " << *msg;
        if (j.ok() && j.value()["command"] == c.id) {
          ack = j.value();
          return true;
        }
      }
      return false;
    }, timeout_s);
    EXPECT_TRUE(got) << "no ack for " << c.id << "\n" << ReadFile(agent_log_);
    return ack;
  }

  protocol::Command Pause(uint64_t comm_seq, double max_pause_s) {
    protocol::Command c = NewCommand("pause");
    c.comm = protocol::CommIdHex(world_id_);
    c.comm_seq = comm_seq;
    c.max_pause_s = max_pause_s;
    return c;
  }

  testing::RedisServer redis_;
  testing::TempDir dir_;
  std::unique_ptr<redis::RedisConnection> c_;  // connected in SetUp
  std::string shm_, agent_log_;
  pid_t agent_ = -1, job_ = -1;
  std::vector<daemon::SegmentReader> segs_;
  uint64_t world_id_ = 0;
  int commands_ = 0;
};

TEST_F(AgentTrapTest, PauseValidateResumeThroughRedisLosesNoTrainingData) {
  Start(/*iters=*/1200);
  // A cut some way ahead: the agent reads the command within ~100 ms, the ranks need longer.
  const uint64_t target = WorldCalls() + 300;
  const json paused = Send(Pause(target, 20), 30);
  ASSERT_EQ(paused["status"], "ok") << paused.dump();
  ASSERT_EQ(paused["results"].size(), size_t{kRanks});
  for (const json& r : paused["results"]) EXPECT_EQ(r["state"], "trapped") << paused.dump();
  // Every rank stopped at the same call: the target, or, when the target sits inside an NCCL
  // group, right after that group (the shim never stops inside one).
  const uint64_t cut = segs_[0].CommCalls(0);
  EXPECT_GE(cut, target);
  for (const auto& s : segs_) EXPECT_EQ(s.CommCalls(0), cut) << "every rank stopped at the same call";

  const protocol::Command gemm = Gemm(48, 3);
  // Transfers run on a validation communicator: rank 0 makes its id, every rank joins it.
  protocol::Command id = NewCommand("validate");
  id.task = "vcomm_id";
  id.ranks = std::vector<std::int64_t>{0};
  const json made = Send(id, 30);
  ASSERT_EQ(made["status"], "ok") << made.dump();
  const std::string blob = made["results"][0].value("blob", "");
  ASSERT_EQ(blob.size(), 2u * FALCON_TASK_BLOB_LEN) << made.dump();
  // Validation ranks in reverse order: rank 0 joins alone (`vrank`), the others in one command
  // with a validation rank each (`vrank_each`), as the controller sends a host's ranks.
  auto vrank_of = [](std::int64_t r) { return std::int64_t{kRanks} - 1 - r; };
  std::vector<protocol::Command> joins = {NewCommand("validate"), NewCommand("validate")};
  for (protocol::Command& j : joins) {
    j.task = "vcomm_join";
    j.blob = blob;
    j.vranks = kRanks;
    j.bytes = 32768;
  }
  joins[0].ranks = std::vector<std::int64_t>{0};
  joins[0].vrank = vrank_of(0);
  joins[1].ranks = std::vector<std::int64_t>{};
  for (std::int64_t r = 1; r < kRanks; ++r) {
    joins[1].ranks->push_back(r);
    joins[1].vrank_each.push_back(vrank_of(r));
  }
  for (const json& ack : SendAll(joins, 30)) ASSERT_EQ(ack["status"], "ok") << ack.dump();
  protocol::Command ring = NewCommand("validate");
  ring.task = "p2p";
  ring.comm = protocol::CommIdHex(world_id_);
  ring.shift = 1;
  ring.bytes = 32768;
  ring.repeats = 20;
  // Pairs of validation ranks (0-1, 2-3, ...) exchange, each rank told its own peer (`peers`).
  protocol::Command pairs = NewCommand("validate");
  pairs.task = "p2p";
  pairs.bytes = 32768;
  pairs.repeats = 5;
  pairs.ranks = std::vector<std::int64_t>{};
  for (std::int64_t r = 0; r < kRanks; ++r) {
    pairs.ranks->push_back(r);
    pairs.peers.push_back(vrank_of(r) ^ 1);
  }
  for (const protocol::Command& v : {gemm, ring, pairs}) {
    const json ack = Send(v, 30);
    ASSERT_EQ(ack["status"], "ok") << ack.dump();
    ASSERT_EQ(ack["results"].size(), size_t{kRanks});
    for (const json& r : ack["results"]) {
      EXPECT_EQ(r["task_status"], "ok") << ack.dump();
      EXPECT_GT(r["rate"].get<double>(), 0.0);
      EXPECT_LE(r["min_s"].get<double>(), r["median_s"].get<double>());
      EXPECT_LE(r["median_s"].get<double>(), r["max_s"].get<double>());
    }
    for (const auto& s : segs_) EXPECT_EQ(s.CommCalls(0), cut) << "benchmark traffic takes no training seq";
  }

  const json resumed = Send(NewCommand("resume"), 30);
  ASSERT_EQ(resumed["status"], "ok") << resumed.dump();
  for (const json& r : resumed["results"]) EXPECT_EQ(r["state"], "resumed");
  EXPECT_EQ(testing::WaitFor(job_, 90), 0) << "the job's --check found wrong data, or it failed";
  job_ = -1;
  // The benchmark passes are not part of any rank's iteration: each rank kept the one period
  // lock it had before the pause.
  const std::string log = ReadFile(agent_log_);
  EXPECT_EQ(log.find("event=period_lost"), std::string::npos) << log;
}

// A validation is a chain of command round trips with the job stopped: the agent answers each as
// soon as the shims have, not at its next tick (poll_ms) or report flush (flush_ms).
TEST_F(AgentTrapTest, CommandsAreAnsweredWithoutWaitingForTheTickOrTheFlush) {
  constexpr int kPollMs = 4000, kFlushMs = 8000;
  Start(/*iters=*/100000, kPollMs, kFlushMs);
  const json paused = Send(Pause(WorldCalls() + 300, 60), 30);
  ASSERT_EQ(paused["status"], "ok") << paused.dump();
  const protocol::Command gemm = Gemm(32, 1);
  for (const protocol::Command& c : {gemm, NewCommand("resume")}) {
    const auto t0 = std::chrono::steady_clock::now();
    const json ack = Send(c, 30);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(ack["status"], "ok") << ack.dump();
    EXPECT_LT(s, kPollMs / 2000.0) << c.type << " was answered at a tick or a flush, not when done";
  }
}

// Every member of every communicator has issued the same number of calls (a consistent cut).
void ExpectConsistentCut(const std::vector<daemon::SegmentReader>& segs) {
  std::map<std::uint64_t, std::set<std::uint64_t>> calls;  // comm id -> counts seen
  for (const auto& s : segs) {
    for (const auto& c : s.Comms()) {
      if (c.entry.state != kFalconCommLive) continue;  // the held call's comm_seq is taken, not issued
      calls[c.entry.comm_id].insert(s.CommCalls(c.slot) - (c.slot == s.trapped_comm_slot() ? 1 : 0));
    }
  }
  for (const auto& [id, counts] : calls) {
    EXPECT_EQ(counts.size(), 1u) << "members of communicator " << protocol::CommIdHex(id) << " disagree";
  }
}

// A job that issues no world collective per iteration (Megatron-style): the cut is planned from
// each rank's call pattern (cut_info) and every rank gets per-communicator targets; falcon-ctl
// pause --iteration does the same for a chosen iteration of the lowest rank.
TEST_F(AgentTrapTest, ConsistentCutWithoutAWorldCollective) {
  Start(/*iters=*/100000, 20, 100, {"--no-world", "--watchdog"});
  std::vector<analyzer::RankCallPattern> patterns;
  ASSERT_TRUE(WaitUntil([&] { return CutPatterns(&patterns); }, 60)) << ReadFile(agent_log_);
  for (const auto& p : patterns) {
    EXPECT_EQ(p.comms.size(), 3u) << "world, TP and DP";
    EXPECT_FALSE(p.units.empty());
  }
  const analyzer::CutPlan plan = analyzer::PlanCut(patterns);
  std::string dump;
  for (const auto& p : patterns) dump += protocol::CutPatternToJson({p, p.min_position, 0, 0}).dump() + "\n";
  ASSERT_TRUE(plan.ok()) << plan.failure << "\n" << dump;
  protocol::Command pause = NewCommand("pause");
  pause.max_pause_s = 20;
  for (const auto& r : plan.ranks) pause.targets.push_back({r.rank, r.targets});
  const json paused = Send(pause, 30);
  std::string why;
  for (std::size_t i = 0; i < plan.ranks.size(); ++i) {
    for (const auto& t : plan.ranks[i].targets) {
      for (const auto& c : segs_[static_cast<std::size_t>(plan.ranks[i].rank)].Comms()) {
        if (c.entry.comm_id == t.comm) {
          why += "rank " + std::to_string(plan.ranks[i].rank) + " comm " + protocol::CommIdHex(t.comm) + " trigger " +
                 std::to_string(t.trigger_seq) + " expect " + std::to_string(t.expect_seq) + " now " +
                 std::to_string(segs_[static_cast<std::size_t>(plan.ranks[i].rank)].CommCalls(c.slot)) + "\n";
        }
      }
    }
  }
  ASSERT_EQ(paused["status"], "ok") << paused.dump() << "\n" << why << dump;
  for (const json& r : paused["results"]) EXPECT_EQ(r["state"], "trapped") << paused.dump();
  ExpectConsistentCut(segs_);
  const protocol::Command gemm = Gemm(32, 2);
  EXPECT_EQ(Send(gemm, 30)["status"], "ok");
  ASSERT_EQ(Send(NewCommand("resume"), 30)["status"], "ok");

  // falcon-ctl pause --iteration: a few iterations after the lowest rank's current one.
  const std::string ctl = testing::BinDir("daemon") + "/falcon-ctl";
  const std::string port = std::to_string(redis_.port());
  testing::ProcessResult early = testing::Run(
      {ctl, "pause", "--iteration", "0", "--max-pause", "20", "--port", port, "--job", kJob, "--timeout", "20"}, {}, 60);
  EXPECT_NE(early.exit_code, 0) << early.out;
  EXPECT_NE(early.err.find("has passed"), std::string::npos) << early.err;
  // A passed iteration names a later one that has a cut, a second ahead (the default --lead);
  // with a lead of five seconds, the one named is further on.
  const auto named_in = [](const std::string& err) -> std::uint64_t {
    const std::size_t at = err.find("(iteration ");
    return at == std::string::npos || err.find(" has a cut as the ranks stand now)", at) == std::string::npos
               ? 0
               : std::stoull(err.substr(at + 11));
  };
  const std::uint64_t named_early = named_in(early.err);
  EXPECT_GT(named_early, 0u) << early.err;
  testing::ProcessResult far = testing::Run({ctl, "pause", "--iteration", "0", "--lead", "5", "--max-pause", "20",
                                             "--port", port, "--job", kJob, "--timeout", "20"}, {}, 60);
  EXPECT_NE(far.exit_code, 0) << far.out;
  EXPECT_GT(named_in(far.err), named_early + 10) << early.err << far.err;
  testing::ProcessResult bad = testing::Run(
      {ctl, "pause", "--iteration", "5", "--ranks", "0", "--port", port, "--job", kJob}, {}, 60);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("drop --ranks"), std::string::npos) << bad.err;
  testing::ProcessResult unpaired = testing::Run(
      {ctl, "validate", "--task", "p2p", "--ranks", "0,1", "--peers", "1", "--bytes", "1024", "--port", port, "--job", kJob},
      {}, 60);
  EXPECT_EQ(unpaired.exit_code, 2) << unpaired.err;
  EXPECT_NE(unpaired.err.find("--peers needs one entry per --ranks entry"), std::string::npos) << unpaired.err;
  // Rank 0's iteration now and its pace, fresh: aim a few seconds ahead. On a loaded machine the
  // aim can still fall short ("too soon", naming the rank and an iteration that had a cut): then
  // aim past the one named, as a user would.
  testing::ProcessResult r;
  std::optional<std::uint64_t> named;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::uint64_t iteration = 0;
    const json info = Send(NewCommand("cut_info"), 15);
    for (const json& rr : info["results"]) {
      auto m = protocol::ParseCutPattern(rr["pattern"]);
      ASSERT_TRUE(m.ok()) << info.dump();
      const auto& p = m.value().pattern;
      if (p.rank != 0) continue;
      ASSERT_TRUE(p.iteration_at_start.has_value()) << "rank 0's pattern starts at an iteration boundary";
      const double per_s = m.value().units_per_s / static_cast<double>(p.units.size());
      iteration = std::max(*p.iteration_at_start, named.value_or(0)) +
                  static_cast<std::uint64_t>(per_s * (3.0 + 2.0 * attempt)) + 5;
    }
    r = testing::Run({ctl, "pause", "--iteration", std::to_string(iteration), "--max-pause", "20", "--port", port,
                      "--job", kJob, "--timeout", "30", "--json"}, {}, 90);
    if (r.exit_code == 0 || r.err.find("too soon") == std::string::npos) break;
    named = named_in(r.err);
    EXPECT_GT(*named, iteration) << "a too-soon failure names a later iteration: " << r.err;
  }
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json doc = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(doc.is_object()) << r.out;
  for (const json& t : doc["targets"]) {
    for (const json& rr : t["ack"]["results"]) EXPECT_EQ(rr["state"], "trapped") << r.out;
  }
  ExpectConsistentCut(segs_);
  testing::ProcessResult resumed = testing::Run({ctl, "resume", "--port", port, "--job", kJob}, {}, 60);
  EXPECT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  std::uint64_t before = segs_[0].CommCalls(1);
  EXPECT_TRUE(WaitUntil([&] { return segs_[0].CommCalls(1) > before + 20; }, 30)) << "training did not go on";

  // --next-iteration: no number to guess; the one chosen is printed.
  for (const std::vector<std::string>& wrong :
       {std::vector<std::string>{"--next-iteration", "--iteration", "5"},
        std::vector<std::string>{"--next-iteration", "--comm", "0000000000000001", "--seq", "3"},
        std::vector<std::string>{"--next-iteration", "--ranks", "0"}}) {
    std::vector<std::string> argv = {ctl, "pause", "--port", port, "--job", kJob};
    argv.insert(argv.end(), wrong.begin(), wrong.end());
    testing::ProcessResult w = testing::Run(argv, {}, 60);
    EXPECT_EQ(w.exit_code, 2) << wrong[1] << ": " << w.out << w.err;
  }
  testing::ProcessResult next = testing::Run({ctl, "pause", "--next-iteration", "--max-pause", "20", "--port", port,
                                              "--job", kJob, "--timeout", "30", "--json"}, {}, 90);
  ASSERT_EQ(next.exit_code, 0) << next.out << next.err;
  const json next_doc = json::parse(next.out, nullptr, false);
  ASSERT_TRUE(next_doc.is_object()) << next.out;
  ASSERT_TRUE(next_doc.contains("iteration")) << next.out;
  EXPECT_GT(next_doc["iteration"].get<std::uint64_t>(), named_early) << "a later iteration than one named before";
  for (const json& t : next_doc["targets"]) {
    for (const json& rr : t["ack"]["results"]) EXPECT_EQ(rr["state"], "trapped") << next.out;
  }
  ExpectConsistentCut(segs_);
  resumed = testing::Run({ctl, "resume", "--port", port, "--job", kJob}, {}, 60);
  EXPECT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  before = segs_[0].CommCalls(1);
  EXPECT_TRUE(WaitUntil([&] { return segs_[0].CommCalls(1) > before + 20; }, 30)) << "training did not go on";
}

// A pipeline of four stages that exchange on one communicator of all of them (the trainer's
// sends are batched, as PyTorch's batch_isend_irecv are: they ride the group's communicator):
// a middle stage calls it twice as often as an end stage, so only counts per channel place a
// cut. Every rank must stop at its trigger (a receive left waiting on a stopped sender would
// keep its rank from ever reaching it), and the job's checked data must come through.
TEST_F(AgentTrapTest, ABatchedFourStagePipelineIsCutPerChannel) {
  Start(0, 20, 100, {},
        {testing::BinDir("bench/train") + "/falcon-train-emu", "--tp", "1", "--dp", "1", "--pp", "4",
         "--compute-ms", "2", "--iters", "100000", "--check"});
  std::vector<analyzer::RankCallPattern> patterns;
  ASSERT_TRUE(WaitUntil([&] { return CutPatterns(&patterns); }, 60)) << ReadFile(agent_log_);
  std::string dump;
  for (const auto& p : patterns) dump += protocol::CutPatternToJson({p, p.min_position, 0, 0}).dump() + "\n";
  for (const auto& p : patterns) {
    // The pipeline communicator: sends and receives per neighbour, counted from its first call.
    int p2p = 0;
    for (const auto& c : p.comms) {
      for (const auto& ch : c.channels) p2p += ch.kind != analyzer::ChannelKind::kCollective;
    }
    EXPECT_EQ(p2p, p.rank == 0 || p.rank == kRanks - 1 ? 2 : 4) << "rank " << p.rank << "\n" << dump;
  }
  std::vector<analyzer::RankCallPattern> totals = patterns;  // what an older agent would report
  for (auto& p : totals) {
    for (auto& c : p.comms) c.channels.clear(), c.rank = -1;
  }
  EXPECT_NE(analyzer::PlanCut(totals).failure.find("calls per period"), std::string::npos);
  const analyzer::CutPlan plan = analyzer::PlanCut(patterns);
  ASSERT_TRUE(plan.ok()) << plan.failure << "\n" << dump;
  protocol::Command pause = NewCommand("pause");
  pause.max_pause_s = 20;
  for (const auto& r : plan.ranks) pause.targets.push_back({r.rank, r.targets});
  const json paused = Send(pause, 30);
  ASSERT_EQ(paused["status"], "ok") << paused.dump() << "\n" << dump;
  for (const json& r : paused["results"]) EXPECT_EQ(r["state"], "trapped") << paused.dump();
  const protocol::Command gemm = Gemm(32, 2);
  EXPECT_EQ(Send(gemm, 30)["status"], "ok");
  ASSERT_EQ(Send(NewCommand("resume"), 30)["status"], "ok");
  std::uint32_t busiest = 0;  // rank 0's busiest communicator: its sends and receives
  for (const auto& c : segs_[0].Comms()) {
    if (segs_[0].CommCalls(c.slot) > segs_[0].CommCalls(busiest)) busiest = c.slot;
  }
  const std::uint64_t before = segs_[0].CommCalls(busiest);
  EXPECT_TRUE(WaitUntil([&] { return segs_[0].CommCalls(busiest) > before + 20; }, 30)) << "training did not go on";
  int status = 0;
  EXPECT_EQ(::waitpid(job_, &status, WNOHANG), 0) << "the job ended (its own data checks fail it)";
}

// Commands for every agent come through the broadcast stream: a GEMM there names no ranks and
// runs on the ranks this agent holds paused (here ranks 0 and 1 of 4), and the resume there
// releases them; both are acked like the agent's own commands.
TEST_F(AgentTrapTest, ABroadcastGemmRunsOnThePausedRanksOnly) {
  Start(/*iters=*/100000);  // runs until TearDown ends it
  protocol::Command pause = Pause(WorldCalls() + 300, 20);
  pause.ranks = std::vector<std::int64_t>{0, 1};
  const json paused = Send(pause, 30);
  ASSERT_EQ(paused["status"], "ok") << paused.dump();
  auto broadcast = [&](const protocol::Command& c) {
    EXPECT_TRUE(redis::XAdd(*c_, Key(protocol::kBroadcastStream), 0, {{"msg", protocol::ToJson(c).dump()}}).ok());
    return AwaitAck(c, 30);
  };
  const json gemm = broadcast(Gemm(48, 3));
  ASSERT_EQ(gemm["status"], "ok") << gemm.dump();
  EXPECT_EQ(gemm["host"], kHost);
  std::set<std::int64_t> measured;
  for (const json& r : gemm["results"]) {
    EXPECT_EQ(r["task_status"], "ok") << gemm.dump();
    measured.insert(r["rank"].get<std::int64_t>());
  }
  EXPECT_EQ(measured, (std::set<std::int64_t>{0, 1})) << "ranks 2 and 3 are not paused: not the GEMM's";
  const json resumed = broadcast(NewCommand("resume"));
  ASSERT_EQ(resumed["status"], "ok") << resumed.dump();
  for (const json& r : resumed["results"]) EXPECT_EQ(r["state"], "resumed");
  EXPECT_TRUE(TrainingGoesOn(20)) << "training did not continue";
}

TEST_F(AgentTrapTest, UnreachedPausesExpireAndBadCommandsAreRejected) {
  Start(/*iters=*/100000);  // runs until TearDown ends it
  // Malformed: no comm_seq; unknown communicator; validate while nothing is paused; resume too.
  protocol::Command no_seq = NewCommand("pause");
  no_seq.comm = protocol::CommIdHex(world_id_);
  no_seq.max_pause_s = 5;
  EXPECT_EQ(Send(no_seq, 15)["status"], "rejected");
  protocol::Command unknown = Pause(WorldCalls() + 300, 5);
  unknown.comm = "0123456789abcdef";
  const json u = Send(unknown, 15);
  EXPECT_EQ(u["status"], "rejected");
  EXPECT_NE(u["detail"].get<std::string>().find("not in communicator"), std::string::npos) << u.dump();
  protocol::Command gemm = NewCommand("validate");
  gemm.task = "gemm";
  const json none = Send(gemm, 15);
  EXPECT_EQ(none["status"], "rejected");
  EXPECT_NE(none.value("detail", "").find("no rank here is trapped"), std::string::npos) << none.dump();
  EXPECT_EQ(Send(NewCommand("resume"), 15)["status"], "rejected");
  protocol::Command elsewhere = Pause(WorldCalls() + 300, 5);
  elsewhere.ranks = std::vector<std::int64_t>{17};
  EXPECT_EQ(Send(elsewhere, 15)["status"], "rejected");

  // A cut the ranks never reach before the deadline: acked expired, and training goes on.
  const json expired = Send(Pause(WorldCalls() + 1'000'000'000, 1.5), 20);
  EXPECT_EQ(expired["status"], "expired") << expired.dump();
  for (const json& r : expired["results"]) EXPECT_EQ(r["state"], "expired");
  EXPECT_TRUE(TrainingGoesOn(20)) << "training did not continue";
  for (const auto& s : segs_) {
    uint64_t gen = 0;
    EXPECT_EQ(s.pause_state(&gen), kFalconPauseExpired);
  }
}

}  // namespace
}  // namespace falcon
