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

#include "device.h"
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

// Drives a launched batch to completion in the calling thread (after its launch).
void Drive(Batch& batch) {
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
}

// Makes every op's first-use connection (Op::Connect), polling them all together so ranks of one
// thread connect to each other; fails on an abort or a peer that is gone.
ncclResult_t ConnectAll(std::vector<std::unique_ptr<Op>>& ops) {
  std::vector<bool> connected(ops.size(), false);
  size_t left = ops.size();
  int idle = 0;
  while (left > 0) {
    const int64_t now = NowNs();
    bool advanced = false;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (connected[i]) continue;
      ncclComm* c = ops[i]->comm();
      if (c->aborted.load(std::memory_order_acquire)) {
        SetAsyncError(c, ncclInternalError);
        return Fail(ncclInternalError, c, c->label + ": the communicator was aborted (ncclCommAbort)");
      }
      const Progress p = ops[i]->Connect(now);
      if (p == Progress::kFailed) return ops[i]->result();
      if (p == Progress::kDone) {
        connected[i] = true;
        --left;
        advanced = true;
      }
    }
    if (advanced) idle = 0;
    else if (left > 0) Backoff(idle++, now, INT64_MAX, true);
  }
  return ncclSuccess;
}

// A batch queued on the device: run by its stream's worker (DeviceJob::Run), then freed there.
struct DeviceJob {
  std::unique_ptr<Batch> batch;
  std::vector<ncclComm*> comms;  // each counted in its device_launched; the ops hold references

  static void Run(void* p) {
    std::unique_ptr<DeviceJob> job(static_cast<DeviceJob*>(p));
    Drive(*job->batch);
    for (const auto& op : job->batch->ops()) {
      if (op->result() != ncclSuccess) SetAsyncError(op->comm(), op->result());
    }
    for (ncclComm* c : job->comms) {  // SyncCommDevice waits for this
      c->device_done.fetch_add(1, std::memory_order_release);
      c->device_done.notify_all();
    }
  }
};

// The distinct streams of `ops`, the first op's first.
std::vector<void*> StreamsOf(const std::vector<std::unique_ptr<Op>>& ops) {
  std::vector<void*> streams;
  for (const auto& op : ops) {
    if (std::find(streams.begin(), streams.end(), op->stream()) == streams.end()) streams.push_back(op->stream());
  }
  return streams;
}

// Queues `job` on the first stream, ordered after the other streams' earlier work and the
// communicators' earlier device work, and orders the other streams' later work after it (as
// NCCL joins the streams of a group and serialises a communicator's kernels). False if the
// driver refused before the job was queued (the caller then still owns it).
bool QueueJob(const CudaEmuApi& cu, std::unique_ptr<DeviceJob>& job, const std::vector<ncclComm*>& comms) {
  const std::vector<void*> streams = StreamsOf(job->batch->ops());
  void* main = streams.front();
  void* joined = nullptr;
  bool ok = cu.event_create(&joined, 0) == 0;
  for (size_t i = 1; ok && i < streams.size(); ++i) {
    ok = cu.event_record(joined, streams[i]) == 0 && cu.stream_wait_event(main, joined, 0) == 0;
  }
  for (ncclComm* c : comms) {
    if (ok && c->device_event != nullptr) ok = cu.stream_wait_event(main, c->device_event, 0) == 0;
    if (ok && c->device_event == nullptr) ok = cu.event_create(&c->device_event, 0) == 0;
  }
  if (ok) {
    job->comms = comms;
    for (ncclComm* c : comms) ++c->device_launched;  // before the worker can finish it
  }
  ok = ok && cu.launch_host_func(main, DeviceJob::Run, job.get()) == 0;
  if (!ok) {
    for (ncclComm* c : job->comms) --c->device_launched;
    job->comms.clear();
  }
  if (ok) {
    job.release();  // DeviceJob::Run frees it
    // Cannot fail for handles that just worked; a failure would only lose ordering, not data.
    (void)cu.event_record(joined, main);
    for (size_t i = 1; i < streams.size(); ++i) (void)cu.stream_wait_event(streams[i], joined, 0);
    for (ncclComm* c : comms) (void)cu.event_record(c->device_event, main);
  }
  if (joined != nullptr) (void)cu.event_destroy(joined);  // the waits already hold what they need
  return ok;
}
// A group captured into a CUDA graph: prototypes of its ops, cloned, launched (sequence numbers,
// connections) in the thread that calls cuGraphLaunch, and driven on the device at the replay,
// in launch order. Lives for the process (a graph's lifetime is not known here).
struct CapturedGroup {
  std::vector<std::unique_ptr<Op>> protos;
  std::mutex mu;
  std::deque<std::unique_ptr<Batch>> launched;  // guarded by mu: launched, not yet run

