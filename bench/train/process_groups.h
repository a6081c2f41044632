// The process groups a Megatron-LM job creates (megatron/core/parallel_state.py,
// initialize_model_parallel), as data: every group of the job, in the order every rank creates
// them, with its members. With context parallel = 1 and expert parallel = 1 (this trainer's
// shape), in order:
//
//   dp-cp (one per (tp, pp)), dp (again, same members), cp (one per rank), mp = tp-pp (one per
//   dp), tp (one per (dp, pp)), then per PP group (one per (tp, dp)): pp, embd (its first and
//   last stage; the single stage when pp = 1), pos-embd (its first stage); then tp-dp-cp and
//   tp-dp (one per pp), tp-cp (one per (dp, pp)).
//
// With per-direction pipeline traffic (--pp-comm per-direction), two more 2-rank groups per pair
// of neighbouring stages follow, as a framework makes them with new_group([a, b]) twice: one
// carries the activations (stage s -> s + 1), one the gradients (s + 1 -> s), each on its own
// communicator and stream so that neither direction waits behind the other. A rank belongs to the
// pair with its previous and the pair with its next stage; the kinds split the pairs by the
// parity of their first stage so that a rank has at most one group of each kind.
//
// torch.distributed.new_group is collective over the whole world: with an eagerly initialised
// default group, PyTorch creates each group with one ncclCommSplit of the world communicator, in
// which the members pass a color and every other rank NCCL_SPLIT_NOCOLOR. Members are ordered by
// global rank, so a rank's index in its tp/dp/pp group is its coordinate. The expert-parallel
// groups Megatron also builds are not listed (no MoE layers here).
//
// Thread-safety: pure value types and functions. Must never: perform I/O.
#ifndef FALCON_BENCH_TRAIN_PROCESS_GROUPS_H_
#define FALCON_BENCH_TRAIN_PROCESS_GROUPS_H_

#include <string>
#include <vector>

#include "layout.h"

namespace falcon::train {

// The groups the trainer talks on.
enum class Group {
  kWorld, kDpCp, kDp, kCp, kMp, kTp, kPp, kEmbd, kPosEmbd, kTpDpCp, kTpDp, kTpCp,
  kPpFwdEven, kPpFwdOdd, kPpBwdEven, kPpBwdOdd,  // per-direction pipeline pairs (s, s + 1), s even / odd
};

// The per-direction group of the pair (first_stage, first_stage + 1) that carries activations
// (forward) or gradients.
[[nodiscard]] Group PpPairGroup(bool forward, int first_stage);

[[nodiscard]] const char* GroupName(Group g);

struct GroupSpec {
  Group kind = Group::kWorld;
  int index = 0;           // n-th group of its kind; the split color of its members
  std::vector<int> ranks;  // global ranks, ascending
};

// Every group of the job in creation order (the world itself excluded); with
// `pp_direction_groups`, the per-direction pipeline pairs last.
[[nodiscard]] std::vector<GroupSpec> MegatronGroups(const Shape& shape, bool pp_direction_groups = false);

// Index of `rank` in `g` (its rank in the communicator), -1 when not a member.
[[nodiscard]] int MemberIndex(const GroupSpec& g, int rank);

}  // namespace falcon::train

#endif  // FALCON_BENCH_TRAIN_PROCESS_GROUPS_H_
