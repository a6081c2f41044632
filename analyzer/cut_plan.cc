// PlanCut. See cut_plan.h for the contract.
#include "analyzer/cut_plan.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <string>
#include <unordered_map>

namespace falcon::analyzer {
namespace {

// One rank's pattern, indexed for E(x) in O(log units).
struct Rank {
  const RankCallPattern* p = nullptr;
  std::uint64_t units = 0;
  std::vector<std::uint64_t> per_period;                 // calls per period, per comm index
  std::vector<std::vector<std::uint32_t>> unit_index;    // per comm: units that call it, ascending
  std::vector<std::vector<std::uint64_t>> cum;           // per comm: calls through that unit
  std::vector<bool> valid;                               // per unit residue: a stop position
  std::uint64_t lo = 0, hi = 0;

  std::uint64_t Issued(std::uint32_t c, std::uint64_t x) const {
    const std::uint64_t base = p->comms[c].base_seq;
    if (units == 0 || per_period[c] == 0) return base;
    const std::uint64_t r = x % units;
    const auto& idx = unit_index[c];
    const auto it = std::lower_bound(idx.begin(), idx.end(), static_cast<std::uint32_t>(r));
    const std::uint64_t within = it == idx.begin() ? 0 : cum[c][static_cast<std::size_t>(it - idx.begin()) - 1];
    return base + (x / units) * per_period[c] + within;
  }
  bool Valid(std::uint64_t x) const { return units == 0 || valid[x % units]; }
  // The first stop position >= x (a valid residue exists: see Index).
  std::uint64_t NextValid(std::uint64_t x) const {
    while (!Valid(x)) ++x;
    return x;
  }
  // The last stop position <= x, or nullopt.
  std::optional<std::uint64_t> PrevValid(std::uint64_t x) const {
    for (std::uint64_t k = 0; k <= units; ++k) {
      if (k > x) return std::nullopt;
      if (Valid(x - k)) return x - k;
    }
    return std::nullopt;
  }
};

// A position x is a stop position unless the unit at x is a group that an ungrouped call
// precedes: the shim stops before an ungrouped call, or right after a group, never before one.
void Index(const RankCallPattern& p, Rank* r) {
  r->p = &p;
  r->units = p.units.size();
  const std::size_t nc = p.comms.size();
  r->per_period.assign(nc, 0);
  r->unit_index.assign(nc, {});
  r->cum.assign(nc, {});
  for (std::size_t u = 0; u < p.units.size(); ++u) {
    for (const UnitCalls& call : p.units[u].calls) {
      r->per_period[call.comm] += call.count;
      auto& idx = r->unit_index[call.comm];
      if (idx.empty() || idx.back() != u) {
        idx.push_back(static_cast<std::uint32_t>(u));
        r->cum[call.comm].push_back(r->per_period[call.comm]);
      } else {
        r->cum[call.comm].back() = r->per_period[call.comm];
      }
    }
  }
  r->valid.assign(p.units.size(), true);
  for (std::size_t u = 0; u < p.units.size(); ++u) {
    const std::size_t prev = (u + p.units.size() - 1) % p.units.size();
    r->valid[u] = !p.units[u].group || p.units[prev].group;
  }
}

std::string Hex(std::uint64_t id) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, id >>= 4) s[static_cast<std::size_t>(i)] = kDigits[id & 15];
  return s;
}

struct Member {
  std::size_t rank;     // index into the ranks
  std::uint32_t comm;   // index into that rank's comms
};

}  // namespace

std::uint64_t IssuedBefore(const RankCallPattern& p, std::uint32_t comm, std::uint64_t position) {
  Rank r;
  Index(p, &r);
  return r.Issued(comm, position);
}

