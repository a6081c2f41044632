// Tests for online period tracking: lock, hold through occasional calls, re-lock on change; and
// equivalence of the running-count health check with the re-scanning one it replaced.
#include "analyzer/period_tracker.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <deque>
#include <vector>

#include "analyzer/test_util.h"

namespace falcon::analyzer {
namespace {

// The previous PeriodTracker, kept verbatim as the oracle: its health check re-reads the last
// check_cycles periods at every check, O(check_cycles * period). PeriodTracker must produce the
// same events and getters for every input.
class ReferencePeriodTracker {
 public:
  explicit ReferencePeriodTracker(const PeriodTrackerOptions& options)
      : options_(options), next_attempt_(std::max<std::size_t>(options.min_calls, 4)) {
    options_.window = std::max(options_.window, next_attempt_);
  }

  TrackerEvent Push(std::uint32_t symbol, std::uint64_t index) {
    if (locked() && Ignored(symbol)) {
      return TrackerEvent::kNone;
    }
    buf_.push_back({symbol, index});
    if (buf_.size() > options_.window) {
      buf_.pop_front();
    }
    if (!locked()) {
      return buf_.size() >= next_attempt_ ? TryLock() : TrackerEvent::kNone;
    }
    if (++since_check_ >= std::max<std::size_t>(period_, 64)) {
      since_check_ = 0;
      return Check();
    }
    return TrackerEvent::kNone;
  }

  [[nodiscard]] bool locked() const { return period_ != 0; }
  [[nodiscard]] std::size_t period() const { return period_; }
  [[nodiscard]] double acf() const { return acf_; }
  [[nodiscard]] std::uint64_t locked_from() const { return locked_from_; }
  [[nodiscard]] std::uint64_t lost_at() const { return lost_at_; }
  [[nodiscard]] const std::vector<bool>& ignored() const { return ignored_; }

 private:
  struct Entry {
    std::uint32_t symbol;
    std::uint64_t index;
  };

  [[nodiscard]] bool Ignored(std::uint32_t symbol) const {
    return symbol < ignored_.size() && ignored_[symbol];
  }

  [[nodiscard]] std::vector<std::uint32_t> Symbols(std::size_t begin) const {
    std::vector<std::uint32_t> symbols;
    symbols.reserve(buf_.size() - begin);
    for (std::size_t i = begin; i < buf_.size(); ++i) {
      symbols.push_back(buf_[i].symbol);
    }
    return symbols;
  }

  TrackerEvent TryLock() {
    PeriodResult r = FindPeriod(Symbols(0), options_.period);
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
    return TrackerEvent::kLocked;
  }

  TrackerEvent Check() {
    const std::size_t span = std::min(buf_.size(), (options_.check_cycles + 1) * period_);
    if (span <= period_) {
      return TrackerEvent::kNone;
    }
    std::size_t same = 0;
    const std::size_t begin = buf_.size() - span;
    std::uint64_t last_match = buf_[begin + period_].index;
    auto lag = buf_.cbegin() + static_cast<std::ptrdiff_t>(begin);
    for (auto it = lag + static_cast<std::ptrdiff_t>(period_); it != buf_.cend(); ++it, ++lag) {
      if (it->symbol == lag->symbol) {
        ++same;
        last_match = it->index;
      }
    }
    acf_ = static_cast<double>(same) / static_cast<double>(span - period_);
    if (acf_ >= options_.lost_rate && acf_ >= lock_acf_ - options_.lost_drop) {
      return TrackerEvent::kNone;
    }
    if (TrackerEvent e = Refine(begin); e != TrackerEvent::kNone) {
      return e;
    }
    lost_at_ = std::min(last_match, buf_.back().index);
    const std::size_t keep = std::min(buf_.size(), period_);
    buf_.erase(buf_.begin(), buf_.end() - static_cast<std::ptrdiff_t>(keep));
    period_ = 0;
    ignored_.clear();
    next_attempt_ = std::max<std::size_t>(options_.min_calls, keep * 2);
    return TrackerEvent::kLost;
  }

  TrackerEvent Refine(std::size_t begin) {
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
    acf_ = r.acf;
    lock_acf_ = r.acf;
    return TrackerEvent::kRefined;
  }

