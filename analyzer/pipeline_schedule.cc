// Pipeline schedules: the greedy builder (Algorithms 3-4) and the exact simulator. See
// pipeline_schedule.h for the model and the contract.
//
// The builder is an event-driven list scheduler. A heap holds, per stage, the time it next
// decides (when its op ends, or when an input it may use arrives). Why a decision at time t sees
// every input that has arrived by t: an op's output is recorded when the op starts, arriving at
// its end plus the link delay; F and B take > 0 s, and stages decide in time order, so anything
// recorded later arrives after t. Hence the greedy choice is exact, and the schedule's own
// timeline is what SimulatePipeline computes for it (the tests check this).
// The simulator walks each stage's order with a worklist: a stage advances while its next op's
// dependency has ended; an op that ends wakes the one stage that may wait for it. Every op is
// placed once, so both run in O(S N log S) and O(S N) time.
#include "analyzer/pipeline_schedule.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <queue>
#include <string>
#include <utility>

namespace falcon::analyzer {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kUnknown = -1.0;  // an end or arrival time not computed yet (times are >= 0)

std::string Str(std::int64_t v) { return std::to_string(v); }
std::string Str(double v) { return std::to_string(v); }

std::size_t Idx(std::int32_t stage, std::int32_t microbatch, std::int32_t n) {
  return static_cast<std::size_t>(stage) * static_cast<std::size_t>(n) +
         static_cast<std::size_t>(microbatch);
}

// REQUIRES: a validated model.
double Duration(const PipelineModel& model, std::int32_t stage, PipelineOpKind kind) {
  const StageTimes& t = model.stages[static_cast<std::size_t>(stage)];
  switch (kind) {
    case PipelineOpKind::kForward:
      return t.forward_s;
    case PipelineOpKind::kBackward:
      return model.backward == BackwardMode::kFused ? t.backward_s + t.weight_s : t.backward_s;
    case PipelineOpKind::kWeight:
      return t.weight_s;
  }
  return 0;
}

double Delay(const PipelineModel& model, std::int32_t link) {
  return model.link_delay_s[static_cast<std::size_t>(link)];
}

Status CheckCounts(std::int32_t stages, std::int32_t microbatches) {
  if (stages < 1 || stages > kMaxPipelineStages) {
    return Status::InvalidArgument("pipeline: " + Str(std::int64_t{stages}) + " stages, need 1.." +
                                   Str(std::int64_t{kMaxPipelineStages}));
  }
  if (microbatches < 1 || microbatches > kMaxPipelineMicrobatches ||
      std::int64_t{stages} * microbatches * 3 > kMaxPipelineOps) {
    return Status::InvalidArgument("pipeline: " + Str(std::int64_t{microbatches}) +
                                   " micro-batches on " + Str(std::int64_t{stages}) +
                                   " stages; need 1.." +
                                   Str(std::int64_t{kMaxPipelineMicrobatches}) +
                                   " and stages x micro-batches x 3 <= " + Str(kMaxPipelineOps));
  }
  return Status::Ok();
}

bool NonNegativeFinite(double v) { return std::isfinite(v) && v >= 0; }

// ---- The builder (Algorithms 3-4) ----

// One stage's progress: ops started so far of each kind (each kind runs in micro-batch order).
struct BuilderStage {
  std::int32_t forwards = 0;
  std::int32_t backwards = 0;
  std::int32_t weights = 0;
  double free_s = 0;       // when its last op ends
  double decide_s = kInf;  // its live heap entry; kInf: waiting to be woken
};

class Builder {
 public:
  Builder(const PipelineModel& model, std::span<const std::int32_t> warmup, std::int32_t n)
      : model_(model),
        warmup_(warmup),
        n_(n),
        s_count_(static_cast<std::int32_t>(model.stages.size())),
        split_(model.backward == BackwardMode::kSplit),
        stages_(model.stages.size()),
        arrive_f_(model.stages.size() * static_cast<std::size_t>(n), kUnknown),
        arrive_b_(model.stages.size() * static_cast<std::size_t>(n), kUnknown) {
    for (std::int32_t j = 0; j < n; ++j) arrive_f_[Idx(0, j, n)] = 0;  // inputs are local
  }

