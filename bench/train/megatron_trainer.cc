// One training iteration of one rank as PyTorch + Megatron-LM run it; see megatron_trainer.h.
#include "megatron_trainer.h"

#include <algorithm>
#include <cmath>
#include <iterator>

namespace falcon::train {
namespace {

std::size_t Floats(std::size_t bytes) { return std::max<std::size_t>(1, bytes / sizeof(float)); }

std::uint64_t Rotation(int iter, int mb, int layer) {
  return static_cast<std::uint64_t>(iter) * 131 + static_cast<std::uint64_t>(mb) * 7 + static_cast<std::uint64_t>(layer);
}

}  // namespace

MegatronTrainer::MegatronTrainer(const Options& options, int rank, Comms* comms, Device* device)
    : options_(options),
      shape_(options.shape),
      rank_(rank),
      coords_(CoordsOf(options.shape, rank)),
      comms_(comms),
      device_(device) {}

Status MegatronTrainer::Init() {
  if (options_.autograd_thread) autograd_ = std::make_unique<AutogradThread>();
  tp_.group = Group::kTp;
  pp_.group = Group::kPp;
  dp_.group = Group::kDpCp;
  mp_.group = Group::kMp;
  embd_.group = Group::kEmbd;
  world_.group = Group::kWorld;
  Result<StreamHandle> cs = device_->NewStream();
  if (!cs.ok()) return cs.status();
  compute_ = cs.value();
  Result<EventHandle> ce = device_->NewEvent();
  if (!ce.ok()) return ce.status();
  compute_done_ = ce.value();
  for (Lane* lane : {&tp_, &pp_, &dp_, &mp_, &embd_, &world_}) {
    Result<StreamHandle> s = device_->NewStream();
    if (!s.ok()) return s.status();
    Result<EventHandle> e = device_->NewEvent();
    if (!e.ok()) return e.status();
    lane->stream = s.value();
    lane->done = e.value();
  }
  const std::size_t layers = static_cast<std::size_t>(options_.layers);
  for (std::size_t l = 0; l < layers; ++l) {
    Result<EventHandle> e = device_->NewEvent();
    if (!e.ok()) return e.status();
    gathered_.push_back(e.value());
  }
  const std::size_t act = Floats(options_.ActivationBytes());
  tp_buf_.assign(act, 0);
  fwd_send_.assign(act, 0);
  fwd_recv_.assign(act, 0);
  bwd_send_.assign(act, 0);
  bwd_recv_.assign(act, 0);
  embd_buf_.assign(act, 0);
  const std::size_t dp = static_cast<std::size_t>(shape_.dp);
  const std::size_t per_layer = (Floats(options_.GradBytes()) + layers - 1) / layers;
  bucket_ = (per_layer + dp - 1) / dp * dp;  // a reduce-scatter needs dp | count
  grad_.assign(bucket_ * layers, 0);
  grad_shard_.assign(grad_.size() / dp, 0);
  param_.assign(grad_.size(), 0);
  pending_.assign(layers, PendingGather{});
  if (options_.pp_per_direction && shape_.pp > 1) {
    const int stage = coords_.pp;
    if (stage > 0) {
      if (Status s = InitRing(&act_in_, true, stage - 1); !s.ok()) return s;
      if (Status s = InitRing(&grad_out_, false, stage - 1); !s.ok()) return s;
    }
    if (stage < shape_.pp - 1) {
      if (Status s = InitRing(&act_out_, true, stage + 1); !s.ok()) return s;
      if (Status s = InitRing(&grad_in_, false, stage + 1); !s.ok()) return s;
    }
    // NCCL connects a pair at its first send/recv, blocking the caller until the peer takes part
    // (PyTorch: the first batch_isend_irecv of a group must involve all its ranks). Receives
    // posted ahead on fresh communicators would wait on each other around the pipeline, so each
    // pair exchanges one element first, in pipeline order: the pair with the previous stage,
    // then the one with the next.
    for (P2pRing* ring : {&act_in_, &grad_out_, &act_out_, &grad_in_}) {
      if (ring->peer_stage < 0) continue;
      const bool receive = ring == &act_in_ || ring == &grad_in_;
      Result<ncclComm_t> comm = comms_->Get(ring->lane.group);
      if (!comm.ok()) return comm.status();
      float* one = ring->slots[0].data();
      const auto st = static_cast<cudaStream_t>(ring->lane.stream);
      const ncclResult_t rc = receive ? ncclRecv(one, 1, ncclFloat, ring->peer, comm.value(), st)
                                      : ncclSend(one, 1, ncclFloat, ring->peer, comm.value(), st);
      if (Status s = NcclDone(rc, comm.value(), "pipeline pair connection"); !s.ok()) return s;
      if (Status s = device_->Record(ring->lane.done, ring->lane.stream); !s.ok()) return s;
      if (Status s = device_->HostWait(ring->lane.done); !s.ok()) return s;
    }
  }
  return Status::Ok();
}

// A direction's pair communicator, stream and ring of activation-limit + 1 buffers (one more
// than the most micro-batches a stage may have in flight, so a plan's warm-up never waits for a
// slot).
Status MegatronTrainer::InitRing(P2pRing* ring, bool forward, int peer_stage) {
  ring->forward = forward;
  ring->peer_stage = peer_stage;
  ring->lane.group = PpPairGroup(forward, std::min(coords_.pp, peer_stage));
  Result<StreamHandle> st = device_->NewStream();
  if (!st.ok()) return st.status();
  ring->lane.stream = st.value();
  Result<EventHandle> done = device_->NewEvent();
  if (!done.ok()) return done.status();
  ring->lane.done = done.value();
  const std::size_t depth = static_cast<std::size_t>(options_.ActivationLimit()) + 1;
  ring->slots.assign(depth, std::vector<float>(Floats(options_.ActivationBytes()), 0));
  for (std::vector<EventHandle>* events : {&ring->ready, &ring->consumed}) {
    for (std::size_t i = 0; i < depth; ++i) {
      Result<EventHandle> e = device_->NewEvent();
      if (!e.ok()) return e.status();
      events->push_back(e.value());
    }
  }
  // Ranks of a pair communicator are ordered by global rank, and a later stage's ranks are
  // higher (layout.h): the lower stage is rank 0.
  ring->peer = peer_stage < coords_.pp ? 0 : 1;
  return Status::Ok();
}

std::string MegatronTrainer::Where(int iter, int mb) const {
  std::string s = "rank " + std::to_string(rank_) + " (tp " + std::to_string(coords_.tp) + ", dp " +
                  std::to_string(coords_.dp) + ", pp " + std::to_string(coords_.pp) + ") iteration " +
                  std::to_string(iter);
  if (mb >= 0) s += " micro-batch " + std::to_string(mb);
  return s;
}

Status MegatronTrainer::Verify(std::span<const float> buf, const std::function<float(std::size_t)>& expect,
                               std::uint64_t rotation, double tolerance, const std::string& what) const {
  if (auto m = VerifySample(buf, expect, rotation, tolerance)) {
    return Status::Corrupt("check failed: " + DescribeMismatch(what, *m));
  }
  return Status::Ok();
}

void MegatronTrainer::MaybeCorrupt(std::span<float> buf, int iter) const {
  if (iter == options_.inject_corruption && !buf.empty()) buf.back() += 1000.0f;  // in every sample
}

// PyTorch's collective on a process group: its stream waits for the work enqueued on the compute
// stream so far, the operation goes on its stream, an event marks its end, and (work.wait())
// the compute stream waits for that event when it consumes the result.
Status MegatronTrainer::Enqueue(Lane* lane, const std::function<ncclResult_t(ncclComm_t, StreamHandle)>& op,
                                const char* what, Consumer consumer) {
  Result<ncclComm_t> comm = comms_->Get(lane->group);
  if (!comm.ok()) return comm.status();
  if (Status s = device_->Record(compute_done_, compute_); !s.ok()) return s;
  if (Status s = device_->StreamWait(lane->stream, compute_done_); !s.ok()) return s;
  if (Status s = NcclDone(op(comm.value(), lane->stream), comm.value(), what); !s.ok()) return s;
  if (Status s = device_->Record(lane->done, lane->stream); !s.ok()) return s;
  if (consumer == Consumer::kCompute) return device_->StreamWait(compute_, lane->done);
  return Status::Ok();
}

Result<ControlDecision> MegatronTrainer::RunIteration(int iter, const std::vector<int>& micro_batches,
                                                      const std::vector<int>& warmup, const ProposeFn& propose) {
  const int m = micro_batches[static_cast<std::size_t>(coords_.dp)];
  const bool per_direction = options_.pp_per_direction && shape_.pp > 1;
  if (!warmup.empty() && (!options_.pp_per_direction || warmup.size() != static_cast<std::size_t>(shape_.pp))) {
    return Status::Internal("warm-up counts given to a trainer that cannot run them");
  }
  const bool split = options_.split_backward;
  std::vector<Step> steps;
  if (split) {
    Result<const std::vector<Step>*> order = SplitSchedule(m, warmup);
    if (!order.ok()) return order.status();
    steps = *order.value();
  } else {
    steps = warmup.empty() ? Build1F1B(shape_.pp, coords_.pp, m)
                           : Build1F1BWithWarmup(shape_.pp, coords_.pp, m, warmup[static_cast<std::size_t>(coords_.pp)]);
  }
  // The step that completes the weight gradients (the last backward, or the last W when split):
  // the buckets are reduced in it. An activation is held from its forward until then too.
  const StepKind completes = split ? StepKind::kWeight : StepKind::kBackward;
  std::size_t last_backward = 0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].kind == completes) last_backward = i;
  }
  if (per_direction) {
    // The side stream posts the iteration's first receives now, ahead of the compute.
    for (P2pRing* ring : {&act_in_, &grad_in_}) {
      if (ring->peer_stage < 0) continue;
      ring->next_post = 0;
      if (Status s = PostReceives(ring, std::min<int>(m, static_cast<int>(ring->slots.size()))); !s.ok()) return s;
    }
  }
  {
    std::vector<Step> compute;
    std::copy_if(steps.begin(), steps.end(), std::back_inserter(compute),
                 [](const Step& st) { return st.kind != StepKind::kExchange; });
    last_schedule_ = ToString(compute);
  }
  held_ = 0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const Step& step = steps[i];
    const Buckets buckets = i == last_backward ? Buckets::kReduce : Buckets::kAccumulate;
    Status s = Status::Ok();
    if (per_direction) {
      s = RunStepPerDirection(iter, step, buckets, m, micro_batches);
    } else if (step.kind == StepKind::kExchange) {
      s = RunExchange(iter, step.xchg);
    } else if (step.kind == StepKind::kBackward) {
      s = RunBackward(iter, step.mb, buckets, micro_batches);
    } else {
      s = RunCompute(iter, step.mb, step.kind, buckets, micro_batches);
    }
    if (!s.ok()) return s;
    if (step.kind == StepKind::kForward) peak_activations_ = std::max(peak_activations_, ++held_);
    if (step.kind == completes) --held_;
  }
  if (Status s = FinishGradSync(iter, micro_batches); !s.ok()) return s;
  if (Status s = EmbeddingGrads(iter); !s.ok()) return s;
  Result<ControlDecision> d = LossAndGradNorm(iter, propose);
  if (!d.ok()) return d;
  if (Status s = device_->Compute(compute_, options_.optimizer_ms); !s.ok()) return s;
  if (distributed_optimizer()) {
    if (Status s = GatherParams(iter, micro_batches); !s.ok()) return s;
  }
  return d;
}

