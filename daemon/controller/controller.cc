// Controller, its state machine and loop: see controller.h.
#include "daemon/controller/controller.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <cmath>
#include <cstdio>
#include <set>

#include "analyzer/localize.h"
#include "analyzer/robust.h"
#include "daemon/common/prometheus_text.h"
#include "daemon/common/log_escape.h"
#include "daemon/controller/validation_steps.h"

namespace falcon::controller {
namespace {

using nlohmann::json;

constexpr std::int64_t kNsPerS = 1'000'000'000;
// After a failed step the loop waits this long, doubling per consecutive failure.
constexpr int kStepBackoffMinMs = 50;
constexpr int kStepBackoffMaxMs = 5000;

std::int64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * kNsPerS + ts.tv_nsec;
}

std::int64_t Seconds(double s) { return static_cast<std::int64_t>(s * static_cast<double>(kNsPerS)); }

std::string Fixed(double v, int digits = 2) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

// The validation settings: what counts as a slow GPU or link (config ratios) for the round's
// re-measuring and its verdict, with the rounds' own.
ValidationSettings ValidationSettingsOf(const ControllerConfig& c) {
  ValidationSettings s = c.validation;
  s.localization.gemm_ratio = c.gemm_ratio;
  s.localization.link_ratio = c.link_ratio;
  return s;
}

StepOptions StepOptionsOf(const ControllerConfig& c) {
  StepOptions so;
  so.gemm_batch = static_cast<std::size_t>(c.gemm_batch);
  so.tree = c.tree;
  return so;
}

}  // namespace

std::int64_t Controller::WallNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * kNsPerS + ts.tv_nsec;
}

Controller::Controller(ControllerConfig config, std::shared_ptr<spdlog::logger> log)
    : config_(std::move(config)),
      log_(std::move(log)),
      started_ns_(WallNs()),
      command_prefix_("ctl-" + std::to_string(started_ns_ / 1'000'000)),
      profiling_(ProfilingStageOptions{command_prefix_, config_.validation.ack_timeout_s,
                                       config_.suspicious_ratio},
                 log_),
      watch_(RecoveryWatchOptions{command_prefix_, config_.validation.ack_timeout_s}),
      validation_(ValidationSettingsOf(config_), StepOptionsOf(config_)),
      mismatch_(MismatchStageOptions{config_.mismatch_grace_s, 8}),
      hang_(HangStageOptions{config_.hang_wait_s, config_.hang_repeat_s, 16}),
      decision_(DecisionStageOptions{config_.mitigation, config_.job, command_prefix_,
                                     MonotonicNs},
                log_) {}

int Controller::Run(const std::atomic<bool>& stop) {
  log_->info("event=start job={} host={} version={} redis={}", daemon::LogValue(config_.job),
             daemon::LogValue(config_.host), kControllerVersion, daemon::LogQuoted(config_.redis.Describe()));
  if (config_.metrics_port > 0) {
    metrics_ = std::make_unique<MetricsEndpoint>();
    if (Status s = metrics_->Start(config_.metrics_address, config_.metrics_port); !s.ok()) {
      log_->error("event=metrics_failed address={} port={} error={}", daemon::LogValue(config_.metrics_address),
                  config_.metrics_port, daemon::LogQuoted(s.message()));
      return 1;
    }
    log_->info("event=metrics address={} port={}", daemon::LogValue(config_.metrics_address), metrics_->port());
  }
  reader_ = std::make_unique<redis::RedisWorker>("redis-read", config_.redis);
  reader_->Start();
  ScheduleTurn(0);
  std::function<void()> watch_stop = [&] {
    if (stop.load(std::memory_order_relaxed)) {
      io_.stop();
      return;
    }
    stop_poll_.expires_after(std::chrono::milliseconds(50));
    stop_poll_.async_wait([&](const boost::system::error_code& ec) {
      if (!ec) watch_stop();
    });
  };
  watch_stop();
  io_.run();
  reader_->Stop();  // wakes a read blocked in XREAD; nothing it posts runs any more
  if (conn_ && conn_->connected()) {
    if (validation_.running() && !validation_.done()) {  // never leave a job paused behind us
      (void)Send(validation_.Release(command_prefix_ + "-stop", view_, WallNs()));
    }
    if (profiling_.mode() != "track") (void)SetMode("track", WallNs());  // leave the shims cheap
    (void)Send(watch_.Disarm(view_, WallNs()));
    (void)SaveState(WallNs());
  }
  log_->info("event=stop");
  return 0;
}

void Controller::ScheduleTurn(int after_ms) {
  turn_.expires_after(std::chrono::milliseconds(after_ms));
  turn_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) Turn();
  });
}

