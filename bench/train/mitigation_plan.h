// Mitigation plans (FALCON §5) as the trainer sees them: the plan schema (the protocol's plan
// fields, include/falcon/protocol.h FALCON_PROTOCOL_PLAN_FIELDS), the plan file's JSON, and what
// applying a plan to this job means (its effect), or why it cannot be applied.
//
// Plan file (--plan-file), replaced atomically (temp file + rename):
//
//   {"version": 7, "strategy": "S2"|"S1"|"S3"|"S4"|"pipeline", "micro_batches": [m per DP replica],
//    "placement": [node of every global rank], "exclude_nodes": [node, ...], "restart": true,
//    "warmup": [warm-up forwards of every pipeline stage]}
//
// `version` (alias "plan_version") is an integer in [1, 2^31). A file with only version and
// micro_batches is an S2 plan (the format before strategies). Other keys are ignored.
//
// Strategies and their effect (PlanEffect), for a job of `dp` replicas and `world` ranks on
// `total_nodes` = job nodes + spare nodes, each node holding at most `gpus_per_node` ranks:
//   S1  undo: back to the job's own micro-batch counts (a plan's micro_batches are ignored) and
//       the standard 1F1B warm-up counts; the placement stays.
//   S2  micro_batches: exactly dp counts in [1, 4096], in force from the next iteration.
//   S3  placement: exactly world node indices in [0, total_nodes), at most gpus_per_node ranks
//       per node, none on an exclude_nodes entry; micro_batches, when given (dp entries), apply
//       too. Ranks whose node changes move their state (parameters + optimizer) there.
//   S4  checkpoint-restart without exclude_nodes: restart from the last in-memory checkpoint;
//       the placement is the plan's (checked as for S3, and none on an excluded node) or, without
//       one, the ranks of each excluded node move, seat for seat, to the lowest spare node (one
//       hosting no rank now and not excluded). Micro-batches: the plan's, else the job's own.
//       `restart` must not be false; on S1..S3 it must not be true. The restarted job runs the
//       standard 1F1B warm-up counts.
//   pipeline  warmup: exactly pp counts in [0, 65535], non-increasing along the pipeline (stage
//       s runs warmup[s] forwards before its first backward: Megatron's num_warmup_microbatches;
//       standard 1F1B is pp - s - 1), each stage holding warmup[s] + 1 micro-batches'
//       activations at most `activation_limit`; only where the job can run them (no
//       `no_pipeline_plans` reason). micro_batches, when given (dp entries), apply too. In force from the
//       next iteration, with no pause. S2 and S3 keep the warm-up counts in force.
// A plan that breaks a rule is rejected as a whole with a reason; training goes on.
//
// Thread-safety: values and pure functions. Must never: throw (JSON errors become values),
// perform I/O.
#ifndef FALCON_BENCH_TRAIN_MITIGATION_PLAN_H_
#define FALCON_BENCH_TRAIN_MITIGATION_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "falcon/status.h"

namespace falcon::train {

enum class Strategy : std::int32_t { kIgnore = 1, kRebalance = 2, kTopology = 3, kRestart = 4, kPipeline = 5 };

inline constexpr int kMaxPlanMicroBatches = 4096;
inline constexpr int kMaxPlanWarmup = 65535;  // the protocol's bound on a warm-up count
inline constexpr int kMaxPlanStages = 1024;   // warm-up counts a plan may carry (FALCON_PLAN_MAX_STAGES)
inline constexpr int kMaxPlanNodes = 65536;  // node indices are < this (the protocol's bound)

// "S1".."S4", "pipeline".
[[nodiscard]] const char* StrategyName(Strategy s);
[[nodiscard]] std::optional<Strategy> StrategyFromName(std::string_view name);
// 1..5 (FalconStrategy of falcon.h) -> Strategy.
[[nodiscard]] std::optional<Strategy> StrategyFromCode(std::int64_t code);

// A plan as a source offers it. Empty vectors are absent parts.
struct MitigationPlan {
  std::int32_t version = 0;
  Strategy strategy = Strategy::kRebalance;  // meaningless in an offer rejected for its strategy
  std::vector<int> micro_batches;
  std::vector<int> placement;
  std::vector<int> exclude_nodes;
  std::vector<int> warmup;      // pipeline: warm-up forwards per stage
  std::optional<bool> restart;  // absent: not given
};

// What a source offered: a version, and the plan or why it is malformed (then `rejection` says
// why and `plan` holds what could be read). Only the version decides whether it is new.
struct PlanOffer {
  MitigationPlan plan;
  std::string rejection;
  bool strategy_known = true;  // false: rejected because the strategy is not S1..S4 or pipeline
  std::string source;  // "file" or "falcon"
};

// Parses plan JSON. InvalidArgument when there is no usable version (not JSON, not an object, no
// integer version in range): such a text is not a plan at all. Any other defect yields an offer
// with `rejection` set.
[[nodiscard]] Result<PlanOffer> ParsePlanJson(std::string_view json);

// The job the plan must fit. Fixed after start-up.
struct JobFacts {
  int world = 1;
  int dp = 1;
  std::vector<int> initial_micro_batches;  // dp entries: --micro-batches
  int total_nodes = 1;                     // job nodes + --spare-nodes
  int gpus_per_node = 1;                   // the most ranks a node may hold
  bool can_replace = false;                // the emulator can re-place ranks (job state present)
  int pp = 1;                              // pipeline stages
  std::string no_pipeline_plans;           // why this job cannot run pipeline plans; empty: it can
  int activation_limit = 1;                // micro-batches' activations a stage may hold (>= pp)
};

// What the job runs under now (every rank holds the same).
struct PlanState {
  std::vector<int> micro_batches;  // dp entries
  std::vector<int> placement;      // world entries: node of every rank
  std::vector<int> warmup;         // pp entries, or empty: standard 1F1B
};

// The result of applying a valid plan.
struct PlanEffect {
  std::vector<int> micro_batches;  // dp entries, in force from the next iteration
  std::vector<int> placement;      // world entries: node of every rank from the next iteration
  bool restart = false;            // S4: restart and roll back to the last checkpoint
  std::vector<int> warmup;         // pp entries, or empty: standard 1F1B (from the next iteration)
};

// Applies `plan` to `now`, or says why it cannot be applied to this job (InvalidArgument).
// REQUIRES: now matches facts (dp and world entries).
[[nodiscard]] Result<PlanEffect> ResolvePlan(const MitigationPlan& plan, const JobFacts& facts, const PlanState& now);

// Ranks whose node differs between two placements of equal size.
[[nodiscard]] std::vector<int> MovedRanks(const std::vector<int>& from, const std::vector<int>& to);

}  // namespace falcon::train

#endif  // FALCON_BENCH_TRAIN_MITIGATION_PLAN_H_
