// DecisionStage. See decision_stage.h for the contract.
#include "daemon/controller/decision_stage.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "daemon/common/log_escape.h"
#include "daemon/protocol/messages.h"

namespace falcon::controller {
namespace {

using nlohmann::json;

constexpr std::int64_t kNsPerS = 1'000'000'000;

std::int64_t Seconds(double s) { return static_cast<std::int64_t>(s * static_cast<double>(kNsPerS)); }

// "S2 after 10 s of slowdown, S3 after 2.1 s of slowdown (measured), S4 unavailable".
std::string CandidatesLine(const json& candidates) {
  std::string out;
  for (const auto& [code, c] : candidates.items()) {
    const bool measured = c.value("overhead_source", "") == "measured";
    out += (out.empty() ? "" : ", ") + code +
           (c.contains("unavailable") ? std::string(" unavailable")
                                      : " after " + fmt::format("{:.{}f}", c.value("overhead_s", 0.0), measured ? 1 : 0) +
                                            " s of slowdown" + (measured ? " (measured)" : ""));
  }
  return out;
}

}  // namespace

DecisionStage::DecisionStage(DecisionStageOptions options, std::shared_ptr<spdlog::logger> log)
    : options_(std::move(options)), log_(std::move(log)) {}

Mitigator* DecisionStage::Current(Incident& inc) {
  if (inc.mitigation.is_null()) {
    mitigator_.reset();
    return nullptr;
  }
  if (!mitigator_) {  // a restarted controller, or a rollback: carry on from the persisted planner
    Result<Mitigator> m = Mitigator::FromJson(options_.settings, inc.mitigation);
    if (!m.ok()) {
      log_->warn("event=mitigation_state_dropped incident={} error={}", daemon::LogValue(inc.id),
                 daemon::LogQuoted(m.status().message()));
      inc.mitigation = json();
      changed_ = true;
      return nullptr;
    }
    mitigator_ = std::move(m.value());
  }
  return &*mitigator_;
}

std::optional<DecisionRecord> DecisionStage::Start(Incident& inc, const Result<JobLayout>& layout, const JobView& view,
                                                   std::optional<double> iteration_s, std::int64_t now_ns,
                                                   bool even_split) {
  const std::int64_t planning_from = options_.monotonic_ns();
  const JobTiming timing{inc.healthy_s, iteration_s.value_or(0), ProfiledLinkDelay(inc.findings, view), even_split};
  Result<Mitigator> m = Mitigator::Start(options_.settings, inc.cause, inc.findings, layout, Measured(view), timing);
  plan_s_ = static_cast<double>(options_.monotonic_ns() - planning_from) / kNsPerS;  // counts towards S2's from now on
  if (!m.ok()) {
    log_->warn("event=mitigation_not_started incident={} error={}", daemon::LogValue(inc.id),
               daemon::LogQuoted(m.status().message()));
    return std::nullopt;
  }
  mitigator_ = std::move(m.value());
  inc.mitigation = mitigator_->ToJson();
  inc.last_feed_ns = 0;
  changed_ = true;
  return DecisionRecord{
      "S1 ignore for now; candidates: " + CandidatesLine(mitigator_->candidates()),
      {{"at_ns", now_ns}, {"ranks", inc.ranks}, {"cause", inc.cause}, {"strategy", "S1"},
       {"detail",
        {{"mode", options_.settings.mode}, {"candidates", mitigator_->candidates()}, {"planning_s", plan_s_}}}},
      "info"};
}

std::optional<Decision> DecisionStage::Feed(Incident& inc, const JobView& view, std::optional<double> iteration_s,
                                            std::int64_t now_ns) {
  Mitigator* m = Current(inc);
  if (m == nullptr || m->stopped()) return std::nullopt;
  if (inc.last_feed_ns > 0 && now_ns - inc.last_feed_ns < Seconds(options_.settings.sample_s)) return std::nullopt;
  if (!iteration_s || *iteration_s <= 0 || inc.healthy_s <= 0) return std::nullopt;
  // The first sample covers the time since detection: the slowdown before the localisation
  // counts towards the switch budget too.
  TakeMeasuredOverheads(*m, inc, view);
  mitigation_before_ = inc.mitigation;
  last_feed_before_ns_ = inc.last_feed_ns;
  const std::int64_t from = inc.last_feed_ns > 0 ? inc.last_feed_ns : inc.opened_ns;
  const double dt = static_cast<double>(std::max<std::int64_t>(0, now_ns - from)) / kNsPerS;
  const auto iterations = std::max<std::int64_t>(1, std::llround(dt / *iteration_s));
  inc.last_feed_ns = now_ns;
  Result<std::optional<Decision>> d =
      m->Observe(static_cast<double>(now_ns - inc.opened_ns) / kNsPerS, *iteration_s, inc.healthy_s, iterations);
  inc.mitigation = m->ToJson();
  changed_ = true;
  if (!d.ok()) {
    log_->warn("event=mitigation_sample_refused incident={} error={}", daemon::LogValue(inc.id),
               daemon::LogQuoted(d.status().message()));
    return std::nullopt;
  }
  return std::move(d).value();
}

Result<Decision> DecisionStage::End(Incident& inc, std::int64_t now_ns) {
  Mitigator* m = Current(inc);
  if (m == nullptr) return Status::Internal("no mitigation to end");
  mitigation_before_ = inc.mitigation;
  last_feed_before_ns_ = inc.last_feed_ns;
  Result<Decision> d = m->End(static_cast<double>(now_ns - inc.opened_ns) / kNsPerS);
  inc.mitigation = m->ToJson();
  return d;
}

DecisionPublication DecisionStage::Publish(const Decision& d, const Incident& inc, const JobView& view,
                                           std::int32_t plan_version, std::int64_t now_ns) {
  const std::string& mode = options_.settings.mode;
  json detail = {{"mode", mode},
                 {"expected_gain", d.expected_gain},
                 {"planner",
                  {{"from", d.from},
                   {"accumulated_slowdown_s", d.planner.accumulated_slowdown_s},
                   {"overheads_paid_s", d.planner.overheads_paid_s},
                   {"overhead_s", d.planner.overhead_s},
                   {"reason", d.planner.reason}}}};
  DecisionPublication out;
  if (d.publish_plan) {
    json plan = d.plan;
    plan["plan_version"] = plan_version;
    detail["plan"] = plan;
    json& m = out.plan;
    m = plan;
    m["v"] = protocol::kSchemaVersion;
    m["type"] = protocol::kMitigationPlan.type;
    m["job"] = options_.job;
    m["at_ns"] = now_ns;
    m["incident"] = inc.id;
    m["mode"] = mode;
    m["expected_gain"] = std::clamp(d.expected_gain, -1.0, 1.0);
    m["reason"] = d.summary.substr(0, 1000);
    m["detail"] = {{"candidates", inc.mitigation.value("candidates", json::object())}, {"node_hosts", view.hosts()}};
    if (mode == "act") out.commands = PlanCommands(d.strategy, plan, view, now_ns);
  }
  out.record = {d.summary,
                {{"at_ns", now_ns}, {"ranks", inc.ranks}, {"cause", inc.cause}, {"strategy", d.strategy}, {"detail", detail}},
                d.strategy == "S1" ? "info" : "warning"};
  return out;
}

std::vector<OutgoingCommand> DecisionStage::PlanCommands(const std::string& strategy, const json& plan,
                                                         const JobView& view, std::int64_t now_ns) {
  std::vector<OutgoingCommand> out;
  for (const std::string& host : view.agents()) {
    protocol::Command c;
    c.type = protocol::kPlanCommand.type;
    c.id = options_.command_prefix + "-p" + std::to_string(++commands_);
    c.issued_ns = now_ns;
    c.plan_version = plan["plan_version"].get<std::int32_t>();
    c.strategy = strategy;
    protocol::CopyPlanFields(plan, &c);
    out.push_back({host, std::move(c)});
  }
  return out;
}

void DecisionStage::Unpublished(Incident& inc, const Status& why) {
  log_->warn("event=decision_deferred incident={} error={}", daemon::LogValue(inc.id), daemon::LogQuoted(why.message()));
  inc.mitigation = mitigation_before_;
  inc.last_feed_ns = last_feed_before_ns_;
  mitigator_.reset();  // rebuilt from the state before the decision
  changed_ = true;
}

bool DecisionStage::TakeChanged() { return std::exchange(changed_, false); }

MeasuredOverheads DecisionStage::Measured(const JobView& view) const {
  MeasuredOverheads m = MeasuredFrom(view);
  if (m.rebalance_s) *m.rebalance_s += plan_s_;
  return m;
}

// What the frameworks report about their plans' costs replaces the configured guesses for the
// strategies the planner may still choose (FALCON §5: overheads measured where possible).
void DecisionStage::TakeMeasuredOverheads(Mitigator& m, Incident& inc, const JobView& view) {
  Result<std::vector<std::string>> changes = m.UseMeasured(Measured(view));
  if (!changes.ok()) {
    log_->warn("event=overhead_refused incident={} error={}", daemon::LogValue(inc.id),
               daemon::LogQuoted(changes.status().message()));
    return;
  }
  if (changes.value().empty()) return;
  for (const std::string& c : changes.value()) {
    log_->info("event=overhead_measured incident={} change={}", daemon::LogValue(inc.id), daemon::LogQuoted(c));
  }
  inc.mitigation = m.ToJson();
  changed_ = true;
}

}  // namespace falcon::controller