void Controller::Turn() {
  const std::int64_t now = WallNs();
  if (!EnsureConnected(now)) {
    ScheduleTurn(config_.tick_ms);  // bounded wait before the next attempt
    return;
  }
  Status s = Status::Ok();
  // While ranks wait on a round (from its pause command: the first to reach their cut wait there
  // for the last) its steps come first: a re-read of the rank keys blocks the loop (about half a
  // second at 16,384 ranks), and the acks that end the wait would wait for it. The round sends
  // to the hosts of the view it began with; the re-read comes in the turn after the resume.
  const bool ranks_wait = validation_.stopping();
  if (now >= next_view_ns_ && !ranks_wait) {
    s = RefreshView();
    // Re-reading every rank key blocks the loop (at 16,384 ranks about half a second): spaced
    // so that it takes at most 1/kViewShareInverse of the loop, the phases keep their pace. A
    // failed re-read (Redis slow or gone) is not a measure of the job: retried at view-ms.
    // Likewise at most view-keys-per-s keys a second: how often Redis is asked, and how often
    // the view is rebuilt from every rank's registration, does not follow how fast the
    // controller parses (with a faster allocator it re-read 1.3-1.8x as often). A rank whose
    // content is held counts as a key read: rebuilding the view costs per rank all the same.
    view_refresh_ns_ = std::max<std::int64_t>(0, WallNs() - now);
    const std::int64_t apart = std::int64_t{config_.view_ms} * 1'000'000;
    const std::int64_t budget = static_cast<std::int64_t>(view_keys_) * 1'000'000'000 / config_.view_keys_per_s;
    next_view_ns_ = now + (s.ok() ? std::max({apart, kViewShareInverse * view_refresh_ns_, budget}) : apart);
  }
  if (s.ok()) s = Advance(WallNs());
  if (s.ok()) s = AdvanceHang(WallNs());
  // The state document grows with the job (at 16,384 ranks a sweep's suspicion alone lists
  // 17,536 communicators) and every turn that read something dirties it: a changed state waits
  // until the last write is 1/kSaveShareInverse of the loop behind, the heartbeat never.
  // Likewise a write of a changed state waits for the resume; the heartbeat's does not (falcon-ctl
  // tells a live controller by the state's age).
  if (s.ok() && ((dirty_ && !ranks_wait && WallNs() >= save_not_before_ns_) || WallNs() >= next_save_ns_)) {
    const std::int64_t t0 = WallNs();
    s = SaveState(t0);
    state_save_ns_ = std::max<std::int64_t>(0, WallNs() - t0);
    save_not_before_ns_ = t0 + kSaveShareInverse * state_save_ns_;
  } else if (!s.ok() && conn_->connected() && WallNs() >= next_save_ns_) {
    // A step that keeps failing must not make the controller look dead: the heartbeat goes on.
    if (Status saved = SaveState(WallNs()); !saved.ok()) {
      log_->debug("event=state_save_failed error={}", daemon::LogQuoted(saved.message()));
    }
  }
  if (s.ok() && config_.stream_retention_s > 0 && !trim_refused_ && WallNs() >= next_trim_ns_) TrimStreams(WallNs());
  // The next read starts when the turn is done, so it takes in everything that arrived during
  // the turn at once, as the blocking loop did: a read per turn, not a turn per entry.
  if (s.ok()) s = ProbeStreams(WallNs(), false);
  if (s.ok()) StartRead();
  PublishMetrics();
  if (!s.ok()) {
    Failed(s);
    return;
  }
  if (step_failures_ > 0) {
    log_->info("event=step_recovered failures={}", step_failures_);
    step_failures_ = 0;
    step_backoff_ms_ = 0;
    step_error_.clear();
  }
  ScheduleTurn(validation_.running() ? std::min(config_.tick_ms, 50) : config_.tick_ms);
}

void Controller::Failed(const Status& s) {
  StepFailed(s);
  if (s.code() == Status::Code::kUnavailable || s.code() == Status::Code::kCorrupt) conn_->Close();
  ScheduleTurn(step_backoff_ms_);  // bounded
}

void Controller::StepFailed(const Status& s) {
  ++step_failures_;
  ++step_failures_total_;
  step_backoff_ms_ = std::clamp(step_backoff_ms_ * 2, kStepBackoffMinMs, kStepBackoffMaxMs);
  if (s.message() == step_error_) return;  // logged already: only a change is news
  step_error_ = s.message();
  log_->warn("event=step_failed failures={} retry_ms={} error={}", step_failures_, step_backoff_ms_,
             daemon::LogQuoted(s.message()));
}

void Controller::PublishMetrics() {
  if (!metrics_) return;
  ControllerMetrics m = counted_;
  m.job = config_.job;
  m.host = config_.host;
  m.phase = PhaseName(state_.phase);
  m.incident_open = state_.incident.has_value();
  m.ranks = view_.ranks().size();
  m.agents = view_.agents().size();
  m.slow_ranks = LiveSlow().size();
  m.stalled_ranks = hang_.stalled().size();
  m.hang_open = !hang_.episode().empty();
  m.signature_calls = mismatch_.calls();
  m.signatures_pending = mismatch_.ledger().pending() + mismatch_.blocks().pending();
  m.current_iteration_seconds = CurrentIterationS().value_or(0);
  m.healthy_iteration_seconds = state_.healthy_s.value_or(0);
  m.plan_version = state_.plan_version;
  m.redis_connected = conn_ && conn_->connected();
  m.step_failures = step_failures_total_;
  m.dropped_messages = dropped_messages_;
  m.cpu_seconds = daemon::ProcessCpuSeconds();
  m.view_refresh_seconds = static_cast<double>(view_refresh_ns_) / 1e9;
  m.state_save_seconds = static_cast<double>(state_save_ns_) / 1e9;
  m.stream_trimmed = trimmed_total_;
  m.stream_lag_seconds = stream_lag_s_;
  std::string health = std::string("ok\nredis ") + (m.redis_connected ? "up" : "down") + "\nphase " + m.phase + "\n";
  metrics_->Publish(RenderControllerMetrics(m), std::move(health));
}

const std::vector<std::int64_t>& Controller::LiveSlow() const { return tracking_.LiveSlow(view_); }

std::optional<double> Controller::CurrentIterationS() const { return tracking_.CurrentIterationS(view_); }

void Controller::Enter(Phase p, std::int64_t now_ns) {
  log_->info("event=phase from={} to={} incident={}", PhaseName(state_.phase), PhaseName(p),
             state_.incident ? daemon::LogValue(state_.incident->id) : "-");
  state_.phase = p;
  state_.since_ns = now_ns;
  dirty_ = true;
}

