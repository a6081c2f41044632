// Mitigation plans at iteration boundaries: rank 0's proposal, applying S1..S4 on every rank with
// their modelled costs, in-memory checkpoints and restarts; see job_run.h for the order of events.
#include <algorithm>
#include <cstdio>
#include <map>

#include "falcon_emu.h"
#include "job_run.h"

namespace falcon::train {

std::optional<Announcement> JobRun::Propose() {
  if (!source_) return std::nullopt;
  std::string warning;
  std::optional<PlanOffer> offer = source_->Poll(last_considered_, &warning);
  if (!warning.empty()) {
    std::fprintf(stderr, "falcon-train-emu: %s%s\n", o_.falcon_plans ? "" : "ignoring plan: ", warning.c_str());
  }
  if (!offer) return std::nullopt;
  const MitigationPlan& plan = offer->plan;
  Announcement a;
  a.version = plan.version;
  if (offer->strategy_known) a.strategy = plan.strategy;
  pending_source_ = offer->source;
  pending_rejection_ = offer->rejection;
  if (pending_rejection_.empty()) {
    Result<PlanEffect> e = ResolvePlan(plan, facts_, state_);
    if (e.ok()) {
      a.effect = std::move(e).value();
      if (a.effect.placement == state_.placement && !a.effect.restart) a.effect.placement.clear();  // unchanged
      a.exclude_nodes = plan.exclude_nodes;
    } else {
      pending_rejection_ = e.status().message();
    }
  }
  if (!pending_rejection_.empty()) {
    a.verdict = Verdict::kReject;
    a.effect = {};
    std::fprintf(stderr, "falcon-train-emu: rejecting plan version %d (%s, from %s): %s; training goes on\n", a.version,
                 a.strategy ? StrategyName(*a.strategy) : "unknown strategy", pending_source_.c_str(),
                 pending_rejection_.c_str());
  }
  return a;
}

Status JobRun::Apply(const Announcement& a, double decided_at, int* next_iter) {
  last_considered_ = a.version;
  PlanRecord rec;
  rec.version = a.version;
  rec.strategy = a.strategy ? StrategyName(*a.strategy) : "unknown";
  rec.source = env_.rank == 0 ? pending_source_ : (o_.falcon_plans ? "falcon" : "file");
  rec.at_s = decided_at;
  if (a.verdict == Verdict::kReject) {
    rec.status = "rejected";
    rec.reason = env_.rank == 0 ? pending_rejection_ : "rejected by rank 0";
    rec.iter = *next_iter;
    report_.plans.push_back(std::move(rec));
    ack_.Ack(a.version, 1);  // the verdict reaches Falcon when the shim is there; no shim: nothing to tell
    return Status::Ok();
  }
  const double t0 = MonotonicSeconds();
  const std::vector<int> to = a.effect.placement.empty() ? state_.placement : a.effect.placement;
  rec.moved_ranks = MovedRanks(state_.placement, to);
  if (a.effect.restart) {
    if (Status s = Restart(a, decided_at, to, next_iter); !s.ok()) return s;
    rec.modelled_s = o_.restart_s;
  } else if (!rec.moved_ranks.empty()) {
    if (Status s = MoveRanks(to, &rec.modelled_s, &rec.moved_bytes); !s.ok()) return s;
  }
  if (a.effect.micro_batches != state_.micro_batches || a.effect.restart) {
    report_.plan_changes.push_back({*next_iter, a.version, a.effect.micro_batches});
  }
  if (a.effect.warmup != state_.warmup) rec.warmup_changed = true;
  state_ = {a.effect.micro_batches, to, a.effect.warmup};
  version_in_force_ = a.version;
  rec.status = "applied";
  rec.iter = *next_iter;
  rec.cost_s = MonotonicSeconds() - t0;
  rec.micro_batches = a.effect.micro_batches;
  rec.placement = to;
  rec.exclude_nodes = a.exclude_nodes;
  rec.warmup = a.effect.warmup;
  rec.restart = a.effect.restart;
  if (env_.rank == 0) {
    std::fprintf(stderr, "falcon-train-emu: plan version %d (%s) applies from iteration %d (cost %.3f s)\n", a.version,
                 rec.strategy.c_str(), *next_iter, rec.cost_s);
  }
  // What the plan cost this rank (the controller takes the slowest rank's figure as the
  // strategy's measured overhead): the stop and state move, or the restart plus the work it
  // rolled back.
  if (a.strategy && *a.strategy != Strategy::kIgnore) {
    const double lost = a.effect.restart && !report_.restarts.empty() ? report_.restarts.back().lost_s : 0.0;
    ack_.ReportCost(static_cast<std::uint32_t>(*a.strategy), rec.cost_s + lost);
  }
  report_.plans.push_back(std::move(rec));
  ack_.Ack(a.version, 0);
  return Status::Ok();
}

Status JobRun::InstallPlacement(const std::vector<int>& to) const {
  const int rc = falconEmuSetPlacement(to.data(), static_cast<int>(to.size()));
  if (rc != 0) return Status::Unavailable("falconEmuSetPlacement returned " + std::to_string(rc));
  return Status::Ok();
}

// S3: every rank installs the same placement, models the state move of the ranks that changed
// node (their parameters and optimizer state over the fabric; several ranks between the same
// two nodes share that path; distinct paths run in parallel), and all meet in a barrier.
Status JobRun::MoveRanks(const std::vector<int>& to, double* modelled_s, std::uint64_t* moved_bytes) {
  std::map<std::pair<int, int>, double> bytes_per_path;
  const double state = static_cast<double>(o_.StateBytes());
  for (int r : MovedRanks(state_.placement, to)) {
    bytes_per_path[{state_.placement[static_cast<std::size_t>(r)], to[static_cast<std::size_t>(r)]}] += state;
    *moved_bytes += o_.StateBytes();
  }
  double seconds = 0;
  for (const auto& [path, bytes] : bytes_per_path) {
    seconds = std::max(seconds, falconEmuTransferSeconds(path.first, path.second, bytes));
  }
  *modelled_s = seconds;
  if (Status s = InstallPlacement(to); !s.ok()) return s;
  SleepFor(seconds);
  return Barrier();
}

// S4: the job stops, restarts (modelled) with the ranks of the excluded nodes on their new nodes,
// and rolls back to the last checkpoint.
Status JobRun::Restart(const Announcement& a, double decided_at, const std::vector<int>& to, int* next_iter) {
  const double t0 = MonotonicSeconds();
  RestartRecord r;
  r.version = a.version;
  r.at_s = decided_at;
  r.next_iter = *next_iter;
  r.rollback_to = checkpoint_.next_iter;
  r.lost_iterations = *next_iter - checkpoint_.next_iter;
  const std::size_t n = report_.iterations.size();
  const std::size_t lost = std::min(n, static_cast<std::size_t>(r.lost_iterations));
  for (std::size_t i = n - lost; i < n; ++i) r.lost_s += report_.iterations[i].duration_s;  // their latest runs
  r.restart_s = o_.restart_s;
  r.exclude_nodes = a.exclude_nodes;
  trainer_.reset();
  mtrainer_.reset();  // drained at the boundary
  comms_.reset();  // destroys the world and its splits
  SleepFor(o_.restart_s);
  if (to != state_.placement) {
    if (Status s = InstallPlacement(to); !s.ok()) return s;
  }
  ++restarts_;
  if (Status s = StartComms(restarts_); !s.ok()) return s;
  *next_iter = checkpoint_.next_iter;
  r.cost_s = MonotonicSeconds() - t0;
  if (env_.rank == 0) {
    std::fprintf(stderr, "falcon-train-emu: restarted (plan version %d): rolled back from iteration %d to %d, %d lost\n",
                 a.version, r.next_iter, r.rollback_to, r.lost_iterations);
  }
  report_.restarts.push_back(std::move(r));
  return Status::Ok();
}

Result<bool> JobRun::MaybeCheckpoint(int next_iter) {
  if (next_iter <= checkpoint_.next_iter || next_iter % o_.checkpoint_every != 0) return false;
  checkpoint_ = {next_iter};
  ++report_.checkpoints.taken;
  report_.checkpoints.last_iter = next_iter;
  // From the job's history, what an S4 restart would cost now: the relaunch plus, on average,
  // half a checkpoint period of work rolled back at the recent iteration time.
  const std::size_t n = report_.iterations.size();
  const std::size_t k = std::min(n, static_cast<std::size_t>(o_.checkpoint_every));
  if (k > 0) {
    double recent = 0;
    for (std::size_t i = n - k; i < n; ++i) recent += report_.iterations[i].duration_s;
    recent /= static_cast<double>(k);
    ack_.ReportCost(static_cast<std::uint32_t>(Strategy::kRestart), o_.restart_s + 0.5 * o_.checkpoint_every * recent);
  }
  if (o_.checkpoint_save_ms > 0) {
    // A modelled save (the device idle first, as a state_dict copy synchronises it), then
    // torch.distributed.barrier(): every rank has saved before training goes on.
    if (Status s = Drain(); !s.ok()) return s;
    SleepFor(o_.checkpoint_save_ms * 1e-3);
    if (Status s = Barrier(); !s.ok()) return s;
  }
  return true;
}

}  // namespace falcon::train
