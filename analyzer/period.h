// Iteration period of a call-signature sequence (FALCON §4.2): the smallest lag at which the
// sequence repeats itself. The paper takes the first lag whose autocorrelation exceeds 0.95;
// here the ACF of a categorical sequence is its match rate m(k) = #{i : s[i] == s[i+k]} / (n-k),
// estimated for every lag at once in O(n log n) with FFTs of random unit-phase embeddings, then
// confirmed exactly on the best candidates. The chosen lag is the smallest divisor of the
// best-matching lag that matches (almost) as well, so sub-patterns that repeat inside an
// iteration (per-layer TP collectives) never win over the true period, and calls that occur only
// in some iterations (periodic logging, checkpoint barriers) only lower m(k) a little.
// Thread-safety: stateless functions; safe from any thread.
// Must never: do I/O, read clocks, keep state between calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace falcon::analyzer {

struct PeriodOptions {
  double acf_threshold = 0.95;   // a lag qualifies when its exact match rate reaches this
  std::size_t min_period = 1;    // smallest lag considered
  std::size_t max_period = 0;    // largest lag considered; 0 = n / 2 (two full repetitions)
  std::size_t max_candidates = 64;  // lags confirmed exactly after the FFT estimate
  // A divisor d of the best lag k* is preferred when 1 - m(d) <= divisor_slack * (1 - m(k*)) +
  // divisor_tolerance.
  double divisor_slack = 2.0;
  double divisor_tolerance = 0.002;
  // Calls that occur in fewer than this fraction of iterations (periodic logging all-reduces,
  // checkpoint barriers, evaluation) are ignored and the period is sought again without them.
  // 0 disables.
  double rare_fraction = 0.5;
};

struct PeriodResult {
  bool found = false;
  std::size_t period = 0;  // calls per iteration; 0 when !found
  double acf = 0.0;        // exact match rate at `period`
  std::size_t best_lag = 0;  // best exactly-confirmed lag even when !found (diagnostics)
  // Symbols ignored as occasional (indexed by symbol id; empty when none). `period` counts calls
  // of the sequence without them.
  std::vector<bool> ignored;
};

// `symbols` without the symbols flagged in `ignored` (symbol ids beyond its size are kept).
[[nodiscard]] std::vector<std::uint32_t> WithoutIgnored(std::span<const std::uint32_t> symbols,
                                                       const std::vector<bool>& ignored);

// Exact match rate at `lag`: fraction of i in [0, n - lag) with s[i] == s[i + lag]; 0 if lag >= n.
[[nodiscard]] double MatchRate(std::span<const std::uint32_t> symbols, std::size_t lag);

// Finds the period of `symbols`. Cost O(n log n) plus O(n) per confirmed candidate; at most two
// passes (the second without occasional symbols).
[[nodiscard]] PeriodResult FindPeriod(std::span<const std::uint32_t> symbols,
                                      const PeriodOptions& options = {});

}  // namespace falcon::analyzer
