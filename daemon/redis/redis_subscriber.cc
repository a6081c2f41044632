// RedisSubscriber. See redis_subscriber.h for the contract.
#include "daemon/redis/redis_subscriber.h"

#include <algorithm>
#include <chrono>

#include "daemon/redis/redis_worker.h"

namespace falcon::redis {

RedisSubscriber::RedisSubscriber(std::string name, RedisOptions options,
                                 std::vector<std::string> channels, MessageFn on_message,
                                 StateFn on_state)
    : name_(std::move(name)),
      channels_(std::move(channels)),
      on_message_(std::move(on_message)),
      on_state_(std::move(on_state)),
      conn_(std::move(options)) {}

RedisSubscriber::~RedisSubscriber() { Stop(); }

void RedisSubscriber::Start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { Run(); });
}

void RedisSubscriber::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  conn_.Interrupt();
  if (thread_.joinable()) thread_.join();
}

bool RedisSubscriber::WaitBackoff(int ms) {
  std::unique_lock<std::mutex> lock(mu_);
  return !cv_.wait_for(lock, std::chrono::milliseconds(ms), [this] { return stopping_; });
}

Status RedisSubscriber::SubscribeAll() {
  std::vector<std::string> argv{"SUBSCRIBE"};
  argv.insert(argv.end(), channels_.begin(), channels_.end());
  Result<std::vector<RedisReply>> first = conn_.Pipeline({argv});
  if (!first.ok()) return first.status();
  // One confirmation per channel; the pipeline read the first.
  for (size_t i = 1; i < channels_.size(); ++i) {
    Result<RedisReply> r = conn_.ReadReply(0);
    if (!r.ok()) return r.status();
  }
  return Status::Ok();
}

void RedisSubscriber::Run() {
  SetThreadName(name_);
  int backoff = 0;
  const RedisOptions& o = conn_.options();
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) break;
    }
    Status s = conn_.Connect();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) break;  // Stop() may have run between Connect and here
    }
    if (s.ok()) s = SubscribeAll();
    if (!s.ok()) {
      if (on_state_) on_state_(false, s);
      backoff = std::clamp(backoff * 2, o.backoff_min_ms, std::max(o.backoff_min_ms, o.backoff_max_ms));
      if (!WaitBackoff(backoff)) break;
      continue;
    }
    backoff = 0;
    if (on_state_) on_state_(true, Status::Ok());
    for (;;) {
      Result<RedisReply> r = conn_.ReadReply(-1);
      if (!r.ok()) {
        if (on_state_) on_state_(false, r.status());
        break;
      }
      const RedisReply& m = r.value();
      if (m.type == RedisReply::Type::kArray && m.elements.size() == 3 &&
          m.elements[0].str == "message" && on_message_) {
        on_message_(m.elements[1].str, m.elements[2].str);
      }
    }
  }
  conn_.Close();
}

}  // namespace falcon::redis
