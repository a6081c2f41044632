// Communicator watchdog thread; see watchdog.h.
#include "watchdog.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>

namespace falcon::train {

Watchdog::Watchdog(int rank, double period_s) : rank_(rank), period_s_(period_s), thread_([this] { Loop(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Watchdog::Watch(ncclComm_t comm, std::string name) {
  std::lock_guard<std::mutex> lock(mu_);
  comms_.emplace_back(comm, std::move(name));
}

void Watchdog::Loop() {
  const auto period = std::chrono::duration<double>(period_s_);
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, period, [this] { return stop_; })) {
    // Polled under mu_: Watch only appends, and the owner destroys the Watchdog (this thread
    // joined) before any watched communicator (invariant 1).
    for (const auto& [comm, name] : comms_) {
      ncclResult_t async = ncclSuccess;
      const ncclResult_t rc = ncclCommGetAsyncError(comm, &async);
      if (rc == ncclSuccess && (async == ncclSuccess || async == ncclInProgress)) continue;
      const ncclResult_t bad = rc != ncclSuccess ? rc : async;
      std::fprintf(stderr,
                   "falcon-train-emu: rank %d: watchdog: communicator %s reports an asynchronous error: %s; "
                   "exiting\n",
                   rank_, name.c_str(), ncclGetErrorString(bad));
      std::fflush(stderr);
      _exit(2);  // as PyTorch's watchdog tears the process down: the job cannot go on
    }
    polls_.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace falcon::train