  // Runs the greedy schedule; appends each stage's ops to `out` when non-null. The iteration
  // time, or Internal if the pipeline stops (unreachable for validated warm-up counts).
  Result<double> Run(PipelineSchedule* out) {
    for (std::int32_t s = 0; s < s_count_; ++s) Wake(s, 0);
    double end = 0;
    std::int64_t left = std::int64_t{s_count_} * n_ * (split_ ? 3 : 2);
    while (!heap_.empty()) {
      const auto [t, s] = heap_.top();
      heap_.pop();
      BuilderStage& st = stages_[static_cast<std::size_t>(s)];
      if (t != st.decide_s) continue;  // superseded by an earlier wake
      st.decide_s = kInf;
      const auto op = Choose(s, t);
      if (!op.has_value()) {
        Wake(s, NextArrival(s));
        continue;
      }
      const double op_end = Start(s, *op, t);
      if (out != nullptr) out->stages[static_cast<std::size_t>(s)].push_back(*op);
      end = std::max(end, op_end);
      --left;
      Wake(s, op_end);
    }
    if (left != 0) return Status::Internal("pipeline: the greedy schedule stopped early");
    return end;
  }

 private:
  using Entry = std::pair<double, std::int32_t>;

  BuilderStage& At(std::int32_t s) { return stages_[static_cast<std::size_t>(s)]; }
  const BuilderStage& At(std::int32_t s) const { return stages_[static_cast<std::size_t>(s)]; }
  bool Finished(const BuilderStage& st) const {
    return st.forwards == n_ && st.backwards == n_ && (!split_ || st.weights == n_);
  }
  std::int32_t Held(const BuilderStage& st) const {
    return st.forwards - (split_ ? st.weights : st.backwards);
  }
  bool InWarmup(std::int32_t s) const {
    return At(s).forwards < warmup_[static_cast<std::size_t>(s)];
  }

  // The arrival time of the next forward's input when the stage may run it now (memory and
  // order allow), of the next backward's likewise; kUnknown when not known or not allowed.
  double ForwardArrival(std::int32_t s) const {
    const BuilderStage& st = At(s);
    if (st.forwards == n_ || Held(st) >= warmup_[static_cast<std::size_t>(s)]) return kUnknown;
    return arrive_f_[Idx(s, st.forwards, n_)];
  }
  double BackwardArrival(std::int32_t s) const {
    const BuilderStage& st = At(s);
    if (InWarmup(s) || st.backwards == st.forwards) return kUnknown;
    return arrive_b_[Idx(s, st.backwards, n_)];
  }

  // The ready op of highest priority at time t (B > F > W), if any.
  std::optional<PipelineOp> Choose(std::int32_t s, double t) const {
    const BuilderStage& st = At(s);
    if (const double a = BackwardArrival(s); a != kUnknown && a <= t) {
      return PipelineOp{PipelineOpKind::kBackward, st.backwards};
    }
    if (const double a = ForwardArrival(s); a != kUnknown && a <= t) {
      return PipelineOp{PipelineOpKind::kForward, st.forwards};
    }
    if (split_ && !InWarmup(s) && st.weights < st.backwards) {
      return PipelineOp{PipelineOpKind::kWeight, st.weights};
    }
    return std::nullopt;
  }

  // The earliest known arrival the stage may use; kInf when none is known yet.
  double NextArrival(std::int32_t s) const {
    double next = kInf;
    for (const double a : {ForwardArrival(s), BackwardArrival(s)}) {
      if (a != kUnknown) next = std::min(next, a);
    }
    return next;
  }

  // Starts `op` on stage s at t and records the arrivals it produces; returns its end.
  double Start(std::int32_t s, const PipelineOp& op, double t) {
    BuilderStage& st = At(s);
    const double end = t + Duration(model_, s, op.kind);
    st.free_s = end;
    const std::int32_t j = op.microbatch;
    switch (op.kind) {
      case PipelineOpKind::kForward:
        ++st.forwards;
        if (s + 1 < s_count_) {
          arrive_f_[Idx(s + 1, j, n_)] = end + Delay(model_, s);
          Wake(s + 1, end + Delay(model_, s));
        } else {
          arrive_b_[Idx(s, j, n_)] = end;  // the last stage's backward needs only its forward
        }
        break;
      case PipelineOpKind::kBackward:
        ++st.backwards;
        if (s > 0) {
          arrive_b_[Idx(s - 1, j, n_)] = end + Delay(model_, s - 1);
          Wake(s - 1, end + Delay(model_, s - 1));
        }
        break;
      case PipelineOpKind::kWeight:
        ++st.weights;
        break;
    }
    return end;
  }

