// The cuBLAS emulator: a libcublas.so.13 with the entry points Falcon's GEMM validation uses
// (cublasCreate_v2, cublasDestroy_v2, cublasSetStream_v2, cublasSgemm_v2, cublasDgemm_v2, and
// cublasGemmEx for bf16 / fp16 inputs and outputs with fp32 compute),
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
#include <cstring>
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
constexpr int kCudaR32F = 0;
constexpr int kCudaR16F = 2;
constexpr int kCudaR16Bf = 14;
constexpr int kCompute32F = 68;
constexpr int kCompute32FFastTf32 = 77;
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

// 16-bit storage types with fp32 arithmetic, as cublasGemmEx with CUBLAS_COMPUTE_32F does.
struct Bf16 {
  uint16_t bits;
  static Bf16 From(float f) {
    uint32_t u = 0;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return Bf16{0x7fc0};         // NaN stays NaN
    return Bf16{static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};  // round to nearest even
  }
  float Get() const {
    const uint32_t u = uint32_t{bits} << 16;
    float f = 0;
    std::memcpy(&f, &u, 4);
    return f;
  }
};
// IEEE half by hand (no _Float16: not every supported compiler has it on x86-64).
struct F16 {
  uint16_t bits;
  static F16 From(float f) {
    uint32_t u = 0;
    std::memcpy(&u, &f, 4);
    const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
    const uint32_t mag = u & 0x7fffffffu;
    if (mag > 0x7f800000u) return F16{static_cast<uint16_t>(sign | 0x7e00u)};  // NaN
    if (mag >= 0x477ff000u) return F16{static_cast<uint16_t>(sign | 0x7c00u)};  // overflow: infinity
    if (mag < 0x33000000u) return F16{sign};                                    // underflow: zero
    int exp = static_cast<int>(mag >> 23) - 127 + 15;
    uint32_t mant = (mag & 0x7fffffu) | 0x800000u;
    const int shift = exp > 0 ? 13 : 14 - exp;  // subnormal halves shift further
    if (exp <= 0) exp = 0;
    const uint32_t half_ulp = 1u << (shift - 1), rest = mant & ((1u << shift) - 1);
    mant >>= shift;
    if (rest > half_ulp || (rest == half_ulp && (mant & 1u))) ++mant;  // to nearest even
    const uint32_t out = exp == 0 ? mant : ((static_cast<uint32_t>(exp) << 10) + (mant & 0x3ffu) + ((mant >> 11) << 10));
    return F16{static_cast<uint16_t>(sign | out)};
  }
  float Get() const {
    const uint32_t sign = uint32_t{bits & 0x8000u} << 16, exp = (bits >> 10) & 0x1fu, mant = bits & 0x3ffu;
    uint32_t u = 0;
    if (exp == 0x1f) {
      u = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
      u = sign | ((exp + 112) << 23) | (mant << 13);
    } else {  // zero or subnormal: mant x 2^-24
      float f = static_cast<float>(mant) * 5.9604644775390625e-8f;
      return sign != 0 ? -f : f;
    }
    float f = 0;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

template <typename S>
struct Gemm16 {
  int m, n, k;
  float alpha, beta;
  const S* a;
  int lda;
  const S* b;
  int ldb;
  S* c;
  int ldc;

  static void Run(void* p) {
    const auto* g = static_cast<const Gemm16*>(p);
    const bool real = static_cast<double>(g->m) * g->n * g->k <= kMaxRealMacs;
    for (int j = 0; j < g->n; ++j) {
      S* cj = g->c + static_cast<int64_t>(j) * g->ldc;
      if (!real) {
        if (g->m > 0) cj[0] = S::From(std::numeric_limits<float>::quiet_NaN());
        continue;
      }
      for (int i = 0; i < g->m; ++i) {
        float acc = 0;
        for (int p2 = 0; p2 < g->k; ++p2) {
          acc += g->a[static_cast<int64_t>(p2) * g->lda + i].Get() * g->b[static_cast<int64_t>(j) * g->ldb + p2].Get();
        }
        const float old = g->beta == 0.0f ? 0.0f : cj[i].Get() * g->beta;  // beta 0: C is not read
        cj[i] = S::From(g->alpha * acc + old);
      }
    }
  }
  static void Free(void* p) { delete static_cast<Gemm16*>(p); }
  static void RunOnce(void* p) {
    Run(p);
    Free(p);
  }
};

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

// Queues GEMM `g` (a Gemm<T> or Gemm16<S>, owned from here on) on the handle's stream.
template <typename G>
int Enqueue(void* handle, double flops, G* g) {
  void* stream = static_cast<Handle*>(handle)->stream;
  static const auto launch_gemm = reinterpret_cast<LaunchGemmFn>(LoadedSymbol("libnccl.so.2", "falconEmuLaunchGemm"));
  if (launch_gemm != nullptr) {
    return launch_gemm(stream, flops, G::Run, g, G::Free) == 0 ? kSuccess : kExecutionFailed;
  }
  static const auto host_func = reinterpret_cast<HostFuncFn>(LoadedSymbol("libcuda.so.1", "cuLaunchHostFunc"));
  if (host_func != nullptr) {
    if (host_func(stream, G::RunOnce, g) == 0) return kSuccess;
    G::Free(g);
    return kExecutionFailed;
  }
  G::RunOnce(g);
  return kSuccess;
}

bool ShapeOk(int m, int n, int k, int lda, int ldb, int ldc) {
  return m >= 0 && n >= 0 && k >= 0 && lda >= (m > 1 ? m : 1) && ldb >= (k > 1 ? k : 1) && ldc >= (m > 1 ? m : 1);
}

template <typename S>
int Launch16(void* handle, int m, int n, int k, float alpha, const void* a, int lda, const void* b, int ldb, float beta,
             void* c, int ldc) {
  auto* g = new (std::nothrow) Gemm16<S>{m, n, k, alpha, beta, static_cast<const S*>(a), lda,
                                         static_cast<const S*>(b), ldb, static_cast<S*>(c), ldc};
  if (g == nullptr) return kAllocFailed;
  return Enqueue(handle, 2.0 * m * n * k, g);
}

template <typename T>
int Launch(void* handle, int transa, int transb, int m, int n, int k, const T* alpha, const T* a, int lda, const T* b,
           int ldb, const T* beta, T* c, int ldc) {
  if (handle == nullptr) return kNotInitialized;
  if (transa != kOpN || transb != kOpN) return kNotSupported;
  if (!ShapeOk(m, n, k, lda, ldb, ldc) || alpha == nullptr || beta == nullptr) return kInvalidValue;
  auto* g = new (std::nothrow) Gemm<T>{m, n, k, *alpha, *beta, a, lda, b, ldb, c, ldc};
  if (g == nullptr) return kAllocFailed;
  return Enqueue(handle, 2.0 * m * n * k, g);
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

// One element type for A, B and C (bf16, fp16 or fp32), fp32 compute, alpha and beta as floats;
// any other combination is CUBLAS_STATUS_NOT_SUPPORTED. The algorithm argument is ignored.
__attribute__((visibility("default"))) int cublasGemmEx(void* handle, int transa, int transb, int m, int n, int k,
                                                        const void* alpha, const void* a, int atype, int lda,
                                                        const void* b, int btype, int ldb, const void* beta, void* c,
                                                        int ctype, int ldc, int compute_type, int /*algo*/) {
  if (handle == nullptr) return kNotInitialized;
  if (transa != kOpN || transb != kOpN || atype != btype || atype != ctype ||
      (compute_type != kCompute32F && compute_type != kCompute32FFastTf32)) {
    return kNotSupported;
  }
  if (!ShapeOk(m, n, k, lda, ldb, ldc) || alpha == nullptr || beta == nullptr) return kInvalidValue;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  switch (atype) {
    case kCudaR16Bf: return Launch16<Bf16>(handle, m, n, k, al, a, lda, b, ldb, be, c, ldc);
    case kCudaR16F: return Launch16<F16>(handle, m, n, k, al, a, lda, b, ldb, be, c, ldc);
    case kCudaR32F:
      return Launch(handle, kOpN, kOpN, m, n, k, &al, static_cast<const float*>(a), lda, static_cast<const float*>(b),
                    ldb, &be, static_cast<float*>(c), ldc);
    default: return kNotSupported;
  }
}

}  // extern "C"
