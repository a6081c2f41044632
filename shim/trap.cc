// Trap: see trap.h.
#include "shim/trap.h"

#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "shim/bench_executor.h"
#include "shim/log.h"
#include "shim/segment.h"
#include "shim/tracer.h"

namespace falcon::shim {
namespace {

template <typename T>
T Load(const T& field, std::memory_order order = std::memory_order_acquire) {
  return std::atomic_ref<T>(const_cast<T&>(field)).load(order);
}
template <typename T>
void Store(T& field, T value, std::memory_order order = std::memory_order_release) {
  std::atomic_ref<T>(field).store(value, order);
}

// A trapped rank polls its control block for tasks and the resume, starting every kPollNs and
// backing off to kMaxPollNs while nothing happens: many paused ranks on few cores must not steal
// the CPU from the benchmarks the others run (up to kMaxPollNs later to notice is nothing next
// to the agent's own command latency).
constexpr long kPollNs = 200 * 1000;
constexpr long kMaxPollNs = 5 * 1000 * 1000;

}  // namespace

void Trap::Attach(FalconControl* control, uint32_t comm_capacity) {
  control_ = control;
  comm_capacity_ = comm_capacity;
  seen_gen_ = Load(control->pause_gen);  // a fresh segment: 0
}

void Trap::Reset() {
  control_ = nullptr;
  phase_.store(kIdle, std::memory_order_relaxed);
  armed_.store(false, std::memory_order_relaxed);
  seen_gen_ = 0;
}

void Trap::Report(FalconPauseState state, uint64_t gen) {
  Store(control_->pause_state, static_cast<uint32_t>(state), std::memory_order_relaxed);
  Store(control_->pause_ack_gen, gen);
}

void Trap::ServiceTick(int64_t real_now_ns) {
  if (control_ == nullptr) return;
  const int phase = phase_.load(std::memory_order_acquire);
  if ((phase == kArmed || phase == kDeferred) && real_now_ns > deadline_real_ns_.load(std::memory_order_relaxed)) {
    // Armed, or deferred to a thread that has not made its next ordered call in time.
    int expected = phase;
    if (phase_.compare_exchange_strong(expected, kIdle, std::memory_order_acq_rel)) {
      armed_.store(false, std::memory_order_relaxed);
      const uint64_t gen = gen_.load(std::memory_order_relaxed);
      Report(kFalconPauseExpired, gen);
      Log(LogLevel::kInfo, "pause %llu expired before its target call", static_cast<unsigned long long>(gen));
    }
    return;
  }
  if (phase != kIdle) return;  // a request arriving while trapped waits for the trap to end
  const uint64_t gen = Load(control_->pause_gen);
  if (gen == seen_gen_) return;
  seen_gen_ = gen;
  const uint32_t count = Load(control_->pause_target_count, std::memory_order_relaxed);
  const int64_t deadline = Load(control_->pause_deadline_real_ns, std::memory_order_relaxed);
  FalconPauseTarget targets[FALCON_PAUSE_MAX_TARGETS];
  const uint32_t n = count == 0 ? 1 : std::min<uint32_t>(count, FALCON_PAUSE_MAX_TARGETS);
  if (count == 0) {
    targets[0] = {Load(control_->pause_comm_slot, std::memory_order_relaxed), 0,
                  Load(control_->pause_comm_seq, std::memory_order_relaxed)};
  } else {
    for (uint32_t i = 0; i < n; ++i) {
      targets[i] = {Load(control_->pause_targets[i].comm_slot, std::memory_order_relaxed), 0,
                    Load(control_->pause_targets[i].seq, std::memory_order_relaxed)};
    }
  }
  // The deadline is the agent's (or anyone's who can write the segment): any int64_t. How far
  // ahead it lies is computed without overflow (INT64_MIN - now is not an int64_t), saturated.
  int64_t ahead = 0;
  if (__builtin_sub_overflow(deadline, real_now_ns, &ahead)) ahead = deadline < 0 ? INT64_MIN : INT64_MAX;
  const char* why = nullptr;
  if (count > FALCON_PAUSE_MAX_TARGETS) {
    why = "too many targets";
  } else if (ahead <= 0) {
    why = "deadline in the past";
  } else if (ahead > FALCON_PAUSE_MAX_NS) {
    why = "deadline more than an hour ahead";
  }
  for (uint32_t i = 0; i < n && why == nullptr; ++i) {
    if (targets[i].comm_slot >= comm_capacity_) why = "unknown communicator slot";
  }
  if (why != nullptr) {
    Report(kFalconPauseRejected, gen);
    Log(LogLevel::kWarn, "rejected pause request %llu: %s (%u targets, deadline %lld ns from now)",
        static_cast<unsigned long long>(gen), why, count, static_cast<long long>(ahead));
    return;
  }
  gen_.store(gen, std::memory_order_relaxed);
  for (uint32_t i = 0; i < n; ++i) {
    target_slot_[i].store(targets[i].comm_slot, std::memory_order_relaxed);
    target_seq_[i].store(targets[i].seq, std::memory_order_relaxed);
  }
  target_count_.store(n, std::memory_order_relaxed);
  deadline_real_ns_.store(deadline, std::memory_order_relaxed);
  Store(control_->trapped_real_ns, int64_t{0}, std::memory_order_relaxed);
  Store(control_->resumed_real_ns, int64_t{0}, std::memory_order_relaxed);
  Report(kFalconPauseArmed, gen);
  phase_.store(kArmed, std::memory_order_release);
  armed_.store(true, std::memory_order_release);
}

bool Trap::OnCall(uint32_t comm_slot, uint64_t comm_seq, Tracer& tracer, ThreadState& ts) {
  if (phase_.load(std::memory_order_acquire) != kArmed) return false;
  const uint64_t gen = gen_.load(std::memory_order_relaxed);
  const uint32_t n = target_count_.load(std::memory_order_relaxed);
  uint32_t i = 0;
  while (i < n && target_slot_[i].load(std::memory_order_relaxed) != comm_slot) ++i;
  if (i == n) return false;
  const uint64_t target = target_seq_[i].load(std::memory_order_relaxed);
  if (comm_seq < target) return false;
  const int next = comm_seq > target ? kIdle : (ts.group_depth > 0 ? kDeferred : kTrapping);
  int expected = kArmed;
  if (!phase_.compare_exchange_strong(expected, next, std::memory_order_acq_rel)) return false;
  if (gen_.load(std::memory_order_relaxed) != gen) {
    // The service thread expired the request we read and armed a new one before our CAS: the
    // fields we compared were stale. Give the new request back untouched.
    phase_.store(kArmed, std::memory_order_release);
    return false;
  }
  armed_.store(false, std::memory_order_relaxed);
  if (next == kIdle) {  // the target call was issued before the request arrived
    Report(kFalconPauseMissed, gen);
    return false;
  }
  if (next == kDeferred) {  // stop after the enclosing group instead (see the file comment)
    ts.trap_deferred = true;
    ts.trap_deferred_gen = gen;
    return false;
  }
  Hold(tracer, ts, comm_slot);
  phase_.store(kIdle, std::memory_order_release);
  return true;
}

void Trap::AfterGroup(Tracer& tracer, ThreadState& ts, uint32_t held_slot) {
  ts.trap_deferred = false;
  int expected = kDeferred;
  if (!phase_.compare_exchange_strong(expected, kTrapping, std::memory_order_acq_rel)) return;
  if (gen_.load(std::memory_order_relaxed) != ts.trap_deferred_gen) {
    // Our deferral expired and another thread deferred a newer request: it is not ours.
    phase_.store(kDeferred, std::memory_order_release);
    return;
  }
  Hold(tracer, ts, held_slot);
  phase_.store(kIdle, std::memory_order_release);
}

void Trap::Hold(Tracer& tracer, ThreadState& ts, uint32_t held_slot) {
  const uint64_t gen = gen_.load(std::memory_order_relaxed);
  const int64_t deadline = deadline_real_ns_.load(std::memory_order_relaxed);
  Store(control_->trapped_real_ns, RealNowNs(), std::memory_order_relaxed);
  Store(control_->trapped_comm_slot, held_slot, std::memory_order_relaxed);  // published by Report
  Report(kFalconPauseTrapped, gen);
  tracer.Annotate(kFalconAnnotatePauseBegin, ts);
  FalconPauseState outcome = kFalconPauseTimedOut;
  long poll_ns = kPollNs;
  for (;;) {
    if (Load(control_->resume_gen) >= gen) {
      outcome = kFalconPauseResumed;
      break;
    }
    if (RealNowNs() > deadline || tracer.stopping()) break;
    const uint64_t task_seq = Load(control_->task_seq);
    if (task_seq != Load(control_->task_ack, std::memory_order_relaxed)) {
      FalconTask task;
      uint8_t blob_in[FALCON_TASK_BLOB_LEN];
      uint8_t blob_out[FALCON_TASK_BLOB_LEN] = {};
      std::memcpy(&task, &control_->task, sizeof(task));  // the agent wrote them before task_seq
      std::memcpy(blob_in, control_->task_blob, sizeof(blob_in));
      // Work may run until the task's deadline, never past the pause's own.
      const int64_t task_deadline =
          task.deadline_real_ns > 0 ? std::min<int64_t>(task.deadline_real_ns, deadline) : deadline;
      const int64_t device_deadline = SystemMonoNs() + std::max<int64_t>(0, task_deadline - RealNowNs());
      const FalconTaskResult result =
          RunBenchmarkTask(task, task_seq, TaskBlobs{blob_in, blob_out}, tracer, ts, device_deadline);
      std::memcpy(control_->task_result_blob, blob_out, sizeof(blob_out));
      std::memcpy(&control_->task_result, &result, sizeof(result));
      Store(control_->task_ack, task_seq);
      poll_ns = kPollNs;  // the next task often follows at once
      continue;
    }
    timespec pause{0, poll_ns};
    nanosleep(&pause, nullptr);
    poll_ns = std::min(poll_ns * 2, kMaxPollNs);
  }
  // The validation communicator lives only as long as the pause (validation_comm.h).
  tracer.validation().Release();
  Store(control_->resumed_real_ns, RealNowNs(), std::memory_order_relaxed);
  tracer.Annotate(kFalconAnnotatePauseEnd, ts);
  Report(outcome, gen);
  if (outcome == kFalconPauseTimedOut) {
    Log(LogLevel::kWarn, "pause %llu reached its deadline without a resume; training goes on",
        static_cast<unsigned long long>(gen));
  }
}

}  // namespace falcon::shim
