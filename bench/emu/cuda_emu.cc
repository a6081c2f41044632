// The CUDA driver emulator: a libcuda.so.1 with the part of the driver API that Falcon's shim,
// the NCCL emulator and test programs use (contexts, streams, events, device memory, copies,
// host functions, stream capture and graphs), on the CPU. Test fabric for the CUDA driver, as the
// NCCL emulator is for NCCL: it lets the shim's GPU paths (CUDA-event timing, device-buffer P2P
// and cuBLAS GEMM validation) run for real in tests on machines without a GPU.
//
// Model: device memory is host memory (device pointers are host pointers, which the NCCL
// emulator accepts). Execution is asynchronous, as on a GPU (cuda_device.h): every stream is an
// in-order queue run by a worker thread; an enqueueing call (cuLaunchHostFunc, cuMemsetD32Async,
// cuMemcpy*Async, cuEventRecord, cuStreamWaitEvent, cuGraphLaunch) returns at once; an event
// completes when its stream reaches it and carries the device-side time it was reached;
// synchronising calls block, unbounded, until the work they name is done. The legacy default
// stream synchronises with blocking streams; CU_STREAM_NON_BLOCKING streams do not. Synchronous
// copies and memsets run on the legacy stream and wait for it; cuMemFree first waits for the
// context's work (the driver synchronises too), so no queued work outlives its buffer.
// Knobs: FALCON_EMU_CUDA_EVENT_DELAY_S=S makes each event complete only S seconds after its
// stream reached it (cuEventQuery answers CUDA_ERROR_NOT_READY until then; the stream itself goes
// on): a stalled completion, for testing deadlines. FALCON_EMU_CUDA_OOM_RANKS=r1,r2,... makes the
// processes of those ranks ($RANK) a device whose memory is nearly full: cuMemAlloc of 1 MiB or
// more fails with out of memory.
// Stream capture (CUDA graphs), as strict as the driver where Falcon could lean on a
// difference: cuStreamBeginCapture_v2 / cuStreamEndCapture / cuStreamIsCapturing and the
// per-thread capture mode (cuThreadExchangeStreamCaptureMode). While a capture in global mode
// runs, a "potentially unsafe" call (synchronisation, event or stream queries, allocation,
// anything on the legacy stream) from any thread not in relaxed mode fails with
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates that capture, whose cuStreamEndCapture
// then fails with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED; a thread-local capture is invalidated
// by unsafe calls from its own thread. Work enqueued on a capturing stream is recorded into the
// capture, in order, instead of run; cuGraphInstantiate + cuGraphLaunch replay it on the launch
// stream (a chain of the recorded work; events recorded during a capture are not graph nodes).
// The NCCL emulator records its collectives with falconEmuCudaCaptureHostFunc, whose host part
// runs at each cuGraphLaunch, so replays never pass through the NCCL API.
// Thread-safety: the current context is per thread, as in the driver. Streams, events, graphs and
// device memory are heap objects the emulated driver keeps track of (as the real one does), so
// what a program never frees is released at exit, not reported as a leak. Unknown stream handles
// are refused with CUDA_ERROR_INVALID_HANDLE; other unknown handles are not detected (as in the
// driver: undefined).
#include <time.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cuda_device.h"

namespace {

using falcon::cuemu::Dep;
using falcon::cuemu::kDevices;
using falcon::cuemu::NowNs;
using falcon::cuemu::StreamPtr;

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
constexpr unsigned kStreamNonBlocking = 0x1;
constexpr unsigned kEventDisableTiming = 0x2;

struct Context {
  int device;
};
Context g_contexts[kDevices] = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}};
std::atomic<bool> g_initialised{false};
// Static TLS (initial-exec), as the shim uses: LeakSanitizer crashed scanning a dlopen-ed
// library's dynamic TLS in threads that had touched it.
__attribute__((tls_model("initial-exec"))) thread_local Context* t_current = nullptr;

int CurrentCtx() { return t_current != nullptr ? t_current->device : -1; }

// One recorded piece of work: `run` on the device at every replay, after `on_launch` ran in the
// thread calling cuGraphLaunch (empty for plain work; see falconEmuCudaCaptureHostFunc).
struct Node {
  std::function<void()> on_launch;
  std::function<void()> run;
};

