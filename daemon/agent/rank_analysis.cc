// RankAnalysis. See rank_analysis.h for the contract.
#include "daemon/agent/rank_analysis.h"

namespace falcon::agent {
namespace {
constexpr std::size_t kOnsetMemory = 4096;  // sample start times kept for alarm onsets
constexpr std::size_t kQuietSpans = 64;     // ended quiet spans kept (samples complete soon after)
}

void RankAnalysis::Quiet(std::int64_t t_ns, QuietSource source, bool on) {
  const bool was = Quiet();
  quiet_[static_cast<int>(source)] = on;
  if (!was && Quiet()) quiet_since_ns_ = t_ns;
  if (was && !Quiet()) {
    quiet_spans_.emplace_back(quiet_since_ns_, t_ns);
    if (quiet_spans_.size() > kQuietSpans) quiet_spans_.pop_front();
  }
}

bool RankAnalysis::OverlapsQuiet(std::int64_t begin, std::int64_t end) const {
  if (Quiet() && end > quiet_since_ns_) return true;
  for (const auto& [b, e] : quiet_spans_) {
    if (begin < e && end > b) return true;
  }
  return false;
}

RankAnalysis::RankAnalysis(const RankAnalysisOptions& options)
    : options_(options),
      tracker_(options.tracker),
      series_(options.series),
      detector_(options.detector),
      history_(options.history_calls) {}

bool RankAnalysis::Ignored(std::uint32_t symbol) const {
  return symbol < ignored_.size() && ignored_[symbol];
}

void RankAnalysis::Push(const analyzer::CallRecord& call) {
  if (call.op == analyzer::OpKind::kOther) return;
  const std::uint32_t symbol = table_.Intern(analyzer::SignatureHash(call));
  const std::uint64_t index = calls_++;
  history_.push_back({symbol, index, call.t_ns});  // full: overwrites the oldest
  const bool was_locked = series_.active();
  switch (tracker_.Push(symbol, index)) {
    case analyzer::TrackerEvent::kLocked: {
      // Seed the new lock's series with the calls it covers that we still remember.
      ignored_ = tracker_.ignored();
      series_.Start(tracker_.period());
      series_period_ = tracker_.period();
      for (const Call& c : history_) {
        if (c.index >= tracker_.locked_from() && !Ignored(c.symbol)) series_.Push(c.symbol, c.t_ns);
      }
      pending_locks_.push_back(tracker_.period());
      return;
    }
    case analyzer::TrackerEvent::kLost:
      // Calls after lost_at (at most one health-check interval) already reached the series; the
      // context match rejects samples that straddle a changed pattern.
      series_.Drain(&scratch_);
      series_.Stop();
      ++pending_losses_;
      return;
    case analyzer::TrackerEvent::kRefined:
      ignored_ = tracker_.ignored();
      break;
    case analyzer::TrackerEvent::kNone:
      break;
  }
  if (was_locked && !Ignored(symbol)) series_.Push(symbol, call.t_ns);
}

void RankAnalysis::Flush(RankUpdate* out) {
  series_.Drain(&scratch_);
  for (const SeriesSample& s : scratch_) {
    if (OverlapsQuiet(s.start_ns, s.start_ns + static_cast<std::int64_t>(s.seconds * 1e9))) {
      ++excluded_;
      ++out->excluded;
      continue;
    }
    const std::uint64_t index = next_sample_++;
    sample_starts_.push_back(s.start_ns);
    if (sample_starts_.size() > kOnsetMemory) sample_starts_.pop_front();
    out->samples.push_back({index, s.start_ns, s.seconds, series_period_});
    const analyzer::DetectorStep step = detector_.Push(s.seconds);
    if (step.status == analyzer::SampleStatus::kInvalid) ++out->invalid;
    if (step.alarm) {
      RankAlarm a;
      a.alarm = *step.alarm;
      a.baseline_seconds = detector_.baseline_seconds();
      const std::uint64_t oldest = next_sample_ - sample_starts_.size();
      if (a.alarm.onset >= oldest && a.alarm.onset < next_sample_) {
        a.onset_ns = sample_starts_[static_cast<std::size_t>(a.alarm.onset - oldest)];
      }
      out->alarms.push_back(a);
    }
  }
  scratch_.clear();
  out->locks.insert(out->locks.end(), pending_locks_.begin(), pending_locks_.end());
  pending_locks_.clear();
  out->losses += pending_losses_;
  pending_losses_ = 0;
}

}  // namespace falcon::agent
