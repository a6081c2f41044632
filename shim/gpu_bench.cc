// Validation benchmarks on the GPU: see gpu_bench.h.
// The driver's entry points come from cuda_driver.h; cuBLAS's types below mirror its ABI
// (cublas_api.h): handles are opaque pointers, statuses ints; so the shim needs neither header.
#include "shim/gpu_bench.h"

#include <dlfcn.h>
#include <nccl.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "shim/cuda_driver.h"
#include "shim/fast_clock.h"
#include "shim/log.h"
#include "shim/real_nccl.h"

namespace falcon::shim {
namespace {

constexpr unsigned kStreamNonBlocking = 0x1;
constexpr int kCublasOpN = 0;
constexpr int kCublasSuccess = 0;
constexpr uint32_t kMaxRepeats = 1000;
constexpr int kMaxContexts = 16;
constexpr size_t kMaxFences = 32;  // job streams a GEMM fences against

// cudaDataType_t / cublasComputeType_t / cublasGemmAlgo_t values (library_types.h, cublas_api.h).
constexpr int kCudaR16F = 2;
constexpr int kCudaR16Bf = 14;
constexpr int kCublasCompute32F = 68;
constexpr int kCublasGemmDefault = -1;

struct Cublas {
  bool ok = false;
  int (*create)(void**) = nullptr;
  int (*set_stream)(void*, void*) = nullptr;
  int (*sgemm)(void*, int, int, int, int, int, const float*, const float*, int, const float*, int, const float*,
               float*, int) = nullptr;
  // Optional (bf16 / fp16 tasks are unsupported without it).
  int (*gemm_ex)(void*, int, int, int, int, int, const void*, const void*, int, int, const void*, int, int,
                 const void*, void*, int, int, int, int) = nullptr;
};

// Bytes per element and the 32-bit fill pattern of 0.25 (inputs that keep every product finite).
struct GemmElement {
  size_t bytes;
  unsigned fill32;
  int cuda_type;  // for cublasGemmEx; unused for fp32
  const char* name;
};
GemmElement ElementOf(uint8_t dtype) {
  switch (dtype) {
    case kFalconGemmBf16: return {2, 0x3e803e80u, kCudaR16Bf, "bf16"};
    case kFalconGemmF16: return {2, 0x34003400u, kCudaR16F, "fp16"};
    default: return {4, 0x3e800000u, 0, "fp32"};
  }
}

template <typename Fn>
bool Load(void* lib, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(lib, name));
  return *out != nullptr;
}

// The driver, when it is loaded and has every entry point the benchmarks use; else nullptr.
const CudaDriver* BenchDriver() {
  const CudaDriver* d = LoadedCudaDriver();
  if (d == nullptr) return nullptr;
  if (d->ctx_get_current == nullptr || d->mem_alloc == nullptr || d->mem_free == nullptr ||
      d->memset_d32_async == nullptr || d->stream_create == nullptr || d->event_create == nullptr ||
      d->event_destroy == nullptr || d->event_record == nullptr || d->event_query == nullptr ||
      d->event_elapsed == nullptr) {
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true)) {
      Log(LogLevel::kWarn, "the CUDA driver lacks entry points the GPU benchmarks need; they are off");
    }
    return nullptr;
  }
  return d;
}

