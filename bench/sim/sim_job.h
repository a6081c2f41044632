// SimJob: the modelled job behind falcon-sim — its layout, communicators, call pattern and
// iteration clock, computed the same way in every simulator process.
//
// Layout is Megatron's rank order (TP fastest, then DP, then PP); nodes hold `gpus_per_node`
// consecutive ranks. Communicators per rank: its TP group (TP > 1), its DP group (DP > 1) and
// one two-rank communicator per neighbouring pipeline stage (PP > 1; the stage pairs PyTorch
// makes for unbatched send/recv). One iteration, per rank, in ordered units:
//   per micro-batch, forward:  2 TP all-reduces, then one group {recv from the previous stage,
//                              send to the next} (the stages it has);
//   per micro-batch, backward: 2 TP all-reduces, then one group {recv from the next stage, send
//                              to the previous};
//   then the DP reduce-scatter and all-gather.
// Every member of every communicator issues the same number of calls on it per iteration, so a
// cut at an iteration boundary is consistent, as in the real job.
//
// The clock: iteration k of the job starts at the same wall time on every rank (synchronous
// training, plus a fixed per-rank skew of a few ms) and lasts the healthy time x noise x the
// slowdown of the faults active at its start. Compute faults slow the job by the compute
// share of their factor; link and NIC faults by the communication share, when the slowed link
// carries the job's traffic (any two nodes of one DP group or neighbouring PP stages). A pause
// holds the clock: trapped at the boundary before iteration k, the job starts k when it is
// resumed (Hold), and every later iteration moves with it, as a real job's would.
// Thread-safety: one thread per SimJob (IterationAt fills a lazy cache; Hold changes the clock).
// Must never: do I/O.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "analyzer/cut_plan.h"
#include "falcon/status.h"

namespace falcon::sim {

// Payloads of the modelled calls: a TP all-reduce, a DP gradient bucket, one activation.
inline constexpr std::uint64_t kTpBytes = 16ull << 20;
inline constexpr std::uint64_t kDpBytes = 256ull << 20;
inline constexpr std::uint64_t kPpBytes = 32ull << 20;

struct SimFault {
  std::string kind;               // compute | link | nic (hang: refused, not modelled yet)
  std::vector<std::int64_t> ranks;  // compute
  std::vector<std::int64_t> nodes;  // link: two nodes; nic: one
  double start_s = 0;
  double duration_s = 0;          // 0: until the end
  double factor = 1;
};

struct SimShape {
  int tp = 1, pp = 1, dp = 1;
  int gpus_per_node = 8;
  int micro_batches = 8;
  double iteration_s = 1.0;       // healthy
  double noise = 0.01;            // relative sd of an iteration's time
  double compute_share = 0.8;     // a compute fault of factor f slows the job 1 + (f-1) x this
  double comm_share = 0.3;        // a link/NIC fault of factor f slows it 1 + (f-1) x this
  std::uint64_t seed = 1;
  std::int64_t ranks() const { return std::int64_t{tp} * pp * dp; }
  std::int64_t nodes() const { return (ranks() + gpus_per_node - 1) / gpus_per_node; }
};

// Reads the fault-plan JSON of DESIGN.md. InvalidArgument says what is wrong.
[[nodiscard]] Result<std::vector<SimFault>> ParseFaultPlan(const std::string& text, const SimShape& shape);

struct SimComm {
  std::uint64_t id = 0;
  std::int32_t rank = 0;   // the rank's rank in it
  std::int32_t nranks = 0;
  std::string kind;        // tp | dp | pp
  std::int64_t peer_prev = -1, peer_next = -1;  // pp pair: global ranks
  std::uint64_t calls_per_iteration = 0;
};

class SimJob {
 public:
  SimJob(SimShape shape, std::vector<SimFault> faults, std::int64_t start_ns);

  const SimShape& shape() const { return shape_; }
  const std::vector<SimFault>& faults() const { return faults_; }
  std::int64_t start_ns() const { return start_ns_; }

  int TpIndex(std::int64_t r) const { return static_cast<int>(r % shape_.tp); }
  int DpIndex(std::int64_t r) const { return static_cast<int>((r / shape_.tp) % shape_.dp); }
  int Stage(std::int64_t r) const { return static_cast<int>(r / (std::int64_t{shape_.tp} * shape_.dp)); }
  std::int64_t Node(std::int64_t r) const { return r / shape_.gpus_per_node; }
  std::string Host(std::int64_t node) const { return "node" + std::to_string(node); }

  // The rank's communicators, in a fixed order (tp, dp, pp-prev, pp-next; those it has).
  std::vector<SimComm> Comms(std::int64_t r) const;
  // Ordered calls per iteration (the period the agent's ACF finds).
  std::uint64_t Period(std::int64_t r) const;
  // One iteration of the rank's calls as cut-plan units, starting at an iteration boundary.
  analyzer::RankCallPattern Pattern(std::int64_t r, std::uint64_t iterations_done) const;

  // Iteration k of the job: start (wall ns) and length (s), common to every rank.
  struct Iteration {
    std::int64_t start_ns = 0;
    double seconds = 0;
  };
  Iteration IterationAt(std::uint64_t k);
  // Iterations started strictly before wall time t (the first not yet started).
  std::uint64_t IterationsBefore(std::int64_t t_ns);
  // The job is held at the boundary before iteration k until wall time `until_ns`: iteration k
  // starts then, if it would have started earlier (k - 1 ends as before: the gap is the pause
  // an agent sees between the two iteration boundaries). Holding k again replaces the time (a
  // resume before the trap's deadline); iterations before k keep theirs.
  void Hold(std::uint64_t k, std::int64_t until_ns);
  // When iteration k would start were the job not held before it (a pause's cut, planned
  // before the pause holds it).
  std::int64_t UnheldStart(std::uint64_t k);
  // Fixed skew of a rank's iteration boundary, ns (0..4 ms).
  std::int64_t Skew(std::int64_t r) const;

  // The job's slowdown factor from faults active at wall time t (1 = healthy), and the faults
  // active then.
  double Slowdown(std::int64_t t_ns) const;
  bool LinkCarriesTraffic(std::int64_t node_a, std::int64_t node_b) const;
  // Whether fault f is active at wall time t.
  bool Active(const SimFault& f, std::int64_t t_ns) const;

 private:
  SimShape shape_;
  std::vector<SimFault> faults_;
  std::int64_t start_ns_ = 0;
  std::vector<Iteration> iterations_;  // cache, grows with IterationAt
  std::map<std::uint64_t, std::int64_t> holds_;  // iteration -> not started before
};

// Deterministic 64-bit mix (splitmix64), for ids and noise.
std::uint64_t Mix(std::uint64_t x);

}  // namespace falcon::sim
