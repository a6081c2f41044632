// Falcon on a Redis Cluster: three real redis-server nodes in cluster mode on loopback.
//
// Every key of a job carries the job as its hash tag (falcon:{job}:..., include/falcon/protocol.h),
// so one node holds the whole job, and the Redis client follows MOVED and ASK redirects
// (daemon/redis/redis_connection.h). The tests check both halves with the server's own slot
// arithmetic (CLUSTER KEYSLOT), then run the real falcon-agent, falcon-controller and falcon-ctl,
// each pointed at a node that does not hold the job. Every wait is a condition with a deadline.
#include <gtest/gtest.h>
#include <signal.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/protocol/keys.h"
#include "daemon/redis/redis_commands.h"
#include "tests/support/redis_server.h"
#include "tests/support/subprocess.h"

namespace falcon {
namespace {

using nlohmann::json;
using testing::ReadFile;
using testing::WaitUntil;

constexpr int kNodes = 3;

class RedisClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::RedisServerOptions o;
    o.cluster = true;
    std::vector<testing::RedisServer*> nodes;
    for (int i = 0; i < kNodes; ++i) {
      nodes_.push_back(std::make_unique<testing::RedisServer>(o));
      ASSERT_TRUE(nodes_.back()->Start().ok()) << nodes_.back()->Log();
      nodes.push_back(nodes_.back().get());
    }
    Status formed = testing::FormCluster(nodes);
    ASSERT_TRUE(formed.ok()) << formed.ToString() << nodes_[0]->Log();
    for (int i = 0; i < kNodes; ++i) {
      admin_.push_back(std::make_unique<redis::RedisConnection>(nodes_[i]->ClientOptions()));
      ASSERT_TRUE(admin_.back()->Connect().ok());
    }
  }

  // The hash slot of `key`, as the cluster computes it.
  long long Slot(const std::string& key) {
    Result<redis::RedisReply> r = admin_[0]->Command({"CLUSTER", "KEYSLOT", key});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r.value().integer : -1;
  }
  // The node (index) that serves `slot`: FormCluster gives node i the i-th equal range.
  static int NodeOfSlot(long long slot) { return static_cast<int>(slot * kNodes / 16384); }

  // Keys on node i (its whole keyspace: a cluster node has db 0 only).
  std::set<std::string> KeysOn(int i) {
    std::set<std::string> keys;
    Result<redis::RedisReply> r = admin_[i]->Command({"KEYS", "*"});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok()) {
      for (const redis::RedisReply& k : r.value().elements) keys.insert(k.str);
    }
    return keys;
  }

  std::string Key(const protocol::KeySpec& spec, const std::string& job, const std::string& host = "h",
                  std::optional<std::int64_t> rank = 0) {
    return protocol::FormatKey(spec, {job, host, rank}).value();
  }

  // A job name (job-0, job-1, ...) whose keys live on node `node`.
  std::string JobOn(int node) {
    for (int i = 0; i < 1000; ++i) {
      const std::string job = "job-" + std::to_string(i);
      if (NodeOfSlot(Slot(Key(protocol::kRankKey, job))) == node) return job;
    }
    ADD_FAILURE() << "no job name on node " << node;
    return "";
  }

  std::vector<std::unique_ptr<testing::RedisServer>> nodes_;
  std::vector<std::unique_ptr<redis::RedisConnection>> admin_;
};

// What a redirect says, and what is not one (it stays an error reply for the caller).
TEST(RedisRedirectTest, MovedAndAskAreParsedAndAnythingElseIsNot) {
  std::optional<redis::Redirect> r = redis::ParseRedirect("MOVED 3999 127.0.0.1:6381");
  ASSERT_TRUE(r.has_value());
  EXPECT_FALSE(r->ask);
  EXPECT_EQ(r->host, "127.0.0.1");
  EXPECT_EQ(r->port, 6381);
  r = redis::ParseRedirect("ASK 12 :7000");  // a node that does not know its address
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(r->ask);
  EXPECT_EQ(r->host, "");
  EXPECT_EQ(r->port, 7000);
  r = redis::ParseRedirect("MOVED 1 ::1:7001");  // IPv6: the port follows the last colon
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->host, "::1");
  EXPECT_EQ(r->port, 7001);
  for (const char* not_one : {"MOVED", "MOVED 1", "MOVED 1 host", "MOVED 1 host:0", "MOVED 1 host:65536",
                              "MOVED 1 host:12x", "MOVED 1 host:", "ASKING", "ERR MOVED 1 h:1", "moved 1 h:1", ""}) {
    EXPECT_FALSE(redis::ParseRedirect(not_one).has_value()) << not_one;
  }
}

