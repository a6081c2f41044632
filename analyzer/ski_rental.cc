// Ski-rental mitigation planner. See ski_rental.h for the contract.
#include "analyzer/ski_rental.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

namespace falcon::analyzer {
namespace {

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f s", s);
  return buf;
}

bool ValidOverhead(double s) { return !std::isnan(s) && s >= 0; }

bool ByOverhead(const auto& x, const auto& y) {
  return std::pair(x.overhead_s, x.strategy) < std::pair(y.overhead_s, y.strategy);
}

}  // namespace

const char* StrategyName(Strategy strategy) {
  switch (strategy) {
    case Strategy::kIgnore: return "S1 ignore";
    case Strategy::kRebalanceMicrobatches: return "S2 re-balance micro-batches";
    case Strategy::kAdjustTopology: return "S3 adjust topology";
    case Strategy::kCheckpointRestart: return "S4 checkpoint-restart";
    case Strategy::kAdaptPipeline: return "pipeline adaptation";
  }
  return "?";
}

Result<SkiRentalPlanner> SkiRentalPlanner::Create(RootCause cause,
                                                  const SkiRentalOptions& options) {
  const StrategyOverheads& o = options.overheads;
  for (const double s : {o.pipeline_s, o.rebalance_s, o.topology_s, o.restart_s}) {
    if (!ValidOverhead(s)) {
      return Status::InvalidArgument("ski rental: overheads must be >= 0 seconds, got " +
                                     std::to_string(s));
    }
  }
  if (!std::isfinite(options.recovery_tolerance) || options.recovery_tolerance < 0 ||
      options.recovery_samples < 1) {
    return Status::InvalidArgument(
        "ski rental: recovery_tolerance must be finite and >= 0, recovery_samples >= 1");
  }
  return SkiRentalPlanner(cause, options);
}

SkiRentalPlanner::SkiRentalPlanner(RootCause cause, const SkiRentalOptions& options)
    : options_(options) {
  const StrategyOverheads& o = options.overheads;
  if (cause == RootCause::kCompute) {
    candidates_.push_back({Strategy::kRebalanceMicrobatches, o.rebalance_s});
  } else {
    candidates_.push_back({Strategy::kAdaptPipeline, o.pipeline_s});
  }
  candidates_.push_back({Strategy::kAdjustTopology, o.topology_s});
  candidates_.push_back({Strategy::kCheckpointRestart, o.restart_s});
  std::stable_sort(candidates_.begin(), candidates_.end(), ByOverhead<Candidate, Candidate>);
}

Result<SkiRentalPlanner> SkiRentalPlanner::Restore(RootCause cause,
                                                   const SkiRentalOptions& options,
                                                   const SkiRentalSnapshot& snapshot) {
  Result<SkiRentalPlanner> made = Create(cause, options);
  if (!made.ok()) return made.status();
  SkiRentalPlanner p = std::move(made.value());
  for (const double v : {snapshot.slowdown_s, snapshot.paid_s, snapshot.last_time_s}) {
    if (!std::isfinite(v) || v < 0) {
      return Status::InvalidArgument("ski rental: snapshot sums must be finite and >= 0");
    }
  }
  if (snapshot.calm_samples < 0) {
    return Status::InvalidArgument("ski rental: snapshot calm_samples must be >= 0");
  }
  for (const Strategy s : snapshot.applied) {
    const auto first = p.candidates_.begin() + static_cast<std::ptrdiff_t>(p.next_);
    const auto it = std::find_if(first, p.candidates_.end(),
                                 [&](const Candidate& c) { return c.strategy == s; });
    if (it == p.candidates_.end()) {
      return Status::InvalidArgument(std::string("ski rental: snapshot applies ") +
                                     StrategyName(s) +
                                     ", which is not a candidate here or was applied twice");
    }
    std::rotate(first, it, it + 1);  // keeps the rest sorted by overhead
    p.current_ = s;
    ++p.next_;
  }
  p.rebalance_in_effect_ = snapshot.rebalance_in_effect;
  p.pipeline_in_effect_ = snapshot.pipeline_in_effect;
  p.stopped_ = snapshot.stopped;
  p.slowdown_s_ = snapshot.slowdown_s;
  p.paid_s_ = snapshot.paid_s;
  p.last_time_s_ = snapshot.last_time_s;
  p.calm_samples_ = snapshot.calm_samples;
  return p;
}

SkiRentalSnapshot SkiRentalPlanner::Snapshot() const {
  SkiRentalSnapshot s;
  for (std::size_t i = 0; i < next_; ++i) s.applied.push_back(candidates_[i].strategy);
  s.rebalance_in_effect = rebalance_in_effect_;
  s.pipeline_in_effect = pipeline_in_effect_;
  s.stopped = stopped_;
  s.slowdown_s = slowdown_s_;
  s.paid_s = paid_s_;
  s.last_time_s = last_time_s_;
  s.calm_samples = calm_samples_;
  return s;
}

std::vector<Strategy> SkiRentalPlanner::remaining() const {
  std::vector<Strategy> out;
  for (std::size_t i = next_; i < candidates_.size(); ++i) out.push_back(candidates_[i].strategy);
  return out;
}

