// PlanDelivery. See plan_delivery.h for the contract.
#include "daemon/agent/plan_delivery.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "daemon/protocol/validate.h"
#include "falcon/falcon.h"

namespace falcon::agent {
namespace {

std::string RankList(const std::vector<std::int64_t>& ranks) {
  std::string s;
  for (std::int64_t r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

daemon::ShmPlan FromCommand(const protocol::Command& c) {
  daemon::ShmPlan p;
  p.version = static_cast<std::uint32_t>(c.plan_version);
  p.strategy = StrategyCode(c.strategy);
  p.restart = c.restart;
  p.micro_batches = c.micro_batches;
  p.placement = c.placement;
  p.exclude_nodes = c.exclude_nodes;
  p.warmup = c.warmup;
  return p;
}

}  // namespace

std::uint32_t StrategyCode(const std::string& strategy) {
  if (strategy == "S1") return kFalconStrategyIgnore;
  if (strategy == "S2") return kFalconStrategyRebalance;
  if (strategy == "S3") return kFalconStrategyTopology;
  if (strategy == "S4") return kFalconStrategyRestart;
  if (strategy == "pipeline") return kFalconStrategyPipeline;
  return kFalconStrategyNone;
}

Result<protocol::Command> PlanInForceCommand(const std::string& text) {
  Result<nlohmann::json> m = protocol::ParseMessage(text, protocol::kMitigationPlan);
  if (!m.ok()) return Status::InvalidArgument("plan in force: " + m.status().message());
  const nlohmann::json& j = m.value();
  if (j["mode"] != "act") return Status::NotFound("plan in force is advice (mode " + j["mode"].get<std::string>() + ")");
  protocol::Command c;
  c.type = protocol::kPlanCommand.type;
  c.plan_version = j["plan_version"].get<std::int32_t>();
  c.id = "plan-in-force-v" + std::to_string(c.plan_version);
  c.issued_ns = j["at_ns"].get<std::int64_t>();
  c.strategy = j["strategy"].get<std::string>();
  protocol::CopyPlanFields(j, &c);
  // Through the command parser: the plan in force meets exactly the checks a plan command does
  // (element ranges included).
  Result<protocol::Command> checked = protocol::ParseCommand(protocol::ToJson(c).dump());
  if (!checked.ok()) return Status::InvalidArgument("plan in force: " + checked.status().message());
  return checked;
}

bool PlanDelivery::Held::Targets(std::int64_t rank) const {
  if (!ranks) return true;
  return rank >= 0 && std::find(ranks->begin(), ranks->end(), rank) != ranks->end();
}

void PlanDelivery::Hold(daemon::ShmPlan plan, const std::optional<std::vector<std::int64_t>>& ranks) {
  const auto at = std::find_if(held_.begin(), held_.end(),
                               [&](const Held& h) { return h.plan.version >= plan.version; });
  if (at != held_.end() && at->plan.version == plan.version) {
    *at = {std::move(plan), ranks};  // the same decision sent again (or corrected): the latest wins
  } else {
    held_.insert(at, {std::move(plan), ranks});
  }
  if (held_.size() > kHeldPlans) held_.erase(held_.begin());
}

CommandOutcome PlanDelivery::Execute(const protocol::Command& c, std::span<RankFollower* const> targets,
                                     std::int64_t now_real_ns) {
  daemon::ShmPlan plan = FromCommand(c);
  const std::string name = "plan v" + std::to_string(plan.version) + " (" + c.strategy + ")";
  if (Status s = daemon::CheckPlanFits(plan); !s.ok()) {
    return {"rejected", name + " not delivered: " + s.message(), {}, {}};
  }
  plan.issued_real_ns = now_real_ns;
  CommandOutcome out;
  std::vector<std::int64_t> stale, failed;
  std::string why_failed;
  for (RankFollower* f : targets) {
    protocol::AckRankResult r;
    r.rank = f->rank();
    if (f->plan_version() >= plan.version) {
      r.state = "stale";
      stale.push_back(r.rank);
    } else if (Status s = f->DeliverPlan(plan); s.ok()) {
      r.state = "delivered";
      out.ranks.push_back(r.rank);
    } else {
      r.state = "failed";
      failed.push_back(r.rank);
      if (why_failed.empty()) why_failed = s.message();
    }
    out.results.push_back(std::move(r));
  }
  Hold(std::move(plan), c.ranks);
  out.status = failed.empty() ? "ok" : "failed";
  out.detail = name + " delivered to " + std::to_string(out.ranks.size()) + " rank(s)";
  if (targets.empty()) out.detail += "; no target rank runs here now: held for ranks that start later";
  if (!stale.empty()) {
    out.detail += "; rank(s) " + RankList(stale) + " already hold this version or a newer one (left alone)";
  }
  if (!failed.empty()) out.detail += "; not delivered to rank(s) " + RankList(failed) + ": " + why_failed;
  return out;
}

std::uint32_t PlanDelivery::CatchUp(RankFollower& f, std::int64_t now_real_ns) {
  if (held_.empty() || !f.writable()) return 0;
  const std::uint32_t have = f.plan_version();
  const std::int64_t rank = f.rank();
  for (auto it = held_.rbegin(); it != held_.rend() && it->plan.version > have; ++it) {
    if (!it->Targets(rank)) continue;
    daemon::ShmPlan plan = it->plan;
    plan.issued_real_ns = now_real_ns;
    return f.DeliverPlan(plan).ok() ? plan.version : 0;
  }
  return 0;
}

}  // namespace falcon::agent