// Every key kind of a job hashes to one slot (the server's CLUSTER KEYSLOT, not ours), and 100
// jobs spread over the three nodes.
TEST_F(RedisClusterTest, AJobsKeysShareOneSlotAndJobsSpreadOverTheNodes) {
  std::map<int, int> jobs_per_node;
  for (int j = 0; j < 100; ++j) {
    const std::string job = "train-" + std::to_string(j);
    std::set<long long> slots;
    for (const protocol::KeySpec& spec : protocol::kAllKeys) slots.insert(Slot(Key(spec, job, "node-7", 4095)));
    ASSERT_EQ(slots.size(), 1u) << job << ": its keys fall in " << slots.size() << " slots";
    ++jobs_per_node[NodeOfSlot(*slots.begin())];
  }
  ASSERT_EQ(jobs_per_node.size(), static_cast<std::size_t>(kNodes));
  for (const auto& [node, n] : jobs_per_node) {
    EXPECT_GE(n, 20) << "node " << node << " holds " << n << " of 100 jobs";
  }
}

// A connection to the wrong node moves to the right one on MOVED, stays there, and reads back
// what it wrote; commands of one pipeline over three nodes each run exactly once, in order.
TEST_F(RedisClusterTest, CommandsFollowMovedAndAPipelineRunsEachCommandOnce) {
  const std::string job = JobOn(2);
  redis::RedisConnection c(nodes_[0]->ClientOptions());
  ASSERT_TRUE(c.Connect().ok());
  const std::string rank_key = Key(protocol::kRankKey, job);
  ASSERT_TRUE(redis::HSet(c, rank_key, {{"msg", "{}"}, {"host", "h"}}).ok());
  EXPECT_EQ(c.endpoint(), "127.0.0.1:" + std::to_string(nodes_[2]->port()));
  EXPECT_EQ(c.redirects(), 1u);
  Result<std::map<std::string, std::string>> h = redis::HGetAll(c, rank_key);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h.value().at("host"), "h");
  EXPECT_EQ(c.redirects(), 1u) << "the second command went straight to the job's node";
  EXPECT_EQ(KeysOn(2), (std::set<std::string>{rank_key}));

  // INCR on a key of a job on each node, twice over, and a PUBLISH (no key: runs where sent).
  std::vector<std::vector<std::string>> cmds;
  std::vector<std::string> counters;
  for (int node = 0; node < kNodes; ++node) counters.push_back(Key(protocol::kControllerKey, JobOn(node)) + ":n");
  for (int round = 0; round < 2; ++round) {
    for (const std::string& k : counters) cmds.push_back({"INCR", k});
    cmds.push_back({"PUBLISH", "falcon:{x}:alerts", "m"});
  }
  Result<std::vector<redis::RedisReply>> r = c.Pipeline(cmds);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r.value().size(), cmds.size());
  for (std::size_t i = 0; i < cmds.size(); ++i) {
    const redis::RedisReply& rep = r.value()[i];
    ASSERT_EQ(rep.type, redis::RedisReply::Type::kInteger) << i << ": " << rep.str;
    if (cmds[i][0] == "INCR") {
      EXPECT_EQ(rep.integer, i < cmds.size() / 2 ? 1 : 2) << cmds[i][1];
    }
  }
  for (int node = 0; node < kNodes; ++node) {
    Result<redis::RedisReply> v = admin_[node]->Command({"GET", counters[node]});
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(v.value().str, "2") << "each INCR ran once on node " << node;
  }
}

// A slot in migration: a key already moved answers ASK on the old node; the client asks the new
// node once (ASKING + the command) and keeps its connection where it was.
TEST_F(RedisClusterTest, AskDuringAMigrationIsAnsweredByTheImportingNode) {
  const std::string job = JobOn(0);
  const std::string key = Key(protocol::kPlanKey, job);
  const std::string slot = std::to_string(Slot(key));
  Result<redis::RedisReply> id0 = admin_[0]->Command({"CLUSTER", "MYID"});
  Result<redis::RedisReply> id1 = admin_[1]->Command({"CLUSTER", "MYID"});
  ASSERT_TRUE(id0.ok() && id1.ok());
  ASSERT_TRUE(admin_[1]->Command({"CLUSTER", "SETSLOT", slot, "IMPORTING", id0.value().str}).ok());
  ASSERT_TRUE(admin_[0]->Command({"CLUSTER", "SETSLOT", slot, "MIGRATING", id1.value().str}).ok());
  Result<std::vector<redis::RedisReply>> put =
      admin_[1]->Pipeline({{"ASKING"}, {"HSET", key, "msg", "on the importing node"}});
  ASSERT_TRUE(put.ok());
  ASSERT_EQ(put.value()[1].type, redis::RedisReply::Type::kInteger) << put.value()[1].str;

  redis::RedisConnection c(nodes_[0]->ClientOptions());
  ASSERT_TRUE(c.Connect().ok());
  Result<std::map<std::string, std::string>> h = redis::HGetAll(c, key);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h.value()["msg"], "on the importing node");
  EXPECT_EQ(c.redirects(), 1u);
  EXPECT_EQ(c.endpoint(), "127.0.0.1:" + std::to_string(nodes_[0]->port())) << "ASK does not move the connection";
}

