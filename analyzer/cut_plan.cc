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

// One rank's pattern, indexed for E(x) in O(log units). Counters 0..comms-1 are the
// communicators' totals (what the shim's triggers count); then each communicator's channels.
// Per counter k, entries first[k]..first[k+1]-1 of unit_index and cum: the units that call it,
// ascending, and its calls through each (flat: a job of 16,384 ranks has 200,000 counters).
struct Rank {
  std::uint64_t units = 0;
  std::vector<std::uint32_t> channel_at;  // per comm: its first channel's counter
  std::vector<std::uint64_t> base;        // per counter: calls before position 0
  std::vector<std::uint64_t> per_period;  // per counter: calls per period
  std::vector<std::uint32_t> first;       // per counter, and one past the last
  std::vector<std::uint32_t> unit_index;
  std::vector<std::uint64_t> cum;
  std::vector<bool> valid;                // per unit residue: a stop position

  std::uint64_t Issued(std::uint32_t k, std::uint64_t x) const {
    if (units == 0 || per_period[k] == 0) return base[k];
    const std::uint64_t r = x % units;
    const auto begin = unit_index.begin() + first[k];
    const auto it = std::lower_bound(begin, unit_index.begin() + first[k + 1], static_cast<std::uint32_t>(r));
    const std::uint64_t within = it == begin ? 0 : cum[static_cast<std::size_t>(it - unit_index.begin()) - 1];
    return base[k] + (x / units) * per_period[k] + within;
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

// Calls f(counter, unit, count) for every call of every unit, in unit order: on its
// communicator's total and, where the communicator carries channels, on its channel.
template <typename F>
void ForEachCall(const RankCallPattern& p, const Rank& r, F&& f) {
  for (std::size_t u = 0; u < p.units.size(); ++u) {
    for (const UnitCalls& call : p.units[u].calls) {
      f(call.comm, static_cast<std::uint32_t>(u), call.count);
      if (!p.comms[call.comm].channels.empty()) {
        f(r.channel_at[call.comm] + call.channel, static_cast<std::uint32_t>(u), call.count);
      }
    }
  }
}

// A position x is a stop position unless the unit at x is a group that an ungrouped call
// precedes: the shim stops before an ungrouped call, or right after a group, never before one.
void Index(const RankCallPattern& p, Rank* r) {
  r->units = p.units.size();
  const std::size_t nc = p.comms.size();
  r->channel_at.assign(nc, 0);
  r->base.clear();
  for (const PatternComm& c : p.comms) r->base.push_back(c.base_seq);
  for (std::size_t c = 0; c < nc; ++c) {
    r->channel_at[c] = static_cast<std::uint32_t>(r->base.size());
    for (const PatternChannel& ch : p.comms[c].channels) r->base.push_back(ch.base);
  }
  const std::size_t nk = r->base.size();
  constexpr std::uint32_t kNone = std::numeric_limits<std::uint32_t>::max();
  // Two passes: how many units call each counter, then those units and the running counts.
  std::vector<std::uint32_t> last(nk, kNone);
  r->first.assign(nk + 1, 0);
  ForEachCall(p, *r, [&](std::uint32_t k, std::uint32_t u, std::uint64_t) {
    if (last[k] != u) {
      last[k] = u;
      ++r->first[k + 1];
    }
  });
  for (std::size_t k = 0; k < nk; ++k) r->first[k + 1] += r->first[k];
  r->unit_index.resize(r->first[nk]);
  r->cum.resize(r->first[nk]);
  r->per_period.assign(nk, 0);
  std::vector<std::uint32_t> next(r->first.begin(), r->first.end() - 1);
  last.assign(nk, kNone);
  ForEachCall(p, *r, [&](std::uint32_t k, std::uint32_t u, std::uint64_t n) {
    r->per_period[k] += n;
    if (last[k] != u) {
      last[k] = u;
      r->unit_index[next[k]++] = u;
    }
    r->cum[next[k] - 1] = r->per_period[k];
  });
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

// Counts that must agree at the cut: one communicator's totals, its collectives, or the sends
// from one member (comm rank `from`) to another (`to`) with the receiver's receives from it.
// `zero`: a member that never used the channel, whose count stays 0.
struct Constraint {
  enum class Kind : std::uint8_t { kTotals, kCollectives, kSends };
  Kind kind = Kind::kTotals;
  std::uint64_t comm = 0;
  std::int32_t from = -1, to = -1;
  std::vector<std::pair<std::size_t, std::uint32_t>> members;  // (rank index, counter)
  bool zero = false;
};

// For messages, built only when a cut fails: a job of 16,384 ranks has 33,000 constraints.
std::string What(const Constraint& c) {
  switch (c.kind) {
    case Constraint::Kind::kTotals:
      return "the members of communicator " + Hex(c.comm) + " cannot agree on a call count";
    case Constraint::Kind::kCollectives:
      return "the members of communicator " + Hex(c.comm) + " cannot agree on a collective count";
    case Constraint::Kind::kSends:
      break;
  }
  return "comm ranks " + std::to_string(c.from) + " and " + std::to_string(c.to) + " of communicator " + Hex(c.comm) +
         " cannot agree on the sends from " + std::to_string(c.from) + " to " + std::to_string(c.to);
}

// The communicator's members' channels as constraints, or a reason to count it by its totals.
std::string ChannelConstraints(std::uint64_t id, const std::vector<Member>& members,
                               std::span<const RankCallPattern> ranks, const std::vector<Rank>& rs,
                               std::vector<Constraint>* out) {
  std::map<std::int32_t, std::size_t> by_comm_rank;  // comm rank -> index into members
  for (std::size_t m = 0; m < members.size(); ++m) {
    const PatternComm& c = ranks[members[m].rank].comms[members[m].comm];
    if (c.channels.empty()) return "rank " + std::to_string(ranks[members[m].rank].rank) + " carries no channels";
    if (c.rank < 0 || c.rank >= c.nranks || !by_comm_rank.emplace(c.rank, m).second) {
      return "comm rank " + std::to_string(c.rank) + " of rank " + std::to_string(ranks[members[m].rank].rank) +
             " is unknown or taken twice";
    }
  }
  Constraint coll{Constraint::Kind::kCollectives, id, -1, -1, {}, false};
  std::map<std::pair<std::int32_t, std::int32_t>, Constraint> p2p;  // (sender, receiver) comm ranks
  std::vector<bool> in_coll(members.size(), false);
  for (std::size_t m = 0; m < members.size(); ++m) {
    const Member& mem = members[m];
    const PatternComm& c = ranks[mem.rank].comms[mem.comm];
    for (std::uint32_t k = 0; k < c.channels.size(); ++k) {
      const PatternChannel& ch = c.channels[k];
      const std::uint32_t counter = rs[mem.rank].channel_at[mem.comm] + k;
      if (ch.kind == ChannelKind::kCollective) {
        coll.members.emplace_back(mem.rank, counter);
        in_coll[m] = true;
        continue;
      }
      if (!by_comm_rank.contains(ch.peer)) {
        return "rank " + std::to_string(ranks[mem.rank].rank) + " names peer " + std::to_string(ch.peer) +
               ", which no member has as its comm rank";
      }
      const auto key = ch.kind == ChannelKind::kSend ? std::pair{c.rank, ch.peer} : std::pair{ch.peer, c.rank};
      Constraint& p = p2p.try_emplace(key, Constraint{Constraint::Kind::kSends, id, key.first, key.second, {}, false})
                          .first->second;
      p.members.emplace_back(mem.rank, counter);
    }
  }
  for (std::size_t m = 0; m < members.size(); ++m) coll.zero = coll.zero || !in_coll[m];
  if (!coll.members.empty()) out->push_back(std::move(coll));
  for (auto& [key, p] : p2p) {
    p.zero = p.members.size() < 2;  // one end never used it
    out->push_back(std::move(p));
  }
  return {};
}

}  // namespace

std::uint64_t IssuedBefore(const RankCallPattern& p, std::uint32_t comm, std::uint64_t position) {
  Rank r;
  Index(p, &r);
  return r.Issued(comm, position);
}

std::uint64_t IssuedOnChannelBefore(const RankCallPattern& p, std::uint32_t comm, std::uint32_t channel,
                                    std::uint64_t position) {
  Rank r;
  Index(p, &r);
  return r.Issued(r.channel_at[comm] + channel, position);
}

namespace {

// What every plan of one set of patterns shares: the ranks indexed, the constraints, and what
// rules out any cut before a search starts. Built once per PlanCut, whose searches (iteration
// tries, the later-iteration search) plan the same patterns many times.
struct Job {
  std::span<const RankCallPattern> ranks;
  std::vector<Rank> rs;
  std::vector<Constraint> constraints;
  std::vector<std::vector<std::size_t>> of_rank;  // per rank: its constraints
  std::size_t root = 0;                           // the lowest rank
  std::string failure;                            // no cut whatever the options
  // Members that count a communicator by its totals, unalike: no cut, but reported after what
  // is wrong with the options.
  std::string counts_failure;
};

Job Prepare(std::span<const RankCallPattern> ranks) {
  Job job;
  job.ranks = ranks;
  if (ranks.empty()) {
    job.failure = "no rank to cut";
    return job;
  }
  std::vector<Rank>& rs = job.rs;
  rs.resize(ranks.size());
  std::map<std::uint64_t, std::vector<Member>> comms;  // ordered: deterministic messages
  std::unordered_map<std::uint64_t, std::int64_t> nranks;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const RankCallPattern& p = ranks[i];
    if (p.units.empty()) {
      job.failure = "rank " + std::to_string(p.rank) +
                    " issues no periodic NCCL calls: there is no call to stop it before";
      return job;
    }
    Index(p, &rs[i]);
    for (std::uint32_t c = 0; c < p.comms.size(); ++c) {
      comms[p.comms[c].id].push_back({i, c});
      nranks[p.comms[c].id] = std::max(nranks[p.comms[c].id], p.comms[c].nranks);
    }
  }
  for (const auto& [id, members] : comms) {
    if (static_cast<std::int64_t>(members.size()) != nranks[id]) {
      job.failure = "communicator " + Hex(id) + ": " + std::to_string(members.size()) + " of " +
                    std::to_string(nranks[id]) + " members have a call pattern";
      return job;
    }
  }
  const auto lowest = std::min_element(ranks.begin(), ranks.end(),
                                       [](const auto& a, const auto& b) { return a.rank < b.rank; });
  job.root = static_cast<std::size_t>(lowest - ranks.begin());

  // The constraints: per communicator, its channels where every member counts them, else its
  // totals.
  std::vector<Constraint>& constraints = job.constraints;
  for (const auto& [id, members] : comms) {
    std::vector<Constraint> channels;
    const std::string why = ChannelConstraints(id, members, ranks, rs, &channels);
    if (why.empty()) {
      for (Constraint& c : channels) constraints.push_back(std::move(c));
      continue;
    }
    // By totals, members must call it alike: where they do not (sends and receives), equal
    // totals can come where the members are iterations apart, and a cut there would hang.
    Constraint total{Constraint::Kind::kTotals, id, -1, -1, {}, false};
    for (const Member& m : members) {
      total.members.emplace_back(m.rank, m.comm);
      const Member& first = members.front();
      if (rs[m.rank].per_period[m.comm] != rs[first.rank].per_period[first.comm]) {
        job.counts_failure = "communicator " + Hex(id) + ": rank " + std::to_string(ranks[first.rank].rank) +
                             " issues " + std::to_string(rs[first.rank].per_period[first.comm]) +
                             " calls per period on it, rank " + std::to_string(ranks[m.rank].rank) + " " +
                             std::to_string(rs[m.rank].per_period[m.comm]) +
                             ": it carries sends and receives, and not every member's agent counts them per "
                             "channel (" + why + ")";
        return job;
      }
    }
    constraints.push_back(std::move(total));
  }
  job.of_rank.resize(rs.size());
  for (std::size_t k = 0; k < constraints.size(); ++k) {
    for (const auto& [rank, counter] : constraints[k].members) {
      if (job.of_rank[rank].empty() || job.of_rank[rank].back() != k) job.of_rank[rank].push_back(k);
    }
  }
  return job;
}

// The earliest consistent cut with each rank i stopping at or after min_position[i].
CutPlan Solve(const Job& job, std::span<const std::uint64_t> min_position, const CutOptions& options) {
  CutPlan out;
  if (!job.failure.empty()) {
    out.failure = job.failure;
    return out;
  }
  const std::span<const RankCallPattern> ranks = job.ranks;
  const std::vector<Rank>& rs = job.rs;
  const std::size_t root = job.root;
  // Domains [lo, hi] of stop positions.
  std::vector<std::uint64_t> lo(rs.size()), hi(rs.size());
  for (std::size_t i = 0; i < rs.size(); ++i) {
    const Rank& r = rs[i];
    lo[i] = r.NextValid(std::max<std::uint64_t>(min_position[i], 1));  // 0 is the past
    const std::uint64_t span = options.horizon_periods * r.units;
    const auto last = r.PrevValid(min_position[i] + std::max<std::uint64_t>(span, 1));
    hi[i] = std::max(last ? *last : lo[i], lo[i]);
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
      out.later_iteration = 0;
      return out;
    }
    const std::uint64_t x = rs[root].NextValid((*options.iteration - *p.iteration_at_start) * rs[root].units);
    if (x < std::max<std::uint64_t>(min_position[root], 1)) {
      out.failure = "iteration " + std::to_string(*options.iteration) + " begins too soon on rank " +
                    std::to_string(p.rank) + " to pause every rank before it: choose a later one";
      out.later_iteration = 0;  // marks a later one worth looking for; PlanCut finds it
      return out;
    }
    lo[root] = hi[root] = x;
  }
  if (!job.counts_failure.empty()) {
    out.failure = job.counts_failure;
    return out;
  }
  const std::vector<Constraint>& constraints = job.constraints;

  // Bounds propagation over the constraints, worklist driven.
  std::deque<std::size_t> work;
  std::vector<bool> queued(constraints.size(), true);
  for (std::size_t k = 0; k < constraints.size(); ++k) work.push_back(k);
  auto requeue = [&](std::size_t i) {
    for (std::size_t k : job.of_rank[i]) {
      if (!queued[k]) {
        queued[k] = true;
        work.push_back(k);
      }
    }
  };
  std::uint64_t rounds = 0;
  const std::uint64_t max_rounds = std::max<std::uint64_t>(options.max_rounds, 64 * constraints.size());
  while (!work.empty()) {
    if (++rounds > max_rounds) {
      out.failure = "no consistent cut found within " + std::to_string(max_rounds) + " propagation rounds";
      return out;
    }
    const std::size_t k = work.front();
    work.pop_front();
    queued[k] = false;
    const Constraint& con = constraints[k];
    std::uint64_t a = 0, b = std::numeric_limits<std::uint64_t>::max();
    if (con.zero) b = 0;
    for (const auto& [rank, counter] : con.members) {
      a = std::max(a, rs[rank].Issued(counter, lo[rank]));
      b = std::min(b, rs[rank].Issued(counter, hi[rank]));
    }
    if (a > b) {
      out.failure = "no consistent cut within " + std::to_string(options.horizon_periods) +
                    " periods: " + What(con) + " (their call patterns disagree)";
      return out;
    }
    for (const auto& [rank, counter] : con.members) {
      const Rank& r = rs[rank];
      std::uint64_t& rlo = lo[rank];
      std::uint64_t& rhi = hi[rank];
      bool changed = false;
      if (r.Issued(counter, rlo) < a) {  // raise lo: the first x with E(x) >= a
        std::uint64_t l = rlo, h = rhi;
        while (l < h) {
          const std::uint64_t mid = l + (h - l) / 2;
          if (r.Issued(counter, mid) >= a) h = mid;
          else l = mid + 1;
        }
        rlo = r.NextValid(l);
        changed = true;
      }
      if (r.Issued(counter, rhi) > b) {  // lower hi: the last x with E(x) <= b
        std::uint64_t l = rlo, h = rhi;
        while (l < h) {
          const std::uint64_t mid = l + (h - l + 1) / 2;
          if (r.Issued(counter, mid) <= b) l = mid;
          else h = mid - 1;
        }
        const auto prev = r.PrevValid(l);
        rhi = prev ? *prev : 0;
        changed = true;
      }
      if (rlo > rhi) {
        out.failure = "no consistent cut within " + std::to_string(options.horizon_periods) + " periods of rank " +
                      std::to_string(ranks[rank].rank) + " (" + What(con) + ")";
        return out;
      }
      if (changed) requeue(rank);
    }
  }

  // The lower bounds are a solution at the fixpoint; check it rather than trust it.
  for (const Constraint& con : constraints) {
    const auto& [r0, k0] = con.members.front();
    const std::uint64_t want = con.zero ? 0 : rs[r0].Issued(k0, lo[r0]);
    for (const auto& [rank, counter] : con.members) {
      if (rs[rank].Issued(counter, lo[rank]) != want) {
        out.failure = "internal: propagation ended without agreement (" + What(con) + ")";
        return out;
      }
    }
  }
  out.ranks.reserve(rs.size());
  for (std::size_t i = 0; i < rs.size(); ++i) {
    const Rank& r = rs[i];
    const std::uint64_t x = lo[i];
    // Trigger: the ungrouped call at x, else a call of the group just before x.
    const bool before_call = !ranks[i].units[x % r.units].group;
    const std::uint64_t t = before_call ? x : x - 1;  // x >= 1
    RankCut cut{ranks[i].rank, x, {}};
    cut.targets.reserve(ranks[i].comms.size());
    for (std::uint32_t c = 0; c < ranks[i].comms.size(); ++c) {
      cut.targets.push_back({ranks[i].comms[c].id, r.Issued(c, t), r.Issued(c, x)});
    }
    out.ranks.push_back(std::move(cut));
  }
  return out;
}

// The ranks' own min_positions.
std::vector<std::uint64_t> MinPositions(std::span<const RankCallPattern> ranks) {
  std::vector<std::uint64_t> out;
  out.reserve(ranks.size());
  for (const RankCallPattern& p : ranks) out.push_back(p.min_position);
  return out;
}

// Solve at options.iteration, and where it fails, why.
CutPlan SolveAtIteration(const Job& job, std::span<const std::uint64_t> min_position, const CutOptions& options) {
  CutPlan out = Solve(job, min_position, options);
  if (out.ok() || !options.iteration || !job.failure.empty()) return out;
  // With the lowest rank pinned to an iteration, a failure usually means another rank will be
  // past the matching point before a pause can reach it. Tell that apart from patterns that
  // really disagree: plan again with the other ranks free to stop anywhere after now.
  std::vector<std::uint64_t> relaxed(min_position.size(), 0);
  relaxed[job.root] = min_position[job.root];
  const CutPlan free = Solve(job, relaxed, options);
  if (!free.ok()) return out;
  for (std::size_t i = 0; i < job.ranks.size(); ++i) {
    if (free.ranks[i].position < min_position[i]) {
      out.failure = "iteration " + std::to_string(*options.iteration) + " begins too soon: rank " +
                    std::to_string(job.ranks[i].rank) + " will be past its matching point before a pause reaches it; " +
                    "choose a later one";
      out.later_iteration = 0;
      return out;
    }
  }
  return out;
}

}  // namespace

