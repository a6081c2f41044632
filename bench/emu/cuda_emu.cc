// The CUDA driver emulator: a libcuda.so.1 with the part of the driver API that Falcon's shim
// uses (contexts, streams, events, device memory), on the CPU. Test fabric for the CUDA driver,
// as the NCCL emulator is for NCCL: it lets the shim's GPU paths (CUDA-event timing, device-buffer
// P2P and cuBLAS GEMM validation) run for real in tests on machines without a GPU.
//
// Model: every device is host memory and every stream runs its work at once, so an event is
// complete when recorded and its time is the host's monotonic clock then. Device pointers are
// host pointers, which the NCCL emulator (host buffers) accepts.
// Knobs: FALCON_EMU_CUDA_EVENT_DELAY_S=S makes each event complete only S seconds after it is
// recorded (cuEventQuery answers CUDA_ERROR_NOT_READY until then): a stalled GPU, for testing
// deadlines. FALCON_EMU_CUDA_OOM_RANKS=r1,r2,... makes the processes of those ranks ($RANK) a
// device whose memory is nearly full: cuMemAlloc of 1 MiB or more fails with out of memory.
// Stream capture (CUDA graphs), as strict as the driver where Falcon could lean on a
// difference: cuStreamBeginCapture_v2 / cuStreamEndCapture / cuStreamIsCapturing and the
// per-thread capture mode (cuThreadExchangeStreamCaptureMode). While a capture in global mode
// runs, a "potentially unsafe" call (synchronisation, event or stream queries, allocation,
// anything on the legacy stream) from any thread not in relaxed mode fails with
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates that capture, whose cuStreamEndCapture
// then fails with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED; a thread-local capture is invalidated
// by unsafe calls from its own thread. Captured work is not replayed (no graph launches).
// Thread-safety: the current context is per thread, as in the driver. Streams, events and device
// memory are heap objects the emulated driver keeps track of (as the real one does), so what a
// program never frees is released at exit, not reported as a leak. Unknown handles are not
// detected (as in the driver: undefined).
#include <time.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_set>

namespace {

using CuResult = int;
constexpr CuResult kSuccess = 0;
constexpr CuResult kInvalidValue = 1;
constexpr CuResult kOutOfMemory = 2;
constexpr CuResult kNotInitialized = 3;
constexpr CuResult kInvalidDevice = 101;
constexpr CuResult kInvalidContext = 201;
constexpr CuResult kInvalidHandle = 400;
constexpr CuResult kNotReady = 600;
constexpr CuResult kCaptureUnsupported = 900;
constexpr CuResult kCaptureInvalidated = 901;
constexpr CuResult kCaptureWrongThread = 908;
constexpr int kModeGlobal = 0;
constexpr int kModeThreadLocal = 1;
constexpr int kModeRelaxed = 2;
constexpr int kDevices = 8;

struct Context {
  int device;
};
Context g_contexts[kDevices] = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}};
std::atomic<bool> g_initialised{false};
// Static TLS (initial-exec), as the shim uses: LeakSanitizer crashed scanning a dlopen-ed
// library's dynamic TLS in threads that had touched it.
__attribute__((tls_model("initial-exec"))) thread_local Context* t_current = nullptr;

struct Stream {
  Context* ctx;
  int capture_status;  // 0 none, 1 active, 2 invalidated (CUstreamCaptureStatus)
  int capture_mode;
  const void* capture_thread;
};

// The calling thread's capture mode (cuThreadExchangeStreamCaptureMode), and a token naming it.
__attribute__((tls_model("initial-exec"))) thread_local int t_capture_mode = kModeGlobal;
__attribute__((tls_model("initial-exec"))) thread_local char t_thread_token = 0;

// Streams being captured now.
std::mutex g_capture_mu;
std::unordered_set<Stream*>& Capturing() {
  static auto* streams = new std::unordered_set<Stream*>();  // reachable for the process's life
  return *streams;
}

