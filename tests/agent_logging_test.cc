// What falcon-agent logs about what it cannot control: the real agent binary against a real
// redis-server, with no traced processes (an empty segment directory): its heartbeat (HSET), its
// command reader (XGROUP, XREADGROUP) and its config file are enough.
//  - Redis refusing the agent (a wrong password, no password where one is required, an ACL user
//    that may only read) is a warning naming the command, once per distinct error however often
//    the agent retries, and a refused connection is never logged as redis_up.
//  - Values from outside (a command's id, its type) cannot forge log lines.
//  - A command on the broadcast stream is answered and acknowledged there, as one on its own;
//    groups Redis lost are made again.
//  - A config file that holds the password and that group or others may read is warned about;
//    files that are not small regular text files are refused (exit 2) without hanging.
// Every wait is a condition with a deadline.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/protocol/keys.h"
#include "daemon/protocol/messages.h"
#include "daemon/redis/redis_commands.h"
#include "tests/support/redis_server.h"
#include "tests/support/subprocess.h"

namespace falcon {
namespace {

using testing::Count;
using testing::ReadFile;
using testing::WaitUntil;

constexpr const char* kJob = "logjob";
constexpr const char* kHost = "node0";

// Lines of `log` whose message (after the "falcon-agent[pid] " prefix, or the whole line when it
// has none: a forged line) starts with `event=forged`.
std::vector<std::string> ForgedLines(const std::string& log) {
  std::vector<std::string> out;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("event=forged", 0) == 0 || line.find("] event=forged") != std::string::npos) out.push_back(line);
  }
  return out;
}

class AgentLoggingTest : public ::testing::Test {
 protected:
  void TearDown() override { StopAgent(); }

  // Starts falcon-agent with fast periods, its stderr in log_; `env` adds FALCON_AGENT_* values.
  void StartAgent(int redis_port, const std::vector<std::string>& args, const std::vector<std::string>& env) {
    std::string cmd = "exec '" + testing::BinDir("daemon") + "/falcon-agent' --job " + kJob + " --host " + kHost +
                      " --shm-dir '" + dir_.path() + "' --redis-port " + std::to_string(redis_port) +
                      " --metrics-port 0 --heartbeat-ms 200 --key-ttl-s 2 --flush-ms 50 --command-block-ms 100" +
                      " --redis-backoff-min-ms 20 --redis-backoff-max-ms 200";
    for (const std::string& a : args) cmd += " '" + a + "'";
    pid_ = testing::Spawn({"/bin/sh", "-c", cmd + " 2>'" + log_ + "'"}, env);
    ASSERT_GT(pid_, 0);
  }
  void StopAgent() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    EXPECT_EQ(testing::WaitFor(pid_, 20), 0) << ReadFile(log_);
    pid_ = -1;
  }
  bool Logged(const std::string& what, double timeout_s = 20) {
    return WaitUntil([&] { return ReadFile(log_).find(what) != std::string::npos; }, timeout_s);
  }
  std::string Key(const protocol::KeySpec& spec) { return protocol::FormatKey(spec, {kJob, kHost, {}}).value(); }

  testing::TempDir dir_;
  std::string log_ = dir_.path() + "/agent.log";
  pid_t pid_ = -1;
};

