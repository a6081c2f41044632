// The Redis client (daemon/redis/) against a real redis-server started per test: streams
// (XADD/XRANGE/XREAD/XREADGROUP/XACK, and an XREAD that drains chosen streams), hashes with TTL,
// pub/sub on its own connection and thread, AUTH with a password and with an ACL user, SELECT,
// per-call timeouts, and recovery when the server is killed and restarted (worker and
// subscriber reconnect with backoff).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/redis/redis_commands.h"
#include "daemon/redis/redis_subscriber.h"
#include "daemon/redis/redis_worker.h"
#include "tests/support/redis_server.h"

namespace falcon::redis {
namespace {

using testing::RedisServer;
using testing::WaitUntil;

// XADDs n entries to `stream`, each with msg = its index.
void FillStream(RedisConnection& c, const std::string& stream, int n) {
  std::vector<std::vector<std::string>> xadds;
  for (int i = 0; i < n; ++i) xadds.push_back(XAddArgs(stream, 0, {{"msg", std::to_string(i)}}));
  ASSERT_TRUE(PipelineInRounds(c, xadds).ok());
}

// Two rare streams and a busy one for the stream-read tests: acks 25 entries, busy 25, alarms 7.
void FillRareAndBusy(RedisConnection& c) {
  FillStream(c, "acks", 25);
  FillStream(c, "busy", 25);
  FillStream(c, "alarms", 7);
}
const std::vector<std::pair<std::string, std::string>> kRareAndBusyFrom0 = {
    {"acks", "0"}, {"busy", "0"}, {"alarms", "0"}};

// stream -> the msg fields of what a read brought, in order.
std::map<std::string, std::vector<std::string>> MsgsByStream(const std::vector<StreamRead>& reads) {
  std::map<std::string, std::vector<std::string>> got;
  for (const StreamRead& r : reads) {
    for (const StreamEntry& e : r.entries) got[r.stream].push_back(*e.Field("msg"));
  }
  return got;
}

class RedisClientTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(server_.Start().ok()) << server_.Log(); }
  RedisServer server_;
};

TEST_F(RedisClientTest, StreamsAppendReadAndConsumerGroups) {
  RedisConnection c(server_.ClientOptions());
  ASSERT_TRUE(c.Connect().ok());
  for (int i = 0; i < 5; ++i) {
    Result<std::string> id = XAdd(c, "s", 3, {{"msg", "m" + std::to_string(i)}, {"n", "x"}});
    ASSERT_TRUE(id.ok()) << id.status().ToString();
  }
  const Result<std::vector<StreamEntry>> all = XRange(c, "s", "-", "+", 0);
  ASSERT_TRUE(all.ok());
  EXPECT_GE(all.value().size(), 3u) << "MAXLEN ~ 3 keeps at least 3";
  EXPECT_EQ(*all.value().back().Field("msg"), "m4");
  EXPECT_EQ(all.value().back().Field("absent"), nullptr);
  EXPECT_EQ(XLen(c, "s").value(), all.value().size());

  const Result<std::vector<StreamRead>> read = XRead(c, {{"s", "0"}}, 2, -1);
  ASSERT_TRUE(read.ok());
  ASSERT_EQ(read.value().size(), 1u);
  EXPECT_EQ(read.value()[0].stream, "s");
  EXPECT_EQ(read.value()[0].entries.size(), 2u);
  // BLOCK that times out: an empty result, not an error.
  const Result<std::vector<StreamRead>> none = XRead(c, {{"s", "$"}}, 0, 50);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_TRUE(none.value().empty());

  ASSERT_TRUE(XGroupCreate(c, "cmds", "g", "$").ok());
  ASSERT_TRUE(XGroupCreate(c, "cmds", "g", "$").ok()) << "an existing group is fine";
  ASSERT_TRUE(XAdd(c, "cmds", 0, {{"msg", "a"}}).ok());
  Result<std::vector<StreamRead>> got = XReadGroup(c, "g", "me", "cmds", ">", 10, 100);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got.value().size(), 1u);
  ASSERT_EQ(got.value()[0].entries.size(), 1u);
  const std::string id = got.value()[0].entries[0].id;
  // Delivered but not acked: still pending for this consumer.
  got = XReadGroup(c, "g", "me", "cmds", "0", 10, -1);
  ASSERT_EQ(got.value()[0].entries.size(), 1u);
  ASSERT_TRUE(XAck(c, "cmds", "g", {id}).ok());
  got = XReadGroup(c, "g", "me", "cmds", "0", 10, -1);
  EXPECT_TRUE(got.value().empty() || got.value()[0].entries.empty());
  // An error reply is a Status, and the connection stays usable.
  EXPECT_FALSE(XReadGroup(c, "nogroup", "me", "cmds", ">", 1, -1).ok());
  EXPECT_TRUE(c.connected());
  EXPECT_TRUE(Ping(c).ok());
}

