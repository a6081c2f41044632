// Tests of the 1F1B schedule: shape of each stage's sequence, and a simulation over all stages
// proving that the point-to-point exchanges pair up (no deadlock) for every pp <= 8, M <= 12.
#include "schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace falcon::train {
namespace {

TEST(ScheduleTest, SingleStageIsForwardBackwardPairs) {
  EXPECT_EQ(ToString(Build1F1B(1, 0, 3)), "F0 B0 F1 B1 F2 B2");
}

TEST(ScheduleTest, TwoStagesMegatronOrder) {
  EXPECT_EQ(ToString(Build1F1B(2, 0, 3)), "F0 x[sf0] F1 x[sf1rb0] B0 F2 x[sf2rb1] B1 x[rb2] B2");
  EXPECT_EQ(ToString(Build1F1B(2, 1, 3)), "x[rf0] F0 B0 x[rf1sb0] F1 B1 x[rf2sb1] F2 B2 x[sb2]");
}

TEST(ScheduleTest, WarmupCounts) {
  EXPECT_EQ(WarmupCount(4, 0, 8), 3);
  EXPECT_EQ(WarmupCount(4, 3, 8), 0);
  EXPECT_EQ(WarmupCount(4, 0, 2), 2);  // fewer micro-batches than stages
}

// Every stage runs each micro-batch forward once and backward once, backward after forward.
TEST(ScheduleTest, EachMicroBatchOnceForwardThenBackward) {
  for (int pp = 1; pp <= 8; ++pp) {
    for (int m = 1; m <= 12; ++m) {
      for (int s = 0; s < pp; ++s) {
        std::vector<int> f(static_cast<std::size_t>(m), -1), b(static_cast<std::size_t>(m), -1);
        const auto steps = Build1F1B(pp, s, m);
        int in_flight = 0, peak = 0;
        for (std::size_t i = 0; i < steps.size(); ++i) {
          const Step& st = steps[i];
          if (st.kind == StepKind::kForward) {
            EXPECT_EQ(f[static_cast<std::size_t>(st.mb)], -1);
            f[static_cast<std::size_t>(st.mb)] = static_cast<int>(i);
            peak = std::max(peak, ++in_flight);
          } else if (st.kind == StepKind::kBackward) {
            EXPECT_EQ(b[static_cast<std::size_t>(st.mb)], -1);
            b[static_cast<std::size_t>(st.mb)] = static_cast<int>(i);
            --in_flight;
          } else {
            EXPECT_FALSE(s == 0 && (st.xchg.recv_fwd_from_prev || st.xchg.send_bwd_to_prev));
            EXPECT_FALSE(s == pp - 1 && (st.xchg.send_fwd_to_next || st.xchg.recv_bwd_from_next));
          }
        }
        for (int mb = 0; mb < m; ++mb) {
          ASSERT_GE(f[static_cast<std::size_t>(mb)], 0) << pp << " " << s << " " << m;
          ASSERT_GT(b[static_cast<std::size_t>(mb)], f[static_cast<std::size_t>(mb)]);
        }
        // 1F1B bounds the activations in flight by the warm-up depth + 1.
        EXPECT_LE(peak, WarmupCount(pp, s, m) + 1);
      }
    }
  }
}

// Does exchange `a` of stage s with its neighbour (direction +1 = next) match exchange `b` of
// that neighbour with s? Each send must meet a receive of the same micro-batch and vice versa.
bool Matches(const Exchange& a, const Exchange& b, int dir) {
  if (dir > 0) {
    return a.send_fwd_to_next == b.recv_fwd_from_prev && a.recv_bwd_from_next == b.send_bwd_to_prev &&
           (!a.send_fwd_to_next || a.send_fwd_mb == b.recv_fwd_mb) &&
           (!a.recv_bwd_from_next || a.recv_bwd_mb == b.send_bwd_mb);
  }
  return Matches(b, a, 1);
}

int NeighbourDir(const Exchange& x) {
  const bool prev = x.recv_fwd_from_prev || x.send_bwd_to_prev;
  const bool next = x.send_fwd_to_next || x.recv_bwd_from_next;
  EXPECT_FALSE(prev && next) << "an exchange talks to one neighbour only";
  return next ? 1 : -1;
}

// Runs all stages in lock-step: a stage at an exchange waits until its neighbour sits at the
// matching exchange; compute steps always proceed. Deadlock = no stage can move.
TEST(ScheduleTest, AllStagesPairWithoutDeadlock) {
  for (int pp = 1; pp <= 8; ++pp) {
    for (int m = 1; m <= 12; ++m) {
      std::vector<std::vector<Step>> plan;
      for (int s = 0; s < pp; ++s) plan.push_back(Build1F1B(pp, s, m));
      std::vector<std::size_t> pc(static_cast<std::size_t>(pp), 0);
      for (bool moved = true; moved;) {
        moved = false;
        for (int s = 0; s < pp; ++s) {
          auto& i = pc[static_cast<std::size_t>(s)];
          const auto& steps = plan[static_cast<std::size_t>(s)];
          if (i >= steps.size()) continue;
          if (steps[i].kind != StepKind::kExchange) {
            ++i;
            moved = true;
            continue;
          }
          const int dir = NeighbourDir(steps[i].xchg);
          const int n = s + dir;
          ASSERT_TRUE(n >= 0 && n < pp);
          auto& j = pc[static_cast<std::size_t>(n)];
          const auto& other = plan[static_cast<std::size_t>(n)];
          if (j < other.size() && other[j].kind == StepKind::kExchange && NeighbourDir(other[j].xchg) == -dir &&
              Matches(steps[i].xchg, other[j].xchg, dir)) {
            ++i;
            ++j;
            moved = true;
          }
        }
      }
      for (int s = 0; s < pp; ++s) {
        EXPECT_EQ(pc[static_cast<std::size_t>(s)], plan[static_cast<std::size_t>(s)].size())
            << "deadlock: pp=" << pp << " m=" << m << " stage " << s << " stuck at "
            << ToString({plan[static_cast<std::size_t>(s)][pc[static_cast<std::size_t>(s)]]});
      }
    }
  }
}

TEST(ScheduleTest, WarmupOverrideKeepsThe1F1BOrderWithMoreForwardsFirst) {
  EXPECT_EQ(ToString(Build1F1BWithWarmup(4, 3, 4, 0)), ToString(Build1F1B(4, 3, 4)));
  // Stage 0 of 2 with 3 warm-up forwards: F0 F1 F2 before B0; the exchanges keep their flags.
  const std::string s = ToString(Build1F1BWithWarmup(2, 0, 4, 3));
  std::string compute;
  for (const Step& st : Build1F1BWithWarmup(2, 0, 4, 3)) {
    if (st.kind != StepKind::kExchange) compute += (st.kind == StepKind::kForward ? "F" : "B") + std::to_string(st.mb) + " ";
  }
  EXPECT_EQ(compute, "F0 F1 F2 F3 B0 B1 B2 B3 ") << s;
  // Clamped to [0, M].
  EXPECT_EQ(ToString(Build1F1BWithWarmup(2, 0, 2, 9)), ToString(Build1F1BWithWarmup(2, 0, 2, 2)));
  EXPECT_EQ(ToString(Build1F1BWithWarmup(2, 0, 2, -1)), ToString(Build1F1BWithWarmup(2, 0, 2, 0)));
}

// Runs the stages' compute orders against the per-direction traffic (megatron_trainer.h): a
// forward needs the previous stage's forward of the same micro-batch, a backward (or B) its own
// forward and the next stage's backward, a W its own B, and the output slot of a ring of depth R
// frees once the receiver has consumed the micro-batch R earlier (it posts the receive R ahead
// of what it consumed). Returns -1 when every stage ran to the end, else the first stuck stage.
int StuckStage(const std::vector<std::vector<Step>>& order, int m, int depth) {
  const int pp = static_cast<int>(order.size());
  std::vector<std::vector<bool>> f(static_cast<std::size_t>(pp), std::vector<bool>(static_cast<std::size_t>(m))),
      b = f, w = f;
  auto done = [&](const std::vector<std::vector<bool>>& v, int s, int k) {
    return k < 0 || v[static_cast<std::size_t>(s)][static_cast<std::size_t>(k)];
  };
  std::vector<std::size_t> pc(static_cast<std::size_t>(pp), 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < pp; ++s) {
      std::size_t& i = pc[static_cast<std::size_t>(s)];
      if (i == order[static_cast<std::size_t>(s)].size()) continue;
      const Step& st = order[static_cast<std::size_t>(s)][i];
      const int k = st.mb;
      bool ready;
      if (st.kind == StepKind::kForward) {
        ready = (s == 0 || done(f, s - 1, k)) && (s == pp - 1 || done(f, s + 1, k - 2 * depth));
      } else if (st.kind == StepKind::kBackward) {
        ready = done(f, s, k) && (s == pp - 1 || done(b, s + 1, k)) && (s == 0 || done(b, s - 1, k - 2 * depth));
      } else {
        ready = done(b, s, k);
      }
      if (!ready) continue;
      auto& v = st.kind == StepKind::kForward ? f : st.kind == StepKind::kBackward ? b : w;
      v[static_cast<std::size_t>(s)][static_cast<std::size_t>(k)] = true;
      ++i;
      moved = true;
    }
  }
  for (int s = 0; s < pp; ++s) {
    if (pc[static_cast<std::size_t>(s)] != order[static_cast<std::size_t>(s)].size()) return s;
  }
  return -1;
}