// The F/B/W order for `m` micro-batches under `warmup` (empty: 1F1B's counts), built once per
// distinct (m, counts): a plan or a re-balance changes them, iterations in between reuse it.
Result<const std::vector<Step>*> MegatronTrainer::SplitSchedule(int m, const std::vector<int>& warmup) {
  std::vector<int> counts = warmup;
  if (counts.empty()) {
    for (int s = 0; s < shape_.pp; ++s) counts.push_back(WarmupCount(shape_.pp, s, m));
  }
  counts.push_back(m);  // the cache key: the counts and the micro-batch count
  if (counts != split_key_) {
    const double layers = options_.layers, f = options_.compute_ms;
    // Per layer: forward f; B two kernels of f / 2 (the input gradients); W one of f.
    Result<std::vector<Step>> built = BuildSplitBackward(
        shape_.pp, coords_.pp, m, std::vector<int>(counts.begin(), counts.end() - 1), layers * f, layers * f, layers * f);
    if (!built.ok()) return Status::Internal("the F/B/W schedule: " + built.status().message());
    split_steps_ = std::move(built).value();
    split_key_ = std::move(counts);
  }
  return &split_steps_;
}

// loss.backward(): on the autograd thread when there is one.
Status MegatronTrainer::RunBackward(int iter, int mb, Buckets buckets, const std::vector<int>& micro_batches) {
  if (autograd_ == nullptr) return RunCompute(iter, mb, StepKind::kBackward, buckets, micro_batches);
  return autograd_->Run([&] {
    if (Status c = device_->MakeCurrent(); !c.ok()) return c;  // the thread's device, as PyTorch sets it
    return RunCompute(iter, mb, StepKind::kBackward, buckets, micro_batches);
  });
}