TEST_F(RedisClientTest, ADrainedReadTakesARareStreamsWholeBurstAndOnlyACountOfTheOthers) {
  RedisConnection c(server_.ClientOptions());
  ASSERT_TRUE(c.Connect().ok());
  FillRareAndBusy(c);
  const std::vector<std::pair<std::string, std::string>>& from0 = kRareAndBusyFrom0;
  // COUNT 4: the drained stream comes whole, in order, the busy one only 4, the short one whole.
  Result<std::vector<StreamRead>> r = XReadDrained(c, from0, {true, false, true}, 4, -1, 100);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::map<std::string, std::vector<std::string>> got = MsgsByStream(r.value());
  ASSERT_EQ(got["acks"].size(), 25u);
  for (int i = 0; i < 25; ++i) EXPECT_EQ(got["acks"][static_cast<std::size_t>(i)], std::to_string(i));
  EXPECT_EQ(got["busy"].size(), 4u);
  EXPECT_EQ(got["alarms"].size(), 7u);
  // The read-ons are bounded: 2 more reads of 4 make 12 of the 25.
  got = MsgsByStream(XReadDrained(c, from0, {true, false, true}, 4, -1, 2).value());
  EXPECT_EQ(got["acks"].size(), 12u);
  // Nothing marked to drain (or a drain list shorter than the streams): a plain XREAD.
  got = MsgsByStream(XReadDrained(c, from0, {}, 4, -1, 100).value());
  EXPECT_EQ(got["acks"].size(), 4u);
  EXPECT_EQ(got["alarms"].size(), 4u);
  // A burst of exactly COUNT asks once more and finds nothing: still exactly what is there.
  FillStream(c, "exact", 4);
  got = MsgsByStream(XReadDrained(c, {{"exact", "0"}}, {true}, 4, -1, 100).value());
  EXPECT_EQ(got["exact"].size(), 4u);
  // A first read Redis refuses is the error; the connection stays usable.
  ASSERT_TRUE(HSet(c, "not-a-stream", {{"a", "1"}}).ok());
  EXPECT_FALSE(XReadDrained(c, {{"not-a-stream", "0"}}, {true}, 4, -1, 100).ok());
  EXPECT_TRUE(Ping(c).ok());
}

