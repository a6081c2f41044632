// Fuzz target: the plan block, read by both its sides. The agent writes it and the framework
// reads it through falcon.h in the job's process, so a block damaged in shared memory (any
// counts, a seqlock left odd, garbage acks) reaches the shim's readers and the agent's. The input
// is the block's bytes (header fields first, then the arrays' first entries) and a few API calls.
// Checked: every read stays inside the block's arrays and returns what the API promises; what
// the agent's reader accepts it can write back unchanged, and the shim then reads the same plan.
#include <cmath>
#include <cstring>
#include <memory>

#include "daemon/shm/plan_block.h"
#include "fuzz/fuzz_input.h"
#include "shim/plan_reader.h"

namespace {

using falcon::fuzz::PropertyFailed;

constexpr size_t kHeadBytes = offsetof(FalconPlanBlock, micro_batches);

void ReadEveryPart(const FalconPlanBlock& block, falcon::fuzz::FuzzInput& in) {
  using falcon::shim::PlanPart;
  FalconPlanInfo info{};
  const int got = falcon::shim::ReadPlanInfo(block, &info);
  if (got != FALCON_OK && info.version != 0) PropertyFailed("a failed ReadPlanInfo left a version");
  static int32_t out[FALCON_PLAN_MAX_PLACEMENT + 8];
  for (PlanPart part : {PlanPart::kMicroBatches, PlanPart::kPlacement, PlanPart::kExcludedNodes}) {
    const int capacity = static_cast<int>(in.Range(0, FALCON_PLAN_MAX_PLACEMENT + 8));
    uint32_t version = 7;
    const int n = falcon::shim::ReadPlanPart(block, part, out, capacity, &version);
    if (n < 0 && version != 0) PropertyFailed("a failed ReadPlanPart left a version");
    if (n > FALCON_PLAN_MAX_PLACEMENT) PropertyFailed("a part longer than any array of the block");
  }
  (void)falcon::shim::PlanVersion(block);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace falcon;
  fuzz::FuzzInput in(data, size);
  auto block = std::make_unique<FalconPlanBlock>();
  const std::string_view head = in.Bytes(kHeadBytes);
  std::memcpy(block.get(), head.data(), head.size());
  const std::string_view arrays = in.Bytes(64 * sizeof(int32_t));
  std::memcpy(block->micro_batches, arrays.data(), arrays.size());
  std::memcpy(block->placement, arrays.data(), arrays.size());
  std::memcpy(block->exclude_nodes, arrays.data(), arrays.size());

  ReadEveryPart(*block, in);
  (void)daemon::ReadPlanAcks(*block);
  daemon::ShmPlan plan;
  const Status read = daemon::ReadPlanBlock(*block, &plan);
  if (read.ok()) {
    if (plan.micro_batches.size() > FALCON_PLAN_MAX_MICRO_BATCHES || plan.placement.size() > FALCON_PLAN_MAX_PLACEMENT ||
        plan.exclude_nodes.size() > FALCON_PLAN_MAX_EXCLUDE) {
      PropertyFailed("the agent's reader returned more entries than the block holds");
    }
    // What was read can be written again, and the framework then sees exactly it.
    auto copy = std::make_unique<FalconPlanBlock>();
    if (!daemon::CheckPlanFits(plan).ok()) PropertyFailed("a plan read from a block does not fit one");
    if (!daemon::WritePlanBlock(copy.get(), plan).ok()) PropertyFailed("a plan read back cannot be written");
    FalconPlanInfo info{};
    if (shim::ReadPlanInfo(*copy, &info) != FALCON_OK || info.version != plan.version ||
        info.micro_batch_count != plan.micro_batches.size() || info.placement_count != plan.placement.size() ||
        info.exclude_count != plan.exclude_nodes.size()) {
      PropertyFailed("the framework reads another plan than the one written");
    }
    static int32_t out[FALCON_PLAN_MAX_PLACEMENT];
    uint32_t version = 0;
    const int n = shim::ReadPlanPart(*copy, shim::PlanPart::kPlacement, out, FALCON_PLAN_MAX_PLACEMENT, &version);
    if (n != static_cast<int>(plan.placement.size()) ||
        (n > 0 && std::memcmp(out, plan.placement.data(), plan.placement.size() * sizeof(int32_t)) != 0)) {
      PropertyFailed("the placement read back differs from the one written");
    }
  }

  // The framework's answers land in whatever the block holds.
  (void)shim::AckPlan(*block, in.Take<uint32_t>(), in.Take<int32_t>());
  const uint32_t strategy = in.Take<uint8_t>() % 8;
  const double seconds = in.Take<double>();
  const bool valid = shim::ValidCostReport(strategy, seconds);
  if (valid && (!std::isfinite(seconds) || seconds < 0)) PropertyFailed("a non-finite or negative cost was accepted");
  if ((shim::ReportCost(*block, strategy, seconds) == FALCON_OK) != valid) PropertyFailed("ReportCost disagrees with ValidCostReport");
  const daemon::PlanAcks acks = daemon::ReadPlanAcks(*block);
  for (double c : acks.cost_s) {
    if (!std::isfinite(c)) PropertyFailed("a cost read back is not finite");
  }
  ReadEveryPart(*block, in);
  return 0;
}
