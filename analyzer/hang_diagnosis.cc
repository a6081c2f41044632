// Hang diagnosis (hang_diagnosis.h): counting rules per communicator, a wait-for graph between
// ranks for calls never issued, and one between queued device work for deadlocks.
#include "analyzer/hang_diagnosis.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>
#include <utility>

namespace falcon::analyzer {
namespace {

constexpr std::uint8_t kSend = 10;  // FalconOp codes (falcon/shm_abi.h)
constexpr std::uint8_t kRecv = 11;
constexpr std::uint64_t kNoSeq = ~std::uint64_t{0};

bool IsP2P(std::uint8_t op) { return op == kSend || op == kRecv; }
bool IsCollective(std::uint8_t op) { return op >= 1 && op <= 9; }  // AllReduce .. Scatter

std::string Hex(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string RankList(const std::vector<std::int64_t>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i == 8) return out + " and " + std::to_string(ranks.size() - 8) + " more";
    out += (i ? ", " : "") + std::to_string(ranks[i]);
  }
  return out;
}

std::string Describe(const CallSignature& s) {
  std::string out = CallOpName(s.op) + " count " + std::to_string(s.count);
  if (s.dtype != 0xFF) out += " dtype " + std::to_string(s.dtype);
  if (s.redop >= 0) out += " redop " + std::to_string(s.redop);
  if (s.peer >= 0) out += (IsP2P(s.op) ? " peer " : " root ") + std::to_string(s.peer);
  return out;
}

struct Member {
  std::size_t rank_index;
  const CommProgress* progress;
};

struct CommView {
  std::int32_t nranks = 0;
  std::vector<Member> members;                        // ascending global rank
  std::map<std::int32_t, std::size_t> by_comm_rank;   // comm rank -> rank index
  bool aligned = true;  // comm_seq alike on every member (no P2P on more than two ranks)
};

// A pending (not completed) call and where it sits in its rank's device queue.
struct Pending {
  std::size_t rank_index;
  const IssuedCall* call;
  bool head;          // nothing before it pending on its stream (or its stream is unknown)
  std::size_t before;  // node index of the pending call queued just before it (head: itself)
};

struct Snapshot {
  std::vector<const RankProgress*> ranks;  // ascending global rank, each once
  std::map<std::uint64_t, CommView> comms;
  std::vector<Pending> pending;
  std::map<std::tuple<std::size_t, std::uint64_t, std::uint64_t>, std::size_t> pending_at;  // (rank, comm, seq)
};

Snapshot Build(std::span<const RankProgress> input) {
  Snapshot s;
  std::set<std::int64_t> seen;
  for (const RankProgress& r : input) {
    if (seen.insert(r.rank).second) s.ranks.push_back(&r);
  }
  std::sort(s.ranks.begin(), s.ranks.end(), [](const RankProgress* a, const RankProgress* b) { return a->rank < b->rank; });
  for (std::size_t i = 0; i < s.ranks.size(); ++i) {
    for (const CommProgress& c : s.ranks[i]->comms) {
      CommView& v = s.comms[c.comm];
      v.nranks = std::max(v.nranks, c.nranks);
      v.members.push_back({i, &c});
      if (c.comm_rank >= 0) v.by_comm_rank.emplace(c.comm_rank, i);
    }
  }
  for (std::size_t i = 0; i < s.ranks.size(); ++i) {
    for (const IssuedCall& call : s.ranks[i]->recent) {
      auto v = s.comms.find(call.comm);
      if (v != s.comms.end() && IsP2P(call.sig.op) && v->second.members.size() > 2) v->second.aligned = false;
    }
  }
  for (std::size_t i = 0; i < s.ranks.size(); ++i) {
    std::unordered_map<std::uint64_t, std::size_t> last_on_stream;
    std::set<std::uint64_t> untracked;  // this rank's communicators of unknown completion
    for (const CommProgress& c : s.ranks[i]->comms) {
      if (!c.completion_known) untracked.insert(c.comm);
    }
    for (const IssuedCall& call : s.ranks[i]->recent) {
      if (call.completed || untracked.count(call.comm) != 0) continue;
      const std::size_t node = s.pending.size();
      Pending p{i, &call, true, node};
      if (call.stream != 0) {
        auto it = last_on_stream.find(call.stream);
        if (it != last_on_stream.end()) {
          const Pending& last = s.pending[it->second];
          if (call.group != 0 && last.call->group == call.group) {
            // Launched together by one ncclGroupEnd: the same place in the queue as the group's
            // other calls, not behind them.
            p.head = last.head;
            p.before = last.head ? node : last.before;
          } else {
            p.head = false;
            p.before = it->second;
          }
        }
        last_on_stream[call.stream] = node;
      }
      s.pending.push_back(p);
      s.pending_at.emplace(std::tuple{i, call.comm, call.seq}, node);
    }
  }
  return s;
}

// The pending call of `peer` that a pending send or receive of `self` pairs with, if queued.
std::optional<std::size_t> MatchingP2P(const Snapshot& s, const CommView& v, std::size_t self, const IssuedCall& call,
                                       std::size_t peer) {
  const std::int32_t self_comm_rank = [&] {
    for (const Member& m : v.members) {
      if (m.rank_index == self) return m.progress->comm_rank;
    }
    return -1;
  }();
  const std::uint8_t want = call.sig.op == kSend ? kRecv : kSend;
  for (std::size_t n = 0; n < s.pending.size(); ++n) {
    const Pending& p = s.pending[n];
    if (p.rank_index == peer && p.call->comm == call.comm && p.call->sig.op == want && p.call->sig.peer == self_comm_rank) {
      return n;
    }
  }
  return std::nullopt;
}

// Rank-level waits: `from` waits in call (comm, seq) for `to` to issue its side.
struct Wait {
  std::size_t to;
  std::uint64_t comm;
  std::uint64_t seq;
};

std::vector<std::vector<Wait>> RankWaits(const Snapshot& s) {
  std::vector<std::vector<Wait>> waits(s.ranks.size());
  for (const auto& [id, v] : s.comms) {
    if (!v.aligned || v.members.size() < 2) continue;
    std::uint64_t front = 0;
    for (const Member& m : v.members) front = std::max(front, m.progress->issued);
    for (const Member& w : v.members) {
      if (w.progress->issued != front) continue;
      if (w.progress->completion_known && w.progress->completed >= front) continue;
      for (const Member& l : v.members) {
        if (l.progress->issued < front) waits[w.rank_index].push_back({l.rank_index, id, front - 1});
      }
    }
  }
  for (const Pending& p : s.pending) {  // sends and receives whose peer posted no matching call
    if (!IsP2P(p.call->sig.op) || !p.head) continue;
    auto v = s.comms.find(p.call->comm);
    if (v == s.comms.end()) continue;
    auto peer = v->second.by_comm_rank.find(p.call->sig.peer);
    if (peer == v->second.by_comm_rank.end() || peer->second == p.rank_index) continue;
    if (!MatchingP2P(s, v->second, p.rank_index, *p.call, peer->second)) {
      waits[p.rank_index].push_back({peer->second, p.call->comm, p.call->seq});
    }
  }
  for (auto& w : waits) {
    std::sort(w.begin(), w.end(), [](const Wait& a, const Wait& b) { return std::tie(a.to, a.comm, a.seq) < std::tie(b.to, b.comm, b.seq); });
    w.erase(std::unique(w.begin(), w.end(), [](const Wait& a, const Wait& b) {
              return a.to == b.to && a.comm == b.comm && a.seq == b.seq;
            }), w.end());
  }
  return waits;
}

// Why a rank that waits for nobody does not go on.
std::string RootReason(const Snapshot& s, std::size_t r) {
  const RankProgress& rank = *s.ranks[r];
  if (rank.in_call) {
    return *rank.in_call == 0 ? "blocked inside an NCCL call (a group end or a communicator init)"
                              : "blocked inside an NCCL call on communicator " + Hex(*rank.in_call);
  }
  for (const Pending& p : s.pending) {
    if (p.rank_index == r && p.head) {
      return "its " + CallOpName(p.call->sig.op) + " #" + std::to_string(p.call->seq) + " on communicator " +
             Hex(p.call->comm) + " does not complete on the device";
    }
  }
  return "issues no NCCL call (blocked outside NCCL)";
}

void NotIssued(const Snapshot& s, const std::vector<std::vector<Wait>>& waits, std::size_t cap, std::vector<Finding>* out) {
  // One finding per (comm, seq) that ranks wait in; its laggards' chains lead to the roots.
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::pair<std::set<std::size_t>, std::set<std::size_t>>> calls;
  for (std::size_t r = 0; r < waits.size(); ++r) {
    for (const Wait& w : waits[r]) {
      auto& [waiting, laggards] = calls[{w.comm, w.seq}];
      waiting.insert(r);
      laggards.insert(w.to);
    }
  }
  std::size_t made = 0;
  for (const auto& [key, sets] : calls) {
    if (made++ == cap) break;
    const auto& [waiting, laggards] = sets;
    Finding f;
    f.kind = FindingKind::kNotIssued;
    f.comm = key.first;
    f.seq = key.second;
    std::set<std::size_t> roots, seen;
    std::vector<std::size_t> stack(laggards.begin(), laggards.end());
    while (!stack.empty()) {  // every rank the laggards wait for, down to those that wait for none
      const std::size_t r = stack.back();
      stack.pop_back();
      if (!seen.insert(r).second) continue;
      if (waits[r].empty()) roots.insert(r);
      for (const Wait& w : waits[r]) stack.push_back(w.to);
    }
    // The chain shown: from the first laggard, each rank's first wait, until a root.
    std::set<std::size_t> on_chain;
    for (std::size_t r = *laggards.begin(); on_chain.insert(r).second;) {
      if (waits[r].empty()) {
        f.chain.push_back({s.ranks[r]->rank, 0, kNoSeq});
        break;
      }
      f.chain.push_back({s.ranks[r]->rank, waits[r].front().comm, waits[r].front().seq});
      r = waits[r].front().to;
    }
    for (std::size_t r : roots) f.culprits.push_back(s.ranks[r]->rank);
    for (std::size_t r : waiting) f.waiting.push_back(s.ranks[r]->rank);
    std::vector<std::int64_t> lag;
    for (std::size_t r : laggards) lag.push_back(s.ranks[r]->rank);
    f.summary = "call #" + std::to_string(f.seq) + " on communicator " + Hex(f.comm) + ": rank(s) " + RankList(f.waiting) +
                " wait for rank(s) " + RankList(lag) + ", which never issued it";
    if (roots.empty()) {
      f.summary += "; they wait in a cycle (see the deadlock finding)";
    } else if (lag != f.culprits) {
      f.summary += "; they wait themselves, for rank(s) " + RankList(f.culprits);
    }
    if (!roots.empty()) f.summary += "; rank " + std::to_string(s.ranks[*roots.begin()]->rank) + " " + RootReason(s, *roots.begin());
    out->push_back(std::move(f));
  }
}

// Each rank's pending call issued first (by issue time; nullptr when none has one). Device work
// can only wait for work issued before it — behind it on its stream, or behind an event a stream
// waits for (cross-stream waits the shim does not see) — so a rank's first pending call is the
// one all its other pending work may be waiting for.
std::vector<const IssuedCall*> FirstPending(const Snapshot& s) {
  std::vector<const IssuedCall*> first(s.ranks.size(), nullptr);
  for (const Pending& p : s.pending) {
    const IssuedCall*& f = first[p.rank_index];
    if (p.call->issue_ns != 0 && (f == nullptr || p.call->issue_ns < f->issue_ns)) f = p.call;
  }
  return first;
}

void NotCompleting(const Snapshot& s, std::size_t cap, std::vector<Finding>* out) {
  std::size_t made = 0;
  const std::vector<const IssuedCall*> first = FirstPending(s);
  for (const auto& [id, v] : s.comms) {
    if (!v.aligned || v.members.empty() || made == cap) continue;
    // Members still short of the whole communicator (some did not report): no verdict.
    if (v.nranks > 0 && v.members.size() < static_cast<std::size_t>(v.nranks)) continue;
    if (std::any_of(v.members.begin(), v.members.end(), [](const Member& m) { return !m.progress->completion_known; })) {
      continue;  // a member's device work is not tracked: no verdict on the device
    }
    // The communicator's first call not complete everywhere, and whether every member issued it.
    std::uint64_t seq = kNoSeq, issued_by_all = kNoSeq;
    for (const Member& m : v.members) {
      if (m.progress->completed < m.progress->issued) seq = std::min(seq, m.progress->completed);
      issued_by_all = std::min(issued_by_all, m.progress->issued);
    }
    if (seq == kNoSeq || issued_by_all <= seq) continue;  // nothing pending, or not issued by all
    bool blocked_behind = false;
    std::vector<std::int64_t> stuck;
    for (const Member& m : v.members) {
      if (m.progress->completed > seq) continue;
      stuck.push_back(s.ranks[m.rank_index]->rank);
      // Work queued behind other work on its stream is that other work's finding.
      auto node = s.pending_at.find({m.rank_index, id, seq});
      if (node != s.pending_at.end() && !s.pending[node->second].head) blocked_behind = true;
      // A member whose first pending call is on another communicator: this call may wait for
      // that one (a stream waiting for another's event), so it is not where the hang starts.
      const IssuedCall* f = first[m.rank_index];
      if (f != nullptr && f->comm != id) blocked_behind = true;
    }
    if (blocked_behind) continue;
    ++made;
    Finding f;
    f.kind = FindingKind::kNotCompleting;
    f.comm = id;
    f.seq = seq;
    f.waiting = stuck;
    if (stuck.size() < v.members.size()) f.culprits = stuck;
    f.summary = "call #" + std::to_string(f.seq) + " on communicator " + Hex(id) + " was issued by all " +
                std::to_string(v.members.size()) + " members and its device work does not complete " +
                (f.culprits.empty() ? std::string("on any of them (the communicator's GPUs or links)")
                                    : "on rank(s) " + RankList(f.culprits));
    out->push_back(std::move(f));
  }
}

void Mismatches(const Snapshot& s, std::size_t cap, std::vector<Finding>* out) {
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::vector<std::pair<std::int64_t, CallSignature>>> issued;
  for (const RankProgress* r : s.ranks) {
    for (const IssuedCall& c : r->recent) {
      // Collectives only: sends and receives pair with their peer's, and a communicator's init,
      // split or finalize legitimately differ between members (colour, key, count).
      if (IsCollective(c.sig.op)) issued[{c.comm, c.seq}].emplace_back(r->rank, c.sig);
    }
  }
  std::size_t made = 0;
  for (auto& [key, sigs] : issued) {
    if (made == cap) break;
    std::optional<Finding> f = MismatchOf(key.first, key.second, std::move(sigs));
    if (!f) continue;
    ++made;
    out->push_back(std::move(*f));
  }
}

// Deadlocks found, and per finding the global ranks whose device work waits on its cycle (the
// cycle's own and those queued behind or waiting for its calls).
void Deadlocks(const Snapshot& s, std::size_t cap, std::vector<Finding>* out, std::vector<std::set<std::int64_t>>* held) {
  // Device work waiting on device work: queued behind its stream's earlier call; a collective at
  // the head waits for each member's copy that is queued behind something; a send or receive at
  // the head for its peer's matching call, if that is queued behind something.
  std::vector<std::vector<std::size_t>> edges(s.pending.size());
  for (std::size_t n = 0; n < s.pending.size(); ++n) {
    const Pending& p = s.pending[n];
    if (!p.head) {
      edges[n].push_back(p.before);
      continue;
    }
    auto v = s.comms.find(p.call->comm);
    if (v == s.comms.end()) continue;
    if (IsP2P(p.call->sig.op)) {
      auto peer = v->second.by_comm_rank.find(p.call->sig.peer);
      if (peer == v->second.by_comm_rank.end()) continue;
      if (auto m = MatchingP2P(s, v->second, p.rank_index, *p.call, peer->second); m && !s.pending[*m].head) {
        edges[n].push_back(*m);
      }
      continue;
    }
    if (!v->second.aligned) continue;
    for (const Member& m : v->second.members) {
      auto other = s.pending_at.find({m.rank_index, p.call->comm, p.call->seq});
      if (other != s.pending_at.end() && other->second != n && !s.pending[other->second].head) {
        edges[n].push_back(other->second);
      }
    }
  }
  // Cycles, each reported once (by its set of calls).
  std::vector<int> color(s.pending.size(), 0);
  std::vector<std::size_t> path;
  std::set<std::vector<std::size_t>> found;
  std::vector<std::vector<std::size_t>> cycles;
  auto dfs = [&](auto&& self, std::size_t n) -> void {
    color[n] = 1;
    path.push_back(n);
    for (std::size_t m : edges[n]) {
      if (color[m] == 1) {
        std::vector<std::size_t> cycle(std::find(path.begin(), path.end(), m), path.end());
        std::vector<std::size_t> key = cycle;
        std::sort(key.begin(), key.end());
        if (found.insert(key).second) cycles.push_back(cycle);
      } else if (color[m] == 0) {
        self(self, m);
      }
    }
    path.pop_back();
    color[n] = 2;
  };
  for (std::size_t n = 0; n < s.pending.size(); ++n) {
    if (color[n] == 0) dfs(dfs, n);
  }
  std::vector<std::vector<std::size_t>> into(s.pending.size());  // reversed edges
  for (std::size_t n = 0; n < edges.size(); ++n) {
    for (std::size_t m : edges[n]) into[m].push_back(n);
  }
  for (std::size_t i = 0; i < cycles.size() && i < cap; ++i) {
    const std::vector<std::size_t>& cycle = cycles[i];
    std::set<std::int64_t>& behind = held->emplace_back();
    std::vector<bool> seen(s.pending.size(), false);
    std::vector<std::size_t> todo(cycle.begin(), cycle.end());
    for (std::size_t n : todo) seen[n] = true;
    while (!todo.empty()) {
      const std::size_t n = todo.back();
      todo.pop_back();
      behind.insert(s.ranks[s.pending[n].rank_index]->rank);
      for (std::size_t m : into[n]) {
        if (!seen[m]) {
          seen[m] = true;
          todo.push_back(m);
        }
      }
    }
    Finding f;
    f.kind = FindingKind::kDeadlock;
    std::set<std::int64_t> ranks;
    std::string calls;
    for (std::size_t n : cycle) {
      const Pending& p = s.pending[n];
      const std::int64_t rank = s.ranks[p.rank_index]->rank;
      f.chain.push_back({rank, p.call->comm, p.call->seq});
      ranks.insert(rank);
    }
    std::sort(f.chain.begin(), f.chain.end(), [](const CallRef& a, const CallRef& b) {
      return std::tie(a.rank, a.comm, a.seq) < std::tie(b.rank, b.comm, b.seq);
    });
    f.comm = f.chain.front().comm;
    f.seq = f.chain.front().seq;
    f.culprits.assign(ranks.begin(), ranks.end());
    f.waiting = f.culprits;
    for (const CallRef& c : f.chain) {
      calls += (calls.empty() ? "" : ", ") + std::string("rank ") + std::to_string(c.rank) + " #" + std::to_string(c.seq) +
               " on " + Hex(c.comm);
    }
    f.summary = "deadlock: rank(s) " + RankList(f.culprits) +
                " queued calls of communicators that share them in opposite orders, each waiting for the other: " + calls;
    out->push_back(std::move(f));
  }
}

void Disorders(const Snapshot& s, const std::vector<Finding>& deadlocks, std::size_t cap, std::vector<Finding>* out) {
  using Key = std::pair<std::uint64_t, std::uint64_t>;  // (comm, seq)
  // For each pair of calls two ranks queued on one stream each: which ranks queued which first.
  std::map<std::pair<Key, Key>, std::array<std::vector<std::int64_t>, 2>> orders;
  for (const RankProgress* r : s.ranks) {
    std::unordered_map<std::uint64_t, std::vector<Key>> by_stream;
    for (const IssuedCall& c : r->recent) {
      if (c.stream != 0 && !IsP2P(c.sig.op)) by_stream[c.stream].emplace_back(c.comm, c.seq);
    }
    for (const auto& [stream, keys] : by_stream) {
      const std::size_t from = keys.size() > 64 ? keys.size() - 64 : 0;  // bounded: the latest 64
      for (std::size_t i = from; i < keys.size(); ++i) {
        for (std::size_t j = i + 1; j < keys.size(); ++j) {
          if (keys[i].first == keys[j].first) continue;
          const bool forward = keys[i] < keys[j];
          orders[forward ? std::pair{keys[i], keys[j]} : std::pair{keys[j], keys[i]}][forward ? 0 : 1].push_back(r->rank);
        }
      }
    }
  }
  std::size_t made = 0;
  for (const auto& [pair, by] : orders) {
    if (by[0].empty() || by[1].empty() || made == cap) continue;
    const auto in_deadlock = [&, &pair = pair](const Finding& d) {
      auto has = [&](const Key& k) {
        return std::any_of(d.chain.begin(), d.chain.end(), [&](const CallRef& c) { return c.comm == k.first && c.seq == k.second; });
      };
      return has(pair.first) && has(pair.second);
    };
    if (std::any_of(deadlocks.begin(), deadlocks.end(), in_deadlock)) continue;
    ++made;
    Finding f;
    f.kind = FindingKind::kDisorder;
    f.comm = pair.first.first;
    f.seq = pair.first.second;
    std::set<std::int64_t> ranks(by[0].begin(), by[0].end());
    ranks.insert(by[1].begin(), by[1].end());
    f.culprits.assign(ranks.begin(), ranks.end());
    f.chain = {{by[0].front(), pair.first.first, pair.first.second}, {by[0].front(), pair.second.first, pair.second.second}};
    f.summary = "disorder: call #" + std::to_string(pair.first.second) + " on " + Hex(pair.first.first) + " and #" +
                std::to_string(pair.second.second) + " on " + Hex(pair.second.first) + " were queued in that order by rank(s) " +
                RankList(by[0]) + " and the other way round by rank(s) " + RankList(by[1]) +
                ": a deadlock once both wait on one stream at once";
    out->push_back(std::move(f));
  }
}

}  // namespace