// A capture in progress on one stream (guarded by g_capture_mu).
struct Capture {
  int status = 0;  // 0 none, 1 active, 2 invalidated (CUstreamCaptureStatus)
  int mode = kModeGlobal;
  const void* thread = nullptr;
  std::vector<Node> nodes;  // recorded work, in order
};
struct Graph {
  std::vector<Node> nodes;
};

// The calling thread's capture mode (cuThreadExchangeStreamCaptureMode), and a token naming it.
__attribute__((tls_model("initial-exec"))) thread_local int t_capture_mode = kModeGlobal;
__attribute__((tls_model("initial-exec"))) thread_local char t_thread_token = 0;

// Streams being captured now, by handle.
std::mutex g_capture_mu;
std::unordered_map<void*, Capture>& Capturing() {
  static auto* streams = new std::unordered_map<void*, Capture>();  // reachable for the process's life
  return *streams;
}

// A potentially unsafe call: invalidates the captures it would disturb (see the file comment)
// and fails if it disturbed any.
CuResult UnsafeCall() {
  if (t_capture_mode == kModeRelaxed) return 0;
  std::lock_guard<std::mutex> lock(g_capture_mu);
  bool disturbed = false;
  for (auto& [handle, c] : Capturing()) {
    const bool own = c.thread == &t_thread_token;
    if (c.status == 1 && (c.mode == kModeGlobal || (own && c.mode == kModeThreadLocal))) {
      c.status = 2;
      disturbed = true;
    }
  }
  return disturbed ? kCaptureUnsupported : 0;
}

// An event: where it was last recorded and when the device reached it (guarded by g_event_mu).
struct Event {
  Context* ctx = nullptr;
  unsigned flags = 0;
  bool recorded = false;
  Dep at;                                          // the record's stream item
  std::shared_ptr<std::atomic<int64_t>> reached;  // device time the stream reached it; -1 before
};
std::mutex g_event_mu;

