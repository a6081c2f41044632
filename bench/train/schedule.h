// The non-interleaved 1F1B pipeline schedule (PipeDream-Flush, as in Megatron-LM) of one pipeline
// stage, as data: the ordered list of steps a stage runs in one iteration, each step being the
// compute of one micro-batch (forward or backward) together with the point-to-point exchange that
// Megatron batches with it.
//
//   warm-up   = min(pp - stage - 1, M) forwards     (recv fwd from prev, send fwd to next)
//   steady    = M - warm-up pairs of forward + backward; the forward's send to the next stage is
//               batched with the receive of a gradient from it, the backward's send to the previous
//               stage with the receive of the next activation from it (except on the last pair)
//   cool-down = warm-up backwards                   (recv grad from next, send grad to prev)
//
// Every exchange of stage s with stage s+1 has a matching exchange of s+1 with s at the same
// position in their sequences of s<->s+1 exchanges, so the schedule cannot deadlock
// (schedule_test.cc proves it for every pp <= 8, M <= 12 by simulation).
//
// Thread-safety: pure functions over values. Must never: perform I/O or communication.
#ifndef FALCON_BENCH_TRAIN_SCHEDULE_H_
#define FALCON_BENCH_TRAIN_SCHEDULE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "falcon/status.h"

namespace falcon::train {

// What one point-to-point exchange moves. Each flag is one ncclSend or ncclRecv; all flags of
// one Exchange go into a single ncclGroupStart/End. On the first stage the "prev" flags and on
// the last stage the "next" flags are never set.
struct Exchange {
  bool recv_fwd_from_prev = false;  // activation of `recv_fwd_mb` from stage - 1
  bool send_fwd_to_next = false;    // activation of `send_fwd_mb` to stage + 1
  bool recv_bwd_from_next = false;  // gradient of `recv_bwd_mb` from stage + 1
  bool send_bwd_to_prev = false;    // gradient of `send_bwd_mb` to stage - 1
  int recv_fwd_mb = -1, send_fwd_mb = -1, recv_bwd_mb = -1, send_bwd_mb = -1;

  [[nodiscard]] bool empty() const {
    return !recv_fwd_from_prev && !send_fwd_to_next && !recv_bwd_from_next && !send_bwd_to_prev;
  }
};

// kBackward is the whole backward of 1F1B, or, in a split-backward schedule, the input-gradient
// half (B); kWeight is the split schedule's weight-gradient half (W), which sends nothing.
enum class StepKind : std::uint8_t { kExchange, kForward, kBackward, kWeight };

// One step: either an exchange or the compute (plus TP traffic) of micro-batch `mb`.
struct Step {
  StepKind kind = StepKind::kExchange;
  int mb = -1;        // kForward / kBackward
  Exchange xchg;      // kExchange
};

// The stage's steps for one iteration of `micro_batches` micro-batches.
// REQUIRES: pp >= 1, 0 <= stage < pp, micro_batches >= 1.
[[nodiscard]] std::vector<Step> Build1F1B(int pp, int stage, int micro_batches);

// The same order of forwards and backwards with `warmup` warm-up forwards (clamped to
// [0, micro_batches]) instead of pp - stage - 1: a pipeline plan's (Adaptra). Its exchanges pair
// as above only for the standard counts; with others a stage's sends and receives must not wait
// on each other (--pp-comm per-direction, megatron_trainer.h), which uses the compute order alone.
[[nodiscard]] std::vector<Step> Build1F1BWithWarmup(int pp, int stage, int micro_batches, int warmup);

// The ZeroBubble-style F/B/W order of `stage` (--split-backward): the backward split into B
// (input gradients, what the previous stage waits for) and W (weight gradients, deferrable), as
// analyzer::BuildPipelineSchedule orders them (Adaptra's Algorithms 3-4: the warm-up forwards,
// then the ready op of highest priority B > F > W, a forward only while fewer than warm-up + 1
// micro-batches' activations are held, an activation held until its W). `warmup`: every stage's
// Megatron warm-up count (pp entries, non-increasing along the pipeline; the standard counts are
// pp - s - 1), each clamped to [0, micro_batches - 1]. `forward_ms`, `input_grad_ms`,
// `weight_grad_ms`: one micro-batch's op times on a stage, which fix the order (every stage
// computes the same order from the same figures; link delays are taken as 0). Compute steps
// only: the traffic needs --pp-comm per-direction. InvalidArgument, naming the fault, for counts
// or times the planner rejects.
[[nodiscard]] Result<std::vector<Step>> BuildSplitBackward(int pp, int stage, int micro_batches,
                                                           const std::vector<int>& warmup, double forward_ms,
                                                           double input_grad_ms, double weight_grad_ms);

// Number of warm-up forwards of `stage`: min(pp - stage - 1, micro_batches).
[[nodiscard]] int WarmupCount(int pp, int stage, int micro_batches);

// Compact text form for tests and debugging, e.g. "F0 x[sf0] F1 ..." (W steps as "W0").
[[nodiscard]] std::string ToString(const std::vector<Step>& steps);

}  // namespace falcon::train

#endif  // FALCON_BENCH_TRAIN_SCHEDULE_H_
