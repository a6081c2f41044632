// CommandExecutor: carries out validated controller commands on the agent's ranks and produces
// exactly one ack per command.
//  - set_mode: RankFollower::RequestMode on every target; the ack ("ok") waits until each target
//    shim has acknowledged the new command sequence in its control block, or becomes "failed"
//    (naming the ranks that did not apply it) after mode_timeout. A target that exits meanwhile
//    counts as not applied.
//  - pause / resume / validate: handed to a TrapController — the extension point for the shim's
//    trap and benchmark executor. UnsupportedTrap (the default) acks "unsupported".
//  - past its deadline_ns: "expired"; targets none of our ranks: "rejected".
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

struct CommandOutcome {
  std::string status;  // ok | unsupported | rejected | failed | expired
  std::string detail;
  std::vector<std::int64_t> ranks;  // ranks it was applied to
};

// The extension point for commands that need the shim's trap / benchmark executor.
class TrapController {
 public:
  virtual ~TrapController() = default;
  virtual CommandOutcome Pause(const protocol::Command& c, std::span<RankFollower* const> targets) = 0;
  virtual CommandOutcome Resume(const protocol::Command& c, std::span<RankFollower* const> targets) = 0;
  virtual CommandOutcome Validate(const protocol::Command& c, std::span<RankFollower* const> targets) = 0;
};

// Until the shim implements the trap (FalconControl's pause/task words are reserved).
class UnsupportedTrap : public TrapController {
 public:
  CommandOutcome Pause(const protocol::Command& c, std::span<RankFollower* const> targets) override;
  CommandOutcome Resume(const protocol::Command& c, std::span<RankFollower* const> targets) override;
  CommandOutcome Validate(const protocol::Command& c, std::span<RankFollower* const> targets) override;
};

class CommandExecutor {
 public:
  using Clock = std::chrono::steady_clock;
  // Receives the command's stream entry id, the command and its outcome.
  using AckFn = std::function<void(const std::string& entry_id, const protocol::Command& command,
                                   const CommandOutcome& outcome)>;

  CommandExecutor(std::unique_ptr<TrapController> trap, std::chrono::milliseconds mode_timeout,
                  AckFn ack);

  // `followers`: every rank the agent follows now. now_real_ns: wall clock, for deadlines.
  void Execute(const std::string& entry_id, const protocol::Command& command,
               std::span<RankFollower* const> followers, std::int64_t now_real_ns, Clock::time_point now);
  // Resolves set_mode acks whose shims answered or whose time is up.
  void Check(Clock::time_point now);
  void Forget(const RankFollower* follower);
  std::size_t pending() const { return pending_.size(); }

 private:
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
  std::chrono::milliseconds mode_timeout_;
  AckFn ack_;
  std::vector<PendingMode> pending_;
};

}  // namespace falcon::agent