// An S3/S4 plan's placement is in force once every live rank's framework has applied it.
void Controller::AdoptAppliedPlacement() {
  if (state_.pending_version == 0 || view_.ranks().empty()) return;
  for (const auto& [rank, r] : view_.ranks()) {
    if (r.plan_applied < state_.pending_version) return;
  }
  log_->info("event=placement_in_force plan_version={}", state_.pending_version);
  state_.placement = std::move(state_.pending_placement);
  state_.excluded_nodes.insert(state_.excluded_nodes.end(), state_.pending_excluded.begin(), state_.pending_excluded.end());
  state_.pending_version = 0;
  state_.pending_placement.clear();
  state_.pending_excluded.clear();
  view_.SetNodes(state_.node_hosts, state_.placement);
  dirty_ = true;
}

// The hang stage's turn: the progress commands it asks for, then the incident entries it made.
// An entry that cannot be written goes back to the stage, for the next turn.
Status Controller::AdvanceHang(std::int64_t now_ns) {
  const bool was_open = !hang_.episode().empty();
  if (Status s = Send(hang_.Next(view_, now_ns)); !s.ok()) return s;
  if (!was_open && !hang_.episode().empty()) {
    log_->warn("event=hang_episode id={} stalled={}", daemon::LogValue(hang_.episode()), hang_.stalled().size());
  }
  std::vector<HangRecord> found = mismatch_.Next(view_, now_ns);
  for (std::size_t i = 0; i < found.size(); ++i) {
    if (Status s = Record(found[i].stage, found[i].summary, found[i].fields, found[i].severity); !s.ok()) {
      mismatch_.Unwritten(std::vector<HangRecord>(found.begin() + static_cast<std::ptrdiff_t>(i), found.end()));
      return s;
    }
    log_->warn("event=mismatch_raised id={} ranks={}", daemon::LogValue(found[i].fields["id"].get<std::string>()),
               daemon::LogValue(found[i].fields["ranks"].dump()));
  }
  std::vector<HangRecord> records = hang_.TakeRecords();
  for (std::size_t i = 0; i < records.size(); ++i) {
    const nlohmann::json& d = records[i].fields["detail"];
    if (records[i].stage == "mismatch" && d.contains("comm") && d.contains("seq")) {
      // Raised already while the job ran (MismatchStage): once is enough.
      const auto comm = protocol::ParseCommIdHex(d["comm"].get<std::string>());
      if (comm && mismatch_.Recorded(*comm, d["seq"].get<std::uint64_t>())) continue;
    }
    if (Status s = Record(records[i].stage, records[i].summary, records[i].fields, records[i].severity); !s.ok()) {
      hang_.Unwritten(std::vector<HangRecord>(records.begin() + static_cast<std::ptrdiff_t>(i), records.end()));
      return s;
    }
  }
  return Status::Ok();
}

Status Controller::Advance(std::int64_t now_ns) {
  Status s = AdvancePhase(now_ns);
  if (decision_.TakeChanged()) dirty_ = true;  // the planner's state is part of the incident's
  return s;
}

Status Controller::AdvancePhase(std::int64_t now_ns) {
  AdoptAppliedPlacement();
  if (!requests_.empty() && state_.phase != Phase::kTracking) {  // the round under way answers it
    state_.incident->request = requests_.back()["id"].get<std::string>();
    requests_.clear();
  }
  switch (state_.phase) {
    case Phase::kTracking: return Track(now_ns);
    case Phase::kProfiling:
      if (LiveSlow().empty() && state_.incident->request.empty() && !state_.incident->recheck) {
        if (Status s = SetMode("track", now_ns); !s.ok()) return s;
        return Resolve(now_ns, "recovered before validation");
      }
      if (profiling_.Ready(view_, state_.profile_from_ns) || now_ns - state_.since_ns > Seconds(config_.profile_wait_s)) return FinishProfiling(now_ns);
      return Status::Ok();
    case Phase::kValidating:
      if (!validation_.running()) return StartValidation(now_ns, /*release_first=*/true);
      if (Status s = Send(validation_.Next(view_, now_ns)); !s.ok()) return s;
      validation_.FreeAnswered();  // after the next step is out: off the pause's path
      return validation_.done() ? FinishValidation(now_ns) : Status::Ok();
  }
  return Status::Ok();
}

// Manual validation: in tracking, a request opens an incident (if none is open) and starts a
// round at once; in profiling or validating the round under way answers it.
Status Controller::ServeRequests(std::int64_t now_ns) {
  if (requests_.empty() || state_.phase != Phase::kTracking) return Status::Ok();
  const json r = requests_.front();
  requests_.clear();  // one round answers every request made so far
  if (!state_.incident) {
    const std::string why = r.value("reason", "");
    Incident inc;
    inc.id = "inc-" + std::to_string(now_ns / 1'000'000) + "-" + std::to_string(++state_.incidents);
    inc.opened_ns = now_ns;
    inc.ranks = LiveSlow();
    inc.healthy_s = state_.healthy_s.value_or(0);
    inc.request = r["id"].get<std::string>();
    state_.incident = inc;
    if (Status s = Record("detection",
                          "manual validation requested" + (r.contains("by") ? " by " + r["by"].get<std::string>() : "") +
                              (why.empty() ? "" : ": " + why),
                          {{"at_ns", now_ns}, {"ranks", inc.ranks}, {"detail", {{"request", r}, {"manual", true}}}},
                          "info");
        !s.ok()) {
      return s;
    }
  } else {
    state_.incident->request = r["id"].get<std::string>();
    state_.incident->localised = false;  // asked again: validate again
  }
  state_.incident->attempts = std::min(state_.incident->attempts, config_.max_attempts - 1);
  return StartProfiling(now_ns);
}

