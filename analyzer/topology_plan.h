// S3 topology adjustment (FALCON §5, Figs. 10 and 11) for a TP x DP x PP job whose ranks are
// placed on nodes. Ranks are numbered Megatron-style, TP innermost, then DP, then PP:
//   rank = ((pp_stage * dp) + dp_index) * tp + tp_index.
// A node hosts gpus_per_node ranks (or none: a spare); its k-th GPU runs its k-th lowest rank.
// The planners only exchange whole nodes (a NodeSwap gives node a the ranks of node b and back),
// so a new placement is the old one with node ids permuted, every node keeps its rank count and
// a TP group stays on its node. Two planners:
//  - Link relief (Fig. 10): the link between nodes A and B is congested. Find at most two swaps
//    after which A and B exchange no traffic at all, or else only pipeline (PP) activations,
//    the lightest traffic a slow link can carry, instead of DP gradient all-reduce traffic.
//  - Straggler consolidation (Fig. 11): move the nodes of slow GPUs into as few PP stages as
//    node granularity allows (ceil(#straggler nodes / nodes per stage) when nodes do not
//    straddle stages; that is ceil(#straggler GPUs / GPUs per stage) for whole slow nodes),
//    interior stages before the first and last, which carry the embedding and the loss.
// Both report the expected iteration time before and after from JobCostModel (FALCON appendix):
//   DP bytes per rank and iteration  V_dp = 12 L h^2 / (pp tp) x bytes per element (ring
//       all-reduce: each rank sends 2 (dp - 1) / dp x V_dp to its ring successor, d -> d + 1);
//   PP bytes per micro-batch         V_pp = b n_ctx h x bytes per element, forward activations
//       to stage s + 1 and the same backward to stage s - 1, per TP rank;
//   step(s, d)  = c x (edge factor if s is first or last) x (slow factor if a GPU of the stage
//                 is a straggler) + V_pp / bandwidth to s + 1 + V_pp / bandwidth to s - 1;
//   pipeline(d) = sum_s step(s, d) + (m - 1) x max_s step(s, d)          (1F1B fill and drain);
//   iteration   = max_d pipeline(d) + max over DP groups of 2 (dp - 1) / dp x V_dp / slowest
//                 ring link.
// Links inside a node run at intra_node_bandwidth, between nodes at inter_node_bandwidth, and
// between the two nodes of JobFaults::slow_link at slow_link_bandwidth. TP traffic is not priced
// (it stays inside a node under node swaps); a slow link that carries TP traffic ranks worst.
// Thread-safety: stateless functions on values; safe from any thread.
// Must never: do I/O, read clocks or globals, or return a placement that is not the input's
// with node ids permuted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "falcon/status.h"

