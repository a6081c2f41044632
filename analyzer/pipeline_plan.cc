// Pipeline adaptation: the delay model and the warm-up planners. See pipeline_plan.h for the
// model and the contract.
//
// Chain sums use prefix sums, so SteadyPeriod and the least counts for a period cost O(S^2) and
// LinkDelayTolerance O(S^2) (a suffix minimum per chain start). Initial planning is a
// water-filling in integers: raise every slackness by one per round, lowest link first, freezing
// a link when a stage it feeds would exceed its limit. Stage i's count is 1 + the slackness of
// the links i.. S-2, so a link's slackness counts against the limits of the stages before it:
// raising lower links first uses the fewest limits, and round by round the minimum, then the
// next, is as large as it can be (checked against a brute force in the tests).
// Adaptation counts the warm-up vectors the limits admit (a DP over stage and value, saturated)
// and simulates them all when few enough; otherwise it descends from five starts, remembering
// every simulated vector so that no schedule is simulated twice.
#include "analyzer/pipeline_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <utility>

namespace falcon::analyzer {
namespace {

std::string Str(std::int64_t v) { return std::to_string(v); }

// Prefix sums of a validated model, for chain sums in O(1).
class Chains {
 public:
  explicit Chains(const PipelineModel& model)
      : s_(model.stages.size()), delay_(s_ + 1, 0.0), g_(s_ + 1, 0.0), v_(s_, 0.0) {
    const bool split = model.backward == BackwardMode::kSplit;
    for (std::size_t s = 0; s < s_; ++s) {
      const StageTimes& t = model.stages[s];
      g_[s + 1] = g_[s] + t.forward_s + t.backward_s + (split ? 0.0 : t.weight_s);
      v_[s] = split ? t.weight_s : 0.0;
      stage_period_ = std::max(stage_period_, t.forward_s + t.backward_s + t.weight_s);
      delay_[s + 1] = delay_[s] + (s + 1 < s_ ? model.link_delay_s[s] : 0.0);
    }
  }
  std::size_t stages() const { return s_; }
  double stage_period() const { return stage_period_; }
  // The left side of chain i..k (i <= k): 2 (c_i + ... + c_{k-1}) + G_i + ... + G_k + V_i.
  double Weight(std::size_t i, std::size_t k) const {
    return 2 * (delay_[k] - delay_[i]) + (g_[k + 1] - g_[i]) + v_[i];
  }

