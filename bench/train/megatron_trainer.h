// One rank of the emulated trainer as PyTorch + Megatron-LM run it (the default mode): one
// training iteration at a time, device work on streams, the host running ahead until it reads a
// result.
//
// Per iteration (megatron/core/pipeline_parallel/schedules.py, p2p_communication.py,
// distributed/param_and_grad_buffer.py, optimizer/ as read; PyTorch's ProcessGroupNCCL stream
// semantics):
//  * compute (modelled kernels, device.h) on the compute stream; every process group's NCCL
//    work on its own stream, which first waits for the compute stream (an event), and the compute
//    stream waits for it in turn where it consumes the result (work.wait(): no host wait);
//  * forward of a layer = attention kernel, TP all-reduce, MLP kernel, TP all-reduce (tp > 1);
//    backward the same in reverse with 2x the kernel time;
//  * pipeline traffic of the 1F1B schedule (schedule.h) as batch_isend_irecv: one
//    ncclGroupStart/End on the PP communicator per exchange, in Megatron's op order (send_prev,
//    recv_prev, send_next, recv_next);
//  * or, with --pp-comm per-direction (what a pipeline plan's warm-up counts need: Adaptra's
//    decoupled communication), each direction of each stage pair on its own 2-rank communicator
//    and stream (process_groups.h): the receives of an iteration are posted ahead from a side
//    stream into a ring of activation-limit + 1 buffers (a slot is posted again once the compute
//    has consumed its micro-batch), the compute stream waits for a micro-batch's receive, and each
//    send goes out on its direction's stream after the compute that produced it, whose slot it
//    holds until sent. Activations and gradients then move as soon as both ends are ready,
//    independently of each other, in micro-batch order on each direction; the forward/backward
//    order is 1F1B's with the plan's warm-up counts (Build1F1BWithWarmup);
//  * or, with --split-backward (ZeroBubble-style F/B/W, per-direction traffic), each backward
//    split into B (the input gradients: the kernels at half the time and their TP all-reduces, on
//    the autograd thread; its gradient goes to the previous stage at once) and W (the weight
//    gradients: one kernel per layer, no traffic, on the training thread), ordered by Adaptra's
//    B > F > W rule for the warm-up counts in force (BuildSplitBackward); an activation is held
//    until its W, and the buckets are reduced during the last W instead of the last backward;
//  * gradients in one bucket per layer on the dp-cp group: during the last micro-batch's
//    backward, a bucket is reduced as soon as its layer's gradients are complete (reduce-scatter
//    for the distributed optimizer, --dp-mode rs-ag, the default; all-reduce with --dp-mode
//    allreduce), overlapped with the rest of the backward; finish_grad_sync makes the compute
//    stream wait for them;
//  * embedding gradients all-reduced on the embedding group (first and last stage, pp > 1);
//  * the loss all-reduced on the dp-cp group and read by the host (loss.item(): a host wait),
//    then the grad norm all-reduced on the model-parallel group and read (grad_norm.item());
//    both carry the control word (control_word.h): summed over DP then over MP, every rank
//    gets the sum over the world (DP group x MP group = world), with no world collective;
//  * the optimizer kernel, then (distributed optimizer) the parameter all-gather of every bucket,
//    which the next iteration's forward of that layer waits for (overlapped with the forward).
// With --check every received or reduced buffer is verified after a host wait on its stream.
//
//  * a backward step runs on the autograd thread (autograd_thread.h) while the training thread
//    waits, as PyTorch runs it: its TP all-reduces and gradient buckets come from that thread.
//  * fault injections (options.h): --inject-mismatch issues one rank's first TP all-reduce or DP
//    bucket of an iteration with a wrong count or datatype; --inject-swap puts the embd and mp
//    all-reduces of an iteration on one stream, one rank issuing them in the other order.
// Thread-safety: one thread at a time (the training thread, or the autograd thread while the
// training thread waits for it). Must never: let the host touch a buffer that device work still
// reads or writes (it waits on the event recorded after that work first), issue collectives in a
// rank-dependent order within a group, or continue after a failed check.
#ifndef FALCON_BENCH_TRAIN_MEGATRON_TRAINER_H_
#define FALCON_BENCH_TRAIN_MEGATRON_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autograd_thread.h"
#include "comms.h"
#include "control_word.h"
#include "device.h"
#include "falcon/status.h"
#include "layout.h"
#include "model.h"
#include "options.h"
#include "schedule.h"

namespace falcon::train {

class MegatronTrainer {
 public:
  // Rank 0's proposal for the iteration's control word (others get an empty one).
  using ProposeFn = std::function<ControlDecision()>;

  // REQUIRES: `comms` and `device` outlive the trainer; options.shape is valid for `rank`.
  MegatronTrainer(const Options& options, int rank, Comms* comms, Device* device);