namespace falcon::analyzer {

inline constexpr std::int64_t kMaxTopologyRanks = std::int64_t{1} << 24;

struct JobShape {
  std::int32_t tp = 1;
  std::int32_t dp = 1;
  std::int32_t pp = 1;
};

struct RankCoord {
  std::int32_t pp_stage = 0;
  std::int32_t dp_index = 0;
  std::int32_t tp_index = 0;
  friend bool operator==(const RankCoord&, const RankCoord&) = default;
};

// REQUIRES: a valid shape and a rank / coordinate inside it.
[[nodiscard]] std::int32_t RankOf(const JobShape& shape, const RankCoord& coord);
[[nodiscard]] RankCoord CoordOf(const JobShape& shape, std::int32_t rank);

struct JobPlacement {
  JobShape shape;
  std::int32_t gpus_per_node = 8;
  std::int32_t num_nodes = 0;              // nodes 0..num_nodes-1; those hosting no rank are spares
  std::vector<std::int32_t> node_of_rank;  // rank -> node, size tp * dp * pp
};

// Ok when tp, dp, pp, gpus_per_node >= 1, the world size is <= kMaxTopologyRanks,
// node_of_rank has one node in [0, num_nodes) per rank, and each node hosts 0 or exactly
// gpus_per_node ranks; otherwise InvalidArgument naming the first fault.
[[nodiscard]] Status CheckPlacement(const JobPlacement& placement);

struct JobCostModel {
  double layers = 32;                      // L
  double hidden = 4096;                    // h
  double seq_len = 2048;                   // n_ctx
  double micro_batch = 1;                  // b, samples per micro-batch
  double microbatches = 32;                // m, micro-batches per pipeline and iteration
  double bytes_per_element = 2;            // bf16
  double inter_node_bandwidth_Bps = 25e9;  // healthy link between nodes, bytes/s
  double slow_link_bandwidth_Bps = 2.5e9;  // the congested link
  double intra_node_bandwidth_Bps = 150e9;
  double microbatch_compute_s = 0.05;      // forward + backward of one micro-batch, one stage
  double slow_compute_factor = 2.0;        // a straggler GPU's compute time multiplier, >= 1
  double edge_stage_compute_factor = 1.0;  // first / last stage compute multiplier, >= 1
};

// Ok when every field is finite and > 0, and the two factors are >= 1.
[[nodiscard]] Status CheckCostModel(const JobCostModel& model);

struct NodePair {
  std::int32_t a = -1;
  std::int32_t b = -1;
};

// A physical GPU: the local-th GPU of a node. It keeps its node when nodes are swapped, so the
// rank it runs changes with the placement.
struct GpuId {
  std::int32_t node = -1;
  std::int32_t local = -1;
  friend auto operator<=>(const GpuId&, const GpuId&) = default;
};

struct JobFaults {
  std::optional<NodePair> slow_link;  // traffic between these two nodes runs at the slow bandwidth
  std::vector<GpuId> slow_gpus;       // compute slow_compute_factor x slower
};

// The cost model's iteration time for a placement with faults. InvalidArgument for a bad
// placement, model, or a fault naming a node or GPU outside the job.
[[nodiscard]] Result<double> ExpectedIterationTime(const JobPlacement& placement,
                                                   const JobCostModel& model,
                                                   const JobFaults& faults);

// What the traffic between two nodes is, per iteration, both directions summed.
enum class LinkTraffic : std::uint8_t { kIdle, kPipeline, kData, kTensor };  // best to worst

struct LinkLoad {
  LinkTraffic traffic = LinkTraffic::kIdle;  // kTensor if any TP, else kData if any DP, ...
  double dp_bytes = 0;
  double pp_bytes = 0;
};

[[nodiscard]] Result<LinkLoad> LoadBetween(const JobPlacement& placement, const JobCostModel& model,
                                           NodePair nodes);

struct NodeSwap {
  std::int32_t a = -1;
  std::int32_t b = -1;
  friend bool operator==(const NodeSwap&, const NodeSwap&) = default;
};

// The placement after the swaps, in order. InvalidArgument for a bad placement or a swap
// naming a node outside [0, num_nodes).
[[nodiscard]] Result<std::vector<std::int32_t>> ApplySwaps(const JobPlacement& placement,
                                                           std::span<const NodeSwap> swaps);

struct TopologyPlan {
  std::vector<std::int32_t> node_of_rank;  // the new placement (the input's when swaps is empty)
  std::vector<NodeSwap> swaps;             // apply in order
  double iteration_before_s = 0;           // cost model, with the fault, before and after
  double iteration_after_s = 0;
  // Link relief: the congested link's traffic before and after.
  LinkLoad link_before;
  LinkLoad link_after;
  // Consolidation: the sorted PP stages that hold straggler GPUs before and after.
  std::vector<std::int32_t> straggler_stages_before;
  std::vector<std::int32_t> straggler_stages_after;
};

// Link relief. Candidates: no swap; A or B swapped with another node (1 swap); both (2 swaps,
// searched only when no single swap idles the link). The best has the best LinkTraffic, then
// the fewest bytes, then the fewest swaps (then the lowest node ids). It is taken only when its
// traffic is lighter and the cost model says the iteration gets faster; otherwise no swap.
// InvalidArgument for a bad placement or model, a == b, or a node outside the job.
// Cost: O(N g (tp + 3)) for N nodes of g GPUs; O(N^2 g (tp + 3)) when two swaps are searched.
[[nodiscard]] Result<TopologyPlan> PlanLinkRelief(const JobPlacement& placement,
                                                  const JobCostModel& model, NodePair congested);

// Consolidation. Stages are taken greedily, interior before first / last, then those already
// holding the most straggler nodes, then the lowest index, until enough nodes lie wholly inside
// them; straggler nodes outside swap with healthy nodes inside (most preferred stage first).
// InvalidArgument for a bad placement or model, no stragglers, or a GPU outside the job or on a
// spare node.
[[nodiscard]] Result<TopologyPlan> PlanStragglerConsolidation(const JobPlacement& placement,
                                                              const JobCostModel& model,
                                                              std::span<const GpuId> stragglers);

// The physical GPUs that run these ranks now, or all GPUs of these nodes. InvalidArgument for a
// rank or node outside the job (or a node hosting no rank).
[[nodiscard]] Result<std::vector<GpuId>> GpusOfRanks(const JobPlacement& placement,
                                                     std::span<const std::int32_t> ranks);
[[nodiscard]] Result<std::vector<GpuId>> GpusOfNodes(const JobPlacement& placement,
                                                     std::span<const std::int32_t> nodes);

}  // namespace falcon::analyzer