Status MegatronTrainer::RunCompute(int iter, int mb, StepKind kind, Buckets buckets,
                                   const std::vector<int>& micro_batches) {
  const bool fwd = kind == StepKind::kForward;
  for (int i = 0; i < options_.layers; ++i) {
    const int layer = fwd ? i : options_.layers - 1 - i;  // backward walks the layers in reverse
    if (kind == StepKind::kWeight) {
      // W: the layer's weight gradients, no TP traffic; complete in the last W of the iteration.
      if (Status s = device_->Compute(compute_, options_.compute_ms); !s.ok()) return s;
      if (buckets == Buckets::kReduce) {
        if (Status s = ReduceBucket(iter, layer, micro_batches); !s.ok()) return s;
      }
      continue;
    }
    if (fwd) {
      // Attention then MLP, each ending in a row-parallel layer's TP all-reduce.
      if (Status s = WaitParams(layer); !s.ok()) return s;
      for (int sub = 0; sub < 2; ++sub) {
        if (Status s = device_->Compute(compute_, options_.compute_ms / 2); !s.ok()) return s;
        if (Status s = TpAllReduce(iter, mb, 2 * layer + sub, PayloadTag::kTpForward); !s.ok()) return s;
      }
      continue;
    }
    // The backward (split: its input-gradient half, B) of the MLP then the attention, each ending
    // in a column-parallel layer's TP all-reduce of the input gradient.
    const double kernel_ms = options_.split_backward ? options_.compute_ms / 2 : options_.compute_ms;
    for (int sub = 1; sub >= 0; --sub) {
      if (Status s = device_->Compute(compute_, kernel_ms); !s.ok()) return s;
      if (Status s = TpAllReduce(iter, mb, 2 * layer + sub, PayloadTag::kTpBackward); !s.ok()) return s;
    }
    // The layer's gradients are complete in the last micro-batch: its bucket goes now.
    if (buckets == Buckets::kReduce && !options_.split_backward) {
      if (Status s = ReduceBucket(iter, layer, micro_batches); !s.ok()) return s;
    }
  }
  return Status::Ok();
}

