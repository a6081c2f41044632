// Element conversions and reduction kernels; see datatypes.h for the numeric contract.
// Thread-safety: stateless except for immutable decode tables built on first use (magic statics).
// Must never: allocate, block, or depend on the floating-point rounding mode being changed
// (it relies on the default round-to-nearest-even mode for nearbyint).
#include "datatypes.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace falcon::emu {
namespace {

// A binary floating format narrower than float: sign, `ebits` exponent, `mbits` mantissa.
struct SmallFmt {
  int ebits;
  int mbits;
  bool has_inf;      // IEEE-style all-ones exponent = inf/NaN (false for e4m3 FN)
  bool satfinite;    // overflow and inf saturate to the largest finite value
  double max_finite;
  uint32_t max_bits;  // encoding of max_finite (no sign)
  uint32_t inf_bits;
  uint32_t nan_bits;
};
constexpr SmallFmt kHalf{5, 10, true, false, 65504.0, 0x7BFF, 0x7C00, 0x7E00};
constexpr SmallFmt kE4M3{4, 3, false, true, 448.0, 0x7E, 0x7E, 0x7F};
constexpr SmallFmt kE5M2{5, 2, true, true, 57344.0, 0x7B, 0x7C, 0x7F};

uint32_t EncodeSmall(float f, const SmallFmt& F) {
  const uint32_t sign = std::signbit(f) ? (1u << (F.ebits + F.mbits)) : 0u;
  if (std::isnan(f)) return sign | F.nan_bits;
  const double a = std::fabs(static_cast<double>(f));
  const uint32_t overflow = F.satfinite ? F.max_bits : F.inf_bits;
  if (std::isinf(a)) return sign | overflow;
  if (a == 0.0) return sign;
  const int bias = (1 << (F.ebits - 1)) - 1;
  const int emin = 1 - bias;
  int e = std::ilogb(a);
  if (e < emin) e = emin;
  const double quantum = std::ldexp(1.0, e - F.mbits);
  const double r = std::nearbyint(a / quantum) * quantum;  // exact: quantum is a power of two
  if (r > F.max_finite) return sign | overflow;
  if (r == 0.0) return sign;
  const int er = std::ilogb(r);
  if (er < emin) {
    return sign | static_cast<uint32_t>(r / std::ldexp(1.0, emin - F.mbits));
  }
  const auto mant = static_cast<uint32_t>(r / std::ldexp(1.0, er - F.mbits)) - (1u << F.mbits);
  return sign | (static_cast<uint32_t>(er + bias) << F.mbits) | mant;
}

float DecodeSmall(uint32_t v, const SmallFmt& F) {
  const uint32_t mmask = (1u << F.mbits) - 1;
  const uint32_t emask = (1u << F.ebits) - 1;
  const bool neg = (v >> (F.ebits + F.mbits)) & 1u;
  const uint32_t exp = (v >> F.mbits) & emask;
  const uint32_t mant = v & mmask;
  const int bias = (1 << (F.ebits - 1)) - 1;
  double r;
  if (F.has_inf && exp == emask) {
    r = mant ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (!F.has_inf && exp == emask && mant == mmask) {
    r = std::numeric_limits<double>::quiet_NaN();
  } else if (exp == 0) {
    r = std::ldexp(static_cast<double>(mant), 1 - bias - F.mbits);
  } else {
    r = std::ldexp(static_cast<double>(mant | (1u << F.mbits)), static_cast<int>(exp) - bias - F.mbits);
  }
  return static_cast<float>(neg ? -r : r);
}

template <const SmallFmt& F>
const std::array<float, 256>& Fp8Table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) t[i] = DecodeSmall(i, F);
    return t;
  }();
  return table;
}