// Redis refuses the agent three ways; each is a warning naming the command that failed, logged
// once however often the agent retries (a heartbeat every 200 ms, a read every 250 ms).
TEST_F(AgentLoggingTest, AuthAndPermissionRefusalsAreWarningsNamingTheCommandOnce) {
  testing::RedisServerOptions o;
  o.password = "s3cret";
  o.acl_user = "reader";
  o.acl_password = "readpw";
  o.acl_rules = "~* &* +@read +@connection";  // may read, may not write (HSET, XADD, XGROUP)
  testing::RedisServer redis(o);
  ASSERT_TRUE(redis.Start().ok()) << redis.Log();
  redis::RedisConnection admin(redis.ClientOptions());
  ASSERT_TRUE(admin.Connect().ok());
  // A counter of Redis's INFO (section, the line's name, and the field in it, "" for the line's
  // value): how often the agent has been refused so far; 0 while the line is absent.
  struct Counter {
    const char* section;
    const char* line;
    const char* field;
  };
  auto stat = [&](const Counter& c) { return testing::InfoCounter(admin, c.section, c.line, c.field); };
  struct Case {
    const char* name;
    std::vector<std::string> args;
    std::vector<std::string> env;
    std::vector<std::string> want;  // each once in the log, on a warning line
    Counter retries;                // raised by each retry
  } cases[] = {
      {"wrong password", {}, {"FALCON_AGENT_REDIS_PASSWORD=not-it"}, {"command=AUTH", "WRONGPASS"},
       {"commandstats", "cmdstat_auth", "calls"}},
      {"no password", {}, {}, {"command=PING", "NOAUTH"}, {"stats", "total_connections_received", ""}},
      {"read-only ACL user", {"--redis-user", "reader"}, {"FALCON_AGENT_REDIS_PASSWORD=readpw"},
       {"command=HSET key=falcon:{logjob}:agent:node0 ", "command=XGROUP key=falcon:{logjob}:commands:node0 ", "NOPERM"},
       {"commandstats", "cmdstat_hset", "rejected_calls"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::remove(log_.c_str());
    StartAgent(redis.port(), c.args, c.env);
    for (const std::string& w : c.want) {
      ASSERT_TRUE(Logged(w)) << "want '" << w << "' in\n" << ReadFile(log_);
    }
    // Retried many times more (heartbeats, reads, reconnects): still one warning per refusal.
    const long long before = stat(c.retries);
    ASSERT_GE(before, 0);
    ASSERT_TRUE(WaitUntil([&] { return stat(c.retries) >= before + 10; }, 20)) << c.retries.line;
    const std::string text = ReadFile(log_);
    std::istringstream lines(text);
    std::set<std::string> distinct;  // what follows event=redis_refused: role, command, key, error
    std::size_t refused = 0;
    for (std::string line; std::getline(lines, line);) {
      const std::size_t at = line.find("event=redis_refused");
      if (at == std::string::npos) continue;
      ++refused;
      distinct.insert(line.substr(at));
      EXPECT_NE(line.find(" warning "), std::string::npos) << "a warning, not " << line;
      EXPECT_EQ(line.find("not-it"), std::string::npos) << "the password is never logged";
      EXPECT_EQ(line.find("readpw"), std::string::npos) << "the password is never logged";
    }
    EXPECT_GE(refused, 1u) << text;
    EXPECT_EQ(refused, distinct.size()) << "one warning per distinct refusal, not one per retry:\n" << text;
    if (std::string(c.name) != "read-only ACL user") {
      EXPECT_EQ(text.find("event=redis_up"), std::string::npos) << "a refused connection is not up:\n" << text;
    }
    StopAgent();
  }
}

// A command's id travels into the agent's log (event=command, event=ack, event=command_rejected):
// an id holding a newline and quotes is escaped, and forges no line.
TEST_F(AgentLoggingTest, CommandIdsCannotForgeLogLines) {
  testing::RedisServer redis;
  ASSERT_TRUE(redis.Start().ok()) << redis.Log();
  redis::RedisConnection c(redis.ClientOptions());
  ASSERT_TRUE(c.Connect().ok());
  StartAgent(redis.port(), {}, {});
  const std::string stream = Key(protocol::kCommandsStream);
  ASSERT_TRUE(WaitUntil([&] {  // the agent's consumer group exists: it reads what comes next
    Result<redis::RedisReply> g = c.Command({"XINFO", "GROUPS", stream});
    return g.ok() && !g.value().elements.empty();
  }, 20)) << ReadFile(log_);
  protocol::Command good;
  good.type = "set_mode";
  good.id = "a\"b\nevent=forged kind=\"good";
  good.issued_ns = 1;
  good.mode = "track";
  ASSERT_TRUE(redis::XAdd(c, stream, 0, {{"msg", protocol::ToJson(good).dump()}}).ok());
  // Invalid (no mode), but its id and type are salvaged to reject it: the id is logged too.
  const nlohmann::json bad = {{"v", protocol::kSchemaVersion}, {"type", "set_mode"}, {"id", "c\r\nevent=forged kind=bad"}};
  ASSERT_TRUE(redis::XAdd(c, stream, 0, {{"msg", bad.dump()}}).ok());
  ASSERT_TRUE(WaitUntil([&] { return Count(ReadFile(log_), "event=ack ") >= 2; }, 20)) << ReadFile(log_);
  const std::string text = ReadFile(log_);
  EXPECT_TRUE(ForgedLines(text).empty()) << text;
  EXPECT_NE(text.find("event=command entry="), std::string::npos) << text;
  EXPECT_NE(text.find("id=\"a\\\"b\\nevent=forged kind=\\\"good\""), std::string::npos) << text;
  EXPECT_NE(text.find("event=command_rejected"), std::string::npos) << text;
  EXPECT_NE(text.find("id=\"c\\r\\nevent=forged kind=bad\""), std::string::npos) << text;
}

// The agent reads the broadcast stream beside its own, in its own group, says so in its
// heartbeat, answers a broadcast command with an ack under its host, and acknowledges the entry
// in the broadcast stream (nothing left pending for its group), while its own stream still works.
TEST_F(AgentLoggingTest, ABroadcastCommandIsAnsweredAndAcknowledgedInItsStream) {
  testing::RedisServer redis;
  ASSERT_TRUE(redis.Start().ok()) << redis.Log();
  redis::RedisConnection c(redis.ClientOptions());
  ASSERT_TRUE(c.Connect().ok());
  StartAgent(redis.port(), {}, {});
  const std::string broadcast = Key(protocol::kBroadcastStream);
  const std::string own = Key(protocol::kCommandsStream);
  const std::string group = protocol::CommandGroup(kHost);
  auto groups_made = [&] {  // both groups exist: the agent reads what comes next
    return WaitUntil([&] {
      for (const std::string& stream : {broadcast, own}) {
        Result<redis::RedisReply> g = c.Command({"XINFO", "GROUPS", stream});
        if (!g.ok() || g.value().elements.empty()) return false;
      }
      return true;
    }, 20);
  };
  ASSERT_TRUE(groups_made()) << ReadFile(log_);
  ASSERT_TRUE(WaitUntil([&] {
    Result<std::map<std::string, std::string>> h = redis::HGetAll(c, Key(protocol::kAgentKey));
    return h.ok() && h.value().count("msg") && nlohmann::json::parse(h.value().at("msg")).value("broadcast", false);
  }, 20)) << "the heartbeat says the agent reads the broadcast stream";
  // Round 2: Redis lost both groups (XGROUP DESTROY, as a restart without persistence would):
  // the agent makes them again, without calling it a refusal, and reads on.
  for (const std::string round : {"1", "2"}) {
    SCOPED_TRACE("round " + round);
    if (round == "2") {
      for (const std::string& stream : {broadcast, own}) {
        ASSERT_TRUE(c.Command({"XGROUP", "DESTROY", stream, group}).ok());
      }
      ASSERT_TRUE(Logged("event=command_group_lost")) << ReadFile(log_);
      ASSERT_TRUE(groups_made()) << ReadFile(log_);
    }
    for (const auto& [stream, id] : {std::pair{broadcast, "to-all-" + round}, std::pair{own, "to-me-" + round}}) {
      protocol::Command cmd;
      cmd.type = "set_mode";
      cmd.id = id;
      cmd.issued_ns = 1;
      cmd.mode = "track";
      ASSERT_TRUE(redis::XAdd(c, stream, 0, {{"msg", protocol::ToJson(cmd).dump()}}).ok());
    }
    std::map<std::string, nlohmann::json> acks;  // command id -> ack
    ASSERT_TRUE(WaitUntil([&] {
      Result<std::vector<redis::StreamEntry>> e = redis::XRange(c, Key(protocol::kAcksStream), "-", "+", 0);
      if (!e.ok()) return false;
      for (const redis::StreamEntry& entry : e.value()) {
        for (const auto& [field, value] : entry.fields) {
          if (field != "msg") continue;
          const nlohmann::json a = nlohmann::json::parse(value);
          acks[a.value("command", "")] = a;
        }
      }
      return acks.count("to-all-" + round) && acks.count("to-me-" + round);
    }, 20)) << ReadFile(log_);
    for (const std::string& id : {"to-all-" + round, "to-me-" + round}) {
      EXPECT_EQ(acks[id]["host"], kHost);
      EXPECT_EQ(acks[id]["status"], "rejected") << "no rank to set: " << acks[id].dump();
    }
    EXPECT_TRUE(WaitUntil([&] {  // acknowledged in the stream it came from
      Result<redis::RedisReply> p = c.Command({"XPENDING", broadcast, group});
      return p.ok() && !p.value().elements.empty() && p.value().elements[0].integer == 0;
    }, 20)) << "the broadcast entry is still pending for " << group;
  }
  std::istringstream log(ReadFile(log_));
  for (std::string line; std::getline(log, line);) {
    const bool lost = line.find("NOGROUP") != std::string::npos || line.find("UNBLOCKED") != std::string::npos;
    EXPECT_FALSE(lost && line.find(" warning ") != std::string::npos) << "a lost group is no refusal: " << line;
  }
}

// A config file that sets the password is warned about when group or others may read it; files
// that are not small regular text files are refused with exit 2, at once.
TEST_F(AgentLoggingTest, ConfigFilesHoldingAPasswordOpenToOthersAreWarnedAbout) {
  testing::RedisServer redis({"s3cret", "", ""});
  ASSERT_TRUE(redis.Start().ok()) << redis.Log();
  const std::string conf = dir_.path() + "/agent.conf";
  std::ofstream(conf) << "# test\nredis_password = s3cret\n";
  for (const mode_t mode : {0644, 0640, 0600}) {
    SCOPED_TRACE(mode);
    ASSERT_EQ(::chmod(conf.c_str(), mode), 0);
    std::remove(log_.c_str());
    StartAgent(redis.port(), {"--config", conf}, {});
    ASSERT_TRUE(Logged("event=redis_up role=publisher")) << ReadFile(log_);  // the password worked
    const std::string text = ReadFile(log_);
    EXPECT_EQ(text.find("s3cret"), std::string::npos) << "the password is never logged";
    if (mode == 0600) {
      EXPECT_EQ(text.find("event=config_exposed"), std::string::npos) << text;
    } else {
      EXPECT_NE(text.find("event=config_exposed"), std::string::npos) << text;
      EXPECT_NE(text.find("chmod 600"), std::string::npos) << text;
      EXPECT_NE(text.find(conf), std::string::npos) << text;
    }
    StopAgent();
  }
  const std::string bin = testing::BinDir("daemon") + "/falcon-agent";
  const std::string garbage = dir_.path() + "/garbage.conf";
  std::ofstream(garbage, std::ios::binary) << std::string("\x7f" "ELF\x02\x01\x01\0\0", 9);
  for (const std::string& bad : {std::string("/dev/zero"), dir_.path(), garbage}) {
    const testing::ProcessResult r = testing::Run({bin, "--config", bad, "--print-config"}, {}, 20);
    EXPECT_FALSE(r.timed_out) << bad;
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.err;
    EXPECT_NE(r.err.find(bad), std::string::npos) << "names the file: " << r.err;
  }
}

}  // namespace
}  // namespace falcon