Status Controller::Track(std::int64_t now_ns) {
  Result<std::optional<std::string>> watched = Watch(now_ns);
  if (!watched.ok()) return watched.status();
  if (watched.value()) return Resolve(now_ns, *watched.value());
  if (!requests_.empty()) return ServeRequests(now_ns);
  const std::vector<std::int64_t> slow = LiveSlow();
  if (!state_.incident) {
    if (slow.empty()) {
      if (const auto cur = CurrentIterationS()) state_.healthy_s = *cur;
      return Status::Ok();
    }
    const std::vector<std::int64_t> outbreak =
        tracking_.Outbreak(view_, config_.min_slow_fraction, StaleBefore(now_ns));
    if (outbreak.empty()) return Status::Ok();
    if (Status s = OpenIncident(now_ns, outbreak); !s.ok()) return s;
    return StartProfiling(now_ns);
  }
  if (slow.empty() && !state_.incident->request.empty() && state_.incident->attempts > 0) {
    return Resolve(now_ns, "manual validation done");
  }
  Incident& inc = *state_.incident;
  Mitigator* m = decision_.Current(inc);
  // While S2 (or adapted warm-up counts) holds, the iteration time cannot tell whether the culprits are still slow: S2 may be
  // what makes the job look healthy, and once the fault is gone the re-balanced split itself
  // keeps the job slower than its even split did. So the culprits are validated again now and
  // then (recheck-s, doubling while they stay slow), whether the ranks look slow or not.
  const bool rebalancing = m != nullptr && !m->stopped() && (m->rebalance_in_effect() || m->pipeline_in_effect()) &&
                           inc.localised && config_.mitigation.mode == "act";
  // The recovery watch seeing the culprits' groups still wait for them is what a round would
  // find: the timer runs from the later of the two.
  auto recheck_due = [&] {
    return now_ns - std::max(inc.last_round_ns, inc.watch_seen_ns) >= Seconds(RecheckIntervalS(inc));
  };
  const UnderPlan under = rebalancing ? FasterUnderPlan(now_ns) : UnderPlan::kNothing;
  if (under == UnderPlan::kUndo) {
    const bool rebalanced = m->rebalance_in_effect();
    const std::string plan = rebalanced ? "the re-balanced micro-batches" : "the pipeline plan";
    return Resolve(now_ns, "the job runs faster than its fault allows under " + plan + " (" +
                               Fixed(inc.plan_level_s, 3) + " s an iteration with its fault, " +
                               Fixed(inc.healthy_s * m->FaultFreeRatio().value_or(1.0), 3) +
                               " s expected without it, " + Fixed(inc.healthy_s, 3) +
                               " s healthy): the " + (rebalanced ? "slow GPU" : "slow link") +
                               " recovered");
  }
  const bool faster_due = under == UnderPlan::kRecheck;
  if (inc.localised && m != nullptr && !m->stopped()) {
    if (const auto cur = CurrentIterationS(); cur && *cur > 0 && (inc.best_since_round_s <= 0 || *cur < inc.best_since_round_s)) {
      inc.best_since_round_s = *cur;
    }
  }
  // A new slowdown (OnAlarm), or a round whose outcome Redis refused, asks for a re-check.
  const bool revalidate_due = inc.revalidate && m != nullptr && !m->stopped() && now_ns >= inc.next_attempt_ns;
  auto recheck = [&] {
    inc.attempts = std::min(inc.attempts, config_.max_attempts - 1);
    inc.recheck = true;
    inc.revalidate = false;
    return StartProfiling(now_ns);
  };
  if (slow.empty()) {
    const bool gone = std::none_of(inc.ranks.begin(), inc.ranks.end(),
                                   [&](std::int64_t r) { return view_.ranks().count(r) > 0; });
    if (!gone && rebalancing) return recheck_due() || revalidate_due || faster_due ? recheck() : FeedMitigation(now_ns);
    return Resolve(now_ns, gone ? "the slow ranks are gone (exited, or their agents stopped reporting)"
                                : m != nullptr && m->current() != "S1" && config_.mitigation.mode == "act"
                                      ? "iteration time is back to healthy under " + m->current()
                                      : "iteration time is back to healthy");
  }
  if (!inc.localised && inc.attempts < config_.max_attempts && now_ns >= inc.next_attempt_ns) {
    return StartProfiling(now_ns);
  }
  if (revalidate_due || (rebalancing && (recheck_due() || faster_due))) return recheck();
  return FeedMitigation(now_ns);
}

// The settle of the plan level: this many planner samples after a plan or a round.
constexpr int kPlanSettleSamples = 5;
// The fault's end under a plan is read from each rank's last few iterations, and must hold for
// as many iterations: the job's pace a few iterations after the fault ended.
constexpr std::size_t kQuickIterations = 3;

// The job's iteration time is the median of each rank's last kRecentIterations: it shows a plan
// once the plan is in force (the next boundary) and twice that many iterations have run under it.
void Controller::SettlePlanLevel(Incident& inc, std::int64_t now_ns, bool keep_level) const {
  if (!keep_level) inc.plan_level_s = 0;
  inc.faster_since_ns = 0;
  const double iteration_s = CurrentIterationS().value_or(inc.healthy_s);
  inc.plan_level_after_ns = now_ns + Seconds(kPlanSettleSamples * config_.mitigation.sample_s +
                                             2.0 * static_cast<double>(TrackingStage::kRecentIterations) * iteration_s);
}

