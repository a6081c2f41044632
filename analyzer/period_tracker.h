// Online period tracking for one rank: signatures arrive one call at a time; the tracker locks
// onto the iteration period (FindPeriod on a bounded window), keeps checking that the sequence
// still repeats at that lag, and re-locks when the pattern changes (a mitigation changed the
// micro-batch count, a topology change, an elastic resize). A failing check runs FindPeriod on
// the window again: the same period means occasional calls the lock had not seen (kept, with
// them ignored); anything else means the pattern changed (lost).
// Memory: O(window) calls (16 bytes per call: symbol + match bit + index), bounded by
// options.window.
// Complexity: O(1) amortised per Push while locked (the health check reads running counts of
// the checked calls); a detection attempt, a refinement or a lost lock costs O(window log window).
// Thread-safety: plain value object; one owner at a time, no internal locking.
// Must never: read clocks or do I/O; block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "analyzer/period.h"

namespace falcon::analyzer {

struct PeriodTrackerOptions {
  PeriodOptions period;
  std::size_t window = 100000;   // calls kept for detection
  std::size_t min_calls = 64;    // first detection attempt
  std::size_t check_cycles = 16; // periods compared at each health check while locked
  double lost_rate = 0.8;        // match rate below which the lock is lost
  // The lock is also lost when the match rate falls this far below the rate it locked with: a
  // lock on a run of one repeated call (period 1, rate 1.0) must not hold on iterations whose
  // per-layer runs of that call still match at lag 1 most of the time (20 in 22: 0.86).
  double lost_drop = 0.1;
};

// kRefined: the lock holds, and calls that began to occur only some iterations (a logging call
// first seen after the lock) are now ignored as occasional: re-read ignored().
enum class TrackerEvent : std::uint8_t { kNone, kLocked, kLost, kRefined };

class PeriodTracker {
 public:
  explicit PeriodTracker(const PeriodTrackerOptions& options = {});

  // Feeds the signature id of call number `index` (the caller's own, increasing numbering).
  TrackerEvent Push(std::uint32_t symbol, std::uint64_t index);

  [[nodiscard]] bool locked() const { return period_ != 0; }
  [[nodiscard]] std::size_t period() const { return period_; }
  [[nodiscard]] double acf() const { return acf_; }
  // Caller index of the first call covered by the current lock (valid when locked()).
  [[nodiscard]] std::uint64_t locked_from() const { return locked_from_; }
  // Caller index of the last call that still matched when the lock was lost (after kLost).
  [[nodiscard]] std::uint64_t lost_at() const { return lost_at_; }
  // Symbols ignored as occasional by the current lock (indexed by symbol id).
  [[nodiscard]] const std::vector<bool>& ignored() const { return ignored_; }
  [[nodiscard]] std::size_t MemoryBytes() const;

 private:
  struct Entry {
    std::uint32_t symbol;
    // While locked: this call repeats the buffered call one period before it (false when the
    // buffer held none). Sits in the padding before `index`.
    bool match;
    std::uint64_t index;
  };
  static_assert(sizeof(Entry) == 16, "the Memory line of the file comment");
  // The buffered symbols from buf_[begin] on.
  [[nodiscard]] std::vector<std::uint32_t> Symbols(std::size_t begin) const;
  TrackerEvent TryLock();
  TrackerEvent Check();
  TrackerEvent Refine(std::size_t begin);
  [[nodiscard]] bool Ignored(std::uint32_t symbol) const;
  // Calls a health check compares with the call one period back: the newest
  // min(size - period, check_cycles * period) buffered calls (0 when size <= period).
  [[nodiscard]] std::size_t CheckedCalls() const;
  // REQUIRES: locked(). buf_.back() was just pushed: sets its match bit and slides the counts.
  void Slide();
  // REQUIRES: locked(). buf_ or the lock changed: recomputes every match bit and the counts.
  void Recount();

  PeriodTrackerOptions options_;
  std::deque<Entry> buf_;
  std::size_t next_attempt_;
  std::size_t since_check_ = 0;
  std::size_t period_ = 0;
  double acf_ = 0.0;
  double lock_acf_ = 0.0;  // match rate at the time of the lock
  std::uint64_t locked_from_ = 0;
  std::uint64_t lost_at_ = 0;
  std::vector<bool> ignored_;
  // While locked, over the checked calls (the newest checked_ == CheckedCalls() entries of buf_;
  // buf_ then holds no ignored symbol): how many match, and the caller index of the newest call
  // that matched (meaningful when same_ > 0: that call is then among the checked ones).
  std::size_t checked_ = 0;
  std::size_t same_ = 0;
  std::uint64_t last_match_ = 0;
};

}  // namespace falcon::analyzer
