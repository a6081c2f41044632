// Robust statistics shared by the analyzer's algorithms: median and the median absolute
// deviation over small windows. Pure functions over values the caller owns.
// Thread-safety: stateless; safe to call from any thread.
// Must never: allocate outside the scratch vector the caller passes, read clocks or globals.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace falcon::analyzer {

// Median of `values` (mean of the two middle values for an even count). Uses `scratch` as working
// storage (its contents are replaced). REQUIRES: !values.empty().
[[nodiscard]] double Median(std::span<const double> values, std::vector<double>& scratch);

// Robust standard deviation: 1.4826 * median(|x - median(x)|), consistent for Gaussian noise.
// Returns 0 for fewer than two values.
[[nodiscard]] double RobustSigma(std::span<const double> values, std::vector<double>& scratch);

}  // namespace falcon::analyzer