const Cublas& TheCublas() {
  static const Cublas c = [] {
    Cublas x;
    const char* names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so.11", "libcublas.so"};
    void* lib = nullptr;
    for (const char* n : names) {  // the process's own cuBLAS first: never load a second one
      if (lib == nullptr) lib = dlopen(n, RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
    }
    const char* env = std::getenv("FALCON_CUBLAS");
    if (lib == nullptr && env != nullptr && env[0] != '\0') {
      lib = dlopen(env, RTLD_LAZY | RTLD_LOCAL);
      if (lib == nullptr) Log(LogLevel::kWarn, "FALCON_CUBLAS=%s cannot be loaded: %s", env, dlerror());
    }
    for (const char* n : names) {
      if (lib == nullptr) lib = dlopen(n, RTLD_LAZY | RTLD_LOCAL);
    }
    if (lib == nullptr) {
      Log(LogLevel::kWarn, "no cuBLAS could be loaded (set FALCON_CUBLAS to its path): GEMM validation is off");
      return x;
    }
    x.ok = Load(lib, "cublasCreate_v2", &x.create) && Load(lib, "cublasSetStream_v2", &x.set_stream) &&
           Load(lib, "cublasSgemm_v2", &x.sgemm);
    Load(lib, "cublasGemmEx", &x.gemm_ex);
    if (!x.ok) Log(LogLevel::kWarn, "the loaded cuBLAS lacks cublasCreate_v2/SetStream_v2/Sgemm_v2: GEMM validation is off");
    return x;
  }();
  return c;
}

// Falcon's stream and cuBLAS handle per context, made on first use and kept.
struct ContextState {
  void* ctx = nullptr;
  void* stream = nullptr;
  void* cublas = nullptr;
};
std::mutex g_contexts_mu;
ContextState g_contexts[kMaxContexts];

ContextState* StateFor(const CudaDriver& cu, void* ctx) {
  std::lock_guard<std::mutex> lock(g_contexts_mu);
  for (ContextState& s : g_contexts) {
    if (s.ctx == ctx) return &s;
    if (s.ctx == nullptr) {
      if (const CuResult rc = cu.stream_create(&s.stream, kStreamNonBlocking); rc != kCudaSuccess) {
        Log(LogLevel::kWarn, "GPU benchmark: cuStreamCreate failed (CUresult %d)", rc);
        return nullptr;
      }
      s.ctx = ctx;
      return &s;
    }
  }
  Log(LogLevel::kWarn, "GPU benchmark: more than %d CUDA contexts in this process", kMaxContexts);
  return nullptr;
}

void* CurrentContext(const CudaDriver* cu) {
  void* ctx = nullptr;
  if (cu == nullptr || cu->ctx_get_current(&ctx) != kCudaSuccess) return nullptr;
  return ctx;
}

// Device memory and events of one task. Released at the end unless the work may still be
// running (a missed deadline): then leaked on purpose.
class TaskResources {
 public:
  static constexpr size_t kMaxEvents = kMaxRepeats + 2 + kMaxFences;
  explicit TaskResources(const CudaDriver& cu) : cu_(cu) {}
  TaskResources(const TaskResources&) = delete;
  TaskResources& operator=(const TaskResources&) = delete;
  ~TaskResources() {
    if (leak_) return;
    for (size_t i = 0; i < n_events_; ++i) cu_.event_destroy(events_[i]);
    for (size_t i = 0; i < n_buffers_; ++i) cu_.mem_free(buffers_[i]);
  }
  CuDevicePtr Alloc(size_t bytes, CuResult* rc) {
    CuDevicePtr p = 0;
    *rc = n_buffers_ < kMaxBuffers ? cu_.mem_alloc(&p, bytes) : -1;
    if (*rc != kCudaSuccess) return 0;
    buffers_[n_buffers_++] = p;
    return p;
  }
  bool MakeEvents(size_t n) {
    if (n > kMaxEvents) return false;
    while (n_events_ < n) {
      void* e = nullptr;
      if (cu_.event_create(&e, 0) != kCudaSuccess) return false;
      events_[n_events_++] = e;
    }
    return true;
  }
  void* event(size_t i) const { return events_[i]; }
  void Leak() { leak_ = true; }

 private:
  static constexpr size_t kMaxBuffers = 3;
  const CudaDriver& cu_;
  CuDevicePtr buffers_[kMaxBuffers] = {};
  size_t n_buffers_ = 0;
  void* events_[kMaxEvents] = {};
  size_t n_events_ = 0;
  bool leak_ = false;
};

// Polls `e` until it completed, failed, or the deadline passed.
CuResult WaitEvent(const CudaDriver& cu, void* e, int64_t deadline_mono_ns) {
  long sleep_ns = 20'000;
  for (;;) {
    const CuResult q = cu.event_query(e);
    if (q != kCudaNotReady) return q;
    if (SystemMonoNs() > deadline_mono_ns) return kCudaNotReady;
    timespec ts{0, sleep_ns};
    nanosleep(&ts, nullptr);
    sleep_ns = std::min(sleep_ns * 2, 1'000'000L);
  }
}

// Fills r from events 0..repeats (sample i = event i -> event i+1).
FalconTaskResult Summarise(const CudaDriver& cu, const TaskResources& res, uint32_t repeats, double work,
                           FalconTaskResult r) {
  double samples[kMaxRepeats] = {};
  if (repeats == 0 || repeats > kMaxRepeats) return r;
  for (uint32_t i = 0; i < repeats; ++i) {
    float ms = 0;
    if (const CuResult rc = cu.event_elapsed(&ms, res.event(i), res.event(i + 1)); rc != kCudaSuccess) {
      Log(LogLevel::kWarn, "GPU benchmark: cuEventElapsedTime failed (CUresult %d)", rc);
      r.status = kFalconTaskFailed;
      return r;
    }
    samples[i] = static_cast<double>(ms) / 1e3;
  }
  std::sort(samples, samples + repeats);
  r.median_s = samples[repeats / 2];
  r.min_s = samples[0];
  r.max_s = samples[repeats - 1];
  r.rate = r.median_s > 0 ? work / r.median_s / 1e9 : 0.0;
  r.status = kFalconTaskOk;
  return r;
}

// Waits for the last event and summarises; on a missed deadline, leaks the task's resources.
FalconTaskResult Complete(const CudaDriver& cu, TaskResources& res, uint32_t repeats, double work, const char* what,
                          int64_t deadline_mono_ns, FalconTaskResult r) {
  const CuResult rc = WaitEvent(cu, res.event(repeats), deadline_mono_ns);
  if (rc == kCudaNotReady) {
    Log(LogLevel::kWarn, "GPU benchmark %s did not finish before the pause's deadline; its buffers are left to the device",
        what);
    res.Leak();
    r.status = kFalconTaskFailed;
    return r;
  }
  if (rc != kCudaSuccess) {
    Log(LogLevel::kWarn, "GPU benchmark %s failed on the device (CUresult %d)", what, rc);
    r.status = kFalconTaskFailed;
    return r;
  }
  return Summarise(cu, res, repeats, work, r);
}

// After a failure part-way: waits (bounded) for whatever was queued, so the buffers can be
// freed; leaks them when that cannot be known. The task's last event is the fence.
void Drain(const CudaDriver& cu, TaskResources& res, size_t fence, void* stream, int64_t deadline_mono_ns) {
  if (cu.event_record(res.event(fence), stream) != kCudaSuccess ||
      WaitEvent(cu, res.event(fence), deadline_mono_ns) != kCudaSuccess) {
    res.Leak();
  }
}

// The fence before a timed GEMM: an event recorded on each of the job's streams in context `ctx`
// (events first..), a bounded wait until all have completed, then Falcon's stream made to wait
// for each (already complete: it orders, never blocks), so the timed region measures the GEMM
// alone, never the job's queued work, and Falcon's stream is never left waiting on the job. A
// stream being captured, or of another context, is skipped (recording into it would alter a
// graph or fail). False if the job's work did not finish by the deadline (or the driver refused).
bool FenceJobWork(const CudaDriver& cu, void* ctx, void* stream, const GpuJobStreams& job, TaskResources& res,
                  size_t first, int64_t deadline_mono_ns) {
  size_t used = 0;
  for (size_t i = 0; i < job.n && i < kMaxFences; ++i) {
    void* s = job.streams[i];
    void* owner = nullptr;
    if (cu.stream_get_ctx != nullptr && (cu.stream_get_ctx(s, &owner) != kCudaSuccess || owner != ctx)) continue;
    int status = 0;
    if (cu.stream_is_capturing == nullptr || cu.stream_is_capturing(s, &status) != kCudaSuccess || status != 0) continue;
    if (cu.event_record(res.event(first + used), s) == kCudaSuccess) ++used;  // else a stream the job destroyed
  }
  for (size_t i = 0; i < used; ++i) {
    const CuResult rc = WaitEvent(cu, res.event(first + i), deadline_mono_ns);
    if (rc == kCudaNotReady) {
      Log(LogLevel::kWarn, "GPU benchmark GEMM: the job's queued device work did not finish before the pause's "
                           "deadline; the GEMM was not run");
      return false;
    }
    if (rc != kCudaSuccess) return false;
    if (cu.stream_wait_event != nullptr && cu.stream_wait_event(stream, res.event(first + i), 0) != kCudaSuccess) {
      return false;
    }
  }
  return true;
}

}  // namespace