namespace {

CutPlan Plan(std::span<const RankCallPattern> ranks, const CutOptions& options) {
  CutPlan out;
  if (ranks.empty()) {
    out.failure = "no rank to cut";
    return out;
  }
  std::vector<Rank> rs(ranks.size());
  std::map<std::uint64_t, std::vector<Member>> comms;  // ordered: deterministic messages
  std::unordered_map<std::uint64_t, std::int64_t> nranks;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const RankCallPattern& p = ranks[i];
    if (p.units.empty()) {
      out.failure = "rank " + std::to_string(p.rank) +
                    " issues no periodic NCCL calls: there is no call to stop it before";
      return out;
    }
    Index(p, &rs[i]);
    for (std::uint32_t c = 0; c < p.comms.size(); ++c) {
      comms[p.comms[c].id].push_back({i, c});
      nranks[p.comms[c].id] = std::max(nranks[p.comms[c].id], p.comms[c].nranks);
    }
  }
  for (const auto& [id, members] : comms) {
    if (static_cast<std::int64_t>(members.size()) != nranks[id]) {
      out.failure = "communicator " + Hex(id) + ": " + std::to_string(members.size()) + " of " +
                    std::to_string(nranks[id]) + " members have a call pattern";
      return out;
    }
  }

  // Domains [lo, hi] of stop positions.
  const auto lowest = std::min_element(ranks.begin(), ranks.end(),
                                       [](const auto& a, const auto& b) { return a.rank < b.rank; });
  const std::size_t root = static_cast<std::size_t>(lowest - ranks.begin());
  for (std::size_t i = 0; i < rs.size(); ++i) {
    Rank& r = rs[i];
    r.lo = r.NextValid(std::max<std::uint64_t>(ranks[i].min_position, 1));  // 0 is the past
    const std::uint64_t span = options.horizon_periods * r.units;
    const auto hi = r.PrevValid(ranks[i].min_position + std::max<std::uint64_t>(span, 1));
    r.hi = hi ? *hi : r.lo;
    if (r.hi < r.lo) r.hi = r.lo;
  }
  if (options.iteration) {
    const RankCallPattern& p = ranks[root];
    if (!p.iteration_at_start) {
      out.failure = "rank " + std::to_string(p.rank) + " has no iteration boundary yet: no iteration to stop at";
      return out;
    }
    if (*options.iteration < *p.iteration_at_start) {
      out.failure = "iteration " + std::to_string(*options.iteration) + " has passed: rank " +
                    std::to_string(p.rank) + " is past iteration " + std::to_string(*p.iteration_at_start);
      return out;
    }
    const std::uint64_t x = rs[root].NextValid((*options.iteration - *p.iteration_at_start) * rs[root].units);
    if (x < std::max<std::uint64_t>(p.min_position, 1)) {
      out.failure = "iteration " + std::to_string(*options.iteration) + " begins too soon on rank " +
                    std::to_string(p.rank) + " to pause every rank before it: choose a later one";
      return out;
    }
    rs[root].lo = rs[root].hi = x;
  }

  // Bounds propagation over communicators, worklist driven.
  std::deque<std::uint64_t> work;
  std::unordered_map<std::uint64_t, bool> queued;
  for (const auto& [id, members] : comms) {
    work.push_back(id);
    queued[id] = true;
  }
  auto requeue = [&](std::size_t i) {
    for (const PatternComm& c : ranks[i].comms) {
      if (!queued[c.id]) {
        queued[c.id] = true;
        work.push_back(c.id);
      }
    }
  };
  std::uint64_t rounds = 0;
  while (!work.empty()) {
    if (++rounds > options.max_rounds) {
      out.failure = "no consistent cut found within " + std::to_string(options.max_rounds) + " propagation rounds";
      return out;
    }
    const std::uint64_t id = work.front();
    work.pop_front();
    queued[id] = false;
    const std::vector<Member>& members = comms.at(id);
    std::uint64_t a = 0, b = std::numeric_limits<std::uint64_t>::max();
    for (const Member& m : members) {
      a = std::max(a, rs[m.rank].Issued(m.comm, rs[m.rank].lo));
      b = std::min(b, rs[m.rank].Issued(m.comm, rs[m.rank].hi));
    }
    if (a > b) {
      out.failure = "no consistent cut within " + std::to_string(options.horizon_periods) +
                    " periods: the members of communicator " + Hex(id) +
                    " cannot agree on a call count (their call patterns disagree)";
      return out;
    }
    for (const Member& m : members) {
      Rank& r = rs[m.rank];
      bool changed = false;
      if (r.Issued(m.comm, r.lo) < a) {  // raise lo: the first x with E(x) >= a
        std::uint64_t l = r.lo, h = r.hi;
        while (l < h) {
          const std::uint64_t mid = l + (h - l) / 2;
          if (r.Issued(m.comm, mid) >= a) h = mid;
          else l = mid + 1;
        }
        r.lo = r.NextValid(l);
        changed = true;
      }
      if (r.Issued(m.comm, r.hi) > b) {  // lower hi: the last x with E(x) <= b
        std::uint64_t l = r.lo, h = r.hi;
        while (l < h) {
          const std::uint64_t mid = l + (h - l + 1) / 2;
          if (r.Issued(m.comm, mid) <= b) l = mid;
          else h = mid - 1;
        }
        const auto prev = r.PrevValid(l);
        r.hi = prev ? *prev : 0;
        changed = true;
      }
      if (r.lo > r.hi) {
        out.failure = "no consistent cut within " + std::to_string(options.horizon_periods) +
                      " periods of rank " + std::to_string(ranks[m.rank].rank) + " (communicator " + Hex(id) + ")";
        return out;
      }
      if (changed) requeue(m.rank);
    }
  }