std::optional<std::uint64_t> FirstReachableIteration(std::span<const RankCallPattern> ranks) {
  if (ranks.empty()) return std::nullopt;
  const auto lowest = std::min_element(ranks.begin(), ranks.end(),
                                       [](const auto& a, const auto& b) { return a.rank < b.rank; });
  const std::uint64_t units = lowest->units.size();
  if (!lowest->iteration_at_start || units == 0) return std::nullopt;
  return *lowest->iteration_at_start + (std::max<std::uint64_t>(lowest->min_position, 1) + units - 1) / units;
}

CutPlan PlanCut(std::span<const RankCallPattern> ranks, const CutOptions& options) {
  const Job job = Prepare(ranks);
  const std::vector<std::uint64_t> min_position = MinPositions(ranks);
  if (!options.iteration && options.iteration_start_tries > 0 && !ranks.empty()) {
    if (const std::optional<std::uint64_t> first = FirstReachableIteration(ranks)) {
      CutOptions at = options;
      at.iteration_start_tries = 0;
      for (std::uint64_t i = 0; i < options.iteration_start_tries; ++i) {
        at.iteration = *first + i;
        CutPlan plan = Solve(job, min_position, at);
        if (plan.ok()) return plan;
      }
    }
    CutOptions earliest = options;
    earliest.iteration_start_tries = 0;
    return Solve(job, min_position, earliest);
  }
  CutPlan out = SolveAtIteration(job, min_position, options);
  if (out.ok() || !options.iteration || !out.later_iteration) return out;
  // Passed or too soon: find a later iteration that has a cut, doubling the step from the one
  // asked for until one does, then halving back towards the first. The halving assumes that
  // every iteration after one that works works too (later ones leave every rank more room);
  // what it settles on has been planned either way.
  out.later_iteration.reset();
  const auto works = [&](std::uint64_t it) {
    CutOptions at = options;
    at.iteration = it;
    return Solve(job, min_position, at).ok();
  };
  std::uint64_t bad = *options.iteration, good = 0;
  for (std::uint64_t step = 1; step <= options.horizon_periods; step *= 2) {
    if (works(*options.iteration + step)) {
      good = *options.iteration + step;
      break;
    }
    bad = *options.iteration + step;
  }
  if (good == 0) return out;
  while (good - bad > 1) {
    const std::uint64_t mid = bad + (good - bad) / 2;
    (works(mid) ? good : bad) = mid;
  }
  out.later_iteration = good;
  out.failure += " (iteration " + std::to_string(good) + " has a cut as the ranks stand now)";
  return out;
}

}  // namespace falcon::analyzer