// Codecs: storage type S, accumulation type A.
template <class T>
struct Plain {
  using S = T;
  using A = T;
  static A L(S v) { return v; }
  static S E(A v) { return v; }
};
struct Half {
  using S = uint16_t;
  using A = float;
  static A L(S v) { return HalfToFloat(v); }
  static S E(A v) { return FloatToHalf(v); }
};
struct Bf16 {
  using S = uint16_t;
  using A = float;
  static A L(S v) { return Bf16ToFloat(v); }
  static S E(A v) { return FloatToBf16(v); }
};
struct E4 {
  using S = uint8_t;
  using A = float;
  static A L(S v) { return Fp8Table<kE4M3>()[v]; }
  static S E(A v) { return FloatToE4M3(v); }
};
struct E5 {
  using S = uint8_t;
  using A = float;
  static A L(S v) { return Fp8Table<kE5M2>()[v]; }
  static S E(A v) { return FloatToE5M2(v); }
};

template <class A>
A Add(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}
template <class A>
A Mul(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::conditional_t<(sizeof(A) < sizeof(unsigned)), unsigned, std::make_unsigned_t<A>>;
    return static_cast<A>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

template <class C, class Op>
void ReduceT(void* dst, const void* const* srcs, int nsrc, size_t n, Op op) {
  using S = typename C::S;
  using A = typename C::A;
  constexpr size_t kBlock = 512;
  A acc[kBlock];
  auto* d = static_cast<S*>(dst);
  for (size_t base = 0; base < n; base += kBlock) {
    const size_t len = n - base < kBlock ? n - base : kBlock;
    const S* s0 = static_cast<const S*>(srcs[0]) + base;
    for (size_t k = 0; k < len; ++k) acc[k] = C::L(s0[k]);
    for (int j = 1; j < nsrc; ++j) {
      const S* sj = static_cast<const S*>(srcs[j]) + base;
      for (size_t k = 0; k < len; ++k) acc[k] = op(acc[k], C::L(sj[k]));
    }
    for (size_t k = 0; k < len; ++k) d[base + k] = C::E(acc[k]);
  }
}

template <class C>
void ReduceOp(RedKind op, void* dst, const void* const* srcs, int nsrc, size_t n) {
  using A = typename C::A;
  switch (op) {
    case RedKind::kSum: return ReduceT<C>(dst, srcs, nsrc, n, [](A a, A b) { return Add(a, b); });
    case RedKind::kProd: return ReduceT<C>(dst, srcs, nsrc, n, [](A a, A b) { return Mul(a, b); });
    case RedKind::kMax: return ReduceT<C>(dst, srcs, nsrc, n, [](A a, A b) { return b > a ? b : a; });
    case RedKind::kMin: return ReduceT<C>(dst, srcs, nsrc, n, [](A a, A b) { return b < a ? b : a; });
  }
}

template <class C>
void ScaleT(void* dst, const void* src, size_t n, const Scalar& s) {
  using S = typename C::S;
  using A = typename C::A;
  A m;
  if constexpr (std::is_integral_v<A>) {
    m = static_cast<A>(s.i);
  } else {
    m = static_cast<A>(s.f);
  }
  const S* in = static_cast<const S*>(src);
  S* out = static_cast<S*>(dst);
  for (size_t k = 0; k < n; ++k) out[k] = C::E(Mul(C::L(in[k]), m));
}

template <class T>
void DivideT(void* dst, size_t n, int64_t divisor) {
  T* d = static_cast<T*>(dst);
  if constexpr (std::is_signed_v<T>) {
    for (size_t k = 0; k < n; ++k) d[k] = static_cast<T>(static_cast<int64_t>(d[k]) / divisor);
  } else {
    const auto u = static_cast<uint64_t>(divisor);
    for (size_t k = 0; k < n; ++k) d[k] = static_cast<T>(static_cast<uint64_t>(d[k]) / u);
  }
}

// Calls fn.template operator()<Codec>() for the codec of `t`.
template <class Fn>
void Dispatch(DType t, Fn&& fn) {
  switch (t) {
    case DType::kInt8: return fn.template operator()<Plain<int8_t>>();
    case DType::kUint8: return fn.template operator()<Plain<uint8_t>>();
    case DType::kInt32: return fn.template operator()<Plain<int32_t>>();
    case DType::kUint32: return fn.template operator()<Plain<uint32_t>>();
    case DType::kInt64: return fn.template operator()<Plain<int64_t>>();
    case DType::kUint64: return fn.template operator()<Plain<uint64_t>>();
    case DType::kFloat16: return fn.template operator()<Half>();
    case DType::kFloat32: return fn.template operator()<Plain<float>>();
    case DType::kFloat64: return fn.template operator()<Plain<double>>();
    case DType::kBfloat16: return fn.template operator()<Bf16>();
    case DType::kFp8E4M3: return fn.template operator()<E4>();
    case DType::kFp8E5M2: return fn.template operator()<E5>();
  }
}

}  // namespace

