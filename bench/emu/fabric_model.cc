// Fabric model formulas; see fabric_model.h. Pure code: no state, no I/O, no clock.
#include "fabric_model.h"

#include <algorithm>

namespace falcon::emu {

double ModelEdgeSeconds(const FabricParams& p, const FaultPlan* plan, int a, int b, double bytes,
                        double t_s) {
  const bool intra = a == b;
  const double lat = (intra ? p.intra_lat_us : p.inter_lat_us) * 1e-6;
  const double bw = (intra ? p.intra_gbps : p.inter_gbps) * 1e9;
  const double base = lat + (bw > 0 ? bytes / bw : 0.0);
  return base * (plan ? plan->LinkFactor(a, b, t_s) : 1.0);
}

double ModelCollSeconds(const FabricParams& p, const FaultPlan* plan, CollKind kind,
                        std::span<const int> nodes, double bytes, double t_s) {
  const size_t n = nodes.size();
  if (!p.enabled || n <= 1) return 0;
  const double dn = static_cast<double>(n);
  const double per_step_bytes =
      (kind == CollKind::kBroadcast || kind == CollKind::kReduce || kind == CollKind::kGather ||
       kind == CollKind::kScatter) ? bytes : bytes / dn;
  double max_edge = 0;
  double max_lat = 0;
  for (size_t i = 0; i < n; ++i) {
    const int a = nodes[i];
    const int b = nodes[(i + 1) % n];
    max_edge = std::max(max_edge, ModelEdgeSeconds(p, plan, a, b, per_step_bytes, t_s));
    max_lat = std::max(max_lat, ModelEdgeSeconds(p, plan, a, b, 0, t_s));
  }
  double s = 0;
  switch (kind) {
    case CollKind::kAllReduce: s = 2 * (dn - 1) * max_edge; break;
    case CollKind::kAllGather:
    case CollKind::kReduceScatter:
    case CollKind::kAlltoAll: s = (dn - 1) * max_edge; break;
    case CollKind::kBroadcast:
    case CollKind::kReduce:
    case CollKind::kGather:
    case CollKind::kScatter: s = max_edge + (dn - 2) * max_lat; break;
  }
  return s * p.time_scale;
}

double ModelP2pSeconds(const FabricParams& p, const FaultPlan* plan, int src_node, int dst_node,
                       double bytes, double t_s) {
  if (!p.enabled) return 0;
  return ModelEdgeSeconds(p, plan, src_node, dst_node, bytes, t_s) * p.time_scale;
}

}  // namespace falcon::emu
