// The controller's config table: see controller_config.h.
#include "daemon/controller/controller_config.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <type_traits>

#include "daemon/common/cli_checks.h"
#include "daemon/common/config_file.h"
#include "daemon/protocol/keys.h"

namespace falcon::controller {
namespace {

std::string EnvName(const std::string& name) {
  std::string e = "FALCON_CONTROLLER_";
  for (char c : name) e += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return e;
}

template <typename T>
CLI::Option* Entry(CLI::App& app, const std::string& name, T& value, const std::string& meaning) {
  CLI::Option* o = app.add_option("--" + name, value, meaning)->envname(EnvName(name))->capture_default_str();
  if constexpr (std::is_same_v<T, std::string>) o->check(daemon::PlainText());
  if constexpr (std::is_same_v<T, bool>) o->check(daemon::Boolean());
  return o;
}

}  // namespace

void AddConfigOptions(CLI::App& app, ControllerConfig& c) {
  Entry(app, "job", c.job, "job name: the {job} in every Redis key")->check(CLI::Validator(
      [](std::string& v) {
        return protocol::ValidKeyPart(v) ? std::string() : "1..128 characters of [A-Za-z0-9._-]";
      },
      "NAME"));
  Entry(app, "host", c.host, "this controller's node name in its state (empty: hostname)")
      ->check(CLI::Validator(
          [](std::string& v) {
            return v.empty() || protocol::ValidKeyPart(v) ? std::string() : "1..128 characters of [A-Za-z0-9._-]";
          },
          "NAME"));
  Entry(app, "redis-host", c.redis.host, "Redis server address (with Redis Cluster: any node)");
  Entry(app, "redis-port", c.redis.port, "Redis server port")->check(daemon::FiniteRange(1, 65535));
  Entry(app, "redis-user", c.redis.user, "Redis ACL user (empty: the default user)");
  app.add_option("--redis-password", c.redis.password,
                 "Redis password (empty: no AUTH); prefer FALCON_CONTROLLER_REDIS_PASSWORD or a 0600 config file")
      ->envname(EnvName("redis-password"))
      ->check(daemon::PlainText());
  Entry(app, "redis-db", c.redis.db, "Redis database number")->check(daemon::FiniteRange(0, 65535));
  Entry(app, "redis-timeout-ms", c.redis.command_timeout_ms, "per-command timeout, ms")->check(daemon::FiniteRange(10, 60000));
  Entry(app, "redis-connect-timeout-ms", c.redis.connect_timeout_ms, "connect + AUTH timeout, ms")
      ->check(daemon::FiniteRange(10, 60000));
  Entry(app, "redis-backoff-max-ms", c.redis.backoff_max_ms, "longest reconnect delay, ms")
      ->check(daemon::FiniteRange(10, 600000));
  Entry(app, "log-level", c.log_level, "log level")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  Entry(app, "tick-ms", c.tick_ms, "longest wait for new stream entries per loop turn, ms")->check(daemon::FiniteRange(10, 10000));
  Entry(app, "metrics-address", c.metrics_address, "address of the Prometheus endpoint")->check(daemon::PlainText());
  Entry(app, "metrics-port", c.metrics_port, "port of /metrics and /healthz (0: off; one controller per job, "
        "so give each its own)")->check(daemon::FiniteRange(0, 65535));
  Entry(app, "view-ms", c.view_ms, "how often rank and agent keys are re-read, ms (at least 4x the last re-read's duration apart)")->check(daemon::FiniteRange(100, 600000));
  Entry(app, "view-keys-per-s", c.view_keys_per_s, "rank and agent keys taken into the view per second at most (a rank "
        "key read again or its content held): the re-reads are spaced so the view's Redis load and rebuilding stay under it")->check(daemon::FiniteRange(100, 10000000));
  Entry(app, "heartbeat-ms", c.heartbeat_ms, "state written at least this often, ms")->check(daemon::FiniteRange(100, 600000));
  Entry(app, "profile-wait-s", c.profile_wait_s, "longest wait for a full profile window from every rank, s")
      ->check(daemon::FiniteRange(0.1, 3600.0));
  Entry(app, "retry-after-s", c.retry_after_s, "retry a validation that named nobody after this, s (also the first wait to redo a round whose outcome Redis refused, doubling)")
      ->check(daemon::FiniteRange(0.0, 86400.0));
  Entry(app, "max-attempts", c.max_attempts, "validation rounds per incident at most")->check(daemon::FiniteRange(1, 100));
  Entry(app, "min-slow-fraction", c.min_slow_fraction, "open an incident when this fraction of live ranks is slow")
      ->check(daemon::FiniteRange(0.0, 1.0));
  Entry(app, "suspicious-ratio", c.suspicious_ratio, "a communicator slower than this x its class median is suspicious; while mitigating, a new slowdown is re-checked only above this x the best iteration time since the last round")
      ->check(daemon::FiniteRange(1.0, 100.0));
  Entry(app, "gemm-ratio", c.gemm_ratio, "a GEMM slower than this x the median names its GPU")->check(daemon::FiniteRange(1.0, 100.0));
  Entry(app, "link-ratio", c.link_ratio, "a transfer slower than this x its baselines names its link")
      ->check(daemon::FiniteRange(1.0, 100.0));
  Entry(app, "gemm-batch", c.gemm_batch, "ranks per GEMM step (0: all at once)")->check(daemon::FiniteRange(0, 1 << 24));
  Entry(app, "tree", c.tree, "also test the tree plan's links");
  Entry(app, "hang-wait-s", c.hang_wait_s, "when agents report stalled ranks: longest wait for every agent's "
        "progress before the job-wide hang diagnosis, s")
      ->check(daemon::FiniteRange(0.1, 600.0));
  Entry(app, "hang-repeat-s", c.hang_repeat_s, "diagnose a hang that stays open again after this, s")
      ->check(daemon::FiniteRange(1.0, 86400.0));
  Entry(app, "mismatch-grace-s", c.mismatch_grace_s, "a collective issued differently by some members is "
        "raised when every member reported it, or this long after the difference was seen, s")
      ->check(daemon::FiniteRange(0.0, 600.0));
  ValidationSettings& v = c.validation;
  Entry(app, "pause-lead-s", v.pause_lead_s, "place the pause cut this far ahead, s")->check(daemon::FiniteRange(0.01, 600.0));
  Entry(app, "max-pause-s", v.max_pause_s, "the shims resume by themselves after this, s")->check(daemon::FiniteRange(1.0, 3600.0));
  Entry(app, "pause-attempts", v.pause_attempts, "cuts tried per validation when ranks passed them")->check(daemon::FiniteRange(1, 20));
  Entry(app, "pause-iteration-tries", v.cut_iteration_tries,
        "stop the lowest rank at one of the next this many iteration starts it can reach, where little device "
        "work is queued behind the cut (0: the earliest consistent cut)")
      ->check(daemon::FiniteRange(0, 100));
  Entry(app, "ack-timeout-s", v.ack_timeout_s, "longest wait for an agent's ack, s")->check(daemon::FiniteRange(0.1, 3600.0));
  Entry(app, "gemm-size", v.gemm_size, "GEMM validation matrix dimension")->check(daemon::FiniteRange(1, 8192));
  Entry(app, "gemm-dtype", v.gemm_dtype, "GEMM validation element type: fp32 (cuBLAS SGEMM), bf16 or fp16 "
        "(tensor cores, fp32 accumulation); a rank without a GPU runs fp32 only")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  Entry(app, "gemm-repeats", v.gemm_repeats, "timed GEMM repetitions")->check(daemon::FiniteRange(1, 1000));
  Entry(app, "p2p-bytes", v.p2p_bytes, "bytes per P2P validation transfer")->check(daemon::FiniteRange(1, 1 << 30));
  // Parsed as its name and converted in a callback: a transformer would store the enum's number
  // as the option's result, and --print-config would write "statistic=1".
  app.add_option_function<std::string>(
         "--statistic",
         [&v](const std::string& name) { v.statistic = name == "min" ? Statistic::kMin : Statistic::kMedian; },
         "which repetition time stands for a benchmark: min (robust to interference) or median")
      ->envname(EnvName("statistic"))
      ->check(CLI::IsMember({"min", "median"}))
      ->default_str(v.statistic == Statistic::kMin ? "min" : "median");
  Entry(app, "p2p-repeats", v.p2p_repeats, "timed P2P repetitions")->check(daemon::FiniteRange(1, 1000));
  Entry(app, "remeasure", v.remeasure, "before resuming, measure again the steps behind ambiguous findings "
        "(several culprits, a NIC slow to only some peers, a link slow in one transfer only, a finding below "
        "remeasure-below) and keep each measurement's lower value");
  Entry(app, "remeasure-alone", v.remeasure_alone, "re-measure a suspect exchange in a step of its own, scaled by "
        "a reference exchange measured alone too, so that what its step-mates did to it is left out");
  Entry(app, "remeasure-alone-max", v.remeasure_alone_max, "suspect exchanges a round measures alone at most; "
        "with more, their steps run again instead")
      ->check(daemon::FiniteRange(0, 1024));
  Entry(app, "gemm-first", v.gemm_first, "a round that sweeps every communicator (the profile singled none out) "
        "skips its transfers once GEMM names a slow GPU cleanly, keeping the pause short");
  Entry(app, "remeasure-below", v.remeasure_below, "a slow GPU, link or NIC less than this x its baseline is "
        "measured again before it is named (0: only the ambiguous cases of remeasure)")
      ->check(daemon::FiniteRange(0.0, 100.0));
  MitigationSettings& m = c.mitigation;
  Entry(app, "mitigation", m.mode, "decisions: off (none), advise (publish plans), act (also hand them to the "
        "frameworks through the agents and shims)")
      ->check(CLI::IsMember({"off", "advise", "act"}));
  Entry(app, "s2-overhead-s", m.overheads.rebalance_s, "S2 re-balance micro-batches: lost training it costs, s, until the job reports a measured cost (falconReportCost)")
      ->check(daemon::FiniteRange(0.0, 1e9));
  Entry(app, "s3-overhead-s", m.overheads.topology_s, "S3 re-place nodes: lost training it costs, s, until the job reports a measured cost (falconReportCost)")
      ->check(daemon::FiniteRange(0.0, 1e9));
  Entry(app, "s4-overhead-s", m.overheads.restart_s, "S4 checkpoint-restart: lost training it costs, s, until the job reports a measured cost (falconReportCost)")
      ->check(daemon::FiniteRange(0.0, 1e9));
  Entry(app, "pipeline-overhead-s", m.overheads.pipeline_s, "pipeline adaptation (new warm-up counts for a slow "
        "link between pipeline stages): lost training it costs, s (a switch at an iteration boundary, no pause)")
      ->check(daemon::FiniteRange(0.0, 1e9));
  Entry(app, "pipeline-activation-limit", m.pipeline_activation_limit, "micro-batches' activations a pipeline "
        "stage may hold under adapted warm-up counts (0: the pipeline depth, what 1F1B's first stage holds)")
      ->check(daemon::FiniteRange(0, 65536));
  Entry(app, "micro-batches", m.micro_batches, "micro-batches per DP replica per iteration in the job's own "
        "schedule (0: unknown, no S2 or pipeline plans)")
      ->check(daemon::FiniteRange(0, 4096));
  Entry(app, "job-shape", m.job_shape, "TPxDPxPP, e.g. 2x4x2 (empty: inferred from the communicators)");
  Entry(app, "spare-nodes", m.spare_nodes, "idle nodes an S4 restart may use, numbered after the job's")
      ->check(daemon::FiniteRange(0, 65535));
  Entry(app, "plan-sample-s", m.sample_s, "feed the mitigation planner the iteration time this often, s")
      ->check(daemon::FiniteRange(0.05, 3600.0));
  Entry(app, "recheck-s", m.recheck_s, "while S2 or adapted warm-up counts hold (act mode), re-validate the culprits this often to see "
        "whether the fault is gone (doubling while they stay slow; counted from the recovery watch's last sight of the "
        "fault where it sees it), s")
      ->check(daemon::FiniteRange(1.0, 86400.0));
  Entry(app, "recovery-watch", m.recovery_watch, "while re-balanced micro-batches hold for slow GPUs (act mode), "
        "profile each culprit's busiest small group and undo the plan as soon as its peers stop waiting for it "
        "(0: the recheck-s timer alone)");
  Entry(app, "incidents-maxlen", c.incidents_maxlen, "XADD MAXLEN ~ of the incidents stream (0: unbounded)")
      ->check(daemon::FiniteRange(0, 1099511627776.0));
  Entry(app, "stream-retention-s", c.stream_retention_s,
        "the iterations, signatures and profiles streams keep this much before the entries the controller has "
        "read and saved; older ones are trimmed (XTRIM MINID ~, Redis 6.2 or later), s (0: never, the agents' "
        "stream_maxlen alone bounds them)")
      ->check(daemon::FiniteRange(0, 31536000.0));
}

Status ApplyConfigText(CLI::App& app, std::string_view text, std::string_view file_name,
                       std::vector<std::string>* secrets_set) {
  Result<std::vector<daemon::ConfigLine>> lines = daemon::ParseConfigLines(text, file_name);
  if (!lines.ok()) return lines.status();
  // Options the command line or the environment set keep their value: noted before any is touched.
  std::set<const CLI::Option*> given;
  for (const CLI::Option* o : app.get_options()) {
    if (o->count() > 0) given.insert(o);
  }
  for (const daemon::ConfigLine& line : lines.value()) {
    const std::string origin = std::string(file_name) + ":" + std::to_string(line.line);
    CLI::Option* o = line.name.front() == '-' ? nullptr : app.get_option_no_throw("--" + line.name);
    if (o == nullptr) {
      std::string hint;
      std::string dashed = line.name;
      std::replace(dashed.begin(), dashed.end(), '_', '-');
      if (dashed != line.name && app.get_option_no_throw("--" + dashed) != nullptr) {
        hint = " (falcon-controller's options are written with dashes: " + dashed + ")";
      }
      return Status::InvalidArgument(origin + ": unknown option '" + line.name + "'" + hint);
    }
    if (!o->get_configurable()) {
      return Status::InvalidArgument(origin + ": option '" + line.name + "' cannot be set in a config file");
    }
    if (given.count(o) != 0) continue;  // a flag or FALCON_CONTROLLER_* wins
    try {
      o->clear();  // a name given twice: the last line wins, as in the agent's files
      o->add_result(line.value);
      o->run_callback();  // validates (bounds, finiteness, choices) and stores
    } catch (const CLI::Error& e) {
      return Status::InvalidArgument(origin + ": " + line.name + ": " + e.what());
    }
    if (line.name == "redis-password" && secrets_set != nullptr && !line.value.empty()) {
      secrets_set->push_back(line.name);
    }
  }
  return Status::Ok();
}

Status LoadConfigFile(CLI::App& app, const std::string& path, std::vector<std::string>* warnings) {
  Result<daemon::ConfigFileText> file = daemon::ReadConfigFile(path);
  if (!file.ok()) return file.status();
  std::vector<std::string> secrets;
  if (Status s = ApplyConfigText(app, file.value().text, path, &secrets); !s.ok()) return s;
  for (const std::string& name : secrets) {
    if (auto w = daemon::ExposedSecretWarning(path, file.value().mode, name); w && warnings != nullptr) {
      warnings->push_back(std::move(*w));
    }
  }
  return Status::Ok();
}

std::string RenderConfig(const CLI::App& app, ConfigStyle style) {
  const bool with_descriptions = style == ConfigStyle::kDocumented;
  auto value_text = [](const std::string& v) {
    double number = 0;
    const bool bare = v == "true" || v == "false" ||
                      (v.rfind("0x", 0) != 0 && v.rfind("0X", 0) != 0 && CLI::detail::lexical_cast(v, number));
    if (bare && !v.empty()) return CLI::detail::trim_copy(v);  // read back trimmed anyway
    std::string out = "\"";
    for (const char c : v) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    return out + "\"";
  };
  auto comment = [](const std::string& text) {
    std::string out = "# ";
    for (const char c : text) out += c == '\n' ? std::string("\n# ") : std::string(1, c);
    return out + "\n";
  };
  std::string out;
  if (with_descriptions && !app.get_description().empty()) out += comment(app.get_description());
  for (const CLI::Option* o : app.get_options()) {
    if (!o->get_configurable()) continue;
    const std::string name = o->get_single_name();
    std::vector<std::string> results = o->reduced_results();
    std::string value = results.empty() ? o->get_default_str() : results.front();
    if (name == "redis-password") value = value.empty() ? "" : "<set>";  // never the password
    if (with_descriptions && !o->get_description().empty()) out += "\n" + comment(o->get_description());
    out += name + "=" + value_text(value) + "\n";
  }
  return out;
}

Status CheckConfig(const ControllerConfig& c) {
  if (c.validation.max_pause_s <= c.validation.pause_lead_s) {
    return Status::InvalidArgument("max-pause-s must exceed pause-lead-s");
  }
  if (c.heartbeat_ms < c.tick_ms) return Status::InvalidArgument("heartbeat-ms must be >= tick-ms");
  if (!c.mitigation.job_shape.empty()) {
    if (Result<analyzer::JobShape> s = ParseJobShape(c.mitigation.job_shape); !s.ok()) return s.status();
  }
  return Status::Ok();
}

}  // namespace falcon::controller
