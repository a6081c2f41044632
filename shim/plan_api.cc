// The exported C API for frameworks (include/falcon/falcon.h): the mitigation plan the agent
// wrote into this process's segment, the framework's acknowledgement and cost reports, and its
// phase annotations (kept process-wide, written into the segment once there is one).
//
// The plan block exists once the shim has its segment, i.e. after the process's first NCCL
// call; before that, in a fork child before its own first call, and while the shim passes
// through (FALCON_DISABLE, no room for the segment) every reader answers FALCON_ERR_NO_PLAN /
// version 0 and falconAckPlan / falconReportCost FALCON_ERR_NO_PLAN (bad arguments: INVALID first). Asking never initialises the shim.
// Thread-safety: any thread, any time (plan_reader.h). Must never: initialise the tracer,
// block, lock, allocate, make a syscall or log — these functions may sit in a training loop.
#include "falcon/falcon.h"
#include "shim/plan_reader.h"
#include "shim/tracer.h"

#define FALCON_EXPORT __attribute__((visibility("default")))

namespace {

using falcon::shim::PlanPart;

// The plan block of this process's segment, or nullptr when there is none (see above).
FalconPlanBlock* Block() {
  using falcon::shim::Tracer;
  if (falcon::shim::g_init_state.load(std::memory_order_acquire) != Tracer::kReady) return nullptr;
  return falcon::shim::g_tracer.segment().plan();
}

int GetPart(PlanPart part, int32_t* out, int capacity, uint32_t* version) {
  if (version != nullptr) *version = 0;
  if (capacity < 0 || (out == nullptr && capacity > 0)) return FALCON_ERR_INVALID;
  const FalconPlanBlock* b = Block();
  if (b == nullptr) return FALCON_ERR_NO_PLAN;
  return falcon::shim::ReadPlanPart(*b, part, out, capacity, version);
}

}  // namespace

extern "C" {

FALCON_EXPORT int falconApiVersion(void) { return FALCON_API_VERSION; }

FALCON_EXPORT uint32_t falconPlanVersion(void) {
  const FalconPlanBlock* b = Block();
  return b == nullptr ? 0 : falcon::shim::PlanVersion(*b);
}

FALCON_EXPORT int falconGetPlan(FalconPlanInfo* info) {
  if (info == nullptr) return FALCON_ERR_INVALID;
  const FalconPlanBlock* b = Block();
  if (b == nullptr) {
    *info = FalconPlanInfo{};
    return FALCON_ERR_NO_PLAN;
  }
  return falcon::shim::ReadPlanInfo(*b, info);
}

FALCON_EXPORT int falconGetMicroBatchPlan(int32_t* counts, int capacity, uint32_t* version) {
  return GetPart(PlanPart::kMicroBatches, counts, capacity, version);
}

FALCON_EXPORT int falconGetPlacementPlan(int32_t* node_of_rank, int capacity, uint32_t* version) {
  return GetPart(PlanPart::kPlacement, node_of_rank, capacity, version);
}

FALCON_EXPORT int falconGetExcludedNodes(int32_t* nodes, int capacity, uint32_t* version) {
  return GetPart(PlanPart::kExcludedNodes, nodes, capacity, version);
}

FALCON_EXPORT int falconGetPipelinePlan(int32_t* warmup, int capacity, uint32_t* version) {
  return GetPart(PlanPart::kWarmup, warmup, capacity, version);
}

FALCON_EXPORT int falconAckPlan(uint32_t version, int status) {
  if (version == 0) return FALCON_ERR_INVALID;
  FalconPlanBlock* b = Block();
  if (b == nullptr) return FALCON_ERR_NO_PLAN;
  return falcon::shim::AckPlan(*b, version, status);
}

FALCON_EXPORT int falconSetPhase(uint32_t phase) {
  if (phase > kFalconPhaseOther) return FALCON_ERR_INVALID;
  falcon::shim::g_phase.store(phase, std::memory_order_seq_cst);
  // Written now if the segment exists; else when it is created (Tracer::InitSlow).
  if (falcon::shim::g_init_state.load(std::memory_order_seq_cst) == falcon::shim::Tracer::kReady) {
    falcon::shim::g_tracer.NotePhase(phase);
  }
  return FALCON_OK;
}

FALCON_EXPORT int falconGetPhase(void) {
  return static_cast<int>(falcon::shim::g_phase.load(std::memory_order_relaxed));
}

FALCON_EXPORT int falconReportCost(uint32_t strategy, double seconds) {
  if (!falcon::shim::ValidCostReport(strategy, seconds)) return FALCON_ERR_INVALID;
  FalconPlanBlock* b = Block();
  if (b == nullptr) return FALCON_ERR_NO_PLAN;
  return falcon::shim::ReportCost(*b, strategy, seconds);
}

}  // extern "C"