Status MegatronTrainer::TpAllReduce(int iter, int mb, int sublayer, PayloadTag tag) {
  if (shape_.tp == 1) return Status::Ok();
  auto key = [&](int tp_rank) { return PayloadKey(tag, {iter, mb, sublayer, coords_.pp, coords_.dp, tp_rank}); };
  if (options_.check) {
    if (Status s = device_->HostWait(tp_.done); !s.ok()) return s;  // the previous all-reduce is done with it
    FillPayload(tp_buf_, key(coords_.tp));
    MaybeCorrupt(tp_buf_, iter);
  }
  float* buf = tp_buf_.data();
  const std::size_t n = tp_buf_.size();
  if (Status s = Enqueue(&tp_, [&](ncclComm_t c, StreamHandle st) {
        const CallArgs a = Mismatch(iter, InjectGroup::kTp, "ncclAllReduce", {n, ncclFloat, buf, buf}, 1);
        return ncclAllReduce(a.send, a.recv, a.count, a.dtype, ncclSum, c, static_cast<cudaStream_t>(st));
      }, "ncclAllReduce(tp)", Consumer::kCompute);
      !s.ok()) {
    return s;
  }
  if (!options_.check) return Status::Ok();
  if (Status s = device_->HostWait(tp_.done); !s.ok()) return s;
  std::vector<std::uint64_t> keys;
  for (int r = 0; r < shape_.tp; ++r) keys.push_back(key(r));
  auto expect = [&keys](std::size_t i) {
    float sum = 0;
    for (std::uint64_t k : keys) sum += PayloadValue(k, i);
    return sum;
  };
  const char* dir = tag == PayloadTag::kTpForward ? "forward" : "backward";
  return Verify(tp_buf_, expect, Rotation(iter, mb, sublayer), 0,
                Where(iter, mb) + " layer " + std::to_string(sublayer / 2) + (sublayer % 2 ? " MLP" : " attention") +
                    " TP " + dir + " all-reduce");
}

// batch_isend_irecv: one group on the PP communicator, Megatron's op order.
Status MegatronTrainer::RunExchange(int iter, const Exchange& x) {
  const int stage = coords_.pp;
  if (options_.check) {
    if (Status s = device_->HostWait(pp_.done); !s.ok()) return s;  // earlier sends are done with the buffers
    if (x.send_fwd_to_next) FillPayload(fwd_send_, P2pKey(iter, true, x.send_fwd_mb, stage));
    if (x.send_bwd_to_prev) FillPayload(bwd_send_, P2pKey(iter, false, x.send_bwd_mb, stage));
    MaybeCorrupt(fwd_send_, iter);
    MaybeCorrupt(bwd_send_, iter);
  }
  const std::size_t n = fwd_send_.size();
  auto group = [&](ncclComm_t pp, StreamHandle st) {
    auto s = static_cast<cudaStream_t>(st);
    ncclResult_t rc = ncclGroupStart();
    if (rc != ncclSuccess) return rc;
    if (x.send_bwd_to_prev && rc == ncclSuccess) rc = ncclSend(bwd_send_.data(), n, ncclFloat, stage - 1, pp, s);
    if (x.recv_fwd_from_prev && rc == ncclSuccess) rc = ncclRecv(fwd_recv_.data(), n, ncclFloat, stage - 1, pp, s);
    if (x.send_fwd_to_next && rc == ncclSuccess) rc = ncclSend(fwd_send_.data(), n, ncclFloat, stage + 1, pp, s);
    if (x.recv_bwd_from_next && rc == ncclSuccess) rc = ncclRecv(bwd_recv_.data(), n, ncclFloat, stage + 1, pp, s);
    const ncclResult_t end = ncclGroupEnd();  // always close the group, even after a failed enqueue
    return rc != ncclSuccess ? rc : end;
  };
  if (Status s = Enqueue(&pp_, group, "pipeline batch_isend_irecv group", Consumer::kCompute); !s.ok()) return s;
  if (!options_.check) return Status::Ok();
  if (Status s = device_->HostWait(pp_.done); !s.ok()) return s;
  if (x.recv_fwd_from_prev) {
    const std::uint64_t k = P2pKey(iter, true, x.recv_fwd_mb, stage - 1);
    if (Status s = Verify(fwd_recv_, [k](std::size_t i) { return PayloadValue(k, i); }, Rotation(iter, x.recv_fwd_mb, 0),
                          0, Where(iter, x.recv_fwd_mb) + " activation received from stage " + std::to_string(stage - 1));
        !s.ok()) {
      return s;
    }
  }
  if (x.recv_bwd_from_next) {
    const std::uint64_t k = P2pKey(iter, false, x.recv_bwd_mb, stage + 1);
    if (Status s = Verify(bwd_recv_, [k](std::size_t i) { return PayloadValue(k, i); }, Rotation(iter, x.recv_bwd_mb, 1),
                          0, Where(iter, x.recv_bwd_mb) + " gradient received from stage " + std::to_string(stage + 1));
        !s.ok()) {
      return s;
    }
  }
  return Status::Ok();
}

