// RankAnalysis: the per-rank detection pipeline of the agent, built from the analyzer's parts
// as they are: signatures (SignatureTable) -> PeriodTracker (lock / re-lock) ->
// OnlineIterationSeries (ExtractIterations) -> FailSlowDetector (BOCD + verification).
// Calls go in one at a time (Push); Flush() returns the iteration samples completed since the
// last Flush and any alarms they raised. Sample indices count from 0 per rank, across re-locks.
// Planned pauses (Quiet: a framework phase other than training, a validation pause) are known
// by their records' times: an iteration that overlaps one is neither fed to the detector nor
// returned, only counted (a checkpoint is not a fail-slow, and its iteration is not one to
// report as the job's speed).
// Memory: bounded by the tracker window, `history_calls`, the series window and the detector.
// Thread-safety: plain value object, one owner (the agent loop). Must never: do I/O, read
// clocks (times are the records' own) or throw.
#pragma once

#include <boost/circular_buffer.hpp>

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
  std::uint64_t excluded = 0;      // samples left out: they overlapped a quiet span
  std::vector<RankAlarm> alarms;
  std::vector<std::size_t> locks;  // periods locked since the last Flush
  std::size_t losses = 0;          // locks lost since the last Flush
  std::uint64_t invalid = 0;       // samples the detector rejected
};

// Who declared a span quiet: the framework's phase, or Falcon's own validation pause.
enum class QuietSource : std::uint8_t { kPhase = 0, kPause = 1 };

class RankAnalysis {
 public:
  explicit RankAnalysis(const RankAnalysisOptions& options = {});

  // One call in time order. Management calls (op kOther) are ignored.
  void Push(const analyzer::CallRecord& call);
  // A quiet span of `source` begins (on) or ends (off) at `t_ns` (the records' clock), in time
  // order with Push.
  void Quiet(std::int64_t t_ns, QuietSource source, bool on);
  // Drains completed samples into the detector; appends to `out`.
  void Flush(RankUpdate* out);

  bool locked() const { return tracker_.locked(); }
  std::size_t period() const { return tracker_.period(); }
  std::uint64_t samples() const { return next_sample_; }
  bool slow() const { return detector_.slow(); }
  double baseline_seconds() const { return detector_.baseline_seconds(); }
  std::uint64_t calls() const { return calls_; }
  std::uint64_t excluded() const { return excluded_; }

 private:
  struct Call {
    std::uint32_t symbol;
    std::uint64_t index;
    std::int64_t t_ns;
  };
  bool Ignored(std::uint32_t symbol) const;
  bool Quiet() const { return quiet_[0] || quiet_[1]; }
  // Whether [begin, end) overlaps a quiet span (ended, or the one open now).
  bool OverlapsQuiet(std::int64_t begin, std::int64_t end) const;

  RankAnalysisOptions options_;
  analyzer::SignatureTable table_;
  analyzer::PeriodTracker tracker_;
  OnlineIterationSeries series_;
  analyzer::FailSlowDetector detector_;
  boost::circular_buffer<Call> history_;  // a ring of history_calls
  std::vector<bool> ignored_;  // of the current lock
  std::size_t series_period_ = 0;  // period of the lock the series' samples come from
  std::uint64_t calls_ = 0;    // signature calls pushed (the tracker's index)
  std::uint64_t next_sample_ = 0;
  std::deque<std::int64_t> sample_starts_;  // start of the last samples, for alarm onsets
  std::vector<std::size_t> pending_locks_;
  std::size_t pending_losses_ = 0;
  std::vector<SeriesSample> scratch_;
  bool quiet_[2] = {false, false};       // by QuietSource
  std::int64_t quiet_since_ns_ = 0;      // start of the open quiet span, while Quiet()
  std::deque<std::pair<std::int64_t, std::int64_t>> quiet_spans_;  // ended [begin, end), newest last
  std::uint64_t excluded_ = 0;
};

}  // namespace falcon::agent
