// GPU timing with CUDA events through the driver API (cuda_driver.h): see gpu_timer.h.
#include "shim/gpu_timer.h"

#include "falcon/shm_abi.h"
#include "shim/cuda_driver.h"
#include "shim/log.h"
#include "shim/segment.h"
#include "shim/tracer.h"

namespace falcon::shim {
namespace {

constexpr int kCaptureStatusNone = 0;
constexpr int64_t kReanchorNs = 30LL * 1000 * 1000 * 1000;

// A copy of the driver's entry points, taken once by Init: the hot path reads it directly.
CudaDriver g_cu;

}  // namespace

bool GpuTimer::Init() {
  // Only a process that already uses the GPU has libcuda loaded; never load it ourselves.
  const CudaDriver* d = LoadedCudaDriver();
  if (d == nullptr) return false;
  if (d->ctx_get_current == nullptr || d->ctx_set_current == nullptr || d->event_create == nullptr ||
      d->event_destroy == nullptr || d->event_record == nullptr || d->event_query == nullptr ||
      d->event_synchronize == nullptr || d->event_elapsed == nullptr || d->stream_is_capturing == nullptr) {
    LogOnce(OnceKey::kCudaDriver, LogLevel::kWarn, "CUDA driver lacks event entry points; host timing only");
    return false;
  }
  g_cu = *d;
  available_.store(true, std::memory_order_release);
  return true;
}

void GpuTimer::Disable(const char* what, int code) {
  available_.store(false, std::memory_order_relaxed);
  LogOnce(OnceKey::kCudaDriver, LogLevel::kWarn, "%s failed (CUresult %d); GPU timing off, host timing only",
          what, code);
}

// HOT PATH BEGIN (Start, Stop, Cancel): no lock, no allocation, no syscall, no logging.
int32_t GpuTimer::Start(void* stream, bool* capturing) {
  int status = kCaptureStatusNone;
  if (g_cu.stream_is_capturing(stream, &status) != kCudaSuccess || status != kCaptureStatusNone) {
    *capturing = status != kCaptureStatusNone;
    return -1;  // recording an event would add a node to the user's graph
  }
  void* ctx = nullptr;
  if (g_cu.ctx_get_current(&ctx) != kCudaSuccess || ctx == nullptr) return -1;
  for (int tries = 0; tries < 8; ++tries) {
    const int32_t i = static_cast<int32_t>(cursor_.fetch_add(1, std::memory_order_relaxed) % kPairs);
    Pair& p = pairs_[i];
    uint32_t expected = kFree;
    if (!p.state.compare_exchange_strong(expected, kClaimed, std::memory_order_acquire)) continue;
    if (p.ctx != ctx) {  // first use of this pair in this context: create its events (rare)
      if (p.start != nullptr) g_cu.event_destroy(p.start);
      if (p.end != nullptr) g_cu.event_destroy(p.end);
      p.start = p.end = nullptr;
      if (g_cu.event_create(&p.start, 0) != kCudaSuccess || g_cu.event_create(&p.end, 0) != kCudaSuccess) {
        p.ctx = nullptr;
        p.state.store(kFree, std::memory_order_release);
        return -1;
      }
      p.ctx = ctx;
    }
    if (g_cu.event_record(p.start, stream) != kCudaSuccess) {
      p.state.store(kFree, std::memory_order_release);
      return -1;
    }
    return i;
  }
  return -1;  // pool busy: this call gets host timing
}

void GpuTimer::Stop(int32_t ticket, void* stream, uint64_t seq, uint32_t lane) {
  Pair& p = pairs_[ticket];
  p.seq = seq;
  p.lane = lane;
  if (g_cu.event_record(p.end, stream) != kCudaSuccess) {
    p.state.store(kFree, std::memory_order_release);
    return;
  }
  p.state.store(kPending, std::memory_order_release);
}

void GpuTimer::Cancel(int32_t ticket) { pairs_[ticket].state.store(kFree, std::memory_order_release); }
// HOT PATH END

void GpuTimer::Poll(Tracer& tracer) {
  for (Pair& p : pairs_) {
    if (p.state.load(std::memory_order_acquire) != kPending) continue;
    if (!available()) {
      p.state.store(kFree, std::memory_order_release);
      continue;
    }
    if (g_cu.ctx_set_current(p.ctx) != kCudaSuccess) continue;
    CuResult q = g_cu.event_query(p.end);
    if (q == kCudaNotReady) continue;
    FalconRecord r{};
    r.op = kFalconOpGpuTiming;
    r.comm_seq = p.seq;
    r.comm_slot = FALCON_NO_COMM;
    r.peer = static_cast<int32_t>(p.lane);
    r.redop = -1;
    r.dtype = 0xFF;
    r.result = 1;
    const int64_t now = SystemMonoNs();
    if (q == kCudaSuccess) {
      // Anchor: an event known to have completed at a known host time, per context, refreshed so
      // float milliseconds keep sub-microsecond resolution.
      if (anchor_ctx_ != p.ctx || now - anchor_set_at_ns_ > kReanchorNs) {
        if (anchor_event_ == nullptr || anchor_ctx_ != p.ctx) {
          if (g_cu.event_create(&anchor_event_, 0) != kCudaSuccess) {
            Disable("cuEventCreate", -1);
            continue;
          }
        }
        CuResult a = g_cu.event_record(anchor_event_, nullptr);
        if (a == kCudaSuccess) a = g_cu.event_synchronize(anchor_event_);
        if (a != kCudaSuccess) {
          Disable("anchor event", a);
          continue;
        }
        anchor_ctx_ = p.ctx;
        anchor_host_ns_ = SystemMonoNs();
        anchor_set_at_ns_ = anchor_host_ns_;
      }
      float start_ms = 0, end_ms = 0;
      if (g_cu.event_elapsed(&start_ms, anchor_event_, p.start) == kCudaSuccess &&
          g_cu.event_elapsed(&end_ms, anchor_event_, p.end) == kCudaSuccess) {
        r.t_start_ns = anchor_host_ns_ + static_cast<int64_t>(static_cast<double>(start_ms) * 1e6);
        r.t_end_ns = anchor_host_ns_ + static_cast<int64_t>(static_cast<double>(end_ms) * 1e6);
        r.result = 0;
      }
    }
    if (r.result != 0) r.t_start_ns = now;
    tracer.Publish(r, tracer.SharedLane());
    p.state.store(kFree, std::memory_order_release);
  }
}

}  // namespace falcon::shim
