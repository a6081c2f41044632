// OnlineIterationSeries: turns a rank's call stream, under one period lock, into iteration
// samples as calls arrive, using the analyzer's batch ExtractIterations unchanged.
//
// It keeps the calls of the current lock (bounded: `keep_cycles` periods before the last emitted
// sample's end, at most `max_calls`), re-runs ExtractIterations once at least one new period of
// calls has arrived, and emits only samples that start at or after the end of the last emitted
// one: samples never overlap or repeat. If the anchor phase the analyzer picks moves (the window
// slid), at most one iteration is skipped; none is counted twice.
// Cost: one ExtractIterations over <= keep_cycles + new periods per Drain that has a new period
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

 private:
  void Trim();

  OnlineSeriesOptions options_;
  std::size_t period_ = 0;
  std::vector<std::uint32_t> symbols_;
  std::vector<std::int64_t> times_;
  std::size_t new_calls_ = 0;  // pushed since the last extraction
  std::int64_t last_extract_ns_ = std::numeric_limits<std::int64_t>::min();  // newest call's time then
  std::int64_t last_end_ns_ = std::numeric_limits<std::int64_t>::min();
};

}  // namespace falcon::agent
