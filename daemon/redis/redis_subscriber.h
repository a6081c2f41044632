// RedisSubscriber: SUBSCRIBE on a connection and thread of its own (a subscribed connection can
// run no other command). Messages and state changes are delivered to callbacks on that thread;
// a lost connection is re-established with backoff and the channels subscribed again (messages
// published while it was down are lost: that is pub/sub — durable data goes to streams).
// Thread-safety: Start()/Stop() from one owning thread; callbacks run on the subscriber thread
// and must not call Stop(). Invariant: after Stop() returns no callback fires.
// Must never: throw, or block Stop() for longer than it takes to shut a socket down and join.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "daemon/redis/redis_connection.h"

namespace falcon::redis {

class RedisSubscriber {
 public:
  using MessageFn = std::function<void(const std::string& channel, const std::string& payload)>;
  // connected = true once every channel's subscription is confirmed.
  using StateFn = std::function<void(bool connected, const Status& why)>;

  RedisSubscriber(std::string name, RedisOptions options, std::vector<std::string> channels,
                  MessageFn on_message, StateFn on_state = {});
  ~RedisSubscriber();  // Stop()
  RedisSubscriber(const RedisSubscriber&) = delete;
  RedisSubscriber& operator=(const RedisSubscriber&) = delete;

  void Start();
  void Stop();

 private:
  void Run();
  Status SubscribeAll();
  bool WaitBackoff(int ms);  // false when stopping

  const std::string name_;
  const std::vector<std::string> channels_;
  MessageFn on_message_;
  StateFn on_state_;
  RedisConnection conn_;  // subscriber thread only (Interrupt() from Stop())
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace falcon::redis
