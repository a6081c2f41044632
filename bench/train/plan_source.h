// Where rank 0 of falcon-train-emu finds mitigation plans, polled at every iteration boundary:
//
//  * PlanFileSource (--plan-file PATH): stat the file, re-read it when its mtime or size changed.
//    A missing file is "no plan"; a text that is not a plan at all (not JSON, no version) is
//    ignored with a warning once per change of the file.
//  * FalconPlanSource (--falcon-plans): Falcon's C API (include/falcon/falcon.h), exported by the
//    LD_PRELOADed shim and resolved with dlsym(RTLD_DEFAULT, ...). No falconGetPlan in the process
//    means no Falcon: one warning, then every poll is "no plan". A plan that changed while being
//    read (versions of its parts differ, FALCON_ERR_BUSY) is read again at the next boundary.
//
// Both return only offers whose version is greater than the last one considered (applied or
// rejected). FalconAck (every rank) reports the verdict back through falconAckPlan, and what
// plans cost through falconReportCost, when the symbols exist.
//
// Thread-safety: one thread per object. Must never: block (file reads are small; the C API never
// blocks), or call into a missing symbol.
#ifndef FALCON_BENCH_TRAIN_PLAN_SOURCE_H_
#define FALCON_BENCH_TRAIN_PLAN_SOURCE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "falcon/falcon.h"
#include "mitigation_plan.h"

namespace falcon::train {

class PlanSource {
 public:
  virtual ~PlanSource() = default;
  // A new offer (version > last_version), or nullopt. *warning: a line for stderr, or empty.
  [[nodiscard]] virtual std::optional<PlanOffer> Poll(std::int32_t last_version, std::string* warning) = 0;
};

class PlanFileSource final : public PlanSource {
 public:
  explicit PlanFileSource(std::string path) : path_(std::move(path)) {}
  [[nodiscard]] std::optional<PlanOffer> Poll(std::int32_t last_version, std::string* warning) override;

 private:
  const std::string path_;
  long long last_mtime_ns_ = -1;  // of the last file read
  long long last_size_ = -1;
};

// The plan in force as the C API hands it out, before conversion.
struct FalconApiPlan {
  FalconPlanInfo info{};
  std::vector<std::int32_t> micro_batches, placement, exclude_nodes, warmup;
};

// Converts what the C API returned into an offer (pure): strategy codes outside S1..S4 or a
// version past 2^31 - 1 become a rejection.
[[nodiscard]] PlanOffer OfferFromApi(const FalconApiPlan& api);

class FalconPlanSource final : public PlanSource {
 public:
  FalconPlanSource();  // resolves the symbols
  [[nodiscard]] std::optional<PlanOffer> Poll(std::int32_t last_version, std::string* warning) override;
  [[nodiscard]] bool available() const { return get_plan_ != nullptr; }

 private:
  decltype(&falconPlanVersion) plan_version_ = nullptr;
  decltype(&falconGetPlan) get_plan_ = nullptr;
  decltype(&falconGetMicroBatchPlan) get_parts_[3] = {nullptr, nullptr, nullptr};  // mb, placement, exclude
  decltype(&falconGetPipelinePlan) get_warmup_ = nullptr;  // API version 4; absent in older shims
  bool warned_ = false;
};

// falconAckPlan when the process has it (resolved once).
class FalconAck {
 public:
  FalconAck();
  // Reports plan `version` applied (status 0) or rejected (non-zero). False when there is no
  // falconAckPlan or it refused (e.g. no shim segment yet); the trainer goes on either way.
  bool Ack(std::int32_t version, int status) const;
  // Reports what applying `strategy` (kFalconStrategyRebalance..Restart) costs this rank, in
  // seconds (falconReportCost, API version 2). False when the symbol is missing (an older shim,
  // or none) or the call refused; the trainer goes on either way.
  bool ReportCost(std::uint32_t strategy, double seconds) const;
  [[nodiscard]] bool available() const { return ack_ != nullptr; }

 private:
  decltype(&falconAckPlan) ack_ = nullptr;
  decltype(&falconReportCost) report_cost_ = nullptr;
};

}  // namespace falcon::train

#endif  // FALCON_BENCH_TRAIN_PLAN_SOURCE_H_
