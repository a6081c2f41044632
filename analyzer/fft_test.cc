// Tests for the FFT autocorrelation against the O(n^2) definition.
#include "analyzer/fft.h"

#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <cstdint>
#include <vector>

namespace falcon::analyzer {
namespace {

TEST(FftTest, AutocorrelationMatchesDirectSumForEverySize) {
  for (std::size_t n : {1u, 2u, 4u, 8u, 16u, 64u, 256u, 1024u}) {
    std::vector<std::complex<float>> x(n);
    std::uint64_t state = 0x9e3779b97f4a7c15ull + n;
    for (auto& v : x) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const double angle = static_cast<double>(state >> 11) * 0x1.0p-53 * 6.283185307179586;
      v = {static_cast<float>(std::cos(angle)), static_cast<float>(std::sin(angle))};
    }
    std::vector<std::complex<float>> got = x;
    Autocorrelate(got);
    for (std::size_t k = 0; k < n; ++k) {
      std::complex<double> want = 0;
      for (std::size_t i = 0; i < n; ++i) {
        want += std::conj(std::complex<double>(x[i])) * std::complex<double>(x[(i + k) % n]);
      }
      // Unnormalised: the inverse transform leaves a factor n.
      EXPECT_NEAR(static_cast<double>(got[k].real()) / static_cast<double>(n), want.real(), 1e-3 * static_cast<double>(n))
          << "n=" << n << " k=" << k;
    }
  }
}

TEST(FftTest, PeriodicSequenceHasFullCorrelationAtItsPeriod) {
  const std::size_t n = 512, period = 8;
  std::vector<std::complex<float>> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double angle = 0.7 * static_cast<double>(i % period);
    x[i] = {static_cast<float>(std::cos(angle)), static_cast<float>(std::sin(angle))};
  }
  Autocorrelate(x);
  EXPECT_NEAR(static_cast<double>(x[period].real()) / static_cast<double>(n), static_cast<double>(n), 1e-2);
  EXPECT_LT(std::abs(static_cast<double>(x[1].real())) / static_cast<double>(n), 0.9 * static_cast<double>(n));
}

}  // namespace
}  // namespace falcon::analyzer
