// Command-line options of falcon-train-emu: one typed table (name, argument, bounds, default,
// meaning) from which both the parser and --help are generated.
//
// Thread-safety: pure; ParseOptions touches nothing but its arguments. Must never: exit, print
// or read the environment (main() does that with the Result).
#ifndef FALCON_BENCH_TRAIN_OPTIONS_H_
#define FALCON_BENCH_TRAIN_OPTIONS_H_

#include <cstddef>
#include <string>
#include <vector>

#include "falcon/status.h"
#include "layout.h"

namespace falcon::train {

enum class DpMode { kAllReduce, kReduceScatterAllGather };

// --inject-mismatch: what the mismatched call changes (both change its byte size, so it hangs
// as under NCCL), and on which group.
enum class MismatchKind { kCount, kDtype };
enum class InjectGroup { kTp, kDp };

struct Options {
  Shape shape;                    // --tp --dp --pp
  int micro_batches = 4;          // --micro-batches: per DP replica per iteration (before plans)
  int layers = 2;                 // --layers: transformer layers per pipeline stage
  int hidden = 128;               // --hidden H
  int seq = 64;                   // --seq S
  int micro_batch_size = 2;       // --micro-batch-size b
  double compute_ms = 2;          // --compute-ms: forward of one layer for one micro-batch
  double optimizer_ms = 1;        // --optimizer-ms: optimizer step per iteration
  std::size_t grad_bytes = 0;     // --grad-bytes: DP gradient bytes; 0 = derived (GradBytes)
  DpMode dp_mode = DpMode::kAllReduce;  // --dp-mode allreduce|rs-ag (default rs-ag unless --world-sync)
  bool dp_mode_given = false;     // --dp-mode was on the command line
  int iters = 0;                  // --iters: 0 = not given
  double duration_s = 0;          // --duration-s: 0 = not given
  bool check = false;             // --check
  std::string report;             // --report FILE ("{rank}" substituted) or "-" for stdout
  int progress_every = 10;        // --progress-every: rank 0 progress line period; 0 = off
  std::string plan_file;          // --plan-file: mitigation plan file (mitigation_plan.h)
  bool falcon_plans = false;      // --falcon-plans: plans from Falcon's C API (plan_source.h)
  int checkpoint_every = 10;      // --checkpoint-every K: in-memory checkpoint period, iterations
  double restart_s = 5;           // --restart-s: modelled restart time of an S4 plan
  int spare_nodes = 0;            // --spare-nodes N: idle emulated nodes after the job's
  std::size_t state_bytes = 0;    // --state-bytes: per-rank parameter + optimizer bytes; 0 = derived
  int inject_corruption = -1;     // --inject-corruption ITER: test hook (with --check), -1 = off
  // --inject-stall RANK:ITER[:SECONDS]: rank RANK stops issuing NCCL calls before iteration ITER
  // (a stuck data loader) for SECONDS, < 0 = for good (-1 rank = off).
  int stall_rank = -1;
  int stall_iter = 0;
  double stall_s = -1;
  // --inject-mismatch RANK:ITER:KIND[:GROUP]: in iteration ITER rank RANK issues its first
  // collective on GROUP (default tp) with count + 1 or a half-size datatype (-1 rank = off).
  int mismatch_rank = -1;
  int mismatch_iter = 0;
  MismatchKind mismatch_kind = MismatchKind::kCount;
  InjectGroup mismatch_group = InjectGroup::kTp;
  // --inject-swap RANK:ITER: in iteration ITER rank RANK issues the grad-norm (mp) and embedding
  // (embd) all-reduces on one stream in the opposite order to its peers (-1 rank = off).
  int swap_rank = -1;
  int swap_iter = 0;
  bool world_sync = false;        // --world-sync: the legacy mode (world control all-reduce)
  bool lazy_init = false;         // --lazy-init: communicators at first use
  bool nonblocking = false;       // --nonblocking: ncclConfig_t.blocking = 0
  bool watchdog = true;           // --no-watchdog turns it off (always off with --world-sync)
  bool autograd_thread = true;    // --no-autograd-thread: backward collectives on the training thread
  double checkpoint_save_ms = 0;  // --checkpoint-save-ms: modelled save + world barrier per checkpoint
  bool pp_per_direction = false;  // --pp-comm per-direction (default batched)
  int activation_limit = 0;       // --activation-limit: micro-batches' activations per stage; 0 = pp
  bool split_backward = false;    // --split-backward: F/B/W (B input gradients, W weight gradients)
  bool help = false;              // --help / -h

  // Activation (and activation-gradient) message bytes: b * S * H * 2 (bf16-sized payload).
  [[nodiscard]] std::size_t ActivationBytes() const;
  // DP gradient bytes: --grad-bytes, else layers * 12 * H^2 / tp parameters at 2 bytes each.
  [[nodiscard]] std::size_t GradBytes() const;
  // A rank's parameters and optimizer state (what moves with it to another node): --state-bytes,
  // else 8 x GradBytes (16 bytes per parameter: bf16 weights and gradients, fp32 master weights
  // and two Adam moments).
  [[nodiscard]] std::size_t StateBytes() const;
  // --activation-limit, or pp when it is not given (what standard 1F1B holds on the first stage).
  [[nodiscard]] int ActivationLimit() const { return activation_limit > 0 ? activation_limit : shape.pp; }
  // Iterations to run when neither --iters nor --duration-s is given.
  static constexpr int kDefaultIters = 10;
};

// Parses argv[1..argc). Returns InvalidArgument naming the flag on an unknown flag, a missing or
// malformed value, a value out of bounds, --plan-file together with --falcon-plans, or an
// injection the shape cannot host (a rank outside tp*dp*pp, a group of one rank, a swap without
// an embedding group on that rank). Does not check the shape against the world size
// (ValidateShape does, once WORLD_SIZE is known).
[[nodiscard]] Result<Options> ParseOptions(int argc, const char* const* argv);

// The --help text, generated from the option table.
[[nodiscard]] std::string UsageText();

[[nodiscard]] const char* DpModeName(DpMode mode);
[[nodiscard]] const char* InjectGroupName(InjectGroup group);  // "tp" / "dp"

}  // namespace falcon::train

#endif  // FALCON_BENCH_TRAIN_OPTIONS_H_
