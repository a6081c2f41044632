// Run loop, agreement and ground truth of one rank; see job.h.
#include "job.h"

#include <unistd.h>

#include <cstdio>
#include <memory>
#include <optional>

#include "comms.h"
#include "falcon_emu.h"
#include "fault_plan.h"
#include "mb_plan.h"
#include "model.h"
#include "report.h"
#include "trainer.h"

namespace falcon::train {
namespace {

// Seconds since the job epoch; falls back to seconds since `local_start` while the emulator
// does not know the epoch (not launched by falcon-emu-run and no communicator yet).
double JobSeconds(double local_start) {
  const double t = falconEmuJobSeconds();
  return t >= 0 ? t : MonotonicSeconds() - local_start;
}

// The control all-reduce at the end of an iteration: rank 0 contributes its proposal (stop, new
// plan), the others an empty one; everyone learns the same decision.
Result<ControlDecision> AgreeAtBoundary(const Comms& comms, int world, int dp, const ControlDecision& proposal) {
  std::vector<std::int32_t> word = PackControl(proposal, dp);
  if (Status s = NcclStatus(ncclAllReduce(word.data(), word.data(), word.size(), ncclInt32, ncclSum, comms.world(),
                                          nullptr),
                            "ncclAllReduce(world control word)");
      !s.ok()) {
    return s;
  }
  return UnpackControl(word, world, dp);
}

class JobRun {
 public:
  JobRun(const Options& o, const JobEnvironment& env) : o_(o), env_(env), local_start_(MonotonicSeconds()) {
    report_.rank = env.rank;
    report_.world_size = env.world_size;
    report_.pid = static_cast<int>(getpid());
    report_.node = falconEmuNodeOf(env.rank);
    report_.coords = CoordsOf(o.shape, env.rank);
    report_.options = o;
  }

  Status Run() {
    Status s = LoadFaults();
    if (s.ok()) s = Loop();
    report_.status = s.ok() ? "ok" : s.ToString();
    if (!o_.report.empty()) {
      const Status w = WriteReport(o_.report, report_);
      if (s.ok()) s = w;
    }
    if (env_.rank == 0) std::printf("%s\n", SummaryLine(report_).c_str());
    std::fflush(stdout);
    return s;
  }

 private:
  Status LoadFaults() {
    if (env_.fault_plan.empty()) return Status::Ok();
    const emu::FaultPlanResult plan = emu::LoadFaultPlan(env_.fault_plan);
    if (!plan.ok()) return Status::InvalidArgument("fault plan: " + plan.error);
    report_.faults = FaultsAffecting(*plan.plan, env_.rank, report_.node);
    return Status::Ok();
  }

  Status Loop() {
    Result<std::unique_ptr<Comms>> comms = Comms::Create(o_.shape, env_.rank, env_.id_timeout_s);
    if (!comms.ok()) return comms.status();
    const int rank = env_.rank;
    const double local_start = local_start_;
    ComputeModel compute([rank](double t) { return falconEmuComputeFactor(rank, t); },
                         [local_start] { return JobSeconds(local_start); });
    Trainer trainer(o_, rank, *comms.value(), &compute);
    std::optional<PlanFileWatcher> watcher;
    if (rank == 0 && !o_.plan_file.empty()) watcher.emplace(o_.plan_file, o_.shape.dp);
    MicroBatchPlan plan{0, std::vector<int>(static_cast<std::size_t>(o_.shape.dp), o_.micro_batches)};
    for (int iter = 0;; ++iter) {
      const double start = JobSeconds(local_start);
      compute.TakeMaxFactor();
      if (Status s = trainer.RunIteration(iter, plan.micro_batches); !s.ok()) return s;
      ControlDecision proposal;
      proposal.stop = rank == 0 && ((o_.iters > 0 && iter + 1 >= o_.iters) ||
                                    (o_.duration_s > 0 && JobSeconds(local_start) >= o_.duration_s));
      if (watcher) {
        std::string warning;
        proposal.new_plan = watcher->Poll(plan.version, &warning);
        if (!warning.empty()) std::fprintf(stderr, "falcon-train-emu: ignoring plan: %s\n", warning.c_str());
      }
      Result<ControlDecision> d = AgreeAtBoundary(*comms.value(), env_.world_size, o_.shape.dp, proposal);
      if (!d.ok()) return d.status();
      const double end = JobSeconds(local_start);
      report_.iterations.push_back({iter, start, end - start, plan.micro_batches[static_cast<std::size_t>(report_.coords.dp)],
                                    plan.version, compute.TakeMaxFactor()});
      if (d.value().new_plan) {
        plan = *d.value().new_plan;
        report_.plan_changes.push_back({iter + 1, plan.version, plan.micro_batches});
        if (rank == 0) std::fprintf(stderr, "falcon-train-emu: plan version %d applies from iteration %d\n",
                                    plan.version, iter + 1);
      }
      Progress(iter);
      if (d.value().stop) return Status::Ok();
    }
  }

  void Progress(int iter) const {
    if (env_.rank != 0 || o_.progress_every <= 0 || (iter + 1) % o_.progress_every != 0) return;
    const IterationRecord& last = report_.iterations.back();
    const Summary s = Summarize(report_.iterations);
    std::fprintf(stderr, "falcon-train-emu: iteration %d done at t=%.3f s: last %.2f ms, median %.2f ms, m=%d, plan v%d\n",
                 iter, last.start_s + last.duration_s, last.duration_s * 1e3, s.median_s * 1e3, last.micro_batches,
                 last.plan_version);
  }

  const Options o_;
  const JobEnvironment env_;
  const double local_start_;
  ReportData report_;
};

}  // namespace

Status RunJob(const Options& options, const JobEnvironment& env) { return JobRun(options, env).Run(); }

}  // namespace falcon::train
