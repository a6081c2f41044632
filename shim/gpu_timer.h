// GPU timing of NCCL calls with CUDA events, through the CUDA driver API loaded at run time.
//
// The driver is never loaded into a process that has not loaded it itself (dlopen with
// RTLD_NOLOAD): a CPU-only process keeps host timing, and a process that loads CUDA after its
// first NCCL call gets GPU timing from then on (the service thread looks again about once a
// second). Events come from a fixed pool of pairs split between up to kContexts CUDA contexts;
// the service thread creates a context's events the first time a call is timed in it, so the
// caller's thread only records events (Start/Stop: no creation, no synchronisation); calls in
// a context whose events are not made yet, or in one context too many, get host timing.
// The service thread polls for completion (Poll) and publishes kFalconOpGpuTiming records.
// Any driver error disables GPU timing for the rest of the process (one log line).
// Completion marks (shm_abi.h contract 8) use the same contexts: one event without timing per
// ordered call, from a pool of kMarksPerContext per context, recorded after the call's work;
// PollMarks advances each communicator's device_done as they complete. A busy pool leaves the
// call unmarked (its state unknown to readers), never waits.
//
// Invariants:
//  1. The service thread never blocks on the device: it queries events, never synchronises.
//     Host time is tied to device time by an anchor event per context, recorded on a
//     non-blocking stream of Falcon's own (never the legacy default stream, which waits for
//     every blocking stream) and polled for at most kAnchorSpinNs.
//  2. The service thread runs in the relaxed stream-capture mode (cuThreadExchangeStream-
//     CaptureMode), so none of its calls can invalidate another thread's CUDA-graph capture;
//     the caller's thread never records an event into a stream being captured.
//  3. A pair's events belong to one context for the life of the process (no re-creation).
// Thread-safety: Start/Stop/Cancel/Mark from any thread; Init, Poll, PollMarks and Prepare from
// the service thread only (Init also once at shim start, before the service thread exists).
#pragma once

#include <atomic>
#include <cstdint>

namespace falcon::shim {

class Tracer;
class CommRegistry;

class GpuTimer {
 public:
  // Looks for an already-loaded libcuda.so.1 and its entry points. Returns true if usable now.
  // May be called again while it has not succeeded (and timing was not disabled).
  bool Init();
  // Acquire: a caller that sees true sees the driver's entry points Init copied (the service
  // thread may find the driver after the callers started).
  bool available() const { return available_.load(std::memory_order_acquire); }
  // A driver error turned GPU timing off for good.
  bool disabled() const { return disabled_.load(std::memory_order_relaxed); }

  // HOT PATH helpers. Start returns a ticket (>= 0) or -1 when the call gets host timing only;
  // *capturing is set when the stream is being captured into a CUDA graph.
  int32_t Start(void* stream, bool* capturing);
  // `seq`/`lane`: where the timed call's record lives, for the kFalconOpGpuTiming record.
  void Stop(int32_t ticket, void* stream, uint64_t seq, uint32_t lane);
  // Releases a ticket whose call failed before Stop.
  void Cancel(int32_t ticket);

  // HOT PATH helper: an event after the work queued on `stream` so far, as call `seq` of comm
  // slot `comm_slot`. False when it could not be tracked (stream being captured into a graph,
  // context without events yet or one too many, pool busy, driver error).
  bool Mark(void* stream, uint32_t comm_slot, uint64_t seq);
  // Service thread: completed marks advance their communicators' device_done.
  void PollMarks(CommRegistry& comms, int64_t now_ns);

  // Service thread: makes events for new contexts, completes finished pairs and publishes
  // their timing through `tracer`.
  void Poll(Tracer& tracer);

  static constexpr int32_t kContexts = 8;
  static constexpr int32_t kPairsPerContext = 512;
  static constexpr int64_t kAnchorSpinNs = 2 * 1000 * 1000;
  static constexpr int32_t kMarksPerContext = 1024;

 private:
  static constexpr int32_t kPairs = kContexts * kPairsPerContext;
  enum State : uint32_t { kFree = 0, kClaimed = 1, kPending = 2 };
  struct Pair {
    std::atomic<uint32_t> state{kFree};
    void* start = nullptr;  // created by the service thread before the context is ready
    void* end = nullptr;
    uint64_t seq = 0;
    uint32_t lane = 0;
  };
  struct MarkSlot {
    std::atomic<uint32_t> state{kFree};
    void* event = nullptr;  // created by the service thread, without timing
    uint32_t comm_slot = 0;
    uint64_t seq = 0;
  };
  struct Context {
    std::atomic<void*> ctx{nullptr};       // claimed by the first caller that times a call in it
    std::atomic<bool> ready{false};        // its pairs have events (release: Prepare)
    std::atomic<uint32_t> cursor{0};
    std::atomic<uint32_t> mark_cursor{0};
    bool failed = false;                   // service thread: its events could not be made
    // Anchor (service thread only): an event on `stream` that completed at host time host_ns.
    void* stream = nullptr;
    void* anchor = nullptr;
    int64_t host_ns = 0;
    int64_t set_at_ns = 0;       // 0: no anchor
    int64_t failed_tick_ns = 0;  // the Poll tick whose anchor attempt timed out
  };
  int32_t ContextIndex(void* ctx);  // hot path: find or claim; -1 if the table is full
  void Prepare(int32_t ci);
  // Makes sure context ci has a usable anchor; at most one attempt (kAnchorSpinNs) per tick.
  bool Anchor(int32_t ci, int64_t tick_ns);
  void Disable(const char* what, int code);

  std::atomic<bool> available_{false};
  std::atomic<bool> disabled_{false};
  bool relaxed_ = false;  // service thread: its capture mode is relaxed
  Context contexts_[kContexts];
  Pair pairs_[kPairs];
  MarkSlot marks_[kContexts * kMarksPerContext];
};

}  // namespace falcon::shim
