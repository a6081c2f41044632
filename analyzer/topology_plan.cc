// S3 topology planners and the job cost model. See topology_plan.h for the contract.
#include "analyzer/topology_plan.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>

namespace falcon::analyzer {
namespace {

std::string Str(std::int64_t v) { return std::to_string(v); }

// A checked placement with the lookups the planners need. Fixed after construction.
struct Layout {
  JobShape shape;
  std::int32_t g = 0;  // GPUs per node
  std::int32_t nodes = 0;
  std::vector<std::int32_t> node_of_rank;
  std::vector<std::int32_t> rank_at;  // node * g + local -> rank; -1 on spares

  std::int32_t world() const { return static_cast<std::int32_t>(node_of_rank.size()); }
  bool Hosts(std::int32_t node) const { return rank_at[Slot(node, 0)] >= 0; }
  std::int32_t RankAt(std::int32_t node, std::int32_t local) const {
    return rank_at[Slot(node, local)];
  }
  static std::size_t Slot(std::int32_t node, std::int32_t local, std::int32_t g) {
    return static_cast<std::size_t>(node) * static_cast<std::size_t>(g) +
           static_cast<std::size_t>(local);
  }
  std::size_t Slot(std::int32_t node, std::int32_t local) const { return Slot(node, local, g); }
};

// REQUIRES: CheckPlacement(p).ok().
Layout MakeLayout(const JobPlacement& p) {
  Layout l{p.shape, p.gpus_per_node, p.num_nodes, p.node_of_rank, {}};
  l.rank_at.assign(Layout::Slot(p.num_nodes, 0, p.gpus_per_node), -1);
  std::vector<std::int32_t> used(static_cast<std::size_t>(p.num_nodes), 0);
  for (std::int32_t r = 0; r < l.world(); ++r) {
    const std::int32_t node = l.node_of_rank[static_cast<std::size_t>(r)];
    l.rank_at[l.Slot(node, used[static_cast<std::size_t>(node)]++)] = r;
  }
  return l;
}

std::int32_t NodeOf(const Layout& l, const RankCoord& c) {
  return l.node_of_rank[static_cast<std::size_t>(RankOf(l.shape, c))];
}

double DpRankBytes(const JobCostModel& m, const JobShape& s) {
  return 12.0 * m.layers * m.hidden * m.hidden / (s.pp * s.tp) * m.bytes_per_element;
}

double RingSendBytes(const JobCostModel& m, const JobShape& s) {
  return 2.0 * (s.dp - 1) / s.dp * DpRankBytes(m, s);
}

double PpMicrobatchBytes(const JobCostModel& m) {
  return m.micro_batch * m.seq_len * m.hidden * m.bytes_per_element;
}

bool IsSlowLink(const JobFaults& f, std::int32_t x, std::int32_t y) {
  return f.slow_link && ((f.slow_link->a == x && f.slow_link->b == y) ||
                         (f.slow_link->a == y && f.slow_link->b == x));
}

double Bandwidth(const JobCostModel& m, const JobFaults& f, std::int32_t x, std::int32_t y) {
  if (x == y) return m.intra_node_bandwidth_Bps;
  return IsSlowLink(f, x, y) ? m.slow_link_bandwidth_Bps : m.inter_node_bandwidth_Bps;
}

// The slowest DP all-reduce: each (stage, tp index) ring over d = 0..dp-1.
double DataParallelTime(const Layout& l, const JobCostModel& m, const JobFaults& f) {
  if (l.shape.dp < 2) return 0;
  double worst = 0;
  for (std::int32_t s = 0; s < l.shape.pp; ++s) {
    for (std::int32_t t = 0; t < l.shape.tp; ++t) {
      double slowest = m.intra_node_bandwidth_Bps;
      for (std::int32_t d = 0; d < l.shape.dp; ++d) {
        const std::int32_t x = NodeOf(l, {s, d, t});
        const std::int32_t y = NodeOf(l, {s, (d + 1) % l.shape.dp, t});
        slowest = std::min(slowest, Bandwidth(m, f, x, y));
      }
      worst = std::max(worst, RingSendBytes(m, l.shape) / slowest);
    }
  }
  return worst;
}

// One micro-batch step of stage s of pipeline d: compute plus the PP sends of its TP ranks.
double StepTime(const Layout& l, const JobCostModel& m, const JobFaults& f,
                const std::vector<char>& slow_rank, std::int32_t s, std::int32_t d) {
  const bool edge = s == 0 || s == l.shape.pp - 1;
  bool slow = false;
  double comm = 0;
  for (std::int32_t t = 0; t < l.shape.tp; ++t) {
    slow = slow || slow_rank[static_cast<std::size_t>(RankOf(l.shape, {s, d, t}))] != 0;
    const std::int32_t here = NodeOf(l, {s, d, t});
    double sends = 0;
    for (const std::int32_t peer : {s + 1, s - 1}) {
      if (peer < 0 || peer >= l.shape.pp) continue;
      sends += PpMicrobatchBytes(m) / Bandwidth(m, f, here, NodeOf(l, {peer, d, t}));
    }
    comm = std::max(comm, sends);
  }
  return m.microbatch_compute_s * (edge ? m.edge_stage_compute_factor : 1.0) *
             (slow ? m.slow_compute_factor : 1.0) +
         comm;
}

// REQUIRES: checked layout, model and faults.
double IterationTime(const Layout& l, const JobCostModel& m, const JobFaults& f) {
  std::vector<char> slow_rank(static_cast<std::size_t>(l.world()), 0);
  for (const GpuId& gpu : f.slow_gpus) {
    slow_rank[static_cast<std::size_t>(l.RankAt(gpu.node, gpu.local))] = 1;
  }
  double pipelines = 0;
  for (std::int32_t d = 0; d < l.shape.dp; ++d) {
    double sum = 0, slowest = 0;
    for (std::int32_t s = 0; s < l.shape.pp; ++s) {
      const double step = StepTime(l, m, f, slow_rank, s, d);
      sum += step;
      slowest = std::max(slowest, step);
    }
    pipelines = std::max(pipelines, sum + (m.microbatches - 1) * slowest);
  }
  return pipelines + DataParallelTime(l, m, f);
}

Status CheckNode(const Layout& l, std::int32_t node, const char* what) {
  if (node < 0 || node >= l.nodes) {
    return Status::InvalidArgument(std::string(what) + ": node " + Str(node) + " outside 0.." +
                                   Str(l.nodes - 1));
  }
  return Status::Ok();
}

Status CheckGpus(const Layout& l, std::span<const GpuId> gpus) {
  for (const GpuId& gpu : gpus) {
    if (Status s = CheckNode(l, gpu.node, "slow GPU"); !s.ok()) return s;
    if (gpu.local < 0 || gpu.local >= l.g || !l.Hosts(gpu.node)) {
      return Status::InvalidArgument("slow GPU " + Str(gpu.local) + " of node " + Str(gpu.node) +
                                     " runs no rank of the job");
    }
  }
  return Status::Ok();
}

Status CheckFaults(const Layout& l, const JobFaults& f) {
  if (f.slow_link) {
    if (Status s = CheckNode(l, f.slow_link->a, "slow link"); !s.ok()) return s;
    if (Status s = CheckNode(l, f.slow_link->b, "slow link"); !s.ok()) return s;
    if (f.slow_link->a == f.slow_link->b) {
      return Status::InvalidArgument("slow link: both ends are node " + Str(f.slow_link->a));
    }
  }
  return CheckGpus(l, f.slow_gpus);
}

// Traffic between the ranks now on nodes x and y (x != y), per iteration, both directions.
LinkLoad Load(const Layout& l, const JobCostModel& m, std::int32_t x, std::int32_t y) {
  LinkLoad load;
  bool tp = false;
  for (const auto& [from, to] : {std::pair{x, y}, std::pair{y, x}}) {
    if (!l.Hosts(from)) continue;
    for (std::int32_t local = 0; local < l.g; ++local) {
      const RankCoord c = CoordOf(l.shape, l.RankAt(from, local));
      if (l.shape.dp > 1 &&
          NodeOf(l, {c.pp_stage, (c.dp_index + 1) % l.shape.dp, c.tp_index}) == to) {
        load.dp_bytes += RingSendBytes(m, l.shape);
      }
      for (const std::int32_t peer : {c.pp_stage + 1, c.pp_stage - 1}) {
        if (peer >= 0 && peer < l.shape.pp && NodeOf(l, {peer, c.dp_index, c.tp_index}) == to) {
          load.pp_bytes += m.microbatches * PpMicrobatchBytes(m);
        }
      }
      for (std::int32_t t = 0; t < l.shape.tp; ++t) {
        tp = tp || (t != c.tp_index && NodeOf(l, {c.pp_stage, c.dp_index, t}) == to);
      }
    }
  }
  load.traffic = tp                  ? LinkTraffic::kTensor
                 : load.dp_bytes > 0 ? LinkTraffic::kData
                 : load.pp_bytes > 0 ? LinkTraffic::kPipeline
                                     : LinkTraffic::kIdle;
  return load;
}

// Node relabelling by swaps: after the swaps, the ranks first on node n are on host[n].
std::vector<std::int32_t> Swapped(const Layout& l, std::span<const NodeSwap> swaps) {
  std::vector<std::int32_t> host(static_cast<std::size_t>(l.nodes));
  std::vector<std::int32_t> holds(static_cast<std::size_t>(l.nodes));  // inverse of host
  std::iota(host.begin(), host.end(), 0);
  std::iota(holds.begin(), holds.end(), 0);
  for (const NodeSwap& s : swaps) {
    const std::int32_t x = holds[static_cast<std::size_t>(s.a)];
    const std::int32_t y = holds[static_cast<std::size_t>(s.b)];
    std::swap(host[static_cast<std::size_t>(x)], host[static_cast<std::size_t>(y)]);
    std::swap(holds[static_cast<std::size_t>(s.a)], holds[static_cast<std::size_t>(s.b)]);
  }
  std::vector<std::int32_t> out(l.node_of_rank.size());
  for (std::size_t r = 0; r < out.size(); ++r) {
    out[r] = host[static_cast<std::size_t>(l.node_of_rank[r])];
  }
  return out;
}

struct Candidate {
  LinkLoad load;
  std::vector<NodeSwap> swaps;
  auto Key() const { return std::tuple(load.traffic, load.dp_bytes + load.pp_bytes, swaps.size()); }
};

void Consider(Candidate c, Candidate& best) {
  if (c.Key() < best.Key()) best = std::move(c);
}

// The best candidate placement for the link a-b (see PlanLinkRelief).
Candidate BestRelief(const Layout& l, const JobCostModel& m, std::int32_t a, std::int32_t b) {
  Candidate best{Load(l, m, a, b), {}};
  for (std::int32_t x = 0; x < l.nodes; ++x) {
    if (x == a || x == b) continue;
    Consider({Load(l, m, x, b), {{a, x}}}, best);  // a takes x's ranks
    Consider({Load(l, m, a, x), {{b, x}}}, best);  // b takes x's ranks
  }
  if (best.load.traffic == LinkTraffic::kIdle) return best;
  for (std::int32_t x = 0; x < l.nodes; ++x) {
    for (std::int32_t y = x + 1; y < l.nodes; ++y) {
      if (x == a || x == b || y == a || y == b) continue;
      Consider({Load(l, m, x, y), {{a, x}, {b, y}}}, best);
    }
  }
  return best;
}

JobPlacement WithNodes(const JobPlacement& p, std::vector<std::int32_t> node_of_rank) {
  JobPlacement out = p;
  out.node_of_rank = std::move(node_of_rank);
  return out;
}

Status CheckShape(const JobPlacement& p) {
  const JobShape& s = p.shape;
  if (s.tp < 1 || s.dp < 1 || s.pp < 1 || p.gpus_per_node < 1 || p.num_nodes < 1) {
    return Status::InvalidArgument("placement: tp " + Str(s.tp) + ", dp " + Str(s.dp) + ", pp " +
                                   Str(s.pp) + ", GPUs per node " + Str(p.gpus_per_node) +
                                   ", nodes " + Str(p.num_nodes) + ": each must be >= 1");
  }
  const std::int64_t world = std::int64_t{s.tp} * s.dp * s.pp;
  const std::int64_t gpus = std::int64_t{p.num_nodes} * p.gpus_per_node;
  if (s.tp > kMaxTopologyRanks || s.dp > kMaxTopologyRanks || world > kMaxTopologyRanks ||
      gpus > 4 * kMaxTopologyRanks) {
    return Status::InvalidArgument("placement: " + Str(world) + " ranks on " + Str(gpus) +
                                   " GPUs; at most " + Str(kMaxTopologyRanks) + " ranks");
  }
  if (p.node_of_rank.size() != static_cast<std::size_t>(world)) {
    return Status::InvalidArgument(
        "placement: " + Str(static_cast<std::int64_t>(p.node_of_rank.size())) +
        " nodes listed for " + Str(world) + " ranks");
  }
  return Status::Ok();
}

std::vector<std::int32_t> StragglerStages(const Layout& l, std::span<const GpuId> gpus) {
  std::vector<std::int32_t> stages;
  for (const GpuId& gpu : gpus) {
    stages.push_back(CoordOf(l.shape, l.RankAt(gpu.node, gpu.local)).pp_stage);
  }
  std::sort(stages.begin(), stages.end());
  stages.erase(std::unique(stages.begin(), stages.end()), stages.end());
  return stages;
}

}  // namespace

std::int32_t RankOf(const JobShape& shape, const RankCoord& c) {
  return ((c.pp_stage * shape.dp) + c.dp_index) * shape.tp + c.tp_index;
}

RankCoord CoordOf(const JobShape& shape, std::int32_t rank) {
  return {rank / (shape.tp * shape.dp), rank / shape.tp % shape.dp, rank % shape.tp};
}

Status CheckPlacement(const JobPlacement& p) {
  if (Status s = CheckShape(p); !s.ok()) return s;
  std::vector<std::int32_t> count(static_cast<std::size_t>(p.num_nodes), 0);
  for (std::size_t r = 0; r < p.node_of_rank.size(); ++r) {
    const std::int32_t node = p.node_of_rank[r];
    if (node < 0 || node >= p.num_nodes) {
      return Status::InvalidArgument("placement: rank " + Str(static_cast<std::int64_t>(r)) +
                                     " on node " + Str(node) + ", outside 0.." +
                                     Str(p.num_nodes - 1));
    }
    ++count[static_cast<std::size_t>(node)];
  }
  for (std::int32_t n = 0; n < p.num_nodes; ++n) {
    const std::int32_t c = count[static_cast<std::size_t>(n)];
    if (c != 0 && c != p.gpus_per_node) {
      return Status::InvalidArgument("placement: node " + Str(n) + " hosts " + Str(c) +
                                     " ranks; a node hosts 0 or " + Str(p.gpus_per_node));
    }
  }
  return Status::Ok();
}

Status CheckCostModel(const JobCostModel& m) {
  const std::pair<const char*, double> fields[] = {
      {"layers", m.layers},
      {"hidden", m.hidden},
      {"seq_len", m.seq_len},
      {"micro_batch", m.micro_batch},
      {"microbatches", m.microbatches},
      {"bytes_per_element", m.bytes_per_element},
      {"inter_node_bandwidth_Bps", m.inter_node_bandwidth_Bps},
      {"slow_link_bandwidth_Bps", m.slow_link_bandwidth_Bps},
      {"intra_node_bandwidth_Bps", m.intra_node_bandwidth_Bps},
      {"microbatch_compute_s", m.microbatch_compute_s},
      {"slow_compute_factor", m.slow_compute_factor},
      {"edge_stage_compute_factor", m.edge_stage_compute_factor},
  };
  for (const auto& [name, v] : fields) {
    if (!std::isfinite(v) || v <= 0) {
      return Status::InvalidArgument(std::string("cost model: ") + name +
                                     " must be finite and > 0, got " + std::to_string(v));
    }
  }
  if (m.slow_compute_factor < 1 || m.edge_stage_compute_factor < 1 || m.microbatches < 1) {
    return Status::InvalidArgument("cost model: compute factors and micro-batches must be >= 1");
  }
  return Status::Ok();
}

Result<double> ExpectedIterationTime(const JobPlacement& placement, const JobCostModel& model,
                                     const JobFaults& faults) {
  if (Status s = CheckPlacement(placement); !s.ok()) return s;
  if (Status s = CheckCostModel(model); !s.ok()) return s;
  const Layout l = MakeLayout(placement);
  if (Status s = CheckFaults(l, faults); !s.ok()) return s;
  return IterationTime(l, model, faults);
}

Result<LinkLoad> LoadBetween(const JobPlacement& placement, const JobCostModel& model,
                             NodePair nodes) {
  if (Status s = CheckPlacement(placement); !s.ok()) return s;
  if (Status s = CheckCostModel(model); !s.ok()) return s;
  const Layout l = MakeLayout(placement);
  if (Status s = CheckFaults(l, {nodes, {}}); !s.ok()) return s;
  return Load(l, model, nodes.a, nodes.b);
}

Result<std::vector<std::int32_t>> ApplySwaps(const JobPlacement& placement,
                                             std::span<const NodeSwap> swaps) {
  if (Status s = CheckPlacement(placement); !s.ok()) return s;
  const Layout l = MakeLayout(placement);
  for (const NodeSwap& swap : swaps) {
    if (Status s = CheckNode(l, swap.a, "swap"); !s.ok()) return s;
    if (Status s = CheckNode(l, swap.b, "swap"); !s.ok()) return s;
  }
  return Swapped(l, swaps);
}

Result<TopologyPlan> PlanLinkRelief(const JobPlacement& placement, const JobCostModel& model,
                                    NodePair congested) {
  if (Status s = CheckPlacement(placement); !s.ok()) return s;
  if (Status s = CheckCostModel(model); !s.ok()) return s;
  const Layout l = MakeLayout(placement);
  const JobFaults faults{congested, {}};
  if (Status s = CheckFaults(l, faults); !s.ok()) return s;
  Candidate best = BestRelief(l, model, congested.a, congested.b);
  TopologyPlan plan;
  plan.link_before = Load(l, model, congested.a, congested.b);
  plan.iteration_before_s = IterationTime(l, model, faults);
  const std::vector<std::int32_t> moved = Swapped(l, best.swaps);
  const double moved_s = IterationTime(MakeLayout(WithNodes(placement, moved)), model, faults);
  if (best.swaps.empty() || moved_s >= plan.iteration_before_s) {
    // Nothing better, or lighter traffic that the model says is no faster: stay.
    plan.node_of_rank = placement.node_of_rank;
    plan.link_after = plan.link_before;
    plan.iteration_after_s = plan.iteration_before_s;
    return plan;
  }
  plan.node_of_rank = moved;
  plan.swaps = std::move(best.swaps);
  plan.link_after = best.load;
  plan.iteration_after_s = moved_s;
  return plan;
}

}  // namespace falcon::analyzer

