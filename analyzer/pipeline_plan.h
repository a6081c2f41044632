// Pipeline adaptation to slow pipeline links (Adaptra): the delay model, initial planning of
// warm-up counts under an activation-memory limit, and adaptation to measured times and delays.
// Schedules, the simulator and the meaning of warm-up counts are in pipeline_schedule.h.
//
// The delay model. Take the steady state of a schedule built from warm-up counts x (every stage
// holds x_s activations and, per micro-batch, runs B_j, W_j, F_{j+x_s} in turn) and let T be the
// period: one micro-batch per T on every stage. Write P_s = F_s + B_s + W_s (the stage's work per
// micro-batch), G_s = F_s + B_s with B_s the input-gradient op (F_s + B_s + W_s when fused), and
// V_s = W_s when split, 0 when fused. Following one micro-batch from stage i forward to stage k
// and its gradient back to i, then on to the forward stage i runs next, closes a cycle of
// dependencies that spans x_i - x_k + 1 periods, so the steady state needs, for every i <= k,
//     2 (c_i + ... + c_{k-1}) + G_i + ... + G_k + V_i  <=  (x_i - x_k + 1) T        (chain i..k)
// (i = k is P_i <= T). The least such T is SteadyPeriod; with no delays and 1F1B counts it is
// max_s P_s, the slowest stage's pace. A link delay that keeps it there costs only its one-time
// fill and drain (about 2 c per link crossed); one that breaks a chain condition stretches every
// period and the iteration grows by about N x the stretch: the cascading bubbles.
// Uniform stages (Adaptra Theorem 1). With equal F, B, W on every stage and T = P, the chain
// over one link i gives, with slackness D_i = x_i - x_{i+1}:
//     fused:  c_i <= (D_i - 1) t,   t = (F + B + W) / 2 (Adaptra's t when F = B = t);
//     split:  c_i <= ((D_i - 1)(F + B) + D_i W) / 2   (B sends its gradient before W runs);
// longer chains are then implied. Standard 1F1B (D = 1) tolerates no delay when fused.
// Assumptions: a stage's times and a link's delay are the same for every micro-batch and both
// directions; a delay is latency (it occupies no stage, and transfers overlap); N is large
// enough to reach the steady state; the schedule is built (BuildPipelineSchedule) for the delays
// it runs with. An order built without a delay for counts whose slackness exceeds the round trip
// runs the backwards that pile up during the warm-up back to back (B > F) and then holds fewer
// micro-batches in flight than x: it tolerates less when a link slows later. The simulator
// checks the model, exactly, on finite N.
//
// Thread-safety: stateless functions on values; safe from any thread.
// Must never: do I/O, read clocks or globals, or return warm-up counts above a stage's
// activation limit, above N, or increasing along the pipeline.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "analyzer/pipeline_schedule.h"
#include "falcon/status.h"

namespace falcon::analyzer {

// Theorem 1: the largest delay a link between two equal stages with slackness D tolerates
// without cascading bubbles (formulas above); negative when the pair cascades even without a
// delay (D = 0). InvalidArgument for D < 0 or invalid times (ValidatePipelineModel's rules).
[[nodiscard]] Result<double> UniformDelayTolerance(std::int32_t slackness, const StageTimes& times,
                                                   BackwardMode mode);

// The least steady period T (seconds per micro-batch) the chain conditions allow for warm-up
// counts x under the model's times and delays: max over i <= k of the chain's left side over
// (x_i - x_k + 1). Errors: ValidatePipelineModel's, and ValidateWarmup's with N = max x.
[[nodiscard]] Result<double> SteadyPeriod(const PipelineModel& model,
                                          std::span<const std::int32_t> warmup);

// Per link i, the largest delay c_i (the other links at the model's delays) for which the steady
// period stays max_s P_s: the general, non-uniform tolerance. 0 when the other links already
// break a chain through link i. Same errors as SteadyPeriod; S = 1 gives an empty vector.
[[nodiscard]] Result<std::vector<double>> LinkDelayTolerance(const PipelineModel& model,
                                                             std::span<const std::int32_t> warmup);

// Initial planning (Algorithm 1), before any delay is known: warm-up counts within
// activation_limit[s] (activations stage s may hold, in micro-batches) and N that maximise the
// minimum slackness min_i (x_i - x_{i+1}), then the next smallest and so on (leximin); the last
// stage runs x = 1. InvalidArgument for S or N out of range or a limit < 1 (no schedule runs
// with less than one activation held per stage).
[[nodiscard]] Result<std::vector<std::int32_t>> PlanInitialWarmup(
    std::span<const std::int32_t> activation_limit, std::int32_t microbatches);

struct PipelineAdaptRequest {
  PipelineModel model;                         // measured per-stage times and link delays
  std::int32_t microbatches = 0;               // N
  std::vector<std::int32_t> activation_limit;  // per stage, >= 1 (micro-batches' activations)
  // The counts in force, the baseline; empty: standard 1F1B (StandardWarmup).
  std::vector<std::int32_t> current_warmup;
  // When (warm-up vectors the limits admit) x S x N is at most this, every vector is simulated
  // and the plan is optimal: a bound on the work, at most about 40 ms at the default (S <= 5 with
  // N <= 12 always fits). 0: always search.
  std::int64_t exhaustive_budget = std::int64_t{1} << 19;
  // Schedules the local search may simulate after its five starts.
  std::int32_t max_evaluations = 128;
};

struct PipelinePlan {
  std::vector<std::int32_t> warmup;           // the plan; peak activations of its schedule
  std::vector<std::int32_t> baseline_warmup;  // the counts it replaces
  double iteration_s = 0;                     // the plan's schedule simulated under the model
  double baseline_iteration_s = 0;            // the baseline's schedule simulated under the model
  double steady_period_s = 0;                 // SteadyPeriod of the plan
  double stage_period_s = 0;                  // max_s P_s: no plan runs a micro-batch faster
  std::int32_t min_slackness = 0;             // min_i (x_i - x_{i+1}); 0 for one stage
  std::int32_t evaluations = 0;               // schedules simulated to find the plan
  bool exhaustive = false;  // every vector within the limits was simulated: the plan is optimal
};

// Dynamic adaptation (Algorithm 2): warm-up counts for the measured times and delays that
// minimise the simulated iteration time within the activation limits. When the vectors the
// limits admit (non-increasing, each in [1, min(limit, N)]) times S x N fit exhaustive_budget,
// it simulates them all: optimal, ties to the lexicographically smallest. Otherwise it starts from
// the least counts that meet every chain condition at the smallest period the limits allow (the
// model above), the baseline, 1F1B, the initial plan (the most slackness the limits allow) and the
// most counts the limits allow, each clamped to the limits, and improves the fastest by a local
// search on the simulated iteration time (each count, and each slackness, down or up by 1, 2,
// 4, ...; downward moves first) within max_evaluations; a local optimum, not always the global
// one. Either way iteration_s <= the clamped baseline's time and the plan respects the limits.
// Errors: ValidatePipelineModel's, ValidateWarmup's for a non-empty current_warmup,
// InvalidArgument for S or N out of range, a limit count other than S, a limit < 1, or a
// negative max_evaluations or exhaustive_budget.
[[nodiscard]] Result<PipelinePlan> AdaptPipeline(const PipelineAdaptRequest& request);

}  // namespace falcon::analyzer
