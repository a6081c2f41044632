// Plan parsing, validation and effects; see mitigation_plan.h. Pure.
#include "mitigation_plan.h"

#include <algorithm>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

namespace falcon::train {
namespace {

using nlohmann::json;

// Reads an optional integer array `key` with entries in [lo, hi]; "" or a reason.
std::string ReadInts(const json& j, const char* key, long long lo, long long hi, std::vector<int>* out) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return "";
  if (!it->is_array()) return std::string("\"") + key + "\" must be an array";
  for (const json& e : *it) {
    if (!e.is_number_integer() || e.get<long long>() < lo || e.get<long long>() > hi) {
      return std::string("\"") + key + "\" entries must be integers in [" + std::to_string(lo) + ", " +
             std::to_string(hi) + "], got " + e.dump();
    }
    out->push_back(e.get<int>());
  }
  return "";
}

// The version, from "version" or its protocol name "plan_version".
Result<std::int32_t> ReadVersion(const json& j) {
  std::optional<long long> v;
  for (const char* key : {"version", "plan_version"}) {
    const auto it = j.find(key);
    if (it == j.end()) continue;
    if (!it->is_number_integer()) return Status::InvalidArgument(std::string("plan: \"") + key + "\" must be an integer");
    if (v && *v != it->get<long long>()) return Status::InvalidArgument("plan: \"version\" and \"plan_version\" differ");
    v = it->get<long long>();
  }
  if (!v) return Status::InvalidArgument("plan: \"version\" must be an integer");
  if (*v < 1 || *v > std::numeric_limits<std::int32_t>::max()) {
    return Status::InvalidArgument("plan: \"version\" " + std::to_string(*v) + " is outside [1, 2^31)");
  }
  return static_cast<std::int32_t>(*v);
}

// Fills the offer's plan from the object; returns the first defect or "".
std::string ReadFields(const json& j, MitigationPlan* p) {
  const auto s = j.find("strategy");
  if (s != j.end()) {
    if (!s->is_string()) return "\"strategy\" must be a string: S1..S4 or pipeline";
    const auto st = StrategyFromName(s->get<std::string>());
    if (!st) return "unknown strategy \"" + s->get<std::string>() + "\" (expected S1, S2, S3, S4 or pipeline)";
    p->strategy = *st;
  } else if (!j.contains("micro_batches")) {
    return "\"strategy\" is missing (only a plan with micro_batches may omit it: S2)";
  }
  std::string err;
  if (!(err = ReadInts(j, "micro_batches", 1, kMaxPlanMicroBatches, &p->micro_batches)).empty()) return err;
  if (!(err = ReadInts(j, "placement", 0, kMaxPlanNodes - 1, &p->placement)).empty()) return err;
  if (!(err = ReadInts(j, "exclude_nodes", 0, kMaxPlanNodes - 1, &p->exclude_nodes)).empty()) return err;
  if (!(err = ReadInts(j, "warmup", 0, kMaxPlanWarmup, &p->warmup)).empty()) return err;
  if (const auto r = j.find("restart"); r != j.end() && !r->is_null()) {
    if (!r->is_boolean()) return "\"restart\" must be true or false";
    p->restart = r->get<bool>();
  }
  return "";
}

// Checks a placement against the job: size, node range, seats per node, excluded nodes.
Status CheckPlacement(const std::vector<int>& placement, const JobFacts& f, const std::set<int>& excluded,
                      const std::vector<int>& now) {
  if (placement.size() != static_cast<std::size_t>(f.world)) {
    return Status::InvalidArgument("placement has " + std::to_string(placement.size()) + " entries; the job has " +
                                   std::to_string(f.world) + " ranks");
  }
  std::map<int, int> per_node;
  for (std::size_t r = 0; r < placement.size(); ++r) {
    const int n = placement[r];
    if (n < 0 || n >= f.total_nodes) {
      return Status::InvalidArgument("placement puts rank " + std::to_string(r) + " on node " + std::to_string(n) +
                                     "; the job has nodes 0.." + std::to_string(f.total_nodes - 1) +
                                     " (job nodes and --spare-nodes)");
    }
    if (excluded.count(n)) {
      return Status::InvalidArgument("placement puts rank " + std::to_string(r) + " on excluded node " + std::to_string(n));
    }
    if (++per_node[n] > f.gpus_per_node) {
      return Status::InvalidArgument("placement puts more than " + std::to_string(f.gpus_per_node) + " ranks on node " +
                                     std::to_string(n) + " (GPUs per node)");
    }
  }
  if (!f.can_replace && placement != now) {
    return Status::InvalidArgument("the emulator cannot re-place ranks here (no job state: run under falcon-emu-run)");
  }
  return Status::Ok();
}

// A pipeline plan's warm-up counts against the job: one per stage, non-increasing, within the
// activation limit, and a trainer that can run them.
Status CheckWarmup(const std::vector<int>& warmup, const JobFacts& f) {
  if (!f.no_pipeline_plans.empty()) return Status::InvalidArgument(f.no_pipeline_plans);
  if (warmup.empty()) return Status::InvalidArgument("a pipeline plan needs warmup counts");
  if (warmup.size() != static_cast<std::size_t>(f.pp)) {
    return Status::InvalidArgument("warmup has " + std::to_string(warmup.size()) + " entries; the job has pp=" +
                                   std::to_string(f.pp) + " stages");
  }
  for (std::size_t s = 0; s < warmup.size(); ++s) {
    if (s > 0 && warmup[s] > warmup[s - 1]) {
      return Status::InvalidArgument("warmup increases from stage " + std::to_string(s - 1) + " (" +
                                     std::to_string(warmup[s - 1]) + ") to stage " + std::to_string(s) + " (" +
                                     std::to_string(warmup[s]) + "): a later stage cannot run ahead of the one feeding it");
    }
    if (static_cast<long long>(warmup[s]) + 1 > f.activation_limit) {
      return Status::InvalidArgument("stage " + std::to_string(s) + " would hold " + std::to_string(warmup[s] + 1) +
                                     " micro-batches' activations; the limit is " + std::to_string(f.activation_limit) +
                                     " (--activation-limit)");
    }
  }
  return Status::Ok();
}

// S4 without a placement: each excluded node's ranks move, seat for seat, to the lowest spare.
Result<std::vector<int>> SparePlacement(const std::vector<int>& now, const JobFacts& f, const std::set<int>& excluded) {
  const std::set<int> used(now.begin(), now.end());
  std::vector<int> spares;
  for (int n = 0; n < f.total_nodes; ++n) {
    if (!used.count(n) && !excluded.count(n)) spares.push_back(n);
  }
  std::map<int, int> to;
  std::size_t next = 0;
  for (int x : excluded) {
    if (!used.count(x)) continue;  // already empty: nothing to move
    if (next == spares.size()) {
      return Status::InvalidArgument("not enough spare nodes: the excluded nodes hold ranks and only " +
                                     std::to_string(spares.size()) +
                                     " spare node(s) are free (the trainer cannot shrink; --spare-nodes)");
    }
    to[x] = spares[next++];
  }
  std::vector<int> out = now;
  for (int& n : out) {
    if (const auto it = to.find(n); it != to.end()) n = it->second;
  }
  return out;
}

}  // namespace

