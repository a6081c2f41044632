// Plan sources; see plan_source.h.
#include "plan_source.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <fstream>
#include <limits>
#include <sstream>

namespace falcon::train {
namespace {

template <class F>
F Resolve(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

// Reads one part of the plan (micro-batches, placement or excluded nodes) of plan `version`:
// nullopt when the plan changed meanwhile or the call failed.
std::optional<std::vector<std::int32_t>> ReadPart(decltype(&falconGetMicroBatchPlan) get, std::uint32_t version) {
  std::uint32_t v = 0;
  const int n = get(nullptr, 0, &v);
  if (n == 0 && (v == version || v == 0)) return std::vector<std::int32_t>();  // the plan has no such part
  if (n < 0 || v != version) return std::nullopt;
  std::vector<std::int32_t> out(static_cast<std::size_t>(n));
  const int again = get(out.data(), n, &v);
  if (again != n || v != version) return std::nullopt;
  return out;
}

}  // namespace

std::optional<PlanOffer> PlanFileSource::Poll(std::int32_t last_version, std::string* warning) {
  struct stat st{};
  if (stat(path_.c_str(), &st) != 0) return std::nullopt;  // no plan yet
  const long long mtime_ns = static_cast<long long>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
  const long long size = static_cast<long long>(st.st_size);
  if (mtime_ns == last_mtime_ns_ && size == last_size_) return std::nullopt;
  last_mtime_ns_ = mtime_ns;
  last_size_ = size;
  std::ifstream in(path_);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) {
    *warning = "cannot read plan file " + path_;
    return std::nullopt;
  }
  Result<PlanOffer> offer = ParsePlanJson(text.str());
  if (!offer.ok()) {
    *warning = path_ + ": " + offer.status().message();
    return std::nullopt;
  }
  if (offer.value().plan.version <= last_version) return std::nullopt;
  return std::move(offer).value();
}

PlanOffer OfferFromApi(const FalconApiPlan& api) {
  PlanOffer o;
  o.source = "falcon";
  if (api.info.version > static_cast<std::uint32_t>(std::numeric_limits<std::int32_t>::max())) {
    o.plan.version = std::numeric_limits<std::int32_t>::max();
    o.rejection = "plan version " + std::to_string(api.info.version) + " is past 2^31 - 1";
    return o;
  }
  o.plan.version = static_cast<std::int32_t>(api.info.version);
  const std::optional<Strategy> s = StrategyFromCode(api.info.strategy);
  if (!s) {
    o.strategy_known = false;
    o.rejection = "unknown strategy code " + std::to_string(api.info.strategy) + " (expected 1..5: S1..S4, pipeline)";
    return o;
  }
  o.plan.strategy = *s;
  o.plan.micro_batches.assign(api.micro_batches.begin(), api.micro_batches.end());
  o.plan.placement.assign(api.placement.begin(), api.placement.end());
  o.plan.exclude_nodes.assign(api.exclude_nodes.begin(), api.exclude_nodes.end());
  o.plan.warmup.assign(api.warmup.begin(), api.warmup.end());
  // The C API always states the flag; "absent" and false are the same there.
  if (api.info.restart != 0 || *s == Strategy::kRestart) o.plan.restart = api.info.restart != 0;
  for (int m : o.plan.micro_batches) {
    if (m < 1 || m > kMaxPlanMicroBatches) {
      o.rejection = "micro-batch count " + std::to_string(m) + " is outside [1, " + std::to_string(kMaxPlanMicroBatches) + "]";
    }
  }
  for (int w : o.plan.warmup) {
    if (w < 0 || w > kMaxPlanWarmup) {
      o.rejection = "warm-up count " + std::to_string(w) + " is outside [0, " + std::to_string(kMaxPlanWarmup) + "]";
    }
  }
  for (const std::vector<int>* v : {&o.plan.placement, &o.plan.exclude_nodes}) {
    for (int n : *v) {
      if (n < 0 || n >= kMaxPlanNodes) o.rejection = "node index " + std::to_string(n) + " is out of range";
    }
  }
  return o;
}

FalconPlanSource::FalconPlanSource()
    : plan_version_(Resolve<decltype(&falconPlanVersion)>("falconPlanVersion")),
      get_plan_(Resolve<decltype(&falconGetPlan)>("falconGetPlan")),
      get_parts_{Resolve<decltype(&falconGetMicroBatchPlan)>("falconGetMicroBatchPlan"),
                 Resolve<decltype(&falconGetPlacementPlan)>("falconGetPlacementPlan"),
                 Resolve<decltype(&falconGetExcludedNodes)>("falconGetExcludedNodes")},
      get_warmup_(Resolve<decltype(&falconGetPipelinePlan)>("falconGetPipelinePlan")) {
  if (!plan_version_ || !get_parts_[0] || !get_parts_[1] || !get_parts_[2]) get_plan_ = nullptr;  // all or nothing
}

std::optional<PlanOffer> FalconPlanSource::Poll(std::int32_t last_version, std::string* warning) {
  if (!get_plan_) {
    if (!warned_) {
      *warning = "--falcon-plans: Falcon's C API is not in this process (no falconGetPlan: is libfalcon_shim.so "
                 "preloaded?); training goes on without Falcon plans";
      warned_ = true;
    }
    return std::nullopt;
  }
  const std::uint32_t v = plan_version_();
  if (v == 0 || v <= static_cast<std::uint32_t>(std::max<std::int32_t>(last_version, 0))) return std::nullopt;
  FalconApiPlan api;
  if (get_plan_(&api.info) != FALCON_OK || api.info.version != v) return std::nullopt;  // changing: next boundary
  std::vector<std::int32_t>* parts[3] = {&api.micro_batches, &api.placement, &api.exclude_nodes};
  for (int i = 0; i < 3; ++i) {
    std::optional<std::vector<std::int32_t>> p = ReadPart(get_parts_[i], v);
    if (!p) return std::nullopt;
    *parts[i] = std::move(*p);
  }
  if (get_warmup_ != nullptr) {
    std::optional<std::vector<std::int32_t>> w = ReadPart(get_warmup_, v);
    if (!w) return std::nullopt;
    api.warmup = std::move(*w);
  }
  return OfferFromApi(api);
}

FalconAck::FalconAck()
    : ack_(Resolve<decltype(&falconAckPlan)>("falconAckPlan")),
      report_cost_(Resolve<decltype(&falconReportCost)>("falconReportCost")) {}

bool FalconAck::ReportCost(std::uint32_t strategy, double seconds) const {
  return report_cost_ != nullptr && report_cost_(strategy, seconds) == FALCON_OK;
}

bool FalconAck::Ack(std::int32_t version, int status) const {
  return ack_ != nullptr && version > 0 && ack_(static_cast<std::uint32_t>(version), status) == FALCON_OK;
}

}  // namespace falcon::train