// The held controller's read: the marked (rare) streams drained first, blocking for them alone,
// then a short page of the others without blocking.
TEST_F(RedisClientTest, AMarkedFirstReadWaitsForTheMarkedStreamsAndTakesAShortPageOfTheOthers) {
  RedisConnection c(server_.ClientOptions());
  ASSERT_TRUE(c.Connect().ok());
  FillRareAndBusy(c);
  const std::vector<std::pair<std::string, std::string>>& from0 = kRareAndBusyFrom0;
  Result<std::vector<StreamRead>> r = XReadMarkedFirst(c, from0, {true, false, true}, 4, -1, 100, 2);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::map<std::string, std::vector<std::string>> got = MsgsByStream(r.value());
  ASSERT_EQ(got["acks"].size(), 25u);
  for (int i = 0; i < 25; ++i) EXPECT_EQ(got["acks"][static_cast<std::size_t>(i)], std::to_string(i));
  EXPECT_EQ(got["alarms"].size(), 7u);
  EXPECT_EQ(got["busy"], (std::vector<std::string>{"0", "1"})) << "the others' page is other_count, from the start";

  // The marked streams read to their end: the read blocks for them alone, though the busy
  // stream has 23 more entries, then brings the busy stream's page.
  std::string acks_end, alarms_end;
  for (const StreamRead& s : r.value()) {
    if (s.stream == "acks") acks_end = s.entries.back().id;
    if (s.stream == "alarms") alarms_end = s.entries.back().id;
  }
  const auto t0 = std::chrono::steady_clock::now();
  r = XReadMarkedFirst(c, {{"acks", acks_end}, {"busy", "0"}, {"alarms", alarms_end}}, {true, false, true}, 4, 300,
                       100, 2);
  const auto waited = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  got = MsgsByStream(r.value());
  EXPECT_GE(waited, std::chrono::milliseconds(250)) << "a busy stream's entries must not end the wait";
  EXPECT_TRUE(got["acks"].empty());
  EXPECT_EQ(got["busy"].size(), 2u);

  // Nothing marked: the others are the blocking read, at other_count.
  got = MsgsByStream(XReadMarkedFirst(c, from0, {}, 4, -1, 100, 3).value());
  EXPECT_EQ(got["acks"].size(), 3u);
  EXPECT_EQ(got["busy"].size(), 3u);
  // Either read Redis refuses is the error, the other's entries dropped; the connection stays usable.
  ASSERT_TRUE(HSet(c, "not-a-stream", {{"a", "1"}}).ok());
  EXPECT_FALSE(XReadMarkedFirst(c, {{"acks", "0"}, {"not-a-stream", "0"}}, {true, false}, 4, -1, 100, 2).ok());
  EXPECT_FALSE(XReadMarkedFirst(c, {{"not-a-stream", "0"}, {"busy", "0"}}, {true, false}, 4, -1, 100, 2).ok());
  EXPECT_TRUE(Ping(c).ok());
}

TEST_F(RedisClientTest, HashesExpiryAndSelect) {
  RedisOptions o = server_.ClientOptions();
  o.db = 3;
  RedisConnection c(o);
  ASSERT_TRUE(c.Connect().ok());
  ASSERT_TRUE(HSet(c, "h", {{"a", "1"}, {"b", "two"}}).ok());
  ASSERT_TRUE(Expire(c, "h", 30).ok());
  const auto h = HGetAll(c, "h");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h.value().at("b"), "two");
  const Result<std::int64_t> ttl = Ttl(c, "h");
  EXPECT_GT(ttl.value(), 0);
  EXPECT_LE(ttl.value(), 30);
  RedisConnection db0(server_.ClientOptions());
  ASSERT_TRUE(db0.Connect().ok());
  EXPECT_TRUE(HGetAll(db0, "h").value().empty()) << "SELECT 3 kept it out of db 0";
  ASSERT_TRUE(Del(c, "h").ok());
  EXPECT_EQ(Ttl(c, "h").value(), -2);
}

