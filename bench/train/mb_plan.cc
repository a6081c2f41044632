// Micro-batch plan parsing, file polling and the control word; see mb_plan.h.
#include "mb_plan.h"

#include <sys/stat.h>

#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

namespace falcon::train {
namespace {

using nlohmann::json;

Result<MicroBatchPlan> FromJson(const json& j, int dp) {
  if (!j.is_object()) return Status::InvalidArgument("plan: not a JSON object");
  const auto v = j.find("version");
  if (v == j.end() || !v->is_number_integer()) return Status::InvalidArgument("plan: \"version\" must be an integer");
  const long long version = v->get<long long>();
  if (version < 1 || version > std::numeric_limits<std::int32_t>::max()) {
    return Status::InvalidArgument("plan: \"version\" " + std::to_string(version) + " is outside [1, 2^31)");
  }
  const auto m = j.find("micro_batches");
  if (m == j.end() || !m->is_array()) return Status::InvalidArgument("plan: \"micro_batches\" must be an array");
  if (m->size() != static_cast<std::size_t>(dp)) {
    return Status::InvalidArgument("plan: \"micro_batches\" has " + std::to_string(m->size()) +
                                   " entries; the job has dp=" + std::to_string(dp) + " replicas");
  }
  MicroBatchPlan plan;
  plan.version = static_cast<std::int32_t>(version);
  for (const json& e : *m) {
    if (!e.is_number_integer() || e.get<long long>() < 1 || e.get<long long>() > kMaxPlanMicroBatches) {
      return Status::InvalidArgument("plan: micro-batch counts must be integers in [1, " +
                                     std::to_string(kMaxPlanMicroBatches) + "], got " + e.dump());
    }
    plan.micro_batches.push_back(e.get<int>());
  }
  return plan;
}

}  // namespace

Result<MicroBatchPlan> ParseMicroBatchPlan(std::string_view text, int dp) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::InvalidArgument("plan: not valid JSON");
  return FromJson(j, dp);
}

std::optional<MicroBatchPlan> PlanFileWatcher::Poll(std::int32_t current_version, std::string* warning) {
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
  Result<MicroBatchPlan> plan = ParseMicroBatchPlan(text.str(), dp_);
  if (!plan.ok()) {
    *warning = path_ + ": " + plan.status().message();
    return std::nullopt;
  }
  if (plan.value().version <= current_version) return std::nullopt;
  return std::move(plan).value();
}

std::vector<std::int32_t> PackControl(const ControlDecision& proposal, int dp) {
  std::vector<std::int32_t> w(3 + static_cast<std::size_t>(dp), 0);
  w[0] = proposal.stop ? 1 : 0;
  w[2] = 1;
  if (const std::optional<MicroBatchPlan>& plan = proposal.new_plan) {
    w[1] = plan->version;
    for (int d = 0; d < dp; ++d) w[3 + static_cast<std::size_t>(d)] = plan->micro_batches[static_cast<std::size_t>(d)];
  }
  return w;
}

Result<ControlDecision> UnpackControl(const std::vector<std::int32_t>& w, int world, int dp) {
  if (w.size() != 3 + static_cast<std::size_t>(dp)) return Status::Corrupt("control word: wrong length");
  if (w[2] != world) {
    return Status::Corrupt("control word: member count " + std::to_string(w[2]) + ", expected " +
                           std::to_string(world));
  }
  if (w[0] != 0 && w[0] != 1) return Status::Corrupt("control word: stop flag " + std::to_string(w[0]));
  ControlDecision d;
  d.stop = w[0] == 1;
  if (w[1] != 0) {
    MicroBatchPlan p;
    p.version = w[1];
    for (int i = 0; i < dp; ++i) {
      const std::int32_t m = w[3 + static_cast<std::size_t>(i)];
      if (m < 1 || m > kMaxPlanMicroBatches) return Status::Corrupt("control word: micro-batches " + std::to_string(m));
      p.micro_batches.push_back(m);
    }
    d.new_plan = std::move(p);
  }
  return d;
}

}  // namespace falcon::train