bool GpuBenchWanted() { return CurrentContext(BenchDriver()) != nullptr; }

FalconTaskResult GpuGemm(const FalconTask& t, FalconTaskResult r, const GpuJobStreams& job, int64_t deadline_mono_ns) {
  r.timing_source = kFalconTimingCudaEvents;
  r.status = kFalconTaskFailed;
  const CudaDriver* driver = BenchDriver();
  void* ctx = CurrentContext(driver);
  if (ctx == nullptr) return r;
  const CudaDriver& cu = *driver;
  const Cublas& blas = TheCublas();
  const GemmElement el = ElementOf(t.dtype);
  r.dtype = t.dtype;
  if (!blas.ok || (t.dtype != kFalconGemmF32 && blas.gemm_ex == nullptr)) {
    if (blas.ok) {
      Log(LogLevel::kWarn, "GPU benchmark: the loaded cuBLAS lacks cublasGemmEx: %s GEMM is unsupported", el.name);
    }
    r.status = kFalconTaskUnsupported;
    return r;
  }
  ContextState* st = StateFor(cu, ctx);
  if (st == nullptr) return r;
  if (st->cublas == nullptr) {
    if (const int s = blas.create(&st->cublas); s != kCublasSuccess) {
      st->cublas = nullptr;
      Log(LogLevel::kWarn, "GPU benchmark: cublasCreate failed (status %d)", s);
      return r;
    }
  }
  // Every time (it is cheap): the GEMMs must run on the stream the events are recorded on.
  if (const int s = blas.set_stream(st->cublas, st->stream); s != kCublasSuccess) {
    Log(LogLevel::kWarn, "GPU benchmark: cublasSetStream failed (status %d)", s);
    return r;
  }
  TaskResources res(cu);
  // One per repetition boundary, a drain fence, and one per job stream for the job fence.
  if (!res.MakeEvents(t.repeats + 2 + std::min(job.n, kMaxFences))) {
    Log(LogLevel::kWarn, "GPU benchmark: cuEventCreate failed");
    return r;
  }
  // Before anything is allocated: a fence that times out leaves nothing the device may use.
  if (!FenceJobWork(cu, ctx, st->stream, job, res, t.repeats + 2, deadline_mono_ns)) return r;
  // A and B are read only, so they share one buffer (filled once); with beta = 0 cuBLAS never
  // reads C, so C is not filled. Two buffers instead of three, one fill instead of three: less
  // of the device's memory held while the job is paused, and less time before the first GEMM.
  const size_t a_n = size_t{t.m} * t.k, b_n = size_t{t.k} * t.n, c_n = size_t{t.m} * t.n;
  // Sizes rounded up to whole 32-bit words, the fill's unit.
  const size_t in_bytes = (std::max(a_n, b_n) * el.bytes + 3) / 4 * 4, c_bytes = (c_n * el.bytes + 3) / 4 * 4;
  CuResult rc = kCudaSuccess;
  const CuDevicePtr in = res.Alloc(in_bytes, &rc);
  const CuDevicePtr c = rc == kCudaSuccess ? res.Alloc(c_bytes, &rc) : 0;
  if (rc != kCudaSuccess) {
    Log(LogLevel::kWarn, "GPU benchmark: cannot allocate %zu bytes for a %ux%ux%u %s GEMM (CUresult %d)",
        in_bytes + c_bytes, t.m, t.n, t.k, el.name, rc);
    return r;
  }
  rc = cu.memset_d32_async(in, el.fill32, in_bytes / 4, st->stream);
  if (rc != kCudaSuccess) {
    Log(LogLevel::kWarn, "GPU benchmark: cuMemsetD32Async failed (CUresult %d)", rc);
    Drain(cu, res, t.repeats + 1, st->stream, deadline_mono_ns);
    return r;
  }
  const float alpha = 1.0f, beta = 0.0f;
  const int m = static_cast<int>(t.m), n = static_cast<int>(t.n), k = static_cast<int>(t.k);
  // Column-major C(m x n) = A(m x k) B(k x n), fp32 accumulation for every type.
  auto gemm = [&]() -> int {
    if (t.dtype == kFalconGemmF32) {
      auto* p = reinterpret_cast<const float*>(in);
      return blas.sgemm(st->cublas, kCublasOpN, kCublasOpN, m, n, k, &alpha, p, m, p, k, &beta,
                        reinterpret_cast<float*>(c), m);
    }
    auto* p = reinterpret_cast<const void*>(in);
    return blas.gemm_ex(st->cublas, kCublasOpN, kCublasOpN, m, n, k, &alpha, p, el.cuda_type, m, p, el.cuda_type, k,
                        &beta, reinterpret_cast<void*>(c), el.cuda_type, m, kCublasCompute32F, kCublasGemmDefault);
  };
  // The first call is the untimed warm-up.
  int s = gemm();
  if (s == kCublasSuccess && cu.event_record(res.event(0), st->stream) != kCudaSuccess) s = -1;
  for (uint32_t i = 0; i < t.repeats && s == kCublasSuccess; ++i) {
    s = gemm();
    if (s == kCublasSuccess && cu.event_record(res.event(i + 1), st->stream) != kCudaSuccess) s = -1;
  }
  if (s != kCublasSuccess) {
    Log(LogLevel::kWarn, "GPU benchmark: %s GEMM or cuEventRecord failed (status %d)", el.name, s);
    Drain(cu, res, t.repeats + 1, st->stream, deadline_mono_ns);
    return r;
  }
  const double flops = 2.0 * static_cast<double>(t.m) * t.n * t.k;
  return Complete(cu, res, t.repeats, flops, "GEMM", deadline_mono_ns, r);
}