TEST_F(RedisClientTest, ManyHashesComeBackInOrderAcrossPipelineChunks) {
  RedisConnection c(server_.ClientOptions());
  ASSERT_TRUE(c.Connect().ok());
  // More keys than one round trip takes, a key that is no hash and a key that is gone.
  const std::size_t n = kPipelineKeys * 2 + 7;
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < n; ++i) {
    keys.push_back("h" + std::to_string(i));
    ASSERT_TRUE(HSet(c, keys.back(), {{"msg", "m" + std::to_string(i)}}).ok());
  }
  ASSERT_TRUE(Del(c, keys[kPipelineKeys]).ok());
  ASSERT_TRUE(XAdd(c, keys[kPipelineKeys], 0, {{"msg", "a stream"}}).ok());
  ASSERT_TRUE(Del(c, keys[3]).ok());
  const auto many = HGetAllMany(c, keys);
  ASSERT_TRUE(many.ok()) << many.status().ToString();
  ASSERT_EQ(many.value().size(), n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto& h = many.value()[i];
    if (i == kPipelineKeys) {
      ASSERT_FALSE(h.ok());
      EXPECT_EQ(h.status().code(), Status::Code::kInvalidArgument) << h.status().ToString();
    } else if (i == 3) {
      ASSERT_TRUE(h.ok());
      EXPECT_TRUE(h.value().empty());
    } else {
      ASSERT_TRUE(h.ok()) << i;
      EXPECT_EQ(h.value().at("msg"), "m" + std::to_string(i));
    }
  }
  EXPECT_TRUE(HGetAllMany(c, {}).value().empty());
  EXPECT_TRUE(c.connected());
}

TEST_F(RedisClientTest, PerCallTimeoutClosesTheConnection) {
  RedisConnection c(server_.ClientOptions());
  ASSERT_TRUE(c.Connect().ok());
  const auto t0 = std::chrono::steady_clock::now();
  const Result<RedisReply> r = c.Command({"BLPOP", "never", "0"}, 150);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.status().code(), Status::Code::kUnavailable) << r.status().ToString();
  EXPECT_LT(took, 1.5);
  EXPECT_FALSE(c.connected());
  EXPECT_FALSE(Ping(c).ok()) << "no silent use of a closed connection";
  ASSERT_TRUE(c.Connect().ok());
  EXPECT_TRUE(Ping(c).ok());
}

TEST_F(RedisClientTest, PubSubDeliversOnItsOwnThread) {
  std::mutex mu;
  std::vector<std::string> got;
  std::atomic<bool> up{false};
  RedisSubscriber sub(
      "test-sub", server_.ClientOptions(), {"falcon:j:alerts", "other"},
      [&](const std::string& ch, const std::string& payload) {
        std::lock_guard<std::mutex> lock(mu);
        got.push_back(ch + "=" + payload);
      },
      [&](bool connected, const Status&) { up = connected; });
  sub.Start();
  ASSERT_TRUE(WaitUntil([&] { return up.load(); }, 10));
  RedisConnection c(server_.ClientOptions());
  ASSERT_TRUE(c.Connect().ok());
  EXPECT_EQ(Publish(c, "falcon:j:alerts", "hello").value(), 1);
  EXPECT_EQ(Publish(c, "other", "x").value(), 1);
  EXPECT_EQ(Publish(c, "unsubscribed", "y").value(), 0);
  ASSERT_TRUE(WaitUntil([&] {
    std::lock_guard<std::mutex> lock(mu);
    return got.size() == 2;
  }, 10));
  EXPECT_EQ(got[0], "falcon:j:alerts=hello");
  EXPECT_EQ(got[1], "other=x");
  const auto t0 = std::chrono::steady_clock::now();
  sub.Stop();  // interrupts the blocked read
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
}

TEST(RedisAuthTest, PasswordAndAclUser) {
  RedisServer server({"s3cret", "falcon", "agentpw"});
  ASSERT_TRUE(server.Start().ok()) << server.Log();
  RedisOptions o = server.ClientOptions();
  {
    RedisConnection c(o);
    ASSERT_TRUE(c.Connect().ok());
    EXPECT_TRUE(Ping(c).ok());
  }
  {
    o.password = "wrong";
    RedisConnection c(o);
    const Status s = c.Connect();
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
    EXPECT_EQ(s.message().find("wrong"), std::string::npos) << "never echo the password";
    EXPECT_EQ(RefusedCommand(s), "AUTH");
    EXPECT_FALSE(c.connected());
  }
  {
    o.password.clear();
    RedisConnection c(o);
    const Status s = c.Connect();
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << "no AUTH: refused at connect, not command by command";
    EXPECT_NE(s.message().find("NOAUTH"), std::string::npos) << s.ToString();
    EXPECT_EQ(RefusedCommand(s), "PING");
    EXPECT_FALSE(c.connected());
    EXPECT_EQ(RefusedCommand(Status::Unavailable("redis AUTH refused")), "") << "only refusals name a command";
  }
  {
    o.user = "falcon";
    o.password = "agentpw";
    RedisConnection c(o);
    ASSERT_TRUE(c.Connect().ok());
    EXPECT_TRUE(XAdd(c, "s", 0, {{"msg", "x"}}).ok());
    o.password = "s3cret";  // the default user's password is not this user's
    RedisConnection wrong(o);
    EXPECT_FALSE(wrong.Connect().ok());
  }
}