// Calls `visit(pp, m, w)` for every pp in [2, 5], m in [1, 8] and non-increasing warm-up vector
// w with entries in [0, pp + 1]; returns how many.
template <typename Visit>
int ForEveryNonIncreasingWarmup(Visit visit) {
  int vectors = 0;
  for (int pp = 2; pp <= 5; ++pp) {
    for (int m = 1; m <= 8; ++m) {
      std::vector<int> w(static_cast<std::size_t>(pp), 0);
      for (;;) {
        ++vectors;
        visit(pp, m, w);
        // Next non-increasing vector (odometer from the last stage).
        int pos = pp - 1;
        while (pos >= 0) {
          const int cap = pos == 0 ? pp + 1 : w[static_cast<std::size_t>(pos) - 1];
          if (w[static_cast<std::size_t>(pos)] < cap) {
            ++w[static_cast<std::size_t>(pos)];
            for (int q = pos + 1; q < pp; ++q) w[static_cast<std::size_t>(q)] = 0;
            break;
          }
          --pos;
        }
        if (pos < 0) break;
      }
    }
  }
  return vectors;
}

// The per-direction traffic cannot deadlock for any non-increasing warm-up vector.
TEST(ScheduleTest, PerDirectionTrafficCompletesForEveryNonIncreasingWarmup) {
  const int vectors = ForEveryNonIncreasingWarmup([](int pp, int m, const std::vector<int>& w) {
    const int depth = *std::max_element(w.begin(), w.end()) + 2;  // activation limit + 1
    std::vector<std::vector<Step>> order;
    for (int s = 0; s < pp; ++s) {
      std::vector<Step> compute;
      for (const Step& st : Build1F1BWithWarmup(pp, s, m, w[static_cast<std::size_t>(s)])) {
        if (st.kind != StepKind::kExchange) compute.push_back(st);
      }
      order.push_back(compute);
    }
    ASSERT_EQ(StuckStage(order, m, depth), -1) << "pp=" << pp << " m=" << m;
  });
  EXPECT_GT(vectors, 1000);
}

