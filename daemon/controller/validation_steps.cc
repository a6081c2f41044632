// Validation steps: see validation_steps.h.
#include "daemon/controller/validation_steps.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "analyzer/validation_plan.h"

namespace falcon::controller {
namespace {

// One pass of one communicator: exchanges between comm ranks.
struct CommPass {
  std::uint64_t comm = 0;
  bool judged = true;
  std::vector<std::pair<std::int32_t, std::int32_t>> pairs;
};

// `measured`: the unordered pairs of global ranks already planned this round (the same two GPUs
// and the same link, whichever communicator they were planned for): each is measured once.
Status AddCommPasses(const CommInfo& c, bool judged, const StepOptions& o,
                     std::set<std::pair<std::int64_t, std::int64_t>>& measured, std::vector<CommPass>& out) {
  std::vector<analyzer::PlanTopology> plans = {analyzer::PlanTopology::kRing};
  if (o.tree) plans.push_back(analyzer::PlanTopology::kTree);
  for (analyzer::PlanTopology t : plans) {
    Result<analyzer::ValidationPlan> plan = analyzer::MakePlan(t, c.members.size());
    if (!plan.ok()) return plan.status();
    for (const analyzer::ValidationPass& p : plan.value().passes) {
      CommPass cp{c.id, judged, {}};
      for (const analyzer::PlannedTransfer& x : p.transfers) {
        const std::int64_t a = c.members[static_cast<std::size_t>(x.sender)];
        const std::int64_t b = c.members[static_cast<std::size_t>(x.receiver)];
        if (measured.insert(std::minmax(a, b)).second) cp.pairs.emplace_back(x.sender, x.receiver);
      }
      if (!cp.pairs.empty()) out.push_back(std::move(cp));
    }
  }
  return Status::Ok();
}

// First-fit packing of exchanges, pass by pass, into steps whose ranks are disjoint: a pass's
// exchanges usually share a step, and a pass thinned out by pairs measured already fills the
// gaps of earlier steps instead of opening steps of its own. `vrank_of`: a global rank's rank in
// the validation communicator.
std::vector<ValidationStep> Pack(const std::vector<CommPass>& passes, const JobView& view,
                                 const std::map<std::int64_t, std::int32_t>& vrank_of) {
  std::vector<ValidationStep> steps;
  std::vector<std::set<std::int64_t>> used;
  for (std::uint32_t index = 0; index < passes.size(); ++index) {
    const CommPass& p = passes[index];
    const CommInfo& c = view.comms().at(p.comm);
    for (const auto& [a, b] : p.pairs) {
      const std::int64_t ga = c.members[static_cast<std::size_t>(a)];
      const std::int64_t gb = c.members[static_cast<std::size_t>(b)];
      std::size_t s = 0;
      while (s < steps.size() && (used[s].count(ga) > 0 || used[s].count(gb) > 0)) ++s;
      if (s == steps.size()) {
        steps.emplace_back();
        used.emplace_back();
      }
      steps[s].tasks.push_back({ga, "p2p", p.comm, vrank_of.at(gb), gb, index, p.judged});
      steps[s].tasks.push_back({gb, "p2p", p.comm, vrank_of.at(ga), ga, index, p.judged});
      used[s].insert({ga, gb});
    }
  }
  for (std::size_t s = 0; s < steps.size(); ++s) {
    steps[s].what = "p2p " + std::to_string(s + 1) + "/" + std::to_string(steps.size());
  }
  return steps;
}

}  // namespace

Result<std::vector<ValidationStep>> PlanValidationSteps(const JobView& view,
                                                        const std::vector<std::uint64_t>& judged,
                                                        const std::vector<std::uint64_t>& peers,
                                                        const StepOptions& options) {
  std::vector<ValidationStep> steps;
  std::vector<std::int64_t> ranks;
  for (const auto& [rank, info] : view.ranks()) ranks.push_back(rank);
  const std::size_t batch = options.gemm_batch == 0 ? std::max<std::size_t>(ranks.size(), 1) : options.gemm_batch;
  const std::size_t gemm_steps = (ranks.size() + batch - 1) / batch;
  for (std::size_t b = 0; b < gemm_steps; ++b) {
    ValidationStep s;
    s.what = "gemm " + std::to_string(b + 1) + "/" + std::to_string(gemm_steps);
    for (std::size_t i = b * batch; i < std::min(ranks.size(), (b + 1) * batch); ++i) {
      s.tasks.push_back({ranks[i], "gemm"});
    }
    steps.push_back(std::move(s));
  }
  std::vector<CommPass> passes;
  std::set<std::uint64_t> planned;
  std::set<std::pair<std::int64_t, std::int64_t>> measured;
  std::map<std::int64_t, std::int32_t> vrank_of;
  for (std::size_t i = 0; i < ranks.size(); ++i) vrank_of[ranks[i]] = static_cast<std::int32_t>(i);
  for (const auto& [list, is_judged] : {std::pair{&judged, true}, std::pair{&peers, false}}) {
    for (std::uint64_t id : *list) {
      auto it = view.comms().find(id);
      if (it == view.comms().end() || !it->second.complete() || it->second.members.size() < 2 ||
          !planned.insert(id).second ||
          std::any_of(it->second.members.begin(), it->second.members.end(),
                      [&](std::int64_t m) { return vrank_of.count(m) == 0; })) {
        continue;
      }
      if (Status s = AddCommPasses(it->second, is_judged, options, measured, passes); !s.ok()) return s;
    }
  }
  if (passes.empty()) return steps;
  // The validation communicator: its id on the first rank, then every rank joins it.
  ValidationStep id_step{"vcomm id", {RankTaskSpec{ranks.front(), "vcomm_id"}}};
  ValidationStep join_step{"vcomm join", {}};
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    RankTaskSpec t{ranks[i], "vcomm_join"};
    t.vrank = static_cast<std::int64_t>(i);
    t.vranks = static_cast<std::int64_t>(ranks.size());
    join_step.tasks.push_back(t);
  }
  steps.push_back(std::move(id_step));
  steps.push_back(std::move(join_step));
  std::vector<ValidationStep> p2p = Pack(passes, view, vrank_of);
  steps.insert(steps.end(), std::make_move_iterator(p2p.begin()), std::make_move_iterator(p2p.end()));
  return steps;
}

}  // namespace falcon::controller
