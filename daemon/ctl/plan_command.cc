// `falcon-ctl plan`: the mitigation plan in force for a job (falcon:{job}:plan, written by the
// controller's decision stage), which ranks' frameworks have applied it (rank_register
// plan_applied / plan_rejected), and with --history every decision of the job's incidents.
// Read-only; every payload is validated and bad ones are skipped with a warning.
// Exit codes: 0 a plan is shown (or none was ever published: says so), 3 the job is unknown,
// 4 Redis unreachable. Single-threaded.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/ctl/command.h"
#include "daemon/ctl/redis_cli.h"
#include "daemon/protocol/keys.h"
#include "daemon/redis/redis_commands.h"

namespace falcon::ctl {
namespace {

using nlohmann::json;

constexpr int kJsonSchema = 1;
constexpr std::uint64_t kHistoryEntries = 10000;

struct PlanOptions {
  RedisCliOptions redis;
  bool history = false;
};

// "[8, 8, 6, 10]" for short vectors, "[n entries: 0 0 1 1 ...]" for long ones.
std::string Compact(const json& v) {
  if (!v.is_array()) return "-";
  if (v.size() <= 16) return v.dump();
  std::string out = "[" + std::to_string(v.size()) + " entries:";
  for (std::size_t i = 0; i < 16; ++i) out += " " + v[i].dump();
  return out + " ...]";
}

json Acks(const std::vector<json>& ranks, std::int64_t version) {
  json applied = json::array(), rejected = json::array(), pending = json::array();
  for (const json& r : ranks) {
    const json rank = r["rank"];
    if (r.value("plan_applied", std::int64_t{0}) >= version) {
      applied.push_back(rank);
    } else if (r.value("plan_rejected", std::int64_t{0}) >= version) {
      rejected.push_back(rank);
    } else {
      pending.push_back(rank);
    }
  }
  return {{"applied", applied}, {"rejected", rejected}, {"pending", pending}};
}

void PrintPlan(const json& p, const json& acks, std::int64_t now) {
  std::printf("plan v%lld  %s  mode %s  incident %s  decided %s ago\n", p["plan_version"].get<long long>(),
              p["strategy"].get<std::string>().c_str(), p["mode"].get<std::string>().c_str(),
              p.value("incident", std::string("-")).c_str(), AgeString(p["at_ns"].get<std::int64_t>(), now).c_str());
  if (p.contains("reason")) std::printf("  why:            %s\n", p["reason"].get<std::string>().c_str());
  if (p.contains("expected_gain")) {
    std::printf("  expected gain:  %.0f%% shorter iterations\n", p["expected_gain"].get<double>() * 100);
  }
  if (p.contains("micro_batches")) std::printf("  micro-batches:  %s per DP replica\n", Compact(p["micro_batches"]).c_str());
  if (p.contains("placement")) std::printf("  placement:      %s node per rank\n", Compact(p["placement"]).c_str());
  if (p.contains("warmup")) std::printf("  warm-up:        %s forwards per pipeline stage\n", Compact(p["warmup"]).c_str());
  if (p.contains("exclude_nodes")) std::printf("  exclude nodes:  %s\n", p["exclude_nodes"].dump().c_str());
  if (p.value("restart", false)) std::printf("  restart:        from the last checkpoint\n");
  if (p["mode"] == "act") {
    std::printf("  frameworks:     applied by %zu rank(s), rejected by %zu, pending %zu%s\n", acks["applied"].size(),
                acks["rejected"].size(), acks["pending"].size(),
                acks["rejected"].empty() ? "" : ("  rejected: " + acks["rejected"].dump()).c_str());
  } else {
    std::printf("  frameworks:     advise mode: published only (the controller runs with --mitigation advise)\n");
  }
}

int RunPlan(PlanOptions o) {
  if (Status s = ResolveRedisOptions(o.redis); !s.ok()) return ReportRedisError(s);
  auto conn = ConnectRedis(o.redis);
  if (!conn.ok()) return ReportRedisError(conn.status());
  redis::RedisConnection& c = *conn.value();
  Result<std::string> key = protocol::FormatKey(protocol::kPlanKey, JobVars(o.redis.job));
  Result<std::string> incidents = protocol::FormatKey(protocol::kIncidentsStream, JobVars(o.redis.job));
  Result<std::string> controller = protocol::FormatKey(protocol::kControllerKey, JobVars(o.redis.job));
  if (!key.ok() || !incidents.ok() || !controller.ok()) return ReportRedisError(Status::InvalidArgument("bad job name"));
  Result<std::optional<ValidMessage>> plan = ReadHashMessage(c, key.value(), protocol::kMitigationPlan);
  if (!plan.ok()) return ReportRedisError(plan.status());
  Result<std::optional<ValidMessage>> state = ReadHashMessage(c, controller.value(), protocol::kControllerState);
  if (!state.ok()) return ReportRedisError(state.status());
  // The ranks' acknowledgements.
  std::vector<json> ranks;
  Result<std::string> pattern = protocol::KeyMatchPattern(protocol::kRankKey, JobVars(o.redis.job));
  if (!pattern.ok()) return ReportRedisError(pattern.status());
  Result<std::vector<std::string>> keys = redis::ScanKeys(c, pattern.value());
  if (!keys.ok()) return ReportRedisError(keys.status());
  for (const std::string& k : keys.value()) {
    Result<std::optional<ValidMessage>> r = ReadHashMessage(c, k, protocol::kRankRegister);
    if (!r.ok()) return ReportRedisError(r.status());
    if (r.value()) ranks.push_back(std::move(r.value()->msg));
  }
  if (!plan.value() && !state.value() && ranks.empty()) {
    std::fprintf(stderr, "falcon-ctl plan: nothing is known about job '%s' here (wrong --job or FALCON_JOB?)\n",
                 o.redis.job.c_str());
    return kExitInput;
  }
  json history = json::array();
  if (o.history) {
    Result<std::vector<ValidMessage>> entries =
        ReadStreamTail(c, incidents.value(), protocol::kIncident, kHistoryEntries, "");
    if (!entries.ok()) return ReportRedisError(entries.status());
    for (const ValidMessage& e : entries.value()) {
      if (e.msg["stage"] == "decision") history.push_back(e.msg);
    }
  }
  const std::int64_t now = NowNs();
  const std::optional<json> p = plan.value() ? std::optional(plan.value()->msg) : std::nullopt;
  const json acks = p ? Acks(ranks, p->at("plan_version").get<std::int64_t>()) : json(nullptr);
  if (o.redis.json) {
    json doc = {{"v", kJsonSchema}, {"job", o.redis.job}, {"at_ns", now}, {"plan", p ? *p : json(nullptr)},
                {"acks", acks}};
    if (state.value()) {
      const json& s = state.value()->msg;
      doc["controller"] = {{"mitigation", s.value("mitigation", json(nullptr))},
                           {"strategy", s.value("strategy", json(nullptr))},
                           {"incident", s.value("incident", json(nullptr))}};
    }
    if (o.history) doc["decisions"] = history;
    std::printf("%s\n", doc.dump().c_str());
    return kExitOk;
  }
  std::printf("# falcon-ctl plan  job %s  at %s UTC\n", o.redis.job.c_str(), FormatUtc(now).c_str());
  if (state.value()) {
    const json& s = state.value()->msg;
    std::printf("# controller: mitigation %s, strategy in force %s, open incident %s\n",
                s.value("mitigation", std::string("?")).c_str(), s.value("strategy", std::string("-")).c_str(),
                s.value("incident", std::string("-")).c_str());
  }
  if (p) {
    PrintPlan(*p, acks, now);
  } else {
    std::printf("no mitigation plan has been published for this job\n");
  }
  if (o.history) {
    std::printf("# %zu decision(s)\n", history.size());
    for (const json& d : history) {
      std::printf("%s  %-9s %-3s %s\n", FormatUtc(d["at_ns"].get<std::int64_t>()).c_str(),
                  d["id"].get<std::string>().c_str(), d.value("strategy", std::string("-")).c_str(),
                  d["summary"].get<std::string>().c_str());
    }
  }
  return kExitOk;
}

}  // namespace

void AddPlanCommand(CLI::App& app, CommandContext& ctx) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Show the mitigation plan in force (strategy, micro-batches, placement, expected gain) and which "
              "ranks applied it; --history lists every decision");
  AddRedisOptions(*cmd, o->redis);
  cmd->add_flag("--history", o->history, "also list every decision recorded on the incidents stream");
  cmd->callback([o, &ctx] {
    try {
      ctx.exit_code = RunPlan(*o);
    } catch (const std::exception& e) {  // JSON access on validated data: a bug if it throws
      std::fprintf(stderr, "falcon-ctl plan: internal error: %s\n", e.what());
      ctx.exit_code = kExitInternal;
    }
  });
}

}  // namespace falcon::ctl
