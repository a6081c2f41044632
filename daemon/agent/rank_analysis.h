// RankAnalysis: the per-rank detection pipeline of the agent, built from the analyzer's parts
// as they are: signatures (SignatureTable) -> PeriodTracker (lock / re-lock) ->
// OnlineIterationSeries (ExtractIterations) -> FailSlowDetector (BOCD + verification).
// Calls go in one at a time (Push); Flush() returns the iteration samples completed since the
// last Flush and any alarms they raised. Sample indices count from 0 per rank, across re-locks.
// Memory: bounded by the tracker window, `history_calls`, the series window and the detector.
// Thread-safety: plain value object, one owner (the agent loop). Must never: do I/O, read
// clocks (times are the records' own) or throw.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "analyzer/detector.h"
#include "analyzer/period_tracker.h"
#include "analyzer/signature.h"
#include "daemon/agent/online_series.h"

namespace falcon::agent {

struct RankAnalysisOptions {
  analyzer::PeriodTrackerOptions tracker;
  analyzer::DetectorOptions detector;
  OnlineSeriesOptions series;
  std::size_t history_calls = 16384;  // recent calls kept to seed the series of a new lock
};

struct RankSample {
  std::uint64_t index = 0;    // in this rank's series
  std::int64_t start_ns = 0;  // the records' clock (CLOCK_MONOTONIC)
  double seconds = 0;
  std::uint64_t period = 0;   // calls per iteration of the lock it came from
};

struct RankAlarm {
  analyzer::Alarm alarm;
  std::optional<std::int64_t> onset_ns;  // start of the onset sample, when still remembered
  double baseline_seconds = 0;
};

struct RankUpdate {
  std::vector<RankSample> samples;
  std::vector<RankAlarm> alarms;
  std::vector<std::size_t> locks;  // periods locked since the last Flush
  std::size_t losses = 0;          // locks lost since the last Flush
  std::uint64_t invalid = 0;       // samples the detector rejected
};

class RankAnalysis {
 public:
  explicit RankAnalysis(const RankAnalysisOptions& options = {});

  // One call in time order. Management calls (op kOther) are ignored.
  void Push(const analyzer::CallRecord& call);
  // Drains completed samples into the detector; appends to `out`.
  void Flush(RankUpdate* out);

  bool locked() const { return tracker_.locked(); }
  std::size_t period() const { return tracker_.period(); }
  std::uint64_t samples() const { return next_sample_; }
  bool slow() const { return detector_.slow(); }
  double baseline_seconds() const { return detector_.baseline_seconds(); }
  std::uint64_t calls() const { return calls_; }

 private:
  struct Call {
    std::uint32_t symbol;
    std::uint64_t index;
    std::int64_t t_ns;
  };
  bool Ignored(std::uint32_t symbol) const;

  RankAnalysisOptions options_;
  analyzer::SignatureTable table_;
  analyzer::PeriodTracker tracker_;
  OnlineIterationSeries series_;
  analyzer::FailSlowDetector detector_;
  std::deque<Call> history_;
  std::vector<bool> ignored_;  // of the current lock
  std::size_t series_period_ = 0;  // period of the lock the series' samples come from
  std::uint64_t calls_ = 0;    // signature calls pushed (the tracker's index)
  std::uint64_t next_sample_ = 0;
  std::deque<std::int64_t> sample_starts_;  // start of the last samples, for alarm onsets
  std::vector<std::size_t> pending_locks_;
  std::size_t pending_losses_ = 0;
  std::vector<SeriesSample> scratch_;
};

}  // namespace falcon::agent