namespace falcon::analyzer {
namespace {

using StageSets = std::vector<std::vector<std::int32_t>>;

// The distinct PP stages of the ranks on each node (empty for spares).
StageSets NodeStages(const Layout& l) {
  StageSets stages(static_cast<std::size_t>(l.nodes));
  for (std::int32_t r = 0; r < l.world(); ++r) {
    stages[static_cast<std::size_t>(l.node_of_rank[static_cast<std::size_t>(r)])].push_back(
        CoordOf(l.shape, r).pp_stage);
  }
  for (auto& s : stages) {
    std::sort(s.begin(), s.end());
    s.erase(std::unique(s.begin(), s.end()), s.end());
  }
  return stages;
}

// Stages by preference: interior before first / last, then more straggler nodes wholly inside,
// then the lower index.
std::vector<std::int32_t> StageOrder(const Layout& l, const StageSets& stages_of,
                                     std::span<const std::int32_t> straggler_nodes) {
  std::vector<std::int32_t> inside(static_cast<std::size_t>(l.shape.pp), 0);
  for (const std::int32_t n : straggler_nodes) {
    const auto& s = stages_of[static_cast<std::size_t>(n)];
    if (s.size() == 1) ++inside[static_cast<std::size_t>(s[0])];
  }
  std::vector<std::int32_t> order(static_cast<std::size_t>(l.shape.pp));
  for (std::int32_t s = 0; s < l.shape.pp; ++s) order[static_cast<std::size_t>(s)] = s;
  auto key = [&](std::int32_t s) {
    const bool edge = s == 0 || s == l.shape.pp - 1;
    return std::tuple(edge, -inside[static_cast<std::size_t>(s)], s);
  };
  std::sort(order.begin(), order.end(), [&](auto x, auto y) { return key(x) < key(y); });
  return order;
}

// Takes stages in order until at least k hosting nodes lie wholly inside the chosen ones.
// Returns each stage's position among the chosen (-1: not chosen).
std::vector<std::int32_t> ChooseStages(const Layout& l, const StageSets& stages_of,
                                       std::span<const std::int32_t> order, std::size_t k) {
  std::vector<std::int32_t> position(static_cast<std::size_t>(l.shape.pp), -1);
  for (std::size_t i = 0; i < order.size(); ++i) {
    position[static_cast<std::size_t>(order[i])] = static_cast<std::int32_t>(i);
    std::size_t capacity = 0;
    for (const auto& s : stages_of) {
      const bool inside = !s.empty() && std::all_of(s.begin(), s.end(), [&](std::int32_t x) {
        return position[static_cast<std::size_t>(x)] >= 0;
      });
      capacity += inside ? 1 : 0;
    }
    if (capacity >= k) break;
  }
  return position;
}

// Nodes wholly inside the chosen stages, most preferred stage first, then by node id.
std::vector<std::int32_t> TargetNodes(const StageSets& stages_of,
                                      const std::vector<std::int32_t>& position) {
  std::vector<std::pair<std::int32_t, std::int32_t>> keyed;  // (worst position, node)
  for (std::size_t n = 0; n < stages_of.size(); ++n) {
    if (stages_of[n].empty()) continue;  // a spare
    std::int32_t worst = 0;
    bool inside = true;
    for (const std::int32_t s : stages_of[n]) {
      const std::int32_t p = position[static_cast<std::size_t>(s)];
      inside = inside && p >= 0;
      worst = std::max(worst, p);
    }
    if (inside) keyed.push_back({worst, static_cast<std::int32_t>(n)});
  }
  std::sort(keyed.begin(), keyed.end());
  std::vector<std::int32_t> out;
  for (const auto& [p, n] : keyed) out.push_back(n);
  return out;
}

// Straggler nodes outside the targets swap with healthy targets, in order.
std::vector<NodeSwap> ConsolidationSwaps(std::span<const std::int32_t> targets,
                                         std::span<const std::int32_t> straggler_nodes) {
  auto is_straggler = [&](std::int32_t n) {
    return std::binary_search(straggler_nodes.begin(), straggler_nodes.end(), n);
  };
  std::vector<std::int32_t> healthy_targets;
  for (const std::int32_t n : targets) {
    if (!is_straggler(n)) healthy_targets.push_back(n);
  }
  std::vector<NodeSwap> swaps;
  std::size_t next = 0;
  for (const std::int32_t n : straggler_nodes) {
    if (std::find(targets.begin(), targets.end(), n) != targets.end()) continue;
    swaps.push_back({n, healthy_targets[next++]});
  }
  return swaps;
}

std::vector<std::int32_t> NodesOf(std::span<const GpuId> gpus) {
  std::vector<std::int32_t> nodes;
  for (const GpuId& gpu : gpus) nodes.push_back(gpu.node);
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  return nodes;
}

}  // namespace

Result<TopologyPlan> PlanStragglerConsolidation(const JobPlacement& placement,
                                                const JobCostModel& model,
                                                std::span<const GpuId> stragglers) {
  if (Status s = CheckPlacement(placement); !s.ok()) return s;
  if (Status s = CheckCostModel(model); !s.ok()) return s;
  if (stragglers.empty()) return Status::InvalidArgument("consolidation: no straggler GPUs");
  const Layout l = MakeLayout(placement);
  const JobFaults faults{std::nullopt, {stragglers.begin(), stragglers.end()}};
  if (Status s = CheckFaults(l, faults); !s.ok()) return s;

  const std::vector<std::int32_t> straggler_nodes = NodesOf(stragglers);
  const StageSets stages_of = NodeStages(l);
  const std::vector<std::int32_t> order = StageOrder(l, stages_of, straggler_nodes);
  const std::vector<std::int32_t> position =
      ChooseStages(l, stages_of, order, straggler_nodes.size());
  TopologyPlan plan;
  plan.swaps = ConsolidationSwaps(TargetNodes(stages_of, position), straggler_nodes);
  plan.node_of_rank = Swapped(l, plan.swaps);
  const Layout after = MakeLayout(WithNodes(placement, plan.node_of_rank));
  plan.straggler_stages_before = StragglerStages(l, stragglers);
  plan.straggler_stages_after = StragglerStages(after, stragglers);
  plan.iteration_before_s = IterationTime(l, model, faults);
  plan.iteration_after_s = IterationTime(after, model, faults);
  return plan;
}

Result<std::vector<GpuId>> GpusOfRanks(const JobPlacement& placement,
                                       std::span<const std::int32_t> ranks) {
  if (Status s = CheckPlacement(placement); !s.ok()) return s;
  const Layout l = MakeLayout(placement);
  std::vector<GpuId> gpus;
  for (const std::int32_t r : ranks) {
    if (r < 0 || r >= l.world()) {
      return Status::InvalidArgument("rank " + Str(r) + " outside 0.." + Str(l.world() - 1));
    }
    const std::int32_t node = l.node_of_rank[static_cast<std::size_t>(r)];
    std::int32_t local = 0;
    while (l.RankAt(node, local) != r) ++local;
    gpus.push_back({node, local});
  }
  return gpus;
}

Result<std::vector<GpuId>> GpusOfNodes(const JobPlacement& placement,
                                       std::span<const std::int32_t> nodes) {
  if (Status s = CheckPlacement(placement); !s.ok()) return s;
  const Layout l = MakeLayout(placement);
  std::vector<GpuId> gpus;
  for (const std::int32_t n : nodes) {
    if (Status s = CheckNode(l, n, "straggler"); !s.ok()) return s;
    if (!l.Hosts(n)) return Status::InvalidArgument("straggler: node " + Str(n) + " hosts no rank");
    for (std::int32_t local = 0; local < l.g; ++local) gpus.push_back({n, local});
  }
  return gpus;
}

}  // namespace falcon::analyzer
