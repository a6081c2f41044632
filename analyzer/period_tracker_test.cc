// Tests for online period tracking: lock, hold through occasional calls, re-lock on change.
#include "analyzer/period_tracker.h"

#include <gtest/gtest.h>

#include <vector>

namespace falcon::analyzer {
namespace {

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

}  // namespace
}  // namespace falcon::analyzer
