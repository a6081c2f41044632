// Radix-2 decimation-in-time FFT. See fft.h for the contract.
#include "analyzer/fft.h"

#include <cmath>
#include <numbers>
#include <utility>
#include <vector>

namespace falcon::analyzer {

namespace {

template <typename T>
void FftImpl(std::span<std::complex<T>> data, FftDirection direction) {
  const std::size_t n = data.size();
  if (n < 2) {
    return;
  }
  for (std::size_t i = 1, j = 0; i < n; ++i) {  // bit-reversal permutation
    std::size_t bit = n >> 1;
    for (; (j & bit) != 0; bit >>= 1) {
      j ^= bit;
    }
    j ^= bit;
    if (i < j) {
      std::swap(data[i], data[j]);
    }
  }
  const T sign = direction == FftDirection::kForward ? T{-1} : T{1};
  // Twiddles for the largest stage; smaller stages read them with a stride.
  std::vector<T> wr(n / 2), wi(n / 2);
  for (std::size_t k = 0; k < n / 2; ++k) {
    // Twiddles in double precision, rounded once to T.
    const double angle = static_cast<double>(sign) * 2.0 * std::numbers::pi * static_cast<double>(k) /
                         static_cast<double>(n);
    wr[k] = static_cast<T>(std::cos(angle));
    wi[k] = static_cast<T>(std::sin(angle));
  }
  // Plain real arithmetic: std::complex multiplication would call the Annex G NaN-recovery path.
  auto* v = reinterpret_cast<T*>(data.data());  // std::complex<T> is layout-compatible with T[2]
  for (std::size_t len = 2; len <= n; len <<= 1) {
    const std::size_t half = len / 2;
    const std::size_t step = n / len;
    for (std::size_t start = 0; start < n; start += len) {
      for (std::size_t k = 0; k < half; ++k) {
        const T cr = wr[k * step];
        const T ci = wi[k * step];
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

// cos/sin of 2*pi*k/n for k in [0, n/2), from one octant of sincos calls and symmetry.
void Twiddles(std::size_t n, std::vector<float>* wr, std::vector<float>* wi) {
  const std::size_t half = n / 2, quarter = n / 4, eighth = n / 8;
  wr->assign(half, 0.0f);
  wi->assign(half, 0.0f);
  if (n < 8) {
    for (std::size_t k = 0; k < half; ++k) {
      const double a = 2.0 * std::numbers::pi * static_cast<double>(k) / static_cast<double>(n);
      (*wr)[k] = static_cast<float>(std::cos(a));
      (*wi)[k] = static_cast<float>(std::sin(a));
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
    (*wr)[k] = static_cast<float>(ck);
    (*wi)[k] = static_cast<float>(sk);
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
  for (std::size_t len = 2; len <= n; len <<= 1) {
    const std::size_t half = len / 2;
    const std::size_t step = n / len;
    for (std::size_t start = 0; start < n; start += len) {
      for (std::size_t k = 0; k < half; ++k) {
        const float cr = wr[k * step], ci = wi[k * step];
        float* a = v + 2 * (start + k);
        float* b = v + 2 * (start + k + half);
        const float br = b[0] * cr - b[1] * ci;
        const float bi = b[0] * ci + b[1] * cr;
        b[0] = a[0] - br;
        b[1] = a[1] - bi;
        a[0] += br;
        a[1] += bi;
      }
    }
  }
}

void Fft(std::span<std::complex<double>> data, FftDirection direction) { FftImpl(data, direction); }
void Fft(std::span<std::complex<float>> data, FftDirection direction) { FftImpl(data, direction); }

}  // namespace falcon::analyzer
