// Prometheus text rendering. See metrics.h for the contract.
#include "daemon/agent/metrics.h"

#include "daemon/common/prometheus_text.h"

namespace falcon::agent {
namespace {

using daemon::PromEscape;
using Writer = daemon::PromWriter;

std::string RankLabels(const RankMetrics& r) {
  return "rank=\"" + std::to_string(r.rank) + "\",pid=\"" + std::to_string(r.pid) + "\"";
}

}  // namespace

std::string RenderPrometheus(const AgentMetrics& m) {
  Writer w("falcon_agent_", "job=\"" + PromEscape(m.job) + "\",host=\"" + PromEscape(m.host) + "\"");
  w.Head("iteration_seconds", "gauge", "Last iteration time per rank, seconds.");
  for (const RankMetrics& r : m.ranks) w.Line("iteration_seconds", RankLabels(r), r.last_iteration_seconds);
  w.Head("iterations_total", "counter", "Iteration samples per rank.");
  for (const RankMetrics& r : m.ranks) w.Line("iterations_total", RankLabels(r), static_cast<double>(r.iterations));
  w.Head("period_calls", "gauge", "Calls per iteration of the current period lock (0: none).");
  for (const RankMetrics& r : m.ranks) w.Line("period_calls", RankLabels(r), static_cast<double>(r.period));
  w.Head("rank_slow", "gauge", "1 while the detector considers the rank slow.");
  for (const RankMetrics& r : m.ranks) w.Line("rank_slow", RankLabels(r), r.slow ? 1 : 0);
  w.Head("rank_stalled", "gauge",
         "1 while the rank is stalled: no ordered NCCL call for longer than its bound, with work "
         "outstanding in NCCL (docs/hangs.md).");
  for (const RankMetrics& r : m.ranks) w.Line("rank_stalled", RankLabels(r), r.stalled ? 1 : 0);
  w.Head("rank_quiet_seconds", "gauge", "Seconds since the rank's latest ordered NCCL call, at the last stall check.");
  for (const RankMetrics& r : m.ranks) w.Line("rank_quiet_seconds", RankLabels(r), r.quiet_seconds);
  w.Head("plan_version", "gauge",
         "Mitigation plan version per rank: delivered to its shared memory, applied or rejected by "
         "its framework (0: none).");
  for (const RankMetrics& r : m.ranks) {
    w.Line("plan_version", RankLabels(r) + ",state=\"delivered\"", r.plan_delivered);
    w.Line("plan_version", RankLabels(r) + ",state=\"applied\"", r.plan_applied);
    w.Line("plan_version", RankLabels(r) + ",state=\"rejected\"", r.plan_rejected);
  }
  w.Head("plan_cost_seconds", "gauge",
         "What applying a mitigation strategy costs per rank, seconds, as its framework reported it "
         "(falconReportCost); absent while not reported.");
  for (const RankMetrics& r : m.ranks) {
    static constexpr const char* kStrategies[] = {"S2", "S3", "S4", "pipeline"};
    for (int i = 0; i < 4; ++i) {
      if (r.cost_s[i] >= 0) {
        w.Line("plan_cost_seconds", RankLabels(r) + ",strategy=\"" + kStrategies[i] + "\"", r.cost_s[i]);
      }
    }
  }
  w.Head("alarms_total", "counter", "Detector alarms by kind.");
  w.Line("alarms_total", "kind=\"slow\"", static_cast<double>(m.alarms_slow));
  w.Line("alarms_total", "kind=\"recovered\"", static_cast<double>(m.alarms_recovered));
  w.Head("stalls_total", "counter", "Stall reports by kind: a rank stalled, a stalled rank progressing again.");
  w.Line("stalls_total", "kind=\"stalled\"", static_cast<double>(m.stalls));
  w.Line("stalls_total", "kind=\"progressing\"", static_cast<double>(m.stalls_ended));
  w.One("signature_messages_total", "counter",
        "call_signatures messages queued: ranks' new collectives, compared for mismatches.",
        static_cast<double>(m.signature_messages));
  w.One("records_read_total", "counter", "Call records read.", static_cast<double>(m.records_read));
  w.One("records_lost_total", "counter", "Call records overwritten before the agent read them.",
        static_cast<double>(m.records_lost));
  w.One("records_torn_total", "counter", "Half-written records skipped (writer died).",
        static_cast<double>(m.records_torn));
  w.Head("segments", "gauge", "Shim segments in the directory by state.");
  for (const char* s : {"live", "exited", "orphaned", "unreadable"}) {
    const auto it = m.segments.find(s);
    w.Line("segments", std::string("state=\"") + s + "\"",
           it == m.segments.end() ? 0 : static_cast<double>(it->second));
  }
  w.One("ranks", "gauge", "Ranks followed.", static_cast<double>(m.ranks.size()));
  w.One("redis_connected", "gauge", "1 while the report connection to Redis is up.",
        m.redis_connected ? 1 : 0);
  w.One("outbox_messages", "gauge", "Reports waiting for Redis.", static_cast<double>(m.outbox));
  w.One("outbox_dropped_total", "counter", "Reports dropped from a full outbox.",
        static_cast<double>(m.outbox_dropped));
  w.One("published_total", "counter", "Stream entries written to Redis.",
        static_cast<double>(m.published));
  w.Head("commands_total", "counter", "Controller commands by ack status.");
  for (const char* s : {"ok", "unsupported", "rejected", "failed", "expired"}) {
    const auto it = m.commands.find(s);
    w.Line("commands_total", std::string("status=\"") + s + "\"",
           it == m.commands.end() ? 0 : static_cast<double>(it->second));
  }
  w.One("invalid_messages_total", "counter", "Messages from Redis that failed validation.",
        static_cast<double>(m.invalid_messages));
  w.One("cpu_seconds_total", "counter", "Agent CPU time, user + system, all threads.",
        m.cpu_seconds);
  w.One("polls_total", "counter", "Poll ticks run.", static_cast<double>(m.polls));
  w.One("last_poll_seconds", "gauge", "Wall time of the last poll tick.", m.last_poll_seconds);
  return w.str();
}

}  // namespace falcon::agent