std::uint64_t MegatronTrainer::P2pKey(int iter, bool forward, int mb, int from_stage) const {
  return PayloadKey(forward ? PayloadTag::kActivation : PayloadTag::kActivationGrad,
                    {iter, mb, from_stage, coords_.dp, coords_.tp});
}

// One compute step with its own traffic: wait for the micro-batch's input, compute (its output
// slot free first), free the input slot for a later receive, send the output.
Status MegatronTrainer::RunStepPerDirection(int iter, const Step& step, Buckets buckets, int micro_batches_here,
                                            const std::vector<int>& micro_batches) {
  if (step.kind == StepKind::kExchange) return Status::Ok();  // the rings carry the traffic
  // W reads what its B kept (the layers' inputs and output gradients, in the framework's own
  // memory, not a receive slot: B released that); it sends nothing. On the training thread, as a
  // split-backward schedule runs its deferred weight gradients.
  if (step.kind == StepKind::kWeight) return RunCompute(iter, step.mb, step.kind, buckets, micro_batches);
  const bool fwd = step.kind == StepKind::kForward;
  P2pRing* in = fwd ? &act_in_ : &grad_in_;
  P2pRing* out = fwd ? &act_out_ : &grad_out_;
  if (in->peer_stage >= 0) {
    if (Status s = ConsumeReceive(iter, in, step.mb); !s.ok()) return s;
  }
  if (out->peer_stage >= 0) {
    // The compute writes its output into the send slot once the send it last held is done.
    const std::size_t slot = static_cast<std::size_t>(step.mb) % out->slots.size();
    if (Status s = device_->StreamWait(compute_, out->ready[slot]); !s.ok()) return s;
  }
  Status s = fwd ? RunCompute(iter, step.mb, step.kind, buckets, micro_batches)
                 : RunBackward(iter, step.mb, buckets, micro_batches);
  if (!s.ok()) return s;
  if (in->peer_stage >= 0) {
    if (Status r = ReleaseReceive(in, step.mb, micro_batches_here); !r.ok()) return r;
  }
  if (out->peer_stage >= 0) return SendFromRing(iter, out, step.mb);
  return Status::Ok();
}

// Posts receives up to micro-batch `up_to` (exclusive) on the ring's stream, each into its slot
// once the compute has consumed the slot's previous micro-batch: a side stream that does not wait
// for the compute stream otherwise, so a receive is ready before the compute needs it.
Status MegatronTrainer::PostReceives(P2pRing* ring, int up_to) {
  Result<ncclComm_t> comm = comms_->Get(ring->lane.group);
  if (!comm.ok()) return comm.status();
  const auto st = static_cast<cudaStream_t>(ring->lane.stream);
  for (; ring->next_post < up_to; ++ring->next_post) {
    const std::size_t slot = static_cast<std::size_t>(ring->next_post) % ring->slots.size();
    if (Status s = device_->StreamWait(ring->lane.stream, ring->consumed[slot]); !s.ok()) return s;
    std::vector<float>& buf = ring->slots[slot];
    const char* what = ring->forward ? "ncclRecv(pipeline activation)" : "ncclRecv(pipeline gradient)";
    if (Status s = NcclDone(ncclRecv(buf.data(), buf.size(), ncclFloat, ring->peer, comm.value(), st), comm.value(), what);
        !s.ok()) {
      return s;
    }
    if (Status s = device_->Record(ring->ready[slot], ring->lane.stream); !s.ok()) return s;
  }
  return device_->Record(ring->lane.done, ring->lane.stream);
}

// The compute stream waits for micro-batch `mb`'s receive (--check: the host verifies it first).
Status MegatronTrainer::ConsumeReceive(int iter, P2pRing* ring, int mb) {
  const std::size_t slot = static_cast<std::size_t>(mb) % ring->slots.size();
  if (mb >= ring->next_post) return Status::Internal("pipeline receive of micro-batch " + std::to_string(mb) + " not posted");
  if (options_.check) {
    if (Status s = device_->HostWait(ring->ready[slot]); !s.ok()) return s;
    const std::uint64_t k = P2pKey(iter, ring->forward, mb, ring->peer_stage);
    if (Status s = Verify(ring->slots[slot], [k](std::size_t i) { return PayloadValue(k, i); },
                          Rotation(iter, mb, ring->forward ? 0 : 1), 0,
                          Where(iter, mb) + (ring->forward ? " activation received from stage " : " gradient received from stage ") +
                              std::to_string(ring->peer_stage));
        !s.ok()) {
      return s;
    }
  }
  return device_->StreamWait(compute_, ring->ready[slot]);
}

// After the compute that read `mb`: its slot may take the receive `slots` micro-batches later.
Status MegatronTrainer::ReleaseReceive(P2pRing* ring, int mb, int micro_batches_here) {
  const std::size_t slot = static_cast<std::size_t>(mb) % ring->slots.size();
  if (Status s = device_->Record(ring->consumed[slot], compute_); !s.ok()) return s;
  const int next = mb + static_cast<int>(ring->slots.size());
  if (next >= micro_batches_here) return Status::Ok();
  return PostReceives(ring, next + 1);
}