// One stage of one micro-batch at a time: F, B, W, the activation freed before the next forward.
TEST(ScheduleTest, SplitBackwardOnOneStageRunsEachMicroBatchWhole) {
  Result<std::vector<Step>> one = BuildSplitBackward(1, 0, 3, {0}, 1, 1, 1);
  ASSERT_TRUE(one.ok()) << one.status().message();
  EXPECT_EQ(ToString(one.value()), "F0 B0 W0 F1 B1 W1 F2 B2 W2");
}

// The 1F1B counts: the first stage runs its warm-up forwards, the last stage's B goes before its
// W so the gradient leaves at once, and every W comes after its B.
TEST(ScheduleTest, SplitBackwardDefersTheWeightGradients) {
  Result<std::vector<Step>> first = BuildSplitBackward(2, 0, 3, {1, 0}, 1, 1, 1);
  Result<std::vector<Step>> last = BuildSplitBackward(2, 1, 3, {1, 0}, 1, 1, 1);
  ASSERT_TRUE(first.ok() && last.ok());
  EXPECT_EQ(ToString(first.value()).substr(0, 5), "F0 F1");
  EXPECT_EQ(ToString(last.value()).substr(0, 8), "F0 B0 W0");
  // Increasing counts would deadlock: refused with the planner's reason.
  Result<std::vector<Step>> bad = BuildSplitBackward(2, 0, 3, {0, 1}, 1, 1, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("split-backward schedule"), std::string::npos);
  EXPECT_FALSE(BuildSplitBackward(3, 0, 3, {1, 0}, 1, 1, 1).ok());  // counts for 2 stages of 3
  EXPECT_FALSE(BuildSplitBackward(2, 2, 3, {1, 0}, 1, 1, 1).ok());  // no stage 2
}

// Every F/B/W order the trainer can be asked to run (any non-increasing counts, clamped) runs each
// micro-batch's F, B and W once, in that order, never holds more activations than its count + 1,
// and completes over the per-direction traffic.
TEST(ScheduleTest, SplitBackwardCompletesForEveryNonIncreasingWarmup) {
  const int vectors = ForEveryNonIncreasingWarmup([](int pp, int m, const std::vector<int>& w) {
    const int depth = *std::max_element(w.begin(), w.end()) + 2;
    std::vector<std::vector<Step>> order;
    for (int s = 0; s < pp; ++s) {
      Result<std::vector<Step>> steps = BuildSplitBackward(pp, s, m, w, 1, 1, 1);
      ASSERT_TRUE(steps.ok()) << steps.status().message();
      std::vector<int> seen(static_cast<std::size_t>(m), 0);  // 1 after F, 2 after B, 3 after W
      int held = 0, peak = 0;
      for (const Step& st : steps.value()) {
        ASSERT_NE(st.kind, StepKind::kExchange);
        int& k = seen[static_cast<std::size_t>(st.mb)];
        const int expect = st.kind == StepKind::kForward ? 0 : st.kind == StepKind::kBackward ? 1 : 2;
        ASSERT_EQ(k, expect) << ToString(steps.value());
        ++k;
        if (st.kind == StepKind::kForward) peak = std::max(peak, ++held);
        if (st.kind == StepKind::kWeight) --held;
      }
      for (int k : seen) ASSERT_EQ(k, 3) << ToString(steps.value());
      EXPECT_LE(peak, std::clamp(w[static_cast<std::size_t>(s)], 0, m - 1) + 1) << ToString(steps.value());
      order.push_back(steps.value());
    }
    ASSERT_EQ(StuckStage(order, m, depth), -1) << "pp=" << pp << " m=" << m;
  });
  EXPECT_GT(vectors, 1000);
}

}  // namespace
}  // namespace falcon::train
