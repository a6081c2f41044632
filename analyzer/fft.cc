// Radix-2 FFT autocorrelation. See fft.h for the contract.
#include "analyzer/fft.h"

#include <cmath>
#include <numbers>
#include <vector>

namespace falcon::analyzer {

namespace {

// cos/sin of 2*pi*k/n for k in [0, n/2), in double precision from one octant of sincos calls
// and symmetry, rounded once to T.
template <typename T>
void Twiddles(std::size_t n, std::vector<T>* wr, std::vector<T>* wi) {
  const std::size_t half = n / 2, quarter = n / 4, eighth = n / 8;
  wr->assign(half, T{0});
  wi->assign(half, T{0});
  if (n < 8) {
    for (std::size_t k = 0; k < half; ++k) {
      const double a = 2.0 * std::numbers::pi * static_cast<double>(k) / static_cast<double>(n);
      (*wr)[k] = static_cast<T>(std::cos(a));
      (*wi)[k] = static_cast<T>(std::sin(a));
    }
    return;
  }
  std::vector<double> c(eighth + 1), sn(eighth + 1);
  for (std::size_t k = 0; k <= eighth; ++k) {
    const double a = 2.0 * std::numbers::pi * static_cast<double>(k) / static_cast<double>(n);
    c[k] = std::cos(a);
    sn[k] = std::sin(a);
  }
  for (std::size_t k = 0; k < half; ++k) {
    double ck, sk;
    if (k <= eighth) {
      ck = c[k];
      sk = sn[k];
    } else if (k <= quarter) {  // theta = pi/2 - phi
      ck = sn[quarter - k];
      sk = c[quarter - k];
    } else if (k < half - eighth) {  // theta = pi/2 + phi
      ck = -sn[k - quarter];
      sk = c[k - quarter];
    } else {  // theta = pi - phi
      ck = -c[half - k];
      sk = sn[half - k];
    }
    (*wr)[k] = static_cast<T>(ck);
    (*wi)[k] = static_cast<T>(sk);
  }
}

// Decimation-in-time butterflies over interleaved (re, im) pairs: bit-reversed order in, natural
// order out. sign = -1 forward, +1 inverse (unnormalised). Plain real arithmetic: std::complex
// multiplication would call the Annex G NaN-recovery path.
template <typename T>
void DitStages(T* v, std::size_t n, const std::vector<T>& wr, const std::vector<T>& wi, T sign) {
  for (std::size_t len = 2; len <= n; len <<= 1) {
    const std::size_t half = len / 2;
    const std::size_t step = n / len;
    for (std::size_t start = 0; start < n; start += len) {
      for (std::size_t k = 0; k < half; ++k) {
        const T cr = wr[k * step];
        const T ci = sign * wi[k * step];
        T* a = v + 2 * (start + k);
        T* b = v + 2 * (start + k + half);
        const T br = b[0] * cr - b[1] * ci;
        const T bi = b[0] * ci + b[1] * cr;
        b[0] = a[0] - br;
        b[1] = a[1] - bi;
        a[0] += br;
        a[1] += bi;
      }
    }
  }
}

}  // namespace

void Autocorrelate(std::span<std::complex<float>> data) {
  const std::size_t n = data.size();
  if (n < 2) {
    if (n == 1) data[0] = {std::norm(data[0]), 0.0f};
    return;
  }
  std::vector<float> wr, wi;
  Twiddles(n, &wr, &wi);
  auto* v = reinterpret_cast<float*>(data.data());
  // Forward DIF (twiddle e^{-i theta}): natural order in, bit-reversed order out.
  for (std::size_t len = n; len >= 2; len >>= 1) {
    const std::size_t half = len / 2;
    const std::size_t step = n / len;
    for (std::size_t start = 0; start < n; start += len) {
      for (std::size_t k = 0; k < half; ++k) {
        const float cr = wr[k * step], ci = -wi[k * step];
        float* a = v + 2 * (start + k);
        float* b = v + 2 * (start + k + half);
        const float dr = a[0] - b[0], di = a[1] - b[1];
        a[0] += b[0];
        a[1] += b[1];
        b[0] = dr * cr - di * ci;
        b[1] = dr * ci + di * cr;
      }
    }
  }
  for (std::size_t i = 0; i < n; ++i) {  // power spectrum: order does not matter
    const float re = v[2 * i], im = v[2 * i + 1];
    v[2 * i] = re * re + im * im;
    v[2 * i + 1] = 0.0f;
  }
  // Inverse DIT (twiddle e^{+i theta}): bit-reversed order in, natural order out.
  DitStages(v, n, wr, wi, 1.0f);
}

}  // namespace falcon::analyzer
