// The shim's side of the plan block (FalconPlanBlock, shm_abi.h contract 7): consistent copies
// of the plan the agent wrote, and the framework's acknowledgements. The exported C API
// (plan_api.cc, include/falcon/falcon.h) is a thin layer over these functions; they take the
// block explicitly so that tests can run them against any block (a real segment, or one that a
// writer thread hammers in the same process).
//
// Thread-safety: every function may run on any number of threads at once, concurrently with
// the agent's writer in another process. Readers never block: a copy is retried at most
// kPlanReadAttempts times while the agent is writing, then FALCON_ERR_BUSY.
// Must never: lock, allocate, make a syscall, log, or write to the block's agent→shim words.
#pragma once

#include <cstdint>

#include "falcon/falcon.h"
#include "falcon/shm_abi.h"

namespace falcon::shim {

// Copies attempted before giving up with FALCON_ERR_BUSY (a spin hint between attempts).
inline constexpr int kPlanReadAttempts = 256;

enum class PlanPart { kMicroBatches, kPlacement, kExcludedNodes, kWarmup };

// The version of the plan in force (one atomic load, no seqlock: contract 7), 0 if none.
uint32_t PlanVersion(const FalconPlanBlock& block);

// Fills *info with a consistent copy of the plan's scalar fields. FALCON_OK,
// FALCON_ERR_NO_PLAN (never written, or version 0) or FALCON_ERR_BUSY; on either error *info is
// all zero. REQUIRES: info != nullptr.
int ReadPlanInfo(const FalconPlanBlock& block, FalconPlanInfo* info);

// Copies min(count, capacity) entries of `part` to out[] from one consistent snapshot and sets
// *version (if not null) to that snapshot's version. Returns the part's number of entries
// (0 when the plan has none), FALCON_ERR_NO_PLAN or FALCON_ERR_BUSY (then *version = 0 and
// out[] may hold entries of a snapshot that was discarded). REQUIRES: capacity >= 0, and out
// != nullptr when capacity > 0.
int ReadPlanPart(const FalconPlanBlock& block, PlanPart part, int32_t* out, int capacity, uint32_t* version);

// Records the framework's answer for plan `version`: status 0 applied, anything else rejected.
// applied_version / rejected_version keep the highest version of their kind. FALCON_OK, or
// FALCON_ERR_INVALID for version 0.
int AckPlan(FalconPlanBlock& block, uint32_t version, int status);

// Records what applying `strategy` (kFalconStrategyRebalance..Restart) costs, `seconds` >= 0,
// rounded to microseconds (a report of 0 s is stored as 1 us: 0 means "none"). FALCON_OK, or
// FALCON_ERR_INVALID for another strategy, a negative or non-finite figure, or one over
// kMaxReportedCostS.
inline constexpr double kMaxReportedCostS = 49.0 * 86400;
bool ValidCostReport(uint32_t strategy, double seconds);
int ReportCost(FalconPlanBlock& block, uint32_t strategy, double seconds);

}  // namespace falcon::shim
