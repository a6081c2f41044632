// Controller, its state machine and loop: see controller.h.
#include "daemon/controller/controller.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "analyzer/localize.h"
#include "analyzer/robust.h"
#include "daemon/controller/profile_analysis.h"
#include "daemon/controller/validation_steps.h"

namespace falcon::controller {
namespace {

using nlohmann::json;

constexpr std::int64_t kNsPerS = 1'000'000'000;

std::int64_t WallNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * kNsPerS + ts.tv_nsec;
}

std::int64_t Seconds(double s) { return static_cast<std::int64_t>(s * static_cast<double>(kNsPerS)); }

std::string Fixed(double v, int digits = 2) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

json EvidenceJson(const analyzer::Evidence& e) {
  return {{"measured", e.measured}, {"baseline", e.baseline}, {"ratio", e.ratio}, {"sigma", e.sigma},
          {"baseline_count", e.baseline_count}};
}

}  // namespace

Controller::Controller(ControllerConfig config, std::shared_ptr<spdlog::logger> log)
    : config_(std::move(config)), log_(std::move(log)), started_ns_(WallNs()) {}

int Controller::Run(const std::atomic<bool>& stop) {
  log_->info("event=start job={} host={} version={} redis={}", config_.job, config_.host, kControllerVersion,
             config_.redis.Describe());
  while (!stop.load(std::memory_order_relaxed)) {
    const std::int64_t now = WallNs();
    if (!EnsureConnected(now)) {
      timespec nap{0, config_.tick_ms * 1'000'000L};  // bounded wait before the next attempt
      nanosleep(&nap, nullptr);
      continue;
    }
    Status s = Status::Ok();
    if (now >= next_view_ns_) {
      s = RefreshView();
      next_view_ns_ = now + std::int64_t{config_.view_ms} * 1'000'000;
    }
    if (s.ok()) s = ReadStreams(run_ ? std::min(config_.tick_ms, 50) : config_.tick_ms);
    if (s.ok()) s = Advance(WallNs());
    if (s.ok() && (dirty_ || WallNs() >= next_save_ns_)) s = SaveState(WallNs());
    if (!s.ok()) {
      log_->warn("event=step_failed error=\"{}\"", s.message());
      if (s.code() == Status::Code::kUnavailable || s.code() == Status::Code::kCorrupt) conn_->Close();
    }
  }
  if (conn_ && conn_->connected()) {
    if (run_ && !run_->done()) {  // never leave a job paused behind us
      ValidationRun release("ctl-" + std::to_string(started_ns_ / 1'000'000) + "-stop", {}, config_.validation, true);
      (void)Send(release.Next(view_, WallNs()));
    }
    if (mode_ != "track") (void)SetMode("track", WallNs());  // leave the shims cheap
    (void)SaveState(WallNs());
  }
  log_->info("event=stop");
  return 0;
}

std::vector<std::int64_t> Controller::LiveSlow() const {
  std::vector<std::int64_t> out;
  for (const auto& [rank, s] : state_.slow) {
    if (view_.ranks().count(rank)) out.push_back(rank);
  }
  return out;
}

std::optional<double> Controller::CurrentIterationS() const {
  std::optional<double> worst;
  std::vector<double> scratch;
  for (const auto& [rank, q] : recent_) {
    if (q.empty() || !view_.ranks().count(rank)) continue;
    const std::vector<double> v(q.begin(), q.end());
    const double m = analyzer::Median(v, scratch);
    if (!worst || m > *worst) worst = m;
  }
  return worst;
}

void Controller::Enter(Phase p, std::int64_t now_ns) {
  log_->info("event=phase from={} to={} incident={}", PhaseName(state_.phase), PhaseName(p),
             state_.incident ? state_.incident->id : "-");
  state_.phase = p;
  state_.since_ns = now_ns;
  dirty_ = true;
}