bool IsValidDType(int v) { return v >= 0 && v < kNumDTypes; }

size_t DTypeSize(DType t) {
  static constexpr size_t kSizes[kNumDTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return kSizes[static_cast<int>(t)];
}

bool IsFloatDType(DType t) { return static_cast<int>(t) >= static_cast<int>(DType::kFloat16); }

const char* DTypeName(DType t) {
  static constexpr const char* kNames[kNumDTypes] = {"int8", "uint8", "int32", "uint32",
      "int64", "uint64", "half", "float", "double", "bfloat16", "fp8e4m3", "fp8e5m2"};
  return IsValidDType(static_cast<int>(t)) ? kNames[static_cast<int>(t)] : "invalid";
}

float HalfToFloat(uint16_t h) {
  static const std::vector<float>* table = [] {
    auto* t = new std::vector<float>(65536);  // leaked on purpose: used until exit
    for (uint32_t i = 0; i < 65536; ++i) (*t)[i] = DecodeSmall(i, kHalf);
    return t;
  }();
  return (*table)[h];
}
uint16_t FloatToHalf(float f) { return static_cast<uint16_t>(EncodeSmall(f, kHalf)); }
float Bf16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN
  bits += 0x7FFFu + ((bits >> 16) & 1u);  // round to nearest even (overflow rounds to inf)
  return static_cast<uint16_t>(bits >> 16);
}
float E4M3ToFloat(uint8_t v) { return Fp8Table<kE4M3>()[v]; }
uint8_t FloatToE4M3(float f) { return static_cast<uint8_t>(EncodeSmall(f, kE4M3)); }
float E5M2ToFloat(uint8_t v) { return Fp8Table<kE5M2>()[v]; }
uint8_t FloatToE5M2(float f) { return static_cast<uint8_t>(EncodeSmall(f, kE5M2)); }

Scalar LoadScalar(DType t, const void* p) {
  Scalar s;
  Dispatch(t, [&]<class C>() {
    typename C::S v;
    std::memcpy(&v, p, sizeof v);
    const auto a = C::L(v);
    if constexpr (std::is_integral_v<decltype(a)>) {
      s.i = static_cast<int64_t>(a);
      s.f = static_cast<double>(a);
    } else {
      s.f = static_cast<double>(a);
      s.i = static_cast<int64_t>(a);
    }
  });
  return s;
}

void ScaleCopy(DType t, void* dst, const void* src, size_t n, const Scalar& s) {
  const bool identity = IsFloatDType(t) ? s.f == 1.0 : s.i == 1;
  if (identity) {
    if (dst != src && n != 0) std::memmove(dst, src, n * DTypeSize(t));
    return;
  }
  Dispatch(t, [&]<class C>() { ScaleT<C>(dst, src, n, s); });
}

void Reduce(DType t, RedKind op, void* dst, const void* const* srcs, int nsrc, size_t n) {
  Dispatch(t, [&]<class C>() { ReduceOp<C>(op, dst, srcs, nsrc, n); });
}

void IntDivide(DType t, void* dst, size_t n, int64_t divisor) {
  switch (t) {
    case DType::kInt8: return DivideT<int8_t>(dst, n, divisor);
    case DType::kUint8: return DivideT<uint8_t>(dst, n, divisor);
    case DType::kInt32: return DivideT<int32_t>(dst, n, divisor);
    case DType::kUint32: return DivideT<uint32_t>(dst, n, divisor);
    case DType::kInt64: return DivideT<int64_t>(dst, n, divisor);
    case DType::kUint64: return DivideT<uint64_t>(dst, n, divisor);
    default: return;
  }
}

}  // namespace falcon::emu
