// The shim's one process-wide state object and the interception hot path.
//
// Tracer owns the segment, the communicator registry, the clock and the GPU timer. It is a
// process-wide singleton (the one mutable global STYLE.md allows the shim), initialised lazily
// by the first NCCL call of the process and reset in a fork child. Every exported NCCL function
// runs Intercept(), which forwards to the real NCCL and, around it, records one FalconRecord
// into the calling thread's lane.
//
// Invariants:
//  1. Initialisation is a CAS from kUninit to kIniting by exactly one thread; callers that see
//     kIniting or kPassThrough forward without recording — nobody waits.
//  2. A thread-local depth counter makes calls that NCCL makes into its own public API (e.g.
//     ncclBcast → ncclBroadcast) forward without recording: every user call is recorded once.
//  3. Between the HOT PATH banners: no lock, no locked instruction on an exclusive lane, no
//     allocation, no syscall, no getenv, no logging, no exceptions. First-call-per-thread and
//     first-call-per-communicator work happens out of line.
//  4. The result of the real call is returned unchanged; the shim never alters user data.
#pragma once

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "falcon/shm_abi.h"
#include "shim/comm_registry.h"
#include "shim/config.h"
#include "shim/fast_clock.h"
#include "shim/gpu_timer.h"
#include "shim/segment.h"
#include "shim/trap.h"
#include "shim/validation_comm.h"

namespace falcon::shim {

// What the wrapper knows about a call before forwarding it.
struct CallDesc {
  FalconOp op = kFalconOpNone;
  const void* comm = nullptr;  // ncclComm_t the call is on, if any
  uint64_t count = 0;
  int32_t dtype = -1;
  int32_t redop = -1;
  int32_t peer = -1;
  void* stream = nullptr;
  uint8_t flags = 0;
  bool gpu_work = false;  // the call enqueues GPU work worth timing with events
};

// Filled by the wrapper's post-call hook for calls that create communicators.
struct CallOutcome {
  uint32_t comm_slot = FALCON_NO_COMM;  // overrides the slot found at entry, if set
  uint64_t aux = ~uint64_t{0};          // overrides FalconRecord::aux if set
  int32_t peer = -2;                    // overrides CallDesc::peer if >= -1
};

// GPU events started for a timed call (see GpuTimer).
struct GpuTicket {
  int32_t ticket = -1;
  bool capturing = false;
};

struct ThreadState {
  uint32_t depth = 0;          // re-entrancy guard
  uint32_t group_depth = 0;    // ncclGroupStart nesting
  uint32_t generation = 0;     // Tracer generation the fields below belong to
  uint32_t sample_counter = 0;
  FalconThreadSlot* slot = nullptr;  // in-flight state, may be null (table full)
  FalconLane* lane = nullptr;
  FalconRecord* ring = nullptr;      // the lane's first record
  uint16_t slot_index = 0xFFFF;
  uint8_t lane_index = 0;
  bool lane_shared = true;
  bool trap_deferred = false;         // stop at the end of the current group (trap.h)
  uint64_t trap_deferred_gen = 0;     // the pause generation trap_deferred belongs to
  const void* cached_comm = nullptr;  // one-entry communicator lookup cache, valid while the
  uint32_t cached_slot = FALCON_NO_COMM;  // registry's epoch is cached_epoch (comm_registry.h)
  uint64_t cached_epoch = 0;
  // A group timed as one (Tracer::GpuBegin): the start event is on group_stream; the outermost
  // ncclGroupEnd records the end. group_streams > 1: calls on several streams, not timed.
  int32_t group_ticket = -1;
  void* group_stream = nullptr;
  uint32_t group_streams = 0;
  // Calls of the open group whose completion is marked at its outermost ncclGroupEnd
  // (Tracer::TrackDevice): the latest comm_seq per (communicator, stream).
  struct GroupMark {
    uint32_t comm_slot;
    uint64_t seq;
    void* stream;
  };
  static constexpr uint32_t kGroupMarks = 16;
  GroupMark group_marks[kGroupMarks];
  uint32_t group_mark_count = 0;
  // The stream of this thread's last call with device work (Tracer::NoteStream is told of each
  // new one).
  void* last_stream = reinterpret_cast<void*>(~uintptr_t{0});  // none yet (0 is the legacy stream)
};

// ncclInProgress (nccl.h; checked in wrapper_util.h): a nonblocking communicator's call that
// has not finished yet.
inline constexpr int kNcclInProgress = 7;

ThreadState& CurrentThread();

class Tracer {
 public:
  enum InitState : int { kUninit = 0, kIniting = 1, kReady = 2, kPassThrough = 3 };

