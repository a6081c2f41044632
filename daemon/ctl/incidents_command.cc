// `falcon-ctl incidents` (the incident stream, newest last) and `falcon-ctl events` (live alerts
// from the alerts channel with --follow; otherwise the incident stream, since the channel keeps
// no history — see docs/protocol.md).
// Threads: `events --follow` runs a RedisSubscriber whose thread prints each validated alert
// (one line, flushed); the main thread only waits for SIGINT/SIGTERM and stops it. Everything
// else is single-threaded. Every payload is validated; bad ones are skipped with a warning.
#include <signal.h>
#include <time.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>

#include "daemon/common/cli_checks.h"
#include "daemon/ctl/command.h"
#include "daemon/ctl/redis_cli.h"
#include "daemon/protocol/keys.h"
#include "daemon/protocol/validate.h"
#include "daemon/redis/redis_subscriber.h"

namespace falcon::ctl {
namespace {

using nlohmann::json;

constexpr int kJsonSchema = 1;

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

struct IncidentOptions {
  RedisCliOptions redis;
  std::string since;   // stream id: entries after it
  std::uint64_t limit = 50;
  bool follow = false;  // events only
};

std::string Field(const json& m, const char* name) {
  if (!m.contains(name)) return "-";
  return m[name].is_string() ? m[name].get<std::string>() : m[name].dump();
}

int ListIncidents(IncidentOptions o, const char* what) {
  if (Status s = ResolveRedisOptions(o.redis); !s.ok()) return ReportRedisError(s);
  auto conn = ConnectRedis(o.redis);
  if (!conn.ok()) return ReportRedisError(conn.status());
  Result<std::string> key =
      protocol::FormatKey(protocol::kIncidentsStream, JobVars(o.redis.job));
  if (!key.ok()) return ReportRedisError(key.status());
  Result<std::vector<ValidMessage>> entries =
      ReadStreamTail(*conn.value(), key.value(), protocol::kIncident, o.limit, o.since);
  if (!entries.ok()) return ReportRedisError(entries.status());
  if (o.redis.json) {
    json list = json::array();
    for (const ValidMessage& e : entries.value()) list.push_back({{"entry", e.id}, {"msg", e.msg}});
    json doc = {{"v", kJsonSchema}, {"job", o.redis.job}, {"stream", key.value()}, {"incidents", list}};
    std::printf("%s\n", doc.dump().c_str());
    return kExitOk;
  }
  std::printf("# falcon-ctl %s 0.1.0 (protocol v%d)  job %s  stream %s  last %llu%s%s\n", what,
              protocol::kSchemaVersion, o.redis.job.c_str(), key.value().c_str(),
              static_cast<unsigned long long>(o.limit), o.since.empty() ? "" : " after ",
              o.since.c_str());
  if (std::string(what) == "events") {
    std::printf("# the alerts channel keeps no history: its durable record, the incident stream, "
                "follows (--follow for live alerts)\n");
  }
  std::printf("%-20s %-19s %-16s %-12s %-8s %-8s %-12s %s\n", "entry", "at (UTC)", "incident",
              "stage", "cause", "strategy", "ranks", "summary");
  for (const ValidMessage& e : entries.value()) {
    std::printf("%-20s %-19s %-16s %-12s %-8s %-8s %-12s %s\n", e.id.c_str(),
                FormatUtc(e.msg["at_ns"].get<std::int64_t>()).c_str(), Field(e.msg, "id").c_str(),
                Field(e.msg, "stage").c_str(), Field(e.msg, "cause").c_str(),
                Field(e.msg, "strategy").c_str(), Field(e.msg, "ranks").c_str(),
                Field(e.msg, "summary").c_str());
  }
  std::printf("# %zu incident entr%s\n", entries.value().size(),
              entries.value().size() == 1 ? "y" : "ies");
  return kExitOk;
}

void PrintAlert(const json& a, bool as_json) {
  if (as_json) {
    std::printf("%s\n", a.dump().c_str());
  } else {
    std::printf("%s  %-8s %-10s host %-12s rank %-5s %s%s%s\n",
                FormatUtc(a["at_ns"].get<std::int64_t>()).c_str(),
                a["severity"].get<std::string>().c_str(), a["source"].get<std::string>().c_str(),
                Field(a, "host").c_str(), Field(a, "rank").c_str(),
                a["summary"].get<std::string>().c_str(), a.contains("incident") ? "  incident " : "",
                a.contains("incident") ? a["incident"].get<std::string>().c_str() : "");
  }
  std::fflush(stdout);
}

int FollowAlerts(IncidentOptions o) {
  if (Status s = ResolveRedisOptions(o.redis); !s.ok()) return ReportRedisError(s);
  {  // Fail fast with exit 4 when Redis is not there; the subscriber would retry forever.
    auto conn = ConnectRedis(o.redis);
    if (!conn.ok()) return ReportRedisError(conn.status());
  }
  Result<std::string> channel =
      protocol::FormatKey(protocol::kAlertsChannel, JobVars(o.redis.job));
  if (!channel.ok()) return ReportRedisError(channel.status());
  redis::RedisOptions ro;
  ro.host = o.redis.host;
  ro.port = o.redis.port;
  ro.user = o.redis.user;
  ro.password = o.redis.password;
  ro.connect_timeout_ms = static_cast<int>(o.redis.timeout_s * 1000);
  const bool as_json = o.redis.json;
  const std::string where = channel.value();
  std::mutex out_mu;  // the subscriber thread prints; stderr notices come from its state callback
  redis::RedisSubscriber sub(
      "ctl-events", ro, {channel.value()},
      [&](const std::string&, const std::string& payload) {
        std::optional<json> a = ValidateOrWarn(where, &payload, protocol::kAlert);
        std::lock_guard<std::mutex> lock(out_mu);
        try {
          if (a) PrintAlert(*a, as_json);
        } catch (const std::exception& e) {  // validated above: a bug if it throws
          std::fprintf(stderr, "falcon-ctl events: internal error: %s\n", e.what());
        }
      },
      [&](bool connected, const Status& why) {
        std::lock_guard<std::mutex> lock(out_mu);
        if (connected) {
          std::fprintf(stderr, "# subscribed to %s (Ctrl-C to stop)\n", where.c_str());
        } else {
          std::fprintf(stderr, "falcon-ctl events: lost Redis (%s), reconnecting\n",
                       why.message().c_str());
        }
      });
  g_stop.store(false);
  struct sigaction sa{};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sub.Start();
  while (!g_stop.load()) {
    timespec ts{0, 50 * 1000 * 1000};
    nanosleep(&ts, nullptr);  // signal poll, as `trace -f` does; no data flows through here
  }
  sub.Stop();
  return kExitOk;
}

void AddListOptions(CLI::App& cmd, IncidentOptions& o) {
  AddRedisOptions(cmd, o.redis);
  cmd.add_option("--since", o.since, "only entries after this stream id (e.g. 1795265000000-0)");
  cmd.add_option("-n", o.limit, "at most N entries, the newest (0: all)")
      ->check(daemon::NonNegative())
      ->capture_default_str();
}

template <typename Fn>
void Guarded(CommandContext& ctx, const char* name, Fn fn) {
  try {
    ctx.exit_code = fn();
  } catch (const std::exception& e) {  // JSON access on validated data: a bug if it throws
    std::fprintf(stderr, "falcon-ctl %s: internal error: %s\n", name, e.what());
    ctx.exit_code = kExitInternal;
  }
}

}  // namespace

void AddIncidentsCommand(CLI::App& app, CommandContext& ctx) {
  auto o = std::make_shared<IncidentOptions>();
  CLI::App* cmd = app.add_subcommand("incidents", "List the job's incident stream, newest last");
  AddListOptions(*cmd, *o);
  cmd->callback([o, &ctx] { Guarded(ctx, "incidents", [&] { return ListIncidents(*o, "incidents"); }); });
}

void AddEventsCommand(CLI::App& app, CommandContext& ctx) {
  auto o = std::make_shared<IncidentOptions>();
  o->limit = 20;
  CLI::App* cmd = app.add_subcommand(
      "events",
      "Print live alerts (--follow, until Ctrl-C); without --follow, recent incident entries "
      "(the alerts channel keeps no history)");
  AddListOptions(*cmd, *o);
  cmd->add_flag("-f,--follow", o->follow, "subscribe to the alerts channel and print each alert");
  cmd->callback([o, &ctx] {
    Guarded(ctx, "events", [&] { return o->follow ? FollowAlerts(*o) : ListIncidents(*o, "events"); });
  });
}

}  // namespace falcon::ctl
