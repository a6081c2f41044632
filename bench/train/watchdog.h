// The trainer's communicator watchdog, as PyTorch's ProcessGroupNCCL runs one per process: a
// thread that polls ncclCommGetAsyncError on every communicator of the job every 100 ms and, on
// an asynchronous error (a failed or aborted communicator), prints which communicator failed
// and ends the process (exit status 2), so a broken job fails fast instead of hanging in its
// next collective.
//
// Thread-safety: Watch and the destructor from the owning thread; the polling thread reads the
// list under mu_. Invariants:
//  1. A communicator is polled only between Watch() and the Watchdog's destruction, and the
//     owner destroys communicators only after destroying the Watchdog that watches them.
//  2. The polling thread never calls anything but ncclCommGetAsyncError (safe from any thread,
//     NCCL's contract) and, once, the exit path.
// Must never: block the training thread (Watch takes mu_ for a push only).
#ifndef FALCON_BENCH_TRAIN_WATCHDOG_H_
#define FALCON_BENCH_TRAIN_WATCHDOG_H_

#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace falcon::train {

class Watchdog {
 public:
  // Starts the polling thread. `rank` names the process in the message.
  Watchdog(int rank, double period_s = 0.1);
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  // Stops and joins the thread (at most one period).
  ~Watchdog();

  // Adds a ready communicator (its init completed) under `name`.
  void Watch(ncclComm_t comm, std::string name);

  // Polling rounds done so far.
  [[nodiscard]] std::uint64_t polls() const { return polls_.load(std::memory_order_relaxed); }

 private:
  void Loop();

  // Fixed after construction.
  const int rank_;
  const double period_s_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;                                      // guarded by mu_
  std::vector<std::pair<ncclComm_t, std::string>> comms_;  // guarded by mu_
  std::atomic<std::uint64_t> polls_{0};
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace falcon::train

#endif  // FALCON_BENCH_TRAIN_WATCHDOG_H_