  // The lower bounds are a solution at the fixpoint; check it rather than trust it.
  for (const auto& [id, members] : comms) {
    const std::uint64_t want = rs[members[0].rank].Issued(members[0].comm, rs[members[0].rank].lo);
    for (const Member& m : members) {
      if (rs[m.rank].Issued(m.comm, rs[m.rank].lo) != want) {
        out.failure = "internal: propagation ended without agreement on communicator " + Hex(id);
        return out;
      }
    }
  }
  out.ranks.reserve(rs.size());
  for (std::size_t i = 0; i < rs.size(); ++i) {
    const Rank& r = rs[i];
    const std::uint64_t x = r.lo;
    // Trigger: the ungrouped call at x, else a call of the group just before x.
    const bool before_call = !ranks[i].units[x % r.units].group;
    const std::uint64_t t = before_call ? x : x - 1;  // x >= 1
    RankCut cut{ranks[i].rank, x, {}};
    for (std::uint32_t c = 0; c < ranks[i].comms.size(); ++c) {
      cut.targets.push_back({ranks[i].comms[c].id, r.Issued(c, t), r.Issued(c, x)});
    }
    out.ranks.push_back(std::move(cut));
  }
  return out;
}

}  // namespace

CutPlan PlanCut(std::span<const RankCallPattern> ranks, const CutOptions& options) {
  if (!options.iteration && options.iteration_start_tries > 0 && !ranks.empty()) {
    const auto lowest = std::min_element(ranks.begin(), ranks.end(),
                                         [](const auto& a, const auto& b) { return a.rank < b.rank; });
    const std::uint64_t units = lowest->units.size();
    if (lowest->iteration_at_start && units > 0) {
      // The first iteration whose start is at or after the rank's minimum position.
      const std::uint64_t first = *lowest->iteration_at_start + (std::max<std::uint64_t>(lowest->min_position, 1) + units - 1) / units;
      CutOptions at = options;
      at.iteration_start_tries = 0;
      for (std::uint64_t i = 0; i < options.iteration_start_tries; ++i) {
        at.iteration = first + i;
        CutPlan plan = Plan(ranks, at);
        if (plan.ok()) return plan;
      }
    }
    CutOptions earliest = options;
    earliest.iteration_start_tries = 0;
    return Plan(ranks, earliest);
  }
  CutPlan out = Plan(ranks, options);
  if (out.ok() || !options.iteration) return out;
  // With the lowest rank pinned to an iteration, a failure usually means another rank will be
  // past the matching point before a pause can reach it. Tell that apart from patterns that
  // really disagree: plan again with the other ranks free to stop anywhere after now.
  std::vector<RankCallPattern> relaxed(ranks.begin(), ranks.end());
  const auto lowest = std::min_element(relaxed.begin(), relaxed.end(),
                                       [](const auto& a, const auto& b) { return a.rank < b.rank; });
  for (auto it = relaxed.begin(); it != relaxed.end(); ++it) {
    if (it != lowest) it->min_position = 0;
  }
  const CutPlan free = Plan(relaxed, options);
  if (!free.ok()) return out;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (free.ranks[i].position < ranks[i].min_position) {
      out.failure = "iteration " + std::to_string(*options.iteration) + " begins too soon: rank " +
                    std::to_string(ranks[i].rank) + " will be past its matching point before a pause reaches it; " +
                    "choose a later one";
      return out;
    }
  }
  return out;
}

}  // namespace falcon::analyzer
