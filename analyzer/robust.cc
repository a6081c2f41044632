// Median and MAD. See robust.h for the contract.
#include "analyzer/robust.h"

#include <algorithm>
#include <cmath>

namespace falcon::analyzer {

double Median(std::span<const double> values, std::vector<double>& scratch) {
  scratch.assign(values.begin(), values.end());
  const std::size_t n = scratch.size();
  const std::size_t mid = n / 2;
  std::nth_element(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(mid),
                   scratch.end());
  const double upper = scratch[mid];
  if (n % 2 == 1) {
    return upper;
  }
  const double lower =
      *std::max_element(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(mid));
  return 0.5 * (lower + upper);
}

double RobustSigma(std::span<const double> values, std::vector<double>& scratch) {
  if (values.size() < 2) {
    return 0.0;
  }
  const double med = Median(values, scratch);
  std::vector<double> dev(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    dev[i] = std::fabs(values[i] - med);
  }
  return 1.4826 * Median(dev, scratch);
}

}  // namespace falcon::analyzer
