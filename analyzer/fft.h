// In-place radix-2 FFT autocorrelation, the engine behind the O(n log n) match-rate estimate of
// period.cc. Internal to the analyzer (not part of its public API).
// Thread-safety: stateless; safe from any thread on distinct data.
// Must never: allocate beyond the twiddle table it builds per call, touch globals.
#pragma once

#include <complex>
#include <span>

namespace falcon::analyzer {

// Circular autocorrelation of `data` in place, unnormalised (divide by size):
// data[k] = sum_i conj(x[i]) x[i + k mod n], the real part is what period.cc needs. A forward
// decimation-in-frequency pass leaves the spectrum in bit-reversed order, the power spectrum is
// pointwise, and a decimation-in-time inverse takes bit-reversed input — so neither transform
// needs the bit-reversal permutation. Single precision: accurate to ~1e-6 relative for the sizes
// period.cc uses. REQUIRES: data.size() is a power of two.
void Autocorrelate(std::span<std::complex<float>> data);

}  // namespace falcon::analyzer