  // The tracer if recording is possible now, else nullptr (see invariant 1).
  static Tracer* Active();

  // Records a call that ran from t0 to t1 (t1 = 0: not measured). Out of line: the shared lane,
  // GPU timing and every first-time case go through here too.
  void Record(const CallDesc& d, const CallOutcome& out, ThreadState& ts, int64_t t0, int64_t t1,
              uint64_t comm_seq, uint32_t comm_slot, int result, bool timed, GpuTicket gpu);
  // Timed calls: records the GPU start event before the call is forwarded (if there is a GPU).
  // Inside a group the call is not timed alone (NCCL launches the group's work at its end): the
  // group's first GPU call starts one ticket for the whole group instead (ThreadState).
  GpuTicket GpuBegin(const CallDesc& d, ThreadState& ts);

  // After an ordered call with device work, or an ncclGroupEnd (result: what it returned):
  // tracks when its device work completes (shm_abi.h contract 8). Inside a group NCCL launches
  // the work at the outermost ncclGroupEnd, so the group's calls are remembered and marked then.
  // A call that failed or is still in progress (a nonblocking communicator) is not marked.
  void TrackDevice(const CallDesc& d, ThreadState& ts, uint32_t comm_slot, uint64_t comm_seq, int result);
  // Adds to the header's untracked_calls (shm_abi.h contract 8).
  void CountUntracked(uint64_t n);

  // Publishes one record into lane `lane` (version and lane are set here). REQUIRES: an
  // exclusive lane is written only by the thread that owns it.
  void Publish(FalconRecord& r, uint32_t lane);
  uint32_t SharedLane() const { return config_.lanes - 1; }

  // Writes a kFalconOpAnnotation record (count = what) into the thread's lane, stamped now.
  void Annotate(uint64_t what, ThreadState& ts);
  // The framework entered phase `phase` (FalconPhase) now: the control block's phase and an
  // annotation record (kFalconAnnotatePhase, peer = phase) on the shared lane, so any thread may
  // call it without a lane of its own. Lock-free, no allocation, no system call.
  void NotePhase(uint32_t phase);

  // Slow paths of the hot path.
  void BindThread(ThreadState& ts);  // first call of a thread (or after fork)
  // Lookup with a one-entry cache; a handle never seen is registered with a best-effort
  // identity (RegisterUnknownComm in wrapper_util.h).
  uint32_t SlotOf(const void* comm, ThreadState& ts);
  void ReleaseThreadSlot(ThreadState& ts);  // thread exit; safe in any state