  // Asks stage s to decide at max(t, when it is free), unless it already will by then.
  void Wake(std::int32_t s, double t) {
    BuilderStage& st = At(s);
    if (Finished(st) || t == kInf) return;
    const double when = std::max(t, st.free_s);
    if (when >= st.decide_s) return;
    st.decide_s = when;
    heap_.push({when, s});
  }

  const PipelineModel& model_;
  const std::span<const std::int32_t> warmup_;
  const std::int32_t n_;
  const std::int32_t s_count_;
  const bool split_;
  std::vector<BuilderStage> stages_;
  std::vector<double> arrive_f_;  // [stage x N]: when F_j's input is at the stage
  std::vector<double> arrive_b_;  // [stage x N]: when B_j's input is at the stage
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap_;
};

// ---- The simulator ----

// Every op exactly once per stage, W exactly when split.
Status CheckStageOps(const PipelineSchedule& schedule, BackwardMode mode) {
  const std::int32_t n = schedule.microbatches;
  const bool split = mode == BackwardMode::kSplit;
  std::vector<std::int32_t> seen(3 * static_cast<std::size_t>(n));
  for (std::size_t s = 0; s < schedule.stages.size(); ++s) {
    const std::string where = "pipeline schedule: stage " + Str(static_cast<std::int64_t>(s));
    std::fill(seen.begin(), seen.end(), 0);
    for (const PipelineOp& op : schedule.stages[s]) {
      if (op.microbatch < 0 || op.microbatch >= n) {
        return Status::InvalidArgument(where + " runs micro-batch " +
                                       Str(std::int64_t{op.microbatch}) + " of " +
                                       Str(std::int64_t{n}));
      }
      if (op.kind == PipelineOpKind::kWeight && !split) {
        return Status::InvalidArgument(where + " runs a W op, but the backward is fused");
      }
      const auto k = static_cast<std::size_t>(op.kind);
      if (k > 2 ||
          ++seen[k * static_cast<std::size_t>(n) + static_cast<std::size_t>(op.microbatch)] > 1) {
        return Status::InvalidArgument(where + " runs " + PipelineOpKindName(op.kind) +
                                       Str(std::int64_t{op.microbatch}) + " twice or has a bad op");
      }
    }
    const std::size_t want = static_cast<std::size_t>(n) * (split ? 3 : 2);
    if (schedule.stages[s].size() != want) {
      return Status::InvalidArgument(where + " runs " +
                                     Str(static_cast<std::int64_t>(schedule.stages[s].size())) +
                                     " ops, needs " + Str(static_cast<std::int64_t>(want)) +
                                     (split ? " (F, B and W" : " (F and B") + " per micro-batch)");
    }
  }
  return Status::Ok();
}

// Runs the per-stage orders (REQUIRES: CheckStageOps passed, model validated and of the same
// stage count). Fills start/end; InvalidArgument naming where the pipeline deadlocks.
class Simulator {
 public:
  Simulator(const PipelineModel& model, const PipelineSchedule& schedule)
      : model_(model),
        schedule_(schedule),
        n_(schedule.microbatches),
        s_count_(static_cast<std::int32_t>(schedule.stages.size())),
        end_f_(schedule.stages.size() * static_cast<std::size_t>(n_), kUnknown),
        end_b_(end_f_.size(), kUnknown),
        next_(schedule.stages.size(), 0),
        free_(schedule.stages.size(), 0.0),
        queued_(schedule.stages.size(), true) {}