  // Creates streams, events and buffers. Call once before RunIteration.
  [[nodiscard]] Status Init();

  // Runs iteration `iter` with `micro_batches[d]` micro-batches on DP replica d; calls
  // `propose` once, after the backward, for this rank's contribution to the control word.
  // Returns the decision every rank of the job gets in this iteration (an applied plan's payload
  // vectors sized but not filled: control_word.h). Corrupt when --check found a wrong value or
  // the word is corrupt; Unavailable when an NCCL or driver call failed.
  // `warmup`: a pipeline plan's warm-up forwards per stage (pp entries), or empty for standard
  // 1F1B. REQUIRES: empty unless --pp-comm per-direction; each entry + 1 <= the activation limit.
  [[nodiscard]] Result<ControlDecision> RunIteration(int iter, const std::vector<int>& micro_batches,
                                                     const std::vector<int>& warmup, const ProposeFn& propose);

  // The most micro-batches whose activations this rank held at once (forwards run, backwards
  // not yet), over every iteration so far.
  [[nodiscard]] int peak_activations() const { return peak_activations_; }
  // The compute order of the last iteration, "F0 F1 B0 W0 ..." (schedule.h's ToString, exchanges
  // left out).
  [[nodiscard]] const std::string& last_schedule() const { return last_schedule_; }

  // Waits until every stream is idle (verifying the parameter all-gathers still in flight).
  // After it, no device work touches the trainer's buffers or communicators.
  [[nodiscard]] Status Drain();

  // The rare world collectives (a plan's payload, a checkpoint or S3 barrier), on the world's
  // stream, waited for by the host. REQUIRES: every rank calls them at the same point.
  [[nodiscard]] Status WorldBarrier();
  // Rank 0's `payload` to every rank (same size everywhere).
  [[nodiscard]] Status WorldBroadcast(std::vector<std::int32_t>* payload);

 private:
  // A process group's NCCL stream and the event recorded after its latest operation.
  struct Lane {
    Group group = Group::kWorld;
    StreamHandle stream = nullptr;
    EventHandle done = nullptr;
  };
  // One direction of the pipeline traffic with one neighbour (--pp-comm per-direction): its lane
  // (pair communicator and stream), the neighbour's index in that communicator, and a ring of
  // buffers. A receive ring's `ready` is recorded after the receive into a slot and its `consumed`
  // after the compute that read it; a send ring's `ready` after the send out of a slot.
  struct P2pRing {
    Lane lane;
    bool forward = true;   // activations (else gradients)
    int peer_stage = -1;   // -1: this direction does not exist on this stage
    int peer = -1;         // the neighbour's rank in the pair communicator
    std::vector<std::vector<float>> slots;
    std::vector<EventHandle> ready, consumed;
    int next_post = 0;     // receive rings: the next micro-batch to post in this iteration
  };
  // A bucket's parameter all-gather in flight: what it must deliver.
  struct PendingGather {
    bool pending = false;
    int iter = 0;
    std::vector<int> micro_batches;
  };

  // Who reads an operation's result on the device: the compute stream (it waits for the
  // operation's event), or nobody yet (a later explicit wait, or the host after HostWait).
  enum class Consumer { kCompute, kLater };
  // Whether a backward step is the last micro-batch's, whose gradients complete the buckets.
  enum class Buckets { kAccumulate, kReduce };

