// RedisWorker. See redis_worker.h for the contract.
#include "daemon/redis/redis_worker.h"

#include <pthread.h>

#include <algorithm>

namespace falcon::redis {

void SetThreadName(const std::string& name) {
  (void)pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());  // cosmetic only
}

RedisWorker::RedisWorker(std::string name, RedisOptions options, StateFn on_state,
                         std::size_t max_queue)
    : name_(std::move(name)),
      max_queue_(max_queue),
      on_state_(std::move(on_state)),
      conn_(std::move(options)) {}

RedisWorker::~RedisWorker() { Stop(); }

void RedisWorker::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (thread_.joinable() || stopping_) return;
  thread_ = std::thread([this] { Run(); });
}

void RedisWorker::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  conn_.Interrupt();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

bool RedisWorker::Submit(Job job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || queue_.size() >= max_queue_) return false;
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
  return true;
}

std::size_t RedisWorker::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

void RedisWorker::EnsureConnected() {
  if (conn_.connected()) return;
  const auto now = std::chrono::steady_clock::now();
  if (up_) {  // it broke during the last job: report, and retry at once
    up_ = false;
    if (on_state_) on_state_(false, Status::Unavailable("redis connection lost"));
    next_attempt_ = now;
    backoff_ = std::chrono::milliseconds(0);
  }
  if (now < next_attempt_) return;
  Status s = conn_.Connect();
  if (s.ok()) {
    up_ = true;
    reported_ = true;
    backoff_ = std::chrono::milliseconds(0);
    if (on_state_) on_state_(true, s);
    return;
  }
  const auto& o = conn_.options();
  backoff_ = std::clamp(backoff_ * 2, std::chrono::milliseconds(o.backoff_min_ms),
                        std::chrono::milliseconds(std::max(o.backoff_min_ms, o.backoff_max_ms)));
  next_attempt_ = now + backoff_;
  if (!reported_ || backoff_.count() == o.backoff_min_ms) {
    reported_ = true;
    if (on_state_) on_state_(false, s);
  }
}

void RedisWorker::Run() {
  SetThreadName(name_);
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) break;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    EnsureConnected();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) break;  // Stop() may have missed a connection made just now
    }
    job(conn_);
    if (up_ && !conn_.connected()) EnsureConnected();  // report the loss promptly
  }
  conn_.Close();
}

}  // namespace falcon::redis
