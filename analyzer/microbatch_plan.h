// S2 micro-batch re-distribution (FALCON §5, FALCON-MITIGATE): given each DP group's time per
// micro-batch t_i (the time its pipeline needs per micro-batch, slow groups larger) and the M
// micro-batches of one iteration, give group i m_i >= 1 micro-batches, sum m_i = M, so that the
// iteration's bottleneck max_i m_i * t_i is as small as possible. The answer is exact, not an
// approximation: the bottleneck equals the minimum over all integer allocations (the argument
// is in microbatch_plan.cc), in O(n log n) for n groups.
// A plan also carries the allocation it replaces (the even split the job runs by default, or the
// caller's current one), both bottlenecks, and the gradient weights w_i = m_i / M that keep the
// loss unbiased: with unequal shares, group i's gradient (the mean over its m_i micro-batches)
// must count w_i of the global gradient, i.e. be scaled by w_i before a summing all-reduce or by
// n * w_i before an averaging one, so that every sample weighs the same as without the plan.
// UndoMicrobatchPlan gives the plan that restores the replaced allocation (the fail-slow ended).
// Thread-safety: stateless functions on values; safe from any thread.
// Must never: do I/O, read clocks or globals, or return an allocation that breaks
// m_i >= 1 and sum m_i = M.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "falcon/status.h"

namespace falcon::analyzer {

// Limits: more groups than ranks any job has, more micro-batches than any iteration runs; both
// keep every m_i and sum exact in an int64 and in a double.
inline constexpr std::size_t kMaxMicrobatchGroups = std::size_t{1} << 24;
inline constexpr std::int64_t kMaxMicrobatches = std::int64_t{1} << 40;

struct MicrobatchPlan {
  std::int64_t total = 0;                  // M = sum of microbatches = sum of baseline
  std::vector<std::int64_t> microbatches;  // m_i >= 1, the plan
  std::vector<std::int64_t> baseline;      // the allocation the plan replaces (m_i >= 1)
  std::vector<double> gradient_weights;    // m_i / M; they sum to 1 (up to rounding)
  double bottleneck_before_s = 0;  // max_i baseline_i * t_i: expected iteration bottleneck now
  // max_i m_i * t_i; from PlanMicrobatches / ReplanMicrobatches the minimum over all allocations.
  double bottleneck_after_s = 0;
  std::size_t bottleneck_group = 0;  // a group i with m_i * t_i = bottleneck_after_s
  // Continuous lower bound on bottleneck_after_s: M / sum(1 / t_i) when no group is slower than
  // that, otherwise the bound with the slow groups held at their one micro-batch.
  double lower_bound_s = 0;
};

// The even split a job runs by default: M / n each, the first M mod n groups one more.
// InvalidArgument unless 1 <= n <= kMaxMicrobatchGroups and n <= M <= kMaxMicrobatches.
[[nodiscard]] Result<std::vector<std::int64_t>> UniformMicrobatches(std::size_t groups,
                                                                    std::int64_t total);

// max_i microbatches_i * times_s_i, the iteration bottleneck of an allocation. InvalidArgument
// when the sizes differ or for an invalid time or micro-batch count (same rules as below).
[[nodiscard]] Result<double> MicrobatchBottleneck(std::span<const double> times_s,
                                                  std::span<const std::int64_t> microbatches);

// The optimal plan for `total` micro-batches, replacing the even split. times_s[i] is group i's
// seconds per micro-batch, finite and > 0. InvalidArgument, naming the fault, for no groups,
// more than kMaxMicrobatchGroups, total < n or > kMaxMicrobatches, a non-finite or
// non-positive time, or times whose products or reciprocal sums overflow a double.
[[nodiscard]] Result<MicrobatchPlan> PlanMicrobatches(std::span<const double> times_s,
                                                      std::int64_t total);

// The optimal plan replacing `current` (the allocation the job runs now: same size as times_s,
// each >= 1; M = its sum). Same errors, plus a current allocation of the wrong size or with a
// count < 1.
[[nodiscard]] Result<MicrobatchPlan> ReplanMicrobatches(std::span<const double> times_s,
                                                        std::span<const std::int64_t> current);

// The optimality certificate, independent of the solver and O(n): true when `microbatches` is an
// allocation of `total` (each m_i >= 1, summing to total) whose bottleneck max_i m_i * t_i is the
// least over every such allocation, false when it is not an allocation of `total` or a smaller
// bottleneck exists. Products are rounded as the solver and MicrobatchBottleneck round them, so
// a PlanMicrobatches / ReplanMicrobatches answer always passes. Tests and benchmarks use it to
// judge answers too large to enumerate. InvalidArgument for times or a total that
// PlanMicrobatches refuses, or an allocation whose size differs from times_s.
[[nodiscard]] Result<bool> IsOptimalMicrobatchAllocation(std::span<const double> times_s,
                                                         std::int64_t total,
                                                         std::span<const std::int64_t> microbatches);

// The plan that goes back to plan.baseline (e.g. the fail-slow ended), judged at times_s (the
// times now, which may differ from those the plan was made for): microbatches = plan.baseline,
// baseline = plan.microbatches, weights baseline_i / M, both bottlenecks and the bound at
// times_s. Same errors as ReplanMicrobatches, plus a plan whose allocations do not match times_s.
[[nodiscard]] Result<MicrobatchPlan> UndoMicrobatchPlan(std::span<const double> times_s,
                                                        const MicrobatchPlan& plan);

}  // namespace falcon::analyzer