const char* StrategyName(Strategy s) {
  switch (s) {
    case Strategy::kIgnore: return "S1";
    case Strategy::kRebalance: return "S2";
    case Strategy::kTopology: return "S3";
    case Strategy::kRestart: return "S4";
    case Strategy::kPipeline: return "pipeline";
  }
  return "S?";
}

std::optional<Strategy> StrategyFromName(std::string_view name) {
  for (Strategy s : {Strategy::kIgnore, Strategy::kRebalance, Strategy::kTopology, Strategy::kRestart,
                     Strategy::kPipeline}) {
    if (name == StrategyName(s)) return s;
  }
  return std::nullopt;
}

std::optional<Strategy> StrategyFromCode(std::int64_t code) {
  if (code < 1 || code > 5) return std::nullopt;
  return static_cast<Strategy>(code);
}

Result<PlanOffer> ParsePlanJson(std::string_view text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::InvalidArgument("plan: not valid JSON");
  if (!j.is_object()) return Status::InvalidArgument("plan: not a JSON object");
  Result<std::int32_t> version = ReadVersion(j);
  if (!version.ok()) return version.status();
  PlanOffer offer;
  offer.source = "file";
  offer.plan.version = version.value();
  offer.rejection = ReadFields(j, &offer.plan);
  if (const auto s = j.find("strategy"); s != j.end() && (!s->is_string() || !StrategyFromName(s->get<std::string>()))) {
    offer.strategy_known = false;
  }
  return offer;
}

