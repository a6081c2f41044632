// Anchor-to-anchor iteration times. See iteration_series.h for the contract.
#include "analyzer/iteration_series.h"

#include <algorithm>
#include <optional>

namespace falcon::analyzer {
namespace {

// First i with symbols[i, i + p) == symbols[i + p, i + 2p), by a sliding count of matches.
std::optional<std::size_t> FirstExactCycle(std::span<const std::uint32_t> s, std::size_t p) {
  if (s.size() < 2 * p) {
    return std::nullopt;
  }
  std::size_t matches = 0;
  for (std::size_t j = 0; j < p; ++j) {
    matches += s[j] == s[j + p] ? 1U : 0U;
  }
  for (std::size_t i = 0;; ++i) {
    if (matches == p) {
      return i;
    }
    if (i + 2 * p >= s.size()) {
      return std::nullopt;
    }
    matches -= s[i] == s[i + p] ? 1U : 0U;
    matches += s[i + p] == s[i + 2 * p] ? 1U : 0U;
  }
}

// Phase whose preceding gap has the largest median over the first cycles.
std::size_t BoundaryPhase(std::span<const std::uint32_t> s, std::span<const std::int64_t> t,
                          std::size_t ref, std::size_t p, std::size_t cycles) {
  std::size_t best = 0;
  std::int64_t best_gap = -1;
  std::vector<std::int64_t> gaps;
  for (std::size_t phase = 0; phase < p; ++phase) {
    gaps.clear();
    for (std::size_t c = 0; c < cycles; ++c) {
      const std::size_t i = ref + phase + c * p;
      if (i >= s.size()) {
        break;
      }
      if (i > 0 && s[i] == s[ref + phase]) {
        gaps.push_back(t[i] - t[i - 1]);
      }
    }
    if (gaps.empty()) {
      continue;
    }
    auto mid = gaps.begin() + static_cast<std::ptrdiff_t>(gaps.size() / 2);
    std::nth_element(gaps.begin(), mid, gaps.end());
    if (*mid > best_gap) {
      best_gap = *mid;
      best = phase;
    }
  }
  return best;
}

bool ContextAt(std::span<const std::uint32_t> s, std::size_t pos,
               std::span<const std::uint32_t> context) {
  if (pos + context.size() > s.size()) {
    return false;
  }
  return std::equal(context.begin(), context.end(), s.begin() + static_cast<std::ptrdiff_t>(pos));
}

// Anchor-to-anchor samples from `pos`, an occurrence of `context`.
std::vector<IterationSample> Walk(std::span<const std::uint32_t> symbols,
                                  std::span<const std::int64_t> t_ns, std::size_t n,
                                  std::size_t period, std::span<const std::uint32_t> context,
                                  std::size_t pos, const IterationSeriesOptions& options) {
  std::vector<IterationSample> out;
  const auto slack = std::max<std::size_t>(
      2, static_cast<std::size_t>(options.search_fraction * static_cast<double>(period)));
  while (pos + period < n) {
    std::optional<std::size_t> next;
    const std::size_t expected = pos + period;
    for (std::size_t d = 0; d <= slack && !next; ++d) {
      if (ContextAt(symbols, expected + d, context)) {
        next = expected + d;
      } else if (d > 0 && expected - d > pos && ContextAt(symbols, expected - d, context)) {
        next = expected - d;
      }
    }
    if (next) {
      out.push_back({pos, t_ns[pos], static_cast<double>(t_ns[*next] - t_ns[pos]) * 1e-9});
      pos = *next;
      continue;
    }
    std::size_t scan = expected + slack + 1;  // lost alignment: resynchronise, no sample
    while (scan < n && !ContextAt(symbols, scan, context)) {
      ++scan;
    }
    pos = scan;
  }
  return out;
}

}  // namespace

std::optional<IterationAnchor> FindIterationAnchor(std::span<const std::uint32_t> symbols,
                                                   std::span<const std::int64_t> t_ns,
                                                   std::size_t period,
                                                   const IterationSeriesOptions& options) {
  const std::size_t n = std::min(symbols.size(), t_ns.size());
  if (period == 0 || n < 2 * period) {
    return std::nullopt;
  }
  const auto ref = FirstExactCycle(symbols.first(n), period);
  if (!ref) {
    return std::nullopt;
  }
  IterationAnchor anchor;
  const std::size_t phase = BoundaryPhase(symbols.first(n), t_ns.first(n), *ref, period, options.gap_cycles);
  anchor.position = *ref + phase;
  for (std::size_t j = 0; j < std::clamp<std::size_t>(options.context, 1, period); ++j) {
    anchor.context.push_back(symbols[*ref + (phase + j) % period + (phase + j >= period ? period : 0)]);
  }
  return anchor;
}

std::vector<IterationSample> ExtractIterations(std::span<const std::uint32_t> symbols,
                                               std::span<const std::int64_t> t_ns,
                                               std::size_t period,
                                               const IterationSeriesOptions& options) {
  const auto anchor = FindIterationAnchor(symbols, t_ns, period, options);
  if (!anchor) {
    return {};
  }
  return ExtractIterationsAt(symbols, t_ns, period, *anchor, options);
}

std::vector<IterationSample> ExtractIterationsAt(std::span<const std::uint32_t> symbols,
                                                 std::span<const std::int64_t> t_ns,
                                                 std::size_t period, const IterationAnchor& anchor,
                                                 const IterationSeriesOptions& options) {
  const std::size_t n = std::min(symbols.size(), t_ns.size());
  if (period == 0 || anchor.context.empty() || !ContextAt(symbols.first(n), anchor.position, anchor.context)) {
    return {};
  }
  return Walk(symbols, t_ns, n, period, anchor.context, anchor.position, options);
}

}  // namespace falcon::analyzer
