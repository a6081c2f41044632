// ShimTrap: the TrapController that drives the shim's trap and benchmark executor through each
// rank's control block (FalconControl in shm_abi.h, SegmentReader::RequestPause & co.).
//  - pause: needs `targets` (per rank, per communicator: the trigger comm_seq and the calls the
//    rank must have issued once stopped — a consistent cut planned by analyzer/cut_plan.h), or
//    `comm` (the 16-hex id every member computes alike) and `comm_seq` (one call of a
//    communicator spanning every target). Every target must be writable and a live member of
//    every communicator named, else the whole command is rejected before any rank is armed. A
//    rank that traps with other call counts than expected is "misaligned" (the cut was not
//    consistent: the pause fails and every rank is released). Each rank is asked to stop with with the shim deadline now + max_pause_s (armed past it: expired; trapped past it:
//    timed out, training goes on). Acked when every rank is trapped or terminal, or at the
//    shim deadline + kGrace: "ok" if all trapped; else the ranks that did trap are released at
//    once (a partial cut would stall their peers) and the ack is rejected / expired / failed.
//  - resume: RequestResume on each target this agent paused; "ok" when all resumed, "failed"
//    (per-rank timed_out, ...) otherwise or at the wait deadline.
//  - validate: posts one FalconTask per target, only on ranks trapped by this agent; acked with
//    each FalconTaskResult. gemm: size^3. vcomm_id: the validation communicator's unique id
//    (ack result `blob`). vcomm_join: join it as `vrank` of `vranks` with buffers of `bytes`.
//    p2p: on the validation communicator this rank joined (never a job's), with `peer` or a
//    ring `shift` in its ranks.
// Every wait has a deadline: the command's deadline_ns, else now + options.wait.
// Thread-safety: loop thread only (a TrapController). Must never: block (waits are polled by
// Check() from the loop's tick), write to a segment anything but the control block's
// agent→shim words, or keep a follower pointer after Forget().
#pragma once

#include <array>
#include <chrono>
#include <optional>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "daemon/agent/command_executor.h"

namespace falcon::agent {

struct ShimTrapOptions {
  std::chrono::milliseconds wait{30000};  // resume / validate waits without a deadline_ns
};

class ShimTrap : public TrapController {
 public:
  static constexpr std::int64_t kGraceNs = 2'000'000'000;  // for the shim's service tick

  explicit ShimTrap(ShimTrapOptions options) : options_(options) {}

  void Pause(const protocol::Command& c, std::span<RankFollower* const> targets, Done done) override;
  void Resume(const protocol::Command& c, std::span<RankFollower* const> targets, Done done) override;
  void Validate(const protocol::Command& c, std::span<RankFollower* const> targets, Done done) override;
  void Check(std::int64_t now_real_ns) override;
  void Forget(const RankFollower* follower) override;
  std::size_t pending() const override { return pending_.size(); }

 private:
  enum class Kind { kPause, kResume, kValidate };
  struct RankWait {
    RankFollower* follower;  // nullptr once forgotten
    std::int64_t rank;
    std::uint64_t seq;       // pause generation, or task sequence
    protocol::AckRankResult result;
    bool done = false;
    // pause with targets: (comm slot, calls it must have issued once trapped)
    std::vector<std::pair<std::uint32_t, std::uint64_t>> expect;
  };
  struct Pending {
    Kind kind;
    std::vector<RankWait> ranks;
    std::int64_t deadline_real_ns;
    Done done;
  };

  // One rank's task for a validate command, with its input blob (vcomm_join).
  struct Task {
    FalconTask task{};
    std::optional<std::array<std::uint8_t, FALCON_TASK_BLOB_LEN>> blob;
  };
  struct VcommMember {
    std::int64_t vrank = -1;
    std::int64_t vranks = 0;
  };
  std::optional<Task> MakeTask(const protocol::Command& c, RankFollower& f, std::string* why) const;
  void Poll(Pending& p, RankWait& w);
  CommandOutcome Finish(Pending& p);
  // The pause generation this agent holds on `f` while the shim reports it armed or trapped.
  std::uint64_t ActivePause(RankFollower* f, bool trapped_only) const;
  std::int64_t WaitDeadline(const protocol::Command& c, std::int64_t now_real_ns) const;

  ShimTrapOptions options_;
  std::vector<Pending> pending_;
  std::map<const RankFollower*, std::uint64_t> paused_;  // last pause generation we requested
  std::map<const RankFollower*, VcommMember> vcomm_;    // validation communicator joined this pause
};

}  // namespace falcon::agent
