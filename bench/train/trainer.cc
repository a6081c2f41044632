// One training iteration of one rank; see trainer.h.
#include "trainer.h"

#include <algorithm>

namespace falcon::train {
namespace {

std::size_t Floats(std::size_t bytes) { return std::max<std::size_t>(1, bytes / sizeof(float)); }

std::uint64_t Rotation(int iter, int mb, int layer) {
  return static_cast<std::uint64_t>(iter) * 131 + static_cast<std::uint64_t>(mb) * 7 + static_cast<std::uint64_t>(layer);
}

}  // namespace

Trainer::Trainer(const Options& options, int rank, const Comms& comms, ComputeModel* compute)
    : options_(options),
      shape_(options.shape),
      rank_(rank),
      coords_(CoordsOf(options.shape, rank)),
      comms_(comms),
      compute_(compute) {
  const std::size_t act = Floats(options.ActivationBytes());
  tp_buf_.assign(act, 0);
  fwd_send_.assign(act, 0);
  fwd_recv_.assign(act, 0);
  bwd_send_.assign(act, 0);
  bwd_recv_.assign(act, 0);
  const std::size_t dp = static_cast<std::size_t>(shape_.dp);
  const std::size_t grad = (Floats(options.GradBytes()) + dp - 1) / dp * dp;  // rs-ag needs dp | count
  grad_.assign(grad, 0);
  grad_shard_.assign(grad / dp, 0);
}

std::string Trainer::Where(int iter, int mb) const {
  std::string s = "rank " + std::to_string(rank_) + " (tp " + std::to_string(coords_.tp) + ", dp " +
                  std::to_string(coords_.dp) + ", pp " + std::to_string(coords_.pp) + ") iteration " +
                  std::to_string(iter);
  if (mb >= 0) s += " micro-batch " + std::to_string(mb);
  return s;
}

Status Trainer::Verify(std::span<const float> buf, const std::function<float(std::size_t)>& expect,
                       std::uint64_t rotation, double tolerance, const std::string& what) const {
  if (auto m = VerifySample(buf, expect, rotation, tolerance)) {
    return Status::Corrupt("check failed: " + DescribeMismatch(what, *m));
  }
  return Status::Ok();
}

void Trainer::MaybeCorrupt(std::span<float> buf, int iter) const {
  // The last element is in every verification sample.
  if (iter == options_.inject_corruption && !buf.empty()) buf.back() += 1000.0f;
}

Status Trainer::RunIteration(int iter, const std::vector<int>& micro_batches) {
  const int m = micro_batches[static_cast<std::size_t>(coords_.dp)];
  for (const Step& step : Build1F1B(shape_.pp, coords_.pp, m)) {
    const Status s = step.kind == StepKind::kExchange ? RunExchange(iter, step.xchg) : RunCompute(iter, step.mb, step.kind);
    if (!s.ok()) return s;
  }
  if (Status s = ReduceGradients(iter, micro_batches); !s.ok()) return s;
  compute_->Run(options_.optimizer_ms);
  return Status::Ok();
}

Status Trainer::RunCompute(int iter, int mb, StepKind kind) {
  const bool fwd = kind == StepKind::kForward;
  for (int i = 0; i < options_.layers; ++i) {
    const int layer = fwd ? i : options_.layers - 1 - i;  // backward walks the layers in reverse
    compute_->Run(fwd ? options_.compute_ms : 2 * options_.compute_ms);
    if (Status s = TpAllReduce(iter, mb, layer, fwd ? PayloadTag::kTpForward : PayloadTag::kTpBackward); !s.ok()) {
      return s;
    }
  }
  return Status::Ok();
}

Status Trainer::TpAllReduce(int iter, int mb, int layer, PayloadTag tag) {
  if (shape_.tp == 1) return Status::Ok();
  auto key = [&](int tp_rank) { return PayloadKey(tag, {iter, mb, layer, coords_.pp, coords_.dp, tp_rank}); };
  if (options_.check) {
    FillPayload(tp_buf_, key(coords_.tp));
    MaybeCorrupt(tp_buf_, iter);
  }
  if (Status s = NcclStatus(ncclAllReduce(tp_buf_.data(), tp_buf_.data(), tp_buf_.size(), ncclFloat, ncclSum,
                                          comms_.tp(), nullptr),
                            "ncclAllReduce(tp)");
      !s.ok()) {
    return s;
  }
  if (!options_.check) return Status::Ok();
  std::vector<std::uint64_t> keys;
  for (int r = 0; r < shape_.tp; ++r) keys.push_back(key(r));
  auto expect = [&keys](std::size_t i) {
    float sum = 0;
    for (std::uint64_t k : keys) sum += PayloadValue(k, i);
    return sum;
  };
  const char* dir = tag == PayloadTag::kTpForward ? "forward" : "backward";
  return Verify(tp_buf_, expect, Rotation(iter, mb, layer), 0,
                Where(iter, mb) + " layer " + std::to_string(layer) + " TP " + dir + " all-reduce");
}

Status Trainer::RunExchange(int iter, const Exchange& x) {
  const int stage = coords_.pp;
  auto key = [&](PayloadTag tag, int mb, int from_stage) {
    return PayloadKey(tag, {iter, mb, from_stage, coords_.dp, coords_.tp});
  };
  if (options_.check) {
    if (x.send_fwd_to_next) FillPayload(fwd_send_, key(PayloadTag::kActivation, x.send_fwd_mb, stage));
    if (x.send_bwd_to_prev) FillPayload(bwd_send_, key(PayloadTag::kActivationGrad, x.send_bwd_mb, stage));
    MaybeCorrupt(fwd_send_, iter);
    MaybeCorrupt(bwd_send_, iter);
  }
  const std::size_t n = fwd_send_.size();
  ncclComm_t pp = comms_.pp();
  if (Status s = NcclStatus(ncclGroupStart(), "ncclGroupStart"); !s.ok()) return s;
  ncclResult_t rc = ncclSuccess;
  if (x.send_fwd_to_next && rc == ncclSuccess) rc = ncclSend(fwd_send_.data(), n, ncclFloat, stage + 1, pp, nullptr);
  if (x.recv_fwd_from_prev && rc == ncclSuccess) rc = ncclRecv(fwd_recv_.data(), n, ncclFloat, stage - 1, pp, nullptr);
  if (x.send_bwd_to_prev && rc == ncclSuccess) rc = ncclSend(bwd_send_.data(), n, ncclFloat, stage - 1, pp, nullptr);
  if (x.recv_bwd_from_next && rc == ncclSuccess) rc = ncclRecv(bwd_recv_.data(), n, ncclFloat, stage + 1, pp, nullptr);
  const ncclResult_t end = ncclGroupEnd();  // always close the group, even after a failed enqueue
  if (Status s = NcclStatus(rc != ncclSuccess ? rc : end, "pipeline send/recv group"); !s.ok()) return s;
  if (!options_.check) return Status::Ok();
  if (x.recv_fwd_from_prev) {
    const std::uint64_t k = key(PayloadTag::kActivation, x.recv_fwd_mb, stage - 1);
    if (Status s = Verify(fwd_recv_, [k](std::size_t i) { return PayloadValue(k, i); }, Rotation(iter, x.recv_fwd_mb, 0),
                          0, Where(iter, x.recv_fwd_mb) + " activation received from stage " + std::to_string(stage - 1));
        !s.ok()) {
      return s;
    }
  }
  if (x.recv_bwd_from_next) {
    const std::uint64_t k = key(PayloadTag::kActivationGrad, x.recv_bwd_mb, stage + 1);
    if (Status s = Verify(bwd_recv_, [k](std::size_t i) { return PayloadValue(k, i); }, Rotation(iter, x.recv_bwd_mb, 1),
                          0, Where(iter, x.recv_bwd_mb) + " gradient received from stage " + std::to_string(stage + 1));
        !s.ok()) {
      return s;
    }
  }
  return Status::Ok();
}

Status Trainer::ReduceGradients(int iter, const std::vector<int>& micro_batches) {
  if (shape_.dp == 1) return Status::Ok();
  std::vector<GradKeyFn> keys;
  for (int d = 0; d < shape_.dp; ++d) {
    keys.push_back([=, this](int mb) { return PayloadKey(PayloadTag::kDpGrad, {iter, mb, coords_.pp, coords_.tp, d}); });
  }
  if (options_.check) {
    const int mine = micro_batches[static_cast<std::size_t>(coords_.dp)];
    std::fill(grad_.begin(), grad_.end(), 0.0f);
    for (int mb = 0; mb < mine; ++mb) AddPayload(grad_, keys[static_cast<std::size_t>(coords_.dp)](mb));
    const float w = ReplicaWeight(mine, micro_batches);
    for (float& g : grad_) g *= w;
    MaybeCorrupt(grad_, iter);
  }
  auto expect = [&](std::size_t i) { return WeightedGradSum(keys, micro_batches, i); };
  const std::uint64_t rot = Rotation(iter, 0, 0);
  ncclComm_t dp = comms_.dp();
  if (options_.dp_mode == DpMode::kAllReduce) {
    if (Status s = NcclStatus(ncclAllReduce(grad_.data(), grad_.data(), grad_.size(), ncclFloat, ncclSum, dp, nullptr),
                              "ncclAllReduce(dp)");
        !s.ok()) {
      return s;
    }
    if (!options_.check) return Status::Ok();
    return Verify(grad_, expect, rot, 1e-5, Where(iter, -1) + " DP gradient all-reduce");
  }
  const std::size_t shard = grad_shard_.size();
  if (Status s = NcclStatus(ncclReduceScatter(grad_.data(), grad_shard_.data(), shard, ncclFloat, ncclSum, dp, nullptr),
                            "ncclReduceScatter(dp)");
      !s.ok()) {
    return s;
  }
  if (options_.check) {
    const std::size_t base = shard * static_cast<std::size_t>(coords_.dp);
    if (Status s = Verify(grad_shard_, [&](std::size_t i) { return expect(base + i); }, rot, 1e-5,
                          Where(iter, -1) + " DP gradient reduce-scatter (shard offset " + std::to_string(base) + ")");
        !s.ok()) {
      return s;
    }
    std::fill(grad_.begin(), grad_.end(), -1.0f);  // the all-gather must overwrite every element
  }
  if (Status s = NcclStatus(ncclAllGather(grad_shard_.data(), grad_.data(), shard, ncclFloat, dp, nullptr),
                            "ncclAllGather(dp)");
      !s.ok()) {
    return s;
  }
  if (!options_.check) return Status::Ok();
  return Verify(grad_, expect, rot + 1, 1e-5, Where(iter, -1) + " DP parameter all-gather");
}

}  // namespace falcon::train