Controller::UnderPlan Controller::FasterUnderPlan(std::int64_t now_ns) {
  Incident& inc = *state_.incident;
  const std::optional<double> cur = CurrentIterationS();
  if (!cur || *cur <= 0) return UnderPlan::kNothing;
  if (inc.plan_level_after_ns != 0 && now_ns >= inc.plan_level_after_ns) {  // (re)measured
    inc.plan_level_s = *cur;
    inc.plan_level_after_ns = 0;
    inc.faster_since_ns = 0;
    dirty_ = true;
    return UnderPlan::kNothing;
  }
  // Until then the level measured before the last round holds: a round confirms its fault, and
  // its pause only slows the iterations it falls into.
  if (inc.plan_level_s <= 0) return UnderPlan::kNothing;
  // Without its fault the plan should give its fault-free pace: the healthy time at worst for
  // adapted warm-up counts (they only add slack), the fullest DP replica's share of it for
  // re-balanced micro-batches (Mitigator::FaultFreeRatio); the healthy time where the plan's pace
  // is unknown. A plan that leaves the job clearly slower than that (by half the suspicious
  // margin) can show the fault's end: the job's last kQuickIterations then fall below the
  // midpoint of the two levels, for as many iterations. One that hides the fault entirely cannot;
  // the recheck-s timer alone tells then. Where the fault-free pace is known and the plan's level
  // is above it by the full suspicious ratio, the plan is undone at once; otherwise a round
  // re-checks the culprits first.
  const double healthy = inc.healthy_s;
  const Mitigator* m = decision_.Current(inc);
  const std::optional<double> ratio = m != nullptr ? m->FaultFreeRatio() : std::nullopt;
  const double fault_free = healthy * ratio.value_or(1.0);
  const bool visible = healthy > 0 && inc.plan_level_s >= fault_free * (1 + (config_.suspicious_ratio - 1) / 2);
  const std::optional<double> quick = tracking_.CurrentIterationS(view_, kQuickIterations);
  if (!visible || !quick || *quick >= (inc.plan_level_s + fault_free) / 2) {
    inc.faster_since_ns = 0;
    return UnderPlan::kNothing;
  }
  if (inc.faster_since_ns == 0) {
    inc.faster_since_ns = now_ns;
    dirty_ = true;
  }
  if (now_ns - inc.faster_since_ns < Seconds(static_cast<double>(kQuickIterations) * inc.plan_level_s)) {
    return UnderPlan::kNothing;
  }
  const bool undo = ratio.has_value() && inc.plan_level_s >= fault_free * config_.suspicious_ratio;
  log_->info("event=faster_under_plan incident={} level_s={:.4f} plan_level_s={:.4f} fault_free_s={:.4f} "
             "healthy_s={:.4f} action={}",
             daemon::LogValue(inc.id), *quick, inc.plan_level_s, fault_free, healthy, undo ? "undo" : "recheck");
  if (undo) return UnderPlan::kUndo;  // kept for the resolution, and for a retry if it is not published
  // Not the job's level any more: measured afresh once the round is done (the round's end
  // settles it again; the job is not tracked in between).
  inc.plan_level_s = 0;
  inc.plan_level_after_ns = now_ns;
  return UnderPlan::kRecheck;
}


Status Controller::StartMitigation(std::int64_t now_ns, bool even_split) {
  Incident& inc = *state_.incident;
  if (state_.node_hosts.empty() && !view_.hosts().empty()) {  // plans name nodes: fix their numbering
    state_.node_hosts = view_.hosts();
    for (std::int32_t i = 0; i < config_.mitigation.spare_nodes; ++i) state_.node_hosts.push_back("spare" + std::to_string(i));
    view_.SetNodes(state_.node_hosts, state_.placement);
  }
  const Result<JobLayout> layout = InferLayout(view_, config_.mitigation.job_shape, state_.excluded_nodes);
  const std::optional<DecisionRecord> r = decision_.Start(inc, layout, view_, CurrentIterationS(), now_ns, even_split);
  if (!r) return Status::Ok();
  return Record("decision", r->summary, r->fields, r->severity);
}

Status Controller::FeedMitigation(std::int64_t now_ns) {
  Incident& inc = *state_.incident;
  const std::optional<Decision> d = decision_.Feed(inc, view_, CurrentIterationS(), now_ns);
  if (!d) return Status::Ok();
  if (Status s = PublishDecision(*d, now_ns); !s.ok()) {
    decision_.Unpublished(inc, s);  // the planner takes this step again on the next sample
    return s;
  }
  return Status::Ok();
}

// The plan goes out first (written, then in act mode sent to every agent), the entry last.
Status Controller::PublishDecision(const Decision& d, std::int64_t now_ns) {
  Incident& inc = *state_.incident;
  const DecisionPublication p = decision_.Publish(d, inc, view_, state_.plan_version + 1, now_ns);
  // The entry must be recordable before anything goes out: a plan sent for a decision that cannot
  // be recorded would be sent again, as a new version, at every later sample.
  if (Result<json> probe = IncidentEntry("decision", p.record.summary, p.record.fields); !probe.ok()) {
    return probe.status();
  }
  if (p.plan.is_object()) {
    state_.plan_version = p.plan["plan_version"].get<std::int32_t>();
    if (Status s = WritePlan(p.plan, d.strategy); !s.ok()) return s;
    if (config_.mitigation.mode == "act") {
      if (p.plan.contains("placement")) {  // in force once every rank applied it
        state_.pending_version = state_.plan_version;
        state_.pending_placement = p.plan["placement"].get<std::vector<std::int32_t>>();
        state_.pending_excluded = p.plan.value("exclude_nodes", std::vector<std::int32_t>{});
      }
      if (d.strategy == "S1") {
        inc.plan_level_after_ns = 0;
        inc.plan_level_s = 0;
      } else {
        SettlePlanLevel(inc, now_ns, false);
      }
      if (Status s = Send(p.commands); !s.ok()) return s;
    }
  }
  dirty_ = true;
  return Record("decision", p.record.summary, p.record.fields, p.record.severity);
}

