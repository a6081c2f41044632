// S4 restart planning. See restart_plan.h for the contract.
#include "analyzer/restart_plan.h"

#include <algorithm>
#include <set>
#include <utility>

namespace falcon::analyzer {
namespace {

std::string Str(std::int64_t v) { return std::to_string(v); }

Status CheckIds(const std::vector<std::int32_t>& ids, const char* what) {
  std::set<std::int32_t> seen;
  for (const std::int32_t id : ids) {
    if (id < 0 || !seen.insert(id).second) {
      return Status::InvalidArgument(std::string("restart: ") + what + " node " + Str(id) +
                                     (id < 0 ? " is negative" : " is listed twice"));
    }
  }
  return Status::Ok();
}

bool Contains(const std::vector<std::int32_t>& ids, std::int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

Status CheckShape(const RestartRequest& r) {
  if (r.tp < 1 || r.dp < 1 || r.pp < 1 || r.gpus_per_node < 1) {
    return Status::InvalidArgument("restart: tp " + Str(r.tp) + ", dp " + Str(r.dp) + ", pp " +
                                   Str(r.pp) + ", GPUs per node " + Str(r.gpus_per_node) +
                                   ": each must be >= 1");
  }
  const std::int64_t world = std::int64_t{r.tp} * r.dp * r.pp;
  const std::int64_t gpus = static_cast<std::int64_t>(r.job_nodes.size()) * r.gpus_per_node;
  if (world > gpus) {
    return Status::InvalidArgument("restart: " + Str(world) + " ranks do not fit " +
                                   Str(static_cast<std::int64_t>(r.job_nodes.size())) +
                                   " nodes of " + Str(r.gpus_per_node) + " GPUs");
  }
  if (r.min_data_parallel < 1 || r.total_microbatches < 0) {
    return Status::InvalidArgument(
        "restart: min_data_parallel must be >= 1 and "
        "total_microbatches >= 0");
  }
  return Status::Ok();
}

Status CheckRequest(const RestartRequest& r) {
  if (Status s = CheckShape(r); !s.ok()) return s;
  for (const auto& [ids, what] :
       {std::pair{&r.job_nodes, "job"}, {&r.faulty_nodes, "faulty"}, {&r.spare_nodes, "spare"}}) {
    if (Status s = CheckIds(*ids, what); !s.ok()) return s;
  }
  for (const std::int32_t n : r.faulty_nodes) {
    if (!Contains(r.job_nodes, n)) {
      return Status::InvalidArgument("restart: faulty node " + Str(n) + " is not in the job");
    }
  }
  for (const std::int32_t n : r.spare_nodes) {
    if (Contains(r.job_nodes, n)) {
      return Status::InvalidArgument("restart: spare node " + Str(n) + " is in the job");
    }
  }
  return Status::Ok();
}

// The job's nodes with each faulty one replaced by the next spare (or dropped when none is left).
std::vector<std::int32_t> Replace(const RestartRequest& r, RestartPlan& plan) {
  std::vector<std::int32_t> nodes;
  std::size_t next_spare = 0;
  for (const std::int32_t n : r.job_nodes) {
    if (!Contains(r.faulty_nodes, n)) {
      nodes.push_back(n);
    } else if (next_spare < r.spare_nodes.size()) {
      const std::int32_t spare = r.spare_nodes[next_spare++];
      plan.replacements.push_back({n, spare});
      nodes.push_back(spare);
    }
  }
  for (std::size_t i = next_spare; i < r.spare_nodes.size(); ++i) {
    nodes.push_back(r.spare_nodes[i]);  // unused spares may still host a shrunken job's ranks
  }
  return nodes;
}

RestartPlan NotPossible(RestartPlan plan, std::string reason) {
  plan.kind = RestartKind::kNotPossible;
  plan.nodes.clear();
  plan.idle_nodes.clear();
  plan.replacements.clear();
  plan.reason = std::move(reason);
  return plan;
}

}  // namespace

Result<RestartPlan> PlanRestart(const RestartRequest& r) {
  if (Status s = CheckRequest(r); !s.ok()) return s;
  RestartPlan plan;
  plan.excluded_nodes = r.faulty_nodes;
  std::sort(plan.excluded_nodes.begin(), plan.excluded_nodes.end());
  const std::vector<std::int32_t> healthy = Replace(r, plan);
  const std::int64_t replica = std::int64_t{r.tp} * r.pp;  // GPUs of one DP group
  const std::int64_t gpus = static_cast<std::int64_t>(healthy.size()) * r.gpus_per_node;
  const std::int64_t dp = std::min<std::int64_t>(r.dp, gpus / replica);
  if (dp < 1) {
    return NotPossible(
        plan, "TP x PP = " + Str(replica) + " GPUs do not fit the " + Str(gpus) + " healthy GPUs");
  }
  if (dp < r.min_data_parallel) {
    return NotPossible(
        plan, "DP would shrink to " + Str(dp) + ", below the minimum " + Str(r.min_data_parallel));
  }
  if (r.total_microbatches > 0 && dp > r.total_microbatches) {
    return NotPossible(
        plan, Str(r.total_microbatches) + " micro-batches cannot feed " + Str(dp) + " DP groups");
  }
  plan.tp = r.tp;
  plan.dp = static_cast<std::int32_t>(dp);
  plan.pp = r.pp;
  plan.world_size = replica * dp;
  const auto used =
      static_cast<std::size_t>((plan.world_size + r.gpus_per_node - 1) / r.gpus_per_node);
  plan.nodes.assign(healthy.begin(), healthy.begin() + static_cast<std::ptrdiff_t>(used));
  plan.idle_nodes.assign(healthy.begin() + static_cast<std::ptrdiff_t>(used), healthy.end());
  std::erase_if(plan.replacements,
                [&](const NodeReplacement& x) { return !Contains(plan.nodes, x.spare); });
  const std::string excluded =
      "excluding " + Str(static_cast<std::int64_t>(plan.excluded_nodes.size())) + " node(s); ";
  if (dp == r.dp) {
    plan.kind = RestartKind::kKeepShape;
    plan.reason = plan.replacements.empty()
                      ? excluded + "the remaining nodes still hold the job"
                      : excluded + Str(static_cast<std::int64_t>(plan.replacements.size())) +
                            " spare(s) in their place keep the shape";
  } else {
    plan.kind = RestartKind::kShrinkDataParallel;
    plan.reason = excluded + "DP shrinks from " + Str(r.dp) + " to " + Str(dp);
  }
  return plan;
}

}  // namespace falcon::analyzer
