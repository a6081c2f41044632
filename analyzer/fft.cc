// Radix-2 decimation-in-time FFT. See fft.h for the contract.
#include "analyzer/fft.h"

#include <cmath>
#include <numbers>
#include <utility>
#include <vector>

namespace falcon::analyzer {

void Fft(std::span<std::complex<double>> data, FftDirection direction) {
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
  const double sign = direction == FftDirection::kForward ? -1.0 : 1.0;
  // Twiddles for the largest stage; smaller stages read them with a stride.
  std::vector<double> wr(n / 2), wi(n / 2);
  for (std::size_t k = 0; k < n / 2; ++k) {
    const double angle = sign * 2.0 * std::numbers::pi * static_cast<double>(k) /
                         static_cast<double>(n);
    wr[k] = std::cos(angle);
    wi[k] = std::sin(angle);
  }
  // Plain real arithmetic: std::complex multiplication would call the Annex G NaN-recovery path.
  auto* v = reinterpret_cast<double*>(data.data());  // std::complex<double> is layout-compatible
  for (std::size_t len = 2; len <= n; len <<= 1) {
    const std::size_t half = len / 2;
    const std::size_t step = n / len;
    for (std::size_t start = 0; start < n; start += len) {
      for (std::size_t k = 0; k < half; ++k) {
        const double cr = wr[k * step];
        const double ci = wi[k * step];
        double* a = v + 2 * (start + k);
        double* b = v + 2 * (start + k + half);
        const double br = b[0] * cr - b[1] * ci;
        const double bi = b[0] * ci + b[1] * cr;
        b[0] = a[0] - br;
        b[1] = a[1] - bi;
        a[0] += br;
        a[1] += bi;
      }
    }
  }
}

}  // namespace falcon::analyzer
