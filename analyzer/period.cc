// Period detection by FFT autocorrelation plus exact confirmation. See period.h.
#include "analyzer/period.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <complex>
#include <numbers>
#include <utility>
#include <vector>

#include "analyzer/fft.h"

namespace falcon::analyzer {
namespace {

// One random-phase projection: the estimate's noise on mismatched pairs is ~sqrt(n)/n (0.1 %
// at n = 100,000) and every candidate is confirmed exactly, so a second projection only cost time.
constexpr int kProjections = 1;

double Phase(std::uint32_t symbol, int projection) {
  // splitmix64 of (symbol, projection): a fixed pseudo-random phase per symbol.
  std::uint64_t x = (static_cast<std::uint64_t>(symbol) << 8) ^
                    static_cast<std::uint64_t>(projection) ^ 0x5851f42d4c957f2dULL;
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return 2.0 * std::numbers::pi * static_cast<double>(x >> 11) * 0x1.0p-53;
}

// Estimated match rate for lags [0, max_lag]: min over projections of Re(ACF) / overlap.
std::vector<double> EstimateMatchRates(std::span<const std::uint32_t> s, std::size_t max_lag) {
  const std::size_t n = s.size();
  // Zero padding to n + max_lag keeps lags <= max_lag free of circular wrap-around.
  const std::size_t size = std::bit_ceil(n + max_lag + 1);
  std::vector<double> estimate(max_lag + 1, 1.0);
  std::vector<std::complex<float>> buf(size);  // float: see fft.h
  std::uint32_t alphabet = 0;
  for (std::uint32_t v : s) {
    alphabet = std::max(alphabet, v + 1);
  }
  std::vector<std::complex<float>> phases(alphabet);
  for (int p = 0; p < kProjections; ++p) {
    for (std::uint32_t v = 0; v < alphabet; ++v) {
      const double angle = Phase(v, p);
      phases[v] = {static_cast<float>(std::cos(angle)), static_cast<float>(std::sin(angle))};
    }
    std::fill(buf.begin(), buf.end(), std::complex<float>{});
    for (std::size_t i = 0; i < n; ++i) {
      buf[i] = phases[s[i]];
    }
    Autocorrelate(buf);
    for (std::size_t k = 1; k <= max_lag; ++k) {
      const double rate =
          static_cast<double>(buf[k].real()) / static_cast<double>(size) / static_cast<double>(n - k);
      estimate[k] = std::min(estimate[k], rate);
    }
  }
  return estimate;
}

std::vector<std::size_t> TopCandidates(const std::vector<double>& estimate, std::size_t lo,
                                       std::size_t hi, const PeriodOptions& options) {
  std::vector<std::size_t> lags;
  const double floor = options.acf_threshold - 0.1;
  for (std::size_t k = lo; k <= hi; ++k) {
    if (estimate[k] >= floor) {
      lags.push_back(k);
    }
  }
  const std::size_t keep = std::min(lags.size(), options.max_candidates);
  std::partial_sort(lags.begin(), lags.begin() + static_cast<std::ptrdiff_t>(keep), lags.end(),
                    [&](std::size_t a, std::size_t b) {
                      return estimate[a] != estimate[b] ? estimate[a] > estimate[b] : a < b;
                    });
  lags.resize(keep);
  return lags;
}

// Occasional symbols: those in the lowest tier of occurrence counts when the next tier is at
// least 1 / fraction times more frequent (a logging all-reduce every 5 iterations vs calls made
// every iteration). Empty when the counts show no such gap.
std::vector<bool> RareSymbols(std::span<const std::uint32_t> s, double fraction) {
  std::vector<std::size_t> counts;
  for (std::uint32_t v : s) {
    if (v >= counts.size()) {
      counts.resize(std::size_t{v} + 1, 0);
    }
    ++counts[v];
  }
  std::vector<std::size_t> tiers;
  for (std::size_t c : counts) {
    if (c > 0) {
      tiers.push_back(c);
    }
  }
  std::sort(tiers.begin(), tiers.end());
  tiers.erase(std::unique(tiers.begin(), tiers.end()), tiers.end());
  std::size_t cut = 0;
  for (std::size_t k = 0; k + 1 < tiers.size(); ++k) {
    if (static_cast<double>(tiers[k]) < fraction * static_cast<double>(tiers[k + 1])) {
      cut = tiers[k];
      break;
    }
  }
  if (cut == 0) {
    return {};
  }
  std::vector<bool> rare(counts.size(), false);
  for (std::size_t v = 0; v < counts.size(); ++v) {
    rare[v] = counts[v] > 0 && counts[v] <= cut;
  }
  return rare;
}

PeriodResult FindPeriodOnce(std::span<const std::uint32_t> symbols, const PeriodOptions& options);

}  // namespace

std::vector<std::uint32_t> WithoutIgnored(std::span<const std::uint32_t> symbols,
                                          const std::vector<bool>& ignored) {
  std::vector<std::uint32_t> out;
  out.reserve(symbols.size());
  for (std::uint32_t v : symbols) {
    if (v >= ignored.size() || !ignored[v]) {
      out.push_back(v);
    }
  }
  return out;
}

PeriodResult FindPeriod(std::span<const std::uint32_t> symbols, const PeriodOptions& options) {
  PeriodResult first = FindPeriodOnce(symbols, options);
  if (options.rare_fraction <= 0.0) {
    return first;
  }
  std::vector<bool> rare = RareSymbols(symbols, options.rare_fraction);
  if (rare.empty()) {
    return first;
  }
  const std::vector<std::uint32_t> kept = WithoutIgnored(symbols, rare);
  PeriodOptions filtered = options;
  if (first.found) {
    // The filtered answer is only taken when it sees >= 1.5x the iterations (below), so its
    // period is at most that long: a shorter search (and a smaller FFT) suffices.
    const double longest = static_cast<double>(first.period) * static_cast<double>(kept.size()) /
                           static_cast<double>(symbols.size()) / 1.5;
    const auto cap = std::max<std::size_t>(1, static_cast<std::size_t>(longest));
    filtered.max_period = options.max_period == 0 ? cap : std::min(options.max_period, cap);
  }
  PeriodResult second = FindPeriodOnce(kept, filtered);
  if (!second.found) {
    return first;
  }
  // Prefer the filtered answer when it sees clearly more iterations (the unfiltered one locked
  // onto a super-cycle spanning several iterations, or found nothing).
  const double cycles_first =
      first.found ? static_cast<double>(symbols.size()) / static_cast<double>(first.period) : 0.0;
  const double cycles_second =
      static_cast<double>(kept.size()) / static_cast<double>(second.period);
  if (first.found && cycles_second < 1.5 * cycles_first) {
    return first;
  }
  // The capped search cannot see the filtered image of the first period, so the filtered answer
  // must also repeat (almost) as well as the first: the same rule as for divisors.
  if (first.found &&
      1.0 - second.acf > options.divisor_slack * (1.0 - first.acf) + options.divisor_tolerance) {
    return first;
  }
  // Filter only if the occasional block is small next to an iteration: [40 calls] x 5 + [1 logging
  // call] is filtered; [2 per-layer calls] x 48 + [2 data-parallel calls] is the iteration itself
  // and is not. Also when the unfiltered sequence does not repeat: a window that mixes two
  // patterns with a burst of one call must not lock onto the burst's symbol alone (period 1).
  std::size_t rare_calls = symbols.size() - kept.size();
  std::size_t max_rare_count = 0;
  std::vector<std::size_t> rare_counts(rare.size(), 0);
  for (std::uint32_t v : symbols) {
    if (v < rare.size() && rare[v]) {
      max_rare_count = std::max(max_rare_count, ++rare_counts[v]);
    }
  }
  const double block = static_cast<double>(rare_calls) /
                       static_cast<double>(std::max<std::size_t>(max_rare_count, 1));
  if (block > 0.25 * static_cast<double>(second.period)) {
    return first;
  }
  second.ignored = std::move(rare);
  return second;
}

double MatchRate(std::span<const std::uint32_t> symbols, std::size_t lag) {
  const std::size_t n = symbols.size();
  if (lag == 0 || lag >= n) {
    return lag == 0 && n > 0 ? 1.0 : 0.0;
  }
  std::size_t same = 0;
  for (std::size_t i = 0; i + lag < n; ++i) {
    same += symbols[i] == symbols[i + lag] ? 1U : 0U;
  }
  return static_cast<double>(same) / static_cast<double>(n - lag);
}

namespace {

PeriodResult FindPeriodOnce(std::span<const std::uint32_t> symbols, const PeriodOptions& options) {
  const std::size_t n = symbols.size();
  const std::size_t hi = options.max_period == 0 ? n / 2 : std::min(options.max_period, n / 2);
  const std::size_t lo = std::max<std::size_t>(1, options.min_period);
  if (n < 2 || lo > hi) {
    return {};
  }
  const std::vector<double> estimate = EstimateMatchRates(symbols, hi);
  std::size_t best = 0;
  double best_rate = -1.0;
  for (std::size_t lag : TopCandidates(estimate, lo, hi, options)) {
    const double rate = MatchRate(symbols, lag);
    if (rate > best_rate || (rate == best_rate && lag < best)) {
      best = lag;
      best_rate = rate;
    }
  }
  if (best == 0 || best_rate < options.acf_threshold) {
    PeriodResult none;
    none.best_lag = best;
    return none;
  }
  const double allowed = options.divisor_slack * (1.0 - best_rate) + options.divisor_tolerance;
  for (std::size_t d = lo; d < best; ++d) {
    if (best % d != 0) {
      continue;
    }
    const double rate = MatchRate(symbols, d);
    if (rate >= options.acf_threshold && 1.0 - rate <= allowed) {
      return {true, d, rate, best, {}};
    }
  }
  return {true, best, best_rate, best, {}};
}

}  // namespace

}  // namespace falcon::analyzer