TEST(RedisReconnectTest, WorkerAndSubscriberRecoverAfterTheServerRestarts) {
  RedisServer server;
  ASSERT_TRUE(server.Start().ok()) << server.Log();
  std::atomic<int> ups{0}, downs{0};
  RedisWorker worker("test-worker", server.ClientOptions(), [&](bool up, const Status&) {
    (up ? ups : downs)++;
  });
  worker.Start();
  std::atomic<int> jobs_ok{0}, jobs_failed{0};
  auto ping = [&] {
    return worker.Submit([&](RedisConnection& c) { (Ping(c).ok() ? jobs_ok : jobs_failed)++; });
  };
  std::atomic<bool> sub_up{false};
  std::atomic<int> messages{0};
  RedisSubscriber sub("test-sub", server.ClientOptions(), {"ch"},
                      [&](const std::string&, const std::string&) { messages++; },
                      [&](bool up, const Status&) { sub_up = up; });
  sub.Start();
  ASSERT_TRUE(ping());
  ASSERT_TRUE(WaitUntil([&] { return jobs_ok.load() == 1 && sub_up.load(); }, 10));
  EXPECT_EQ(ups.load(), 1);

  server.Kill();
  ASSERT_TRUE(ping());
  // The worker reports the lost connection after the failed job returns: wait for both.
  ASSERT_TRUE(WaitUntil([&] { return jobs_failed.load() >= 1 && !sub_up.load() && downs.load() >= 1; }, 10))
      << "jobs failed " << jobs_failed.load() << ", downs " << downs.load();

  ASSERT_TRUE(server.Start().ok()) << server.Log();
  // The worker retries on its own backoff schedule; keep giving it work until a PING succeeds.
  ASSERT_TRUE(WaitUntil([&] {
    if (worker.queued() == 0) (void)ping();  // best effort: only keeps the worker busy
    return jobs_ok.load() >= 2;
  }, 15));
  EXPECT_EQ(ups.load(), 2);
  ASSERT_TRUE(WaitUntil([&] { return sub_up.load(); }, 15)) << "subscriber re-subscribed";
  RedisConnection c(server.ClientOptions());
  ASSERT_TRUE(c.Connect().ok());
  ASSERT_TRUE(WaitUntil([&] { return Publish(c, "ch", "after-restart").value() == 1; }, 10));
  ASSERT_TRUE(WaitUntil([&] { return messages.load() >= 1; }, 10));
  sub.Stop();
  worker.Stop();
}

TEST(RedisWorkerTest, StopInterruptsABlockedJob) {
  RedisServer server;
  ASSERT_TRUE(server.Start().ok()) << server.Log();
  RedisWorker worker("test-block", server.ClientOptions());
  worker.Start();
  std::atomic<bool> started{false};
  ASSERT_TRUE(worker.Submit([&](RedisConnection& c) {
    started = true;
    (void)XRead(c, {{"nothing", "$"}}, 1, 20000);  // interrupted by Stop: the error is expected
  }));
  ASSERT_TRUE(WaitUntil([&] { return started.load(); }, 10));
  const auto t0 = std::chrono::steady_clock::now();
  worker.Stop();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 3.0);
  EXPECT_FALSE(worker.Submit([](RedisConnection&) {})) << "no jobs after Stop";
}

}  // namespace
}  // namespace falcon::redis
