// S4 checkpoint-and-restart without the faulty nodes (FALCON §5): which nodes to leave out,
// which spare nodes take their place, and the shape of the restarted job.
//  1. Every faulty node of the job is excluded.
//  2. Spare nodes (healthy, idle, in the order given) replace faulty nodes one for one: with
//     enough spares the job restarts with its shape unchanged.
//  3. Otherwise the DP degree shrinks: TP and PP stay (the model's partitioning and the
//     checkpoint's layout depend on them), dp' = min(dp, floor(healthy GPUs / (tp x pp))).
//     dp' = 0 (a model replica no longer fits) is "not possible"; so is dp' below
//     min_data_parallel or, when total_microbatches is given, a dp' that leaves a DP group
//     without a micro-batch. Healthy nodes the smaller job does not need stay idle.
// The restarted job's nodes are listed in launch order (surviving nodes in their old order, each
// spare in the place of the node it replaces), so a launcher that fills nodes with consecutive
// ranks gives the usual Megatron placement.
// Thread-safety: stateless functions on values; safe from any thread.
// Must never: do I/O, read clocks or globals, or list a faulty node in the restarted job.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "falcon/status.h"

namespace falcon::analyzer {

struct RestartRequest {
  std::int32_t tp = 1;
  std::int32_t dp = 1;
  std::int32_t pp = 1;
  std::int32_t gpus_per_node = 8;
  std::vector<std::int32_t> job_nodes;     // the job's nodes in launch order, distinct, >= 0
  std::vector<std::int32_t> faulty_nodes;  // each must be one of job_nodes
  std::vector<std::int32_t> spare_nodes;   // healthy idle nodes, none in job_nodes; may be empty
  std::int32_t min_data_parallel = 1;      // refuse to shrink DP below this
  std::int64_t total_microbatches = 0;     // micro-batches per iteration; 0: not checked
};

enum class RestartKind : std::uint8_t {
  kKeepShape,           // same shape: spares in place of faulty nodes, where needed
  kShrinkDataParallel,  // fewer DP groups on the healthy nodes (and any spares)
  kNotPossible,         // see reason
};

struct NodeReplacement {
  std::int32_t faulty = -1;
  std::int32_t spare = -1;
  friend bool operator==(const NodeReplacement&, const NodeReplacement&) = default;
};

struct RestartPlan {
  RestartKind kind = RestartKind::kNotPossible;
  std::vector<std::int32_t> excluded_nodes;   // the faulty nodes, sorted
  std::vector<NodeReplacement> replacements;  // spares used, in faulty-node order
  std::vector<std::int32_t> nodes;            // the restarted job's nodes, launch order
  std::vector<std::int32_t> idle_nodes;       // healthy nodes (old or spare) left unused
  std::int32_t tp = 0, dp = 0, pp = 0;        // the new shape (0 when not possible)
  std::int64_t world_size = 0;                // tp x dp x pp
  std::string reason;                         // why, in one line, for every kind
};

// InvalidArgument, naming the fault, for a shape or gpus_per_node < 1, a job whose
// tp x dp x pp GPUs do not fit its nodes, a repeated or negative node id, a faulty node not in
// the job, a spare that is in the job, min_data_parallel < 1 or total_microbatches < 0. A
// restart that cannot be done is not an error: kind kNotPossible with the reason.
[[nodiscard]] Result<RestartPlan> PlanRestart(const RestartRequest& request);

}  // namespace falcon::analyzer
