// PlanDelivery: the agent's part of act-mode mitigation. Carries out `plan` commands by writing
// the plan into the plan block (FalconPlanBlock, shm_abi.h) of every targeted rank's segment,
// where the framework reads it through include/falcon/falcon.h, and keeps the latest plans so
// that a process that starts later (a late or restarted rank, a new segment) gets the newest
// plan that targets it, without a new command.
//  - A plan whose arrays exceed the block's capacities (FALCON_PLAN_MAX_*) is refused whole:
//    ack "rejected", nothing written, nothing held.
//  - A rank whose segment already holds this version or a newer one is left alone ("stale").
//  - Per-rank results: delivered | stale | failed (segment opened read-only). The ack is "ok"
//    unless a rank failed ("failed"); `ranks` lists the ranks the plan was written to. With no
//    target here now the plan is held and acked "ok" with no ranks.
// Thread-safety: one owner (the agent loop, through CommandExecutor). Must never: block, keep a
// follower pointer beyond a call, or write to a segment anything but its plan block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "daemon/agent/command_executor.h"
#include "daemon/agent/rank_follower.h"
#include "daemon/protocol/messages.h"
#include "daemon/shm/plan_block.h"

namespace falcon::agent {

// FalconStrategy value of "S1".."S4" (0 for anything else; the schema admits only those).
std::uint32_t StrategyCode(const std::string& strategy);

// The plan command (every rank) that carries the plan in force of `text`, the plan hash's
// mitigation_plan message: InvalidArgument when it is malformed, NotFound when its mode is not
// act (an advised plan is the operator's to apply, never the agent's).
Result<protocol::Command> PlanInForceCommand(const std::string& text);

class PlanDelivery {
 public:
  static constexpr std::size_t kHeldPlans = 8;

  // A validated plan command and the followers it targets (already filtered by `ranks`).
  CommandOutcome Execute(const protocol::Command& c, std::span<RankFollower* const> targets,
                         std::int64_t now_real_ns);

  // Writes the newest held plan that targets `f` and is newer than what its segment holds.
  // Returns the version written, 0 if none was due (or f is read-only, or the write failed).
  std::uint32_t CatchUp(RankFollower& f, std::int64_t now_real_ns);

  // The newest plan version held, 0 if none.
  std::uint32_t newest() const { return held_.empty() ? 0 : held_.back().plan.version; }

 private:
  struct Held {
    daemon::ShmPlan plan;
    std::optional<std::vector<std::int64_t>> ranks;  // absent: every rank
    bool Targets(std::int64_t rank) const;
  };
  void Hold(daemon::ShmPlan plan, const std::optional<std::vector<std::int64_t>>& ranks);

  std::vector<Held> held_;  // ascending by version, at most kHeldPlans
};

}  // namespace falcon::agent
