// The benchmark steps of one validation round (FALCON §4.3), planned from the job view: GEMM on
// every paused rank (in batches), then P2P passes over the communicators under test, packed so
// that no rank takes part in two transfers of one step.
//  - GEMM runs on every rank, not only the profile's suspects: on real GPUs all GEMMs run at once,
//    so the pause is no longer, and a slow GPU the profile could not single out (every
//    communicator of its class slowed alike) is still measured against all its peers.
//    `gemm_batch` > 0 runs that many ranks at a time (hosts whose "GPUs" share few CPU cores).
//  - P2P: transfers never run on the job's communicators (a rank that failed to post there would
//    leave its peer's kernel waiting for ever): a "vcomm id" step makes the unique id of a
//    validation communicator on the first rank, a "vcomm join" step has every rank join it
//    (rank = position in the sorted rank list) and allocate its buffers — every rank confirms
//    it is ready before any transfer is posted — then the P2P steps run on it. Per job
//    communicator under test, the ring plan (2 passes, 3 for odd sizes) and the tree plan (<= 4
//    passes) of analyzer/validation_plan.h. A transfer is an exchange between two ranks (both
//    send and receive; the agent's `peer`), so each unordered pair of ranks is measured once per
//    round: pairs the ring already covered are dropped from the tree, and pairs an earlier
//    communicator covered (Megatron's groups alike, a TP pair that is also a model-parallel pair)
//    from later ones — suspicious communicators first, so a pair they share with a peer stays
//    judged. Exchanges are packed first fit, pass by pass, into steps where no rank takes part
//    twice: passes of different communicators share a step when they touch disjoint ranks, and
//    the exchanges a thinned-out pass has left fill earlier steps' gaps.
// Thread-safety: pure functions. Must never: do I/O.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/controller/job_view.h"
#include "falcon/status.h"

namespace falcon::controller {

// One rank's benchmark in a step.
struct RankTaskSpec {
  std::int64_t rank = -1;  // global
  std::string task;        // gemm | vcomm_id | vcomm_join | p2p
  std::uint64_t comm = 0;  // p2p: the job's communicator whose link the transfer measures
  std::int32_t peer = -1;  // p2p: the peer's rank in the validation communicator
  std::int64_t peer_global = -1;
  std::uint32_t pass = 0;  // p2p: index of (communicator, plan pass), distinct across the round
  bool judged = true;      // p2p: on a communicator under suspicion (else a baseline peer)
  std::int64_t vrank = -1;   // vcomm_join: this rank's rank in the validation communicator
  std::int64_t vranks = 0;   // vcomm_join: its size
};

struct ValidationStep {
  std::string what;  // "gemm 1/8", "p2p 3/12" for logs
  std::vector<RankTaskSpec> tasks;
};

struct StepOptions {
  std::size_t gemm_batch = 0;  // ranks per GEMM step; 0 = all at once
  bool tree = true;            // also test the tree plan's links
};

// GEMM steps over every live rank, then P2P steps over `judged` and `peers` (communicators not
// in the view, or with unknown members, are skipped). InvalidArgument when a plan cannot be made.
[[nodiscard]] Result<std::vector<ValidationStep>> PlanValidationSteps(
    const JobView& view, const std::vector<std::uint64_t>& judged,
    const std::vector<std::uint64_t>& peers, const StepOptions& options);

}  // namespace falcon::controller