Result<PlanEffect> ResolvePlan(const MitigationPlan& plan, const JobFacts& f, const PlanState& now) {
  const bool s4 = plan.strategy == Strategy::kRestart;
  if (plan.restart && *plan.restart != s4) {
    return Status::InvalidArgument(s4 ? "S4 restarts from the last checkpoint: \"restart\": false is not supported"
                                      : std::string("\"restart\" is only for S4, not ") + StrategyName(plan.strategy));
  }
  if (!plan.micro_batches.empty() && plan.strategy != Strategy::kIgnore &&
      plan.micro_batches.size() != static_cast<std::size_t>(f.dp)) {
    return Status::InvalidArgument("micro_batches has " + std::to_string(plan.micro_batches.size()) +
                                   " entries; the job has dp=" + std::to_string(f.dp) + " replicas");
  }
  const std::set<int> excluded(plan.exclude_nodes.begin(), plan.exclude_nodes.end());
  if (excluded.size() != plan.exclude_nodes.size()) return Status::InvalidArgument("exclude_nodes repeats a node");
  for (int n : excluded) {
    if (n >= f.total_nodes) {
      return Status::InvalidArgument("exclude_nodes names node " + std::to_string(n) + "; the job has nodes 0.." +
                                     std::to_string(f.total_nodes - 1));
    }
  }
  if (!plan.warmup.empty() && plan.strategy != Strategy::kPipeline) {
    return Status::InvalidArgument(std::string("\"warmup\" is only for pipeline plans, not ") + StrategyName(plan.strategy));
  }
  PlanEffect e{now.micro_batches, now.placement, false, now.warmup};
  switch (plan.strategy) {
    case Strategy::kIgnore:
      e.micro_batches = f.initial_micro_batches;
      e.warmup.clear();
      return e;
    case Strategy::kPipeline:
      if (Status s = CheckWarmup(plan.warmup, f); !s.ok()) return s;
      e.warmup = plan.warmup;
      if (!plan.micro_batches.empty()) e.micro_batches = plan.micro_batches;
      return e;
    case Strategy::kRebalance:
      if (plan.micro_batches.empty()) return Status::InvalidArgument("S2 needs micro_batches");
      e.micro_batches = plan.micro_batches;
      return e;
    case Strategy::kTopology:
      if (plan.placement.empty()) return Status::InvalidArgument("S3 needs a placement");
      if (Status s = CheckPlacement(plan.placement, f, excluded, now.placement); !s.ok()) return s;
      e.placement = plan.placement;
      if (!plan.micro_batches.empty()) e.micro_batches = plan.micro_batches;
      return e;
    case Strategy::kRestart: {
      if (plan.placement.empty() && excluded.empty()) return Status::InvalidArgument("S4 needs exclude_nodes or a placement");
      if (plan.placement.empty()) {
        Result<std::vector<int>> p = SparePlacement(now.placement, f, excluded);
        if (!p.ok()) return p.status();
        e.placement = std::move(p).value();
      } else {
        e.placement = plan.placement;
      }
      if (Status s = CheckPlacement(e.placement, f, excluded, now.placement); !s.ok()) return s;
      e.micro_batches = plan.micro_batches.empty() ? f.initial_micro_batches : plan.micro_batches;
      e.warmup.clear();  // a relaunched job runs its own schedule
      e.restart = true;
      return e;
    }
  }
  return Status::InvalidArgument("unknown strategy");
}

std::vector<int> MovedRanks(const std::vector<int>& from, const std::vector<int>& to) {
  std::vector<int> out;
  for (std::size_t r = 0; r < from.size() && r < to.size(); ++r) {
    if (from[r] != to[r]) out.push_back(static_cast<int>(r));
  }
  return out;
}

}  // namespace falcon::train
