// Run loop, agreement and ground truth of one rank; see job.h and job_run.h. Plans, checkpoints
// and restarts are in job_mitigation.cc.
#include "job.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>
#include <thread>

#include "falcon_emu.h"
#include "job_run.h"

namespace falcon::train {

JobRun::JobRun(const Options& o, const JobEnvironment& env) : o_(o), env_(env), local_start_(MonotonicSeconds()) {
  report_.rank = env.rank;
  report_.world_size = env.world_size;
  report_.pid = static_cast<int>(getpid());
  report_.launch_node = falconEmuLaunchNodeOf(env.rank);
  report_.node = report_.launch_node;
  report_.coords = CoordsOf(o.shape, env.rank);
  report_.options = o;
  report_.checkpoints.every = o.checkpoint_every;
}

Status JobRun::Run() {
  Status s = o_.stall_rank >= env_.world_size
                 ? Status::InvalidArgument("--inject-stall: rank " + std::to_string(o_.stall_rank) +
                                           " is not in this job of " + std::to_string(env_.world_size) + " ranks")
                 : Status::Ok();
  if (s.ok()) s = LoadFaults();
  if (s.ok()) s = Setup();
  if (s.ok()) s = Loop();
  report_.status = s.ok() ? "ok" : s.ToString();
  report_.node = falconEmuNodeOf(env_.rank);
  if (faults_) {
    std::set<int> nodes = {report_.launch_node, report_.node};
    for (const IterationRecord& it : report_.iterations) nodes.insert(it.node);
    report_.faults = FaultsAffecting(*faults_, env_.rank, std::vector<int>(nodes.begin(), nodes.end()));
  }
  if (comms_) {
    report_.comm_groups = comms_->created();
    report_.world_splits = comms_->splits();
    report_.watchdog_polls = comms_->watchdog_polls();
  }
  if (!o_.report.empty()) {
    const Status w = WriteReport(o_.report, report_);
    if (s.ok()) s = w;
  }
  if (env_.rank == 0) std::printf("%s\n", SummaryLine(report_).c_str());
  std::fflush(stdout);
  if (!s.ok() && comms_ && !o_.world_sync) {
    // Device work may still be in flight on the trainer's buffers (a collective waiting for a
    // peer that failed). As PyTorch does on an error, abort the communicators first, so that
    // work ends, and let the streams drain before the buffers go (the trainers own them).
    comms_->AbortAll();
    if (device_) (void)device_->SynchronizeStreams();  // teardown: the job has failed already
  }
  trainer_.reset();  // before the communicators they use
  mtrainer_.reset();
  comms_.reset();
  device_.reset();
  return s;
}

double JobRun::Now() const {
  const double t = falconEmuJobSeconds();
  return t >= 0 ? t : MonotonicSeconds() - local_start_;  // not launched by falcon-emu-run, no comm yet
}

Status JobRun::LoadFaults() {
  if (env_.fault_plan.empty()) return Status::Ok();
  emu::FaultPlanResult plan = emu::LoadFaultPlan(env_.fault_plan);
  if (!plan.ok()) return Status::InvalidArgument("fault plan: " + plan.error);
  faults_ = std::move(plan.plan);
  return Status::Ok();
}

Status JobRun::Setup() {
  const int world = env_.world_size;
  facts_.world = world;
  facts_.dp = o_.shape.dp;
  facts_.initial_micro_batches.assign(static_cast<std::size_t>(o_.shape.dp), o_.micro_batches);
  std::vector<int> per_node;
  for (int r = 0; r < world; ++r) {
    const int launch = falconEmuLaunchNodeOf(r);
    if (launch >= static_cast<int>(per_node.size())) per_node.resize(static_cast<std::size_t>(launch) + 1, 0);
    ++per_node[static_cast<std::size_t>(launch)];
    state_.placement.push_back(falconEmuNodeOf(r));
  }
  facts_.total_nodes = static_cast<int>(per_node.size()) + o_.spare_nodes;
  facts_.gpus_per_node = std::max(env_.ranks_per_node, *std::max_element(per_node.begin(), per_node.end()));
  state_.micro_batches = facts_.initial_micro_batches;
  facts_.pp = o_.shape.pp;
  facts_.activation_limit = o_.ActivationLimit();
  if (o_.world_sync) {
    facts_.no_pipeline_plans = "the --world-sync trainer runs standard 1F1B only (pipeline plans need the Megatron mode "
                               "with --pp-comm per-direction)";
  } else if (o_.shape.pp == 1) {
    facts_.no_pipeline_plans = "the job has no pipeline parallelism (pp=1)";
  } else if (!o_.pp_per_direction) {
    facts_.no_pipeline_plans = "pipeline plans need --pp-comm per-direction: batched exchanges tie each send to a "
                               "receive, so extra warm-up forwards would wait for gradients instead of running ahead";
  }
  checkpoint_ = {0};
  if (env_.rank == 0) {
    // Probe: clearing the (still empty) override succeeds only where the job state exists.
    facts_.can_replace = falconEmuSetPlacement(nullptr, 0) == 0;
    if (o_.falcon_plans) source_ = std::make_unique<FalconPlanSource>();
    else if (!o_.plan_file.empty()) source_ = std::make_unique<PlanFileSource>(o_.plan_file);
  }
  return StartComms(0);
}

Status JobRun::StartComms(int round) {
  CommsOptions co;
  co.id_timeout_s = env_.id_timeout_s;
  co.id_file = env_.id_file;
  co.megatron = !o_.world_sync;
  co.lazy = o_.lazy_init;
  co.nonblocking = o_.nonblocking;
  co.watchdog = !o_.world_sync && o_.watchdog;
  co.pp_per_direction = o_.pp_per_direction;
  if (round > 0) {
    if (env_.id_file.empty()) return Status::Unavailable("restart: no FALCON_EMU_ID_FILE to exchange the new unique id");
    co.id_file = env_.id_file + ".restart" + std::to_string(round);
  }
  Result<std::unique_ptr<Comms>> comms = Comms::Create(o_.shape, env_.rank, co);
  if (!comms.ok()) return comms.status();
  comms_ = std::move(comms).value();
  // Every rank has read the id once the world exists: the round's file is no longer needed.
  if (round > 0 && env_.rank == 0 && !o_.lazy_init) std::remove(co.id_file.c_str());
  if (!compute_) {
    const int rank = env_.rank;
    compute_ = std::make_unique<ComputeModel>([rank](double t) { return falconEmuComputeFactor(rank, t); },
                                              [this] { return Now(); });
  }
  if (o_.world_sync) {
    trainer_ = std::make_unique<Trainer>(o_, env_.rank, *comms_, compute_.get());
    return Status::Ok();
  }
  if (!device_) {
    // The local GPU: the rank's seat on its node (the emulated driver has 8 devices).
    const int ordinal = env_.rank % std::max(1, env_.ranks_per_node) % 8;
    Result<std::unique_ptr<Device>> dev = Device::Open(ordinal, compute_.get());
    if (!dev.ok()) return dev.status();
    device_ = std::move(dev).value();
    report_.device_streams = device_->has_driver();
    report_.device_compute = device_->device_compute();
  }
  if (o_.pp_per_direction && o_.shape.pp > 1 && !device_->has_driver()) {
    return Status::InvalidArgument(
        "--pp-comm per-direction needs a CUDA driver (streams): without one every NCCL call completes on the host "
        "before it returns, so a receive posted ahead would wait for a send its own rank has not issued yet "
        "(falcon-emu-run puts the emulated driver on the library path unless --no-cuda)");
  }
  mtrainer_ = std::make_unique<MegatronTrainer>(o_, env_.rank, comms_.get(), device_.get());
  return mtrainer_->Init();
}

Status JobRun::Barrier() {
  if (!o_.world_sync) return mtrainer_->WorldBarrier();
  std::int32_t x = 1;
  return NcclStatus(ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, comms_->world(), nullptr), "ncclAllReduce(world barrier)");
}