Status Controller::OpenIncident(std::int64_t now_ns, const std::vector<std::int64_t>& slow) {
  Incident inc;
  inc.id = "inc-" + std::to_string(now_ns / 1'000'000) + "-" + std::to_string(++state_.incidents);
  inc.opened_ns = now_ns;
  inc.ranks = slow;
  std::vector<double> baselines, ratios;
  std::int64_t onset = now_ns;
  for (std::int64_t r : slow) {
    const SlowRank& s = state_.slow.at(r);
    if (s.baseline_s > 0) baselines.push_back(s.baseline_s);
    ratios.push_back(s.ratio);
    onset = std::min(onset, s.onset_ns);
  }
  std::vector<double> scratch;
  inc.healthy_s = !baselines.empty() ? analyzer::Median(baselines, scratch) : state_.healthy_s.value_or(0);
  const double ratio = analyzer::Median(ratios, scratch);
  state_.incident = inc;
  dirty_ = true;
  return Record("detection",
                std::to_string(slow.size()) + " rank(s) slow: iteration time " + Fixed(ratio) + "x healthy (" +
                    Fixed(inc.healthy_s * 1e3, 1) + " ms)",
                {{"at_ns", now_ns}, {"ranks", slow}, {"detail", {{"ratio", ratio}, {"healthy_s", inc.healthy_s},
                                                                 {"onset_ns", onset}}}},
                "warning");
}

Status Controller::SetMode(const std::string& mode, std::int64_t now_ns) {
  dirty_ = true;  // the mode is part of the state written
  return Send(profiling_.SetMode(mode, view_, now_ns));
}

Result<std::optional<std::string>> Controller::Watch(std::int64_t now_ns) {
  // Wanted while re-balanced micro-batches hold for slow GPUs in act mode, between rounds.
  std::vector<std::int64_t> gpus;
  const Mitigator* m = state_.incident ? decision_.Current(*state_.incident) : nullptr;
  if (config_.mitigation.recovery_watch && m != nullptr && !m->stopped() && m->rebalance_in_effect() &&
      state_.incident->localised && config_.mitigation.mode == "act") {
    for (const json& g : state_.incident->findings.value("gpus", json::array())) {
      if (g.is_object() && g.contains("rank") && g["rank"].is_number_integer()) gpus.push_back(g["rank"].get<std::int64_t>());
    }
  }
  // A switch back to track that did not go out stays owed (the watch keeps those ranks) and is
  // sent again with the next Disarm; an arming that did not go out is sent again as it is,
  // without switching its ranks back first.
  const bool may_send = watch_retry_.Due(now_ns);
  auto disarm = [&]() -> Status {
    const std::vector<OutgoingCommand> commands = watch_.Disarm(view_, now_ns);
    if (commands.empty() || !may_send) return Status::Ok();
    Result<bool> sent = SendWatch(commands, "disarm", now_ns);
    if (!sent.ok()) return sent.status();
    if (sent.value()) watch_.Delivered();
    return Status::Ok();
  };
  if (gpus.empty()) {
    watch_key_.clear();
    arming_key_.clear();
    if (Status s = disarm(); !s.ok()) return s;
    return std::optional<std::string>();
  }
  Incident& inc = *state_.incident;
  const std::string key = inc.id + "/" + std::to_string(state_.plan_version) + "/" + std::to_string(inc.attempts);
  if (key != watch_key_ && may_send) {  // a new plan, or a round since: (re-)arm
    if (key != arming_key_) {
      if (Status s = disarm(); !s.ok()) return s;
    }
    arming_key_ = key;
    // The shape tells the culprit's replica, whose groups keep their waits under the plan.
    std::optional<analyzer::JobShape> shape;
    if (const Result<JobLayout> l = InferLayout(view_, config_.mitigation.job_shape, state_.excluded_nodes); l.ok()) {
      shape = l.value().placement.shape;
    }
    Result<bool> sent = SendWatch(watch_.Arm(view_, gpus, now_ns, inc.id, shape), "arm", now_ns);
    if (!sent.ok()) return sent.status();
    if (sent.value()) {
      watch_key_ = key;
      arming_key_.clear();
      json targets = json::array();
      for (const WatchTarget& t : watch_.targets()) {
        targets.push_back({{"rank", t.culprit}, {"comm", protocol::CommIdHex(t.comm)}, {"members", t.members}});
        if (const auto level = watch_.LevelOf(t.culprit)) targets.back()["level"] = *level;  // kept from before a round
      }
      log_->info("event=recovery_watch incident={} action={} targets={}", daemon::LogValue(inc.id),
                 watch_.armed() ? "armed" : "none", daemon::LogValue(targets.dump()));
    }
  }
  if (!watch_.armed()) return std::optional<std::string>();
  const RecoveryWatch::Verdict v = watch_.Observe(profiling_.profiles());
  // "rank R's peers wait Nx its time per call[, Lx under the fault]; ..." for the log and the resolution.
  auto readings = [&v](bool with_level) {
    std::string out;
    for (const RecoveryWatch::Reading& r : v.readings) {
      out += (out.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r.culprit) + "'s peers wait " +
             Fixed(r.imbalance, 2) + "x its time per call" + (with_level ? ", " + Fixed(r.level, 2) + "x under the fault" : "");
    }
    return out;
  };
  if (const std::string now = readings(true); now != watch_logged_ && !now.empty()) {
    log_->debug("event=recovery_watch incident={} action=reading detail={}", daemon::LogValue(inc.id),
                daemon::LogQuoted(now));
    watch_logged_ = now;
  }
  if (v.seen_ns > inc.watch_seen_ns) {
    if (inc.watch_seen_ns <= inc.last_round_ns) {  // the first sight since the last round: say so once
      log_->info("event=recovery_watch incident={} action=sees_fault detail={}", daemon::LogValue(inc.id),
                 daemon::LogQuoted(readings(false) + ": the re-check timer runs from the watch's windows"));
    }
    inc.watch_seen_ns = std::min(v.seen_ns, now_ns);  // an agent clock ahead of ours defers nothing
  }
  if (!v.recovered) return std::optional<std::string>();
  const std::string detail = readings(true);
  log_->info("event=recovery_watch incident={} action=undo detail={}", daemon::LogValue(inc.id), daemon::LogQuoted(detail));
  return std::optional<std::string>("the slow GPU recovered under the re-balanced micro-batches: its group's members "
                                    "arrive together again (" + detail + ")");
}

