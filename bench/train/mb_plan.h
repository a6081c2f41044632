// Micro-batch plans (the S2 mitigation hook) and the per-iteration control word that makes every
// rank apply a plan, or stop, at the same iteration boundary.
//
// Plan file (--plan-file), written by a controller or a test, replaced atomically (write a temp
// file, then rename) so a reader never sees half of it:
//
//   {"version": 3, "micro_batches": [4, 4, 2, 6]}
//
// `version` is an integer in [1, 2^31); `micro_batches` has exactly one entry per DP replica
// (index = dp coordinate), each in [1, 4096]. Other keys are ignored (room for later hooks such
// as pipeline warm-up counts). Only a version greater than the one in force is applied.
//
// Agreement: rank 0 alone polls the file (stat at every iteration boundary, re-read when the
// mtime or size changed). At the end of every iteration all ranks all-reduce (sum) a small int32
// control word on the world communicator, in which only rank 0 writes the stop flag and any new
// plan, and every rank adds 1 to a member count. Every rank therefore learns the same decision in
// the same iteration and applies it from the next one; the count proves that every rank took part.
//
// Thread-safety: values and pure functions, except PlanFileWatcher (one thread; reads the file
// system). Must never: throw (JSON errors become Status values), or block.
#ifndef FALCON_BENCH_TRAIN_MB_PLAN_H_
#define FALCON_BENCH_TRAIN_MB_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "falcon/status.h"

namespace falcon::train {

struct MicroBatchPlan {
  std::int32_t version = 0;          // 0: the initial plan from --micro-batches
  std::vector<int> micro_batches;    // per DP replica
};

inline constexpr int kMaxPlanMicroBatches = 4096;

// Parses and validates plan JSON for a job with `dp` replicas.
[[nodiscard]] Result<MicroBatchPlan> ParseMicroBatchPlan(std::string_view json, int dp);

// Polls a plan file. Fixed after construction: path, dp.
class PlanFileWatcher {
 public:
  PlanFileWatcher(std::string path, int dp) : path_(std::move(path)), dp_(dp) {}

  // Returns a valid plan whose version is greater than `current_version` when the file changed
  // since the last poll (or on the first poll). A missing file is "no plan" (not an error). An
  // unreadable or invalid file returns nullopt and sets *warning (once per change of the file).
  [[nodiscard]] std::optional<MicroBatchPlan> Poll(std::int32_t current_version, std::string* warning);

 private:
  std::string path_;
  int dp_;
  long long last_mtime_ns_ = -1;
  long long last_size_ = -1;
};

// The control word: [stop, plan_version, member_count, m_0 .. m_{dp-1}] (int32, summed).
struct ControlDecision {
  bool stop = false;
  std::optional<MicroBatchPlan> new_plan;  // set when rank 0 announced one
};

// This rank's contribution: rank 0 passes its proposal (stop, new plan), the others an empty
// ControlDecision. REQUIRES: a plan, when given, has dp entries.
[[nodiscard]] std::vector<std::int32_t> PackControl(const ControlDecision& proposal, int dp);
// Decodes the summed word; Corrupt if the member count is not `world` or the word is malformed.
[[nodiscard]] Result<ControlDecision> UnpackControl(const std::vector<std::int32_t>& summed, int world, int dp);

}  // namespace falcon::train

#endif  // FALCON_BENCH_TRAIN_MB_PLAN_H_