// Sends micro-batch `mb`'s output on the ring's stream after the compute that produced it.
Status MegatronTrainer::SendFromRing(int iter, P2pRing* ring, int mb) {
  const std::size_t slot = static_cast<std::size_t>(mb) % ring->slots.size();
  std::vector<float>& buf = ring->slots[slot];
  if (options_.check) {
    // The host writes what the compute would have: after the slot's previous send is done.
    if (Status s = device_->HostWait(ring->ready[slot]); !s.ok()) return s;
    FillPayload(buf, P2pKey(iter, ring->forward, mb, coords_.pp));
    MaybeCorrupt(buf, iter);
  }
  const int peer = ring->peer;
  if (Status s = Enqueue(&ring->lane, [&](ncclComm_t c, StreamHandle st) {
        return ncclSend(buf.data(), buf.size(), ncclFloat, peer, c, static_cast<cudaStream_t>(st));
      }, ring->forward ? "ncclSend(pipeline activation)" : "ncclSend(pipeline gradient)", Consumer::kLater);
      !s.ok()) {
    return s;
  }
  return device_->Record(ring->ready[slot], ring->lane.stream);
}

std::function<float(std::size_t)> MegatronTrainer::ExpectedGrad(int iter, const std::vector<int>& micro_batches,
                                                                  std::size_t base) const {
  std::vector<GradKeyFn> keys;  // built once per verification, not per element
  for (int d = 0; d < shape_.dp; ++d) {
    const std::int64_t pp = coords_.pp, tp = coords_.tp;
    keys.push_back([=](int mb) { return PayloadKey(PayloadTag::kDpGrad, {iter, mb, pp, tp, d}); });
  }
  return [keys = std::move(keys), micro_batches, base](std::size_t i) {
    return WeightedGradSum(keys, micro_batches, base + i);
  };
}

Status MegatronTrainer::ReduceBucket(int iter, int layer, const std::vector<int>& micro_batches) {
  if (options_.check && layer == options_.layers - 1) {
    // The first bucket of the iteration: the host writes every bucket's gradients once the
    // previous iteration's reductions are done with them.
    if (Status s = device_->HostWait(dp_.done); !s.ok()) return s;
    const int mine = micro_batches[static_cast<std::size_t>(coords_.dp)];
    std::fill(grad_.begin(), grad_.end(), 0.0f);
    for (int mb = 0; mb < mine; ++mb) {
      AddPayload(grad_, PayloadKey(PayloadTag::kDpGrad, {iter, mb, coords_.pp, coords_.tp, coords_.dp}));
    }
    const float w = ReplicaWeight(mine, micro_batches);
    for (float& g : grad_) g *= w;
    MaybeCorrupt(grad_, iter);
  }
  const std::size_t l = static_cast<std::size_t>(layer);
  float* in = grad_.data() + l * bucket_;
  const std::size_t shard = bucket_ / static_cast<std::size_t>(shape_.dp);
  float* out = grad_shard_.data() + l * shard;
  if (distributed_optimizer()) {
    return Enqueue(&dp_, [&](ncclComm_t c, StreamHandle st) {
      const CallArgs a = Mismatch(iter, InjectGroup::kDp, "ncclReduceScatter", {shard, ncclFloat, in, out},
                                  static_cast<std::size_t>(shape_.dp));
      return ncclReduceScatter(a.send, a.recv, a.count, a.dtype, ncclSum, c, static_cast<cudaStream_t>(st));
    }, "ncclReduceScatter(dp-cp bucket)", Consumer::kLater);
  }
  const std::size_t n = bucket_;
  return Enqueue(&dp_, [&](ncclComm_t c, StreamHandle st) {
    const CallArgs a = Mismatch(iter, InjectGroup::kDp, "ncclAllReduce", {n, ncclFloat, in, in}, 1);
    return ncclAllReduce(a.send, a.recv, a.count, a.dtype, ncclSum, c, static_cast<cudaStream_t>(st));
  }, "ncclAllReduce(dp-cp bucket)", Consumer::kLater);
}

Status MegatronTrainer::FinishGradSync(int iter, const std::vector<int>& micro_batches) {
  if (Status s = device_->StreamWait(compute_, dp_.done); !s.ok()) return s;
  if (!options_.check) return Status::Ok();
  if (Status s = device_->HostWait(dp_.done); !s.ok()) return s;
  const std::size_t shard = bucket_ / static_cast<std::size_t>(shape_.dp);
  for (std::size_t b = 0; b < static_cast<std::size_t>(options_.layers); ++b) {
    const std::size_t base = b * bucket_ + (distributed_optimizer() ? shard * static_cast<std::size_t>(coords_.dp) : 0);
    std::span<const float> got = distributed_optimizer() ? std::span<const float>(grad_shard_).subspan(b * shard, shard)
                                                          : std::span<const float>(grad_).subspan(b * bucket_, bucket_);
    if (Status s = Verify(got, ExpectedGrad(iter, micro_batches, base),
                          Rotation(iter, 0, 0) + b, 1e-5,
                          Where(iter, -1) + " DP gradient " + (distributed_optimizer() ? "reduce-scatter" : "all-reduce") +
                              " bucket " + std::to_string(b) + " (offset " + std::to_string(base) + ")");
        !s.ok()) {
      return s;
    }
  }
  return Status::Ok();
}

