// OnlineIterationSeries: turns a rank's call stream, under one period lock, into iteration
// samples as calls arrive, using the analyzer's batch extraction (FindIterationAnchor,
// ExtractIterationsAt) unchanged.
//
// It keeps the calls of the current lock (bounded: `keep_cycles` periods before the last emitted
// sample's end, at most `max_calls`), re-runs the extraction once at least one new period of
// calls has arrived, and emits only samples that start at or after the end of the last emitted
// one: samples never overlap or repeat. If the anchor phase the analyzer picks moves (the window
// slid), at most one iteration is skipped; none is counted twice.
// The boundary search (the costly part of the analyzer's extraction) runs until it has seen its
// `gap_cycles` cycles of the lock; its anchor is then kept for the lock and later extractions walk
// on from the last emitted sample's end (an occurrence of it), so the anchor does not move as the
// window slides. Should that walk find no sample, the search runs again.
// Cost: one extraction over <= keep_cycles + new periods per Drain that has a new period
// and is the first in its `extract_every_ns` interval of record time (intervals aligned on
// multiples of it, so ranks sharing a clock extract together): at 10 iterations a
// second each extraction covers 16 + 10 periods, not 16 + 1, and the per-call cost is ~6x less;
// samples reach the caller up to that much later.
// Thread-safety: plain value object, one owner. Must never: do I/O or read clocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "analyzer/iteration_series.h"

namespace falcon::agent {

struct OnlineSeriesOptions {
  analyzer::IterationSeriesOptions series;
  std::size_t keep_cycles = 16;
  std::size_t max_calls = 1 << 20;
  std::int64_t extract_every_ns = 1'000'000'000;  // 0: at every new period
};

struct SeriesSample {
  std::int64_t start_ns = 0;  // time of the anchor call (the caller's clock)
  double seconds = 0;
};

class OnlineIterationSeries {
 public:
  explicit OnlineIterationSeries(const OnlineSeriesOptions& options = {}) : options_(options) {}

  // A new lock with `period` calls per iteration: forgets the previous lock's calls.
  void Start(std::size_t period);
  // No lock: drops everything buffered.
  void Stop();
  bool active() const { return period_ != 0; }
  // Appends one call (not an ignored symbol) of the current lock. No-op when not active.
  void Push(std::uint32_t symbol, std::int64_t t_ns);
  // Appends the samples completed since the last Drain to `out`.
  void Drain(std::vector<SeriesSample>* out);
  std::size_t buffered() const { return symbols_.size(); }
  // Boundary searches run so far (all locks): at most one per extraction until an anchor is kept.
  std::size_t anchor_searches() const { return anchor_searches_; }

 private:
  void Trim();

  OnlineSeriesOptions options_;
  std::size_t period_ = 0;
  std::vector<std::uint32_t> symbols_;
  std::vector<std::int64_t> times_;
  std::size_t new_calls_ = 0;  // pushed since the last extraction
  analyzer::IterationAnchor anchor_;  // from the boundary search
  bool anchor_kept_ = false;          // the search saw gap_cycles cycles: no need to repeat it
  std::size_t anchor_searches_ = 0;
  std::int64_t last_extract_ns_ = std::numeric_limits<std::int64_t>::min();  // newest call's time then
  std::int64_t last_end_ns_ = std::numeric_limits<std::int64_t>::min();
};

}  // namespace falcon::agent
