// Slow GPUs, links and NICs from validation results. See localize.h for the contract.
#include "analyzer/localize.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "analyzer/robust.h"

namespace falcon::analyzer {
namespace {

enum class LinkKind : std::uint8_t { kIntra, kInter, kUnknown };

LinkKind KindOf(const TransferMeasurement& t) {
  if (t.sender_node < 0 || t.receiver_node < 0) return LinkKind::kUnknown;
  return t.sender_node == t.receiver_node ? LinkKind::kIntra : LinkKind::kInter;
}

double PerByte(const TransferMeasurement& t) {
  return t.median_s / static_cast<double>(t.bytes);
}

bool ValidTime(double s) { return std::isfinite(s) && s > 0.0; }

struct Baseline {
  double median = 0.0;
  double sigma = 0.0;
  std::size_t count = 0;    // values
  std::size_t sources = 0;  // distinct GPUs or rank pairs behind them
};

using RankPair = std::pair<std::int32_t, std::int32_t>;

RankPair PairOf(const TransferMeasurement& t) {
  return {std::min(t.sender, t.receiver), std::max(t.sender, t.receiver)};
}

// Values with the sources they came from (a rank, or a rank pair).
struct Pool {
  std::vector<double> values;
  std::set<RankPair> sources;
};

// Median of the pool; sigma from its inliers (values at most `ratio` x the median), so that the
// slow values themselves (up to half of a small group's links under a slow NIC) do not inflate
// the noise estimate they are judged by.
Baseline MakeBaseline(const Pool& pool, double ratio, std::vector<double>& scratch) {
  Baseline b;
  b.count = pool.values.size();
  b.sources = pool.sources.size();
  if (pool.values.empty()) return b;
  b.median = Median(pool.values, scratch);
  std::vector<double> inliers;
  for (const double v : pool.values) {
    if (v <= ratio * b.median) inliers.push_back(v);
  }
  b.sigma = RobustSigma(inliers, scratch);
  return b;
}

// `value` is slow against `b` when the baseline comes from enough distinct sources and value exceeds its median by
// the ratio, by mad_z sigmas, and (times `seconds_per_unit`) by min_margin_s.
bool Slow(double value, const Baseline& b, double ratio, double seconds_per_unit,
          const LocalizationOptions& o) {
  const double excess = value - b.median;
  return b.sources >= o.min_baseline && value > ratio * b.median && excess > o.mad_z * b.sigma &&
         excess * seconds_per_unit > o.min_margin_s;
}

Evidence MakeEvidence(double value, const Baseline& b) {
  return {value, b.median, b.median > 0.0 ? value / b.median : 0.0, b.sigma, b.count};
}

Status Validate(const LocalizationInput& in, const LocalizationOptions& o) {
  if (!(o.gemm_ratio >= 1.0) || !(o.link_ratio >= 1.0)) {
    return Status::InvalidArgument("gemm_ratio and link_ratio must be >= 1");
  }
  if (o.min_baseline < 2) return Status::InvalidArgument("min_baseline must be >= 2");
  for (const auto& list : {in.transfers, in.peer_transfers}) {
    for (const TransferMeasurement& t : list) {
      if (!ValidTime(t.median_s) || t.bytes == 0) {
        return Status::InvalidArgument("transfer " + std::to_string(t.sender) + " -> " +
                                       std::to_string(t.receiver) +
                                       ": time must be finite and > 0, bytes > 0");
      }
      if (t.sender == t.receiver) {
        return Status::InvalidArgument("transfer from rank " + std::to_string(t.sender) +
                                       " to itself");
      }
    }
  }
  for (const auto& list : {in.gemms, in.peer_gemms}) {
    for (const GemmMeasurement& g : list) {
      if (!ValidTime(g.median_s)) {
        return Status::InvalidArgument("GEMM of rank " + std::to_string(g.rank) +
                                       ": time must be finite and > 0");
      }
    }
  }
  return Status::Ok();
}

void FindGpus(const LocalizationInput& in, const LocalizationOptions& o, Localization& out) {
  Pool pool;
  for (const auto& list : {in.gemms, in.peer_gemms}) {
    for (const GemmMeasurement& g : list) {
      pool.values.push_back(g.median_s);
      pool.sources.insert({g.rank, g.rank});
    }
  }
  std::vector<double> scratch;
  const Baseline b = MakeBaseline(pool, o.gemm_ratio, scratch);
  for (const GemmMeasurement& g : in.gemms) {
    if (b.sources < o.min_baseline) {
      ++out.gemms_unassessed;
      continue;
    }
    if (Slow(g.median_s, b, o.gemm_ratio, 1.0, o)) {
      out.gpus.push_back({g.rank, g.node, MakeEvidence(g.median_s, b), {}});
    }
  }
  std::sort(out.gpus.begin(), out.gpus.end(),
            [](const SlowGpu& a, const SlowGpu& b2) { return a.rank < b2.rank; });
}

// Slow transfers, the peers' included, merged per unordered rank pair.
std::map<RankPair, SlowLink> FindSlowLinks(
    const LocalizationInput& in, const LocalizationOptions& o, Localization& out) {
  std::map<LinkKind, Pool> all;
  std::map<std::pair<LinkKind, std::uint32_t>, Pool> by_pass;
  for (const auto& list : {in.transfers, in.peer_transfers}) {
    for (const TransferMeasurement& t : list) {
      for (Pool* pool : {&all[KindOf(t)], &by_pass[{KindOf(t), t.pass}]}) {
        pool->values.push_back(PerByte(t));
        pool->sources.insert(PairOf(t));
      }
    }
  }
  std::vector<double> scratch;
  std::map<LinkKind, Baseline> all_base;
  for (const auto& [kind, pool] : all) all_base[kind] = MakeBaseline(pool, o.link_ratio, scratch);
  std::map<std::pair<LinkKind, std::uint32_t>, Baseline> pass_base;
  for (const auto& [key, pool] : by_pass) pass_base[key] = MakeBaseline(pool, o.link_ratio, scratch);

  std::map<RankPair, SlowLink> slow;
  for (const auto& list : {in.transfers, in.peer_transfers}) {
    for (const TransferMeasurement& t : list) {
      const Baseline& b_all = all_base[KindOf(t)];
      if (b_all.sources < o.min_baseline) {
        ++out.transfers_unassessed;
        continue;
      }
      const double v = PerByte(t);
      const double bytes = static_cast<double>(t.bytes);
      if (!Slow(v, b_all, o.link_ratio, bytes, o)) continue;
      const Baseline& b_pass = pass_base[{KindOf(t), t.pass}];
      const bool pass_judged = b_pass.sources >= o.min_baseline;
      if (pass_judged && !Slow(v, b_pass, o.link_ratio, bytes, o)) continue;
      SlowLink link{t.sender,      t.receiver, t.sender_node, t.receiver_node, t.pass, 1,
                    MakeEvidence(v, b_all), pass_judged ? MakeEvidence(v, b_pass) : Evidence{}};
      auto [it, inserted] = slow.try_emplace(PairOf(t), link);
      if (!inserted) {
        link.measurements = it->second.measurements + 1;
        if (link.evidence.ratio > it->second.evidence.ratio) {
          it->second = link;
        } else {
          it->second.measurements = link.measurements;
        }
      }
    }
  }
  return slow;
}

// A throttled GPU runs NCCL's copy kernels slowly too, so its own transfers measure slow. A slow
// link with a slow GPU at one end, and no slower than that GPU's GEMM, is the GPU's doing: it is
// moved under the GPU (the slower one when both ends are slow) before NICs are judged. A link
// slower than the GPU at its end stays a link: something besides the GPU slows it.
void ExplainByGpus(std::map<RankPair, SlowLink>& slow, Localization& out) {
  std::map<std::int32_t, SlowGpu*> gpu_of;
  for (SlowGpu& g : out.gpus) gpu_of[g.rank] = &g;
  for (auto it = slow.begin(); it != slow.end();) {
    SlowGpu* by = nullptr;
    for (const std::int32_t rank : {it->first.first, it->first.second}) {
      const auto g = gpu_of.find(rank);
      if (g != gpu_of.end() && (by == nullptr || g->second->evidence.ratio > by->evidence.ratio)) by = g->second;
    }
    if (by != nullptr && it->second.evidence.ratio <= by->evidence.ratio) {
      by->links.push_back(it->second);
      it = slow.erase(it);
    } else {
      ++it;
    }
  }
}

Evidence Summarise(const std::vector<SlowLink>& links) {
  std::vector<double> measured, baseline, ratio, scratch;
  for (const SlowLink& l : links) {
    measured.push_back(l.evidence.measured);
    baseline.push_back(l.evidence.baseline);
    ratio.push_back(l.evidence.ratio);
  }
  return {Median(measured, scratch), Median(baseline, scratch), Median(ratio, scratch),
          links.front().evidence.sigma, links.front().evidence.baseline_count};
}

void FindNics(const LocalizationInput& in, const LocalizationOptions& o,
              std::map<RankPair, SlowLink> slow,
              Localization& out) {
  std::map<std::int32_t, std::set<std::int32_t>> tested, slow_peers;
  for (const auto& list : {in.transfers, in.peer_transfers}) {
    for (const TransferMeasurement& t : list) {
      if (KindOf(t) != LinkKind::kInter) continue;
      tested[t.sender_node].insert(t.receiver_node);
      tested[t.receiver_node].insert(t.sender_node);
    }
  }
  // Explaining away, greediest first: the node whose slow links reach the most peers is taken
  // as a slow NIC, its links are explained, and the others are judged on what is left. A healthy
  // neighbour of a slow NIC then has only its other links to show (a slow NIC slows every link
  // that touches it, so without this its neighbours would look like slow NICs too).
  std::set<std::int32_t> chosen;
  for (;;) {
    slow_peers.clear();
    for (const auto& [key, l] : slow) {
      if (l.sender_node < 0 || l.receiver_node < 0 || l.sender_node == l.receiver_node) continue;
      if (chosen.count(l.sender_node) || chosen.count(l.receiver_node)) continue;
      slow_peers[l.sender_node].insert(l.receiver_node);
      slow_peers[l.receiver_node].insert(l.sender_node);
    }
    std::int32_t best = -1;
    std::size_t best_peers = 0;
    for (const auto& [node, peers] : slow_peers) {
      const std::size_t n_tested = tested[node].size();
      const bool qualifies = peers.size() >= o.nic_min_links &&
                             static_cast<double>(peers.size()) >= o.nic_min_fraction * static_cast<double>(n_tested);
      if (qualifies && peers.size() > best_peers) {
        best = node;
        best_peers = peers.size();
      }
    }
    if (best < 0) break;
    chosen.insert(best);
    out.nics.push_back({best, best_peers, tested[best].size(), {}, {}});
  }
  std::sort(out.nics.begin(), out.nics.end(), [](const SlowNic& a, const SlowNic& b) { return a.node < b.node; });
  for (const auto& [key, l] : slow) {
    bool explained = false;
    for (SlowNic& nic : out.nics) {
      if (l.sender_node == l.receiver_node || explained) continue;
      if (l.sender_node == nic.node || l.receiver_node == nic.node) {
        nic.links.push_back(l);  // a link between two slow NICs is listed under the first
        explained = true;
      }
    }
    if (!explained) out.links.push_back(l);
  }
  for (SlowNic& nic : out.nics) nic.evidence = Summarise(nic.links);
}

}  // namespace

Result<Localization> Localize(const LocalizationInput& input, const LocalizationOptions& options) {
  if (Status s = Validate(input, options); !s.ok()) return s;
  Localization out;
  FindGpus(input, options, out);
  std::map<RankPair, SlowLink> slow = FindSlowLinks(input, options, out);
  ExplainByGpus(slow, out);
  FindNics(input, options, std::move(slow), out);
  return out;
}

}  // namespace falcon::analyzer
