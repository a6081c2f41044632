// `falcon-ctl mode | pause | resume | validate`: send one controller command (include/falcon/
// protocol.h: set_mode, pause, resume, validate) to the agents' command streams and wait, up to
// --timeout, for their acks on the acks stream.
//
// Targets: --agent HOST (repeatable), else the hosts of the ranks given with --ranks (from the
// rank keys), else every agent with a heartbeat key. One command per host, each with its own id
// ("ctl-<pid>-<ns>-<n>"), `ranks` only when --ranks was given, `deadline_ns` = issue + timeout.
// Every outgoing message is validated against its spec before it is sent; every ack read is
// validated, and bad ones are skipped with a warning.
// Exit: 0 every ack ok; 1 an ack not ok; 4 Redis unreachable or an agent did not ack in time;
// 3 no agent to send to. Single-threaded.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "daemon/common/cli_checks.h"
#include "daemon/ctl/command.h"
#include "daemon/ctl/redis_cli.h"
#include "daemon/protocol/keys.h"
#include "daemon/protocol/messages.h"
#include "daemon/protocol/validate.h"
#include "daemon/redis/redis_commands.h"

namespace falcon::ctl {
namespace {

using nlohmann::json;

constexpr int kJsonSchema = 1;
constexpr int kAckPollMs = 200;         // one XREAD BLOCK slice while waiting for acks
constexpr std::uint64_t kCommandsMaxLen = 1000;  // MAXLEN ~ of a host's command stream

struct SendOptions {
  RedisCliOptions redis;
  std::vector<std::string> agents;
  std::vector<std::int64_t> ranks;
  protocol::Command command;  // type and type-specific fields; ids filled at send time
  std::function<std::string()> check;  // after parsing: "" or what is wrong with the flags
  std::function<bool()> plan_cut;  // pause --iteration: plan a consistent cut from cut_info first
  double cut_lead_s = 1.0;
  bool next_iteration = false;     // pause --next-iteration: the first iteration that has a cut
  std::optional<std::uint64_t> planned_iteration;  // the iteration the cut stops the lowest rank at
};

protocol::KeyVars HostVars(const std::string& job, const std::string& host) {
  protocol::KeyVars v = JobVars(job);
  v.host = host;
  return v;
}

struct Target {
  std::string host;
  std::string command_id;
  std::optional<json> ack;  // validated
  std::vector<protocol::Command::RankTargets> cut;  // pause: this host's part of a planned cut
};

// Hosts to send to, from --agent, --ranks (rank keys) or every agent heartbeat.
Result<std::vector<std::string>> FindHosts(redis::RedisConnection& c, const SendOptions& o) {
  if (!o.agents.empty()) {
    for (const std::string& h : o.agents) {
      if (!protocol::ValidKeyPart(h)) return Status::InvalidArgument("--agent '" + h + "': not a host name");
    }
    return o.agents;
  }
  const protocol::KeySpec& spec = o.ranks.empty() ? protocol::kAgentKey : protocol::kRankKey;
  Result<std::string> pattern = protocol::KeyMatchPattern(spec, JobVars(o.redis.job));
  if (!pattern.ok()) return pattern.status();
  Result<std::vector<std::string>> keys = redis::ScanKeys(c, pattern.value());
  if (!keys.ok()) return keys.status();
  std::set<std::string> hosts;
  const protocol::MessageSpec* ms = protocol::FindMessage(spec.messages);
  if (ms == nullptr) return Status::Internal("no single message type for key " + std::string(spec.name));
  for (const std::string& key : keys.value()) {
    Result<std::optional<ValidMessage>> m = ReadHashMessage(c, key, *ms);
    if (!m.ok()) return m.status();
    if (!m.value()) continue;
    const json& msg = m.value()->msg;
    if (!o.ranks.empty() &&
        std::find(o.ranks.begin(), o.ranks.end(), msg["rank"].get<std::int64_t>()) == o.ranks.end()) {
      continue;
    }
    hosts.insert(msg["host"].get<std::string>());
  }
  return std::vector<std::string>(hosts.begin(), hosts.end());
}

// The acks stream's last entry id ("0-0" if empty): acks are read after it.
Result<std::string> LastId(redis::RedisConnection& c, const std::string& stream) {
  Result<redis::RedisReply> r = c.Command({"XREVRANGE", stream, "+", "-", "COUNT", "1"});
  if (!r.ok()) return r.status();
  const redis::RedisReply& rep = r.value();
  if (rep.type != redis::RedisReply::Type::kArray) return Status::Corrupt("unexpected XREVRANGE reply");
  if (rep.elements.empty()) return std::string("0-0");
  if (rep.elements[0].type != redis::RedisReply::Type::kArray || rep.elements[0].elements.empty()) {
    return Status::Corrupt("unexpected XREVRANGE entry");
  }
  return rep.elements[0].elements[0].str;
}

Status SendAll(redis::RedisConnection& c, const SendOptions& o, std::vector<Target>& targets) {
  const std::int64_t now = NowNs();
  int n = 0;
  for (Target& t : targets) {
    protocol::Command cmd = o.command;
    t.command_id = "ctl-" + std::to_string(getpid()) + "-" + std::to_string(now) + "-" +
                   std::to_string(n++);
    cmd.id = t.command_id;
    cmd.issued_ns = now;
    cmd.deadline_ns = now + static_cast<std::int64_t>(o.redis.timeout_s * 1e9);
    if (!o.ranks.empty()) cmd.ranks = o.ranks;
    if (!t.cut.empty()) cmd.targets = t.cut;
    const json j = protocol::ToJson(cmd);
    const protocol::MessageSpec* spec = protocol::FindCommand(cmd.type);
    if (spec == nullptr) return Status::Internal("unknown command type " + cmd.type);
    if (Status s = protocol::ValidateMessage(j, *spec); !s.ok()) {
      return Status::InvalidArgument("the " + cmd.type + " command would be invalid: " + s.message());
    }
    Result<std::string> stream =
        protocol::FormatKey(protocol::kCommandsStream, HostVars(o.redis.job, t.host));
    if (!stream.ok()) return stream.status();
    Result<std::string> id = redis::XAdd(c, stream.value(), kCommandsMaxLen,
                                         {{std::string(protocol::kPayloadField), j.dump()}});
    if (!id.ok()) return id.status();
  }
  return Status::Ok();
}

// Reads acks after `last_id` until every target has one or the deadline passes.
Status AwaitAcks(redis::RedisConnection& c, const std::string& acks, std::string last_id,
                 double timeout_s, std::vector<Target>& targets) {
  const std::int64_t deadline = NowNs() + static_cast<std::int64_t>(timeout_s * 1e9);
  auto pending = [&] {
    return std::count_if(targets.begin(), targets.end(), [](const Target& t) { return !t.ack; });
  };
  while (pending() > 0) {
    const std::int64_t left_ms = (deadline - NowNs()) / 1000000;
    if (left_ms <= 0) break;
    Result<std::vector<redis::StreamRead>> r = redis::XRead(
        c, {{acks, last_id}}, 100, static_cast<int>(std::min<std::int64_t>(left_ms, kAckPollMs)));
    if (!r.ok()) return r.status();
    for (const redis::StreamRead& read : r.value()) {
      for (const redis::StreamEntry& e : read.entries) {
        last_id = e.id;
        std::optional<json> ack = ValidateOrWarn(acks + " " + e.id,
                                                 e.Field(std::string(protocol::kPayloadField)),
                                                 protocol::kAck);
        if (!ack) continue;
        for (Target& t : targets) {
          if (!t.ack && (*ack)["command"] == t.command_id) t.ack = std::move(*ack);
        }
      }
    }
  }
  return Status::Ok();
}

int Report(const SendOptions& o, const std::vector<Target>& targets) {
  bool missing = false, not_ok = false;
  for (const Target& t : targets) {
    missing = missing || !t.ack;
    not_ok = not_ok || (t.ack && (*t.ack)["status"] != "ok");
  }
  if (o.redis.json) {
    json list = json::array();
    for (const Target& t : targets) {
      list.push_back({{"host", t.host}, {"command", t.command_id}, {"ack", t.ack ? *t.ack : json(nullptr)}});
    }
    json doc = {{"v", kJsonSchema}, {"job", o.redis.job}, {"type", o.command.type}, {"targets", list}};
    if (o.planned_iteration) doc["iteration"] = *o.planned_iteration;
    std::printf("%s\n", doc.dump().c_str());
  } else {
    std::printf("# falcon-ctl %s 0.1.0 (protocol v%d)  job %s  %zu agent(s)  timeout %.1f s\n",
                o.command.type.c_str(), protocol::kSchemaVersion, o.redis.job.c_str(),
                targets.size(), o.redis.timeout_s);
    if (o.planned_iteration) {
      std::printf("# the cut stops the lowest rank at the start of iteration %llu\n",
                  static_cast<unsigned long long>(*o.planned_iteration));
    }
    std::printf("%-16s %-32s %-12s %-16s %s\n", "host", "command", "status", "ranks", "detail");
    for (const Target& t : targets) {
      const json& a = t.ack ? *t.ack : json(nullptr);
      std::printf("%-16s %-32s %-12s %-16s %s\n", t.host.c_str(), t.command_id.c_str(),
                  t.ack ? a["status"].get<std::string>().c_str() : "NO ACK",
                  t.ack ? a["ranks"].dump().c_str() : "-",
                  t.ack ? a.value("detail", std::string()).c_str() : "agent did not answer in time");
    }
    std::printf("# verdict: %s\n", missing ? "NO ACK from some agent" : not_ok ? "NOT OK" : "ok");
  }
  if (missing) return kExitUnreachable;
  return not_ok ? kExitFound : kExitOk;
}

// pause --iteration N: asks every agent for its ranks' call patterns (cut_info), plans the
// consistent cut that stops the lowest rank at the start of iteration N (analyzer/cut_plan.h)
// and gives each target its hosts' part. Prints why and returns non-zero when there is none.
// --next-iteration: N is the lowest rank's first iteration that starts after the lead, or the
// first after it that has a cut. Sets o.planned_iteration (and the command's at_iteration).
int PlanCutFor(redis::RedisConnection& c, SendOptions& o, const std::string& acks, std::vector<Target>& targets) {
  SendOptions info = o;
  info.command = protocol::Command{};
  info.command.type = std::string(protocol::kCutInfo.type);
  std::vector<Target> asked;
  for (const Target& t : targets) asked.push_back({t.host, "", std::nullopt, {}});
  Result<std::string> last = LastId(c, acks);
  if (!last.ok()) return ReportRedisError(last.status());
  const std::int64_t asked_ns = NowNs();
  if (Status s = SendAll(c, info, asked); !s.ok()) return ReportRedisError(s);
  if (Status s = AwaitAcks(c, acks, last.value(), o.redis.timeout_s, asked); !s.ok()) return ReportRedisError(s);
  std::vector<analyzer::RankCallPattern> patterns;
  std::map<std::int64_t, std::size_t> target_of;  // rank -> index into targets
  std::string why;
  for (std::size_t i = 0; i < asked.size(); ++i) {
    if (!asked[i].ack) {
      why += asked[i].host + ": no answer; ";
      continue;
    }
    const json& a = *asked[i].ack;
    if (a["status"] != "ok") why += asked[i].host + ": " + a.value("detail", std::string("failed")) + "; ";
    for (const json& r : a.value("results", json::array())) {
      if (!r.contains("pattern")) continue;
      const auto m = protocol::ParseCutPattern(r["pattern"]);
      if (!m.ok()) {
        why += asked[i].host + ": " + m.status().message() + "; ";
        continue;
      }
      analyzer::RankCallPattern p = m.value().pattern;
      const double ahead_s = m.value().age_s + static_cast<double>(NowNs() - asked_ns) / 1e9 + o.cut_lead_s;
      p.min_position = m.value().position + static_cast<std::uint64_t>(std::ceil(m.value().units_per_s * ahead_s)) + 1;
      target_of[p.rank] = i;
      patterns.push_back(std::move(p));
    }
  }
  if (why.empty() && patterns.empty()) why = "no agent reported a rank's call pattern";
  if (why.empty() && o.next_iteration) {
    if (const std::optional<std::uint64_t> first = analyzer::FirstReachableIteration(patterns)) {
      o.command.at_iteration = *first;
    } else {
      const auto lowest = std::min_element(patterns.begin(), patterns.end(),
                                           [](const auto& a, const auto& b) { return a.rank < b.rank; });
      why = "rank " + std::to_string(lowest->rank) + " has no iteration boundary yet: no iteration to stop at";
    }
  }
  analyzer::CutOptions options;
  options.iteration = o.command.at_iteration;
  analyzer::CutPlan plan = why.empty() ? analyzer::PlanCut(patterns, options) : analyzer::CutPlan{{}, why, std::nullopt};
  if (!plan.ok() && o.next_iteration && plan.later_iteration) {
    o.command.at_iteration = *plan.later_iteration;
    options.iteration = o.command.at_iteration;
    plan = analyzer::PlanCut(patterns, options);
  }
  if (!plan.ok()) {
    if (o.next_iteration && why.empty()) {
      std::fprintf(stderr, "falcon-ctl pause: no consistent cut at the next iteration (%llu): %s\n",
                   static_cast<unsigned long long>(o.command.at_iteration), plan.failure.c_str());
    } else {
      std::fprintf(stderr, "falcon-ctl pause: no consistent cut%s: %s\n",
                   o.next_iteration ? "" : (" at iteration " + std::to_string(o.command.at_iteration)).c_str(),
                   plan.failure.c_str());
    }
    return kExitFound;
  }
  o.planned_iteration = o.command.at_iteration;
  for (const analyzer::RankCut& r : plan.ranks) targets[target_of[r.rank]].cut.push_back({r.rank, r.targets});
  return kExitOk;
}

int RunSend(SendOptions o) {
  if (o.check) {
    if (const std::string bad = o.check(); !bad.empty()) {
      std::fprintf(stderr, "falcon-ctl %s: %s\n", o.command.type.c_str(), bad.c_str());
      return kExitUsage;
    }
  }
  if (Status s = ResolveRedisOptions(o.redis); !s.ok()) return ReportRedisError(s);
  auto conn = ConnectRedis(o.redis);
  if (!conn.ok()) return ReportRedisError(conn.status());
  redis::RedisConnection& c = *conn.value();
  Result<std::vector<std::string>> hosts = FindHosts(c, o);
  if (!hosts.ok()) return ReportRedisError(hosts.status());
  if (hosts.value().empty()) {
    std::fprintf(stderr, "falcon-ctl %s: no agent %s for job '%s' (is falcon-agent running? --job?)\n",
                 o.command.type.c_str(), o.ranks.empty() ? "registered" : "follows those ranks",
                 o.redis.job.c_str());
    return kExitInput;
  }
  Result<std::string> acks = protocol::FormatKey(protocol::kAcksStream, JobVars(o.redis.job));
  if (!acks.ok()) return ReportRedisError(acks.status());
  Result<std::string> last = LastId(c, acks.value());
  if (!last.ok()) return ReportRedisError(last.status());
  std::vector<Target> targets;
  for (const std::string& h : hosts.value()) targets.push_back({h, "", std::nullopt, {}});
  if (o.plan_cut && o.plan_cut()) {
    if (const int rc = PlanCutFor(c, o, acks.value(), targets); rc != kExitOk) return rc;
    if (Result<std::string> l = LastId(c, acks.value()); l.ok()) last = l;
  }
  if (Status s = SendAll(c, o, targets); !s.ok()) return ReportRedisError(s);
  if (Status s = AwaitAcks(c, acks.value(), last.value(), o.redis.timeout_s, targets); !s.ok()) {
    return ReportRedisError(s);
  }
  return Report(o, targets);
}

struct RequestOptions {
  bool wait = false;
  std::string reason;
};

// `falcon-ctl validate` without --task: a controller_request on the requests stream; with --wait,
// the incident stream is read until a localisation stage names this request.
int RunControllerValidate(RedisCliOptions redis_options, const RequestOptions& o) {
  if (Status s = ResolveRedisOptions(redis_options); !s.ok()) return ReportRedisError(s);
  auto conn = ConnectRedis(redis_options);
  if (!conn.ok()) return ReportRedisError(conn.status());
  redis::RedisConnection& c = *conn.value();
  Result<std::string> requests = protocol::FormatKey(protocol::kRequestsStream, JobVars(redis_options.job));
  Result<std::string> incidents = protocol::FormatKey(protocol::kIncidentsStream, JobVars(redis_options.job));
  if (!requests.ok() || !incidents.ok()) return ReportRedisError(requests.ok() ? incidents.status() : requests.status());
  Result<std::string> last = LastId(c, incidents.value());
  if (!last.ok()) return ReportRedisError(last.status());
  const std::int64_t now = NowNs();
  const std::string id = "req-" + std::to_string(getpid()) + "-" + std::to_string(now);
  char host[128] = {};
  gethostname(host, sizeof host - 1);
  const char* user = std::getenv("USER");
  json req = {{"v", protocol::kSchemaVersion}, {"type", protocol::kControllerRequest.type}, {"id", id},
              {"issued_ns", now}, {"action", "validate"},
              {"by", std::string(user != nullptr ? user : "?") + "@" + host + " (falcon-ctl)"}};
  if (!o.reason.empty()) req["reason"] = o.reason;
  if (Status s = protocol::ValidateMessage(req, protocol::kControllerRequest); !s.ok()) {
    std::fprintf(stderr, "falcon-ctl validate: %s\n", s.message().c_str());
    return kExitUsage;
  }
  Result<std::string> entry = redis::XAdd(c, requests.value(), kCommandsMaxLen,
                                          {{std::string(protocol::kPayloadField), req.dump()}});
  if (!entry.ok()) return ReportRedisError(entry.status());
  if (!o.wait) {
    if (redis_options.json) std::printf("%s\n", json{{"v", kJsonSchema}, {"request", id}, {"sent", true}}.dump().c_str());
    else std::printf("# validation requested (%s); follow it with `falcon-ctl events --follow` or `falcon-ctl incidents`\n", id.c_str());
    return kExitOk;
  }
  const std::int64_t deadline = NowNs() + static_cast<std::int64_t>(redis_options.timeout_s * 1e9);
  std::string cursor = last.value();
  while (NowNs() < deadline) {
    Result<std::vector<redis::StreamRead>> r = redis::XRead(c, {{incidents.value(), cursor}}, 100, kAckPollMs);
    if (!r.ok()) return ReportRedisError(r.status());
    for (const redis::StreamRead& read : r.value()) {
      for (const redis::StreamEntry& e : read.entries) {
        cursor = e.id;
        std::optional<json> m = ValidateOrWarn(incidents.value() + " " + e.id,
                                               e.Field(std::string(protocol::kPayloadField)), protocol::kIncident);
        if (!m || (*m)["stage"] != "localisation" || !m->contains("detail") ||
            (*m)["detail"].value("request", "") != id) {
          continue;
        }
        const bool named = m->value("cause", "unknown") != "unknown";
        if (redis_options.json) std::printf("%s\n", json{{"v", kJsonSchema}, {"request", id}, {"localisation", *m}}.dump().c_str());
        else std::printf("%s: %s\n", (*m)["id"].get<std::string>().c_str(), (*m)["summary"].get<std::string>().c_str());
        return named ? kExitFound : kExitOk;
      }
    }
  }
  std::fprintf(stderr, "falcon-ctl validate: no localisation for %s within %.0f s (is falcon-controller running "
               "for job '%s'? a longer --timeout?)\n", id.c_str(), redis_options.timeout_s, redis_options.job.c_str());
  return kExitUnreachable;
}

CLI::App* AddSendCommand(CLI::App& app, CommandContext& ctx, const char* name, const char* help,
                         std::shared_ptr<SendOptions> o) {
  CLI::App* cmd = app.add_subcommand(name, help);
  AddRedisOptions(*cmd, o->redis);
  cmd->add_option("--agent", o->agents, "send only to this agent host (repeatable)");
  cmd->add_option("--ranks", o->ranks, "target only these ranks (default: all)")->delimiter(',');
  cmd->callback([o, &ctx, name] {
    try {
      ctx.exit_code = RunSend(*o);
    } catch (const std::exception& e) {  // JSON access on validated data: a bug if it throws
      std::fprintf(stderr, "falcon-ctl %s: internal error: %s\n", name, e.what());
      ctx.exit_code = kExitInternal;
    }
  });
  return cmd;
}

}  // namespace

Result<std::vector<AgentAnswer>> AskAgents(redis::RedisConnection& c, const RedisCliOptions& opts,
                                           const protocol::Command& command) {
  SendOptions o;
  o.redis = opts;
  o.command = command;
  Result<std::vector<std::string>> hosts = FindHosts(c, o);
  if (!hosts.ok()) return hosts.status();
  if (hosts.value().empty()) {
    return Status::NotFound("no agent registered for job '" + opts.job + "' (is falcon-agent running? --job?)");
  }
  Result<std::string> acks = protocol::FormatKey(protocol::kAcksStream, JobVars(opts.job));
  if (!acks.ok()) return acks.status();
  Result<std::string> last = LastId(c, acks.value());
  if (!last.ok()) return last.status();
  std::vector<Target> targets;
  for (const std::string& h : hosts.value()) targets.push_back({h, "", std::nullopt, {}});
  if (Status s = SendAll(c, o, targets); !s.ok()) return s;
  if (Status s = AwaitAcks(c, acks.value(), last.value(), opts.timeout_s, targets); !s.ok()) return s;
  std::vector<AgentAnswer> out;
  for (Target& t : targets) out.push_back({t.host, t.command_id, std::move(t.ack)});
  return out;
}

void AddAgentCommands(CLI::App& app, CommandContext& ctx) {
  auto mode = std::make_shared<SendOptions>();
  mode->command.type = std::string(protocol::kSetMode.type);
  CLI::App* m = AddSendCommand(app, ctx, "mode", "Set the shims' recording mode and await acks", mode);
  m->add_option("mode", mode->command.mode, "track | profile | sample | off")
      ->required()
      ->check(CLI::IsMember({"track", "profile", "sample", "off"}));
  m->add_option("--sample-every", mode->command.sample_every, "N for sample mode")
      ->check(daemon::FiniteRange(1, 1000000))
      ->capture_default_str();

  auto pause = std::make_shared<SendOptions>();
  pause->command.type = std::string(protocol::kPause.type);
  pause->command.max_pause_s = 60;
  CLI::App* p = AddSendCommand(app, ctx, "pause", "Trap the ranks at an iteration boundary and await acks", pause);
  CLI::Option* iter = p->add_option("--iteration", pause->command.at_iteration, "pause at this iteration boundary")
                          ->check(daemon::NonNegative());
  CLI::Option* next = p->add_flag("--next-iteration", pause->next_iteration,
                                  "pause at the first iteration boundary every rank can still reach after --lead "
                                  "(printed, and `iteration` in --json)");
  next->excludes(iter);
  CLI::Option* comm = p->add_option("--comm", pause->command.comm,
                                    "the cut: communicator id (16 hex digits) whose call --seq ranks stop before");
  CLI::Option* seq = p->add_option("--seq", pause->command.comm_seq,
                                   "the cut: call number (0-based, per communicator) of --comm")
                        ->check(daemon::NonNegative());
  comm->needs(seq);
  seq->needs(comm);
  p->add_option("--lead", pause->cut_lead_s,
                "with --iteration or --next-iteration: seconds every rank must still have before its stop")
      ->check(daemon::FiniteRange(0.0, 3600.0))
      ->capture_default_str();
  pause->plan_cut = [comm] { return comm->count() == 0; };
  pause->check = [po = pause.get(), iter, next, comm]() -> std::string {  // raw: pause owns the check
    if (iter->count() == 0 && next->count() == 0 && comm->count() == 0) {
      return "give --iteration N, --next-iteration, or --comm ID --seq N";
    }
    if (comm->count() > 0 && next->count() > 0) return "--next-iteration plans the cut itself: drop --comm and --seq";
    if (comm->count() == 0 && !po->ranks.empty()) {
      return std::string(next->count() > 0 ? "--next-iteration" : "--iteration") +
             " pauses every rank (a cut of some ranks only would stall the others): drop --ranks";
    }
    return "";
  };
  p->add_option("--max-pause", pause->command.max_pause_s, "seconds after which the ranks resume by themselves")
      ->check(daemon::FiniteRange(0.001, 3600.0))
      ->capture_default_str();

  auto resume = std::make_shared<SendOptions>();
  resume->command.type = std::string(protocol::kResume.type);
  AddSendCommand(app, ctx, "resume", "Release a pause and await acks", resume);

  auto val = std::make_shared<SendOptions>();
  val->command.type = std::string(protocol::kValidate.type);
  auto round = std::make_shared<RequestOptions>();
  CLI::App* v = AddSendCommand(app, ctx, "validate",
                               "Ask the controller for a validation round now (pause, GEMM, P2P passes, resume, "
                               "localise; --wait for its outcome); with --task, run one benchmark on paused "
                               "ranks through the agents instead",
                               val);
  v->add_option("--task", val->command.task,
                "gemm | vcomm_id | vcomm_join | p2p: one step through the agents (ranks must be paused). "
                "Transfers run on a validation communicator Falcon owns, never the job's: vcomm_id on one "
                "rank prints its id (blob), vcomm_join on every member joins it, then p2p")
      ->check(CLI::IsMember({"gemm", "p2p", "vcomm_id", "vcomm_join"}));
  v->add_flag("--wait", round->wait, "controller round: wait (up to --timeout) for its localisation and print it");
  v->add_option("--reason", round->reason, "controller round: why, for the incident record");
  v->callback([val, round, &ctx] {
    try {
      ctx.exit_code = val->command.task.empty() ? RunControllerValidate(val->redis, *round) : RunSend(*val);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "falcon-ctl validate: internal error: %s\n", e.what());
      ctx.exit_code = kExitInternal;
    }
  });
  v->add_option("--comm", val->command.comm, "p2p: the job's communicator (16 hex digits) the transfer stands for");
  v->add_option("--peer", val->command.peer, "p2p: peer rank in the validation communicator");
  v->add_option("--shift", val->command.shift,
                "p2p instead of --peer: validation rank r sends to r+shift");
  v->add_option("--peers", val->command.peers,
                "p2p instead of --peer: each of --ranks' peer in the validation communicator, in order")
      ->delimiter(',');
  v->add_option("--bytes", val->command.bytes, "p2p: message size in bytes; vcomm_join: buffer size");
  v->add_option("--blob", val->command.blob, "vcomm_join: the id vcomm_id printed (256 hex digits)");
  v->add_option("--vranks", val->command.vranks, "vcomm_join: members of the validation communicator");
  v->add_option("--vrank", val->command.vrank, "vcomm_join: the rank's rank in it");
  v->add_option("--vrank-each", val->command.vrank_each,
                "vcomm_join instead of --vrank: each of --ranks' rank in it, in order")
      ->delimiter(',');
  val->check = [o = val.get()]() -> std::string {  // raw: val owns the check
    for (const auto& [flag, list] : {std::pair{"--peers", &o->command.peers}, std::pair{"--vrank-each", &o->command.vrank_each}}) {
      if (!list->empty() && list->size() != o->ranks.size()) {
        return std::string(flag) + " needs one entry per --ranks entry (" + std::to_string(list->size()) + " for " +
               std::to_string(o->ranks.size()) + ")";
      }
    }
    return "";
  };
  v->add_option("--size", val->command.size, "gemm: matrix dimension");
  v->add_option("--dtype", val->command.dtype, "gemm: element type (fp32, bf16, fp16; default fp32)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  v->add_option("--repeats", val->command.repeats, "timed repetitions");
}

}  // namespace falcon::ctl
