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
// REQUIRES: data.size() is a power of two (1 allowed).
void Fft(std::span<std::complex<double>> data, FftDirection direction);

}  // namespace falcon::analyzer