bool GpuAllocP2pBuffers(uint64_t bytes, GpuP2pBuffers* out) {
  *out = GpuP2pBuffers{};
  const CudaDriver* driver = BenchDriver();
  void* ctx = CurrentContext(driver);
  if (ctx == nullptr || bytes == 0) return false;
  const CudaDriver& cu = *driver;
  ContextState* st = StateFor(cu, ctx);
  if (st == nullptr) return false;
  GpuP2pBuffers b;
  CuResult rc = cu.mem_alloc(&b.send, bytes);
  if (rc == kCudaSuccess) rc = cu.mem_alloc(&b.recv, bytes);
  // On Falcon's own stream, which the transfers use too (ordered after this fill).
  if (rc == kCudaSuccess && bytes >= 4) rc = cu.memset_d32_async(b.send, 0x5a5a5a5au, bytes / 4, st->stream);
  if (rc != kCudaSuccess) {
    Log(LogLevel::kWarn, "GPU benchmark: cannot allocate 2 x %llu bytes for P2P transfers (CUresult %d)",
        static_cast<unsigned long long>(bytes), rc);
    if (b.send != 0) cu.mem_free(b.send);
    if (b.recv != 0) cu.mem_free(b.recv);
    return false;
  }
  *out = b;
  return true;
}