  PeriodTrackerOptions options_;
  std::deque<Entry> buf_;
  std::size_t next_attempt_;
  std::size_t since_check_ = 0;
  std::size_t period_ = 0;
  double acf_ = 0.0;
  double lock_acf_ = 0.0;
  std::uint64_t locked_from_ = 0;
  std::uint64_t lost_at_ = 0;
  std::vector<bool> ignored_;
};

TEST(PeriodTrackerTest, LocksHoldsAndRelocksWhenThePatternChanges) {
  PeriodTracker tracker;
  std::uint64_t index = 0;
  std::vector<std::size_t> locks;
  bool lost = false;
  auto feed = [&](std::size_t period, std::size_t iterations, std::uint32_t offset) {
    for (std::size_t it = 0; it < iterations; ++it) {
      for (std::size_t j = 0; j < period; ++j) {
        const auto symbol = static_cast<std::uint32_t>(offset + (j * 7919) % (period + 3));
        const TrackerEvent e = tracker.Push(symbol, index++);
        if (e == TrackerEvent::kLocked) locks.push_back(tracker.period());
        if (e == TrackerEvent::kLost) lost = true;
      }
      if (it % 20 == 5) (void)tracker.Push(5000, index++);  // occasional logging call
    }
  };
  feed(30, 200, 0);  // 4 micro-batches
  ASSERT_EQ(locks.size(), 1U);
  EXPECT_EQ(locks[0], 30U);
  EXPECT_FALSE(lost);
  feed(45, 200, 0);  // a mitigation changed the micro-batch count: 6 micro-batches
  EXPECT_TRUE(lost);
  ASSERT_GE(locks.size(), 2U);
  EXPECT_LE(locks.size(), 3U);  // at most one transient lock on the mixed window
  EXPECT_EQ(locks.back(), 45U);
  EXPECT_TRUE(tracker.locked());
}

TEST(PeriodTrackerTest, ALockOnARunOfOneCallIsLostWhenIterationsResume) {
  // A run of one repeated call locks period 1 legitimately. When iterations with runs of that
  // same call resume (per-layer collectives: 20 alike, then two others), lag 1 still matches
  // 19 calls in 22: the lock must not hold on that, it must give way to the real period.
  PeriodTracker tracker;
  std::uint64_t index = 0;
  for (int i = 0; i < 300; ++i) (void)tracker.Push(7, index++);
  ASSERT_TRUE(tracker.locked());
  ASSERT_EQ(tracker.period(), 1U);
  bool lost = false;
  for (int it = 0; it < 200; ++it) {
    for (int j = 0; j < 22; ++j) {
      const std::uint32_t symbol = j < 20 ? 7 : static_cast<std::uint32_t>(j);
      if (tracker.Push(symbol, index++) == TrackerEvent::kLost) lost = true;
    }
  }
  EXPECT_TRUE(lost);
  ASSERT_TRUE(tracker.locked());
  EXPECT_EQ(tracker.period(), 22U);
}

TEST(PeriodTrackerTest, RandomCallsNeverLock) {
  PeriodTracker tracker;
  std::uint64_t x = 88172645463325252ULL;
  for (std::uint64_t i = 0; i < 20000; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    EXPECT_NE(tracker.Push(static_cast<std::uint32_t>(x % 97), i), TrackerEvent::kLocked);
  }
  EXPECT_FALSE(tracker.locked());
}

// One stream of calls for the equivalence test: periodic segments (periods 1..40, a new pattern
// and often a new period each) with noise, and stretches of garbage between some of them.
std::vector<std::uint32_t> RandomCalls(testing::Rng& rng, std::size_t length) {
  std::vector<std::uint32_t> calls;
  auto below = [&](std::uint64_t n) { return static_cast<std::uint32_t>(rng.Next() % n); };
  while (calls.size() < length) {
    if (below(8) == 0) {  // garbage: no period at all
      for (std::uint32_t i = 0, n = 50 + below(800); i < n; ++i) calls.push_back(below(64));
      continue;
    }
    const std::size_t period = 1 + below(40);
    const std::uint32_t alphabet = 1 + below(static_cast<std::uint32_t>(period) + 3);
    const std::uint32_t offset = below(4) * 100;  // the same symbols as before, sometimes
    std::vector<std::uint32_t> pattern(period);
    for (auto& s : pattern) s = offset + below(alphabet);
    const std::uint32_t iterations = 20 + below(400);
    const double extra = below(3) == 0 ? 0.05 * rng.Uniform() : 0.0;   // stray calls
    const double swap = below(3) == 0 ? 0.03 * rng.Uniform() : 0.0;    // one call replaced
    // A call made every `every` iterations from iteration `from` on (logging, checkpoints):
    // first seen after the lock, it must be refined away.
    const std::uint32_t every = below(2) == 0 ? 2 + below(9) : 0;
    const std::uint32_t from = below(iterations), at = below(static_cast<std::uint32_t>(period));
    for (std::uint32_t it = 0; it < iterations; ++it) {
      for (std::size_t j = 0; j < period; ++j) {
        if (every != 0 && it >= from && it % every == 0 && j == at) calls.push_back(1000 + at % 3);
        if (rng.Uniform() < extra) calls.push_back(900 + below(5));
        calls.push_back(rng.Uniform() < swap ? below(64) : pattern[j]);
      }
    }
  }
  calls.resize(length);
  return calls;
}

::testing::AssertionResult SameState(const ReferencePeriodTracker& want, const PeriodTracker& got) {
  if (got.locked() != want.locked() || got.period() != want.period() ||
      got.acf() != want.acf() || got.locked_from() != want.locked_from() ||
      got.lost_at() != want.lost_at() || got.ignored() != want.ignored()) {
    return ::testing::AssertionFailure()
           << "period " << got.period() << " vs " << want.period() << ", acf " << got.acf()
           << " vs " << want.acf() << ", locked_from " << got.locked_from() << " vs "
           << want.locked_from() << ", lost_at " << got.lost_at() << " vs " << want.lost_at()
           << ", ignored " << got.ignored().size() << " vs " << want.ignored().size();
  }
  return ::testing::AssertionSuccess();
}

TEST(PeriodTrackerTest, RunningCountsMatchTheRescanningCheck) {
  constexpr int kSequences = 300;
  std::array<std::size_t, 4> events{};  // by TrackerEvent
  std::size_t pushes = 0;
  std::size_t capped = 0;  // pushes locked with check_cycles + 1 periods over the window
  for (int seed = 1; seed <= kSequences; ++seed) {
    testing::Rng rng(static_cast<std::uint64_t>(seed));
    PeriodTrackerOptions options;
    options.window = 300 + rng.Next() % 2300;
    options.min_calls = 64;
    options.check_cycles = seed % 25 == 0 ? seed % 2 : 4 + rng.Next() % 13;  // 0 and 1: edges
    options.lost_rate = 0.7 + 0.1 * static_cast<double>(rng.Next() % 3);
    options.lost_drop = rng.Next() % 2 == 0 ? 0.1 : 0.05;
    ReferencePeriodTracker want(options);
    PeriodTracker got(options);
    std::uint64_t index = 0;
    for (const std::uint32_t symbol : RandomCalls(rng, 8000 + rng.Next() % 8000)) {
      index += rng.Next() % 10 == 0 ? 1 + rng.Next() % 5 : 1;  // the caller's own numbering
      const TrackerEvent w = want.Push(symbol, index);
      const TrackerEvent g = got.Push(symbol, index);
      ASSERT_EQ(g, w) << "seed " << seed << " index " << index;
      ASSERT_TRUE(SameState(want, got)) << "seed " << seed << " index " << index;
      ++events[static_cast<std::size_t>(g)];
      ++pushes;
      if (got.locked() && (options.check_cycles + 1) * got.period() > options.window) ++capped;
    }
  }
  std::printf("# %d sequences, %zu pushes: none %zu, locked %zu, lost %zu, refined %zu; "
              "%zu pushes with the check capped by the window\n",
              kSequences, pushes, events[0], events[1], events[2], events[3], capped);
  // Every kind of event occurred, so the comparison is not vacuous.
  EXPECT_GT(events[static_cast<std::size_t>(TrackerEvent::kLocked)], 0U);
  EXPECT_GT(events[static_cast<std::size_t>(TrackerEvent::kLost)], 0U);
  EXPECT_GT(events[static_cast<std::size_t>(TrackerEvent::kRefined)], 0U);
  EXPECT_GT(capped, 0U);
}

}  // namespace
}  // namespace falcon::analyzer
