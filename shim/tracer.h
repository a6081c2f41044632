// The shim's one process-wide state object and the interception hot path.
//
// Tracer owns the segment, the communicator registry and the GPU timer. It is a process-wide
// singleton (the one mutable global STYLE.md allows the shim), initialised lazily by the first
// NCCL call of the process and reset in a fork child. Every exported NCCL function runs
// Intercept(), which forwards to the real NCCL and, around it, records one FalconRecord.
//
// Invariants:
//  1. Initialisation is a CAS from kUninit to kIniting by exactly one thread; callers that see
//     kIniting, kPassThrough or kUninit-after-failure forward without recording — nobody waits.
//  2. A thread-local depth counter makes calls that NCCL makes into its own public API (e.g.
//     ncclBcast → ncclBroadcast) forward without recording: every user call is recorded once.
//  3. Between the HOT PATH banners: no lock, no allocation, no syscall (clock_gettime is vDSO),
//     no getenv, no logging, no exceptions.
//  4. The result of the real call is returned unchanged; the shim never alters user data.
#pragma once

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "falcon/shm_abi.h"
#include "shim/comm_registry.h"
#include "shim/config.h"
#include "shim/gpu_timer.h"
#include "shim/segment.h"

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
  uint16_t flags = 0;
  bool gpu_work = false;       // the call enqueues GPU work worth timing with events
};

// Filled by the wrapper's post-call hook for calls that create communicators.
struct CallOutcome {
  uint32_t comm_slot = FALCON_NO_COMM;  // overrides the slot found at entry, if set
  uint64_t ref = ~uint64_t{0};          // FalconRecord::ref_seq
  int32_t peer = -2;                    // overrides CallDesc::peer if >= -1
  uint64_t count = ~uint64_t{0};        // overrides CallDesc::count if set
};

struct CallToken {
  int64_t t0 = 0;
  uint64_t comm_seq = ~uint64_t{0};
  uint32_t comm_slot = FALCON_NO_COMM;
  int32_t gpu_ticket = -1;
  uint16_t flags = 0;
  uint8_t group_depth = 0;
  bool host_end = false;
};

struct ThreadState {
  uint32_t depth = 0;          // re-entrancy guard
  uint32_t group_depth = 0;    // ncclGroupStart nesting
  uint32_t generation = 0;     // Tracer generation `slot` belongs to
  uint32_t sample_counter = 0;
  uint16_t slot_index = 0xFFFF;
  FalconThreadSlot* slot = nullptr;
};

ThreadState& CurrentThread();

class Tracer {
 public:
  enum InitState : int { kUninit = 0, kIniting = 1, kReady = 2, kPassThrough = 3 };

  // The tracer if recording is possible now, else nullptr (see invariant 1).
  static Tracer* Active();

  CallToken Begin(const CallDesc& d, ThreadState& ts);
  void End(const CallToken& t, const CallDesc& d, const CallOutcome& out, int result, ThreadState& ts);

  // Publishes one record into the ring (seq and version are assigned here). Thread-safe.
  void Publish(FalconRecord& r);

  CommRegistry& comms() { return comms_; }
  Segment& segment() { return segment_; }
  GpuTimer& gpu() { return gpu_; }
  const ShimConfig& config() const { return config_; }
  uint32_t mode() const { return mode_.load(std::memory_order_relaxed); }
  uint32_t generation() const { return generation_.load(std::memory_order_relaxed); }

  // Service-thread entry points (service_thread.cc).
  void ServiceTick();
  bool stopping() const { return stop_.load(std::memory_order_relaxed); }

  // Process lifecycle hooks (tracer.cc).
  static Tracer* InitSlow();
  void OnExit();
  void OnForkChild();

 private:
  void AcquireThreadSlot(ThreadState& ts);
  uint32_t RegisterUnknownComm(const void* comm);
  void CountInternalError();

  ShimConfig config_;
  Segment segment_;
  CommRegistry comms_;
  GpuTimer gpu_;
  std::atomic<uint32_t> mode_{kFalconModeTrack};
  std::atomic<uint32_t> sample_every_{100};
  std::atomic<uint32_t> generation_{1};
  std::atomic<bool> stop_{false};
  uint64_t applied_command_ = 0;  // service thread only
};

extern std::atomic<int> g_init_state;
extern Tracer g_tracer;

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

// Forwards one NCCL call and records it. `forward()` performs the real call and returns its
// result; `after(result, outcome)` runs after it, inside the guard, only when recording.
template <typename Forward, typename After>
inline auto Intercept(const CallDesc& d, Forward&& forward, After&& after) -> decltype(forward()) {
  // HOT PATH BEGIN: no lock, no allocation, no syscall, no getenv, no logging.
  ThreadState& ts = CurrentThread();
  if (ts.depth != 0) return forward();  // NCCL calling its own API: already recorded
  ts.depth = 1;
  Tracer* tracer = Tracer::Active();
  if (tracer == nullptr || tracer->mode() == kFalconModeOff) {
    auto r = forward();
    TrackGroupDepth(d.op, ResultCode(r), ts);
    ts.depth = 0;
    return r;
  }
  CallToken token = tracer->Begin(d, ts);
  auto r = forward();
  CallOutcome out;
  after(r, out);
  tracer->End(token, d, out, ResultCode(r), ts);
  TrackGroupDepth(d.op, ResultCode(r), ts);
  ts.depth = 0;
  return r;
  // HOT PATH END
}

template <typename Forward>
inline auto Intercept(const CallDesc& d, Forward&& forward) -> decltype(forward()) {
  return Intercept(d, static_cast<Forward&&>(forward), [](auto, CallOutcome&) {});
}

}  // namespace falcon::shim
