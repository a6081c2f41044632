// A slow GPU's recovery under re-balanced micro-batches: see recovery_watch.h.
#include "daemon/controller/recovery_watch.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "analyzer/robust.h"
#include "analyzer/topology_plan.h"
#include "daemon/controller/profile_analysis.h"
#include "daemon/controller/profiling_stage.h"
#include "daemon/protocol/messages.h"

namespace falcon::controller {
namespace {

using nlohmann::json;

// The entry of communicator `comm` in a validated comm_profile, nullptr if absent.
const json* CommEntry(const json& profile, std::uint64_t comm) {
  for (const json& c : profile["comms"]) {
    if (!c.is_object() || !c.contains("id") || !c["id"].is_string() || !c.contains("sigs") || !c["sigs"].is_array()) {
      continue;
    }
    const std::optional<std::uint64_t> id = protocol::ParseCommIdHex(c["id"].get<std::string>());
    if (id && *id == comm) return &c;
  }
  return nullptr;
}

bool PointToPoint(const std::string& op) { return op == "Send" || op == "Recv"; }

// The newest window of `rank` taken in profile mode since from_ns, nullptr if none.
const json* Window(const std::map<std::int64_t, json>& profiles, std::int64_t rank, std::int64_t from_ns) {
  auto p = profiles.find(rank);
  if (p == profiles.end() || p->second["mode"] != "profile" || p->second["since_ns"].get<std::int64_t>() < from_ns) {
    return nullptr;
  }
  return &p->second;
}

// The median time of the busiest signature of `op` from or to comm rank `peer` in a profile
// entry that was called at least min_calls times; NaN if none.
double BusiestP2p(const json& entry, const std::string& op, std::int64_t peer, std::uint64_t min_calls) {
  double median = std::nan(""), most = 0;
  for (const json& s : entry["sigs"]) {
    if (!s.is_object() || !s.contains("op") || s["op"] != op || ProfileNumber(s, "peer") != static_cast<double>(peer)) {
      continue;
    }
    const double m = ProfileNumber(s, "median_us"), count = ProfileNumber(s, "count");
    if (!std::isfinite(m) || m < 0 || !(count >= static_cast<double>(min_calls)) || count <= most) continue;
    median = m;
    most = count;
  }
  return median;
}

// A communicator the culprit only exchanges on (a pipeline's, at TP 1): the same wait, read from
// receives. Whoever receives from a slow GPU waits for it; the slow GPU, arriving late, finds its
// neighbours' data there. The median over its neighbours of their receives from it, over the
// median of its receives from them; nullopt unless some neighbour has both in windows taken in
// profile mode since from_ns.
std::optional<double> ExchangeImbalance(const WatchTarget& t, const json& own_entry,
                                        const std::map<std::int64_t, json>& profiles, std::int64_t from_ns,
                                        std::uint64_t min_calls) {
  const auto at = std::find(t.members.begin(), t.members.end(), t.culprit);
  if (at == t.members.end()) return std::nullopt;
  const auto own_rank = static_cast<std::int64_t>(at - t.members.begin());  // members are in comm-rank order
  std::vector<double> theirs, own;
  for (std::size_t j = 0; j < t.members.size(); ++j) {
    if (static_cast<std::int64_t>(j) == own_rank) continue;
    const double mine = BusiestP2p(own_entry, "Recv", static_cast<std::int64_t>(j), min_calls);
    if (!std::isfinite(mine)) continue;  // not a neighbour of the culprit
    const json* w = Window(profiles, t.members[j], from_ns);
    const json* e = w == nullptr ? nullptr : CommEntry(*w, t.comm);
    if (e == nullptr) return std::nullopt;
    const double other = BusiestP2p(*e, "Recv", own_rank, min_calls);
    if (!std::isfinite(other)) continue;
    own.push_back(mine);
    theirs.push_back(other);
  }
  if (own.empty()) return std::nullopt;
  std::vector<double> scratch;
  const double num = analyzer::Median(theirs, scratch), den = analyzer::Median(own, scratch);
  return std::max(num, 1.0) / std::max(den, 1.0);
}

}  // namespace

std::vector<WatchTarget> WatchTargets(const JobView& view, const std::vector<std::int64_t>& culprits,
                                      std::int32_t max_members, std::optional<analyzer::JobShape> shape) {
  const auto world = static_cast<std::int64_t>(view.ranks().size());
  if (shape && (shape->dp < 2 || std::int64_t{shape->tp} * shape->dp * shape->pp != world)) shape.reset();
  auto replica = [&](std::int64_t rank) {
    return analyzer::CoordOf(*shape, static_cast<std::int32_t>(rank)).dp_index;
  };
  std::vector<WatchTarget> out;
  for (const std::int64_t culprit : culprits) {
    auto r = view.ranks().find(culprit);
    if (r == view.ranks().end()) continue;
    const RankComm* best = nullptr;
    for (const RankComm& c : r->second.comms) {
      if (c.nranks < 2 || c.nranks > max_members) continue;
      auto info = view.comms().find(c.id);
      if (info == view.comms().end() || !info->second.complete()) continue;
      // Re-balanced micro-batches even out the replicas, and with them the waits of a group that
      // spans them (data parallelism): only a group inside the culprit's replica keeps its wait.
      const std::vector<std::int64_t>& members = info->second.members;
      if (shape && culprit < world && std::any_of(members.begin(), members.end(), [&](std::int64_t m) {
            return m < 0 || m >= world || replica(m) != replica(culprit);
          })) {
        continue;
      }
      if (best == nullptr || c.calls > best->calls) best = &c;
    }
    if (best == nullptr || best->calls == 0) continue;
    out.push_back({culprit, best->id, view.comms().at(best->id).members});
  }
  return out;
}

std::optional<double> WaitImbalance(const WatchTarget& t, const std::map<std::int64_t, json>& profiles,
                                    std::int64_t from_ns, std::uint64_t min_calls, bool* from_receives) {
  if (from_receives != nullptr) *from_receives = false;
  const json* own = Window(profiles, t.culprit, from_ns);
  const json* entry = own == nullptr ? nullptr : CommEntry(*own, t.comm);
  if (entry == nullptr) return std::nullopt;
  // The busiest collective signature with a timing in the culprit's window.
  const json* sig = nullptr;
  for (const json& s : (*entry)["sigs"]) {
    if (!s.is_object() || !s.contains("op") || !s["op"].is_string() || PointToPoint(s["op"].get<std::string>())) continue;
    const double median = ProfileNumber(s, "median_us"), count = ProfileNumber(s, "count");
    if (!std::isfinite(median) || median < 0 || !(count >= static_cast<double>(min_calls))) continue;
    if (sig == nullptr || count > ProfileNumber(*sig, "count")) sig = &s;
  }
  if (sig == nullptr) {
    if (from_receives != nullptr) *from_receives = true;
    return ExchangeImbalance(t, *entry, profiles, from_ns, min_calls);
  }
  const std::string op = (*sig)["op"].get<std::string>();
  const double bytes = ProfileNumber(*sig, "bytes");
  std::vector<double> others;
  for (const std::int64_t m : t.members) {
    if (m == t.culprit) continue;
    const json* w = Window(profiles, m, from_ns);
    const json* e = w == nullptr ? nullptr : CommEntry(*w, t.comm);
    if (e == nullptr) return std::nullopt;
    double median = std::nan("");
    for (const json& s : (*e)["sigs"]) {
      if (s.is_object() && s.contains("op") && s["op"] == op && ProfileNumber(s, "bytes") == bytes) median = ProfileNumber(s, "median_us");
    }
    if (!std::isfinite(median) || median < 0) return std::nullopt;
    others.push_back(median);
  }
  if (others.empty()) return std::nullopt;
  std::vector<double> scratch;
  const double mid = analyzer::Median(others, scratch);
  // A microsecond floor: a culprit's median of 0 (timer resolution) must not divide by zero.
  return std::max(mid, 1.0) / std::max(ProfileNumber(*sig, "median_us"), 1.0);
}

std::vector<OutgoingCommand> RecoveryWatch::ModeCommands(const JobView& view, const std::string& mode,
                                                         const std::set<std::int64_t>& ranks, std::int64_t now_ns) {
  std::map<std::string, std::set<std::int64_t>> by_host;
  for (const std::int64_t m : ranks) {
    if (const std::string* host = view.AgentOf(m)) by_host[*host].insert(m);
  }
  std::vector<OutgoingCommand> out;
  for (const auto& [host, on_host] : by_host) {
    out.push_back({host, SetModeCommand(options_.command_prefix + "-w" + std::to_string(++commands_), mode, now_ns,
                                        options_.ack_timeout_s, std::vector<std::int64_t>(on_host.begin(), on_host.end()))});
  }
  return out;
}

std::vector<OutgoingCommand> RecoveryWatch::Arm(const JobView& view, const std::vector<std::int64_t>& culprits,
                                                std::int64_t now_ns, const std::string& episode,
                                                std::optional<analyzer::JobShape> shape) {
  Reset();
  if (episode.empty() || episode != episode_) level_.clear();
  episode_ = episode;
  targets_ = WatchTargets(view, culprits, 64, shape);
  std::erase_if(level_, [&](const auto& l) {
    return std::none_of(targets_.begin(), targets_.end(),
                        [&](const WatchTarget& t) { return t.culprit == l.first && t.comm == l.second.comm; });
  });
  // A culprit without a group to watch could stay slow unseen: then the watch tells nothing.
  if (targets_.empty() || targets_.size() != std::set<std::int64_t>(culprits.begin(), culprits.end()).size()) {
    targets_.clear();
    return {};
  }
  armed_ = true;
  from_ns_ = now_ns;
  std::set<std::int64_t> members;
  for (const WatchTarget& t : targets_) members.insert(t.members.begin(), t.members.end());
  for (const std::int64_t m : members) owed_.erase(m);  // profiled again: no longer owed a switch back
  return ModeCommands(view, "profile", members, now_ns);
}

std::vector<OutgoingCommand> RecoveryWatch::Disarm(const JobView& view, std::int64_t now_ns) {
  for (const WatchTarget& t : targets_) owed_.insert(t.members.begin(), t.members.end());
  Reset();
  return owed_.empty() ? std::vector<OutgoingCommand>{} : ModeCommands(view, "track", owed_, now_ns);
}

void RecoveryWatch::Reset() {
  armed_ = false;
  targets_.clear();
  first_at_.clear();
}

void RecoveryWatch::Forget() {
  Reset();
  owed_.clear();
}

RecoveryWatch::Verdict RecoveryWatch::Observe(const std::map<std::int64_t, json>& profiles) {
  Verdict v;
  if (!armed_) return v;
  bool all = true;
  bool seen = true;
  std::int64_t seen_ns = 0;
  for (const WatchTarget& t : targets_) {
    bool from_receives = false;
    const std::optional<double> now = WaitImbalance(t, profiles, from_ns_, 8, &from_receives);
    const json* own = Window(profiles, t.culprit, from_ns_);
    const std::int64_t at = own == nullptr ? 0 : (*own)["at_ns"].get<std::int64_t>();
    if (now && !level_.contains(t.culprit)) {
      const auto [first, fresh] = first_at_.try_emplace(t.culprit, at);
      if (!fresh && at > first->second) level_[t.culprit] = {*now, at, t.comm};
    }
    auto l = level_.find(t.culprit);
    if (l == level_.end()) {
      all = false;
      seen = false;
      continue;
    }
    const Level& level = l->second;
    v.readings.push_back({t.culprit, level.value, now.value_or(0)});
    // Visible, and a newer window than the level's below the geometric midpoint of it and 1.
    const bool visible = level.value >= options_.min_level;
    // Receives wait in bursts (the pipeline's schedule): their ratio ran 0.07-78x under one fault
    // in the TP 1 e2e runs, against about 1.5x healthy. Read from them, a recovery must also be a
    // pair that waits alike, within min_level either way, not just a quieter window under the
    // fault, nor one where the culprit waits for its neighbour.
    const bool alike = !from_receives || (now && *now < options_.min_level && *now * options_.min_level > 1);
    const bool recovered = visible && now && at > level.at_ns && *now < std::sqrt(level.value) && alike;
    all = all && recovered;
    // The level's own window counts: a visible level was read under the fault.
    const bool persists = visible && now && at >= level.at_ns && *now >= std::sqrt(level.value);
    seen = seen && persists;
    if (persists) seen_ns = seen_ns == 0 ? at : std::min(seen_ns, at);
  }
  v.recovered = all && !v.readings.empty();
  v.seen_ns = seen && !v.readings.empty() ? seen_ns : 0;
  return v;
}

}  // namespace falcon::controller
