// GPU timing with CUDA events through the driver API (cuda_driver.h): see gpu_timer.h.
#include "shim/gpu_timer.h"

#include "falcon/shm_abi.h"
#include "shim/comm_registry.h"
#include "shim/cuda_driver.h"
#include "shim/log.h"
#include "shim/segment.h"
#include "shim/tracer.h"

namespace falcon::shim {
namespace {

constexpr int kCaptureStatusNone = 0;
constexpr int kCaptureModeRelaxed = 2;  // CU_STREAM_CAPTURE_MODE_RELAXED
constexpr int64_t kReanchorNs = 30LL * 1000 * 1000 * 1000;

// A copy of the driver's entry points, taken once by Init: the hot path reads it directly.
CudaDriver g_cu;

}  // namespace

bool GpuTimer::Init() {
  if (disabled()) return false;
  if (available()) return true;
  // Only a process that already uses the GPU has libcuda loaded; never load it ourselves.
  const CudaDriver* d = LoadedCudaDriver();
  if (d == nullptr) return false;
  if (d->ctx_get_current == nullptr || d->ctx_set_current == nullptr || d->event_create == nullptr ||
      d->event_destroy == nullptr || d->event_record == nullptr || d->event_query == nullptr ||
      d->event_elapsed == nullptr || d->stream_is_capturing == nullptr || d->stream_create == nullptr) {
    LogOnce(OnceKey::kCudaDriver, LogLevel::kWarn, "CUDA driver lacks event entry points; host timing only");
    disabled_.store(true, std::memory_order_relaxed);
    return false;
  }
  g_cu = *d;
  available_.store(true, std::memory_order_release);
  return true;
}

void GpuTimer::Disable(const char* what, int code) {
  disabled_.store(true, std::memory_order_relaxed);
  available_.store(false, std::memory_order_relaxed);
  LogOnce(OnceKey::kCudaDriver, LogLevel::kWarn, "%s failed (CUresult %d); GPU timing off, host timing only",
          what, code);
}

// HOT PATH BEGIN (ContextIndex, Start, Stop, Cancel): no lock, no allocation, no syscall, no
// logging, no event creation.
int32_t GpuTimer::ContextIndex(void* ctx) {
  for (int32_t i = 0; i < kContexts; ++i) {
    void* seen = contexts_[i].ctx.load(std::memory_order_acquire);
    if (seen == ctx) return i;
    if (seen == nullptr) {
      if (contexts_[i].ctx.compare_exchange_strong(seen, ctx, std::memory_order_acq_rel)) return i;
      if (seen == ctx) return i;  // another thread claimed it for the same context
    }
  }
  return -1;
}

int32_t GpuTimer::Start(void* stream, bool* capturing) {
  int status = kCaptureStatusNone;
  if (g_cu.stream_is_capturing(stream, &status) != kCudaSuccess || status != kCaptureStatusNone) {
    *capturing = status != kCaptureStatusNone;
    return -1;  // recording an event would add a node to the user's graph
  }
  void* ctx = nullptr;
  if (g_cu.ctx_get_current(&ctx) != kCudaSuccess || ctx == nullptr) return -1;
  const int32_t ci = ContextIndex(ctx);
  if (ci < 0) return -1;
  Context& c = contexts_[ci];
  if (!c.ready.load(std::memory_order_acquire)) return -1;  // the service thread makes its events
  for (int tries = 0; tries < 8; ++tries) {
    const int32_t i = ci * kPairsPerContext +
                      static_cast<int32_t>(c.cursor.fetch_add(1, std::memory_order_relaxed) % kPairsPerContext);
    Pair& p = pairs_[i];
    uint32_t expected = kFree;
    if (!p.state.compare_exchange_strong(expected, kClaimed, std::memory_order_acquire)) continue;
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

bool GpuTimer::Mark(void* stream, uint32_t comm_slot, uint64_t seq) {
  int status = kCaptureStatusNone;
  if (g_cu.stream_is_capturing(stream, &status) != kCudaSuccess || status != kCaptureStatusNone) return false;
  void* ctx = nullptr;
  if (g_cu.ctx_get_current(&ctx) != kCudaSuccess || ctx == nullptr) return false;
  const int32_t ci = ContextIndex(ctx);
  if (ci < 0) return false;
  Context& c = contexts_[ci];
  if (!c.ready.load(std::memory_order_acquire)) return false;  // the service thread makes its events
  for (int tries = 0; tries < 4; ++tries) {
    MarkSlot& m = marks_[ci * kMarksPerContext +
                         static_cast<int32_t>(c.mark_cursor.fetch_add(1, std::memory_order_relaxed) % kMarksPerContext)];
    uint32_t expected = kFree;
    if (!m.state.compare_exchange_strong(expected, kClaimed, std::memory_order_acquire)) continue;
    m.comm_slot = comm_slot;
    m.seq = seq;
    if (g_cu.event_record(m.event, stream) != kCudaSuccess) {
      m.state.store(kFree, std::memory_order_release);
      return false;
    }
    m.state.store(kPending, std::memory_order_release);
    return true;
  }
  return false;
}
// HOT PATH END

void GpuTimer::Prepare(int32_t ci) {
  Context& c = contexts_[ci];
  void* ctx = c.ctx.load(std::memory_order_acquire);
  if (ctx == nullptr || c.failed || c.ready.load(std::memory_order_relaxed)) return;
  if (const CuResult rc = g_cu.ctx_set_current(ctx); rc != kCudaSuccess) {
    c.failed = true;
    LogOnce(OnceKey::kCudaContext, LogLevel::kWarn,
            "cannot use CUDA context %p from the service thread (CUresult %d): its calls get host timing", ctx,
            rc);
    return;
  }
  for (int32_t k = 0; k < kPairsPerContext; ++k) {
    Pair& p = pairs_[ci * kPairsPerContext + k];
    if (p.start != nullptr) continue;
    CuResult rc = g_cu.event_create(&p.start, 0);
    if (rc == kCudaSuccess) rc = g_cu.event_create(&p.end, 0);
    if (rc != kCudaSuccess) {
      Disable("cuEventCreate", rc);
      return;
    }
  }
  constexpr unsigned kEventDisableTiming = 2;  // CU_EVENT_DISABLE_TIMING: cheaper to record
  for (int32_t k = 0; k < kMarksPerContext; ++k) {
    MarkSlot& m = marks_[ci * kMarksPerContext + k];
    if (m.event != nullptr) continue;
    if (const CuResult rc = g_cu.event_create(&m.event, kEventDisableTiming); rc != kCudaSuccess) {
      Disable("cuEventCreate", rc);
      return;
    }
  }
  // A stream of our own for the anchor: non-blocking, so it never waits for the legacy stream
  // or the job's blocking streams.
  constexpr unsigned kStreamNonBlocking = 1;
  CuResult rc = g_cu.stream_create(&c.stream, kStreamNonBlocking);
  if (rc == kCudaSuccess) rc = g_cu.event_create(&c.anchor, 0);
  if (rc != kCudaSuccess) {
    Disable("anchor stream/event", rc);
    return;
  }
  c.ready.store(true, std::memory_order_release);
}

bool GpuTimer::Anchor(int32_t ci, int64_t tick_ns) {
  Context& c = contexts_[ci];
  if (c.set_at_ns != 0 && tick_ns - c.set_at_ns < kReanchorNs) return true;
  if (c.failed_tick_ns == tick_ns) return false;  // one try per context and tick
  // Refreshed now and then so that float milliseconds keep sub-microsecond resolution; if the
  // device does not get to our event within kAnchorSpinNs, keep the old anchor (or wait).
  if (const CuResult rc = g_cu.event_record(c.anchor, c.stream); rc != kCudaSuccess) {
    Disable("anchor cuEventRecord", rc);
    return false;
  }
  const int64_t give_up = SystemMonoNs() + kAnchorSpinNs;
  for (;;) {
    const CuResult q = g_cu.event_query(c.anchor);
    const int64_t t = SystemMonoNs();
    if (q == kCudaSuccess) {
      c.host_ns = t;
      c.set_at_ns = t;
      return true;
    }
    if (q != kCudaNotReady) {
      Disable("anchor cuEventQuery", q);
      return false;
    }
    if (t > give_up) {  // the event was re-recorded, so the old anchor is gone too
      c.set_at_ns = 0;
      c.failed_tick_ns = tick_ns;
      return false;
    }
  }
}

void GpuTimer::Poll(Tracer& tracer) {
  if (!relaxed_) {
    // Invariant 2: this thread's calls must not invalidate a capture in progress elsewhere.
    if (g_cu.thread_exchange_capture_mode != nullptr) {
      int mode = kCaptureModeRelaxed;
      if (const CuResult rc = g_cu.thread_exchange_capture_mode(&mode); rc != kCudaSuccess) {
        Disable("cuThreadExchangeStreamCaptureMode", rc);
        return;
      }
    }
    relaxed_ = true;
  }
  for (int32_t ci = 0; ci < kContexts; ++ci) Prepare(ci);
  const int64_t tick = SystemMonoNs();
  for (int32_t i = 0; i < kPairs; ++i) {
    Pair& p = pairs_[i];
    if (p.state.load(std::memory_order_acquire) != kPending) continue;
    if (!available()) {
      p.state.store(kFree, std::memory_order_release);
      continue;
    }
    const int32_t ci = i / kPairsPerContext;
    if (g_cu.ctx_set_current(contexts_[ci].ctx.load(std::memory_order_relaxed)) != kCudaSuccess) continue;
    const CuResult q = g_cu.event_query(p.end);
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
      if (!Anchor(ci, tick)) {
        if (!available()) p.state.store(kFree, std::memory_order_release);
        continue;  // no anchor yet: try again next tick
      }
      const Context& c = contexts_[ci];
      float start_ms = 0, end_ms = 0;
      if (g_cu.event_elapsed(&start_ms, c.anchor, p.start) == kCudaSuccess &&
          g_cu.event_elapsed(&end_ms, c.anchor, p.end) == kCudaSuccess) {
        r.t_start_ns = c.host_ns + static_cast<int64_t>(static_cast<double>(start_ms) * 1e6);
        r.t_end_ns = c.host_ns + static_cast<int64_t>(static_cast<double>(end_ms) * 1e6);
        r.result = 0;
      }
    }
    if (r.result != 0) r.t_start_ns = now;
    tracer.Publish(r, tracer.SharedLane());
    p.state.store(kFree, std::memory_order_release);
  }
}

void GpuTimer::PollMarks(CommRegistry& comms, int64_t now_ns) {
  for (int32_t ci = 0; ci < kContexts; ++ci) {
    Context& c = contexts_[ci];
    if (!c.ready.load(std::memory_order_acquire)) continue;
    bool current = false;
    for (int32_t k = 0; k < kMarksPerContext; ++k) {
      MarkSlot& m = marks_[ci * kMarksPerContext + k];
      if (m.state.load(std::memory_order_acquire) != kPending) continue;
      if (!available()) {
        m.state.store(kFree, std::memory_order_release);
        continue;
      }
      if (!current) {
        if (g_cu.ctx_set_current(c.ctx.load(std::memory_order_relaxed)) != kCudaSuccess) break;
        current = true;
      }
      const CuResult q = g_cu.event_query(m.event);
      if (q == kCudaNotReady) continue;
      if (q == kCudaSuccess) comms.NoteDone(m.comm_slot, m.seq, now_ns);
      m.state.store(kFree, std::memory_order_release);  // an error: that call stays of unknown state
    }
  }
}

}  // namespace falcon::shim
