// `falcon-ctl status`: what Redis says about one job — controller state, the agents (heartbeat
// hashes), the ranks (registration hashes) with their latest iteration time (iterations stream)
// and healthy baseline (latest alarm), period and shim mode. Read-only; every payload is
// validated and bad ones are skipped with a warning. Single-threaded.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/ctl/command.h"
#include "daemon/ctl/redis_cli.h"
#include "daemon/redis/redis_commands.h"
#include "daemon/protocol/keys.h"
#include "daemon/protocol/rank_beat.h"

namespace falcon::ctl {
namespace {

using nlohmann::json;

constexpr std::uint64_t kRecentEntries = 2000;  // stream entries scanned for the latest values
constexpr int kJsonSchema = 1;

struct JobStatus {
  std::vector<json> agents;           // validated agent_heartbeat
  std::vector<json> ranks;            // validated rank_register
  std::map<std::int64_t, double> current_s;   // rank -> latest iteration time
  std::map<std::int64_t, json> last_alarm;    // rank -> latest alarm
  std::optional<json> controller;             // validated controller_state, if any
};

Result<std::vector<json>> ReadHashes(redis::RedisConnection& c, const protocol::KeySpec& spec,
                                     const std::string& job) {
  Result<std::string> pattern = protocol::KeyMatchPattern(spec, JobVars(job));
  if (!pattern.ok()) return pattern.status();
  Result<std::vector<std::string>> keys = redis::ScanKeys(c, pattern.value());
  if (!keys.ok()) return keys.status();
  std::vector<json> out;
  const protocol::MessageSpec* ms = protocol::FindMessage(spec.messages);
  if (ms == nullptr) return Status::Internal("no single message type for key " + std::string(spec.name));
  for (const std::string& key : keys.value()) {
    Result<std::optional<ValidMessage>> m = ReadHashMessage(c, key, *ms);
    if (!m.ok()) return m.status();
    if (m.value()) out.push_back(std::move(m.value()->msg));
  }
  return out;
}

Status Collect(redis::RedisConnection& c, const std::string& job, JobStatus& st) {
  Result<std::vector<json>> agents = ReadHashes(c, protocol::kAgentKey, job);
  if (!agents.ok()) return agents.status();
  st.agents = std::move(agents).value();
  Result<std::vector<json>> ranks = ReadHashes(c, protocol::kRankKey, job);
  if (!ranks.ok()) return ranks.status();
  st.ranks = std::move(ranks).value();
  protocol::ApplyBeats(st.ranks, st.agents);  // the counters now, from the agents' heartbeats
  Result<std::string> iters = protocol::FormatKey(protocol::kIterationsStream, JobVars(job));
  Result<std::string> alarms = protocol::FormatKey(protocol::kAlarmsStream, JobVars(job));
  if (!iters.ok() || !alarms.ok()) return Status::InvalidArgument("bad job name");
  Result<std::vector<ValidMessage>> batches =
      ReadStreamTail(c, iters.value(), protocol::kIterations, kRecentEntries, "");
  if (!batches.ok()) return batches.status();
  for (const ValidMessage& b : batches.value()) {  // oldest first: the last write wins
    const json& s = b.msg["seconds"];
    if (!s.empty()) st.current_s[b.msg["rank"].get<std::int64_t>()] = s.back().get<double>();
  }
  Result<std::vector<ValidMessage>> al =
      ReadStreamTail(c, alarms.value(), protocol::kAlarm, kRecentEntries, "");
  if (!al.ok()) return al.status();
  for (const ValidMessage& a : al.value()) st.last_alarm[a.msg["rank"].get<std::int64_t>()] = a.msg;
  Result<std::vector<json>> controller = ReadHashes(c, protocol::kControllerKey, job);
  if (!controller.ok()) return controller.status();
  if (!controller.value().empty()) st.controller = controller.value().front();
  return Status::Ok();
}

json RankRecord(const json& r, const JobStatus& st, std::int64_t now) {
  const std::int64_t rank = r["rank"].get<std::int64_t>();
  json out = {{"rank", rank},
              {"host", r["host"]},
              {"pid", r["pid"]},
              {"state", r["state"]},
              {"mode", r["mode"]},
              {"period", r.contains("period") ? r["period"] : json(nullptr)},
              {"iterations", r["iterations"]},
              {"slow", r["slow"]},
              {"phase", r.value("phase", std::string("train"))},
              {"excluded", r.value("excluded", std::int64_t{0})},
              {"heartbeat_age_s", static_cast<double>(now - r["at_ns"].get<std::int64_t>()) / 1e9},
              {"current_s", nullptr},
              {"healthy_s", nullptr}};
  if (auto it = st.current_s.find(rank); it != st.current_s.end()) out["current_s"] = it->second;
  if (auto it = st.last_alarm.find(rank); it != st.last_alarm.end()) {
    out["healthy_s"] = it->second["baseline_s"];
    out["last_alarm"] = it->second["kind"];
  }
  return out;
}

std::string Ms(const json& seconds) {
  if (seconds.is_null()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", seconds.get<double>() * 1e3);
  return buf;
}

// What people and scripts want from the controller's state (the resume document stays out).
json ControllerRecord(const json& c, std::int64_t now) {
  json out = {{"state", c["state"]},
              {"since_s", static_cast<double>(now - c["since_ns"].get<std::int64_t>()) / 1e9},
              {"host", c["host"]},
              {"pid", c["pid"]},
              {"version", c["version"]},
              {"heartbeat_age_s", static_cast<double>(now - c["at_ns"].get<std::int64_t>()) / 1e9},
              {"ranks", c["ranks"]},
              {"agents", c["agents"]},
              {"incident", c.value("incident", json(nullptr))},
              {"incidents", c["incidents"]},
              {"slow_ranks", c["slow_ranks"]},
              {"mode", c.value("mode", json(nullptr))},
              {"period", c.value("period", json(nullptr))},
              {"current_s", c.value("current_s", json(nullptr))},
              {"healthy_s", c.value("healthy_s", json(nullptr))},
              {"mitigation", c.value("mitigation", json(nullptr))},
              {"strategy", c.value("strategy", json(nullptr))},
              {"plan_version", c.value("plan_version", json(nullptr))}};
  return out;
}

void PrintController(const std::optional<json>& c, std::int64_t now) {
  if (!c) {
    std::printf("# controller: none — no controller has written state for this job (is falcon-controller running?)\n");
    return;
  }
  const json r = ControllerRecord(*c, now);
  const bool stale = r["heartbeat_age_s"].get<double>() > 10;
  std::printf("# controller: %s for %.0f s  incident %s  slow ranks %s  mode %s  period %s calls  "
              "iteration %s ms (healthy %s ms)  %s pid %lld, state written %.1f s ago%s\n",
              r["state"].get<std::string>().c_str(), r["since_s"].get<double>(),
              r["incident"].is_null() ? "-" : r["incident"].get<std::string>().c_str(),
              r["slow_ranks"].dump().c_str(), r["mode"].is_null() ? "-" : r["mode"].get<std::string>().c_str(),
              r["period"].is_null() ? "-" : std::to_string(r["period"].get<long long>()).c_str(),
              Ms(r["current_s"]).c_str(), Ms(r["healthy_s"]).c_str(), r["host"].get<std::string>().c_str(),
              r["pid"].get<long long>(), r["heartbeat_age_s"].get<double>(),
              stale ? "  (STALE: is falcon-controller running?)" : "");
  if (!r["mitigation"].is_null()) {
    std::printf("# mitigation: %s  strategy in force %s  plan %s%s\n", r["mitigation"].get<std::string>().c_str(),
                r["strategy"].is_null() ? "-" : r["strategy"].get<std::string>().c_str(),
                r["plan_version"].is_null() ? "none" : ("v" + std::to_string(r["plan_version"].get<long long>())).c_str(),
                r["plan_version"].is_null() ? "" : "  (falcon-ctl plan)");
  }
}

void PrintTable(const std::string& job, const JobStatus& st, const std::vector<json>& ranks,
                std::int64_t now) {
  std::printf("# falcon-ctl status 0.1.0 (protocol v%d)  job %s  at %s UTC\n",
              protocol::kSchemaVersion, job.c_str(), FormatUtc(now).c_str());
  PrintController(st.controller, now);
  std::printf("# %zu agent(s), %zu rank(s)\n", st.agents.size(), ranks.size());
  for (const json& a : st.agents) {
    std::printf("# agent %s pid %lld version %s ranks %s heartbeat %s ago outbox %llu dropped %llu\n",
                a["host"].get<std::string>().c_str(), a["pid"].get<long long>(),
                a["version"].get<std::string>().c_str(), a["ranks"].dump().c_str(),
                AgeString(a["at_ns"].get<std::int64_t>(), now).c_str(),
                a["outbox"].get<unsigned long long>(), a["dropped"].get<unsigned long long>());
  }
  std::printf("%6s %-16s %8s %-8s %-7s %8s %10s %12s %12s %9s %-5s %s\n", "rank", "host", "pid",
              "state", "mode", "period", "iters", "current_ms", "healthy_ms", "beat_age", "slow", "phase");
  for (const json& r : ranks) {
    char age[32];
    std::snprintf(age, sizeof(age), "%.1fs", r["heartbeat_age_s"].get<double>());
    std::printf("%6lld %-16s %8lld %-8s %-7s %8s %10llu %12s %12s %9s %-5s %s\n",
                r["rank"].get<long long>(), r["host"].get<std::string>().c_str(),
                r["pid"].get<long long>(), r["state"].get<std::string>().c_str(),
                r["mode"].get<std::string>().c_str(),
                r["period"].is_null() ? "-" : std::to_string(r["period"].get<long long>()).c_str(),
                r["iterations"].get<unsigned long long>(), Ms(r["current_s"]).c_str(),
                Ms(r["healthy_s"]).c_str(), age, r["slow"].get<bool>() ? "SLOW" : "no",
                r["phase"].get<std::string>().c_str());
  }
  std::size_t slow = 0;
  for (const json& r : ranks) slow += r["slow"].get<bool>() ? 1 : 0;
  std::printf("# %zu of %zu rank(s) slow\n", slow, ranks.size());
}

int RunStatus(RedisCliOptions o) {
  if (Status s = ResolveRedisOptions(o); !s.ok()) return ReportRedisError(s);
  auto conn = ConnectRedis(o);
  if (!conn.ok()) return ReportRedisError(conn.status());
  JobStatus st;
  if (Status s = Collect(*conn.value(), o.job, st); !s.ok()) return ReportRedisError(s);
  if (st.agents.empty() && st.ranks.empty() && !st.controller) {
    std::fprintf(stderr,
                 "falcon-ctl status: no agents or ranks registered for job '%s' (is falcon-agent "
                 "running with job = %s and this Redis? wrong --job or FALCON_JOB?)\n",
                 o.job.c_str(), o.job.c_str());
    return kExitInput;
  }
  const std::int64_t now = NowNs();
  std::vector<json> ranks;
  for (const json& r : st.ranks) ranks.push_back(RankRecord(r, st, now));
  std::sort(ranks.begin(), ranks.end(),
            [](const json& a, const json& b) { return a["rank"] < b["rank"]; });
  if (o.json) {
    json agents = json::array();
    for (const json& a : st.agents) {
      agents.push_back({{"host", a["host"]},
                        {"pid", a["pid"]},
                        {"version", a["version"]},
                        {"ranks", a["ranks"]},
                        {"heartbeat_age_s",
                         static_cast<double>(now - a["at_ns"].get<std::int64_t>()) / 1e9},
                        {"outbox", a["outbox"]},
                        {"dropped", a["dropped"]}});
    }
    json doc = {{"v", kJsonSchema}, {"job", o.job},   {"at_ns", now},
                {"controller", st.controller ? ControllerRecord(*st.controller, now) : json(nullptr)},
                {"agents", agents}, {"ranks", ranks}};
    std::printf("%s\n", doc.dump().c_str());
  } else {
    PrintTable(o.job, st, ranks, now);
  }
  return kExitOk;
}

}  // namespace

void AddStatusCommand(CLI::App& app, CommandContext& ctx) {
  auto o = std::make_shared<RedisCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "status", "Show a job from Redis: controller, agents, ranks with iteration times and mode");
  AddRedisOptions(*cmd, *o);
  cmd->callback([o, &ctx] {
    try {
      ctx.exit_code = RunStatus(*o);
    } catch (const std::exception& e) {  // JSON access on validated data: a bug if it throws
      std::fprintf(stderr, "falcon-ctl status: internal error: %s\n", e.what());
      ctx.exit_code = kExitInternal;
    }
  });
}

}  // namespace falcon::ctl