// finalize_model_grads: the tied word-embedding gradients of the first and last stage.
bool MegatronTrainer::HasEmbd() const {
  return shape_.pp > 1 && (coords_.pp == 0 || coords_.pp == shape_.pp - 1);
}

Status MegatronTrainer::EmbeddingGrads(int iter) {
  const int stage = coords_.pp;
  if (!HasEmbd()) return Status::Ok();
  auto key = [&](int s) { return PayloadKey(PayloadTag::kEmbeddingGrad, {iter, coords_.dp, coords_.tp, s}); };
  if (options_.check) {
    if (Status s = device_->HostWait(embd_.done); !s.ok()) return s;
    FillPayload(embd_buf_, key(stage));
    MaybeCorrupt(embd_buf_, iter);
  }
  if (SwapIteration(iter) && rank_ == options_.swap_rank) {
    embd_deferred_ = true;  // --inject-swap: issued after the grad norm (LossAndGradNorm)
    return Status::Ok();
  }
  if (Status s = EnqueueEmbd(iter); !s.ok()) return s;
  // --inject-swap's iteration: no host wait between the two all-reduces (Megatron reads neither
  // before the grad norm's .item()), so every rank queues both, as DFCCL's deadlock needs.
  if (!options_.check || SwapIteration(iter)) return Status::Ok();
  if (Status s = device_->HostWait(embd_.done); !s.ok()) return s;
  const std::uint64_t first = key(0), last = key(shape_.pp - 1);
  return Verify(embd_buf_, [&](std::size_t i) { return PayloadValue(first, i) + PayloadValue(last, i); },
                Rotation(iter, 0, 2), 0, Where(iter, -1) + " embedding gradient all-reduce");
}

// The embedding all-reduce. --inject-swap's iteration: on the mp lane's stream, and the compute
// stream waits for it only once the grad norm is queued too (LossAndGradNorm): every rank then
// queues both all-reduces on one stream with nothing in between that waits for either, which is
// the deadlock DFCCL describes when one rank queues them the other way round.
Status MegatronTrainer::EnqueueEmbd(int iter) {
  Lane lane = embd_;
  if (SwapIteration(iter)) lane.stream = mp_.stream;
  float* buf = embd_buf_.data();
  const std::size_t n = embd_buf_.size();
  return Enqueue(&lane, [&](ncclComm_t c, StreamHandle st) {
    return ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, c, static_cast<cudaStream_t>(st));
  }, "ncclAllReduce(embd)", SwapIteration(iter) ? Consumer::kLater : Consumer::kCompute);
}

// The loss over the DP group, then the grad norm over the model-parallel group, both read by the
// host; the control word rides on both (megatron_trainer.h).
Result<ControlDecision> MegatronTrainer::LossAndGradNorm(int iter, const ProposeFn& propose) {
  const std::vector<std::int32_t> word = PackControl(propose(), shape_.dp);
  const std::size_t n = word.size() + 1;
  loss_.assign(n, 0);
  loss_[0] = 1;  // this replica's loss
  for (std::size_t i = 0; i < word.size(); ++i) loss_[i + 1] = word[i];
  double* lb = loss_.data();
  if (Status s = Enqueue(&dp_, [&](ncclComm_t c, StreamHandle st) {
        return ncclAllReduce(lb, lb, n, ncclFloat64, ncclSum, c, static_cast<cudaStream_t>(st));
      }, "ncclAllReduce(dp-cp loss)", Consumer::kLater);
      !s.ok()) {
    return s;
  }
  if (Status s = device_->HostWait(dp_.done); !s.ok()) return s;  // loss.item()
  // Members after the DP sum: the DP group's size (word field 1).
  if (loss_[0] != shape_.dp || loss_[2] != shape_.dp) {
    return Status::Corrupt(Where(iter, -1) + ": loss all-reduce: " + std::to_string(loss_[0]) + " / " +
                           std::to_string(loss_[2]) + " members, expected " + std::to_string(shape_.dp));
  }
  norm_.assign(n, 0);
  norm_[0] = 1;  // this rank's share of the squared gradient norm
  for (std::size_t i = 1; i < n; ++i) norm_[i] = loss_[i];
  double* nb = norm_.data();
  // --inject-swap: the compute stream waits for the grad norm only after the embd all-reduce is
  // queued, so that only the shared stream's order holds the embd all-reduce back.
  const bool swap = embd_deferred_;
  if (swap) LogSwap(iter);
  if (Status s = Enqueue(&mp_, [&](ncclComm_t c, StreamHandle st) {
        return ncclAllReduce(nb, nb, n, ncclFloat64, ncclSum, c, static_cast<cudaStream_t>(st));
      }, "ncclAllReduce(mp grad norm)", swap ? Consumer::kLater : Consumer::kCompute);
      !s.ok()) {
    return s;
  }
  if (swap) {
    embd_deferred_ = false;  // behind the grad norm on one stream, while the peers' grad norm waits for it
    if (Status s = EnqueueEmbd(iter); !s.ok()) return s;
    if (Status s = device_->StreamWait(compute_, mp_.done); !s.ok()) return s;
  }
  if (SwapIteration(iter) && HasEmbd()) {
    if (Status s = device_->StreamWait(compute_, embd_.done); !s.ok()) return s;
  }
  if (Status s = device_->HostWait(mp_.done); !s.ok()) return s;  // grad_norm.item()
  if (norm_[0] != shape_.tp * shape_.pp) {
    return Status::Corrupt(Where(iter, -1) + ": grad-norm all-reduce: " + std::to_string(norm_[0]) +
                           " shares, expected " + std::to_string(shape_.tp * shape_.pp));
  }
  std::vector<std::int32_t> summed(word.size());
  for (std::size_t i = 0; i < word.size(); ++i) {
    const double v = norm_[i + 1];
    if (v != std::floor(v) || std::fabs(v) > 2147483647.0) return Status::Corrupt("control word: not an integer");
    summed[i] = static_cast<std::int32_t>(v);
  }
  return UnpackControl(summed, shape_.world(), shape_.dp);
}

