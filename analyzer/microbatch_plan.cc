// Exact min-max micro-batch allocation. See microbatch_plan.h for the contract.
//
// Why the result is optimal. Let T* be the least bottleneck of any allocation (m_i >= 1 integer,
// sum m_i = M). T is achievable iff every t_i <= T and sum_i floor(T / t_i) >= M (pick m_i in
// [1, floor(T / t_i)] summing to M). The algorithm:
//  1. Bound. f(L) = sum_i max(1, L / t_i) is continuous, = n for L <= min t_i and strictly
//     increasing after. Let L solve f(L) = M (L = min t_i when M = n). Any allocation with
//     bottleneck T has m_i <= T / t_i and m_i >= 1, so M <= f(T); hence L <= T*. Without slow
//     groups (all t_i <= L) this is the continuous bound T0 = M / sum(1 / t_i).
//  2. Start. a_i = max(1, floor(L / t_i)). Then sum a_i <= f(L) = M, and a_i * t_i <= T* for
//     every i: either a_i <= L / t_i <= T* / t_i, or a_i = 1 and t_i <= T* (every group runs
//     one micro-batch). So a_i <= c_i := floor(T* / t_i).
//  3. Fill. While sum a_i < M, give one more micro-batch to the group with the least
//     (a_i + 1) * t_i (a min-heap). Since sum c_i >= M > sum a_i, some group has a_i < c_i, and
//     its (a_i + 1) * t_i <= c_i * t_i <= T*; the least key is no larger. So every value ever
//     assigned is <= T*, the final bottleneck is <= T*, and by the definition of T* it is T*.
// Floating point: L is computed with compensated sums (relative error a few ulps) and the start
// is floor(L / t_i * (1 - 1e-12)), which never exceeds floor of the exact L / t_i, so step 2
// holds exactly. Rounding is monotone, so a heap that ties values within an ulp still never
// picks a value whose rounded product exceeds the rounded T*: the returned bottleneck equals the
// minimum of max_i fl(m_i * t_i) over all allocations, which is what a brute force computes.
// Cost: the sort for L, O(n log n); step 2 leaves fewer than 3n units to fill (each floor loses
// < 1, the 1e-12 shrink at most 2 more), so step 3 is O(n log n) too.
#include "analyzer/microbatch_plan.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <queue>
#include <string>
#include <tuple>
#include <utility>

namespace falcon::analyzer {
namespace {

constexpr double kStartShrink = 1.0 - 1e-12;

// Kahan-compensated running sum: error independent of the number of terms.
class CompensatedSum {
 public:
  void Add(double x) {
    const double y = x - carry_;
    const double t = sum_ + y;
    carry_ = (t - sum_) - y;
    sum_ = t;
  }
  double value() const { return sum_; }

