// Ground truth of one rank for scoring Falcon: what this rank did (its iteration times, micro-batch
// counts and nodes), every mitigation plan it applied or rejected with its cost, every restart
// with the work it lost, and which faults of the plan could have slowed it. Written once at the
// end of the run (also after a failure, with "status" saying why) as JSON:
//
//   {"schema": "falcon.train.report", "schema_version": 2, "status": "ok" | "check failed: ..." | ...,
//    "rank": 3, "world_size": 8, "pid": 1234, "node": 4, "launch_node": 1,
//    "shape": {"tp": 2, "dp": 2, "pp": 2}, "coords": {"tp": 1, "dp": 1, "pp": 0},
//    "config": {"micro_batches": 4, ..., "plan_file": "", "plan_source": "file"|"falcon"|"none",
//               "checkpoint_every": 10, "restart_s": 5, "spare_nodes": 1, "state_bytes": 3145728},
//    "iterations": [{"iter": 0, "start_s": 0.41, "duration_s": 0.071, "micro_batches": 4,
//                    "plan_version": 0, "compute_factor": 1, "node": 1, "redo": false}, ...],
//    "plan_changes": [{"iter": 1, "version": 1, "micro_batches": [2, 6]}],
//    "plans": [{"version": 2, "strategy": "S3", "source": "file", "status": "applied", "reason": "",
//               "iter": 5, "at_s": 0.52, "cost_s": 0.004, "modelled_s": 0.0013,
//               "micro_batches": [4, 4], "placement": [0, 3, 2, 1, ...], "exclude_nodes": [],
//               "restart": false, "moved_ranks": [2, 3, 6, 7], "moved_bytes": 12582912}],
//    "restarts": [{"version": 3, "at_s": 1.1, "next_iter": 8, "rollback_to": 5,
//                  "lost_iterations": 3, "lost_s": 0.21, "restart_s": 5, "cost_s": 5.03,
//                  "exclude_nodes": [1]}],
//    "checkpoints": {"every": 10, "taken": 2, "last_iter": 10},
//    "faults": [{"index": 0, "kind": "compute", "scope": "rank", "ranks": [3], "nodes": [],
//                "start_s": 0, "duration_s": 0, "factor": 3}],
//    "summary": {"iterations": 10, "median_s": ..., "mean_s": ..., "min_s": ..., "max_s": ...,
//                "p95_s": ..., "total_s": ..., "plans_applied": 1, "plans_rejected": 0,
//                "restarts": 1, "lost_iterations": 3, "mitigation_cost_s": 5.03}}
//
// Times are seconds since the job epoch (falconEmuJobSeconds). compute_factor is the largest
// compute slowdown applied in that iteration; node is where the rank ran it; redo marks an
// iteration run again after a restart rolled back past it (every run of an iteration is listed).
// A plan's "iter" is the first iteration run under it (for a rejected plan: the iteration after
// the boundary that rejected it); "at_s" when the boundary decided; "cost_s" the measured time
// from that decision until training resumed, "modelled_s" its modelled part (an S3 state move,
// an S4 restart). A restart's "next_iter" is the iteration that would have run next,
// "rollback_to" the checkpoint's next iteration, "lost_s" the run time of the lost iterations.
// Only rank 0 knows why a plan was rejected; the others say "rejected by rank 0".
//
// Thread-safety: pure functions, except WriteReport (file system). Must never: throw (the JSON
// library is used only with values it accepts), or write a partial file (temp file + rename).
#ifndef FALCON_BENCH_TRAIN_REPORT_H_
#define FALCON_BENCH_TRAIN_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "falcon/status.h"
#include "fault_plan.h"
#include "layout.h"
#include "options.h"

