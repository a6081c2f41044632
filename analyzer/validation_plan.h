// Validation pass plans (FALCON §4.3, Fig. 9): which P2P transfers to run, in which pass, to test
// every link of a suspicious group's ring and tree while the job is paused, and the GEMM task that
// tests a compute suspect's GPU. In a pass every rank takes part in at most one transfer (the
// pass is a matching), so the transfers of a pass run at once without contending for a rank's
// GPU or PCIe lanes, and a slow link stands out against its pass's median.
//  - Ring over ranks 0..n-1, links i -> (i + 1) mod n (NCCL's ring direction): 2 passes when n is
//    even (links of even i, then of odd i), 3 when n is odd (an odd cycle needs 3 colours; the
//    links are spread over the 3 passes as evenly as possible so that each pass has a median).
//  - Binary tree in heap order (rank i's children are 2i+1 and 2i+2), links parent -> child:
//    pass = 2 x (depth of the parent mod 2) + (0 for the left child, 1 for the right). A parent
//    sends in one pass only and a child receives only from its parent, so each pass is a
//    matching, whatever n. Empty passes are dropped: min(n - 1, 4) passes (4 for n >= 5).
// Ranks in a plan are ranks within the communicator (0..n-1); RemapPlan relabels them.
// Thread-safety: stateless functions; safe from any thread.
// Must never: do I/O, read clocks or globals, touch shared memory (FalconTask is built as a
// value; the caller writes it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "falcon/shm_abi.h"
#include "falcon/status.h"

namespace falcon::analyzer {

enum class PlanTopology : std::uint8_t { kRing, kTree };

// One directed P2P transfer: `sender` sends `bytes` to `receiver`.
struct PlannedTransfer {
  std::int32_t sender = -1;
  std::int32_t receiver = -1;
  friend bool operator==(const PlannedTransfer&, const PlannedTransfer&) = default;
};

// Transfers that run at once. Invariant (checked by CheckPlan): no rank appears twice.
struct ValidationPass {
  std::vector<PlannedTransfer> transfers;
};

struct ValidationPlan {
  PlanTopology topology = PlanTopology::kRing;
  std::size_t nranks = 0;
  std::vector<ValidationPass> passes;  // never an empty pass
};

// Largest group a plan is made for (ranks are int32 and FalconTask peers too).
inline constexpr std::size_t kMaxPlanRanks = std::size_t{1} << 24;

// The links a topology over n ranks has, in a fixed order: ring i -> (i+1) mod n for i = 0..n-1
// (for n = 2 that is 0 -> 1 and 1 -> 0); tree (i-1)/2 -> i for i = 1..n-1. REQUIRES: n >= 2.
[[nodiscard]] std::vector<PlannedTransfer> RingLinks(std::size_t n);
[[nodiscard]] std::vector<PlannedTransfer> TreeLinks(std::size_t n);

// Plans for a group of n ranks. InvalidArgument unless 2 <= n <= kMaxPlanRanks.
[[nodiscard]] Result<ValidationPlan> PlanRing(std::size_t n);
[[nodiscard]] Result<ValidationPlan> PlanTree(std::size_t n);
[[nodiscard]] Result<ValidationPlan> MakePlan(PlanTopology topology, std::size_t n);

// Ok when every transfer's ranks lie in [0, nranks), sender != receiver, no pass is empty and no
// rank takes part in two transfers of one pass; otherwise InvalidArgument naming the first fault.
[[nodiscard]] Status CheckPlan(const ValidationPlan& plan);

// Relabels ranks: rank r becomes labels[r] (e.g. global ranks, or a measured ring order).
// InvalidArgument when labels.size() != plan.nranks.
[[nodiscard]] Result<ValidationPlan> RemapPlan(const ValidationPlan& plan,
                                               std::span<const std::int32_t> labels);

// Executor task limits, from shm_abi.h.
inline constexpr std::uint32_t kMaxTaskRepeats = 1000;
inline constexpr std::uint32_t kMaxGemmDim = 8192;
inline constexpr std::uint64_t kMaxP2pBytes = std::uint64_t{1} << 30;

struct P2pTaskOptions {
  // Large enough that bandwidth, not latency, dominates, so times compare across links.
  std::uint64_t bytes = std::uint64_t{64} << 20;
  std::uint32_t repeats = 20;  // timed repetitions (the executor adds one untimed warm-up)
};

// The executor task of one rank in one pass. `task.comm_slot` is 0: the slot is local to each
// process's comm table, so the agent that delivers the task fills it in.
struct RankTask {
  std::int32_t rank = -1;  // communicator rank that runs it
  FalconTask task{};
};

// Per-rank tasks of a pass: the sender gets send_peer = receiver, the receiver recv_peer =
// sender (the other peer -1). Ranks not in the pass get no task (they idle). InvalidArgument for
// bytes outside 1 B..1 GiB or repeats outside 1..1000.
[[nodiscard]] Result<std::vector<RankTask>> PassTasks(const ValidationPass& pass,
                                                      const P2pTaskOptions& options = {});

struct GemmTaskOptions {
  std::uint32_t m = 4096, n = 4096, k = 4096;  // ~137 GFLOP per repetition
  std::uint32_t repeats = 10;
};

// The GEMM task for a compute suspect (and the peers it is compared against: run the same task on
// every rank of the suspect's communicator, so the suspect has a median to stand out from).
// InvalidArgument for dimensions outside 1..8192 or repeats outside 1..1000.
[[nodiscard]] Result<FalconTask> GemmTask(const GemmTaskOptions& options = {});

}  // namespace falcon::analyzer
