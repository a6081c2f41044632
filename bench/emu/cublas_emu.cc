// The cuBLAS emulator: a libcublas.so.13 with the entry points Falcon's GEMM validation uses
// (cublasCreate_v2, cublasDestroy_v2, cublasSetStream_v2, cublasSgemm_v2), computing on the CPU
// over the CUDA driver emulator's "device" memory (host memory). Test fabric, like cuda_emu.cc.
// Column-major, as cuBLAS; only CUBLAS_OP_N is emulated (other ops: CUBLAS_STATUS_NOT_SUPPORTED).
// Thread-safety: a handle is used by one thread at a time, as with cuBLAS.
#include <cstdint>
#include <cstdlib>

namespace {

constexpr int kSuccess = 0;
constexpr int kNotInitialized = 1;
constexpr int kAllocFailed = 3;
constexpr int kInvalidValue = 7;
constexpr int kNotSupported = 15;
constexpr int kOpN = 0;

struct Handle {
  void* stream;
};

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
  if (handle == nullptr) return kNotInitialized;
  if (transa != kOpN || transb != kOpN) return kNotSupported;
  if (m < 0 || n < 0 || k < 0 || lda < (m > 1 ? m : 1) || ldb < (k > 1 ? k : 1) || ldc < (m > 1 ? m : 1) ||
      alpha == nullptr || beta == nullptr) {
    return kInvalidValue;
  }
  for (int j = 0; j < n; ++j) {
    float* cj = c + static_cast<int64_t>(j) * ldc;
    for (int i = 0; i < m; ++i) cj[i] = *beta == 0.0f ? 0.0f : cj[i] * *beta;  // beta 0: C is not read
    for (int p = 0; p < k; ++p) {
      const float bpj = *alpha * b[static_cast<int64_t>(j) * ldb + p];
      const float* ap = a + static_cast<int64_t>(p) * lda;
      for (int i = 0; i < m; ++i) cj[i] += ap[i] * bpj;
    }
  }
  return kSuccess;
}

}  // extern "C"