namespace falcon::train {

inline constexpr int kReportSchemaVersion = 2;

struct IterationRecord {
  int iter = 0;
  double start_s = 0;
  double duration_s = 0;
  int micro_batches = 0;        // this rank's replica
  std::int32_t plan_version = 0;
  double compute_factor = 1;
  int node = 0;
  bool redo = false;
  int warmup = 0;               // warm-up forwards of this rank's stage in force (before the M clamp)
};

struct PlanChange {
  int iter = 0;  // first iteration under the plan
  std::int32_t version = 0;
  std::vector<int> micro_batches;
};

// One plan this rank applied or rejected.
struct PlanRecord {
  std::int32_t version = 0;
  std::string strategy;  // "S1".."S4"
  std::string source;    // "file" or "falcon"
  std::string status;    // "applied" or "rejected"
  std::string reason;    // why rejected
  int iter = 0;
  double at_s = 0;
  double cost_s = 0;
  double modelled_s = 0;
  std::vector<int> micro_batches, placement, exclude_nodes, moved_ranks;
  std::vector<int> warmup;      // warm-up counts in force after it (empty: standard 1F1B)
  bool warmup_changed = false;  // it changed the warm-up counts
  bool restart = false;
  std::uint64_t moved_bytes = 0;
};

struct RestartRecord {
  std::int32_t version = 0;
  double at_s = 0;
  int next_iter = 0;
  int rollback_to = 0;
  int lost_iterations = 0;
  double lost_s = 0;
  double restart_s = 0;
  double cost_s = 0;
  std::vector<int> exclude_nodes;
};

struct CheckpointStats {
  int every = 0;
  int taken = 0;
  int last_iter = 0;  // the next iteration of the last checkpoint
};

// A fault of the plan that touches this rank: "rank" scope for compute/hang naming the rank (for
// compute: the GPU it was launched on), "node" scope for link/nic faults on a node it ran on.
struct AffectingFault {
  int index = 0;  // position in the plan
  emu::Fault fault;
  std::string scope;
};

struct Summary {
  int iterations = 0;
  double median_s = 0, mean_s = 0, min_s = 0, max_s = 0, p95_s = 0, total_s = 0;
};

struct ReportData {
  std::string status = "ok";
  int rank = 0;
  int world_size = 1;
  int pid = 0;
  int node = 0;          // at the end
  int launch_node = 0;
  Coords coords;
  Options options;
  std::vector<IterationRecord> iterations;
  std::vector<PlanChange> plan_changes;
  std::vector<PlanRecord> plans;
  std::vector<RestartRecord> restarts;
  CheckpointStats checkpoints;
  std::vector<AffectingFault> faults;
  // The communicators and threads, as the run made them (the last set after a restart).
  std::vector<std::string> comm_groups;  // "name.index" in creation order
  int world_splits = 0;                  // ncclCommSplit calls on the world (members and not)
  std::uint64_t watchdog_polls = 0;      // polling rounds of the watchdog thread
  bool device_streams = false;           // a driver was loaded: work ran on streams
  bool device_compute = false;           // compute was enqueued on the device (falconEmuLaunchCompute)
  int peak_activations = 0;              // most micro-batches' activations held at once (Megatron mode)
  std::string schedule;                  // the stage's compute order in the last iteration (Megatron mode)
};

// `nodes`: every node the rank ran on.
[[nodiscard]] std::vector<AffectingFault> FaultsAffecting(const emu::FaultPlan& plan, int rank,
                                                          const std::vector<int>& nodes);
[[nodiscard]] Summary Summarize(const std::vector<IterationRecord>& iterations);
// One JSON document; `indent` < 0 gives a single line.
[[nodiscard]] std::string ReportJson(const ReportData& data, int indent);
// Where rank `rank` writes for --report `spec`: "{rank}" substituted, else ".rank<R>" appended
// when world > 1. "-" stays "-" (stdout).
[[nodiscard]] std::string ReportPath(const std::string& spec, int rank, int world);
// Writes the report (stdout as one line for "-"), atomically for files.
[[nodiscard]] Status WriteReport(const std::string& spec, const ReportData& data);
// Rank 0's human summary line.
[[nodiscard]] std::string SummaryLine(const ReportData& data);

}  // namespace falcon::train

#endif  // FALCON_BENCH_TRAIN_REPORT_H_