 private:
  std::size_t s_;
  std::vector<double> delay_;  // delay_[l] = c_0 + ... + c_{l-1}
  std::vector<double> g_;      // g_[l] = G_0 + ... + G_{l-1}
  std::vector<double> v_;
  double stage_period_ = 0;
};

double Period(const Chains& chains, std::span<const std::int32_t> x) {
  double period = 0;
  for (std::size_t i = 0; i < chains.stages(); ++i) {
    for (std::size_t k = i; k < chains.stages(); ++k) {
      period = std::max(period, chains.Weight(i, k) / static_cast<double>(x[i] - x[k] + 1));
    }
  }
  return period;
}

// The least non-increasing counts that meet every chain condition at period `period`, or false
// when they exceed `cap` somewhere. x_i - x_k + 1 >= Weight / period, with the quotient shrunk by
// 1e-12 so that a chain met exactly is not rounded up.
bool LeastWarmup(const Chains& chains, double period, std::span<const std::int32_t> cap,
                 std::vector<std::int32_t>& x) {
  const std::size_t s_count = chains.stages();
  x.assign(s_count, 1);
  for (std::size_t i = s_count - 1; i-- > 0;) {
    double need = x[i + 1];
    for (std::size_t k = i + 1; k < s_count; ++k) {
      const double periods = std::ceil(chains.Weight(i, k) / period * (1 - 1e-12));
      need = std::max(need, x[k] - 1 + periods);
    }
    if (need > cap[i]) return false;
    x[i] = static_cast<std::int32_t>(need);
  }
  return true;
}

// Model-based start for AdaptPipeline: the least counts for the smallest feasible period.
std::vector<std::int32_t> ModelWarmup(const Chains& chains, std::span<const std::int32_t> cap) {
  std::vector<std::int32_t> x;
  if (LeastWarmup(chains, chains.stage_period(), cap, x)) return x;
  double lo = chains.stage_period();
  double hi = 0;  // every count 1 meets each chain at its own weight
  for (std::size_t i = 0; i < chains.stages(); ++i) {
    for (std::size_t k = i; k < chains.stages(); ++k) hi = std::max(hi, chains.Weight(i, k));
  }
  for (int step = 0; step < 200 && hi - lo > 1e-12 * hi; ++step) {
    const double mid = lo + (hi - lo) / 2;
    if (LeastWarmup(chains, mid, cap, x)) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  if (!LeastWarmup(chains, hi, cap, x)) x.assign(chains.stages(), 1);  // ones fit every cap
  return x;
}

Status CheckLimits(std::span<const std::int32_t> limit, std::int32_t microbatches) {
  const auto stages = static_cast<std::int64_t>(limit.size());
  if (stages < 1 || stages > kMaxPipelineStages) {
    return Status::InvalidArgument("pipeline plan: " + Str(stages) + " stages, need 1.." +
                                   Str(std::int64_t{kMaxPipelineStages}));
  }
  std::vector<std::int32_t> ones(limit.size(), 1);
  if (Status s = ValidateWarmup(static_cast<std::int32_t>(stages), microbatches, ones); !s.ok()) {
    return s;  // N out of range
  }
  for (std::size_t s = 0; s < limit.size(); ++s) {
    if (limit[s] < 1) {
      return Status::InvalidArgument(
          "pipeline plan: stage " + Str(static_cast<std::int64_t>(s)) + " may hold " +
          Str(std::int64_t{limit[s]}) +
          " micro-batches' activations; every schedule holds at least 1 on every stage");
    }
  }
  return Status::Ok();
}

// The caps a non-increasing plan can reach: cap_s = min over stages <= s of min(limit, N).
std::vector<std::int32_t> EffectiveCaps(std::span<const std::int32_t> limit, std::int32_t n) {
  std::vector<std::int32_t> cap(limit.size());
  std::int32_t running = n;
  for (std::size_t s = 0; s < limit.size(); ++s) {
    running = std::min(running, limit[s]);
    cap[s] = running;
  }
  return cap;
}

std::int32_t MinSlackness(std::span<const std::int32_t> x) {
  std::int32_t least = x.size() > 1 ? std::numeric_limits<std::int32_t>::max() : 0;
  for (std::size_t i = 0; i + 1 < x.size(); ++i) least = std::min(least, x[i] - x[i + 1]);
  return least;
}

// How many non-increasing vectors lie within the (non-increasing) caps, or more than `limit`
// when that many or more: ways[v] counts the prefixes ending in value v, summed from the top.
std::int64_t CountWarmups(std::span<const std::int32_t> cap, std::int64_t limit) {
  std::vector<std::int64_t> ways(static_cast<std::size_t>(cap[0]) + 1, 1);
  ways[0] = 0;
  for (std::size_t s = 1; s < cap.size(); ++s) {
    std::vector<std::int64_t> next(ways.size(), 0);
    std::int64_t above = 0;  // prefixes whose last value is >= v, saturated at limit + 1
    for (std::size_t v = ways.size() - 1; v >= 1; --v) {
      above = std::min(limit + 1, above + ways[v]);
      if (v <= static_cast<std::size_t>(cap[s])) next[v] = above;
    }
    ways = std::move(next);
  }
  std::int64_t total = 0;
  for (const std::int64_t w : ways) total = std::min(limit + 1, total + w);
  return total;
}

// The search's state: the best counts so far and their time, every simulated time (so no
// vector is simulated twice), and the evaluation budget of the descents.
class Search {
 public:
  Search(const PipelineAdaptRequest& r, std::vector<std::int32_t> cap, std::int64_t budget)
      : r_(r), cap_(std::move(cap)), budget_(budget) {}

  // Variable-neighbourhood descent from `start` (feasible): the moves of size 1 (below), first
  // improvement; when none improves, size 2, 4, ... up to the largest cap; after an improvement,
  // size 1 again. Lower moves come first, so of equally fast plans the one with less memory is
  // usually kept. Stops at a local optimum or when the budget is spent.
  void Descend(const std::vector<std::int32_t>& start) {
    std::vector<std::int32_t> current = start;
    double current_s = Time(current);
    const std::int32_t largest = *std::max_element(cap_.begin(), cap_.end());
    for (std::int32_t size = 1; size <= largest && evaluations_ < budget_;) {
      size = TryMoves(size, current, current_s) ? 1 : 2 * size;
    }
  }

  // Simulates every non-increasing vector within the caps, smallest first (so ties keep the
  // lexicographically smallest). Ignores the budget.
  void Enumerate() {
    std::vector<std::int32_t> x(cap_.size());
    EnumerateFrom(0, x);
  }

  const std::vector<std::int32_t>& best() const { return best_; }
  double best_s() const { return best_s_; }
  std::int32_t evaluations() const { return evaluations_; }

 private:
  enum class Move : std::uint8_t { kLower, kLowerPrefix, kRaise, kRaisePrefix };

  // The simulated iteration time of feasible counts x; the best so far keeps the first of ties.
  double Time(const std::vector<std::int32_t>& x) {
    const auto [it, fresh] = times_.try_emplace(x, 0.0);
    if (!fresh) return it->second;
    ++evaluations_;
    const Result<double> t = WarmupIterationTime(r_.model, x, r_.microbatches);
    it->second = t.ok() ? t.value() : std::numeric_limits<double>::infinity();
    if (it->second < best_s_ * (1 - 1e-12)) {
      best_ = x;
      best_s_ = it->second;
    }
    return it->second;
  }

  void EnumerateFrom(std::size_t s, std::vector<std::int32_t>& x) {
    if (s == x.size()) {
      Time(x);
      return;
    }
    const std::int32_t high = s == 0 ? cap_[0] : std::min(cap_[s], x[s - 1]);
    for (std::int32_t v = 1; v <= high; ++v) {
      x[s] = v;
      EnumerateFrom(s + 1, x);
    }
  }

  // True when a move of `size` improved `current` (which it then replaces).
  bool TryMoves(std::int32_t size, std::vector<std::int32_t>& current, double& current_s) {
    for (const Move move : {Move::kLower, Move::kLowerPrefix, Move::kRaise, Move::kRaisePrefix}) {
      for (std::size_t i = 0; i < current.size(); ++i) {
        if (evaluations_ >= budget_) return false;
        std::vector<std::int32_t> x = current;
        Apply(move, i, size, x);
        if (!Feasible(x)) continue;
        if (const double t = Time(x); t < current_s * (1 - 1e-12)) {
          current = std::move(x);
          current_s = t;
          return true;
        }
      }
    }
    return false;
  }

  // kLower: x_i down, later counts pulled down to it; kLowerPrefix: x_0..x_i down (slackness
  // D_i down; i = S-1 lowers every count), later counts pulled down; kRaise: x_i up, earlier
  // counts pushed up to it; kRaisePrefix: x_0..x_i up (D_i up). The result may be infeasible.
  static void Apply(Move move, std::size_t i, std::int32_t size, std::vector<std::int32_t>& x) {
    const bool lower = move == Move::kLower || move == Move::kLowerPrefix;
    const bool prefix = move == Move::kLowerPrefix || move == Move::kRaisePrefix;
    for (std::size_t k = prefix ? 0 : i; k <= i; ++k) x[k] += lower ? -size : size;
    for (std::size_t k = 0; k < x.size(); ++k) {
      if (lower && k > i) x[k] = std::min(x[k], x[i]);
      if (!lower && k < i) x[k] = std::max(x[k], x[i]);
    }
  }

  bool Feasible(const std::vector<std::int32_t>& x) const {
    for (std::size_t s = 0; s < x.size(); ++s) {
      if (x[s] < 1 || x[s] > cap_[s] || (s > 0 && x[s] > x[s - 1])) return false;
    }
    return true;
  }

  const PipelineAdaptRequest& r_;
  const std::vector<std::int32_t> cap_;
  const std::int64_t budget_;
  std::map<std::vector<std::int32_t>, double> times_;
  std::vector<std::int32_t> best_;
  double best_s_ = std::numeric_limits<double>::infinity();
  std::int32_t evaluations_ = 0;
};

}  // namespace

Result<double> UniformDelayTolerance(std::int32_t slackness, const StageTimes& times,
                                     BackwardMode mode) {
  PipelineModel one;
  one.stages = {times};
  one.backward = mode;
  if (Status s = ValidatePipelineModel(one); !s.ok()) return s;
  if (slackness < 0) {
    return Status::InvalidArgument("pipeline plan: slackness " + Str(std::int64_t{slackness}) +
                                   " < 0; warm-up counts must not increase along the pipeline");
  }
  const double d = slackness;
  const double fb = times.forward_s + times.backward_s;
  if (mode == BackwardMode::kFused) return (d - 1) * (fb + times.weight_s) / 2;
  return ((d - 1) * fb + d * times.weight_s) / 2;
}

Result<double> SteadyPeriod(const PipelineModel& model, std::span<const std::int32_t> warmup) {
  if (Status s = ValidatePipelineModel(model); !s.ok()) return s;
  const std::int32_t n = warmup.empty() ? 1 : *std::max_element(warmup.begin(), warmup.end());
  const auto stages = static_cast<std::int32_t>(model.stages.size());
  if (Status s = ValidateWarmup(stages, std::max(n, 1), warmup); !s.ok()) return s;
  return Period(Chains(model), warmup);
}

Result<std::vector<double>> LinkDelayTolerance(const PipelineModel& model,
                                               std::span<const std::int32_t> warmup) {
  if (Result<double> p = SteadyPeriod(model, warmup); !p.ok()) return p.status();
  const Chains chains(model);
  const std::size_t s_count = chains.stages();
  const double period = chains.stage_period();
  // headroom(i, k) = ((x_i - x_k + 1) T - Weight(i, k)) / 2; link l's tolerance is c_l plus the
  // least headroom of the chains through it (i <= l < k).
  std::vector<double> least(s_count > 0 ? s_count - 1 : 0, std::numeric_limits<double>::infinity());
  std::vector<double> suffix(s_count + 1);
  for (std::size_t i = 0; i + 1 < s_count; ++i) {
    suffix[s_count] = std::numeric_limits<double>::infinity();
    for (std::size_t k = s_count; k-- > i + 1;) {
      const double periods = warmup[i] - warmup[k] + 1;
      suffix[k] = std::min(suffix[k + 1], (periods * period - chains.Weight(i, k)) / 2);
    }
    for (std::size_t l = i; l + 1 < s_count; ++l) least[l] = std::min(least[l], suffix[l + 1]);
  }
  for (std::size_t l = 0; l < least.size(); ++l) {
    least[l] = std::max(0.0, model.link_delay_s[l] + least[l]);
  }
  return least;
}

Result<std::vector<std::int32_t>> PlanInitialWarmup(std::span<const std::int32_t> activation_limit,
                                                    std::int32_t microbatches) {
  if (Status s = CheckLimits(activation_limit, microbatches); !s.ok()) return s;
  const std::size_t s_count = activation_limit.size();
  std::vector<std::int32_t> cap(s_count);
  for (std::size_t s = 0; s < s_count; ++s) cap[s] = std::min(activation_limit[s], microbatches);
  std::vector<std::int32_t> x(s_count, 1);
  std::vector<bool> frozen(s_count > 0 ? s_count - 1 : 0, false);
  bool raised = true;
  while (raised) {
    raised = false;
    for (std::size_t link = 0; link + 1 < s_count; ++link) {
      if (frozen[link]) continue;
      // Raising the slackness of `link` raises the counts of stages 0..link by one.
      bool fits = true;
      for (std::size_t s = 0; s <= link && fits; ++s) fits = x[s] < cap[s];
      if (!fits) {
        frozen[link] = true;
        continue;
      }
      for (std::size_t s = 0; s <= link; ++s) ++x[s];
      raised = true;
    }
  }
  return x;
}

Result<PipelinePlan> AdaptPipeline(const PipelineAdaptRequest& request) {
  if (Status s = ValidatePipelineModel(request.model); !s.ok()) return s;
  const std::size_t s_count = request.model.stages.size();
  const auto stages = static_cast<std::int32_t>(s_count);
  if (request.activation_limit.size() != s_count) {
    return Status::InvalidArgument(
        "pipeline plan: " + Str(static_cast<std::int64_t>(request.activation_limit.size())) +
        " activation limits for " + Str(std::int64_t{stages}) + " stages");
  }
  if (Status s = CheckLimits(request.activation_limit, request.microbatches); !s.ok()) return s;
  if (request.max_evaluations < 0 || request.exhaustive_budget < 0) {
    return Status::InvalidArgument(
        "pipeline plan: max_evaluations and exhaustive_budget must be >= 0");
  }
  PipelinePlan plan;
  plan.baseline_warmup = request.current_warmup;
  if (plan.baseline_warmup.empty()) {
    plan.baseline_warmup = StandardWarmup(stages, request.microbatches).value();
  }
  if (Status s = ValidateWarmup(stages, request.microbatches, plan.baseline_warmup); !s.ok()) {
    return s;
  }
  const std::vector<std::int32_t> cap =
      EffectiveCaps(request.activation_limit, request.microbatches);
  const Chains chains(request.model);
  Search search(request, cap, std::int64_t{request.max_evaluations} + 5);  // starts are free
  const std::int64_t most_vectors =
      request.exhaustive_budget / (std::int64_t{stages} * request.microbatches);
  plan.exhaustive = most_vectors > 0 && CountWarmups(cap, most_vectors) <= most_vectors;
  if (plan.exhaustive) {
    search.Enumerate();
  } else {
    std::vector<std::vector<std::int32_t>> starts = {
        ModelWarmup(chains, cap), plan.baseline_warmup,
        StandardWarmup(stages, request.microbatches).value(),
        PlanInitialWarmup(request.activation_limit, request.microbatches).value(), cap};
    for (auto& start : starts) {
      for (std::size_t s = 0; s < s_count; ++s) start[s] = std::min(start[s], cap[s]);
    }
    for (const auto& start : starts) search.Descend(start);
  }

  plan.warmup = search.best();
  plan.iteration_s = search.best_s();
  Result<double> baseline =
      WarmupIterationTime(request.model, plan.baseline_warmup, request.microbatches);
  if (!baseline.ok()) return baseline.status();
  plan.baseline_iteration_s = baseline.value();
  plan.steady_period_s = Period(chains, plan.warmup);
  plan.stage_period_s = chains.stage_period();
  plan.min_slackness = MinSlackness(plan.warmup);
  plan.evaluations = search.evaluations();
  return plan;
}

}  // namespace falcon::analyzer