  Status Run(PipelineSimulation& sim) {
    sim.start_s.assign(schedule_.stages.size(), {});
    sim.end_s.assign(schedule_.stages.size(), {});
    for (std::int32_t s = s_count_ - 1; s >= 0; --s) work_.push_back(s);
    while (!work_.empty()) {
      const std::int32_t s = work_.back();
      work_.pop_back();
      queued_[static_cast<std::size_t>(s)] = false;
      Advance(s, sim);
    }
    for (std::int32_t s = 0; s < s_count_; ++s) {
      const auto& ops = schedule_.stages[static_cast<std::size_t>(s)];
      const std::size_t k = next_[static_cast<std::size_t>(s)];
      if (k < ops.size()) {
        return Status::InvalidArgument(
            "pipeline schedule deadlocks: stage " + Str(std::int64_t{s}) + " stops at op " +
            Str(static_cast<std::int64_t>(k)) + " (" + PipelineOpKindName(ops[k].kind) +
            Str(std::int64_t{ops[k].microbatch}) + "), waiting for " + Needs(s, ops[k]) +
            ", which never runs");
      }
    }
    return Status::Ok();
  }

 private:
  // When op's input is available on stage s; kUnknown while its producer has not run.
  double Ready(std::int32_t s, const PipelineOp& op) const {
    const std::int32_t j = op.microbatch;
    switch (op.kind) {
      case PipelineOpKind::kForward: {
        if (s == 0) return 0;
        const double e = end_f_[Idx(s - 1, j, n_)];
        return e == kUnknown ? kUnknown : e + Delay(model_, s - 1);
      }
      case PipelineOpKind::kBackward: {
        if (s == s_count_ - 1) return end_f_[Idx(s, j, n_)];
        const double e = end_b_[Idx(s + 1, j, n_)];
        return e == kUnknown ? kUnknown : e + Delay(model_, s);
      }
      case PipelineOpKind::kWeight:
        return end_b_[Idx(s, j, n_)];
    }
    return kUnknown;
  }

  std::string Needs(std::int32_t s, const PipelineOp& op) const {
    const std::string j = Str(std::int64_t{op.microbatch});
    switch (op.kind) {
      case PipelineOpKind::kForward:
        return "F" + j + " of stage " + Str(std::int64_t{s - 1});
      case PipelineOpKind::kBackward:
        return s == s_count_ - 1 ? "its own F" + j
                                 : "B" + j + " of stage " + Str(std::int64_t{s + 1});
      case PipelineOpKind::kWeight:
        return "its own B" + j;
    }
    return "?";
  }

  void Advance(std::int32_t s, PipelineSimulation& sim) {
    const auto us = static_cast<std::size_t>(s);
    const auto& ops = schedule_.stages[us];
    while (next_[us] < ops.size()) {
      const PipelineOp& op = ops[next_[us]];
      const double ready = Ready(s, op);
      if (ready == kUnknown) return;
      const double start = std::max(free_[us], ready);
      const double end = start + Duration(model_, s, op.kind);
      sim.start_s[us].push_back(start);
      sim.end_s[us].push_back(end);
      free_[us] = end;
      ++next_[us];
      if (op.kind == PipelineOpKind::kForward) {
        end_f_[Idx(s, op.microbatch, n_)] = end;
        if (s + 1 < s_count_) Queue(s + 1);
      } else if (op.kind == PipelineOpKind::kBackward) {
        end_b_[Idx(s, op.microbatch, n_)] = end;
        if (s > 0) Queue(s - 1);
      }
    }
  }

  void Queue(std::int32_t s) {
    if (queued_[static_cast<std::size_t>(s)]) return;
    queued_[static_cast<std::size_t>(s)] = true;
    work_.push_back(s);
  }

