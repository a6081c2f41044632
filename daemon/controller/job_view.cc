// JobView: see job_view.h.
#include "daemon/controller/job_view.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <iterator>
#include <set>
#include <utility>

#include "daemon/protocol/messages.h"

namespace falcon::controller {
namespace {

constexpr double kRateSmoothing = 0.5;  // weight of the newest rate estimate
constexpr std::size_t kMembersPerReport = 64;  // member slots one report may make the view hold

}  // namespace

RankEntry ParseRankEntry(const nlohmann::json& m, std::vector<std::uint32_t>* slots) {
  RankEntry e;
  e.live = m["state"] == "live";
  RankInfo& r = e.info;
  r.rank = m["rank"].get<std::int64_t>();
  r.host = m["host"].get<std::string>();
  r.agent_host = r.host;
  r.pid = m["pid"].get<std::int64_t>();
  r.mode = m["mode"].get<std::string>();
  if (m.contains("period")) r.period = m["period"].get<std::uint64_t>();
  r.slow = m["slow"].get<bool>();
  r.at_ns = m["at_ns"].get<std::int64_t>();
  const auto applied = m.find("plan_applied");
  if (applied != m.end() && applied->is_number_integer()) r.plan_applied = applied->get<std::int64_t>();
  for (std::size_t i = 0; i < r.cost_s.size(); ++i) {
    const auto cost = m.find("cost_s" + std::to_string(i + 2));
    if (cost != m.end() && cost->is_number() && std::isfinite(cost->get<double>()) && cost->get<double>() >= 0) {
      r.cost_s[i] = cost->get<double>();
    }
  }
  const nlohmann::json& comms = m["comms"];
  for (std::size_t i = 0; i < comms.size(); ++i) {
    const nlohmann::json& c = comms[i];
    if (!c.is_object() || !c.contains("id") || !c["id"].is_string()) continue;
    const std::optional<std::uint64_t> id = protocol::ParseCommIdHex(c["id"].get<std::string>());
    const auto rank = c.find("rank"), nranks = c.find("nranks");
    if (!id || rank == c.end() || nranks == c.end() || !rank->is_number_integer() ||
        !nranks->is_number_integer()) {
      continue;  // an entry the schema does not check deeply: skipped, never trusted
    }
    RankComm rc;
    rc.id = *id;
    rc.rank = rank->get<std::int32_t>();
    rc.nranks = nranks->get<std::int32_t>();
    if (rc.nranks < 1 || rc.nranks > protocol::kMaxCommRanks || rc.rank < 0 || rc.rank >= rc.nranks) continue;
    const auto calls = c.find("calls");
    if (calls != c.end() && calls->is_number_unsigned()) rc.calls = calls->get<std::uint64_t>();
    r.comms.push_back(rc);
    if (slots != nullptr) slots->push_back(static_cast<std::uint32_t>(i));
  }
  return e;
}

bool CommInfo::complete() const {
  return std::none_of(members.begin(), members.end(), [](std::int64_t m) { return m < 0; });
}

void JobView::Update(const std::vector<nlohmann::json>& ranks, const std::vector<nlohmann::json>& agents) {
  std::vector<RankEntry> entries;
  entries.reserve(ranks.size());
  for (const nlohmann::json& m : ranks) entries.push_back(ParseRankEntry(m));
  UpdateEntries(std::move(entries), agents);
}

void JobView::UpdateEntries(std::vector<RankEntry> ranks, const std::vector<nlohmann::json>& agents) {
  static std::atomic<std::uint64_t> updates{0};  // one sequence over every view: versions never collide
  version_ = ++updates;
  std::map<std::uint64_t, CommInfo> old = std::move(comms_);
  ranks_.clear();
  comms_.clear();
  std::set<std::int64_t> registered;
  for (RankEntry& e : ranks) {
    const std::int64_t rank = e.info.rank;
    if (rank < 0) continue;
    registered.insert(rank);
    if (!e.live) {  // the holder's process exited: its claim ends with it
      const auto claim = claims_.find(rank);
      if (claim != claims_.end() && claim->second.host == e.info.host && claim->second.pid == e.info.pid) {
        claims_.erase(claim);
      }
      continue;
    }
    ranks_[rank] = Claimed(std::move(e.info));
  }
  for (auto it = claims_.begin(); it != claims_.end();) {  // keys gone: no claim left
    it = registered.count(it->first) ? std::next(it) : claims_.erase(it);
  }
  // A member table is sized by the communicator's nranks, a claim: it is built only when at
  // least 1 in kMembersPerReport of its members reported it, so memory stays proportional to
  // the reports (kMembersPerReport slots each at most), never to what one message claims. A
  // real communicator is kept with half its ranks gone (an agent died) or while the job starts.
  std::map<std::uint64_t, std::size_t> reports;
  for (const auto& [rank, r] : ranks_) {
    for (const RankComm& rc : r.comms) ++reports[rc.id];
  }
  std::set<std::string> hosts;
  for (const auto& [rank, r] : ranks_) {
    hosts.insert(r.host);
    for (const RankComm& rc : r.comms) {
      if (static_cast<std::size_t>(rc.nranks) > kMembersPerReport * reports[rc.id]) continue;
      CommInfo& c = comms_[rc.id];
      if (c.members.empty()) {
        c.id = rc.id;
        c.nranks = rc.nranks;
        c.members.assign(static_cast<std::size_t>(rc.nranks), -1);
      }
      if (rc.nranks != c.nranks) continue;  // disagreeing members: the first one wins
      c.members[static_cast<std::size_t>(rc.rank)] = rank;
      if (rc.calls >= c.max_calls) {
        c.max_calls = rc.calls;
        c.max_calls_at_ns = r.at_ns;
      }
    }
  }
  for (auto& [id, c] : comms_) {
    auto was = old.find(id);
    if (was == old.end()) continue;
    c.calls_per_s = was->second.calls_per_s;
    const double dt = static_cast<double>(c.max_calls_at_ns - was->second.max_calls_at_ns) * 1e-9;
    if (dt > 0 && c.max_calls >= was->second.max_calls) {
      const double rate = static_cast<double>(c.max_calls - was->second.max_calls) / dt;
      c.calls_per_s = c.calls_per_s > 0 ? kRateSmoothing * rate + (1 - kRateSmoothing) * c.calls_per_s
                                        : rate;
    } else if (dt == 0) {
      c.max_calls_at_ns = was->second.max_calls_at_ns;  // same report: keep measuring from it
      c.max_calls = std::max(c.max_calls, was->second.max_calls);
    }
  }
  hosts_.assign(hosts.begin(), hosts.end());
  IndexNodes();
  agent_hosts_ = hosts_;
  ApplyNodes();
  std::set<std::string> live, broadcast;
  for (const nlohmann::json& a : agents) {
    live.insert(a["host"].get<std::string>());
    if (a.value("broadcast", false)) broadcast.insert(a["host"].get<std::string>());
  }
  agents_.assign(live.begin(), live.end());
  broadcast_ = !agent_hosts_.empty() &&
               std::all_of(agent_hosts_.begin(), agent_hosts_.end(), [&](const std::string& h) { return broadcast.count(h) != 0; });
}

const RankInfo& JobView::Claimed(RankInfo r) {
  const auto [it, fresh] = claims_.try_emplace(r.rank);
  Claim& c = it->second;
  const bool same = c.host == r.agent_host && c.pid == r.pid;
  if (fresh || same || r.at_ns - c.at_ns > kClaimHoldNs) {
    if (!fresh && !same) {
      claim_events_.push_back({RankClaimEvent::Kind::kHandover, r.rank, c.host, c.pid, r.agent_host, r.pid});
      c.reported.clear();
    }
    c.host = r.agent_host;
    c.pid = r.pid;
    c.at_ns = std::max(c.at_ns, r.at_ns);
    c.info = std::move(r);
    return c.info;
  }
  if (c.reported.emplace(r.agent_host, r.pid).second) {
    claim_events_.push_back({RankClaimEvent::Kind::kConflict, r.rank, c.host, c.pid, r.agent_host, r.pid});
  }
  return c.info;
}

std::vector<RankClaimEvent> JobView::TakeClaimEvents() { return std::exchange(claim_events_, {}); }

void JobView::SetNodes(std::vector<std::string> hosts, std::vector<std::int32_t> placement) {
  node_hosts_ = std::move(hosts);
  placement_ = std::move(placement);
  ApplyNodes();
}

void JobView::ApplyNodes() {
  if (node_hosts_.empty()) return;  // default numbering: sorted hosts
  std::vector<std::string> hosts = node_hosts_;
  for (const std::string& h : hosts_) {  // a host the numbering does not know yet goes last
    if (std::find(hosts.begin(), hosts.end(), h) == hosts.end()) hosts.push_back(h);
  }
  hosts_ = std::move(hosts);
  IndexNodes();
  for (auto& [rank, r] : ranks_) {
    if (rank >= 0 && static_cast<std::size_t>(rank) < placement_.size() && placement_[static_cast<std::size_t>(rank)] >= 0 &&
        static_cast<std::size_t>(placement_[static_cast<std::size_t>(rank)]) < hosts_.size()) {
      r.host = hosts_[static_cast<std::size_t>(placement_[static_cast<std::size_t>(rank)])];
    }
  }
}

void JobView::IndexNodes() {
  node_of_host_.clear();
  for (std::size_t i = 0; i < hosts_.size(); ++i) node_of_host_.emplace(hosts_[i], static_cast<std::int32_t>(i));
}

std::int32_t JobView::NodeOf(std::int64_t rank) const {
  const std::string* h = HostOf(rank);
  if (h == nullptr) return -1;
  const auto it = node_of_host_.find(*h);
  return it == node_of_host_.end() ? -1 : it->second;
}

const std::string* JobView::AgentOf(std::int64_t rank) const {
  auto it = ranks_.find(rank);
  return it == ranks_.end() ? nullptr : &it->second.agent_host;
}

const std::string* JobView::HostOf(std::int64_t rank) const {
  auto it = ranks_.find(rank);
  return it == ranks_.end() ? nullptr : &it->second.host;
}

std::optional<std::uint64_t> JobView::CutComm() const {
  std::optional<std::uint64_t> best;
  std::size_t best_size = 0;
  double best_rate = 0;
  for (const auto& [id, c] : comms_) {
    if (!c.complete() || c.calls_per_s <= 0) continue;
    const std::size_t size = c.members.size();
    if (size != ranks_.size()) continue;  // must stop every live rank
    if (!best || size > best_size || (size == best_size && c.calls_per_s > best_rate)) {
      best = id;
      best_size = size;
      best_rate = c.calls_per_s;
    }
  }
  return best;
}

std::optional<std::uint64_t> JobView::Period() const {
  std::map<std::uint64_t, int> votes;
  for (const auto& [rank, r] : ranks_) {
    if (r.period) ++votes[*r.period];
  }
  std::optional<std::uint64_t> best;
  int most = 0;
  for (const auto& [p, n] : votes) {
    if (n > most) {
      best = p;
      most = n;
    }
  }
  return best;
}

std::vector<std::uint64_t> SweepComms(const JobView& view) {
  std::vector<std::uint64_t> out;
  for (const auto& [id, c] : view.comms()) {
    if (c.members.size() >= 2) out.push_back(id);
  }
  return out;
}

}  // namespace falcon::controller
