// In-place iterative radix-2 complex FFT, the engine behind the O(n log n) autocorrelation of
// period.cc. Internal to the analyzer (not part of its public API).
// Thread-safety: stateless; safe from any thread on distinct data.
// Must never: allocate beyond the twiddle table it builds per call, touch globals.
#pragma once

#include <complex>
#include <span>

namespace falcon::analyzer {

enum class FftDirection { kForward, kInverse };

// Transforms `data` in place. The inverse is unnormalised (caller divides by size).
// REQUIRES: data.size() is a power of two (1 allowed). The float version is twice as fast and
// accurate to ~1e-6 relative for the autocorrelations period.cc computes.
void Fft(std::span<std::complex<double>> data, FftDirection direction);
void Fft(std::span<std::complex<float>> data, FftDirection direction);

// Circular autocorrelation of `data` in place, unnormalised (divide by size):
// data[k] = sum_i conj(x[i]) x[i + k mod n], the real part is what period.cc needs. A forward
// decimation-in-frequency pass leaves the spectrum in bit-reversed order, the power spectrum is
// pointwise, and a decimation-in-time inverse takes bit-reversed input — so neither transform
// needs the bit-reversal permutation. REQUIRES: data.size() is a power of two.
void Autocorrelate(std::span<std::complex<float>> data);

}  // namespace falcon::analyzer
