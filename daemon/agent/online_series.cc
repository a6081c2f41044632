// OnlineIterationSeries. See online_series.h for the contract.
#include "daemon/agent/online_series.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace falcon::agent {

void OnlineIterationSeries::Start(std::size_t period) {
  Stop();
  period_ = period;
}

void OnlineIterationSeries::Stop() {
  period_ = 0;
  symbols_.clear();
  times_.clear();
  new_calls_ = 0;
  anchor_ = {};
  anchor_kept_ = false;
  last_extract_ns_ = std::numeric_limits<std::int64_t>::min();  // a new lock's first Drain extracts
  // last_end_ns_ is kept: a new lock must not re-emit time already covered.
}

void OnlineIterationSeries::Push(std::uint32_t symbol, std::int64_t t_ns) {
  if (period_ == 0) return;
  symbols_.push_back(symbol);
  times_.push_back(t_ns);
  ++new_calls_;
  if (symbols_.size() > options_.max_calls) Trim();
}

void OnlineIterationSeries::Drain(std::vector<SeriesSample>* out) {
  if (period_ == 0 || new_calls_ < period_) return;
  // At most once per interval of the records' own clock, on the interval's boundaries: the ranks
  // of a node share CLOCK_MONOTONIC, so ranks in step extract in the same poll and their samples
  // leave in one flush (one packed stream entry). A clock stepped back extracts at once.
  const std::int64_t newest = times_.back();
  const std::int64_t every = options_.extract_every_ns;
  if (every > 0 && last_extract_ns_ != std::numeric_limits<std::int64_t>::min() && newest >= last_extract_ns_ &&
      newest / every == last_extract_ns_ / every) {
    return;
  }
  last_extract_ns_ = newest;
  new_calls_ = 0;
  std::vector<analyzer::IterationSample> samples;
  if (anchor_kept_ && last_end_ns_ != std::numeric_limits<std::int64_t>::min()) {
    // The last emitted sample ended at an occurrence of the anchor: the new samples start there.
    // (Calls sharing that time stamp are tried in turn.)
    for (auto at = std::lower_bound(times_.begin(), times_.end(), last_end_ns_ - 2);
         at != times_.end() && *at <= last_end_ns_ + 2 && samples.empty(); ++at) {
      anchor_.position = static_cast<std::size_t>(at - times_.begin());
      samples = analyzer::ExtractIterationsAt(symbols_, times_, period_, anchor_, options_.series);
    }
  }
  if (samples.empty()) {
    // The boundary search, until it has seen all its cycles of this lock; its anchor is kept
    // from then on, and searched for again when the walk from the last sample's end finds none.
    ++anchor_searches_;
    if (auto anchor = analyzer::FindIterationAnchor(symbols_, times_, period_, options_.series)) {
      anchor_ = std::move(*anchor);
      anchor_kept_ = symbols_.size() >= (options_.series.gap_cycles + 1) * period_;
      samples = analyzer::ExtractIterationsAt(symbols_, times_, period_, anchor_, options_.series);
    }
  }
  for (const analyzer::IterationSample& s : samples) {
    // 2 ns: the end is rebuilt from seconds, which rounds.
    if (s.start_ns + 2 < last_end_ns_) continue;
    out->push_back({s.start_ns, s.seconds});
    last_end_ns_ = s.start_ns + std::llround(s.seconds * 1e9);
  }
  Trim();
}

void OnlineIterationSeries::Trim() {
  // Keep keep_cycles periods before the end of the last emitted sample (the anchor the next
  // sample starts from), so the analyzer sees enough cycles to pick the same anchor again.
  const auto end_it = std::lower_bound(times_.begin(), times_.end(), last_end_ns_);
  const std::size_t end_idx = static_cast<std::size_t>(end_it - times_.begin());
  const std::size_t keep = options_.keep_cycles * period_;
  std::size_t drop = end_idx > keep ? end_idx - keep : 0;
  if (symbols_.size() - drop > options_.max_calls) drop = symbols_.size() - options_.max_calls;
  if (drop < std::max<std::size_t>(period_, 64) && symbols_.size() <= options_.max_calls) return;
  symbols_.erase(symbols_.begin(), symbols_.begin() + static_cast<std::ptrdiff_t>(drop));
  times_.erase(times_.begin(), times_.begin() + static_cast<std::ptrdiff_t>(drop));
}

}  // namespace falcon::agent
