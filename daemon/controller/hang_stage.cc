// HangStage: see hang_stage.h.
#include "daemon/controller/hang_stage.h"

#include <algorithm>

#include "daemon/protocol/messages.h"
#include "daemon/shm/progress_json.h"
#include "falcon/protocol.h"

namespace falcon::controller {

using nlohmann::json;

namespace {

constexpr std::int64_t kNsPerS = 1'000'000'000;

std::string RankList(const std::vector<std::int64_t>& ranks) {
  std::string out;
  for (std::int64_t r : ranks) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out;
}

json SignatureJson(const analyzer::CallSignature& s) {
  json j = {{"op", analyzer::CallOpName(s.op)}, {"count", s.count}, {"peer", s.peer}};
  if (s.dtype != 0xFF) j["dtype"] = s.dtype;
  if (s.redop >= 0) j["redop"] = s.redop;
  return j;
}

}  // namespace

const char* HangStageName(analyzer::FindingKind k) {
  switch (k) {
    case analyzer::FindingKind::kNotIssued:
    case analyzer::FindingKind::kNotCompleting: return "hang";
    case analyzer::FindingKind::kMismatch: return "mismatch";
    case analyzer::FindingKind::kDeadlock: return "deadlock";
    case analyzer::FindingKind::kDisorder: return "disorder";
  }
  return "hang";
}

void HangStage::OnStall(const json& m) {
  const std::int64_t rank = m["rank"].get<std::int64_t>();
  if (rank < 0) return;
  if (m["kind"] == "stalled") {
    stalled_[rank] = m;
  } else {
    stalled_.erase(rank);
  }
}

bool HangStage::OnAck(const json& m) {
  const auto it = asked_.find(m["command"].get<std::string>());
  if (it == asked_.end()) return false;
  answered_hosts_.insert(it->second);
  // By reference: json::value would copy every rank's progress (up to 256 calls each).
  const auto results = m.find("results");
  if (results == m.end() || !results->is_array()) return true;
  for (const json& r : *results) {
    if (const auto p = r.find("progress"); p != r.end() && p->is_object()) answers_.push_back(*p);
  }
  return true;
}

std::vector<OutgoingCommand> HangStage::Next(const JobView& view, std::int64_t now_ns) {
  // A report of a process that is gone (exited, or a rank number now held by another process:
  // a restarted job) is no stall of this job. A view with no rank at all (not read yet, or
  // Redis refused it) tells nothing: nothing is dropped then.
  for (auto it = stalled_.begin(); !view.ranks().empty() && it != stalled_.end();) {
    const auto r = view.ranks().find(it->first);
    const bool live = r != view.ranks().end() && r->second.pid == it->second["pid"].get<std::int64_t>();
    it = live ? std::next(it) : stalled_.erase(it);
  }
  if (!asked_.empty()) {
    if (answered_hosts_.size() < asked_.size() && now_ns < answers_deadline_ns_) return {};
    Conclude(view, now_ns);
  }
  if (stalled_.empty()) {
    if (!episode_.empty()) {
      const double s = static_cast<double>(now_ns - episode_opened_ns_) / 1e9;
      char summary[160];
      std::snprintf(summary, sizeof summary, "no rank is stalled any more, %.0f s after the hang was reported", s);
      records_.push_back({"resolution", summary, {{"id", episode_}, {"at_ns", now_ns}, {"detail", {{"hang_s", s}}}},
                          "info"});
      episode_.clear();
    }
    return {};
  }
  if (episode_.empty()) {
    episode_ = "hang-" + std::to_string(now_ns / 1'000'000) + "-" + std::to_string(++episodes_);
    episode_opened_ns_ = now_ns;
    next_diagnosis_ns_ = now_ns;
    reported_.clear();
    reported_nothing_ = false;
  }
  if (now_ns < next_diagnosis_ns_ || view.agent_hosts().empty()) return {};
  std::vector<OutgoingCommand> out;
  answers_.clear();
  answered_hosts_.clear();
  answers_deadline_ns_ = now_ns + static_cast<std::int64_t>(options_.answer_wait_s * kNsPerS);
  for (const std::string& host : view.agent_hosts()) {
    protocol::Command c;
    c.type = std::string(protocol::kProgressCommand.type);
    c.id = episode_ + "-p" + std::to_string(++commands_);
    c.issued_ns = now_ns;
    c.deadline_ns = answers_deadline_ns_;
    c.calls = options_.calls;
    asked_[c.id] = host;
    out.push_back({host, std::move(c)});
  }
  return out;
}

void HangStage::Conclude(const JobView& view, std::int64_t now_ns) {
  std::vector<analyzer::RankProgress> ranks;
  std::set<std::int64_t> seen;
  for (const json& one : answers_) {
    std::optional<analyzer::RankProgress> parsed = daemon::ParseProgressRank(one, nullptr);
    if (!parsed) continue;  // a bad rank costs only itself
    if (seen.insert(parsed->rank).second) ranks.push_back(std::move(*parsed));
  }
  std::vector<std::string> silent;
  for (const auto& [id, host] : asked_) {
    if (answered_hosts_.count(host) == 0) silent.push_back(host);
  }
  asked_.clear();
  answers_.clear();
  next_diagnosis_ns_ = now_ns + static_cast<std::int64_t>(options_.repeat_s * kNsPerS);
  if (stalled_.empty()) return;  // it moved on meanwhile
  ++diagnoses_;
  const std::vector<analyzer::Finding> findings = analyzer::DiagnoseHang(ranks);
  // Calls never issued by the same culprits are one entry (one root cause held up several
  // communicators); every other finding is its own.
  std::map<std::vector<std::int64_t>, std::vector<const analyzer::Finding*>> by_culprits;
  std::vector<std::vector<const analyzer::Finding*>> groups;
  for (const analyzer::Finding& f : findings) {
    if (f.kind == analyzer::FindingKind::kNotIssued && !f.culprits.empty()) {
      by_culprits[f.culprits].push_back(&f);
    } else {
      groups.push_back({&f});
    }
  }
  // Ranks held behind device work that does not complete are that finding's, not another root
  // cause: a not-issued group joins a not-completing call when each of its culprits is a member
  // of that call, or its own stuck work is on a communicator shared with one (its device waits
  // for a peer whose device is held there).
  std::map<std::uint64_t, std::set<std::int64_t>> members_of;  // communicator -> ranks that hold it
  for (const analyzer::RankProgress& r : ranks) {
    for (const analyzer::CommProgress& c : r.comms) members_of[c.comm].insert(r.rank);
  }
  auto first_pending_comm = [&ranks](std::int64_t rank) -> std::uint64_t {
    for (const analyzer::RankProgress& r : ranks) {
      if (r.rank != rank) continue;
      const analyzer::IssuedCall* first = nullptr;
      for (const analyzer::CommProgress& c : r.comms) {
        if (!c.completion_known || c.completed >= c.issued) continue;
        for (const analyzer::IssuedCall& i : r.recent) {
          if (i.comm == c.comm && i.seq == c.completed && (first == nullptr || i.issue_ns < first->issue_ns)) first = &i;
        }
      }
      return first != nullptr ? first->comm : 0;
    }
    return 0;
  };
  for (auto& [culprits, group] : by_culprits) {
    std::vector<const analyzer::Finding*>* home = nullptr;
    for (std::vector<const analyzer::Finding*>& g : groups) {
      const analyzer::Finding& nc = *g.front();
      if (nc.kind != analyzer::FindingKind::kNotCompleting) continue;
      std::set<std::int64_t> members(nc.waiting.begin(), nc.waiting.end());
      members.insert(nc.culprits.begin(), nc.culprits.end());
      auto held_there = [&](std::int64_t r) {
        if (members.count(r) != 0) return true;
        const auto shared = members_of.find(first_pending_comm(r));
        return shared != members_of.end() &&
               std::any_of(shared->second.begin(), shared->second.end(), [&](std::int64_t m) { return members.count(m) != 0; });
      };
      if (std::all_of(culprits.begin(), culprits.end(), held_there)) {
        home = &g;
        break;
      }
    }
    if (home != nullptr) {
      home->insert(home->end(), group.begin(), group.end());
    } else {
      groups.insert(groups.begin(), group);
    }
  }
  for (const std::vector<const analyzer::Finding*>& group : groups) {
    const analyzer::Finding& f = *group.front();
    const std::string key = std::string(analyzer::FindingKindName(f.kind)) + "/" +
                            (f.kind == analyzer::FindingKind::kNotIssued && !f.culprits.empty()
                                 ? "culprits " + RankList(f.culprits)
                                 : protocol::CommIdHex(f.comm) + "/" + std::to_string(f.seq));
    if (!reported_.insert(key).second) continue;
    HangRecord r = FindingRecord(group, view, now_ns);
    r.fields["detail"]["ranks_read"] = ranks.size();
    r.fields["detail"]["agents_silent"] = silent;
    records_.push_back(std::move(r));
  }
  if (findings.empty() && reported_.empty() && !reported_nothing_) {
    reported_nothing_ = true;
    std::vector<std::int64_t> stalled;
    for (const auto& [rank, m] : stalled_) stalled.push_back(rank);
    records_.push_back({"hang",
                        std::to_string(stalled.size()) + " rank(s) stalled in NCCL (" + RankList(stalled) +
                            "), but the progress of the " + std::to_string(ranks.size()) +
                            " rank(s) read names no culprit" +
                            (silent.empty() ? std::string() : " (agents silent: " + std::to_string(silent.size()) + ")"),
                        {{"id", episode_},
                         {"at_ns", now_ns},
                         {"ranks", stalled},
                         {"detail", {{"kind", "unexplained"}, {"ranks_read", ranks.size()}, {"agents_silent", silent}}}},
                        "critical"});
  }
}

HangRecord HangStage::FindingRecord(const std::vector<const analyzer::Finding*>& group, const JobView& view,
                                    std::int64_t now_ns) const {
  std::vector<std::int64_t> stalled;
  for (const auto& [rank, m] : stalled_) stalled.push_back(rank);
  return FindingEntry(group, view, now_ns, episode_, stalled);
}

HangRecord FindingEntry(const std::vector<const analyzer::Finding*>& group, const JobView& view, std::int64_t now_ns,
                        const std::string& id, const std::vector<std::int64_t>& stalled) {
  const analyzer::Finding& f = *group.front();
  std::set<std::int64_t> waiting;
  std::set<std::string> comms;
  json each = json::array();
  for (const analyzer::Finding* g : group) {
    waiting.insert(g->waiting.begin(), g->waiting.end());
    if (g->comm != 0) comms.insert(protocol::CommIdHex(g->comm));
    json chain = json::array();
    for (const analyzer::CallRef& c : g->chain) {
      chain.push_back({{"rank", c.rank}, {"comm", protocol::CommIdHex(c.comm)},
                       {"seq", c.seq == ~std::uint64_t{0} ? json(nullptr) : json(c.seq)}});
    }
    json sigs = json::array();
    for (const auto& [rank, sig] : g->signatures) {
      json s = SignatureJson(sig);
      s["rank"] = rank;
      sigs.push_back(std::move(s));
    }
    each.push_back({{"kind", analyzer::FindingKindName(g->kind)},
                    {"comm", protocol::CommIdHex(g->comm)},
                    {"seq", g->seq},
                    {"culprits", g->culprits},
                    {"waiting", g->waiting},
                    {"chain", std::move(chain)},
                    {"signatures", std::move(sigs)},
                    {"summary", g->summary}});
  }
  const std::vector<std::int64_t> held(waiting.begin(), waiting.end());
  // Named: the first finding's culprits, else the members its call holds (a call that does not
  // complete: the communicator's members that wait in it).
  const std::vector<std::int64_t>& named = f.culprits.empty() ? f.waiting : f.culprits;
  json hosts = json::array();
  for (std::int64_t r : named) {
    const std::string* h = view.HostOf(r);
    hosts.push_back({{"rank", r}, {"host", h != nullptr ? json(*h) : json(nullptr)}});
  }
  json fields = {{"id", id}, {"at_ns", now_ns}, {"ranks", named}};
  if (!comms.empty()) fields["comms"] = std::vector<std::string>(comms.begin(), comms.end());
  fields["detail"] = {{"kind", analyzer::FindingKindName(f.kind)},
                      {"comm", protocol::CommIdHex(f.comm)},
                      {"seq", f.seq},
                      {"culprits", f.culprits},
                      {"waiting", held},
                      {"hosts", std::move(hosts)},
                      {"chain", each[0]["chain"]},
                      {"signatures", each[0]["signatures"]},
                      {"findings", std::move(each)},
                      {"stalled", stalled}};
  std::string summary = f.summary;
  if (!f.culprits.empty()) {
    std::string where;
    for (std::int64_t r : f.culprits) {
      const std::string* h = view.HostOf(r);
      where += (where.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r) + (h != nullptr ? " on " + *h : "");
    }
    summary = where + ": " + summary;
  }
  if (group.size() > 1) {
    summary += f.kind == analyzer::FindingKind::kNotCompleting
                   ? " (" + std::to_string(held.size()) + " rank(s) held behind it in " + std::to_string(group.size() - 1) +
                         " more call(s))"
                   : " (and " + std::to_string(group.size() - 1) + " more call(s) it never issued, " +
                         std::to_string(held.size()) + " rank(s) held in all)";
  }
  return {HangStageName(f.kind), summary, std::move(fields),
          f.kind == analyzer::FindingKind::kDisorder ? "warning" : "critical"};
}

std::vector<HangRecord> HangStage::TakeRecords() {
  std::vector<HangRecord> out;
  out.swap(records_);
  return out;
}

void HangStage::Unwritten(std::vector<HangRecord> records) {
  records.insert(records.end(), std::make_move_iterator(records_.begin()), std::make_move_iterator(records_.end()));
  records_ = std::move(records);
}

}  // namespace falcon::controller
