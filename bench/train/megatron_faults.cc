// The Megatron trainer's fault injections (--inject-mismatch, --inject-swap; options.h): the
// wrong call and the stderr line that stamps it. The swap's reordering itself lives where the
// two all-reduces are issued (megatron_trainer.cc: EmbeddingGrads, LossAndGradNorm).
//
// Thread-safety: as MegatronTrainer (one thread at a time). Must never: change a call on any rank
// but the injected one, or hand NCCL a count its buffers do not hold.
#include <time.h>

#include <cstdio>
#include <string>

#include "megatron_trainer.h"

namespace falcon::train {
namespace {

// CLOCK_REALTIME in nanoseconds: the clock of --inject-stall's line, which the benchmarks parse.
long long RealtimeNs() {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<long long>(now.tv_sec) * 1'000'000'000LL + now.tv_nsec;
}

}  // namespace

MegatronTrainer::CallArgs MegatronTrainer::Mismatch(int iter, InjectGroup group, const char* op, CallArgs call,
                                                    std::size_t send_blocks) {
  if (rank_ != options_.mismatch_rank || iter != options_.mismatch_iter || group != options_.mismatch_group ||
      mismatched_) {
    return call;
  }
  mismatched_ = true;
  std::string what;
  if (options_.mismatch_kind == MismatchKind::kCount) {
    what = "count " + std::to_string(call.count + 1) + " instead of " + std::to_string(call.count) + " (ncclFloat)";
    const bool in_place = call.send == call.recv;
    const std::size_t n = call.count + 1;
    mismatch_buf_.assign(send_blocks * n + (in_place ? 0 : n), 0.0f);
    call.send = mismatch_buf_.data();
    call.recv = in_place ? mismatch_buf_.data() : mismatch_buf_.data() + send_blocks * n;
    call.count = n;
  } else {
    // Half the bytes at the same count: inside the caller's buffers.
    what = "ncclFloat16 instead of ncclFloat (count " + std::to_string(call.count) + ")";
    call.dtype = ncclFloat16;
  }
  std::fprintf(stderr, "rank %d: --inject-mismatch: %s on %s in iteration %d issued with %s (from %lld ns)\n", rank_, op,
               InjectGroupName(group), iter, what.c_str(), RealtimeNs());
  std::fflush(stderr);
  return call;
}

void MegatronTrainer::LogSwap(int iter) const {
  std::fprintf(stderr,
               "rank %d: --inject-swap: ncclAllReduce(grad norm) on mp and ncclAllReduce(embedding gradients) on embd "
               "swapped in iteration %d (from %lld ns)\n",
               rank_, iter, RealtimeNs());
  std::fflush(stderr);
}

}  // namespace falcon::train