 private:
  double sum_ = 0;
  double carry_ = 0;
};

Status CheckTimes(std::span<const double> times_s) {
  if (times_s.empty()) return Status::InvalidArgument("micro-batch plan: no DP groups");
  if (times_s.size() > kMaxMicrobatchGroups) {
    return Status::InvalidArgument("micro-batch plan: " + std::to_string(times_s.size()) +
                                   " DP groups, at most " + std::to_string(kMaxMicrobatchGroups));
  }
  for (std::size_t i = 0; i < times_s.size(); ++i) {
    const double t = times_s[i];
    if (!std::isfinite(t) || t <= 0 || !std::isfinite(1.0 / t)) {
      return Status::InvalidArgument("micro-batch plan: time of DP group " + std::to_string(i) +
                                     " must be finite, > 0 and have a finite reciprocal, got " +
                                     std::to_string(t));
    }
  }
  return Status::Ok();
}

Status CheckTotal(std::size_t groups, std::int64_t total) {
  if (total < static_cast<std::int64_t>(groups) || total > kMaxMicrobatches) {
    return Status::InvalidArgument("micro-batch plan: " + std::to_string(total) +
                                   " micro-batches for " + std::to_string(groups) +
                                   " DP groups; need one per group and at most " +
                                   std::to_string(kMaxMicrobatches));
  }
  return Status::Ok();
}

// M times the slowest group must stay finite, or no bottleneck can be represented.
Status CheckOverflow(std::span<const double> times_s, std::int64_t total) {
  const double slowest = *std::max_element(times_s.begin(), times_s.end());
  if (!std::isfinite(static_cast<double>(total) * slowest)) {
    return Status::InvalidArgument("micro-batch plan: " + std::to_string(total) +
                                   " micro-batches x " + std::to_string(slowest) +
                                   " s overflows a double");
  }
  return Status::Ok();
}

Status CheckAllocation(std::size_t groups, std::span<const std::int64_t> allocation) {
  if (allocation.size() != groups) {
    return Status::InvalidArgument("micro-batch plan: allocation has " +
                                   std::to_string(allocation.size()) + " groups, times have " +
                                   std::to_string(groups));
  }
  std::int64_t sum = 0;
  for (std::size_t i = 0; i < allocation.size(); ++i) {
    if (allocation[i] < 1 || allocation[i] > kMaxMicrobatches - sum) {
      return Status::InvalidArgument(
          "micro-batch plan: DP group " + std::to_string(i) + " has " +
          std::to_string(allocation[i]) +
          " micro-batches; each needs >= 1, the sum <= " + std::to_string(kMaxMicrobatches));
    }
    sum += allocation[i];
  }
  return Status::Ok();
}

// Step 1: the L with sum_i max(1, L / t_i) = M. On the k-th segment (the k fastest groups run
// >= 1 unit at rate L / t, the rest exactly 1) f(L) = L * S_k + (n - k), S_k = their 1 / t sum;
// the first segment whose right end reaches M holds L.
Result<double> LowerBound(std::span<const double> times_s, std::int64_t total) {
  std::vector<double> sorted(times_s.begin(), times_s.end());
  std::sort(sorted.begin(), sorted.end());
  const std::size_t n = sorted.size();
  CompensatedSum reciprocal;
  for (std::size_t k = 1; k <= n; ++k) {
    reciprocal.Add(1.0 / sorted[k - 1]);
    const double units = static_cast<double>(total - static_cast<std::int64_t>(n - k));
    const double bound = units / reciprocal.value();
    if (!std::isfinite(bound) || !std::isfinite(reciprocal.value())) {
      return Status::InvalidArgument("micro-batch plan: the sum of 1 / t overflows a double");
    }
    if (k == n || bound <= sorted[k]) return std::max(bound, sorted[0]);
  }
  return sorted[n - 1];  // unreachable: k == n returns above
}

// Step 2: a_i = max(1, floor(L / t_i)), shrunk by 1e-12 so rounding never rounds up.
std::vector<std::int64_t> StartAllocation(std::span<const double> times_s, double bound) {
  std::vector<std::int64_t> start(times_s.size());
  for (std::size_t i = 0; i < times_s.size(); ++i) {
    const double units = std::floor(bound / times_s[i] * kStartShrink);
    start[i] = std::max<std::int64_t>(1, static_cast<std::int64_t>(units));
  }
  return start;
}

// Step 3: the greedy fill with a min-heap keyed on ((a_i + 1) * t_i, i); ties go to the lower
// index, so the plan is deterministic.
void Fill(std::span<const double> times_s, std::int64_t missing, std::vector<std::int64_t>& alloc) {
  using Entry = std::pair<double, std::size_t>;
  std::vector<Entry> entries(times_s.size());
  for (std::size_t i = 0; i < times_s.size(); ++i) {
    entries[i] = {static_cast<double>(alloc[i] + 1) * times_s[i], i};
  }
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap(std::greater<>{},
                                                                      std::move(entries));
  for (std::int64_t unit = 0; unit < missing; ++unit) {
    const std::size_t i = heap.top().second;
    heap.pop();
    ++alloc[i];
    heap.push({static_cast<double>(alloc[i] + 1) * times_s[i], i});
  }
}

std::int64_t Sum(std::span<const std::int64_t> values) {
  std::int64_t sum = 0;
  for (const std::int64_t v : values) sum += v;
  return sum;
}

// REQUIRES: validated inputs. The argmax of m_i * t_i (lowest index on ties) and its value.
std::pair<std::size_t, double> Bottleneck(std::span<const double> times_s,
                                          std::span<const std::int64_t> alloc) {
  std::pair<std::size_t, double> best{0, -1.0};
  for (std::size_t i = 0; i < times_s.size(); ++i) {
    const double v = static_cast<double>(alloc[i]) * times_s[i];
    if (v > best.second) best = {i, v};
  }
  return best;
}

// REQUIRES: validated inputs; both allocations sum to the same total.
MicrobatchPlan Assemble(std::span<const double> times_s, std::vector<std::int64_t> alloc,
                        std::vector<std::int64_t> baseline, double lower_bound_s) {
  MicrobatchPlan plan;
  plan.total = Sum(alloc);
  plan.lower_bound_s = lower_bound_s;
  plan.bottleneck_before_s = Bottleneck(times_s, baseline).second;
  std::tie(plan.bottleneck_group, plan.bottleneck_after_s) = Bottleneck(times_s, alloc);
  plan.gradient_weights.reserve(alloc.size());
  for (const std::int64_t m : alloc) {
    plan.gradient_weights.push_back(static_cast<double>(m) / static_cast<double>(plan.total));
  }
  plan.microbatches = std::move(alloc);
  plan.baseline = std::move(baseline);
  return plan;
}

// REQUIRES: times checked, 1 <= total <= kMaxMicrobatches, value > 0. True when some allocation
// of `total` has a bottleneck below `value`: every group fits k_i >= 1 micro-batches with
// fl(k_i * t_i) < value, and sum_i k_i >= total (then m_i in [1, k_i] summing to total exist).
// k_i and the running sum are capped at total, so neither can overflow.
bool AllocationBelowExists(std::span<const double> times_s, std::int64_t total, double value) {
  std::int64_t fit = 0;
  for (const double t : times_s) {
    std::int64_t k = total;
    // value / t >= total + 1 means fl(total * t) < value (total <= 2^40: rounding cannot close
    // a gap of a whole t); otherwise floor(value / t) <= 2^40 converts exactly.
    if (const double q = value / t; q < static_cast<double>(total) + 1) {
      k = static_cast<std::int64_t>(std::floor(q));
      while (k > 0 && static_cast<double>(k) * t >= value) --k;
      while (k < total && static_cast<double>(k + 1) * t < value) ++k;
    }
    if (k == 0) return false;
    fit = std::min(fit + k, total);  // every group must still fit one: no early true
  }
  return fit >= total;
}

// REQUIRES: times checked, baseline checked (size n, sum M within limits).
Result<MicrobatchPlan> Solve(std::span<const double> times_s, std::vector<std::int64_t> baseline) {
  const std::int64_t total = Sum(baseline);
  if (Status s = CheckOverflow(times_s, total); !s.ok()) return s;
  Result<double> bound = LowerBound(times_s, total);
  if (!bound.ok()) return bound.status();
  std::vector<std::int64_t> alloc = StartAllocation(times_s, bound.value());
  if (Sum(alloc) > total) {
    // Unreachable by the error analysis above; starting from ones keeps the plan exact anyway.
    std::fill(alloc.begin(), alloc.end(), 1);
  }
  Fill(times_s, total - Sum(alloc), alloc);

  return Assemble(times_s, std::move(alloc), std::move(baseline), bound.value());
}

}  // namespace

Result<std::vector<std::int64_t>> UniformMicrobatches(std::size_t groups, std::int64_t total) {
  if (groups == 0 || groups > kMaxMicrobatchGroups) {
    return Status::InvalidArgument("micro-batch plan: " + std::to_string(groups) +
                                   " DP groups, need 1.." + std::to_string(kMaxMicrobatchGroups));
  }
  if (Status s = CheckTotal(groups, total); !s.ok()) return s;
  const auto n = static_cast<std::int64_t>(groups);
  std::vector<std::int64_t> out(groups, total / n);
  for (std::int64_t i = 0; i < total % n; ++i) ++out[static_cast<std::size_t>(i)];
  return out;
}

Result<double> MicrobatchBottleneck(std::span<const double> times_s,
                                    std::span<const std::int64_t> microbatches) {
  if (Status s = CheckTimes(times_s); !s.ok()) return s;
  if (Status s = CheckAllocation(times_s.size(), microbatches); !s.ok()) return s;
  if (Status s = CheckOverflow(times_s, Sum(microbatches)); !s.ok()) return s;
  return Bottleneck(times_s, microbatches).second;
}

Result<MicrobatchPlan> PlanMicrobatches(std::span<const double> times_s, std::int64_t total) {
  if (Status s = CheckTimes(times_s); !s.ok()) return s;
  Result<std::vector<std::int64_t>> uniform = UniformMicrobatches(times_s.size(), total);
  if (!uniform.ok()) return uniform.status();
  return Solve(times_s, std::move(uniform).value());
}

Result<MicrobatchPlan> ReplanMicrobatches(std::span<const double> times_s,
                                          std::span<const std::int64_t> current) {
  if (Status s = CheckTimes(times_s); !s.ok()) return s;
  if (Status s = CheckAllocation(times_s.size(), current); !s.ok()) return s;
  return Solve(times_s, std::vector<std::int64_t>(current.begin(), current.end()));
}

Result<bool> IsOptimalMicrobatchAllocation(std::span<const double> times_s, std::int64_t total,
                                           std::span<const std::int64_t> microbatches) {
  if (Status s = CheckTimes(times_s); !s.ok()) return s;
  if (Status s = CheckTotal(times_s.size(), total); !s.ok()) return s;
  if (Status s = CheckOverflow(times_s, total); !s.ok()) return s;
  if (microbatches.size() != times_s.size()) {
    return Status::InvalidArgument("micro-batch plan: allocation has " +
                                   std::to_string(microbatches.size()) + " groups, times have " +
                                   std::to_string(times_s.size()));
  }
  if (!CheckAllocation(times_s.size(), microbatches).ok() || Sum(microbatches) != total) {
    return false;  // not an allocation of `total`, so not an optimal one
  }
  return !AllocationBelowExists(times_s, total, Bottleneck(times_s, microbatches).second);
}

Result<MicrobatchPlan> UndoMicrobatchPlan(std::span<const double> times_s,
                                          const MicrobatchPlan& plan) {
  if (Status s = CheckTimes(times_s); !s.ok()) return s;
  for (const auto* alloc : {&plan.microbatches, &plan.baseline}) {
    if (Status s = CheckAllocation(times_s.size(), *alloc); !s.ok()) return s;
    if (Sum(*alloc) != plan.total) {
      return Status::InvalidArgument("micro-batch plan: an allocation does not sum to the total " +
                                     std::to_string(plan.total));
    }
  }
  if (Status s = CheckOverflow(times_s, plan.total); !s.ok()) return s;
  Result<double> bound = LowerBound(times_s, plan.total);
  if (!bound.ok()) return bound.status();
  return Assemble(times_s, plan.baseline, plan.microbatches, bound.value());
}

}  // namespace falcon::analyzer