Result<bool> Controller::SendWatch(const std::vector<OutgoingCommand>& commands, const char* action,
                                   std::int64_t now_ns) {
  const Status s = Send(commands);
  if (s.ok()) {
    if (!watch_unsent_.empty()) log_->info("event=recovery_watch_sent action={}", action);
    watch_unsent_.clear();
    watch_retry_ = {};
    return true;
  }
  if (s.code() == Status::Code::kUnavailable || s.code() == Status::Code::kCorrupt) return s;
  watch_retry_.Refused(now_ns);
  if (s.message() != watch_unsent_) {  // only a change is news
    watch_unsent_ = s.message();
    log_->warn("event=recovery_watch_unsent action={} retry_ms={} error={}", action, watch_retry_.backoff_ms,
               daemon::LogQuoted(s.message()));
  }
  return false;
}

Status Controller::StartProfiling(std::int64_t now_ns) {
  watch_.Forget();  // the round switches every shim's mode; the watch re-arms after it
  watch_key_.clear();
  arming_key_.clear();
  state_.profile_from_ns = now_ns;
  state_.suspicion = json::object();
  Enter(Phase::kProfiling, now_ns);
  return SetMode("profile", now_ns);
}

Status Controller::FinishProfiling(std::int64_t now_ns) {
  if (Status s = SetMode("track", now_ns); !s.ok()) return s;
  state_.suspicion = profiling_.Analyze(view_, state_.profile_from_ns);
  return StartValidation(now_ns, /*release_first=*/false);
}

Status Controller::StartValidation(std::int64_t now_ns, bool release_first) {
  Incident& inc = *state_.incident;
  if (Status s = validation_.Start(view_, state_.suspicion, inc.id + "-v" + std::to_string(inc.attempts + 1), release_first);
      !s.ok()) {
    return s;
  }
  ++inc.attempts;
  if (state_.phase != Phase::kValidating) Enter(Phase::kValidating, now_ns);
  dirty_ = true;
  return Status::Ok();
}

Status Controller::FinishValidation(std::int64_t now_ns) {
  Incident& inc = *state_.incident;
  const Incident before_round = inc;
  RoundVerdict verdict = validation_.Finish(view_);
  json detail = std::move(verdict.detail);
  detail["suspicion"] = state_.suspicion;
  detail["attempt"] = inc.attempts;
  if (!inc.request.empty()) detail["request"] = inc.request;
  const std::vector<std::int64_t>& ranks = verdict.ranks;
  const std::string& failure = verdict.failure;
  std::string summary = verdict.summary;
  const std::string cause = verdict.cause;
  const bool was_localised = inc.localised;
  const std::string was_cause = inc.cause;
  const json was_findings = inc.findings;
  const bool recheck = inc.recheck;
  inc.recheck = false;
  inc.localised = verdict.localised;
  if (!inc.localised) {
    summary = !failure.empty() ? "validation did not complete: " + failure
                                      : "validation found no slow GPU, link or NIC (attempt " +
                                            std::to_string(inc.attempts) + " of " + std::to_string(config_.max_attempts) + ")";
    inc.next_attempt_ns = now_ns + Seconds(config_.retry_after_s);
  } else {
    inc.next_attempt_ns = 0;
  }
  inc.cause = cause;
  inc.findings = detail;
  inc.last_round_ns = now_ns;
  inc.best_since_round_s = 0;
  if (inc.plan_level_after_ns != 0 || inc.plan_level_s > 0) SettlePlanLevel(inc, now_ns, true);
  if (log_->should_log(spdlog::level::debug)) log_->debug("event=localisation detail={}", detail.dump());
  Enter(Phase::kTracking, now_ns);
  json fields = {{"at_ns", now_ns}, {"ranks", ranks}, {"cause", cause}, {"detail", detail}};
  // A large sweep has no list (profiling_stage.h, "Size"): every shared communicator was tested.
  if (detail.contains("suspicion") && state_.suspicion.contains("suspicious")) fields["comms"] = state_.suspicion["suspicious"];
  Mitigator* m = decision_.Current(inc);
  const bool mitigating = m != nullptr && !m->stopped();
  if (mitigating && !inc.localised && !failure.empty()) {
    // An incomplete round proves nothing: the mitigation and what it answers stay.
    inc.localised = was_localised;
    inc.cause = was_cause;
    inc.findings = was_findings;
    summary = "re-check did not complete: " + failure + "; " + m->current() + " stays in force";
  }
  if (recheck && inc.localised) inc.recheck_interval_s = std::min(2 * RecheckIntervalS(inc), 3600.0);
  if (Status s = Record("localisation", (recheck ? "re-check: " : "") + summary, fields,
                        inc.localised && !recheck ? "critical" : mitigating ? "info" : "warning");
      !s.ok()) {
    return RoundUnpublished(before_round, now_ns, s);
  }
  inc.deferred_rounds = 0;
  if (mitigating) {
    // A mitigation is running: a complete round that finds nothing means the fault is gone;
    // one that blames others means the fault moved: the old mitigation stops (S2 undone), a new
    // one starts from the new findings.
    if (!inc.localised) {
      if (Status s = Resolve(now_ns, "the culprits validate healthy again"); !s.ok()) {
        return RoundUnpublished(before_round, now_ns, s);
      }
      return Status::Ok();
    }
    if (CulpritsChanged(was_findings, inc.findings, m->current())) {
      // The iterations measured lately ran under the old plan's counts, if it re-balanced.
      const bool even_split = !m->rebalance_in_effect();
      Result<Decision> d = decision_.End(inc, now_ns);
      if (d.ok()) {
        d.value().summary = "the culprits changed: " + d.value().summary;
        if (Status s = PublishDecision(d.value(), now_ns); !s.ok()) return RoundUnpublished(before_round, now_ns, s);
      }
      decision_.Forget();
      inc.mitigation = json();
      inc.recheck_interval_s = 0;
      if (Status s = StartMitigation(now_ns, even_split); !s.ok()) return RoundUnpublished(before_round, now_ns, s);
      inc.last_feed_ns = now_ns;  // the new culprits' cost counts from now, not from the detection
      return Status::Ok();
    }
    return Status::Ok();
  }
  if (inc.localised && config_.mitigation.mode != "off") {
    if (Status s = StartMitigation(now_ns); !s.ok()) return RoundUnpublished(before_round, now_ns, s);
  }
  return Status::Ok();
}