Status Controller::Advance(std::int64_t now_ns) {
  if (!requests_.empty() && state_.phase != Phase::kTracking) {  // the round under way answers it
    state_.incident->request = requests_.back()["id"].get<std::string>();
    requests_.clear();
  }
  switch (state_.phase) {
    case Phase::kTracking: return Track(now_ns);
    case Phase::kProfiling:
      if (LiveSlow().empty() && state_.incident->request.empty()) {
        if (Status s = SetMode("track", now_ns); !s.ok()) return s;
        return Resolve(now_ns, "recovered before validation");
      }
      if (ProfilesReady() || now_ns - state_.since_ns > Seconds(config_.profile_wait_s)) return FinishProfiling(now_ns);
      return Status::Ok();
    case Phase::kValidating:
      if (!run_) return StartValidation(now_ns, /*release_first=*/true);
      if (Status s = Send(run_->Next(view_, now_ns)); !s.ok()) return s;
      return run_->done() ? FinishValidation(now_ns) : Status::Ok();
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
  if (!requests_.empty()) return ServeRequests(now_ns);
  const std::vector<std::int64_t> slow = LiveSlow();
  if (!state_.incident) {
    if (slow.empty()) {
      if (const auto cur = CurrentIterationS()) state_.healthy_s = *cur;
      return Status::Ok();
    }
    const double fraction = static_cast<double>(slow.size()) / static_cast<double>(view_.ranks().size());
    if (fraction < config_.min_slow_fraction) return Status::Ok();
    if (Status s = OpenIncident(now_ns, slow); !s.ok()) return s;
    return StartProfiling(now_ns);
  }
  if (slow.empty() && !state_.incident->request.empty() && state_.incident->attempts > 0) {
    return Resolve(now_ns, "manual validation done");
  }
  if (slow.empty()) {
    const bool gone = std::none_of(state_.incident->ranks.begin(), state_.incident->ranks.end(),
                                   [&](std::int64_t r) { return view_.ranks().count(r) > 0; });
    return Resolve(now_ns, gone ? "the slow ranks are gone (exited, or their agents stopped reporting)"
                                : "iteration time is back to healthy");
  }
  Incident& inc = *state_.incident;
  if (!inc.localised && inc.attempts < config_.max_attempts && now_ns >= inc.next_attempt_ns) {
    return StartProfiling(now_ns);
  }
  return Status::Ok();
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
  mode_commands_.clear();  // acks still missing from an earlier switch no longer matter
  std::vector<OutgoingCommand> out;
  for (const std::string& host : view_.hosts()) {
    protocol::Command c;
    c.type = "set_mode";
    c.id = "ctl-" + std::to_string(started_ns_ / 1'000'000) + "-m" + std::to_string(++commands_);
    c.issued_ns = now_ns;
    c.deadline_ns = now_ns + Seconds(config_.validation.ack_timeout_s);
    c.mode = mode;
    mode_commands_.insert(c.id);
    out.push_back({host, std::move(c)});
  }
  mode_ = mode;
  dirty_ = true;
  return Send(out);
}

Status Controller::StartProfiling(std::int64_t now_ns) {
  state_.profile_from_ns = now_ns;
  state_.suspicion = json::object();
  Enter(Phase::kProfiling, now_ns);
  return SetMode("profile", now_ns);
}

bool Controller::ProfilesReady() const {
  if (view_.ranks().empty() || !mode_commands_.empty()) return false;
  for (const auto& [rank, info] : view_.ranks()) {
    auto p = profiles_.find(rank);
    if (p == profiles_.end() || p->second["mode"] != "profile" ||
        p->second["since_ns"].get<std::int64_t>() < state_.profile_from_ns) {
      return false;
    }
  }
  return true;
}

Status Controller::FinishProfiling(std::int64_t now_ns) {
  if (Status s = SetMode("track", now_ns); !s.ok()) return s;
  std::map<std::int64_t, json> current;
  for (const auto& [rank, p] : profiles_) {
    if (view_.ranks().count(rank) && p["since_ns"].get<std::int64_t>() >= state_.profile_from_ns) current[rank] = p;
  }
  analyzer::SuspicionOptions so;
  so.suspicious_ratio = config_.suspicious_ratio;
  Result<ProfileVerdict> v = AnalyzeProfiles(view_, current, so);
  json suspicion = {{"profiles", current.size()}, {"suspicious", json::array()}, {"peers", json::array()},
                    {"compute_suspects", json::array()}};
  if (v.ok()) {
    for (std::uint64_t id : v.value().suspicious) suspicion["suspicious"].push_back(protocol::CommIdHex(id));
    for (std::uint64_t id : v.value().peers) suspicion["peers"].push_back(protocol::CommIdHex(id));
    for (const ComputeSuspectFinding& s : v.value().compute_suspects) {
      suspicion["compute_suspects"].push_back({{"rank", s.rank}, {"comm", protocol::CommIdHex(s.comm)},
                                               {"wait_gap", s.wait_gap}, {"confidence", s.confidence}});
    }
    suspicion["comms"] = v.value().evidence;
  } else {
    log_->warn("event=profile_analysis_failed error=\"{}\"", v.status().message());
    suspicion["error"] = v.status().message();
  }
  // Nothing suspicious (or no timings): every class is tested, each against its own members.
  if (suspicion["suspicious"].empty()) {
    suspicion["sweep"] = true;
    for (const auto& [id, c] : view_.comms()) {
      if (c.members.size() >= 2) suspicion["suspicious"].push_back(protocol::CommIdHex(id));
    }
  }
  state_.suspicion = suspicion;
  log_->info("event=profiled profiles={} suspicious={} peers={} compute_suspects={}", current.size(),
             suspicion["suspicious"].size(), suspicion["peers"].size(), suspicion["compute_suspects"].size());
  return StartValidation(now_ns, /*release_first=*/false);
}

Status Controller::StartValidation(std::int64_t now_ns, bool release_first) {
  std::vector<std::uint64_t> judged, peers;
  for (const auto& [key, out] : {std::pair{"suspicious", &judged}, std::pair{"peers", &peers}}) {
    for (const json& id : state_.suspicion.value(key, json::array())) {
      if (!id.is_string()) continue;
      if (const auto v = protocol::ParseCommIdHex(id.get<std::string>())) out->push_back(*v);
    }
  }
  StepOptions so;
  so.gemm_batch = static_cast<std::size_t>(config_.gemm_batch);
  so.tree = config_.tree;
  Result<std::vector<ValidationStep>> steps = PlanValidationSteps(view_, judged, peers, so);
  if (!steps.ok()) return steps.status();
  Incident& inc = *state_.incident;
  ++inc.attempts;
  run_ = std::make_unique<ValidationRun>(inc.id + "-v" + std::to_string(inc.attempts), std::move(steps.value()),
                                         config_.validation, release_first);
  if (state_.phase != Phase::kValidating) Enter(Phase::kValidating, now_ns);
  dirty_ = true;
  return Status::Ok();
}

Status Controller::FinishValidation(std::int64_t now_ns) {
  std::unique_ptr<ValidationRun> run = std::move(run_);
  Incident& inc = *state_.incident;
  analyzer::LocalizationOptions lo;
  lo.gemm_ratio = config_.gemm_ratio;
  lo.link_ratio = config_.link_ratio;
  Result<analyzer::Localization> loc = analyzer::Localize(run->Input(), lo);
  json detail = {{"validation", run->Summary()}, {"suspicion", state_.suspicion}, {"attempt", inc.attempts}};
  if (!inc.request.empty()) detail["request"] = inc.request;
  std::vector<std::int64_t> ranks;
  std::string summary;
  std::string cause = "unknown";
  auto host = [&](std::int32_t node) {
    return node >= 0 && static_cast<std::size_t>(node) < view_.hosts().size() ? view_.hosts()[static_cast<std::size_t>(node)] : std::string("?");
  };
  if (loc.ok()) {
    const analyzer::Localization& l = loc.value();
    json gpus = json::array(), links = json::array(), nics = json::array();
    for (const analyzer::SlowGpu& g : l.gpus) {
      gpus.push_back({{"rank", g.rank}, {"host", host(g.node)}, {"evidence", EvidenceJson(g.evidence)}});
      ranks.push_back(g.rank);
      summary += (summary.empty() ? "" : "; ") + std::string("slow GPU: rank ") + std::to_string(g.rank) + " on " +
                 host(g.node) + " (GEMM " + Fixed(g.evidence.ratio) + "x median)";
    }
    for (const analyzer::SlowNic& n : l.nics) {
      nics.push_back({{"host", host(n.node)}, {"slow_peer_nodes", n.slow_peer_nodes},
                      {"tested_peer_nodes", n.tested_peer_nodes}, {"evidence", EvidenceJson(n.evidence)}});
      summary += (summary.empty() ? "" : "; ") + std::string("slow NIC: ") + host(n.node) + " (" +
                 Fixed(n.evidence.ratio) + "x median transfer time)";
    }
    for (const analyzer::SlowLink& k : l.links) {
      links.push_back({{"ranks", {k.sender, k.receiver}}, {"hosts", {host(k.sender_node), host(k.receiver_node)}},
                       {"evidence", EvidenceJson(k.evidence)}});
      ranks.push_back(k.sender);
      ranks.push_back(k.receiver);
      summary += (summary.empty() ? "" : "; ") + std::string("slow link: ") + host(k.sender_node) + " <-> " +
                 host(k.receiver_node) + " (ranks " + std::to_string(k.sender) + "-" + std::to_string(k.receiver) +
                 ", " + Fixed(k.evidence.ratio) + "x median)";
    }
    cause = !l.gpus.empty() ? "compute" : !l.nics.empty() ? "nic" : !l.links.empty() ? "link" : "unknown";
    detail["gpus"] = gpus;
    detail["links"] = links;
    detail["nics"] = nics;
    detail["unassessed"] = {{"gemms", l.gemms_unassessed}, {"transfers", l.transfers_unassessed}};
  } else {
    detail["error"] = loc.status().message();
  }
  inc.localised = loc.ok() && !loc.value().nothing_found();
  if (!inc.localised) {
    summary = !run->failure().empty() ? "validation did not complete: " + run->failure()
                                      : "validation found no slow GPU, link or NIC (attempt " +
                                            std::to_string(inc.attempts) + " of " + std::to_string(config_.max_attempts) + ")";
    inc.next_attempt_ns = now_ns + Seconds(config_.retry_after_s);
  }
  inc.cause = cause;
  inc.findings = detail;
  inc.last_round_ns = now_ns;
  log_->debug("event=localisation detail={}", detail.dump());
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  Enter(Phase::kTracking, now_ns);
  json fields = {{"at_ns", now_ns}, {"ranks", ranks}, {"cause", cause}, {"detail", detail}};
  if (detail.contains("suspicion")) fields["comms"] = state_.suspicion.value("suspicious", json::array());
  return Record("localisation", summary, fields, inc.localised ? "critical" : "warning");
}

Status Controller::Resolve(std::int64_t now_ns, const std::string& why) {
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
  state_.suspicion = json::object();
  run_.reset();
  Enter(Phase::kTracking, now_ns);
  return Status::Ok();
}

}  // namespace falcon::controller
