// RecoveryWatch: tells a slow GPU's recovery while re-balanced micro-batches hide it (issue: every
// mitigation undone within a few iterations of its fault's end, without undoing one whose fault
// persists).
//
// Why a watch. Under S2 the job's iteration time barely moves when the GPU recovers: the
// re-balanced split keeps the healthy replicas as busy as the slow one was (on the strict fabric
// the demo runs at 670 ms with the fault and 660 ms without it). What does move is inside the
// culprit's busiest small communicator (its tensor-parallel group): while the GPU is slow its
// peers wait for it in every collective, so their calls take far longer than the culprit's (it
// arrives last and waits for nobody); once it recovers the members arrive together. S2 does not
// change that per-call wait: it moves micro-batches between DP replicas, not work inside one.
//
// The mechanism.
//  - Targets (WatchTargets): per GPU culprit, the communicator of 2..max_members members, every
//    member known, that carried the most calls; the watch puts those members' shims in profile
//    mode (set_mode with `ranks`) and reads their comm_profile windows.
//  - Imbalance (WaitImbalance): in the newest windows taken in profile mode since the watch began,
//    the communicator's busiest collective signature (op, bytes) in the culprit's window: the
//    median over the other members of their median duration, over the culprit's. A window's
//    median covers its last 64 calls, so it shows the last moments of the window. A group with
//    no collective (a pipeline's, at TP 1) is read from its receives: the median over the
//    culprit's neighbours of their busiest receive from it, over the median of its busiest
//    receives from them (a receive waits for its sender; a send may finish into the peer's
//    buffer before the peer arrives, so sends are not read). Receives wait in bursts: that ratio
//    is heavy-tailed under the fault (0.07-78x in the TP 1 e2e runs), so a recovery read from it
//    must also be within min_level of 1 either way (healthy neighbours read about 1.5x).
//  - Level and recovery (RecoveryWatch::Observe): the imbalance of each culprit's second window
//    since arming is its level under the fault. Not the first: that one spans whatever armed the
//    watch (the plan's switch, which the ranks take at their next iteration, or a round's pause),
//    and overstates the level (TP 1 e2e runs: 19x and 35x, then mostly 4-11x while it lasted,
//    which once read the fault as ended). A level of at least `min_level` (2: the peers wait as
//    long again as the transfer takes) is visible. A level outlives a re-arming of the same episode (the caller's
//    incident) on the same communicator: a round that re-checks the culprits switches every
//    shim's mode, so the watch is armed again after it, and a fault that ended during that round
//    would otherwise show its first window after the round as the level, healthy, and never be
//    told. The GPU has recovered once a newer window's imbalance is below
//    the geometric midpoint of the level and 1 (healthy members wait alike): every culprit
//    visible and recovered means the fault has ended. A level below min_level (a mild fault, or
//    a transfer that dwarfs the compute) tells nothing: the caller keeps its re-check timer.
//  - Persistence (Verdict::seen_ns): every culprit visible and its newest window still at or above
//    that midpoint says the fault is there at that window's time, which is what a re-check round
//    would have found, without pausing the job: the caller runs its re-check timer from then.
// Thread-safety: a value type for the controller loop. Must never: send or write anything (the
// commands go out through the caller), read a clock, or trust a profile it was not given validated.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "analyzer/topology_plan.h"
#include "daemon/controller/job_view.h"
#include "daemon/controller/validation_run.h"