  CommRegistry& comms() { return comms_; }
  Segment& segment() { return segment_; }
  GpuTimer& gpu() { return gpu_; }
  // Counts a query (FalconOpIsQuery) of `ts`'s thread: a plain increment on its own exclusive
  // lane, an atomic add on the shared lane for threads that share it or that never made another
  // call (a watchdog that only polls takes no lane of its own). Lock-free, no allocation.
  void CountQuery(const ThreadState& ts) {
    if (ts.generation == generation() && !ts.lane_shared && ts.lane != nullptr) {
      std::atomic_ref<uint64_t> q(ts.lane->queries);
      q.store(q.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      return;
    }
    std::atomic_ref<uint64_t>(segment_.lanes()[SharedLane()].queries).fetch_add(1, std::memory_order_relaxed);
  }
  // HOT PATH helper (lock-free, no allocation): remembers a stream the job's NCCL calls use,
  // for the GEMM validation's fence (gpu_bench.h). The first kJobStreams distinct streams are
  // kept; later ones are not (a job uses a handful).
  void NoteStream(void* stream);
  // Copies up to `max` remembered streams into `out` (null: the legacy default stream); returns
  // how many. Any thread.
  size_t JobStreams(void** out, size_t max) const;
  static constexpr size_t kJobStreams = 32;
  Trap& trap() { return trap_; }
  // Trapped thread only (validation_comm.h).
  ValidationComm& validation() { return validation_; }
  const FastClock& clock() const { return clock_; }
  const ShimConfig& config() const { return config_; }
  uint32_t mode() const { return mode_.load(std::memory_order_relaxed); }
  uint32_t sample_every() const { return sample_every_.load(std::memory_order_relaxed); }
  uint32_t generation() const { return generation_.load(std::memory_order_relaxed); }

  // Service-thread entry point (service_thread.cc). The first tick runs on the thread that
  // initialises the shim (a training thread): `kFirst` does only what is safe there — no GPU
  // work, which would change that thread's CUDA state (its stream-capture mode).
  enum class TickKind { kFirst, kService };
  void ServiceTick(TickKind kind = TickKind::kService);
  bool stopping() const { return stop_.load(std::memory_order_relaxed); }

  // Process lifecycle hooks (tracer.cc).
  static Tracer* InitSlow();
  void OnExit();
  void OnForkChild();

 private:
  ShimConfig config_;
  Segment segment_;
  CommRegistry comms_;
  GpuTimer gpu_;
  std::atomic<void*> job_streams_[kJobStreams] = {};  // NoteStream: filled front to back, never cleared
  std::atomic<bool> legacy_stream_used_{false};       // NoteStream(nullptr) was called
  Trap trap_;
  ValidationComm validation_;
  FastClock clock_;
  std::atomic<uint32_t> mode_{kFalconModeTrack};
  std::atomic<uint32_t> sample_every_{100};
  std::atomic<uint32_t> generation_{1};
  std::atomic<bool> stop_{false};
  uint64_t applied_command_ = 0;  // service thread only
  static constexpr uint32_t kGpuRetryTicks = 20;  // ~1 s of 50 ms service ticks
  uint32_t ticks_without_gpu_ = 0;  // service thread only
};

extern std::atomic<int> g_init_state;
extern Tracer g_tracer;
// The framework's phase (falconSetPhase, FalconPhase), process-wide, kept also before the
// segment exists; the tracer writes it into the segment when it is created.
extern std::atomic<uint32_t> g_phase;

inline Tracer* Tracer::Active() {
  int s = g_init_state.load(std::memory_order_acquire);
  if (__builtin_expect(s == kReady, 1)) return &g_tracer;
  if (s == kUninit) return InitSlow();
  return nullptr;
}

// The value recorded as FalconRecord::result: the ncclResult_t, or 0 for string queries.
template <typename R>
inline int ResultCode(R r) {
  if constexpr (std::is_pointer_v<R>) {
    return 0;
  } else {
    return static_cast<int>(r);
  }
}

// Keeps the per-thread ncclGroupStart nesting depth; runs for every call, traced or not.
inline void TrackGroupDepth(FalconOp op, int result, ThreadState& ts) {
  if (op == kFalconOpGroupStart && result == 0) ++ts.group_depth;
  if ((op == kFalconOpGroupEnd || op == kFalconOpGroupSimulateEnd) && ts.group_depth > 0) --ts.group_depth;
}

// After a call, when the tracer is active: the group depth, then a stop deferred to the end of
// the group (trap.h), unless the group end returned ncclInProgress (the stop then comes before
// the thread's next ordered call).
inline void EndCall(FalconOp op, int result, Tracer& tracer, ThreadState& ts) {
  TrackGroupDepth(op, result, ts);
  if (__builtin_expect(ts.trap_deferred, 0) && ts.group_depth == 0 && result != kNcclInProgress) {
    tracer.trap().AfterGroup(tracer, ts);
  }
}

// Forwards one NCCL call and records it. `forward()` performs the real call and returns its
// result; `after(result, outcome)` runs after it, inside the guard, only when recording.
template <typename Forward, typename After>
inline auto Intercept(const CallDesc& d, Forward&& forward, After&& after) -> decltype(forward()) {
  // HOT PATH BEGIN: see invariant 3.
  ThreadState& ts = CurrentThread();
  if (ts.depth != 0) return forward();  // NCCL calling its own API: already recorded
  ts.depth = 1;
  Tracer* tracer = Tracer::Active();
  if (tracer == nullptr) {  // pass-through: no segment, disabled, or another thread initialising
    auto r = forward();
    TrackGroupDepth(d.op, ResultCode(r), ts);
    ts.depth = 0;
    return r;
  }
  if (FalconOpIsQuery(d.op)) {  // counted, never recorded; takes no lane, never stops (shm_abi.h)
    auto r = forward();
    CallOutcome out;
    after(r, out);
    tracer->CountQuery(ts);
    ts.depth = 0;
    return r;
  }
  const uint32_t mode = tracer->mode();
  if (__builtin_expect(ts.generation != tracer->generation(), 0)) tracer->BindThread(ts);
  // Identity and ordering are kept in every mode, `off` included: members switch modes at
  // different points, and their comm_seq must stay alike (shm_abi.h, FalconOpIsOrdered).
  const bool ordered = FalconOpIsOrdered(d.op) != 0;
  uint32_t comm_slot = FALCON_NO_COMM;
  uint64_t comm_seq = ~uint64_t{0};
  if (d.comm != nullptr) {
    comm_slot = d.comm == ts.cached_comm && ts.cached_epoch == tracer->comms().epoch() ? ts.cached_slot
                                                                                       : tracer->SlotOf(d.comm, ts);
    if (ordered && comm_slot != FALCON_NO_COMM) comm_seq = tracer->comms().NextCallSeq(comm_slot);
  }
  // A pause stops the thread that issues ordered calls, never a thread polling errors (trap.h):
  // before the target call, or before the first ordered call after a deferred stop's group.
  if (__builtin_expect(ts.trap_deferred, 0) && ts.group_depth == 0 && (ordered || d.op == kFalconOpGroupStart)) {
    tracer->trap().AfterGroup(*tracer, ts, ordered ? comm_slot : FALCON_NO_COMM);
  }
  if (__builtin_expect(tracer->trap().armed(), 0) && ordered && comm_slot != FALCON_NO_COMM) {
    tracer->trap().OnCall(comm_slot, comm_seq, *tracer, ts);
  }
  if (mode == kFalconModeOff) {
    auto r = forward();
    CallOutcome out;
    after(r, out);
    if (out.comm_slot != FALCON_NO_COMM && comm_slot == FALCON_NO_COMM) tracer->comms().NextCallSeq(out.comm_slot);
    EndCall(d.op, ResultCode(r), *tracer, ts);
    ts.depth = 0;
    return r;
  }
  if (d.gpu_work && d.stream != ts.last_stream) {  // rare: a thread's stream changes seldom
    ts.last_stream = d.stream;
    tracer->NoteStream(d.stream);
  }
  const int64_t t0 = tracer->clock().Now();  // after any pause: the call starts now
  if (FalconThreadSlot* s = ts.slot) {  // in-flight state, for hang diagnosis
    std::atomic_ref<int64_t>(s->inflight_since_mono_ns).store(t0, std::memory_order_relaxed);
    std::atomic_ref<uint32_t>(s->inflight_comm_slot).store(comm_slot, std::memory_order_relaxed);
    std::atomic_ref<uint16_t>(s->inflight_op).store(static_cast<uint16_t>(d.op), std::memory_order_relaxed);
    std::atomic_ref<uint64_t>(s->inflight_seq)
        .store(comm_seq != ~uint64_t{0} ? comm_seq + 1 : FALCON_INFLIGHT_UNORDERED, std::memory_order_release);
  }
  if (comm_seq != ~uint64_t{0}) tracer->comms().NoteCall(comm_slot, t0);
  const bool timed = mode == kFalconModeProfile ||
                     (mode == kFalconModeSample && ts.sample_counter++ % tracer->sample_every() == 0);
  if (__builtin_expect(timed || ts.lane_shared || ts.group_ticket >= 0, 0)) {
    // Profile/sample mode and threads on the shared lane take the out-of-line path.
    const GpuTicket gpu = timed ? tracer->GpuBegin(d, ts) : GpuTicket{};
    auto r = forward();
    CallOutcome out;
    after(r, out);
    const int64_t t1 = timed ? tracer->clock().Now() : 0;
    tracer->Record(d, out, ts, t0, t1, comm_seq, comm_slot, ResultCode(r), timed, gpu);
    if (tracer->gpu().available() && tracer->config().device_progress) {
      tracer->TrackDevice(d, ts, comm_slot, comm_seq, ResultCode(r));
    }
    EndCall(d.op, ResultCode(r), *tracer, ts);
    ts.depth = 0;
    return r;
  }
  auto r = forward();
  CallOutcome out;
  after(r, out);
  // Exclusive lane (shm_abi.h contract 3): one writer, plain atomic stores, one cache line.
  FalconLane* lane = ts.lane;
  std::atomic_ref<uint64_t> head(lane->head);
  const uint64_t idx = head.load(std::memory_order_relaxed);
  head.store(idx + 1, std::memory_order_relaxed);
  const uint64_t cap = tracer->config().ring_records;
  FalconRecord* rec = &ts.ring[idx & (cap - 1)];
  std::atomic_ref<uint64_t> version(rec->version);
  version.store(2 * idx + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  if (__builtin_expect(idx >= cap, 1) &&
      idx - cap >= std::atomic_ref<uint64_t>(lane->reader_cursor).load(std::memory_order_relaxed)) {
    std::atomic_ref<uint64_t> lost(lane->records_lost);
    lost.store(lost.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  uint32_t slot_out = comm_slot;
  if (__builtin_expect(out.comm_slot != FALCON_NO_COMM, 0)) {  // the call created a communicator
    slot_out = out.comm_slot;
    if (comm_slot == FALCON_NO_COMM && ordered) comm_seq = tracer->comms().NextCallSeq(slot_out);
  }
  const int32_t peer = out.peer >= -1 ? out.peer : d.peer;
  const int32_t redop = d.redop > 32767 ? 32767 : d.redop;
  uint8_t flags = d.flags;
  if (ts.group_depth > 0) flags |= kFalconFlagInGroup;
  const uint64_t w6 = uint64_t{slot_out} | (uint64_t{static_cast<uint32_t>(peer)} << 32);
  const uint64_t w7 = uint64_t{static_cast<uint16_t>(static_cast<int16_t>(redop))} |
                      (uint64_t{static_cast<uint8_t>(d.op)} << 16) | (uint64_t{static_cast<uint8_t>(d.dtype)} << 24) |
                      (uint64_t{static_cast<uint8_t>(ts.group_depth > 255 ? 255 : ts.group_depth)} << 32) |
                      (uint64_t{flags} << 40) | (uint64_t{static_cast<uint8_t>(ResultCode(r))} << 48) |
                      (uint64_t{ts.lane_index} << 56);
  auto* w = reinterpret_cast<uint64_t*>(rec);
  std::atomic_ref<uint64_t>(w[1]).store(comm_seq, std::memory_order_relaxed);
  std::atomic_ref<uint64_t>(w[2]).store(d.count, std::memory_order_relaxed);
  std::atomic_ref<uint64_t>(w[3]).store(out.aux != ~uint64_t{0} ? out.aux : reinterpret_cast<uintptr_t>(d.stream),
                                        std::memory_order_relaxed);
  std::atomic_ref<uint64_t>(w[4]).store(static_cast<uint64_t>(t0), std::memory_order_relaxed);
  std::atomic_ref<uint64_t>(w[5]).store(0, std::memory_order_relaxed);
  std::atomic_ref<uint64_t>(w[6]).store(w6, std::memory_order_relaxed);
  std::atomic_ref<uint64_t>(w[7]).store(w7, std::memory_order_relaxed);
  version.store(2 * idx + 2, std::memory_order_release);
  if (FalconThreadSlot* s = ts.slot) std::atomic_ref<uint64_t>(s->inflight_seq).store(0, std::memory_order_release);
  if ((d.gpu_work || d.op == kFalconOpGroupEnd) && tracer->gpu().available() && tracer->config().device_progress) {
    tracer->TrackDevice(d, ts, comm_slot, comm_seq, ResultCode(r));
  }
  EndCall(d.op, ResultCode(r), *tracer, ts);
  ts.depth = 0;
  return r;
  // HOT PATH END
}

template <typename Forward>
inline auto Intercept(const CallDesc& d, Forward&& forward) -> decltype(forward()) {
  return Intercept(d, static_cast<Forward&&>(forward), [](auto, CallOutcome&) {});
}

}  // namespace falcon::shim
