// The agent's side of a segment's plan block (FalconPlanBlock, shm_abi.h contract 7): writing a
// mitigation plan for the framework to read through falcon.h, reading the framework's
// acknowledgements back, and a consistent copy of the plan for tools and tests.
//
// Thread-safety: WritePlanBlock must have one writer per block at a time (the agent's loop
// thread; one agent per node); the readers may run anywhere, concurrently with it and with the
// shim's readers and ack writers. Must never: block, or write to the shim→agent ack words.
#pragma once

#include <cstdint>
#include <vector>

#include "falcon/shm_abi.h"
#include "falcon/status.h"

namespace falcon::daemon {

// A plan as the plan block holds it. strategy is a FalconStrategy value (falcon.h).
struct ShmPlan {
  uint32_t version = 0;  // 1.., increasing
  uint32_t strategy = 0;
  bool restart = false;
  int64_t issued_real_ns = 0;
  std::vector<int32_t> micro_batches;
  std::vector<int32_t> placement;
  std::vector<int32_t> exclude_nodes;
  std::vector<int32_t> warmup;  // pipeline: warm-up forwards per stage
};

// What the framework answered (falconAckPlan, falconReportCost), as last published by the shim.
struct PlanAcks {
  uint32_t applied = 0;       // highest version acked with status 0 (0: none)
  uint32_t rejected = 0;      // highest version acked with another status (0: none)
  uint32_t last_version = 0;  // the latest ack's version and status (0: no ack yet)
  int32_t last_status = 0;
  uint64_t count = 0;         // acks so far
  // falconReportCost: seconds of training applying S2, S3, S4, the pipeline plan costs (index
  // strategy - 2); negative while not reported.
  double cost_s[4] = {-1, -1, -1, -1};
};

// InvalidArgument naming the first array that exceeds the block's capacity, or version 0.
[[nodiscard]] Status CheckPlanFits(const ShmPlan& plan);

// Writes `plan` under the seqlock (odd seq, fields and arrays, version, even seq). Refuses a
// plan that does not fit (CheckPlanFits) without touching the block. A block left odd by a
// writer that died mid-write is taken over. REQUIRES: the only writer of `block` now.
[[nodiscard]] Status WritePlanBlock(FalconPlanBlock* block, const ShmPlan& plan);

// The version in the block (one acquire load), 0 if none.
uint32_t PlanBlockVersion(const FalconPlanBlock& block);

// A consistent copy of the plan. NotFound when no plan was written, Unavailable when every
// attempt raced the writer (try again).
[[nodiscard]] Status ReadPlanBlock(const FalconPlanBlock& block, ShmPlan* out);

PlanAcks ReadPlanAcks(const FalconPlanBlock& block);

}  // namespace falcon::daemon
