// The emulated GPU seen from the NCCL emulator; see device.h.
// Thread-safety: the entry-point table is published once with a release store; the noise
// generator is guarded by its mutex. Must never: block the caller (except SyncCommDevice, whose
// point is to), spin.
#include "device.h"

#include <dlfcn.h>
#include <time.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <random>

#include "comm.h"
#include "emu_config.h"
#include "falcon_emu.h"

namespace falcon::emu {
namespace {

constexpr int kCaptureNone = 0;

template <typename Fn>
bool Load(void* lib, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(lib, name));
  return *out != nullptr;
}

const CudaEmuApi* TryLoad() {
  void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
  if (lib == nullptr) return nullptr;
  auto* api = new CudaEmuApi;  // published once, reachable for the process's life
  int (*marker)() = nullptr;
  const bool ok = Load(lib, "falconEmuCudaDriver", &marker) && Load(lib, "cuCtxGetCurrent", &api->ctx_get_current) &&
                  Load(lib, "cuLaunchHostFunc", &api->launch_host_func) &&
                  Load(lib, "cuEventCreate", &api->event_create) && Load(lib, "cuEventDestroy_v2", &api->event_destroy) &&
                  Load(lib, "cuEventRecord", &api->event_record) &&
                  Load(lib, "cuStreamWaitEvent", &api->stream_wait_event) &&
                  Load(lib, "cuEventSynchronize", &api->event_synchronize) &&
                  Load(lib, "cuEventQuery", &api->event_query) &&
                  Load(lib, "cuStreamIsCapturing", &api->stream_is_capturing) &&
                  Load(lib, "cuThreadExchangeStreamCaptureMode", &api->exchange_capture_mode) &&
                  Load(lib, "falconEmuCudaCaptureHostFunc", &api->capture_host_func);
  dlclose(lib);  // NOLOAD took a reference; the program's own keeps the library mapped
  if (!ok) {
    delete api;
    return nullptr;
  }
  return api;
}

void SleepUntil(int64_t target_ns) {
  for (int64_t left = target_ns - NowNs(); left > 0; left = target_ns - NowNs()) {
    timespec ts{static_cast<time_t>(left / 1'000'000'000), static_cast<long>(left % 1'000'000'000)};
    nanosleep(&ts, nullptr);
  }
}

// Multiplicative noise of one kernel (mean 1), from this rank's generator.
double Noise() {
  const double sigma = Config().compute_noise;
  if (sigma <= 0) return 1.0;
  static std::mutex mu;
  static std::mt19937_64* gen = nullptr;  // leaked: kernels may run during exit
  std::lock_guard<std::mutex> lock(mu);
  if (gen == nullptr) {
    const auto rank = static_cast<uint64_t>(ProcessGlobalRank(0));
    gen = new std::mt19937_64(0x9E3779B97F4A7C15ull * (rank + 1) ^ Config().noise_seed);
  }
  double z = std::normal_distribution<double>(0.0, 1.0)(*gen);
  z = std::fmax(-4.0, std::fmin(4.0, z));
  return std::exp(sigma * z - sigma * sigma / 2);
}

struct Kernel {
  double nominal_s;
  void (*body)(void*);
  void* arg;
  void (*release)(void*);
  bool captured;  // recorded into a CUDA graph: runs at every replay, so it is never freed
};

void RunKernel(void* p) {
  auto* k = static_cast<Kernel*>(p);
  const int64_t start = NowNs();
  const int rank = ProcessGlobalRank(-1);
  const double t = EpochNs() == 0 ? 0.0 : JobSeconds(start);
  const double factor = rank < 0 ? 1.0 : falconEmuComputeFactor(rank, t);
  if (k->body != nullptr) k->body(k->arg);
  SleepUntil(start + static_cast<int64_t>(k->nominal_s * factor * Noise() * 1e9));
  if (k->captured) return;
  if (k->release != nullptr) k->release(k->arg);
  delete k;
}

}  // namespace

const CudaEmuApi* CudaEmu() {
  static std::atomic<const CudaEmuApi*> api{nullptr};
  static std::mutex mu;
  const CudaEmuApi* a = api.load(std::memory_order_acquire);
  if (a != nullptr) return a;
  std::lock_guard<std::mutex> lock(mu);
  a = api.load(std::memory_order_relaxed);
  if (a == nullptr) {
    a = TryLoad();
    if (a != nullptr) api.store(a, std::memory_order_release);
  }
  return a;
}