std::optional<Finding> MismatchOf(std::uint64_t comm, std::uint64_t seq,
                                  std::vector<std::pair<std::int64_t, CallSignature>> sigs, const CallSignature* prefer) {
  if (sigs.empty()) return std::nullopt;
  const CallSignature& first = sigs.front().second;  // named: clang 14 cannot capture a structured binding
  if (std::all_of(sigs.begin(), sigs.end(), [&](const auto& x) { return x.second == first; })) return std::nullopt;
  std::sort(sigs.begin(), sigs.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  // The most common signature is taken as intended; ties go to the lowest rank's.
  std::vector<std::pair<CallSignature, std::size_t>> tally;
  for (const auto& [rank, sig] : sigs) {
    auto it = std::find_if(tally.begin(), tally.end(), [&want = sig](const auto& t) { return t.first == want; });
    if (it == tally.end()) tally.emplace_back(sig, 1);
    else ++it->second;
  }
  const auto top =
      std::max_element(tally.begin(), tally.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  CallSignature common = top->first;
  if (prefer != nullptr) {
    auto p = std::find_if(tally.begin(), tally.end(), [prefer](const auto& t) { return t.first == *prefer; });
    if (p != tally.end() && p->second == top->second) common = p->first;
  }
  Finding f;
  f.kind = FindingKind::kMismatch;
  f.comm = comm;
  f.seq = seq;
  std::string differ;
  for (const auto& [rank, sig] : sigs) {
    if (sig == common) continue;
    f.culprits.push_back(rank);
    if (differ.empty()) differ = "rank " + std::to_string(rank) + " issued " + Describe(sig);
  }
  f.summary = "call #" + std::to_string(f.seq) + " on communicator " + Hex(f.comm) + " differs between ranks: " + differ +
              ", the others " + Describe(common);
  f.signatures = std::move(sigs);
  return f;
}

const char* FindingKindName(FindingKind k) {
  switch (k) {
    case FindingKind::kNotIssued: return "not_issued";
    case FindingKind::kNotCompleting: return "not_completing";
    case FindingKind::kMismatch: return "mismatch";
    case FindingKind::kDeadlock: return "deadlock";
    case FindingKind::kDisorder: return "disorder";
  }
  return "?";
}

bool IsCollectiveOp(std::uint8_t op) { return IsCollective(op); }

std::string CallOpName(std::uint8_t op) {
  static constexpr std::array<const char*, 12> kNames = {"None",          "AllReduce", "Broadcast", "Bcast",
                                                         "Reduce",        "AllGather", "ReduceScatter", "AlltoAll",
                                                         "Gather",        "Scatter",   "Send",          "Recv"};
  if (op < kNames.size()) return kNames[op];
  return "op " + std::to_string(op);
}

std::vector<Finding> DiagnoseHang(std::span<const RankProgress> ranks, const HangDiagnosisOptions& options) {
  const Snapshot s = Build(ranks);
  const std::size_t cap = options.max_findings;
  std::vector<Finding> deadlocks, rest;
  std::vector<std::set<std::int64_t>> held;
  Deadlocks(s, cap, &deadlocks, &held);
  NotIssued(s, RankWaits(s), cap, &rest);
  // A call never issued because its root rank's host waits (outside NCCL) on device work that a
  // deadlock holds is the deadlock's doing: its ranks join the deadlock's, not a finding of its own.
  std::erase_if(rest, [&](const Finding& f) {
    if (f.kind != FindingKind::kNotIssued || f.chain.empty()) return false;
    for (std::size_t d = 0; d < deadlocks.size(); ++d) {
      if (!held[d].count(f.chain.back().rank)) continue;
      std::set<std::int64_t> waiting(deadlocks[d].waiting.begin(), deadlocks[d].waiting.end());
      waiting.insert(f.waiting.begin(), f.waiting.end());
      waiting.insert(f.culprits.begin(), f.culprits.end());
      deadlocks[d].waiting.assign(waiting.begin(), waiting.end());
      return true;
    }
    return false;
  });
  for (Finding& d : deadlocks) {
    if (d.waiting.size() > d.culprits.size()) {
      d.summary += " (" + std::to_string(d.waiting.size()) + " rank(s) held in all)";
    }
  }
  NotCompleting(s, cap, &rest);
  Mismatches(s, cap, &rest);
  Disorders(s, deadlocks, cap, &rest);
  deadlocks.insert(deadlocks.end(), std::make_move_iterator(rest.begin()), std::make_move_iterator(rest.end()));
  return deadlocks;
}

}  // namespace falcon::analyzer
