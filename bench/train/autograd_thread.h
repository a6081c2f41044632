// The autograd engine's device thread of a PyTorch process, as the trainer models it: PyTorch
// runs a CUDA backward pass on a thread of its own (one per device, torch/csrc/autograd/
// engine.cpp), while the training thread blocks in loss.backward() until it is done. So the
// collectives a backward issues (Megatron's tensor-parallel all-reduces of input gradients, the
// data-parallel gradient buckets started by gradient hooks) come from that thread, and the
// forward's and the pipeline's from the training thread: a rank's ordered NCCL calls come from
// two threads that take turns. (Seen on a real GPU: an agent that followed one thread's calls
// only could not plan a cut.)
//
// Thread-safety: Run is called by one thread (the training thread) at a time; the task runs on
// the autograd thread while the caller waits, so the task may use everything the caller may
// (the hand-over is a mutex: what the caller wrote before Run is seen by the task, and what the
// task wrote is seen by the caller after Run returns). Must never: run two tasks at once.
#ifndef FALCON_BENCH_TRAIN_AUTOGRAD_THREAD_H_
#define FALCON_BENCH_TRAIN_AUTOGRAD_THREAD_H_

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "falcon/status.h"

namespace falcon::train {

class AutogradThread {
 public:
  AutogradThread();
  ~AutogradThread();  // joins the thread
  AutogradThread(const AutogradThread&) = delete;
  AutogradThread& operator=(const AutogradThread&) = delete;

  // Runs `task` on the autograd thread and returns its status once it has finished.
  [[nodiscard]] Status Run(const std::function<Status()>& task);

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<Status()>* task_ = nullptr;  // guarded by mu_: the task to run, or null
  Status result_ = Status::Ok();                    // guarded by mu_
  bool done_ = false;                               // guarded by mu_: the task has finished
  bool stop_ = false;                               // guarded by mu_
  std::thread thread_;                              // last: starts after the fields above exist
};

}  // namespace falcon::train

#endif  // FALCON_BENCH_TRAIN_AUTOGRAD_THREAD_H_