Status SkiRentalPlanner::CheckTime(double time_s) const {
  if (stopped_) return Status::InvalidArgument("ski rental: the planner has stopped");
  if (!std::isfinite(time_s) || time_s < last_time_s_) {
    return Status::InvalidArgument("ski rental: time " + std::to_string(time_s) +
                                   " s is not finite or goes back before " +
                                   std::to_string(last_time_s_) + " s");
  }
  return Status::Ok();
}

Status SkiRentalPlanner::SetOverhead(Strategy strategy, double seconds) {
  if (!ValidOverhead(seconds)) {
    return Status::InvalidArgument("ski rental: overhead of " +
                                   std::string(StrategyName(strategy)) +
                                   " must be >= 0 seconds, got " + std::to_string(seconds));
  }
  const auto it = std::find_if(candidates_.begin(), candidates_.end(),
                               [&](const Candidate& c) { return c.strategy == strategy; });
  if (it == candidates_.end()) {
    return Status::InvalidArgument(std::string("ski rental: ") + StrategyName(strategy) +
                                   " is not a candidate for this root cause");
  }
  it->overhead_s = seconds;
  const auto first = candidates_.begin() + static_cast<std::ptrdiff_t>(next_);
  std::stable_sort(first, candidates_.end(), ByOverhead<Candidate, Candidate>);
  return Status::Ok();
}

// The most expensive candidate not yet applied whose overhead the budget covers, if any.
std::optional<MitigationDecision> SkiRentalPlanner::MaybeSwitch(double time_s) {
  const double budget =
      options_.rule == SwitchRule::kCostSinceOnset ? slowdown_s_ + paid_s_ : slowdown_s_;
  std::optional<std::size_t> pick;
  for (std::size_t i = next_; i < candidates_.size(); ++i) {
    if (candidates_[i].overhead_s <= budget) pick = i;
  }
  if (!pick) return std::nullopt;
  const Candidate& c = candidates_[*pick];
  MitigationDecision d;
  d.kind = DecisionKind::kSwitch;
  d.from = current_;
  d.to = c.strategy;
  d.time_s = time_s;
  d.accumulated_slowdown_s = slowdown_s_;
  d.overheads_paid_s = paid_s_;
  d.overhead_s = c.overhead_s;
  d.reason = std::string(options_.rule == SwitchRule::kCostSinceOnset ? "cost since onset "
                                                                      : "slowdown since onset ") +
             Seconds(budget) + " >= overhead " + Seconds(c.overhead_s) + " of " +
             StrategyName(c.strategy);
  paid_s_ += c.overhead_s;
  current_ = c.strategy;
  next_ = *pick + 1;
  if (c.strategy == Strategy::kRebalanceMicrobatches) rebalance_in_effect_ = true;
  if (c.strategy == Strategy::kAdaptPipeline) pipeline_in_effect_ = true;
  if (c.strategy == Strategy::kCheckpointRestart) rebalance_in_effect_ = pipeline_in_effect_ = false;
  return d;
}

MitigationDecision SkiRentalPlanner::Stop(double time_s, const std::string& why) {
  MitigationDecision d;
  d.kind = DecisionKind::kStop;
  d.from = current_;
  d.to = Strategy::kIgnore;
  d.time_s = time_s;
  d.accumulated_slowdown_s = slowdown_s_;
  d.overheads_paid_s = paid_s_;
  d.undo_rebalance = rebalance_in_effect_;
  d.undo_pipeline = pipeline_in_effect_;
  d.reason = why + (rebalance_in_effect_ ? "; undo the micro-batch re-balancing" : "") +
             (pipeline_in_effect_ ? "; back to the job's own warm-up counts" : "");
  stopped_ = true;
  last_time_s_ = time_s;
  return d;
}

Result<std::optional<MitigationDecision>> SkiRentalPlanner::Observe(const IterationSample& s) {
  if (Status st = CheckTime(s.time_s); !st.ok()) return st;
  if (!std::isfinite(s.iteration_s) || s.iteration_s <= 0 ||
      !std::isfinite(s.healthy_iteration_s) || s.healthy_iteration_s <= 0 || s.iterations < 1) {
    return Status::InvalidArgument(
        "ski rental: sample needs finite iteration times > 0 and iterations >= 1, got " +
        std::to_string(s.iteration_s) + " s vs healthy " + std::to_string(s.healthy_iteration_s) +
        " s x " + std::to_string(s.iterations));
  }
  last_time_s_ = s.time_s;
  slowdown_s_ +=
      static_cast<double>(s.iterations) * std::max(0.0, s.iteration_s - s.healthy_iteration_s);
  if (current_ == Strategy::kIgnore) {
    const bool calm = s.iteration_s <= (1 + options_.recovery_tolerance) * s.healthy_iteration_s;
    calm_samples_ = calm ? calm_samples_ + 1 : 0;
    if (calm_samples_ >= options_.recovery_samples) {
      return std::optional(Stop(s.time_s, "iteration times back to healthy"));
    }
  }
  return MaybeSwitch(s.time_s);
}

Result<MitigationDecision> SkiRentalPlanner::End(double time_s) {
  if (Status st = CheckTime(time_s); !st.ok()) return st;
  return Stop(time_s, "the fail-slow ended");
}

}  // namespace falcon::analyzer
