// Fabric model of the NCCL emulator: turns a collective or point-to-point transfer into modelled
// seconds from the placement of its members on emulated nodes, link bandwidth/latency and the
// fault plan's link/nic slowdowns at the time the operation starts.
//
// Model (n members in communicator order, ring i -> i+1 mod n; bytes = the op's message size):
//   edge(a, b, m)   = (lat(a,b) + m / bw(a,b)) * LinkFactor(node a, node b, t)
//   all-reduce      = 2(n-1) * max_ring_edge(bytes / n)
//   all-gather, reduce-scatter, all-to-all = (n-1) * max_ring_edge(bytes / n)   (bytes = total)
//   broadcast, reduce, gather, scatter     = max_ring_edge(bytes) + (n-2) * max_ring_latency
//   send/recv       = edge(src, dst, bytes)
// then multiplied by time_scale; n == 1 costs 0. Intra-node pairs use the intra figures.
//
// Thread-safety: pure functions of their arguments. Must never read the environment or the clock.
#ifndef FALCON_BENCH_EMU_FABRIC_MODEL_H_
#define FALCON_BENCH_EMU_FABRIC_MODEL_H_

#include <span>

#include "fault_plan.h"

namespace falcon::emu {

struct FabricParams {
  bool enabled = true;
  double intra_gbps = 100;    // GB/s (1e9 bytes/s)
  double inter_gbps = 25;
  double intra_lat_us = 2;
  double inter_lat_us = 10;
  double time_scale = 1;
};

enum class CollKind {
  kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter, kAlltoAll, kGather, kScatter,
};

// Seconds for one transfer of `bytes` between nodes a and b at job time t_s.
[[nodiscard]] double ModelEdgeSeconds(const FabricParams& p, const FaultPlan* plan, int node_a,
                                      int node_b, double bytes, double t_s);
// Seconds for a collective; `nodes` holds each member's node in communicator order.
[[nodiscard]] double ModelCollSeconds(const FabricParams& p, const FaultPlan* plan, CollKind kind,
                                      std::span<const int> nodes, double bytes, double t_s);
// Seconds for a send/recv pair.
[[nodiscard]] double ModelP2pSeconds(const FabricParams& p, const FaultPlan* plan, int src_node,
                                     int dst_node, double bytes, double t_s);

}  // namespace falcon::emu

#endif  // FALCON_BENCH_EMU_FABRIC_MODEL_H_
