// Iteration-time series from a periodic call sequence (FALCON §4.2): one sample per iteration,
// the time from an anchor call to its occurrence one period later. The anchor is the phase of
// the pattern with the longest typical gap before it (the iteration boundary: optimizer step,
// data loading and forward compute come before the first collective), so samples are aligned to
// iteration starts. Occurrences are found by matching a short context of signatures near the
// expected position, which tolerates inserted or missing calls (periodic logging, checkpoint
// barriers): the alignment is re-found instead of drifting.
// Thread-safety: stateless functions; safe from any thread.
// Must never: do I/O, read clocks, assume timestamps are evenly spaced.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace falcon::analyzer {

struct IterationSeriesOptions {
  std::size_t context = 4;        // signatures that must match at an anchor occurrence
  double search_fraction = 0.125;  // occurrences are sought within +-period * this (>= 2 calls)
  std::size_t gap_cycles = 16;    // cycles used to find the iteration boundary
};

struct IterationSample {
  std::size_t first_call = 0;  // index (into the sequence) of the anchor call starting it
  std::int64_t start_ns = 0;   // time of that call
  double seconds = 0.0;        // time to the next anchor occurrence
};

// REQUIRES: symbols.size() == t_ns.size(); period > 0. Returns no samples when the sequence does
// not contain two consecutive exact repetitions of the pattern.
[[nodiscard]] std::vector<IterationSample> ExtractIterations(
    std::span<const std::uint32_t> symbols, std::span<const std::int64_t> t_ns,
    std::size_t period, const IterationSeriesOptions& options = {});

// The anchor ExtractIterations picks: where in the sequence it first takes it, and the
// signatures (`options.context` of them) that mark each of its occurrences.
struct IterationAnchor {
  std::size_t position = 0;
  std::vector<std::uint32_t> context;
};

// The boundary search of ExtractIterations on its own (over `options.gap_cycles` cycles, the
// costly part). nullopt exactly when ExtractIterations would return no samples for lack of two
// consecutive exact repetitions.
[[nodiscard]] std::optional<IterationAnchor> FindIterationAnchor(
    std::span<const std::uint32_t> symbols, std::span<const std::int64_t> t_ns,
    std::size_t period, const IterationSeriesOptions& options = {});

// ExtractIterations with the anchor already chosen: samples from `anchor.position`, which must be
// an occurrence of `anchor.context` (no samples otherwise), without the boundary search. With
// FindIterationAnchor's result it is ExtractIterations; a caller that keeps extracting one
// stream can keep the anchor and start at an occurrence it already found.
[[nodiscard]] std::vector<IterationSample> ExtractIterationsAt(
    std::span<const std::uint32_t> symbols, std::span<const std::int64_t> t_ns,
    std::size_t period, const IterationAnchor& anchor, const IterationSeriesOptions& options = {});

}  // namespace falcon::analyzer
