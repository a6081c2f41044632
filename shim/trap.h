// Trap: pausing the training thread at a consistent cut, with a deadline, and running
// benchmark tasks while paused. The protocol is FalconControl's (shm_abi.h).
//
// The agent asks for a pause before given calls: per communicator slot, a target comm_seq (up
// to FALCON_PAUSE_MAX_TARGETS of them, shm_abi.h; a consistent cut without any collective that
// spans the job names every communicator of the rank, analyzer/cut_plan.h). The service thread
// validates the request and arms the trap; the hot path then checks one relaxed flag per call.
// The thread that is about to issue a call whose comm_seq equals its communicator's target
// stops there (before the call), reports Trapped, runs the tasks the agent posts, and goes on
// when resumed or when the deadline passes — whichever comes first. A thread never stops inside
// an NCCL group (its calls would complete only at the group's end, and tasks would nest in it):
// if the target call is inside a group, the thread stops right after the outermost
// ncclGroupEnd instead — every rank's group holds the same calls, so the cut stays consistent.
// A group end that returns ncclInProgress (nonblocking communicators, still launching) moves
// that stop to just before the thread's next ordered call or ncclGroupStart: the same cut, on
// communicators that are ready again (NCCL requires polling them ready before the next call).
// Only ordered calls (shm_abi.h, FalconOpIsOrdered) are targets, so a thread that only polls
// errors or asks queries (PyTorch's watchdog) is never stopped. A request whose target call
// has already been issued is reported Missed, one whose deadline passes first (armed, or
// deferred to a thread that made no further call) Expired, one with a deadline more than
// FALCON_PAUSE_MAX_NS ahead or an unknown slot Rejected.
//
// Invariants:
//  1. phase_ moves Idle → Armed only on the service thread, Armed → Trapping/Deferred/Idle by a
//     CAS (the caller that hits the target, a caller that is past it, or the service thread at
//     the deadline): exactly one of them wins. Deferred → Trapping only by the deferring thread
//     of the same generation; Deferred → Idle by the service thread at the deadline.
//  2. The target fields (targets, deadline_, gen_) are written before phase_ becomes Armed
//     (release) and read after observing Armed (acquire); they do not change until Idle.
//  3. Only the thread in Trapping writes pause_state until it returns to Idle.
//  4. No wait is unbounded: the trapped thread polls every 200 µs and leaves at the deadline.
// Never blocks a thread that is not the target; never changes a call's arguments or result.
#pragma once

#include <atomic>
#include <cstdint>

#include "falcon/shm_abi.h"

namespace falcon::shim {

class Tracer;
struct ThreadState;

class Trap {
 public:
  void Attach(FalconControl* control, uint32_t comm_capacity);
  void Reset();  // after fork

  // HOT PATH: true while a pause is armed (one relaxed load).
  bool armed() const { return armed_.load(std::memory_order_relaxed); }

  // Service thread: arms new requests, expires armed ones past their deadline.
  void ServiceTick(int64_t real_now_ns);

  // Caller thread, only when armed(): stops here if this is the target call. Returns true if
  // the thread was stopped (the caller should re-read its clock). Inside a group it marks the
  // thread (ThreadState::trap_deferred) to stop at AfterGroup instead.
  bool OnCall(uint32_t comm_slot, uint64_t comm_seq, Tracer& tracer, ThreadState& ts);
  // Caller thread, when ts.trap_deferred and the group has ended (after the group end, or
  // before the next ordered call when the group end returned ncclInProgress): stops now.
  // `held_slot`: the comm slot of the ordered call the thread is about to issue (its comm_seq
  // taken), FALCON_NO_COMM after a group end.
  void AfterGroup(Tracer& tracer, ThreadState& ts, uint32_t held_slot = FALCON_NO_COMM);

 private:
  enum Phase : int { kIdle = 0, kArmed = 1, kTrapping = 2, kDeferred = 3 };
  void Report(FalconPauseState state, uint64_t gen);
  void Hold(Tracer& tracer, ThreadState& ts, uint32_t held_slot);

  FalconControl* control_ = nullptr;  // fixed after Attach
  uint32_t comm_capacity_ = 0;        // fixed after Attach
  std::atomic<int> phase_{kIdle};
  std::atomic<bool> armed_{false};
  // Target, see invariant 2 (atomics: a caller may read them while the service thread re-arms
  // after an expiry; OnCall re-checks them after winning the CAS).
  std::atomic<uint64_t> gen_{0};
  std::atomic<uint32_t> target_count_{0};
  std::atomic<uint32_t> target_slot_[FALCON_PAUSE_MAX_TARGETS] = {};
  std::atomic<uint64_t> target_seq_[FALCON_PAUSE_MAX_TARGETS] = {};
  std::atomic<int64_t> deadline_real_ns_{0};
  // Service thread only.
  uint64_t seen_gen_ = 0;
};

}  // namespace falcon::shim