namespace falcon::controller {

struct WatchTarget {
  std::int64_t culprit = -1;          // global rank of the slow GPU
  std::uint64_t comm = 0;             // the communicator watched
  std::vector<std::int64_t> members;  // its members' global ranks, the culprit included
};

// Per culprit, its busiest communicator of 2..max_members members whose members are all known,
// and, where the job's `shape` is known (and has data parallelism), all in the culprit's
// replica; culprits without one are left out.
[[nodiscard]] std::vector<WatchTarget> WatchTargets(const JobView& view, const std::vector<std::int64_t>& culprits,
                                                    std::int32_t max_members = 64,
                                                    std::optional<analyzer::JobShape> shape = std::nullopt);

// The culprit's wait imbalance in `t` (above) from `profiles` (newest validated comm_profile per
// rank): nullopt unless every member has a window taken in profile mode since `from_ns` with a
// median for the signature, and the culprit's window holds at least `min_calls` of it. Read from
// receives (no collective): nullopt unless some neighbour and the culprit each received at least
// `min_calls` times from the other in such windows.
// `from_receives` (optional): set to whether it was read from receives.
[[nodiscard]] std::optional<double> WaitImbalance(const WatchTarget& t,
                                                  const std::map<std::int64_t, nlohmann::json>& profiles,
                                                  std::int64_t from_ns, std::uint64_t min_calls = 8,
                                                  bool* from_receives = nullptr);

struct RecoveryWatchOptions {
  std::string command_prefix = "ctl";  // set_mode ids are <prefix>-w<n>
  double ack_timeout_s = 5;
  double min_level = 2;
};

class RecoveryWatch {
 public:
  explicit RecoveryWatch(RecoveryWatchOptions options = {}) : options_(std::move(options)) {}

  // Starts watching `culprits` (GPU ranks): the set_mode profile commands for their targets'
  // members, one per agent host. Empty when some culprit has no target (nothing is watched then:
  // a recovery of the others would say nothing about it). Levels read in the same non-empty
  // `episode` on the same communicator are kept; any other episode starts afresh.
  std::vector<OutgoingCommand> Arm(const JobView& view, const std::vector<std::int64_t>& culprits,
                                   std::int64_t now_ns, const std::string& episode = "",
                                   std::optional<analyzer::JobShape> shape = std::nullopt);
  // Stops: the set_mode track commands for the watched ranks, and for any earlier disarm's ranks
  // not yet Delivered() (none when there are neither). A shim left in profile mode by a lost
  // command would pay for profiling until the next round: those ranks stay owed until the
  // caller says the commands went out.
  std::vector<OutgoingCommand> Disarm(const JobView& view, std::int64_t now_ns);
  // The commands of the last Disarm() were sent: nothing is owed any more.
  void Delivered() { owed_.clear(); }
  // Forgets the watch, owed ranks included, without sending anything: a round switches every
  // shim's mode itself. The episode's levels stay (see Arm).
  void Forget();

  struct Reading {
    std::int64_t culprit = -1;
    double level = 0;      // imbalance under the fault (see the header)
    double imbalance = 0;  // the newest
  };
  struct Verdict {
    bool recovered = false;         // every culprit visible and below its midpoint
    std::vector<Reading> readings;  // culprits with a level so far
    // Every culprit visible and its newest window at or above its midpoint: the oldest of those
    // windows' times (agent clocks, as the windows say), when the watch last saw the whole fault;
    // 0 when it does not see it now.
    std::int64_t seen_ns = 0;
  };
  // Reads the newest profiles: levels first, then recoveries.
  Verdict Observe(const std::map<std::int64_t, nlohmann::json>& profiles);

  [[nodiscard]] bool armed() const { return armed_; }
  [[nodiscard]] const std::vector<WatchTarget>& targets() const { return targets_; }
  // The culprit's level under the fault, once read (or kept from earlier in the episode).
  [[nodiscard]] std::optional<double> LevelOf(std::int64_t culprit) const {
    auto l = level_.find(culprit);
    return l == level_.end() ? std::nullopt : std::optional(l->second.value);
  }

 private:
  std::vector<OutgoingCommand> ModeCommands(const JobView& view, const std::string& mode,
                                           const std::set<std::int64_t>& ranks, std::int64_t now_ns);
  void Reset();  // the watch itself: targets (not the levels, nor what is owed)

  RecoveryWatchOptions options_;
  bool armed_ = false;
  std::int64_t from_ns_ = 0;
  std::uint64_t commands_ = 0;
  std::vector<WatchTarget> targets_;
  struct Level {
    double value = 0;
    std::int64_t at_ns = 0;  // the culprit's window it was read from
    std::uint64_t comm = 0;  // on which communicator
  };
  std::string episode_;
  std::map<std::int64_t, Level> level_;  // per culprit
  std::map<std::int64_t, std::int64_t> first_at_;  // per culprit: its first window since arming (not a level)
  std::set<std::int64_t> owed_;                       // ranks whose switch back to track is not known sent
};

}  // namespace falcon::controller
