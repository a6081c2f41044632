// CommandExecutor: carries out validated controller commands on the agent's ranks and produces
// exactly one ack per command.
//  - set_mode: RankFollower::RequestMode on every target; the ack ("ok") waits until each target
//    shim has acknowledged the new command sequence in its control block, or becomes "failed"
//    (naming the ranks that did not apply it) after mode_timeout. A target that exits meanwhile
//    counts as not applied.
//  - pause / resume / validate: handed to a TrapController — the extension point for the shim's
//    trap and benchmark executor (ShimTrap, shim_trap.h; UnsupportedTrap acks "unsupported").
//    The controller calls its Done exactly once, at once or from a later Check().
//  - cut_info: each target's call pattern (RankFollower::CutPattern) at once, as ack results
//    `pattern`; "failed" naming the ranks without one.
//  - plan: PlanDelivery (plan_delivery.h) writes the plan into each target's plan block at once
//    and holds it for ranks that start later (CatchUpPlans, every tick); a plan is held even
//    when none of its ranks runs here now.
//  - progress: each target's progress on its communicators at once (ack results `progress`).
//  - past its deadline_ns: "expired"; targets none of our ranks (except plan): "rejected".
// Thread-safety: one owner (the agent loop). Must never: block (acks that need the shim wait in
// pending_, checked by Check() each tick), or keep a follower pointer after Forget().
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "daemon/agent/rank_follower.h"
#include "daemon/protocol/messages.h"

namespace falcon::agent {

class PlanDelivery;

struct CommandOutcome {
  std::string status;  // ok | unsupported | rejected | failed | expired
  std::string detail;
  std::vector<std::int64_t> ranks;  // ranks it was applied to
  std::vector<protocol::AckRankResult> results;  // per-rank detail (trap and plan commands)
};

// The extension point for commands that need the shim's trap / benchmark executor. Loop thread
// only. Each command's `done` is called exactly once: from inside the call, or from Check().
// `targets` are the followed ranks the command names (every one when it names none); a
// `validate` naming none runs on those of them the trap holds paused. Must never block.
class TrapController {
 public:
  using Done = std::function<void(const CommandOutcome&)>;
  virtual ~TrapController() = default;
  virtual void Pause(const protocol::Command& c, std::span<RankFollower* const> targets, Done done) = 0;
  virtual void Resume(const protocol::Command& c, std::span<RankFollower* const> targets, Done done) = 0;
  virtual void Validate(const protocol::Command& c, std::span<RankFollower* const> targets, Done done) = 0;
  // Resolves waits that are answered or past their deadline (every loop tick).
  virtual void Check(std::int64_t /*now_real_ns*/) {}
  // `follower` is about to be destroyed: drop every pointer to it.
  virtual void Forget(const RankFollower* /*follower*/) {}
  virtual std::size_t pending() const { return 0; }
};

// For builds or deployments without the shim's trap (config trap_backend = unsupported).
class UnsupportedTrap : public TrapController {
 public:
  void Pause(const protocol::Command& c, std::span<RankFollower* const> targets, Done done) override;
  void Resume(const protocol::Command& c, std::span<RankFollower* const> targets, Done done) override;
  void Validate(const protocol::Command& c, std::span<RankFollower* const> targets, Done done) override;
};

class CommandExecutor {
 public:
  using Clock = std::chrono::steady_clock;
  // Receives the command's stream entry id, the command and its outcome.
  using AckFn = std::function<void(const std::string& entry_id, const protocol::Command& command,
                                   const CommandOutcome& outcome)>;

  CommandExecutor(std::unique_ptr<TrapController> trap, std::chrono::milliseconds mode_timeout,
                  AckFn ack);
  ~CommandExecutor();

  // `followers`: every rank the agent follows now. now_real_ns: wall clock, for deadlines.
  void Execute(const std::string& entry_id, const protocol::Command& command,
               std::span<RankFollower* const> followers, std::int64_t now_real_ns, Clock::time_point now);
  // A plan taken from the plan hash at start (not a command: no ack): delivered to `followers`
  // and held for the ranks that start later. Returns what PlanDelivery made of it.
  CommandOutcome AdoptPlanInForce(const protocol::Command& plan, std::span<RankFollower* const> followers,
                                  std::int64_t now_real_ns);
  // Resolves set_mode acks whose shims answered or whose time is up.
  void Check(Clock::time_point now);
  void Forget(const RankFollower* follower);
  // Gives every follower the newest held plan that targets it and that its segment lacks (a
  // process that started after the plan command). Returns how many segments were written;
  // `on_delivered` (may be empty) hears each (follower, version).
  std::size_t CatchUpPlans(std::span<RankFollower* const> followers, std::int64_t now_real_ns,
                           const std::function<void(const RankFollower&, std::uint32_t)>& on_delivered);
  std::size_t pending() const { return pending_.size() + trap_->pending(); }

 private:
  CommandOutcome CutInfo(std::span<RankFollower* const> targets);
  // progress: each target's progress, a rank of the falcon-progress document (progress_json.h)
  // plus paused, phase and quiet_s (seconds since its latest ordered call, -1: none). `calls`
  // (latest calls per communicator) is halved until the ack fits a message, and the detail says
  // so. ProgressOnce: one try with `calls`.
  CommandOutcome ProgressOf(std::span<RankFollower* const> targets, std::int64_t calls);
  CommandOutcome ProgressOnce(std::span<RankFollower* const> targets, std::int64_t calls);
  struct Wait {
    RankFollower* follower;  // nullptr once forgotten
    std::int64_t rank;
    std::uint64_t seq;
  };
  struct PendingMode {
    std::string entry_id;
    protocol::Command command;
    std::vector<Wait> waits;
    Clock::time_point deadline;
  };

  std::unique_ptr<TrapController> trap_;
  std::unique_ptr<PlanDelivery> plans_;
  std::chrono::milliseconds mode_timeout_;
  AckFn ack_;
  std::vector<PendingMode> pending_;
};

}  // namespace falcon::agent
