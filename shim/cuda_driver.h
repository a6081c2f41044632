// The CUDA driver API entry points the shim uses (GPU timing, gpu_timer.h; GPU validation tasks,
// gpu_bench.h), from a libcuda.so.1 the process has already loaded: the shim never loads the
// driver into a process that has not (dlopen RTLD_NOLOAD). Types mirror the driver's ABI (cuda.h)
// so no toolkit header is needed: handles are opaque pointers, device pointers 64-bit integers,
// results ints. Each entry point is null where this driver lacks it; users check theirs.
// Thread-safety: LoadedCudaDriver from any thread.
#pragma once

#include <cstddef>

namespace falcon::shim {

using CuResult = int;
using CuDevicePtr = unsigned long long;
inline constexpr CuResult kCudaSuccess = 0;
inline constexpr CuResult kCudaNotReady = 600;

struct CudaDriver {
  CuResult (*ctx_get_current)(void**) = nullptr;
  CuResult (*ctx_set_current)(void*) = nullptr;
  CuResult (*stream_create)(void**, unsigned) = nullptr;
  CuResult (*stream_is_capturing)(void*, int*) = nullptr;
  CuResult (*event_create)(void**, unsigned) = nullptr;
  CuResult (*event_destroy)(void*) = nullptr;
  CuResult (*event_record)(void*, void*) = nullptr;
  CuResult (*event_query)(void*) = nullptr;
  CuResult (*event_synchronize)(void*) = nullptr;
  CuResult (*event_elapsed)(float*, void*, void*) = nullptr;  // cuEventElapsedTime_v2, else the first version
  CuResult (*mem_alloc)(CuDevicePtr*, size_t) = nullptr;
  CuResult (*mem_free)(CuDevicePtr) = nullptr;
  CuResult (*memset_d32_async)(CuDevicePtr, unsigned, size_t, void*) = nullptr;
  CuResult (*thread_exchange_capture_mode)(int*) = nullptr;  // cuThreadExchangeStreamCaptureMode
  CuResult (*stream_wait_event)(void*, void*, unsigned) = nullptr;
  CuResult (*stream_get_ctx)(void*, void**) = nullptr;
};

// The loaded driver's entry points, looked up once it is found; nullptr while the process has
// not loaded libcuda.so.1 (every call looks again: a process may load it after its first NCCL
// call).
const CudaDriver* LoadedCudaDriver();

}  // namespace falcon::shim