// The distributed optimizer's parameter all-gather, bucket by bucket, after the optimizer kernel.
Status MegatronTrainer::GatherParams(int iter, const std::vector<int>& micro_batches) {
  const std::size_t shard = bucket_ / static_cast<std::size_t>(shape_.dp);
  if (options_.check) {
    // Every element must be overwritten; the host writes once the forward kernels that read the
    // parameters are done.
    if (Status s = device_->Record(compute_done_, compute_); !s.ok()) return s;
    if (Status s = device_->HostWait(compute_done_); !s.ok()) return s;
    std::fill(param_.begin(), param_.end(), -1.0f);
  }
  for (std::size_t b = 0; b < static_cast<std::size_t>(options_.layers); ++b) {
    float* in = grad_shard_.data() + b * shard;
    float* out = param_.data() + b * bucket_;
    if (Status s = Enqueue(&dp_, [&](ncclComm_t c, StreamHandle st) {
          return ncclAllGather(in, out, shard, ncclFloat, c, static_cast<cudaStream_t>(st));
        }, "ncclAllGather(dp-cp params)", Consumer::kLater);
        !s.ok()) {
      return s;
    }
    if (Status s = device_->Record(gathered_[b], dp_.stream); !s.ok()) return s;
    pending_[b] = {true, iter, micro_batches};
  }
  return Status::Ok();
}

// The forward pre-hook of a layer: its parameters must have arrived.
Status MegatronTrainer::WaitParams(int layer) {
  PendingGather& p = pending_[static_cast<std::size_t>(layer)];
  if (!p.pending) return Status::Ok();
  const std::size_t b = static_cast<std::size_t>(layer);
  p.pending = false;
  if (!options_.check) return device_->StreamWait(compute_, gathered_[b]);
  if (Status s = device_->HostWait(gathered_[b]); !s.ok()) return s;
  return Verify(std::span<const float>(param_).subspan(b * bucket_, bucket_),
                ExpectedGrad(p.iter, p.micro_batches, b * bucket_),
                Rotation(p.iter, 0, 1) + b, 1e-5,
                Where(p.iter, -1) + " DP parameter all-gather bucket " + std::to_string(b));
}

Status MegatronTrainer::Drain() {
  for (Lane* lane : {&tp_, &pp_, &dp_, &mp_, &embd_, &world_, &act_in_.lane, &act_out_.lane, &grad_in_.lane,
                     &grad_out_.lane}) {
    if (lane->done == nullptr) continue;  // a direction this stage does not have
    if (Status s = device_->HostWait(lane->done); !s.ok()) return s;
  }
  if (Status s = device_->Record(compute_done_, compute_); !s.ok()) return s;
  if (Status s = device_->HostWait(compute_done_); !s.ok()) return s;
  for (int l = 0; l < options_.layers; ++l) {
    if (Status s = WaitParams(l); !s.ok()) return s;
  }
  return Status::Ok();
}

Status MegatronTrainer::WorldBarrier() {
  barrier_.assign(1, 1);
  std::int32_t* buf = barrier_.data();
  if (Status s = Enqueue(&world_, [&](ncclComm_t c, StreamHandle st) {
        return ncclAllReduce(buf, buf, 1, ncclInt32, ncclSum, c, static_cast<cudaStream_t>(st));
      }, "ncclAllReduce(world barrier)", Consumer::kCompute);
      !s.ok()) {
    return s;
  }
  return device_->HostWait(world_.done);
}

Status MegatronTrainer::WorldBroadcast(std::vector<std::int32_t>* payload) {
  std::int32_t* buf = payload->data();
  const std::size_t n = payload->size();
  if (Status s = Enqueue(&world_, [&](ncclComm_t c, StreamHandle st) {
        return ncclBroadcast(buf, buf, n, ncclInt32, 0, c, static_cast<cudaStream_t>(st));
      }, "ncclBroadcast(world plan payload)", Consumer::kLater);
      !s.ok()) {
    return s;
  }
  return device_->HostWait(world_.done);
}

}  // namespace falcon::train