// A potentially unsafe call: invalidates the captures it would disturb (see the file comment)
// and fails if it disturbed any.
CuResult UnsafeCall() {
  if (t_capture_mode == kModeRelaxed) return 0;
  std::lock_guard<std::mutex> lock(g_capture_mu);
  bool disturbed = false;
  for (Stream* st : Capturing()) {
    const bool own = st->capture_thread == &t_thread_token;
    if (st->capture_status == 1 && (st->capture_mode == kModeGlobal || (own && st->capture_mode == kModeThreadLocal))) {
      st->capture_status = 2;
      disturbed = true;
    }
  }
  return disturbed ? kCaptureUnsupported : 0;
}
struct Event {
  Context* ctx;
  int64_t recorded_ns;  // -1: never recorded
};

// Every live stream, event and allocation: the driver's, until destroyed or freed.
std::mutex g_objects_mu;
std::unordered_set<void*>& Objects() {
  static auto* objects = new std::unordered_set<void*>();  // reachable for the process's life
  return *objects;
}
void Track(void* p) {
  std::lock_guard<std::mutex> lock(g_objects_mu);
  Objects().insert(p);
}
void Release(void* p) {
  {
    std::lock_guard<std::mutex> lock(g_objects_mu);
    Objects().erase(p);
  }
  std::free(p);
}

int64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

int64_t EventDelayNs() {
  static const int64_t delay = [] {
    const char* v = std::getenv("FALCON_EMU_CUDA_EVENT_DELAY_S");
    const double s = v != nullptr ? std::atof(v) : 0.0;
    return s > 0 ? static_cast<int64_t>(s * 1e9) : int64_t{0};
  }();
  return delay;
}

// FALCON_EMU_CUDA_OOM_RANKS lists this process's $RANK.
bool DeviceNearlyFull() {
  static const bool full = [] {
    const char* ranks = std::getenv("FALCON_EMU_CUDA_OOM_RANKS");
    const char* me = std::getenv("RANK");
    if (ranks == nullptr || me == nullptr || *me == '\0') return false;
    const std::string list = std::string(",") + ranks + ",";
    return list.find(std::string(",") + me + ",") != std::string::npos;
  }();
  return full;
}