// SCAN lists one node's keys; ScanKeys first moves to the node of the pattern's hash tag, so it
// finds a job's keys from whichever node it starts.
TEST_F(RedisClusterTest, ScanKeysFindsAJobsKeysFromAnyNode) {
  const std::string job = JobOn(1);
  std::set<std::string> want;
  for (std::int64_t rank = 0; rank < 50; ++rank) {
    want.insert(Key(protocol::kRankKey, job, "h", rank));
    ASSERT_TRUE(admin_[1]->Command({"HSET", Key(protocol::kRankKey, job, "h", rank), "msg", "{}"}).ok());
  }
  const std::string pattern = protocol::KeyMatchPattern(protocol::kRankKey, {job, {}, std::nullopt}).value();
  for (int node = 0; node < kNodes; ++node) {
    redis::RedisConnection c(nodes_[node]->ClientOptions());
    ASSERT_TRUE(c.Connect().ok());
    Result<std::vector<std::string>> keys = redis::ScanKeys(c, pattern);
    ASSERT_TRUE(keys.ok()) << keys.status().ToString();
    EXPECT_EQ(std::set<std::string>(keys.value().begin(), keys.value().end()), want) << "from node " << node;
  }
}

// The real daemons and falcon-ctl, each pointed at a node that does not hold the job: the agent
// registers and answers a command, the controller saves its state, falcon-ctl reads both, and
// every key they wrote is on the job's node.
TEST_F(RedisClusterTest, AgentControllerAndCtlRunAJobFromAnyNode) {
  const std::string job = JobOn(2);
  testing::TempDir dir;
  const std::string port0 = std::to_string(nodes_[0]->port());
  const std::string port1 = std::to_string(nodes_[1]->port());
  const std::string agent_log = dir.path() + "/agent.log", controller_log = dir.path() + "/controller.log";
  const pid_t agent = testing::Spawn(
      {"/bin/sh", "-c",
       "exec '" + testing::BinDir("daemon") + "/falcon-agent' --job " + job + " --host node0 --shm-dir '" + dir.path() +
           "' --redis-port " + port0 + " --metrics-port 0 --heartbeat-ms 200 --flush-ms 50 --command-block-ms 100" +
           " 2>'" + agent_log + "'"},
      {});
  ASSERT_GT(agent, 0);
  const pid_t controller = testing::Spawn(
      {"/bin/sh", "-c",
       "exec '" + testing::BinDir("daemon") + "/falcon-controller' --job " + job + " --redis-port " + port1 +
           " --tick-ms 50 --view-ms 100 --heartbeat-ms 200 2>'" + controller_log + "'"},
      {});
  ASSERT_GT(controller, 0);
  auto ctl = [&](std::vector<std::string> args) {
    std::vector<std::string> argv{testing::BinDir("daemon") + "/falcon-ctl"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"--port", port0, "--job", job});
    return testing::Run(argv, {}, 20);
  };
  json doc;
  EXPECT_TRUE(WaitUntil(
      [&] {
        testing::ProcessResult r = ctl({"status", "--json"});
        if (r.exit_code != 0) return false;
        doc = json::parse(r.out, nullptr, false);
        return doc.is_object() && doc["agents"].size() == 1 && doc["controller"].is_object();
      },
      20))
      << doc.dump() << "\n" << ReadFile(agent_log) << ReadFile(controller_log);
  // A command through the agent's own stream, answered on the job's acks stream: the agent
  // follows no process here, so it rejects it (exit 1; no answer would be exit 4).
  testing::ProcessResult mode = ctl({"mode", "track"});
  EXPECT_EQ(mode.exit_code, 1) << mode.out << mode.err << ReadFile(agent_log);
  EXPECT_NE(mode.out.find("this agent follows no rank"), std::string::npos) << mode.out;

  kill(agent, SIGTERM);
  kill(controller, SIGTERM);
  EXPECT_EQ(testing::WaitFor(agent, 20), 0) << ReadFile(agent_log);
  EXPECT_EQ(testing::WaitFor(controller, 20), 0) << ReadFile(controller_log);
  const std::string prefix = "falcon:{" + job + "}:";
  const std::set<std::string> on_job_node = KeysOn(2);
  EXPECT_GE(on_job_node.size(), 4u);  // agent hash, commands, acks, controller state at least
  for (const std::string& k : on_job_node) EXPECT_EQ(k.rfind(prefix, 0), 0u) << k;
  EXPECT_TRUE(KeysOn(0).empty());
  EXPECT_TRUE(KeysOn(1).empty());
  EXPECT_EQ(ReadFile(agent_log).find("MOVED"), std::string::npos) << ReadFile(agent_log);
  EXPECT_EQ(ReadFile(controller_log).find("MOVED"), std::string::npos) << ReadFile(controller_log);
}

}  // namespace
}  // namespace falcon
