// Element types and reduction kernels of the NCCL emulator: the twelve ncclDataType_t formats,
// their conversions to and from float (round-to-nearest-even), and the element-wise reductions
// that every collective uses.
//
// Thread-safety: pure functions over caller-owned memory; safe to call from any thread.
// Must never: allocate, block, read the environment or the clock.
//
// Numeric contract (the same on every rank, so results are bit-identical):
//  * integers reduce in their own type with two's-complement wrap-around; Avg sums, then divides
//    by the rank count with C++ integer division (truncation toward zero), as NCCL does.
//  * fp16 / bf16 / fp8 reduce through float: every input is widened to float, the reduction runs
//    in float in rank order 0..n-1, and the result is rounded back once, to nearest-even.
//  * fp8 e4m3 is the OCP "FN" variant (no infinities; NaN = S.1111.111); e4m3 and e5m2 saturate
//    finite overflow and +-inf to the largest finite value (NCCL's __NV_SATFINITE), NaN stays NaN.
//  * float Avg and PreMulSum multiply each rank's input by the scalar before the sum (NCCL's
//    pre-multiplied sum), rounding the product back to the element type.
#ifndef FALCON_BENCH_EMU_DATATYPES_H_
#define FALCON_BENCH_EMU_DATATYPES_H_

#include <cstddef>
#include <cstdint>

namespace falcon::emu {

// Mirrors ncclDataType_t values (0..11); kept numeric so this header needs no nccl.h.
enum class DType : int {
  kInt8 = 0, kUint8 = 1, kInt32 = 2, kUint32 = 3, kInt64 = 4, kUint64 = 5,
  kFloat16 = 6, kFloat32 = 7, kFloat64 = 8, kBfloat16 = 9, kFp8E4M3 = 10, kFp8E5M2 = 11,
};
inline constexpr int kNumDTypes = 12;
inline constexpr size_t kMaxDTypeSize = 8;  // DTypeSize of the widest types (64-bit)

// The reduction applied element-wise after any pre-multiplication.
enum class RedKind : int { kSum = 0, kProd = 1, kMax = 2, kMin = 3 };

// A scalar for pre-multiplication, held in the widest type of its class.
struct Scalar {
  double f = 1.0;    // used for floating types
  int64_t i = 1;     // used for integer types (wraps to the element width)
};

[[nodiscard]] bool IsValidDType(int v);
[[nodiscard]] size_t DTypeSize(DType t);
[[nodiscard]] bool IsFloatDType(DType t);
[[nodiscard]] const char* DTypeName(DType t);

// Scalar conversions, exposed for tests and the reference implementation.
[[nodiscard]] float HalfToFloat(uint16_t h);
[[nodiscard]] uint16_t FloatToHalf(float f);
[[nodiscard]] float Bf16ToFloat(uint16_t b);
[[nodiscard]] uint16_t FloatToBf16(float f);
[[nodiscard]] float E4M3ToFloat(uint8_t v);
[[nodiscard]] uint8_t FloatToE4M3(float f);
[[nodiscard]] float E5M2ToFloat(uint8_t v);
[[nodiscard]] uint8_t FloatToE5M2(float f);

// Reads one element of `t` at `p` as a Scalar (used to load PreMulSum scalars).
[[nodiscard]] Scalar LoadScalar(DType t, const void* p);

// dst[k] = src[k] * s for k < n (dst may equal src). With s == identity it is a plain copy.
void ScaleCopy(DType t, void* dst, const void* src, size_t n, const Scalar& s);
// dst[k] = srcs[0][k] op srcs[1][k] op ... op srcs[nsrc-1][k], folded left in that order.
// dst may alias any source. REQUIRES: nsrc >= 1.
void Reduce(DType t, RedKind op, void* dst, const void* const* srcs, int nsrc, size_t n);
// Integer Avg post-step: dst[k] /= divisor (truncating). No-op for floating types.
void IntDivide(DType t, void* dst, size_t n, int64_t divisor);

}  // namespace falcon::emu

#endif  // FALCON_BENCH_EMU_DATATYPES_H_