Status Controller::RoundUnpublished(Incident before, std::int64_t now_ns, const Status& why) {
  // The redo is this round again, not another attempt; it waits retry-after-s, doubling per
  // round in a row that could not be written, so a Redis that keeps refusing writes costs the
  // job a pause now and then, not one per tick.
  before.attempts = std::max(0, before.attempts - 1);
  before.deferred_rounds = std::min(before.deferred_rounds + 1, 16);
  const double wait_s = std::min(std::max(config_.retry_after_s, 1.0) * std::ldexp(1.0, before.deferred_rounds - 1), 3600.0);
  before.next_attempt_ns = now_ns + Seconds(wait_s);
  if (before.localised && before.mitigation.is_object()) before.revalidate = true;  // re-check its culprits
  log_->warn("event=round_deferred incident={} redo_in_s={} error={}", daemon::LogValue(before.id), Fixed(wait_s, 0),
             daemon::LogQuoted(why.message()));
  state_.incident = std::move(before);
  decision_.Forget();  // rebuilt from the state before the round
  dirty_ = true;
  return why;
}

double Controller::RecheckIntervalS(const Incident& inc) const {
  return inc.recheck_interval_s > 0 ? inc.recheck_interval_s : config_.mitigation.recheck_s;
}

std::int64_t Controller::StaleBefore(std::int64_t now_ns) {
  if (state_.resolved_ns <= 0 || !state_.healthy_s || *state_.healthy_s <= 0) return 0;
  const double healthy = *state_.healthy_s;
  const std::int64_t settle = std::max(Seconds(1.0), Seconds(kSettleIterations * healthy));
  const std::optional<double> cur = tracking_.CurrentIterationS(view_, kJudgeIterations);
  const bool held = now_ns - state_.resolved_ns < settle || (cur && *cur <= healthy * config_.suspicious_ratio);
  if (stale_held_ != held) {
    stale_held_ = held;
    log_->info("event=stale_alarms action={} resolved_ns={} current_s={:.4f} healthy_s={:.4f}",
               held ? "held" : "released", state_.resolved_ns, cur.value_or(0), healthy);
  }
  return held ? state_.resolved_ns : 0;
}

Status Controller::Resolve(std::int64_t now_ns, const std::string& why) {
  if (Mitigator* m = decision_.Current(*state_.incident); m != nullptr && !m->stopped()) {
    Result<Decision> d = decision_.End(*state_.incident, now_ns);
    if (d.ok()) {
      if (Status s = PublishDecision(d.value(), now_ns); !s.ok()) {
        decision_.Unpublished(*state_.incident, s);  // the stop (and S2's undo) is decided again on the next try
        return s;
      }
    } else {
      log_->warn("event=mitigation_end_failed error={}", daemon::LogQuoted(d.status().message()));
    }
  }
  const Incident inc = *state_.incident;
  const std::optional<double> cur = CurrentIterationS();
  Status s = Record("resolution", why + " after " + Fixed(static_cast<double>(now_ns - inc.opened_ns) / kNsPerS, 1) + " s",
                    {{"at_ns", now_ns},
                     {"ranks", inc.ranks},
                     {"cause", inc.cause},
                     {"detail", {{"current_s", cur.value_or(0)}, {"healthy_s", inc.healthy_s},
                                 {"localised", inc.localised}, {"attempts", inc.attempts}}}},
                    "info");
  if (!s.ok()) return s;
  state_.incident.reset();
  state_.resolved_ns = now_ns;
  stale_held_.reset();
  decision_.Forget();
  state_.suspicion = json::object();
  validation_.Abandon();
  Enter(Phase::kTracking, now_ns);
  return Status::Ok();
}

}  // namespace falcon::controller
