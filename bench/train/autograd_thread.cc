// AutogradThread: see autograd_thread.h.
#include "autograd_thread.h"

namespace falcon::train {

AutogradThread::AutogradThread() : thread_([this] { Loop(); }) {}

AutogradThread::~AutogradThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Status AutogradThread::Run(const std::function<Status()>& task) {
  std::unique_lock<std::mutex> lock(mu_);
  task_ = &task;
  done_ = false;
  cv_.notify_all();
  cv_.wait(lock, [this] { return done_; });
  task_ = nullptr;
  return result_;
}

void AutogradThread::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || (task_ != nullptr && !done_); });
    if (stop_) return;
    const std::function<Status()>* task = task_;
    lock.unlock();
    Status s = (*task)();
    lock.lock();
    result_ = std::move(s);
    done_ = true;
    cv_.notify_all();
  }
}

}  // namespace falcon::train