  [[nodiscard]] Status Enqueue(Lane* lane, const std::function<ncclResult_t(ncclComm_t, StreamHandle)>& op,
                               const char* what, Consumer consumer);
  [[nodiscard]] Status RunCompute(int iter, int mb, StepKind kind, Buckets buckets,
                                  const std::vector<int>& micro_batches);
  [[nodiscard]] Status TpAllReduce(int iter, int mb, int sublayer, PayloadTag tag);
  [[nodiscard]] Status RunExchange(int iter, const Exchange& x);
  [[nodiscard]] Status InitRing(P2pRing* ring, bool forward, int peer_stage);
  [[nodiscard]] Status RunStepPerDirection(int iter, const Step& step, Buckets buckets, int micro_batches_here,
                                           const std::vector<int>& micro_batches);
  [[nodiscard]] Status PostReceives(P2pRing* ring, int up_to);
  [[nodiscard]] Status ConsumeReceive(int iter, P2pRing* ring, int mb);
  [[nodiscard]] Status ReleaseReceive(P2pRing* ring, int mb, int micro_batches_here);
  [[nodiscard]] Status SendFromRing(int iter, P2pRing* ring, int mb);
  [[nodiscard]] Status RunBackward(int iter, int mb, Buckets buckets, const std::vector<int>& micro_batches);
  [[nodiscard]] Result<const std::vector<Step>*> SplitSchedule(int m, const std::vector<int>& warmup);
  [[nodiscard]] std::uint64_t P2pKey(int iter, bool forward, int mb, int from_stage) const;
  [[nodiscard]] Status ReduceBucket(int iter, int layer, const std::vector<int>& micro_batches);
  [[nodiscard]] Status FinishGradSync(int iter, const std::vector<int>& micro_batches);
  [[nodiscard]] Status EmbeddingGrads(int iter);
  [[nodiscard]] Status EnqueueEmbd(int iter);
  [[nodiscard]] Result<ControlDecision> LossAndGradNorm(int iter, const ProposeFn& propose);
  [[nodiscard]] Status GatherParams(int iter, const std::vector<int>& micro_batches);
  [[nodiscard]] Status WaitParams(int layer);
  [[nodiscard]] Status Verify(std::span<const float> buf, const std::function<float(std::size_t)>& expect,
                              std::uint64_t rotation, double tolerance, const std::string& what) const;
  // Element i of the expectation = the weighted DP gradient sum at element base + i.
  [[nodiscard]] std::function<float(std::size_t)> ExpectedGrad(int iter, const std::vector<int>& micro_batches,
                                                               std::size_t base) const;
  [[nodiscard]] std::string Where(int iter, int mb) const;
  void MaybeCorrupt(std::span<float> buf, int iter) const;
  [[nodiscard]] bool distributed_optimizer() const { return options_.dp_mode == DpMode::kReduceScatterAllGather; }

  // Fault injections (megatron_faults.cc). A float collective's arguments as issued.
  struct CallArgs {
    std::size_t count = 0;
    ncclDataType_t dtype = ncclFloat;
    const void* send = nullptr;
    void* recv = nullptr;
  };
  // --inject-mismatch: `call`, this rank's first `op` on `group` in `iter`, as it must go out:
  // unchanged, or (the injected rank, once) with count + 1 on buffers of the trainer's own that
  // hold it, or as ncclFloat16; then logs the stderr line. Call just before issuing it.
  // `send_blocks`: counts the send buffer holds (a reduce-scatter's dp, else 1).
  [[nodiscard]] CallArgs Mismatch(int iter, InjectGroup group, const char* op, CallArgs call, std::size_t send_blocks);
  // --inject-swap: true if the rank's embd all-reduce of `iter` goes on the mp lane's stream.
  // Whether this rank is in an embedding group (first or last stage of a pipeline of 2+).
  [[nodiscard]] bool HasEmbd() const;
  [[nodiscard]] bool SwapIteration(int iter) const { return options_.swap_rank >= 0 && iter == options_.swap_iter; }
  // Logs the --inject-swap line (the first of the swapped pair is issued next).
  void LogSwap(int iter) const;

  // Fixed after construction / Init.
  const Options options_;
  const Shape shape_;
  const int rank_;
  const Coords coords_;
  Comms* const comms_;
  Device* const device_;
  StreamHandle compute_ = nullptr;
  EventHandle compute_done_ = nullptr;
  Lane tp_, pp_, dp_, mp_, embd_, world_;
  std::vector<EventHandle> gathered_;  // per bucket: after its parameter all-gather
  std::unique_ptr<AutogradThread> autograd_;  // runs backward steps (null: --no-autograd-thread)
  std::size_t bucket_ = 0;             // floats per gradient bucket (a multiple of dp)

  // Buffers, reused every iteration (see the thread-safety contract).
  std::vector<float> tp_buf_;
  std::vector<float> fwd_send_, fwd_recv_, bwd_send_, bwd_recv_;
  std::vector<float> grad_, grad_shard_, param_, embd_buf_;
  std::vector<double> loss_, norm_;
  std::vector<std::int32_t> barrier_;
  std::vector<PendingGather> pending_;  // per bucket
  // --pp-comm per-direction: activations in from the previous stage, out to the next; gradients
  // in from the next, out to the previous.
  P2pRing act_in_, act_out_, grad_in_, grad_out_;
  int held_ = 0, peak_activations_ = 0;
  // --split-backward: the F/B/W order in use and its key (warm-up counts, then micro-batches).
  std::vector<int> split_key_;
  std::vector<Step> split_steps_;
  std::string last_schedule_;
  // Fault injections.
  bool mismatched_ = false;           // --inject-mismatch: the wrong call went out
  bool embd_deferred_ = false;        // --inject-swap: the embd all-reduce waits for the grad norm
  std::vector<float> mismatch_buf_;   // a count + 1 call's buffers (never completes, never freed early)
};

}  // namespace falcon::train

#endif  // FALCON_BENCH_TRAIN_MEGATRON_TRAINER_H_