// Every live event, graph and allocation: the driver's, until destroyed or freed.
std::mutex g_objects_mu;
std::unordered_map<void*, std::function<void()>>& Objects() {
  static auto* objects = new std::unordered_map<void*, std::function<void()>>();  // process lifetime
  return *objects;
}
void Track(void* p, std::function<void()> free_fn) {
  std::lock_guard<std::mutex> lock(g_objects_mu);
  Objects().emplace(p, std::move(free_fn));
}
void Release(void* p) {
  std::function<void()> free_fn;
  {
    std::lock_guard<std::mutex> lock(g_objects_mu);
    auto it = Objects().find(p);
    if (it == Objects().end()) return;
    free_fn = std::move(it->second);
    Objects().erase(it);
  }
  free_fn();
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

bool IsLegacy(void* stream) {
  const auto h = reinterpret_cast<uintptr_t>(stream);
  return h == 0 || h == 0x1 || h == 0x2;
}

// Puts `run` on `stream` (recorded into the capture instead while the stream is captured).
// The legacy stream is an unsafe call (it waits for every blocking stream).
CuResult Submit(void* stream, std::function<void()> run, std::vector<Dep> deps = {}) {
  if (const CuResult rc = NeedContext(); rc != kSuccess) return rc;
  if (IsLegacy(stream)) {
    if (const CuResult rc = UnsafeCall(); rc != kSuccess) return rc;
  } else {
    std::lock_guard<std::mutex> lock(g_capture_mu);
    auto it = Capturing().find(stream);
    if (it != Capturing().end()) {
      if (it->second.status == 1) it->second.nodes.push_back(Node{nullptr, std::move(run)});
      return it->second.status == 1 ? kSuccess : kCaptureInvalidated;
    }
  }
  const StreamPtr s = falcon::cuemu::Resolve(stream, CurrentCtx());
  if (!s) return kInvalidHandle;
  falcon::cuemu::Enqueue(s, std::move(run), std::move(deps));
  return kSuccess;
}

// Submits `run` on the legacy stream and waits for it (synchronous copies and memsets).
CuResult RunSync(std::function<void()> run) {
  if (const CuResult rc = Submit(nullptr, std::move(run)); rc != kSuccess) return rc;
  const StreamPtr s = falcon::cuemu::Resolve(nullptr, CurrentCtx());
  falcon::cuemu::Wait({Dep{s, falcon::cuemu::Tail(s)}});
  return kSuccess;
}

// What synchronising `stream` waits for.
CuResult StreamDeps(void* stream, std::vector<Dep>* deps) {
  if (IsLegacy(stream)) {
    if (CurrentCtx() < 0) return kInvalidContext;
    *deps = falcon::cuemu::ContextTails(CurrentCtx(), falcon::cuemu::Which::kLegacyScope);
    return kSuccess;
  }
  const StreamPtr s = falcon::cuemu::Resolve(stream, CurrentCtx());
  if (!s) return kInvalidHandle;
  deps->push_back(Dep{s, falcon::cuemu::Tail(s)});
  return kSuccess;
}

// The device time the event's record was reached, or -1 while it is pending (delay included).
int64_t ReachedNs(const Event& e) {
  if (!e.recorded) return 0;
  const int64_t at = e.reached->load(std::memory_order_acquire);
  if (at < 0 || NowNs() < at + EventDelayNs()) return -1;
  return at;
}

void* DevPtr(unsigned long long p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); }

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
  if (const CuResult rc = UnsafeCall(); rc != kSuccess) return rc;
  falcon::cuemu::Wait(falcon::cuemu::ContextTails(CurrentCtx(), falcon::cuemu::Which::kAll));
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuStreamCreate(void** stream, unsigned flags) {
  if (const CuResult rc = NeedContext(); rc != kSuccess) return rc;
  if (stream == nullptr || (flags & ~kStreamNonBlocking) != 0) return kInvalidValue;
  *stream = falcon::cuemu::CreateStream(CurrentCtx(), (flags & kStreamNonBlocking) != 0);
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuStreamCreateWithPriority(void** stream, unsigned flags, int) {
  return cuStreamCreate(stream, flags);
}

// As the driver: returns at once; work already queued still runs.
__attribute__((visibility("default"))) CuResult cuStreamDestroy_v2(void* stream) {
  if (IsLegacy(stream)) return kInvalidHandle;
  {
    std::lock_guard<std::mutex> lock(g_capture_mu);
    Capturing().erase(stream);
  }
  return falcon::cuemu::DestroyStream(stream) ? kSuccess : kInvalidHandle;
}

__attribute__((visibility("default"))) CuResult cuStreamGetCtx(void* stream, void** ctx) {
  if (const CuResult rc = NeedContext(); rc != kSuccess) return rc;
  if (ctx == nullptr) return kInvalidValue;
  const StreamPtr s = falcon::cuemu::Resolve(stream, CurrentCtx());
  if (!s) return kInvalidHandle;
  *ctx = &g_contexts[falcon::cuemu::ContextOf(*s)];
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuStreamSynchronize(void* stream) {
  if (const CuResult rc = NeedContext(); rc != kSuccess) return rc;
  if (const CuResult rc = UnsafeCall(); rc != kSuccess) return rc;
  std::vector<Dep> deps;
  if (const CuResult rc = StreamDeps(stream, &deps); rc != kSuccess) return rc;
  falcon::cuemu::Wait(deps);
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuStreamQuery(void* stream) {
  if (const CuResult rc = NeedContext(); rc != kSuccess) return rc;
  if (const CuResult rc = UnsafeCall(); rc != kSuccess) return rc;
  std::vector<Dep> deps;
  if (const CuResult rc = StreamDeps(stream, &deps); rc != kSuccess) return rc;
  for (const Dep& d : deps) {
    if (!falcon::cuemu::Completed(d)) return kNotReady;
  }
  return kSuccess;
}

// Runs fn(arg) on the device in stream order (a "kernel" of the host's choosing). The function
// may block: its stream waits for it.
__attribute__((visibility("default"))) CuResult cuLaunchHostFunc(void* stream, void (*fn)(void*), void* arg) {
  if (fn == nullptr) return kInvalidValue;
  return Submit(stream, [fn, arg] { fn(arg); });
}

__attribute__((visibility("default"))) CuResult cuStreamWaitEvent(void* stream, void* event, unsigned flags) {
  if (event == nullptr) return kInvalidHandle;
  if (flags != 0) return kInvalidValue;
  std::vector<Dep> deps;
  {
    std::lock_guard<std::mutex> lock(g_event_mu);
    const auto* e = static_cast<const Event*>(event);
    if (e->recorded) deps.push_back(e->at);  // never recorded: nothing to wait for (as the driver)
  }
  return Submit(stream, [] {}, std::move(deps));
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
  if (IsLegacy(stream)) return kCaptureUnsupported;  // the legacy stream cannot be captured
  if (mode < kModeGlobal || mode > kModeRelaxed) return kInvalidValue;
  if (!falcon::cuemu::Resolve(stream, CurrentCtx())) return kInvalidHandle;
  std::lock_guard<std::mutex> lock(g_capture_mu);
  if (Capturing().count(stream) != 0) return kCaptureUnsupported;
  Capture& c = Capturing()[stream];
  c.status = 1;
  c.mode = mode;
  c.thread = &t_thread_token;
  return kSuccess;
}

// Ends the capture; *graph gets the recorded work (cuGraphDestroy frees it).
__attribute__((visibility("default"))) CuResult cuStreamEndCapture(void* stream, void** graph) {
  if (stream == nullptr || graph == nullptr) return kInvalidValue;
  std::unique_ptr<Graph> g;
  {
    std::lock_guard<std::mutex> lock(g_capture_mu);
    auto it = Capturing().find(stream);
    if (it == Capturing().end()) return kInvalidValue;
    if (it->second.mode != kModeRelaxed && it->second.thread != &t_thread_token) return kCaptureWrongThread;
    const bool invalidated = it->second.status == 2;
    if (!invalidated) g = std::make_unique<Graph>(Graph{std::move(it->second.nodes)});
    Capturing().erase(it);
    if (invalidated) {
      *graph = nullptr;
      return kCaptureInvalidated;
    }
  }
  Graph* raw = g.release();
  Track(raw, [raw] { delete raw; });
  *graph = raw;
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuStreamIsCapturing(void* stream, int* status) {
  if (const CuResult rc = NeedContext(); rc != kSuccess) return rc;
  if (status == nullptr) return kInvalidValue;
  std::lock_guard<std::mutex> lock(g_capture_mu);
  *status = 0;
  if (IsLegacy(stream)) {  // the legacy stream: reports active while a global capture runs
    for (const auto& [handle, c] : Capturing()) {
      if (c.mode == kModeGlobal && c.status == 1) *status = 1;
    }
    return kSuccess;
  }
  auto it = Capturing().find(stream);
  if (it != Capturing().end()) *status = it->second.status;
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuGraphDestroy(void* graph) {
  if (graph == nullptr) return kInvalidValue;
  Release(graph);
  return kSuccess;
}

// An executable graph is a copy of the graph's work (later edits of the graph do not reach it).
__attribute__((visibility("default"))) CuResult cuGraphInstantiateWithFlags(void** exec, void* graph,
                                                                            unsigned long long /*flags*/) {
  if (exec == nullptr || graph == nullptr) return kInvalidValue;
  auto* copy = new Graph(*static_cast<const Graph*>(graph));
  Track(copy, [copy] { delete copy; });
  *exec = copy;
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuGraphInstantiate_v2(void** exec, void* graph, void* /*error_node*/,
                                                                      char* log, size_t log_size) {
  if (log != nullptr && log_size > 0) log[0] = '\0';
  return cuGraphInstantiateWithFlags(exec, graph, 0);
}

__attribute__((visibility("default"))) CuResult cuGraphExecDestroy(void* exec) {
  if (exec == nullptr) return kInvalidValue;
  Release(exec);
  return kSuccess;
}

// Replays the graph's work on `stream`, in capture order, as one unit of stream work.
__attribute__((visibility("default"))) CuResult cuGraphLaunch(void* exec, void* stream) {
  if (exec == nullptr) return kInvalidValue;
  auto nodes = std::make_shared<std::vector<Node>>(static_cast<const Graph*>(exec)->nodes);
  for (Node& n : *nodes) {
    if (n.on_launch) n.on_launch();
  }
  return Submit(stream, [nodes] {
    for (Node& n : *nodes) n.run();
  });
}

__attribute__((visibility("default"))) CuResult cuEventCreate(void** event, unsigned flags) {
  if (const CuResult rc = NeedContext(); rc != kSuccess) return rc;
  if (event == nullptr) return kInvalidValue;
  auto* e = new Event;
  e->ctx = t_current;
  e->flags = flags;
  Track(e, [e] { delete e; });
  *event = e;
  return kSuccess;
}

// As the driver: a pending record still completes; the event is gone for the caller.
__attribute__((visibility("default"))) CuResult cuEventDestroy_v2(void* event) {
  if (event == nullptr) return kInvalidHandle;
  std::lock_guard<std::mutex> lock(g_event_mu);  // no query or record of it is under way
  Release(event);
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuEventRecord(void* event, void* stream) {
  if (const CuResult rc = NeedContext(); rc != kSuccess) return rc;
  if (event == nullptr) return kInvalidHandle;
  if (IsLegacy(stream)) {  // the legacy stream waits for every blocking stream: unsafe
    if (const CuResult rc = UnsafeCall(); rc != kSuccess) return rc;
  } else {
    std::lock_guard<std::mutex> lock(g_capture_mu);
    auto it = Capturing().find(stream);
    if (it != Capturing().end()) return it->second.status == 1 ? kSuccess : kCaptureInvalidated;
  }
  const StreamPtr s = falcon::cuemu::Resolve(stream, CurrentCtx());
  if (!s) return kInvalidHandle;
  auto reached = std::make_shared<std::atomic<int64_t>>(-1);
  std::lock_guard<std::mutex> lock(g_event_mu);  // records of one event take effect in call order
  const uint64_t seq = falcon::cuemu::Enqueue(s, [reached] { reached->store(NowNs(), std::memory_order_release); });
  auto* e = static_cast<Event*>(event);
  e->recorded = true;
  e->at = Dep{s, seq};
  e->reached = std::move(reached);
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuEventRecordWithFlags(void* event, void* stream, unsigned flags) {
  if (flags != 0) return kInvalidValue;
  return cuEventRecord(event, stream);
}

__attribute__((visibility("default"))) CuResult cuEventQuery(void* event) {
  if (event == nullptr) return kInvalidHandle;
  if (const CuResult rc = UnsafeCall(); rc != kSuccess) return rc;
  std::lock_guard<std::mutex> lock(g_event_mu);
  return ReachedNs(*static_cast<const Event*>(event)) < 0 ? kNotReady : kSuccess;
}

__attribute__((visibility("default"))) CuResult cuEventSynchronize(void* event) {
  if (event == nullptr) return kInvalidHandle;
  if (const CuResult rc = UnsafeCall(); rc != kSuccess) return rc;
  std::shared_ptr<std::atomic<int64_t>> reached;
  Dep at;
  {
    std::lock_guard<std::mutex> lock(g_event_mu);
    const auto* e = static_cast<const Event*>(event);
    if (!e->recorded) return kSuccess;
    reached = e->reached;
    at = e->at;
  }
  falcon::cuemu::Wait({at});
  const int64_t wait = reached->load(std::memory_order_acquire) + EventDelayNs() - NowNs();
  if (wait > 0) {
    timespec ts{static_cast<time_t>(wait / 1'000'000'000), static_cast<long>(wait % 1'000'000'000)};
    nanosleep(&ts, nullptr);
  }
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuEventElapsedTime_v2(float* ms, void* start, void* end) {
  if (ms == nullptr) return kInvalidValue;
  if (start == nullptr || end == nullptr) return kInvalidHandle;
  std::lock_guard<std::mutex> lock(g_event_mu);
  const auto* a = static_cast<const Event*>(start);
  const auto* b = static_cast<const Event*>(end);
  if (!a->recorded || !b->recorded) return kInvalidHandle;  // as the driver: an event never recorded
  if (((a->flags | b->flags) & kEventDisableTiming) != 0) return kInvalidHandle;
  const int64_t ta = ReachedNs(*a), tb = ReachedNs(*b);
  if (ta < 0 || tb < 0) return kNotReady;
  *ms = static_cast<float>(static_cast<double>(tb - ta) / 1e6);
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
  Track(p, [p] { std::free(p); });
  *dptr = reinterpret_cast<uintptr_t>(p);
  return kSuccess;
}

// Waits for the context's queued work first, as the driver's free synchronises.
__attribute__((visibility("default"))) CuResult cuMemFree_v2(unsigned long long dptr) {
  if (const CuResult rc = NeedContext(); rc != kSuccess) return rc;
  if (const CuResult rc = UnsafeCall(); rc != kSuccess) return rc;
  if (dptr == 0) return kSuccess;
  falcon::cuemu::Wait(falcon::cuemu::ContextTails(CurrentCtx(), falcon::cuemu::Which::kAll));
  Release(DevPtr(dptr));
  return kSuccess;
}

__attribute__((visibility("default"))) CuResult cuMemsetD32Async(unsigned long long dptr, unsigned value, size_t n,
                                                                  void* stream) {
  auto* p = static_cast<uint32_t*>(DevPtr(dptr));
  return Submit(stream, [p, value, n] {
    for (size_t i = 0; i < n; ++i) p[i] = value;
  });
}

__attribute__((visibility("default"))) CuResult cuMemsetD32_v2(unsigned long long dptr, unsigned value, size_t n) {
  auto* p = static_cast<uint32_t*>(DevPtr(dptr));
  return RunSync([p, value, n] {
    for (size_t i = 0; i < n; ++i) p[i] = value;
  });
}

// Copies read their source when the stream reaches them, not at the call.
__attribute__((visibility("default"))) CuResult cuMemcpyAsync(unsigned long long dst, unsigned long long src,
                                                               size_t bytes, void* stream) {
  return Submit(stream, [d = DevPtr(dst), s = DevPtr(src), bytes] { std::memmove(d, s, bytes); });
}
__attribute__((visibility("default"))) CuResult cuMemcpyHtoDAsync_v2(unsigned long long dst, const void* src,
                                                                      size_t bytes, void* stream) {
  return cuMemcpyAsync(dst, reinterpret_cast<uintptr_t>(src), bytes, stream);
}
__attribute__((visibility("default"))) CuResult cuMemcpyDtoHAsync_v2(void* dst, unsigned long long src, size_t bytes,
                                                                      void* stream) {
  return cuMemcpyAsync(reinterpret_cast<uintptr_t>(dst), src, bytes, stream);
}
__attribute__((visibility("default"))) CuResult cuMemcpyDtoDAsync_v2(unsigned long long dst, unsigned long long src,
                                                                      size_t bytes, void* stream) {
  return cuMemcpyAsync(dst, src, bytes, stream);
}
__attribute__((visibility("default"))) CuResult cuMemcpy(unsigned long long dst, unsigned long long src, size_t bytes) {
  return RunSync([d = DevPtr(dst), s = DevPtr(src), bytes] { std::memmove(d, s, bytes); });
}
__attribute__((visibility("default"))) CuResult cuMemcpyHtoD_v2(unsigned long long dst, const void* src, size_t bytes) {
  return cuMemcpy(dst, reinterpret_cast<uintptr_t>(src), bytes);
}
__attribute__((visibility("default"))) CuResult cuMemcpyDtoH_v2(void* dst, unsigned long long src, size_t bytes) {
  return cuMemcpy(reinterpret_cast<uintptr_t>(dst), src, bytes);
}
__attribute__((visibility("default"))) CuResult cuMemcpyDtoD_v2(unsigned long long dst, unsigned long long src,
                                                                 size_t bytes) {
  return cuMemcpy(dst, src, bytes);
}

// For the NCCL emulator: records into the capture running on `stream` a node whose on_launch(arg)
// runs in the thread that calls cuGraphLaunch (the host side of a launch: NCCL's sequence
// numbers) and whose run(arg) runs on the device at each replay. Nothing is freed: the node
// lives as long as the process (a graph's lifetime is not known to the caller).
// CUDA_ERROR_INVALID_VALUE if the stream is not being captured.
__attribute__((visibility("default"))) CuResult falconEmuCudaCaptureHostFunc(void* stream, void (*on_launch)(void*),
                                                                             void (*run)(void*), void* arg) {
  if (const CuResult rc = NeedContext(); rc != kSuccess) return rc;
  if (on_launch == nullptr || run == nullptr || IsLegacy(stream)) return kInvalidValue;
  std::lock_guard<std::mutex> lock(g_capture_mu);
  auto it = Capturing().find(stream);
  if (it == Capturing().end()) return kInvalidValue;
  if (it->second.status != 1) return kCaptureInvalidated;
  it->second.nodes.push_back(Node{[on_launch, arg] { on_launch(arg); }, [run, arg] { run(arg); }});
  return kSuccess;
}

// Marks this library as the emulator for the NCCL and cuBLAS emulators, which then put their
// device work on its streams (cuLaunchHostFunc). Returns the interface version.
__attribute__((visibility("default"))) int falconEmuCudaDriver(void) { return 1; }

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