Status JobRun::Drain() { return mtrainer_ ? mtrainer_->Drain() : Status::Ok(); }

ControlDecision JobRun::MakeProposal(int iter) {
  ControlDecision p;
  if (env_.rank == 0) {
    p.stop = (o_.iters > 0 && iter + 1 >= o_.iters) || (o_.duration_s > 0 && Now() >= o_.duration_s);
    if (!p.stop) p.plan = Propose();
  }
  proposal_ = p;
  return p;
}

Status JobRun::ReceivePayload(const ControlDecision& proposal, ControlDecision* d) {
  if (!d->plan || PayloadSize(*d->plan) == 0) return Status::Ok();
  Announcement& a = *d->plan;
  std::vector<std::int32_t> payload(PayloadSize(a), 0);
  if (env_.rank == 0) {
    if (!proposal.plan) return Status::Corrupt("control word: a plan rank 0 did not announce");
    payload = PackPayload(*proposal.plan);
  }
  if (o_.world_sync) {
    if (Status s = NcclStatus(ncclBroadcast(payload.data(), payload.data(), payload.size(), ncclInt32, 0,
                                            comms_->world(), nullptr),
                              "ncclBroadcast(world plan payload)");
        !s.ok()) {
      return s;
    }
  } else if (Status s = mtrainer_->WorldBroadcast(&payload); !s.ok()) {
    return s;
  }
  return UnpackPayload(payload, &a);
}