  const PipelineModel& model_;
  const PipelineSchedule& schedule_;
  const std::int32_t n_;
  const std::int32_t s_count_;
  std::vector<double> end_f_;  // [stage x N]
  std::vector<double> end_b_;  // [stage x N]
  std::vector<std::size_t> next_;
  std::vector<double> free_;
  std::vector<bool> queued_;
  std::vector<std::int32_t> work_;
};

// Busy time, bubbles and peak activations from a completed timeline.
void Report(const PipelineModel& model, const PipelineSchedule& schedule, PipelineSimulation& sim) {
  const PipelineOpKind frees =
      model.backward == BackwardMode::kSplit ? PipelineOpKind::kWeight : PipelineOpKind::kBackward;
  sim.iteration_s = 0;
  for (const auto& ends : sim.end_s) {
    for (const double e : ends) sim.iteration_s = std::max(sim.iteration_s, e);
  }
  sim.stages.assign(schedule.stages.size(), {});
  for (std::size_t s = 0; s < schedule.stages.size(); ++s) {
    StageReport& r = sim.stages[s];
    std::int32_t held = 0;
    for (std::size_t k = 0; k < schedule.stages[s].size(); ++k) {
      const PipelineOpKind kind = schedule.stages[s][k].kind;
      r.busy_s += sim.end_s[s][k] - sim.start_s[s][k];
      if (kind == PipelineOpKind::kForward)
        r.peak_activations = std::max(r.peak_activations, ++held);
      if (kind == frees) --held;
    }
    r.bubble_s = sim.iteration_s - r.busy_s;
  }
}

}  // namespace

const char* PipelineOpKindName(PipelineOpKind kind) {
  switch (kind) {
    case PipelineOpKind::kForward:
      return "F";
    case PipelineOpKind::kBackward:
      return "B";
    case PipelineOpKind::kWeight:
      return "W";
  }
  return "?";
}

Status ValidatePipelineModel(const PipelineModel& model) {
  const auto stages = static_cast<std::int64_t>(model.stages.size());
  if (stages < 1 || stages > kMaxPipelineStages) {
    return Status::InvalidArgument("pipeline: " + Str(stages) + " stages, need 1.." +
                                   Str(std::int64_t{kMaxPipelineStages}));
  }
  if (static_cast<std::int64_t>(model.link_delay_s.size()) != stages - 1) {
    return Status::InvalidArgument(
        "pipeline: " + Str(static_cast<std::int64_t>(model.link_delay_s.size())) +
        " link delays for " + Str(stages) + " stages, need " + Str(stages - 1));
  }
  for (std::size_t s = 0; s < model.stages.size(); ++s) {
    const StageTimes& t = model.stages[s];
    if (!NonNegativeFinite(t.forward_s) || !NonNegativeFinite(t.backward_s) ||
        !NonNegativeFinite(t.weight_s) || t.forward_s == 0 || t.backward_s == 0 ||
        !std::isfinite(t.forward_s + t.backward_s + t.weight_s)) {
      return Status::InvalidArgument("pipeline: stage " + Str(static_cast<std::int64_t>(s)) +
                                     " times F " + Str(t.forward_s) + " s, B " + Str(t.backward_s) +
                                     " s, W " + Str(t.weight_s) +
                                     " s; F and B must be finite and > 0, W finite and >= 0");
    }
  }
  for (std::size_t i = 0; i < model.link_delay_s.size(); ++i) {
    if (!NonNegativeFinite(model.link_delay_s[i])) {
      return Status::InvalidArgument("pipeline: delay of link " +
                                     Str(static_cast<std::int64_t>(i)) + " is " +
                                     Str(model.link_delay_s[i]) + " s; must be finite, >= 0");
    }
  }
  return Status::Ok();
}

Result<std::vector<std::int32_t>> StandardWarmup(std::int32_t stages, std::int32_t microbatches) {
  if (Status s = CheckCounts(stages, microbatches); !s.ok()) return s;
  std::vector<std::int32_t> warmup(static_cast<std::size_t>(stages));
  for (std::int32_t s = 0; s < stages; ++s) {
    warmup[static_cast<std::size_t>(s)] = std::min(stages - s, microbatches);
  }
  return warmup;
}