  static void OnLaunch(void* p) {
    auto* g = static_cast<CapturedGroup*>(p);
    std::vector<std::unique_ptr<Op>> ops;
    for (const auto& proto : g->protos) ops.push_back(proto->Clone());
    auto batch = std::make_unique<Batch>(std::move(ops));
    batch->Launch();
    // A failed connection marks its op's communicator failed; the replay then fails at once.
    (void)ConnectAll(batch->ops());
    for (ncclComm* c : JobComms(batch->ops())) ++c->device_launched;  // SyncCommDevice waits for the replay
    std::lock_guard<std::mutex> lock(g->mu);
    g->launched.push_back(std::move(batch));
  }

  static void Run(void* p) {
    auto* g = static_cast<CapturedGroup*>(p);
    std::unique_ptr<Batch> batch;
    {
      std::lock_guard<std::mutex> lock(g->mu);
      if (g->launched.empty()) return;
      batch = std::move(g->launched.front());
      g->launched.pop_front();
    }
    Drive(*batch);
    for (const auto& op : batch->ops()) {
      if (op->result() != ncclSuccess) SetAsyncError(op->comm(), op->result());
    }
    for (ncclComm* c : JobComms(batch->ops())) {
      c->device_done.fetch_add(1, std::memory_order_release);
      c->device_done.notify_all();
    }
  }
};

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

Op::~Op() {
  DropMark(gate_);
  Release(comm_);
}

Progress Op::Poll(int64_t now_ns) {
  if (comm_->aborted.load(std::memory_order_acquire)) {
    result_ = Fail(ncclInternalError, comm_, comm_->label + ": the communicator was aborted (ncclCommAbort)");
    SetAsyncError(comm_, ncclInternalError);
    return Progress::kFailed;
  }
  if (gate_ != nullptr) {
    if (!MarkReached(gate_)) return Progress::kPending;
    DropMark(gate_);
    gate_ = nullptr;
  }
  return Step(now_ns);
}

ncclResult_t RunOps(std::vector<std::unique_ptr<Op>>& ops) {
  Batch batch(std::move(ops));
  batch.Launch();
  // The same first-use handshake as on the device, so a peer on either path finds its flag.
  ncclResult_t rc = ConnectAll(batch.ops());
  if (rc == ncclSuccess) {
    Drive(batch);
    rc = batch.first_error();
  }
  ops = std::move(batch.ops());
  return rc;
}

ncclResult_t RunOnDevice(std::vector<std::unique_ptr<Op>> ops) {
  auto job = std::make_unique<DeviceJob>();
  job->batch = std::make_unique<Batch>(std::move(ops));
  job->batch->Launch();
  if (const ncclResult_t rc = ConnectAll(job->batch->ops()); rc != ncclSuccess) return rc;
  const std::vector<ncclComm*> comms = JobComms(job->batch->ops());
  const CudaEmuApi* cu = CudaEmu();
  if (cu != nullptr && QueueJob(*cu, job, comms)) return ncclSuccess;
  Drive(*job->batch);  // the driver refused the work: run it here (host time == device time)
  return job->batch->first_error();
}

bool CaptureOnDevice(std::vector<std::unique_ptr<Op>>& ops) {
  const CudaEmuApi* cu = CudaEmu();
  if (cu == nullptr) return false;
  for (const auto& op : ops) {
    if (op->Clone() == nullptr) return false;
  }
  auto* g = new CapturedGroup;
  void* stream = ops.front()->stream();
  g->protos = std::move(ops);
  if (cu->capture_host_func(stream, CapturedGroup::OnLaunch, CapturedGroup::Run, g) != 0) {
    ops = std::move(g->protos);
    delete g;
    return false;
  }
  return true;  // `g` is the graph's from now on
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
