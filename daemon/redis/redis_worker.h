// RedisWorker: a named thread that owns one RedisConnection and runs submitted jobs on it, in
// submission order. This is how an event loop talks to Redis without blocking (STYLE rule 9):
// the loop submits a job; the job runs here, may block (up to its call's timeout, or a BLOCK read)
// and hands its result back to the loop itself (typically by posting to the loop's executor).
//
// Reconnection: before each job the worker makes sure the connection is up. After a failed
// attempt it waits backoff_min_ms, doubling up to backoff_max_ms, before the next; in between,
// jobs run against a closed connection and their calls fail fast with Unavailable (the caller
// keeps its data and retries later). A connection that breaks during a job is retried at once.
// on_state(connected, why) reports every transition, on the worker thread.
//
// Thread-safety: Submit(), queued() and Stop() may be called from any thread. Jobs and on_state
// run on the worker thread only; they must not call Stop().
// Invariants:
//  1. Only the worker thread touches conn_ (except conn_.Interrupt() from Stop()).
//  2. queue_, stopping_ are guarded by mu_.
//  3. After Stop() returns no job runs and no callback fires; queued jobs are destroyed unrun.
// Must never: run jobs concurrently or out of order, throw out of a job (a job that throws is
// logged by the caller's design — here it terminates, so jobs must be noexcept in spirit).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "daemon/redis/redis_connection.h"

namespace falcon::redis {

class RedisWorker {
 public:
  using Job = std::function<void(RedisConnection&)>;
  using StateFn = std::function<void(bool connected, const Status& why)>;

  RedisWorker(std::string name, RedisOptions options, StateFn on_state = {},
              std::size_t max_queue = 1024);
  ~RedisWorker();  // Stop()
  RedisWorker(const RedisWorker&) = delete;
  RedisWorker& operator=(const RedisWorker&) = delete;

  void Start();
  // Interrupts a blocked job, drops queued ones, joins. Idempotent.
  void Stop();
  // False when stopped or max_queue jobs are waiting.
  [[nodiscard]] bool Submit(Job job);
  std::size_t queued() const;
  const std::string& name() const { return name_; }

 private:
  void Run();
  void EnsureConnected();

  const std::string name_;
  const std::size_t max_queue_;
  StateFn on_state_;
  RedisConnection conn_;  // worker thread only (invariant 1)
  // Worker thread only:
  bool reported_ = false;
  bool up_ = false;
  std::chrono::milliseconds backoff_{0};
  std::chrono::steady_clock::time_point next_attempt_{};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;  // guarded by mu_
  bool stopping_ = false;  // guarded by mu_
  std::thread thread_;
};

// Sets the calling thread's name (15 characters at most are kept).
void SetThreadName(const std::string& name);

}  // namespace falcon::redis
