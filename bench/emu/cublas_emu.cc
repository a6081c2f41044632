// The cuBLAS emulator: a libcublas.so.13 with the entry points Falcon's GEMM validation uses
// (cublasCreate_v2, cublasDestroy_v2, cublasSetStream_v2, cublasSgemm_v2, and cublasDgemm_v2),
// over the CUDA driver emulator's "device" memory (host memory). Test fabric, like cuda_emu.cc.
// Column-major, as cuBLAS; only CUBLAS_OP_N is emulated (other ops: CUBLAS_STATUS_NOT_SUPPORTED).
//
// A GEMM is device work, as on a GPU: it is queued on the handle's stream and returns at once;
// the device reads A, B (and C when beta != 0) when the GEMM starts, not at the call. With the
// NCCL emulator loaded (falconEmuLaunchGemm, falcon_emu.h) the kernel lasts flops /
// FALCON_EMU_GPU_TFLOPS x the fault plan's compute factor of this rank's GPU x noise (or its real
// computation time if longer), so validation GEMMs measure the emulated device, slow-compute
// faults included. Without it, the GEMM is a plain host function on the stream (its real time);
// without the driver emulator loaded, it runs in the calling thread.
// Results are computed for real up to kMaxRealMacs multiply-adds; a larger GEMM (a validation
// GEMM of size 4096 would take minutes on a CPU) is timed only and writes a quiet NaN at the head
// of every column of C, so a caller that reads it cannot mistake it for a result (filling all of
// C would cost real CPU time that the model does not charge: 64 MiB at size 4096, tens of ms
// when 16 ranks share two cores, which would swamp the modelled time). alpha and beta are read at the call
// (CUBLAS_POINTER_MODE_HOST).
// Thread-safety: a handle is used by one thread at a time, as with cuBLAS.
#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <new>

namespace {

constexpr int kSuccess = 0;
constexpr int kNotInitialized = 1;
constexpr int kAllocFailed = 3;
constexpr int kInvalidValue = 7;
constexpr int kExecutionFailed = 13;
constexpr int kNotSupported = 15;
constexpr int kOpN = 0;
constexpr double kMaxRealMacs = double{1 << 27};

struct Handle {
  void* stream;
};

using LaunchGemmFn = int (*)(void*, double, void (*)(void*), void*, void (*)(void*));
using HostFuncFn = int (*)(void*, void (*)(void*), void*);

// An already-loaded library's symbol (never loads one).
void* LoadedSymbol(const char* lib_name, const char* symbol) {
  void* lib = dlopen(lib_name, RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
  if (lib == nullptr) return nullptr;
  void* s = dlsym(lib, symbol);
  dlclose(lib);
  return s;
}

template <typename T>
struct Gemm {
  int m, n, k;
  T alpha, beta;
  const T* a;
  int lda;
  const T* b;
  int ldb;
  T* c;
  int ldc;

  static void Run(void* p) {
    const auto* g = static_cast<const Gemm*>(p);
    const bool real = static_cast<double>(g->m) * g->n * g->k <= kMaxRealMacs;
    for (int j = 0; j < g->n; ++j) {
      T* cj = g->c + static_cast<int64_t>(j) * g->ldc;
      if (!real) {
        if (g->m > 0) cj[0] = std::numeric_limits<T>::quiet_NaN();
        continue;
      }
      for (int i = 0; i < g->m; ++i) cj[i] = g->beta == T(0) ? T(0) : cj[i] * g->beta;  // beta 0: C is not read
      for (int p2 = 0; p2 < g->k; ++p2) {
        const T bpj = g->alpha * g->b[static_cast<int64_t>(j) * g->ldb + p2];
        const T* ap = g->a + static_cast<int64_t>(p2) * g->lda;
        for (int i = 0; i < g->m; ++i) cj[i] += ap[i] * bpj;
      }
    }
  }
  static void Free(void* p) { delete static_cast<Gemm*>(p); }
  // Host function of the driver (no model): run, then free.
  static void RunOnce(void* p) {
    Run(p);
    Free(p);
  }
};

template <typename T>
int Launch(void* handle, int transa, int transb, int m, int n, int k, const T* alpha, const T* a, int lda, const T* b,
           int ldb, const T* beta, T* c, int ldc) {
  if (handle == nullptr) return kNotInitialized;
  if (transa != kOpN || transb != kOpN) return kNotSupported;
  if (m < 0 || n < 0 || k < 0 || lda < (m > 1 ? m : 1) || ldb < (k > 1 ? k : 1) || ldc < (m > 1 ? m : 1) ||
      alpha == nullptr || beta == nullptr) {
    return kInvalidValue;
  }
  auto* g = new (std::nothrow) Gemm<T>{m, n, k, *alpha, *beta, a, lda, b, ldb, c, ldc};
  if (g == nullptr) return kAllocFailed;
  void* stream = static_cast<Handle*>(handle)->stream;
  static const auto launch_gemm = reinterpret_cast<LaunchGemmFn>(LoadedSymbol("libnccl.so.2", "falconEmuLaunchGemm"));
  if (launch_gemm != nullptr) {
    const double flops = 2.0 * m * n * k;
    return launch_gemm(stream, flops, Gemm<T>::Run, g, Gemm<T>::Free) == 0 ? kSuccess : kExecutionFailed;
  }
  static const auto host_func = reinterpret_cast<HostFuncFn>(LoadedSymbol("libcuda.so.1", "cuLaunchHostFunc"));
  if (host_func != nullptr) {
    if (host_func(stream, Gemm<T>::RunOnce, g) == 0) return kSuccess;
    Gemm<T>::Free(g);
    return kExecutionFailed;
  }
  Gemm<T>::RunOnce(g);
  return kSuccess;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int cublasCreate_v2(void** handle) {
  if (handle == nullptr) return kInvalidValue;
  auto* h = static_cast<Handle*>(std::malloc(sizeof(Handle)));
  if (h == nullptr) return kAllocFailed;
  h->stream = nullptr;
  *handle = h;
  return kSuccess;
}

__attribute__((visibility("default"))) int cublasDestroy_v2(void* handle) {
  if (handle == nullptr) return kNotInitialized;
  std::free(handle);
  return kSuccess;
}

__attribute__((visibility("default"))) int cublasSetStream_v2(void* handle, void* stream) {
  if (handle == nullptr) return kNotInitialized;
  static_cast<Handle*>(handle)->stream = stream;
  return kSuccess;
}

// C = alpha * A(m x k) * B(k x n) + beta * C, column-major with leading dimensions.
__attribute__((visibility("default"))) int cublasSgemm_v2(void* handle, int transa, int transb, int m, int n, int k,
                                                          const float* alpha, const float* a, int lda, const float* b,
                                                          int ldb, const float* beta, float* c, int ldc) {
  return Launch(handle, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

__attribute__((visibility("default"))) int cublasDgemm_v2(void* handle, int transa, int transb, int m, int n, int k,
                                                          const double* alpha, const double* a, int lda,
                                                          const double* b, int ldb, const double* beta, double* c,
                                                          int ldc) {
  return Launch(handle, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // extern "C"
