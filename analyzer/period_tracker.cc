// Online period lock / re-lock. See period_tracker.h for the contract.
#include "analyzer/period_tracker.h"

#include <algorithm>

namespace falcon::analyzer {

PeriodTracker::PeriodTracker(const PeriodTrackerOptions& options)
    : options_(options), next_attempt_(std::max<std::size_t>(options.min_calls, 4)) {
  options_.window = std::max(options_.window, next_attempt_);
}

bool PeriodTracker::Ignored(std::uint32_t symbol) const {
  return symbol < ignored_.size() && ignored_[symbol];
}

TrackerEvent PeriodTracker::Push(std::uint32_t symbol, std::uint64_t index) {
  if (locked() && Ignored(symbol)) {
    return TrackerEvent::kNone;
  }
  buf_.push_back({symbol, false, index});
  if (buf_.size() > options_.window) {
    buf_.pop_front();
  }
  if (!locked()) {
    return buf_.size() >= next_attempt_ ? TryLock() : TrackerEvent::kNone;
  }
  Slide();
  if (++since_check_ >= std::max<std::size_t>(period_, 64)) {
    since_check_ = 0;
    return Check();
  }
  return TrackerEvent::kNone;
}

std::size_t PeriodTracker::CheckedCalls() const {
  const std::size_t n = buf_.size();
  return n > period_ ? std::min(n - period_, options_.check_cycles * period_) : 0;
}

// The checked calls only ever gain the newest call and lose the oldest: CheckedCalls() grows by
// one per call while the buffer fills, then stays put (check_cycles periods or a full window,
// where the pop_front in Push and the loss of the oldest checked call go together).
void PeriodTracker::Slide() {
  const std::size_t n = buf_.size();
  Entry& e = buf_.back();
  e.match = n > period_ && buf_[n - 1 - period_].symbol == e.symbol;
  const std::size_t checked = CheckedCalls();
  if (checked == 0) {
    return;
  }
  if (checked > checked_) {
    checked_ = checked;  // grew by this call (checked == checked_ + 1)
  } else if (buf_[n - checked - 1].match) {
    --same_;  // the call just before the checked ones left them
  }
  if (e.match) {
    ++same_;
    last_match_ = e.index;
  }
}

void PeriodTracker::Recount() {
  const std::size_t n = buf_.size();
  const std::size_t head = std::min(n, period_);  // calls with nothing one period back
  auto lag = buf_.begin();
  auto it = buf_.begin() + static_cast<std::ptrdiff_t>(head);
  for (auto first = buf_.begin(); first != it; ++first) {
    first->match = false;
  }
  for (; it != buf_.end(); ++it, ++lag) {
    it->match = it->symbol == lag->symbol;
  }
  checked_ = CheckedCalls();
  same_ = 0;
  for (it = buf_.end() - static_cast<std::ptrdiff_t>(checked_); it != buf_.end(); ++it) {
    if (it->match) {
      ++same_;
      last_match_ = it->index;
    }
  }
}

std::vector<std::uint32_t> PeriodTracker::Symbols(std::size_t begin) const {
  std::vector<std::uint32_t> symbols;
  symbols.reserve(buf_.size() - begin);
  for (std::size_t i = begin; i < buf_.size(); ++i) {
    symbols.push_back(buf_[i].symbol);
  }
  return symbols;
}

TrackerEvent PeriodTracker::TryLock() {
  PeriodResult r = FindPeriod(Symbols(0), options_.period);
  // Next attempt when the buffer has doubled, or a quarter window later once it is full.
  next_attempt_ = buf_.size() < options_.window
                      ? std::min(buf_.size() * 2, options_.window)
                      : options_.window;
  if (!r.found) {
    if (buf_.size() >= options_.window) {
      const std::size_t drop = options_.window / 4;
      buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(drop));
    }
    return TrackerEvent::kNone;
  }
  period_ = r.period;
  acf_ = r.acf;
  lock_acf_ = r.acf;
  ignored_ = std::move(r.ignored);
  if (!ignored_.empty()) {
    std::erase_if(buf_, [&](const Entry& e) { return Ignored(e.symbol); });
  }
  locked_from_ = buf_.front().index;
  since_check_ = 0;
  Recount();
  return TrackerEvent::kLocked;
}

// The match rate of the checked calls against the calls one period before them, read from the
// running counts in O(1); only a failing check costs more (Refine, or dropping the lock).
TrackerEvent PeriodTracker::Check() {
  if (checked_ == 0) {
    return TrackerEvent::kNone;
  }
  // buf_[begin..] holds the checked calls and the period of calls they are compared with.
  const std::size_t begin = buf_.size() - checked_ - period_;
  // The newest checked call that matched, else the oldest checked call.
  const std::uint64_t last_match = same_ > 0 ? last_match_ : buf_[begin + period_].index;
  acf_ = static_cast<double>(same_) / static_cast<double>(checked_);
  if (acf_ >= options_.lost_rate && acf_ >= lock_acf_ - options_.lost_drop) {
    return TrackerEvent::kNone;
  }
  if (TrackerEvent e = Refine(begin); e != TrackerEvent::kNone) {
    return e;
  }
  // Lost: keep the most recent period's calls (likely the new pattern) and search again.
  lost_at_ = std::min(last_match, buf_.back().index);
  const std::size_t keep = std::min(buf_.size(), period_);
  buf_.erase(buf_.begin(), buf_.end() - static_cast<std::ptrdiff_t>(keep));
  period_ = 0;
  ignored_.clear();
  checked_ = 0;
  same_ = 0;
  next_attempt_ = std::max<std::size_t>(options_.min_calls, keep * 2);
  return TrackerEvent::kLost;
}

// The checked calls (buf_[begin..]) still repeat at the locked period once the symbols that occur
// only some iterations are set aside: keep the lock, ignore them from now on.
TrackerEvent PeriodTracker::Refine(std::size_t begin) {
  PeriodResult r = FindPeriod(Symbols(begin), options_.period);
  if (!r.found || r.period != period_ || r.ignored.empty()) {
    return TrackerEvent::kNone;
  }
  if (ignored_.size() < r.ignored.size()) {
    ignored_.resize(r.ignored.size(), false);
  }
  for (std::size_t v = 0; v < r.ignored.size(); ++v) {
    if (r.ignored[v]) {
      ignored_[v] = true;
    }
  }
  std::erase_if(buf_, [&](const Entry& e) { return Ignored(e.symbol); });
  Recount();
  acf_ = r.acf;
  lock_acf_ = r.acf;
  return TrackerEvent::kRefined;
}

std::size_t PeriodTracker::MemoryBytes() const {
  return sizeof(*this) + buf_.size() * sizeof(Entry) + ignored_.capacity() / 8;
}

}  // namespace falcon::analyzer