bool DeviceUsable(void* stream) {
  const CudaEmuApi* cu = CudaEmu();
  if (cu == nullptr) return false;
  void* ctx = nullptr;
  if (cu->ctx_get_current(&ctx) != 0 || ctx == nullptr) return false;
  // Asking is safe during a capture in any mode: cuStreamIsCapturing is not an unsafe call.
  int status = kCaptureNone;
  return cu->stream_is_capturing(stream, &status) == 0 && status == kCaptureNone;
}

bool DeviceCapturing(void* stream) {
  const CudaEmuApi* cu = CudaEmu();
  if (cu == nullptr) return false;
  void* ctx = nullptr;
  if (cu->ctx_get_current(&ctx) != 0 || ctx == nullptr) return false;
  int status = kCaptureNone;
  return cu->stream_is_capturing(stream, &status) == 0 && status == 1;  // active (not invalidated)
}

void* MarkStream(void* stream) {
  if (!DeviceUsable(stream)) return nullptr;
  const CudaEmuApi* cu = CudaEmu();
  void* e = nullptr;
  if (cu->event_create(&e, 0) != 0) return nullptr;
  if (cu->event_record(e, stream) != 0) {
    (void)cu->event_destroy(e);
    return nullptr;
  }
  return e;
}

bool MarkReached(void* mark) {
  static thread_local bool relaxed = false;  // the emulator's own query: never disturbs a capture
  const CudaEmuApi* cu = CudaEmu();
  if (!relaxed) {
    int mode = 2;
    cu->exchange_capture_mode(&mode);
    relaxed = true;
  }
  return cu->event_query(mark) == 0;
}

void DropMark(void* mark) {
  if (mark != nullptr) (void)CudaEmu()->event_destroy(mark);
}

void SyncCommDevice(ncclComm* c) {
  for (uint64_t done = c->device_done.load(std::memory_order_acquire); done < c->device_launched;
       done = c->device_done.load(std::memory_order_acquire)) {
    c->device_done.wait(done, std::memory_order_acquire);
  }
}

void ReleaseCommDevice(ncclComm* c) {
  if (c->device_event == nullptr) return;
  (void)CudaEmu()->event_destroy(c->device_event);  // a pending record still completes
  c->device_event = nullptr;
}

int LaunchModelledKernel(void* stream, double nominal_s, void (*body)(void*), void* arg, void (*release)(void*)) {
  if (!(nominal_s >= 0) || !std::isfinite(nominal_s)) {
    if (release != nullptr) release(arg);
    return -1;
  }
  if (!Config().error.empty()) {
    if (release != nullptr) release(arg);
    return -2;
  }
  auto* k = new Kernel{nominal_s, body, arg, release, false};
  const CudaEmuApi* cu = CudaEmu();
  void* ctx = nullptr;
  if (cu == nullptr || cu->ctx_get_current(&ctx) != 0 || ctx == nullptr) {
    RunKernel(k);  // no device to queue on: the host is the device
    return 0;
  }
  int status = kCaptureNone;
  if (cu->stream_is_capturing(stream, &status) == 0 && status != kCaptureNone) k->captured = true;
  if (cu->launch_host_func(stream, RunKernel, k) != 0) {
    if (release != nullptr) release(arg);
    delete k;
    return -3;
  }
  return 0;
}

}  // namespace falcon::emu

extern "C" __attribute__((visibility("default"))) int falconEmuLaunchCompute(void* stream, double seconds) {
  return falcon::emu::LaunchModelledKernel(stream, seconds, nullptr, nullptr, nullptr);
}

extern "C" __attribute__((visibility("default"))) int falconEmuLaunchGemm(void* stream, double flops, void (*body)(void*), void* arg,
                                            void (*release)(void*)) {
  const falcon::emu::EmuConfig& c = falcon::emu::Config();
  const double seconds = c.gpu_tflops > 0 && flops >= 0 ? flops / (c.gpu_tflops * 1e12) * c.fabric.time_scale : 0.0;
  if (!(flops >= 0)) {
    if (release != nullptr) release(arg);
    return -1;
  }
  return falcon::emu::LaunchModelledKernel(stream, seconds, body, arg, release);
}
