// Ground truth of one rank for scoring Falcon: what this rank did (its iteration times and
// micro-batch counts) and which faults of the plan could have slowed it. Written once at the end
// of the run (also after a failure, with "status" saying why) as JSON:
//
//   {"schema": "falcon.train.report", "schema_version": 1, "status": "ok" | "check failed: ..." | ...,
//    "rank": 3, "world_size": 8, "pid": 1234, "node": 0,
//    "shape": {"tp": 2, "dp": 2, "pp": 2}, "coords": {"tp": 1, "dp": 1, "pp": 0},
//    "config": {"micro_batches": 4, "layers": 2, "hidden": 128, "seq": 64, "micro_batch_size": 2,
//               "compute_ms": 2, "optimizer_ms": 1, "dp_mode": "allreduce", "check": true,
//               "activation_bytes": 32768, "grad_bytes": 393216, "plan_file": ""},
//    "iterations": [{"iter": 0, "start_s": 0.41, "duration_s": 0.071, "micro_batches": 4,
//                    "plan_version": 0, "compute_factor": 1}, ...],
//    "plan_changes": [{"iter": 1, "version": 1, "micro_batches": [2, 6]}],
//    "faults": [{"index": 0, "kind": "compute", "scope": "rank", "ranks": [3], "nodes": [],
//                "start_s": 0, "duration_s": 0, "factor": 3}],
//    "summary": {"iterations": 10, "median_s": ..., "mean_s": ..., "min_s": ..., "max_s": ...,
//                "p95_s": ..., "total_s": ...}}
//
// Times are seconds since the job epoch (falconEmuJobSeconds). compute_factor is the largest
// compute slowdown applied in that iteration. A plan change's "iter" is the first iteration run
// under it.
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

inline constexpr int kReportSchemaVersion = 1;

struct IterationRecord {
  int iter = 0;
  double start_s = 0;
  double duration_s = 0;
  int micro_batches = 0;        // this rank's replica
  std::int32_t plan_version = 0;
  double compute_factor = 1;
};

struct PlanChange {
  int iter = 0;  // first iteration under the plan
  std::int32_t version = 0;
  std::vector<int> micro_batches;
};

// A fault of the plan that touches this rank: "rank" scope for compute/hang naming the rank,
// "node" scope for link/nic faults on the rank's node.
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
  int node = 0;
  Coords coords;
  Options options;
  std::vector<IterationRecord> iterations;
  std::vector<PlanChange> plan_changes;
  std::vector<AffectingFault> faults;
};

[[nodiscard]] std::vector<AffectingFault> FaultsAffecting(const emu::FaultPlan& plan, int rank, int node);
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
