// Progress engine: the sweep over a batch of ops, the backoff, the blocking driver and the
// background progress thread; see engine.h for the design and invariants.
// Thread-safety: Batch is single-threaded; the progress thread's job queue is guarded by
// Background::mu. Must never throw out of the progress thread (Step is noexcept by contract;
// the only allocation there, the job list, happens under the queue's lock and is caught).
#include "engine.h"

#include <sched.h>
#include <signal.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "emu_config.h"
#include "job_state.h"

namespace falcon::emu {
namespace {

constexpr int kSpinSweeps = 64;
constexpr int kYieldSweeps = 128;
constexpr int64_t kMaxSleepNs = 200'000;         // while peers are awaited
constexpr int64_t kMaxTimedSleepNs = 10'000'000;  // while only a point in time is awaited

void SleepNs(int64_t ns) {
  if (ns <= 0) return;
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  nanosleep(&ts, nullptr);
}

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  sched_yield();
#endif
}

// Waits a little after a sweep without progress. `wake_ns` is the earliest time-only wake-up
// (INT64_MAX if none); `peers` says whether any op waits for other ranks.
void Backoff(int idle, int64_t now, int64_t wake_ns, bool peers) {
  if (!peers) {
    const int64_t left = wake_ns - now;
    if (left > 60'000) SleepNs(std::min(left - 50'000, kMaxTimedSleepNs));
    else if (left > 0) sched_yield();
    return;
  }
  if (idle < kSpinSweeps) {
    for (int i = 0; i < 16; ++i) CpuRelax();
  } else if (idle < kYieldSweeps) {
    sched_yield();
  } else {
    const int shift = std::min(idle - kYieldSweeps, 8);
    int64_t ns = std::min<int64_t>(int64_t{1000} << shift, kMaxSleepNs);
    if (wake_ns != INT64_MAX) ns = std::min(ns, wake_ns - now);
    if (ns > 0) SleepNs(ns); else sched_yield();
  }
}

// What one sweep over some ops saw.
struct Sweep {
  bool advanced = false;
  bool peers = false;
  int64_t wake = INT64_MAX;
};

// A launched batch of ops driven to completion.
class Batch {
 public:
  explicit Batch(std::vector<std::unique_ptr<Op>> ops)
      : ops_(std::move(ops)), finished_(ops_.size(), false), remaining_(ops_.size()) {}

  void Launch() {
    for (auto& op : ops_) {
      RefreshCommNodes(op->comm(), Refresh::kIfChanged);  // a placement change applies from here on
      op->Launch();
    }
  }

  void StepAll(int64_t now, Sweep* s) {
    for (size_t i = 0; i < ops_.size(); ++i) {
      if (finished_[i]) continue;
      const Progress p = ops_[i]->Poll(now);
      if (p == Progress::kDone || p == Progress::kFailed) {
        finished_[i] = true;
        --remaining_;
        s->advanced = true;
        if (p == Progress::kFailed && first_error_ == ncclSuccess) first_error_ = ops_[i]->result();
      } else if (p == Progress::kAdvanced) {
        s->advanced = true;
      } else if (ops_[i]->wake_at_ns() != 0) {
        s->wake = std::min(s->wake, ops_[i]->wake_at_ns());
      } else {
        s->peers = true;
      }
    }
  }

  [[nodiscard]] bool done() const { return remaining_ == 0; }
  [[nodiscard]] ncclResult_t first_error() const { return first_error_; }
  [[nodiscard]] std::vector<std::unique_ptr<Op>>& ops() { return ops_; }

 private:
  std::vector<std::unique_ptr<Op>> ops_;
  std::vector<bool> finished_;
  size_t remaining_;
  ncclResult_t first_error_ = ncclSuccess;
};

// The communicators a job drives: each op's comm and child, without repeats.
std::vector<ncclComm*> JobComms(const std::vector<std::unique_ptr<Op>>& ops) {
  std::vector<ncclComm*> comms;
  for (const auto& op : ops) {
    for (ncclComm* c : {op->comm(), op->child()}) {
      if (c && std::find(comms.begin(), comms.end(), c) == comms.end()) comms.push_back(c);
    }
  }
  return comms;
}