Status ValidateWarmup(std::int32_t stages, std::int32_t microbatches,
                      std::span<const std::int32_t> warmup) {
  if (Status s = CheckCounts(stages, microbatches); !s.ok()) return s;
  if (static_cast<std::int64_t>(warmup.size()) != stages) {
    return Status::InvalidArgument("pipeline: " + Str(static_cast<std::int64_t>(warmup.size())) +
                                   " warm-up counts for " + Str(std::int64_t{stages}) + " stages");
  }
  for (std::size_t s = 0; s < warmup.size(); ++s) {
    if (warmup[s] < 1 || warmup[s] > microbatches) {
      return Status::InvalidArgument("pipeline: warm-up count " + Str(std::int64_t{warmup[s]}) +
                                     " of stage " + Str(static_cast<std::int64_t>(s)) +
                                     " is outside 1.." + Str(std::int64_t{microbatches}));
    }
    if (s > 0 && warmup[s] > warmup[s - 1]) {
      return Status::InvalidArgument(
          "pipeline: warm-up counts increase from stage " + Str(static_cast<std::int64_t>(s - 1)) +
          " (" + Str(std::int64_t{warmup[s - 1]}) + ") to stage " +
          Str(static_cast<std::int64_t>(s)) + " (" + Str(std::int64_t{warmup[s]}) +
          "); the pipeline would deadlock");
    }
  }
  return Status::Ok();
}

Result<PipelineSchedule> BuildPipelineSchedule(const PipelineModel& model,
                                               std::span<const std::int32_t> warmup,
                                               std::int32_t microbatches) {
  if (Status s = ValidatePipelineModel(model); !s.ok()) return s;
  const auto stages = static_cast<std::int32_t>(model.stages.size());
  if (Status s = ValidateWarmup(stages, microbatches, warmup); !s.ok()) return s;
  PipelineSchedule schedule;
  schedule.microbatches = microbatches;
  schedule.stages.resize(model.stages.size());
  const std::size_t per_stage =
      static_cast<std::size_t>(microbatches) * (model.backward == BackwardMode::kSplit ? 3 : 2);
  for (auto& ops : schedule.stages) ops.reserve(per_stage);
  Builder builder(model, warmup, microbatches);
  if (Result<double> r = builder.Run(&schedule); !r.ok()) return r.status();
  return schedule;
}

Result<double> WarmupIterationTime(const PipelineModel& model, std::span<const std::int32_t> warmup,
                                   std::int32_t microbatches) {
  if (Status s = ValidatePipelineModel(model); !s.ok()) return s;
  const auto stages = static_cast<std::int32_t>(model.stages.size());
  if (Status s = ValidateWarmup(stages, microbatches, warmup); !s.ok()) return s;
  Builder builder(model, warmup, microbatches);
  return builder.Run(nullptr);
}

Status ValidatePipelineSchedule(const PipelineSchedule& schedule, BackwardMode mode) {
  const auto stages = static_cast<std::int64_t>(schedule.stages.size());
  if (stages > kMaxPipelineStages) {
    return Status::InvalidArgument("pipeline schedule: " + Str(stages) + " stages, at most " +
                                   Str(std::int64_t{kMaxPipelineStages}));
  }
  if (Status s = CheckCounts(static_cast<std::int32_t>(stages), schedule.microbatches); !s.ok()) {
    return s;
  }
  if (Status s = CheckStageOps(schedule, mode); !s.ok()) return s;
  // Liveness does not depend on times: run the orders with unit times.
  PipelineModel unit;
  unit.backward = mode;
  unit.stages.assign(schedule.stages.size(), StageTimes{1, 1, 1});
  unit.link_delay_s.assign(schedule.stages.size() - 1, 0.0);
  PipelineSimulation sim;
  return Simulator(unit, schedule).Run(sim);
}

Result<PipelineSimulation> SimulatePipeline(const PipelineModel& model,
                                            const PipelineSchedule& schedule) {
  if (Status s = ValidatePipelineModel(model); !s.ok()) return s;
  if (schedule.stages.size() != model.stages.size()) {
    return Status::InvalidArgument(
        "pipeline: the schedule has " + Str(static_cast<std::int64_t>(schedule.stages.size())) +
        " stages, the model " + Str(static_cast<std::int64_t>(model.stages.size())));
  }
  if (Status s = CheckCounts(static_cast<std::int32_t>(model.stages.size()), schedule.microbatches);
      !s.ok()) {
    return s;
  }
  if (Status s = CheckStageOps(schedule, model.backward); !s.ok()) return s;
  PipelineSimulation sim;
  if (Status s = Simulator(model, schedule).Run(sim); !s.ok()) return s;
  Report(model, schedule, sim);
  return sim;
}

}  // namespace falcon::analyzer
