// SimAgents: the device time of a call as the profile window reports it. See sim_agents.h.
//
// A collective's device time on one member is its transfer plus its wait for the last member to
// arrive. The transfer follows the fabric model (DeviceModel) and is slowed by a link or NIC
// fault on any link the communicator's ring crosses. The wait: a compute straggler with factor f
// arrives late by (f - 1) x its compute between two calls of the communicator; its peers wait
// that long, it waits least.
#include <algorithm>

#include "bench/sim/sim_agents.h"

namespace falcon::sim {

std::vector<SimAgents::Signature> SimAgents::ProfileSignatures(const SimComm& c) {
  if (c.kind == "tp") return {{"AllReduce", kTpBytes, -1}};
  if (c.kind == "dp") {
    return {{"ReduceScatter", kDpBytes / static_cast<std::uint64_t>(c.nranks), -1},
            {"AllGather", kDpBytes / static_cast<std::uint64_t>(c.nranks), -1}};
  }
  const std::int32_t other = 1 - c.rank;  // a stage pair: the peer's rank in it
  return {{"Send", kPpBytes, other}, {"Recv", kPpBytes, other}};
}

double SimAgents::CallMicros(std::int64_t rank, const SimComm& c, const Signature& sig, std::int64_t now_ns) const {
  const SimShape& shape = job_.shape();
  // Members, in ring order.
  std::vector<std::int64_t> members;
  if (c.kind == "tp") {
    const std::int64_t first = rank - job_.TpIndex(rank);
    for (int t = 0; t < shape.tp; ++t) members.push_back(first + t);
  } else if (c.kind == "dp") {
    const std::int64_t first = rank - std::int64_t{job_.DpIndex(rank)} * shape.tp;
    for (int d = 0; d < shape.dp; ++d) members.push_back(first + std::int64_t{d} * shape.tp);
  } else {
    members = {c.peer_prev >= 0 ? c.peer_prev : rank, c.peer_next >= 0 ? c.peer_next : rank};
  }
  // Transfer: the ring's slowest hop sets the pace.
  const double n = static_cast<double>(members.size());
  const double volume = c.kind == "tp" ? 2.0 * (n - 1) / n * static_cast<double>(sig.bytes)
                        : c.kind == "dp" ? (n - 1) * static_cast<double>(sig.bytes)
                                         : static_cast<double>(sig.bytes);
  double hop_s = 0;
  for (std::size_t i = 0; i < members.size(); ++i) {
    const std::int64_t a = members[i], b = members[(i + 1) % members.size()];
    if (a == b) continue;
    hop_s = std::max(hop_s, P2pSeconds(a, b, 1'000'000'000, now_ns) - device_.latency_s);  // s per GB
  }
  double transfer_s = device_.latency_s + volume / 1e9 * hop_s;
  // Wait for a compute straggler among the members (not the straggler itself).
  double wait_s = 0;
  for (const SimFault& f : job_.faults()) {
    if (f.kind != "compute" || !job_.Active(f, now_ns)) continue;
    for (std::int64_t slow : f.ranks) {
      if (slow == rank || std::find(members.begin(), members.end(), slow) == members.end()) continue;
      const double compute_between = shape.iteration_s * shape.compute_share /
                                     static_cast<double>(std::max<std::uint64_t>(1, c.calls_per_iteration));
      wait_s = std::max(wait_s, (f.factor - 1.0) * compute_between);
    }
  }
  return (transfer_s + wait_s) * 1e6;
}

}  // namespace falcon::sim
