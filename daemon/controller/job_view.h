// JobView: the controller's picture of the job, rebuilt from the agents' rank keys and heartbeats
// (rank_register / agent_heartbeat messages, already validated): which ranks are live and on
// which host, the communicators with their members in comm-rank order and how far each has got
// (calls, and a call rate estimated between updates), and which agents are alive.
// Node indices are the hosts' positions in sorted order: the same host is the same node — unless
// SetNodes fixed the numbering (the controller does once a mitigation plan names nodes, so plan
// indices keep their meaning) and, after an S3/S4 plan was applied in place (the framework moved
// ranks between nodes while their processes, and so the agents reporting them, stayed put, as in
// the emulated trainer), which node each rank now runs on.
// One rank, one claimant: a rank's key is written by whichever agent follows a process with that
// rank, so a second process claiming an existing rank (another host, or another pid) overwrites
// the first one's registration, and the two alternate at every heartbeat. The view keeps the
// claimant it saw first (host and pid) while that claimant's registrations keep arriving, each
// within kClaimHoldNs of the one before (by the registrations' own at_ns: no clock here); the
// other's are set aside, and the rank keeps the holder's last registration. The rank passes to
// another claimant only when the holder has been silent that long, or registered itself exited,
// or the rank's key is gone. Each conflict is reported once (TakeClaimEvents), naming both, and
// so is a hand-over; the controller logs them.
// Thread-safety: a value type; one thread. Must never: do I/O, or trust a message it was not
// given validated.
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace falcon::controller {

struct RankComm {
  std::uint64_t id = 0;
  std::int32_t rank = -1;  // rank within the communicator
  std::int32_t nranks = 0;
  std::uint64_t calls = 0;
};

struct RankInfo {
  std::int64_t rank = -1;
  std::string host;        // the node it runs on (after SetNodes' placement)
  std::string agent_host;  // the agent that reports it: where its commands go
  std::int64_t pid = 0;
  std::string mode;
  std::optional<std::uint64_t> period;
  bool slow = false;
  std::int64_t at_ns = 0;  // when its agent wrote the registration
  std::int64_t plan_applied = 0;  // last mitigation plan version its framework applied
  // What applying S2, S3, S4 costs this rank, seconds, as its framework reported it
  // (falconReportCost; index strategy - 2); unset while not reported.
  std::array<std::optional<double>, 4> cost_s;  // S2, S3, S4, pipeline (rank_register cost_s2..cost_s5)
  std::vector<RankComm> comms;
};

// A rank key's registration as the view takes it: what the view reads of it, a few hundred bytes
// where the parsed message takes kilobytes (the controller holds one per rank between re-reads).
struct RankEntry {
  RankInfo info;
  bool live = true;  // its state is "live" (not exited or orphaned)
};

// The entry of a validated rank_register. Communicator entries the schema does not check deeply
// are skipped, never trusted; `slots`, when given, gets each of info.comms' index in m's comms.
[[nodiscard]] RankEntry ParseRankEntry(const nlohmann::json& m, std::vector<std::uint32_t>* slots = nullptr);

struct CommInfo {
  std::uint64_t id = 0;
  std::int32_t nranks = 0;
  std::vector<std::int64_t> members;  // global rank per comm rank; -1 = not (yet) registered
  std::uint64_t max_calls = 0;        // furthest member
  std::int64_t max_calls_at_ns = 0;   // when that member's agent reported it
  double calls_per_s = 0;             // smoothed over view updates; 0 until two updates
  [[nodiscard]] bool complete() const;  // every member known
};

// What the view did about two claimants of one rank (see the file comment).
struct RankClaimEvent {
  enum class Kind { kConflict, kHandover };
  Kind kind = Kind::kConflict;
  std::int64_t rank = -1;
  std::string holder_host;  // kHandover: the previous holder
  std::int64_t holder_pid = 0;
  std::string claimant_host;  // kHandover: the new holder
  std::int64_t claimant_pid = 0;
};

class JobView {
 public:
  // A holder silent for longer than this gives its rank up to another claimant (the agents'
  // default rank-key TTL: a live agent re-registers every heartbeat, 2 s by default).
  static constexpr std::int64_t kClaimHoldNs = 10'000'000'000;

  // Replaces the view with these registrations (live ones only; exited/orphaned ranks are left
  // out) and heartbeats, keeping call-rate history (rates are measured between the agents'
  // report times, so a stale report does not skew them). A communicator reported by fewer than
  // 1 in 64 of its claimed members is left out: memory grows with the reports, not with the
  // sizes they claim.
  void UpdateEntries(std::vector<RankEntry> ranks, const std::vector<nlohmann::json>& agents);
  // The same from validated rank_register messages (ParseRankEntry).
  void Update(const std::vector<nlohmann::json>& ranks, const std::vector<nlohmann::json>& agents);

  const std::map<std::int64_t, RankInfo>& ranks() const { return ranks_; }
  // Changes with every Update, and no two views' updates share one (0: never updated): what is
  // computed from the live ranks can be kept until it changes.
  [[nodiscard]] std::uint64_t version() const { return version_; }
  const std::map<std::uint64_t, CommInfo>& comms() const { return comms_; }
  const std::vector<std::string>& agents() const { return agents_; }  // live agent hosts, sorted
  // Hosts that run live ranks, sorted (or in SetNodes' order, then hosts it did not list); a
  // rank's node is its host's index here (-1 if unknown).
  const std::vector<std::string>& hosts() const { return hosts_; }
  // Fixes the node numbering to `hosts` (node i = hosts[i]; may name idle spares) and, where
  // placement has an entry, puts rank r on node placement[r] whatever host its agent reports.
  // Kept across Update calls. Empty hosts: back to sorted hosts.
  void SetNodes(std::vector<std::string> hosts, std::vector<std::int32_t> placement);
  [[nodiscard]] std::int32_t NodeOf(std::int64_t rank) const;
  [[nodiscard]] const std::string* HostOf(std::int64_t rank) const;
  // The agent host that follows `rank` (commands for it go there), nullptr if unknown; and every
  // agent host that follows a live rank, sorted.
  [[nodiscard]] const std::string* AgentOf(std::int64_t rank) const;
  const std::vector<std::string>& agent_hosts() const { return agent_hosts_; }
  // Every agent host reads the broadcast command stream (its heartbeat says `broadcast`): a
  // command for all of them can go as one entry there. False with no agent host, or while any
  // of them runs an agent that reads its own stream only (or has no live heartbeat).
  [[nodiscard]] bool Broadcast() const { return broadcast_; }
  // The communicator whose members are all live ranks (the world, or the largest one that spans
  // the job) with a known call rate: the one pause cuts are placed on. nullopt when none.
  [[nodiscard]] std::optional<std::uint64_t> CutComm() const;
  // Most common period over ranks that have one.
  [[nodiscard]] std::optional<std::uint64_t> Period() const;
  // Conflicts and hand-overs since the last call, each conflict once per (rank, holder,
  // claimant) while it lasts.
  std::vector<RankClaimEvent> TakeClaimEvents();

 private:
  void IndexNodes();  // after hosts_ changes

  std::map<std::int64_t, RankInfo> ranks_;
  std::uint64_t version_ = 0;
  std::map<std::uint64_t, CommInfo> comms_;
  std::vector<std::string> agents_;
  std::vector<std::string> hosts_;
  std::vector<std::string> agent_hosts_;
  bool broadcast_ = false;
  std::vector<std::string> node_hosts_;    // SetNodes
  std::vector<std::int32_t> placement_;    // SetNodes
  std::map<std::string, std::int32_t> node_of_host_;  // hosts_ indexed: NodeOf is a lookup
  struct Claim {
    std::string host;  // the agent that reports it
    std::int64_t pid = 0;
    std::int64_t at_ns = 0;  // its newest registration
    RankInfo info;           // that registration, as parsed
    std::set<std::pair<std::string, std::int64_t>> reported;  // claimants reported as conflicts
  };
  std::map<std::int64_t, Claim> claims_;  // rank -> holder
  std::vector<RankClaimEvent> claim_events_;
  // The registration rank `r.rank` keeps this update: `r` itself, or its holder's last one.
  const RankInfo& Claimed(RankInfo r);
  void ApplyNodes();
};

// The communicators a validation sweep tests: every one of two or more members, by id.
[[nodiscard]] std::vector<std::uint64_t> SweepComms(const JobView& view);

}  // namespace falcon::controller
