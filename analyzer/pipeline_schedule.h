// Pipeline-parallel schedules and their exact simulation (the model behind Adaptra-style
// warm-up adaptation; the planner is pipeline_plan.h).
//
// The model. S stages run N micro-batches per iteration. Stage s runs, per micro-batch j, a
// forward F_j (forward_s seconds), a backward B_j and, when the backward is split (ZeroBubble
// style), a weight-gradient op W_j. With BackwardMode::kFused there is no W op: B_j runs the whole
// backward, backward_s + weight_s seconds (plain 1F1B). Link i joins stage i and i + 1; every
// transfer over it, either way, arrives link_delay_s[i] seconds after the op that sent it ends.
// Dependencies:
//   F_j on stage s > 0  needs F_j on s - 1 ended, plus link delay s - 1;
//   B_j on stage s < S-1 needs B_j on s + 1 ended, plus link delay s;
//   B_j on the last stage needs its own F_j ended;
//   W_j needs B_j on the same stage ended.
// A stage runs one op at a time, in the order its schedule lists, each as early as its
// dependency and the previous op allow (the simulator is exact for that order, no slack added).
//
// Activation memory. Micro-batch j holds an activation on stage s from the start of F_j until
// the end of the op that frees it: B_j when fused, W_j when split (W still reads the saved
// inputs). The peak count per stage is a property of the order alone.
//
// Warm-up counts. x_s is the number of forwards stage s runs before its first backward; standard
// 1F1B has x_s = min(S - s, N) (stages numbered from 0). BuildPipelineSchedule turns counts into
// a schedule (Adaptra's Algorithms 3-4): x_s forwards F_0..F_{x_s-1}, then, whenever the stage
// is free, the ready op of highest priority B > F > W, where F is ready only while fewer than
// x_s activations are held, so the peak activation count of stage s is exactly x_s (N >= x_s).
// Counts must not increase along the pipeline (x_s >= x_{s+1}): a stage that wants more
// forwards before its first backward than its upstream can send without one would deadlock.
// Which op is ready when depends on times, so the order is the greedy list schedule under the
// model's times; simulated under other times (a link slows) it keeps its order, as a framework
// running a static schedule would.
//
// Thread-safety: stateless functions on values; safe from any thread.
// Must never: do I/O, read clocks or globals, or return a schedule that deadlocks or runs an op
// twice.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "falcon/status.h"

namespace falcon::analyzer {

// Limits: deeper than any pipeline, more micro-batches than any iteration runs; S x N x 3 ops
// stay small enough to simulate in well under a second.
inline constexpr std::int32_t kMaxPipelineStages = 1024;
inline constexpr std::int32_t kMaxPipelineMicrobatches = 1 << 16;
inline constexpr std::int64_t kMaxPipelineOps = std::int64_t{1} << 24;

enum class BackwardMode : std::uint8_t {
  kFused,  // B includes the weight gradients: 1F1B
  kSplit,  // B (input gradients) then a separate W (weight gradients): ZeroBubble-style F/B/W
};

// Seconds per micro-batch on one stage. forward_s, backward_s > 0, weight_s >= 0, all finite.
struct StageTimes {
  double forward_s = 0;
  double backward_s = 0;  // input gradients (the whole backward when weight_s is 0)
  double weight_s = 0;    // weight gradients; part of B when fused
};

struct PipelineModel {
  std::vector<StageTimes> stages;    // S entries, 1 <= S <= kMaxPipelineStages
  std::vector<double> link_delay_s;  // S - 1 entries, finite, >= 0: link i joins stage i, i + 1
  BackwardMode backward = BackwardMode::kFused;
};

enum class PipelineOpKind : std::uint8_t { kForward, kBackward, kWeight };
// "F", "B", "W".
[[nodiscard]] const char* PipelineOpKindName(PipelineOpKind kind);

struct PipelineOp {
  PipelineOpKind kind = PipelineOpKind::kForward;
  std::int32_t microbatch = 0;
  friend bool operator==(const PipelineOp&, const PipelineOp&) = default;
};

// Per stage, the ops in the order the stage runs them.
struct PipelineSchedule {
  std::int32_t microbatches = 0;  // N
  std::vector<std::vector<PipelineOp>> stages;
};

struct StageReport {
  double busy_s = 0;    // sum of the stage's op times
  double bubble_s = 0;  // iteration_s - busy_s: idle time within the iteration
  std::int32_t peak_activations = 0;
};

struct PipelineSimulation {
  double iteration_s = 0;  // end of the last op; the first op starts at 0
  std::vector<StageReport> stages;
  // start_s[s][k], end_s[s][k]: times of the k-th op of stage s in the schedule.
  std::vector<std::vector<double>> start_s;
  std::vector<std::vector<double>> end_s;
};

// InvalidArgument, naming the fault, unless 1 <= S <= kMaxPipelineStages, there are S - 1 link
// delays, every time is finite with forward_s, backward_s > 0 and weight_s, delays >= 0.
[[nodiscard]] Status ValidatePipelineModel(const PipelineModel& model);

// Standard 1F1B: x_s = min(S - s, N). InvalidArgument for S or N out of range.
[[nodiscard]] Result<std::vector<std::int32_t>> StandardWarmup(std::int32_t stages,
                                                               std::int32_t microbatches);

// InvalidArgument, naming the fault, unless warmup has S entries (S = `stages`), each in
// [1, N], not increasing along the pipeline, and 1 <= N <= kMaxPipelineMicrobatches with
// S x N x 3 <= kMaxPipelineOps.
[[nodiscard]] Status ValidateWarmup(std::int32_t stages, std::int32_t microbatches,
                                    std::span<const std::int32_t> warmup);

// The schedule for warm-up counts `warmup` (Algorithms 3-4, above) under the model's times.
// The same errors as ValidatePipelineModel and ValidateWarmup.
[[nodiscard]] Result<PipelineSchedule> BuildPipelineSchedule(const PipelineModel& model,
                                                             std::span<const std::int32_t> warmup,
                                                             std::int32_t microbatches);

// The iteration time BuildPipelineSchedule's schedule takes under the model's own times (what
// SimulatePipeline would report for it), without materialising the schedule: the planner's
// objective. The same errors as BuildPipelineSchedule.
[[nodiscard]] Result<double> WarmupIterationTime(const PipelineModel& model,
                                                 std::span<const std::int32_t> warmup,
                                                 std::int32_t microbatches);

// Structural and liveness check, independent of times: S >= 1 stages within the limits, every
// stage runs F_j and B_j (and W_j exactly when `mode` is kSplit) exactly once for every j < N
// and nothing else, and the per-stage orders can run to the end without deadlock.
// InvalidArgument naming the first fault (the stage, the op, or where the pipeline stops).
[[nodiscard]] Status ValidatePipelineSchedule(const PipelineSchedule& schedule, BackwardMode mode);

// Runs `schedule` under the model's times and delays (any order: 1F1B, custom warm-ups, F/B/W).
// The errors of ValidatePipelineModel and ValidatePipelineSchedule (with the model's mode), and
// InvalidArgument when the schedule's stage count is not the model's.
[[nodiscard]] Result<PipelineSimulation> SimulatePipeline(const PipelineModel& model,
                                                          const PipelineSchedule& schedule);

}  // namespace falcon::analyzer
