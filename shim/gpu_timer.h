// GPU timing of NCCL calls with CUDA events, through the CUDA driver API loaded at run time.
//
// The driver is never loaded into a process that has not loaded it itself (dlopen with
// RTLD_NOLOAD): a CPU-only process keeps host timing. Events come from a fixed pool of pairs;
// the caller's thread only records events (Start/Stop, no synchronisation); the service thread
// polls for completion (Poll) and publishes kFalconOpGpuTiming records. Any driver error
// disables GPU timing for the rest of the process (one log line); calls then get host timing.
// Thread-safety: Start/Stop from any thread; Poll from the service thread only; Init once.
// Never blocks the caller; never records an event into a stream being captured into a graph.
#pragma once

#include <atomic>
#include <cstdint>

namespace falcon::shim {

class Tracer;

class GpuTimer {
 public:
  // Looks for an already-loaded libcuda.so.1 and its entry points. Returns true if usable.
  bool Init();
  bool available() const { return available_.load(std::memory_order_relaxed); }

  // HOT PATH helpers. Start returns a ticket (>= 0) or -1 when the call gets host timing only;
  // *capturing is set when the stream is being captured into a CUDA graph.
  int32_t Start(void* stream, bool* capturing);
  // `seq`/`lane`: where the timed call's record lives, for the kFalconOpGpuTiming record.
  void Stop(int32_t ticket, void* stream, uint64_t seq, uint32_t lane);
  // Releases a ticket whose call failed before Stop.
  void Cancel(int32_t ticket);

  // Service thread: completes finished pairs and publishes their timing through `tracer`.
  void Poll(Tracer& tracer);

 private:
  static constexpr int32_t kPairs = 4096;
  enum State : uint32_t { kFree = 0, kClaimed = 1, kPending = 2 };
  struct Pair {
    std::atomic<uint32_t> state{kFree};
    void* ctx = nullptr;
    void* start = nullptr;
    void* end = nullptr;
    uint64_t seq = 0;
    uint32_t lane = 0;
  };
  void Disable(const char* what, int code);

  std::atomic<bool> available_{false};
  std::atomic<uint32_t> cursor_{0};
  Pair pairs_[kPairs];
  // Anchor (service thread only): a completed event and the host time it completed at.
  void* anchor_ctx_ = nullptr;
  void* anchor_event_ = nullptr;
  int64_t anchor_host_ns_ = 0;
  int64_t anchor_set_at_ns_ = 0;
};

}  // namespace falcon::shim