CuResult NeedContext() {
  if (!g_initialised.load(std::memory_order_acquire)) return kNotInitialized;
  return t_current != nullptr ? kSuccess : kInvalidContext;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) CuResult cuInit(unsigned flags) {
  if (flags != 0) return kInvalidValue;
  g_initialised.store(true, std::memory_order_release);
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuDriverGetVersion(int* version) {
  if (version == nullptr) return kInvalidValue;
  *version = 13000;
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuDeviceGetCount(int* count) {
  if (!g_initialised.load(std::memory_order_acquire)) return kNotInitialized;
  if (count == nullptr) return kInvalidValue;
  *count = kDevices;
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuDeviceGet(int* device, int ordinal) {
  if (!g_initialised.load(std::memory_order_acquire)) return kNotInitialized;
  if (device == nullptr) return kInvalidValue;
  if (ordinal < 0 || ordinal >= kDevices) return kInvalidDevice;
  *device = ordinal;
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuDevicePrimaryCtxRetain(void** ctx, int device) {
  if (!g_initialised.load(std::memory_order_acquire)) return kNotInitialized;
  if (ctx == nullptr) return kInvalidValue;
  if (device < 0 || device >= kDevices) return kInvalidDevice;
  *ctx = &g_contexts[device];
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuCtxSetCurrent(void* ctx) {
  if (!g_initialised.load(std::memory_order_acquire)) return kNotInitialized;
  t_current = static_cast<Context*>(ctx);
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuCtxGetCurrent(void** ctx) {
  if (!g_initialised.load(std::memory_order_acquire)) return kNotInitialized;
  if (ctx == nullptr) return kInvalidValue;
  *ctx = t_current;
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuCtxSynchronize() {
  if (const CuResult rc = NeedContext(); rc != kSuccess) return rc;
  return UnsafeCall();
}

__attribute__((visibility("default"))) CuResult cuStreamCreate(void** stream, unsigned /*flags*/) {
  if (const CuResult rc = NeedContext(); rc != kSuccess) return rc;
  if (stream == nullptr) return kInvalidValue;
  auto* s = static_cast<Stream*>(std::malloc(sizeof(Stream)));
  if (s == nullptr) return kOutOfMemory;
  s->ctx = t_current;
  s->capture_status = 0;
  s->capture_mode = kModeGlobal;
  s->capture_thread = nullptr;
  Track(s);
  *stream = s;
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuStreamDestroy_v2(void* stream) {
  if (stream == nullptr) return kInvalidHandle;
  {
    std::lock_guard<std::mutex> lock(g_capture_mu);
    Capturing().erase(static_cast<Stream*>(stream));
  }
  Release(stream);
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuStreamSynchronize(void* /*stream*/) {
  if (const CuResult rc = NeedContext(); rc != kSuccess) return rc;
  return UnsafeCall();
}

__attribute__((visibility("default"))) CuResult cuStreamQuery(void* /*stream*/) {
  if (const CuResult rc = NeedContext(); rc != kSuccess) return rc;
  return UnsafeCall();
}

__attribute__((visibility("default"))) CuResult cuThreadExchangeStreamCaptureMode(int* mode) {
  if (mode == nullptr || *mode < kModeGlobal || *mode > kModeRelaxed) return kInvalidValue;
  const int old = t_capture_mode;
  t_capture_mode = *mode;
  *mode = old;
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuStreamBeginCapture_v2(void* stream, int mode) {
  if (const CuResult rc = NeedContext(); rc != kSuccess) return rc;
  if (stream == nullptr) return kCaptureUnsupported;  // the legacy stream cannot be captured
  if (mode < kModeGlobal || mode > kModeRelaxed) return kInvalidValue;
  auto* st = static_cast<Stream*>(stream);
  std::lock_guard<std::mutex> lock(g_capture_mu);
  if (st->capture_status != 0) return kCaptureUnsupported;
  st->capture_status = 1;
  st->capture_mode = mode;
  st->capture_thread = &t_thread_token;
  Capturing().insert(st);
  return kSuccess;
}

// Ends the capture; *graph gets a non-null token on success (graphs are not instantiated).
__attribute__((visibility("default"))) CuResult cuStreamEndCapture(void* stream, void** graph) {
  if (stream == nullptr || graph == nullptr) return kInvalidValue;
  auto* st = static_cast<Stream*>(stream);
  std::lock_guard<std::mutex> lock(g_capture_mu);
  if (st->capture_status == 0) return kInvalidValue;
  if (st->capture_mode != kModeRelaxed && st->capture_thread != &t_thread_token) return kCaptureWrongThread;
  const bool invalidated = st->capture_status == 2;
  st->capture_status = 0;
  st->capture_thread = nullptr;
  Capturing().erase(st);
  *graph = invalidated ? nullptr : stream;
  return invalidated ? kCaptureInvalidated : kSuccess;
}

__attribute__((visibility("default"))) CuResult cuStreamIsCapturing(void* stream, int* status) {
  if (const CuResult rc = NeedContext(); rc != kSuccess) return rc;
  if (status == nullptr) return kInvalidValue;
  if (stream == nullptr) {  // the legacy stream: reports active while a global capture runs
    std::lock_guard<std::mutex> lock(g_capture_mu);
    *status = 0;
    for (const Stream* st : Capturing()) {
      if (st->capture_mode == kModeGlobal && st->capture_status == 1) *status = 1;
    }
    return kSuccess;
  }
  std::lock_guard<std::mutex> lock(g_capture_mu);
  *status = static_cast<const Stream*>(stream)->capture_status;
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuEventCreate(void** event, unsigned /*flags*/) {
  if (const CuResult rc = NeedContext(); rc != kSuccess) return rc;
  if (event == nullptr) return kInvalidValue;
  auto* e = static_cast<Event*>(std::malloc(sizeof(Event)));
  if (e == nullptr) return kOutOfMemory;
  e->ctx = t_current;
  e->recorded_ns = -1;
  Track(e);
  *event = e;
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuEventDestroy_v2(void* event) {
  if (event == nullptr) return kInvalidHandle;
  Release(event);
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuEventRecord(void* event, void* stream) {
  if (const CuResult rc = NeedContext(); rc != kSuccess) return rc;
  if (event == nullptr) return kInvalidHandle;
  if (stream == nullptr) {  // the legacy stream waits for every blocking stream: unsafe
    if (const CuResult rc = UnsafeCall(); rc != kSuccess) return rc;
  }
  static_cast<Event*>(event)->recorded_ns = NowNs();  // the stream's earlier work is done: it ran at once
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuEventQuery(void* event) {
  if (event == nullptr) return kInvalidHandle;
  if (const CuResult rc = UnsafeCall(); rc != kSuccess) return rc;
  const int64_t at = static_cast<const Event*>(event)->recorded_ns;
  return at >= 0 && NowNs() < at + EventDelayNs() ? kNotReady : kSuccess;
}

__attribute__((visibility("default"))) CuResult cuEventSynchronize(void* event) {
  if (event == nullptr) return kInvalidHandle;
  if (const CuResult rc = UnsafeCall(); rc != kSuccess) return rc;
  const int64_t at = static_cast<const Event*>(event)->recorded_ns;
  if (at >= 0) {
    const int64_t wait = at + EventDelayNs() - NowNs();
    if (wait > 0) {
      timespec ts{static_cast<time_t>(wait / 1'000'000'000), static_cast<long>(wait % 1'000'000'000)};
      nanosleep(&ts, nullptr);
    }
  }
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuEventElapsedTime_v2(float* ms, void* start, void* end) {
  if (ms == nullptr) return kInvalidValue;
  if (start == nullptr || end == nullptr) return kInvalidHandle;
  const int64_t a = static_cast<const Event*>(start)->recorded_ns, b = static_cast<const Event*>(end)->recorded_ns;
  if (a < 0 || b < 0) return kInvalidHandle;  // as the driver: an event never recorded
  const int64_t now = NowNs();
  if (now < a + EventDelayNs() || now < b + EventDelayNs()) return kNotReady;
  *ms = static_cast<float>(static_cast<double>(b - a) / 1e6);
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuEventElapsedTime(float* ms, void* start, void* end) {
  return cuEventElapsedTime_v2(ms, start, end);
}

__attribute__((visibility("default"))) CuResult cuMemAlloc_v2(unsigned long long* dptr, size_t bytes) {
  if (const CuResult rc = NeedContext(); rc != kSuccess) return rc;
  if (const CuResult rc = UnsafeCall(); rc != kSuccess) return rc;
  if (dptr == nullptr || bytes == 0) return kInvalidValue;
  if (DeviceNearlyFull() && bytes >= (size_t{1} << 20)) return kOutOfMemory;
  void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (p == nullptr) return kOutOfMemory;
  Track(p);
  *dptr = reinterpret_cast<uintptr_t>(p);
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuMemFree_v2(unsigned long long dptr) {
  if (const CuResult rc = NeedContext(); rc != kSuccess) return rc;
  if (const CuResult rc = UnsafeCall(); rc != kSuccess) return rc;
  if (dptr != 0) Release(reinterpret_cast<void*>(static_cast<uintptr_t>(dptr)));
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuMemsetD32Async(unsigned long long dptr, unsigned value, size_t n,
                                                                  void* /*stream*/) {
  if (const CuResult rc = NeedContext(); rc != kSuccess) return rc;
  auto* p = reinterpret_cast<uint32_t*>(static_cast<uintptr_t>(dptr));
  for (size_t i = 0; i < n; ++i) p[i] = value;
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuMemsetD32_v2(unsigned long long dptr, unsigned value, size_t n) {
  return cuMemsetD32Async(dptr, value, n, nullptr);
}

__attribute__((visibility("default"))) CuResult cuGetErrorString(CuResult error, const char** str) {
  if (str == nullptr) return kInvalidValue;
  switch (error) {
    case kSuccess: *str = "no error"; break;
    case kInvalidValue: *str = "invalid argument"; break;
    case kOutOfMemory: *str = "out of memory"; break;
    case kNotInitialized: *str = "initialization error"; break;
    case kInvalidDevice: *str = "invalid device ordinal"; break;
    case kInvalidContext: *str = "invalid device context"; break;
    case kInvalidHandle: *str = "invalid resource handle"; break;
    case kNotReady: *str = "device not ready"; break;
    case kCaptureUnsupported: *str = "operation not permitted when stream is capturing"; break;
    case kCaptureInvalidated: *str = "operation failed due to a previous error during capture"; break;
    case kCaptureWrongThread: *str = "attempt to terminate a thread-local capture sequence from another thread"; break;
    default: *str = nullptr; return kInvalidValue;
  }
  return kSuccess;
}

}  // extern "C"