Result<ControlDecision> JobRun::Agree(const ControlDecision& proposal) {
  std::vector<std::int32_t> word = PackControl(proposal, o_.shape.dp);
  if (Status s = NcclStatus(ncclAllReduce(word.data(), word.data(), word.size(), ncclInt32, ncclSum, comms_->world(),
                                          nullptr),
                            "ncclAllReduce(world control word)");
      !s.ok()) {
    return s;
  }
  return UnpackControl(word, env_.world_size, o_.shape.dp);
}

Result<ControlDecision> JobRun::Step(int iter) {
  if (env_.rank == o_.stall_rank && iter == o_.stall_iter) {
    // --inject-stall: the host stops here, outside NCCL, as a stuck data loader would; the
    // device work already queued runs on, and peers wait in their next call with this rank.
    timespec now{};
    clock_gettime(CLOCK_REALTIME, &now);
    std::fprintf(stderr, "rank %d: --inject-stall: no NCCL calls before iteration %d for %s (from %lld ns)\n", env_.rank,
                 iter, o_.stall_s < 0 ? "good" : (std::to_string(o_.stall_s) + " s").c_str(),
                 static_cast<long long>(now.tv_sec) * 1'000'000'000LL + now.tv_nsec);
    std::fflush(stderr);
    if (o_.stall_s < 0) {
      for (;;) pause();  // until the launcher ends the job
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(o_.stall_s));
  }
  Result<ControlDecision> d = Status::Ok();
  if (o_.world_sync) {
    if (Status s = trainer_->RunIteration(iter, state_.micro_batches); !s.ok()) return s;
    d = Agree(MakeProposal(iter));
  } else {
    d = mtrainer_->RunIteration(iter, state_.micro_batches, state_.warmup, [this, iter] { return MakeProposal(iter); });
  }
  if (!d.ok()) return d;
  ControlDecision decision = std::move(d).value();
  if (Status s = ReceivePayload(proposal_, &decision); !s.ok()) return s;
  return decision;
}

Status JobRun::Loop() {
  for (int iter = 0;;) {
    const double start = Now();
    compute_->TakeMaxFactor();
    const int node = falconEmuNodeOf(env_.rank);
    Result<ControlDecision> d = Step(iter);
    if (!d.ok()) return d.status();
    const double end = Now();
    const int stage = report_.coords.pp;
    const int warmup = state_.warmup.empty() ? o_.shape.pp - stage - 1 : state_.warmup[static_cast<std::size_t>(stage)];
    report_.iterations.push_back({iter, start, end - start,
                                  state_.micro_batches[static_cast<std::size_t>(report_.coords.dp)], version_in_force_,
                                  compute_->TakeMaxFactor(), node, iter <= highest_iter_run_, warmup});
    if (mtrainer_) {
      report_.peak_activations = std::max(report_.peak_activations, mtrainer_->peak_activations());
      report_.schedule = mtrainer_->last_schedule();
    }
    highest_iter_run_ = std::max(highest_iter_run_, iter);
    Progress(iter);
    int next = iter + 1;
    // The state after this iteration is complete: a restart now loses nothing.
    if (Result<bool> c = MaybeCheckpoint(next); !c.ok()) return c.status();
    if (d.value().plan || d.value().stop) {
      if (Status s = Drain(); !s.ok()) return s;
    }
    if (d.value().plan) {
      if (Status s = Apply(*d.value().plan, end, &next); !s.ok()) return s;
    }
    if (d.value().stop) return Status::Ok();
    iter = next;
  }
}

void JobRun::Progress(int iter) const {
  if (env_.rank != 0 || o_.progress_every <= 0 || (iter + 1) % o_.progress_every != 0) return;
  const IterationRecord& last = report_.iterations.back();
  const Summary s = Summarize(report_.iterations);
  std::fprintf(stderr, "falcon-train-emu: iteration %d done at t=%.3f s: last %.2f ms, median %.2f ms, m=%d, plan v%d\n",
               iter, last.start_s + last.duration_s, last.duration_s * 1e3, s.median_s * 1e3, last.micro_batches,
               last.plan_version);
}

Status RunJob(const Options& options, const JobEnvironment& env) { return JobRun(options, env).Run(); }

}  // namespace falcon::train
