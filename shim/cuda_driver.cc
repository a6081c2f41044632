// The loaded CUDA driver's entry points: see cuda_driver.h.
#include "shim/cuda_driver.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>

namespace falcon::shim {
namespace {

template <typename Fn>
void Load(void* lib, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(lib, name));
}

std::mutex g_mu;
CudaDriver g_driver;
std::atomic<const CudaDriver*> g_loaded{nullptr};

}  // namespace

const CudaDriver* LoadedCudaDriver() {
  if (const CudaDriver* d = g_loaded.load(std::memory_order_acquire)) return d;
  std::lock_guard<std::mutex> lock(g_mu);
  if (const CudaDriver* d = g_loaded.load(std::memory_order_acquire)) return d;
  void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
  if (lib == nullptr) return nullptr;
  CudaDriver& d = g_driver;
  Load(lib, "cuCtxGetCurrent", &d.ctx_get_current);
  Load(lib, "cuCtxSetCurrent", &d.ctx_set_current);
  Load(lib, "cuStreamCreate", &d.stream_create);
  Load(lib, "cuStreamIsCapturing", &d.stream_is_capturing);
  Load(lib, "cuEventCreate", &d.event_create);
  Load(lib, "cuEventDestroy_v2", &d.event_destroy);
  Load(lib, "cuEventRecord", &d.event_record);
  Load(lib, "cuEventQuery", &d.event_query);
  Load(lib, "cuEventSynchronize", &d.event_synchronize);
  // CUDA 13 names it cuEventElapsedTime_v2; older drivers have only the first version.
  Load(lib, "cuEventElapsedTime_v2", &d.event_elapsed);
  if (d.event_elapsed == nullptr) Load(lib, "cuEventElapsedTime", &d.event_elapsed);
  Load(lib, "cuMemAlloc_v2", &d.mem_alloc);
  Load(lib, "cuMemFree_v2", &d.mem_free);
  Load(lib, "cuMemsetD32Async", &d.memset_d32_async);
  Load(lib, "cuThreadExchangeStreamCaptureMode", &d.thread_exchange_capture_mode);
  Load(lib, "cuStreamWaitEvent", &d.stream_wait_event);
  Load(lib, "cuStreamGetCtx", &d.stream_get_ctx);
  g_loaded.store(&d, std::memory_order_release);
  return &d;
}

}  // namespace falcon::shim
