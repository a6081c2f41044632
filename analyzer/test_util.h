// Deterministic generators for the analyzer's unit tests (not part of the library).
// Thread-safety: each Rng is a plain value. Must never: read clocks or global state.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

namespace falcon::analyzer::testing {

// xorshift-based generator with uniform and Gaussian draws; same seed, same sequence.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed * 0x9e3779b97f4a7c15ULL + 1) {}
  std::uint64_t Next() {
    state_ ^= state_ << 13;
    state_ ^= state_ >> 7;
    state_ ^= state_ << 17;
    return state_;
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  double Gauss() {
    const double u = std::max(Uniform(), 1e-300);
    return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * std::numbers::pi * Uniform());
  }

 private:
  std::uint64_t state_;
};

}  // namespace falcon::analyzer::testing