void GpuFreeP2pBuffers(const GpuP2pBuffers& buffers) {
  const CudaDriver* driver = BenchDriver();
  if (driver == nullptr) return;
  if (buffers.send != 0) driver->mem_free(buffers.send);
  if (buffers.recv != 0) driver->mem_free(buffers.recv);
}

int FinishNonblockingGroup(void* comm_handle, int end_result, int64_t deadline_mono_ns) {
  const auto end = static_cast<ncclResult_t>(end_result);
  auto* comm = static_cast<ncclComm_t>(comm_handle);
  if (end != ncclInProgress) return end;
  auto poll = RealSymbol<decltype(&pncclCommGetAsyncError)>(kFalconOpCommGetAsyncError);
  if (poll == nullptr) return ncclInternalError;
  long sleep_ns = 10'000;
  for (;;) {
    ncclResult_t async = ncclInProgress;
    const ncclResult_t r = poll(comm, &async);
    if (r != ncclSuccess) return r;
    if (async != ncclInProgress) return async;
    if (SystemMonoNs() > deadline_mono_ns) return ncclInProgress;
    timespec ts{0, sleep_ns};
    nanosleep(&ts, nullptr);
    sleep_ns = std::min(sleep_ns * 2, 1'000'000L);
  }
}

FalconTaskResult GpuP2p(const FalconTask& t, FalconTaskResult r, void* comm, const GpuP2pBuffers& buffers,
                        const GpuP2pObserver& observer, int64_t deadline_mono_ns) {
  r.timing_source = kFalconTimingCudaEvents;
  r.status = kFalconTaskFailed;
  const CudaDriver* driver = BenchDriver();
  void* ctx = CurrentContext(driver);
  if (ctx == nullptr || buffers.send == 0 || buffers.recv == 0) return r;
  const CudaDriver& cu = *driver;
  auto group_start = RealSymbol<decltype(&pncclGroupStart)>(kFalconOpGroupStart);
  auto group_end = RealSymbol<decltype(&pncclGroupEnd)>(kFalconOpGroupEnd);
  auto send = RealSymbol<decltype(&pncclSend)>(kFalconOpSend);
  auto recv = RealSymbol<decltype(&pncclRecv)>(kFalconOpRecv);
  ContextState* st = StateFor(cu, ctx);
  if (st == nullptr || group_start == nullptr || group_end == nullptr || send == nullptr || recv == nullptr) return r;
  TaskResources res(cu);
  if (!res.MakeEvents(t.repeats + 2)) {  // one per repetition boundary, and a fence
    Log(LogLevel::kWarn, "GPU benchmark: cuEventCreate failed");
    return r;
  }
  auto* stream = static_cast<cudaStream_t>(st->stream);
  auto* nccl_comm = static_cast<ncclComm_t>(comm);
  bool ok = true;
  for (uint32_t rep = 0; rep <= t.repeats && ok; ++rep) {  // rep 0: the untimed warm-up
    // The warm-up only sets up connections: a full-size one over a slow link would lengthen the pause.
    const uint64_t bytes = rep == 0 ? std::min<uint64_t>(t.bytes, FALCON_P2P_WARMUP_BYTES) : t.bytes;
    const int64_t t0 = SystemMonoNs();
    ncclResult_t res_nccl = group_start();
    if (res_nccl == ncclSuccess && t.send_peer >= 0) {
      res_nccl = send(reinterpret_cast<const void*>(buffers.send), bytes, ncclInt8, t.send_peer, nccl_comm, stream);
    }
    if (res_nccl == ncclSuccess && t.recv_peer >= 0) {
      res_nccl = recv(reinterpret_cast<void*>(buffers.recv), bytes, ncclInt8, t.recv_peer, nccl_comm, stream);
    }
    const auto end = static_cast<ncclResult_t>(FinishNonblockingGroup(nccl_comm, group_end(), deadline_mono_ns));
    if (res_nccl == ncclSuccess) res_nccl = end;
    const int64_t t1 = SystemMonoNs();
    if (observer.on_call != nullptr) observer.on_call(observer.ctx, t0, t1, bytes, static_cast<int>(res_nccl));
    if (res_nccl != ncclSuccess) {
      Log(LogLevel::kWarn, "GPU benchmark p2p failed: NCCL result %d", static_cast<int>(res_nccl));
      ok = false;
    } else if (cu.event_record(res.event(rep), st->stream) != kCudaSuccess) {
      ok = false;
    }
  }
  if (!ok) {
    Drain(cu, res, t.repeats + 1, st->stream, deadline_mono_ns);
    return r;
  }
  return Complete(cu, res, t.repeats, static_cast<double>(t.bytes), "P2P", deadline_mono_ns, r);
}

}  // namespace falcon::shim