struct Job {
  std::unique_ptr<Batch> batch;
  std::vector<ncclComm*> comms;  // each holds one reference and one `inflight` count
};

// Records the job's outcome on its communicators and hands them back (engine.h invariant 1).
void Finish(Job& job) {
  for (const auto& op : job.batch->ops()) {
    // A split/shrink failure belongs to the child (a failed all-gather on the parent already
    // marked the parent itself).
    if (op->result() != ncclSuccess) SetAsyncError(op->child() ? op->child() : op->comm(), op->result());
  }
  job.batch.reset();  // ops drop their references here
  for (ncclComm* c : job.comms) {
    c->inflight.fetch_sub(1, std::memory_order_release);
    Release(c);
  }
}

// The process-wide progress thread and its queue (leaked: it may outlive static destruction).
class Background {
 public:
  void Start() {
    std::call_once(started_, [this] { std::thread([this] { Loop(); }).detach(); });
  }

  void Add(Job job) {
    std::lock_guard<std::mutex> lock(mu_);
    incoming_.push_back(std::move(job));
    cv_.notify_one();
  }

 private:
  void Loop() {
    std::vector<Job> active;
    int idle = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (active.empty()) cv_.wait(lock, [this] { return !incoming_.empty(); });
        while (!incoming_.empty()) {
          active.push_back(std::move(incoming_.front()));
          incoming_.pop_front();
          idle = 0;
        }
      }
      const int64_t now = NowNs();
      Sweep s;
      for (Job& job : active) job.batch->StepAll(now, &s);
      for (size_t i = 0; i < active.size();) {
        if (!active[i].batch->done()) {
          ++i;
          continue;
        }
        Finish(active[i]);
        active.erase(active.begin() + static_cast<std::ptrdiff_t>(i));
      }
      if (s.advanced) {
        idle = 0;
      } else if (!active.empty()) {
        Backoff(idle++, now, s.wake, s.peers);
      }
    }
  }

  std::once_flag started_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> incoming_;  // guarded by mu_
};

Background& Bg() {
  static auto* b = new Background;
  return *b;
}

}  // namespace

bool PeerWait::Expired(int64_t now_ns) const {
  const double limit = Config().timeout_s;
  return limit > 0 && static_cast<double>(now_ns - last_progress_ns_) * 1e-9 > limit;
}

bool PeerWait::LivenessDue(int64_t now_ns) {
  if (now_ns < next_liveness_ns_) return false;
  next_liveness_ns_ = now_ns + 100'000'000;
  return true;
}

std::string RankList(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(ranks[i]);
  }
  return s;
}

bool ProcessGone(int pid) { return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH; }

bool PeerGone(const Segment& seg, int r) {
  RankCtl* ctl = seg.rank(r);
  return LoadAcquire(ctl->gone) != 0 || ProcessGone(LoadAcquire(ctl->pid));
}

Progress Op::Poll(int64_t now_ns) {
  if (comm_->aborted.load(std::memory_order_acquire)) {
    result_ = Fail(ncclInternalError, comm_, comm_->label + ": the communicator was aborted (ncclCommAbort)");
    SetAsyncError(comm_, ncclInternalError);
    return Progress::kFailed;
  }
  return Step(now_ns);
}

ncclResult_t RunOps(std::vector<std::unique_ptr<Op>>& ops) {
  Batch batch(std::move(ops));
  batch.Launch();
  int idle = 0;
  while (!batch.done()) {
    const int64_t now = NowNs();
    Sweep s;
    batch.StepAll(now, &s);
    if (s.advanced) {
      idle = 0;
    } else if (!batch.done()) {
      Backoff(idle++, now, s.wake, s.peers);
    }
  }
  ops = std::move(batch.ops());
  return batch.first_error();
}

ncclResult_t RunInBackground(std::vector<std::unique_ptr<Op>> ops) {
  Bg().Start();
  Job job;
  job.batch = std::make_unique<Batch>(std::move(ops));
  job.batch->Launch();
  job.comms = JobComms(job.batch->ops());
  for (ncclComm* c : job.comms) {
    Retain(c);
    c->inflight.fetch_add(1, std::memory_order_relaxed);
  }
  Bg().Add(std::move(job));
  return ncclInProgress;
}

}  // namespace falcon::emu
