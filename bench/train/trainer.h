// One rank of the emulated hybrid-parallel trainer in the legacy mode (--world-sync): runs one
// training iteration at a time with synchronous NCCL calls and host-side compute. The default
// mode is megatron_trainer.h.
//
// An iteration is the 1F1B schedule of this rank's pipeline stage (schedule.h) over the
// micro-batches of its DP replica; per micro-batch and layer, forward = modelled compute + a TP
// all-reduce of the activations (tp > 1), backward = 2x modelled compute + a TP all-reduce;
// activations go to the next stage and gradients to the previous one with ncclSend/ncclRecv
// inside ncclGroupStart/End. Then the DP gradient reduction (all-reduce, or reduce-scatter +
// all-gather), each replica's contribution weighted by m_d / sum(m), and a modelled optimizer
// step. With --check every received or reduced buffer is verified (model.h payloads).
//
// Thread-safety: one thread. Must never: issue collectives in a rank-dependent order within a
// group (every member of a TP/DP group runs the same sequence), or continue after a failed check.
#ifndef FALCON_BENCH_TRAIN_TRAINER_H_
#define FALCON_BENCH_TRAIN_TRAINER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "comms.h"
#include "falcon/status.h"
#include "layout.h"
#include "model.h"
#include "options.h"
#include "schedule.h"

namespace falcon::train {

class Trainer {
 public:
  // REQUIRES: `comms` and `compute` outlive the Trainer; options.shape is valid for `rank`.
  Trainer(const Options& options, int rank, const Comms& comms, ComputeModel* compute);

  // Runs iteration `iter` with `micro_batches[d]` micro-batches on DP replica d.
  // Returns Ok; Corrupt when --check found a wrong value (the message says where); Unavailable
  // when an NCCL call failed. REQUIRES: micro_batches.size() == dp, every entry >= 1.
  [[nodiscard]] Status RunIteration(int iter, const std::vector<int>& micro_batches);

  [[nodiscard]] const Coords& coords() const { return coords_; }

 private:
  [[nodiscard]] Status RunCompute(int iter, int mb, StepKind kind);
  [[nodiscard]] Status TpAllReduce(int iter, int mb, int layer, PayloadTag tag);
  [[nodiscard]] Status RunExchange(int iter, const Exchange& x);
  [[nodiscard]] Status ReduceGradients(int iter, const std::vector<int>& micro_batches);
  [[nodiscard]] Status Verify(std::span<const float> buf, const std::function<float(std::size_t)>& expect,
                              std::uint64_t rotation, double tolerance, const std::string& what) const;
  [[nodiscard]] std::string Where(int iter, int mb) const;
  // --inject-corruption: perturbs `buf` (data about to be sent) in the chosen iteration.
  void MaybeCorrupt(std::span<float> buf, int iter) const;

  // Fixed after construction.
  const Options options_;
  const Shape shape_;
  const int rank_;
  const Coords coords_;
  const Comms& comms_;
  ComputeModel* const compute_;

  // Scratch buffers, reused every iteration.
  std::vector<float> tp_buf_;
  std::vector<float> fwd_send_, fwd_recv_, bwd_send_, bwd_recv_;
  std::vector<float> grad_, grad_shard_;
};

}  // namespace falcon::train

#endif  // FALCON_BENCH_TRAIN_TRAINER_H_
