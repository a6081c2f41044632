// The agent's config table and its loaders. See agent_config.h for the contract.
#include "daemon/agent/agent_config.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "daemon/common/config_file.h"

namespace falcon::agent {
namespace {

using T = ConfigEntry::Type;
using C = AgentConfig;

const ConfigEntry kTable[] = {
    {"job", T::kString, 1, 128, "job name: the {job} in every Redis key; segments whose FALCON_JOB "
     "is set and differs are not followed", &C::job},
    {"host", T::kString, 0, 128, "this node's name in keys and reports (empty: hostname)", &C::host},
    {"shm_dir", T::kString, 0, 4096, "where shim segments live (empty: $FALCON_SHM_DIR, else "
     "/dev/shm)", &C::shm_dir},
    {"poll_ms", T::kInt, 10, 10000, "period of segment discovery and record reads, ms", &C::poll_ms},
    {"read_batch", T::kInt, 256, 16777216, "records read per lane per poll at most", &C::read_batch},
    {"reap_orphans", T::kBool, 0, 1, "unlink segments of crashed processes after reading them",
     &C::reap_orphans},
    {"redis_host", T::kString, 1, 256, "Redis server address (with Redis Cluster: any node)", &C::redis_host},
    {"redis_port", T::kInt, 1, 65535, "Redis server port", &C::redis_port},
    {"redis_user", T::kString, 0, 128, "Redis ACL user (empty: the default user)", &C::redis_user},
    {"redis_password", T::kString, 0, 512, "Redis password (empty: no AUTH); prefer the "
     "environment or a 0600 config file", &C::redis_password, "", true},
    {"redis_db", T::kInt, 0, 65535, "Redis database number (SELECT)", &C::redis_db},
    {"redis_connect_timeout_ms", T::kInt, 10, 60000, "connect + AUTH timeout, ms",
     &C::redis_connect_timeout_ms},
    {"redis_timeout_ms", T::kInt, 10, 60000, "per-command timeout, ms", &C::redis_timeout_ms},
    {"redis_backoff_min_ms", T::kInt, 10, 60000, "first reconnect delay, ms (doubles)",
     &C::redis_backoff_min_ms},
    {"redis_backoff_max_ms", T::kInt, 10, 600000, "longest reconnect delay, ms",
     &C::redis_backoff_max_ms},
    {"heartbeat_ms", T::kInt, 100, 600000, "agent heartbeat period (the agent key, its ranks' beats), ms",
     &C::heartbeat_ms},
    {"key_ttl_s", T::kInt, 1, 86400, "TTL of rank and agent keys, s (> heartbeat; an unchanged rank key is rewritten two heartbeats before it)", &C::key_ttl_s},
    {"flush_ms", T::kInt, 10, 60000, "how often queued reports are sent to Redis, ms", &C::flush_ms},
    {"flush_batch", T::kInt, 1, 100000, "stream entries per Redis round trip at most",
     &C::flush_batch},
    {"profile_ms", T::kInt, 0, 3600000, "per-communicator profile period, ms (0: off)",
     &C::profile_ms},
    {"stream_maxlen", T::kInt, 0, 1e9, "messages kept per report stream, about (MAXLEN ~ of each packed entry: "
     "this / its messages; 0: unbounded)", &C::stream_maxlen},
    {"outbox_max", T::kInt, 16, 1e7, "reports held while Redis is unreachable; the oldest are "
     "dropped (and counted) beyond this", &C::outbox_max},
    {"command_block_ms", T::kInt, 10, 60000, "XREADGROUP BLOCK on the command stream, ms",
     &C::command_block_ms},
    {"command_poll_ms", T::kInt, 1, 1000, "while a command waits on the shims (pause, resume, "
     "validate, set_mode), how often their answers are checked, ms", &C::command_poll_ms},
    {"mode_ack_timeout_ms", T::kInt, 100, 600000, "set_mode is acked failed if a shim has not "
     "applied it by then, ms", &C::mode_ack_timeout_ms},
    {"trap_backend", T::kString, 1, 16, "who carries out pause / resume / validate: the shim's "
     "trap and benchmark executor, or nobody (acked unsupported)", &C::trap_backend,
     "shim|unsupported"},
    {"trap_wait_ms", T::kInt, 100, 3600000, "resume and validate are acked failed if the shims "
     "have not answered by then (unless the command has a deadline_ns), ms", &C::trap_wait_ms},
    {"metrics_address", T::kString, 1, 256, "address of the Prometheus endpoint",
     &C::metrics_address},
    {"metrics_port", T::kInt, 0, 65535, "port of /metrics and /healthz (0: off)", &C::metrics_port},
    {"log_level", T::kString, 0, 16, "log level", &C::log_level, "trace|debug|info|warn|error|off"},
    {"acf_threshold", T::kDouble, 0.5, 1.0, "match rate that locks an iteration period",
     &C::acf_threshold},
    {"tracker_window", T::kInt, 256, 10000000, "calls kept for period detection per rank",
     &C::tracker_window},
    {"min_change", T::kDouble, 0.01, 10.0, "detector: relative level change that is a fail-slow",
     &C::min_change},
    {"cp_threshold", T::kDouble, 0.5, 0.9999, "detector: change-point posterior to consider",
     &C::cp_threshold},
    {"rho_floor", T::kDouble, 0.0, 1.0, "detector: noise autocorrelation above which the "
     "verification margin widens (1: never)", &C::rho_floor},
    {"series_cycles", T::kInt, 2, 1024, "iterations kept to align iteration samples",
     &C::series_cycles},
    {"series_every_ms", T::kInt, 0, 60000, "iteration samples are extracted at most this often "
     "(of the calls' time; at least one new iteration each time), ms (0: at every new iteration)",
     &C::series_every_ms},
    {"history_calls", T::kInt, 256, 10000000, "recent calls kept per rank to start a new period "
     "lock's series", &C::history_calls},
    {"stall_check_ms", T::kInt, 0, 600000, "how often each rank is checked for a stall (no ordered "
     "NCCL call for longer than max(stall_floor_s, stall_factor x its iteration time) with work "
     "outstanding in NCCL), ms (0: off)", &C::stall_check_ms},
    {"stall_floor_s", T::kDouble, 0.1, 86400, "a stall's bound is never shorter than this, s",
     &C::stall_floor_s},
    {"stall_factor", T::kDouble, 1.0, 1000, "a stall's bound in iteration times of the rank",
     &C::stall_factor},
    {"stall_startup_s", T::kDouble, 0, 86400, "a stall's bound while the rank has no iteration time yet "
     "(communicator setup, the first iterations), s", &C::stall_startup_s},
    {"signature_ms", T::kInt, 0, 60000, "how often each rank's newly issued collectives are sent "
     "for mismatch detection (call_signatures), ms (0: off)", &C::signature_ms},
    {"signature_full_seqs", T::kInt, 0, 9.2e18, "each communicator's calls below this comm_seq are sent "
     "one by one (as runs); later ones as a digest per block of 1024, and in full only where the "
     "communicator stops (a hang) or is idle between sends (a mismatch in a digest is named by "
     "block, not by call). Set it very large to send every call (more traffic and agent CPU)",
     &C::signature_full_seqs},
};

std::string Trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t\r");
  return std::string(s.substr(b, e - b + 1));
}

// The value as ParseConfigLines (daemon/common/config_file.h) reads it back: quoted when it holds a '#' or starts with a quote.
std::string QuoteForFile(const std::string& v) {
  if (v.find('#') == std::string::npos && (v.empty() || v.front() != '"')) return v;
  std::string out = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

Status Bad(const ConfigEntry& e, std::string_view origin, const std::string& why) {
  return Status::InvalidArgument(std::string(origin) + ": " + std::string(e.name) + ": " + why);
}

bool InChoices(std::string_view v, std::string_view choices) {
  std::string_view rest = choices;
  for (;;) {
    const auto bar = rest.find('|');
    if (rest.substr(0, bar) == v) return true;
    if (bar == std::string_view::npos) return false;
    rest.remove_prefix(bar + 1);
  }
}

std::string FormatDouble(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

}  // namespace

std::span<const ConfigEntry> ConfigTable() { return kTable; }

const ConfigEntry* FindEntry(std::string_view name) {
  for (const ConfigEntry& e : kTable) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

std::string EnvName(std::string_view name) {
  std::string s = "FALCON_AGENT_";
  for (char c : name) s.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  return s;
}

std::string FlagName(std::string_view name) {
  std::string s = "--";
  for (char c : name) s.push_back(c == '_' ? '-' : c);
  return s;
}

Status SetFromText(AgentConfig& config, const ConfigEntry& e, std::string_view text,
                   std::string_view origin) {
  const std::string v = Trim(text);
  switch (e.type) {
    case T::kString: {
      // No option holds a control character; one would break the file --print-config writes
      // (a newline starts another line) and the log lines that quote the value.
      for (std::size_t i = 0; i < v.size(); ++i) {
        const auto c = static_cast<unsigned char>(v[i]);
        if (c < 0x20 || c == 0x7f) {
          static constexpr char kHex[] = "0123456789abcdef";
          return Bad(e, origin, std::string("control character 0x") + kHex[c >> 4] + kHex[c & 15] + " at offset " +
                                    std::to_string(i) + " is not allowed");
        }
      }
      if (static_cast<double>(v.size()) < e.min || static_cast<double>(v.size()) > e.max) {
        return Bad(e, origin, "length must be " + FormatDouble(e.min) + ".." + FormatDouble(e.max));
      }
      if (!e.choices.empty() && !InChoices(v, e.choices)) {
        return Bad(e, origin, "'" + v + "' is not one of " + std::string(e.choices));
      }
      config.*std::get<std::string AgentConfig::*>(e.member) = v;
      return Status::Ok();
    }
    case T::kBool: {
      bool b = false;
      if (v == "1" || v == "true" || v == "yes" || v == "on") b = true;
      else if (v == "0" || v == "false" || v == "no" || v == "off") b = false;
      else return Bad(e, origin, "'" + v + "' is not a boolean (true/false)");
      config.*std::get<bool AgentConfig::*>(e.member) = b;
      return Status::Ok();
    }
    case T::kInt:
    case T::kDouble: {
      char* end = nullptr;
      errno = 0;
      const double d = std::strtod(v.c_str(), &end);
      if (v.empty() || end != v.c_str() + v.size() || errno == ERANGE || !std::isfinite(d)) {
        return Bad(e, origin, "'" + v + "' is not a number");
      }
      if (e.type == T::kInt && d != std::floor(d)) return Bad(e, origin, "'" + v + "' is not an integer");
      if (d < e.min || d > e.max) {
        return Bad(e, origin, v + " out of range " + FormatDouble(e.min) + ".." + FormatDouble(e.max));
      }
      if (e.type == T::kInt) {
        config.*std::get<std::int64_t AgentConfig::*>(e.member) = static_cast<std::int64_t>(d);
      } else {
        config.*std::get<double AgentConfig::*>(e.member) = d;
      }
      return Status::Ok();
    }
  }
  return Status::Internal("unknown config type");
}

std::string ValueText(const AgentConfig& config, const ConfigEntry& e) {
  switch (e.type) {
    case T::kString: {
      const std::string& s = config.*std::get<std::string AgentConfig::*>(e.member);
      return e.secret && !s.empty() ? "<set>" : s;
    }
    case T::kBool: return config.*std::get<bool AgentConfig::*>(e.member) ? "true" : "false";
    case T::kInt: return std::to_string(config.*std::get<std::int64_t AgentConfig::*>(e.member));
    case T::kDouble: return FormatDouble(config.*std::get<double AgentConfig::*>(e.member));
  }
  return {};
}

Status ApplyConfigText(AgentConfig& config, std::string_view text, std::string_view file_name,
                       std::vector<std::string>* secrets_set) {
  Result<std::vector<daemon::ConfigLine>> lines = daemon::ParseConfigLines(text, file_name);
  if (!lines.ok()) return lines.status();
  for (const daemon::ConfigLine& line : lines.value()) {
    const std::string origin = std::string(file_name) + ":" + std::to_string(line.line);
    const ConfigEntry* e = FindEntry(line.name);
    if (e == nullptr) return Status::InvalidArgument(origin + ": unknown option '" + line.name + "'");
    Status s = SetFromText(config, *e, line.value, origin);
    if (!s.ok()) return s;
    if (e->secret && secrets_set != nullptr && !Trim(line.value).empty()) secrets_set->emplace_back(e->name);
  }
  return Status::Ok();
}

Status LoadConfigFile(AgentConfig& config, const std::string& path, std::vector<std::string>* warnings) {
  Result<daemon::ConfigFileText> file = daemon::ReadConfigFile(path);
  if (!file.ok()) return file.status();
  std::vector<std::string> secrets;
  if (Status s = ApplyConfigText(config, file.value().text, path, &secrets); !s.ok()) return s;
  for (const std::string& name : secrets) {
    if (auto w = daemon::ExposedSecretWarning(path, file.value().mode, name); w && warnings != nullptr) {
      warnings->push_back(std::move(*w));
    }
  }
  return Status::Ok();
}

Status ApplyEnvironment(AgentConfig& config,
                        const std::function<const char*(const char*)>& getenv_fn) {
  for (const ConfigEntry& e : kTable) {
    const std::string env = EnvName(e.name);
    const char* v = getenv_fn(env.c_str());
    if (v == nullptr) continue;
    Status s = SetFromText(config, e, v, env);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

Status ApplyFlags(AgentConfig& config, const std::map<std::string, std::string>& flags) {
  for (const auto& [name, value] : flags) {
    const ConfigEntry* e = FindEntry(name);
    if (e == nullptr) return Status::InvalidArgument("unknown option " + name);
    Status s = SetFromText(config, *e, value, FlagName(name));
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

Status CheckConfig(const AgentConfig& c) {
  if (c.redis_backoff_min_ms > c.redis_backoff_max_ms) {
    return Status::InvalidArgument("redis_backoff_min_ms must be <= redis_backoff_max_ms");
  }
  if (c.key_ttl_s * 1000 <= c.heartbeat_ms) {
    return Status::InvalidArgument("key_ttl_s must exceed heartbeat_ms, or keys expire between "
                                   "heartbeats");
  }
  return Status::Ok();
}

std::string RenderConfig(const AgentConfig& config, ConfigStyle style) {
  const bool with_docs = style == ConfigStyle::kDocumented;
  std::ostringstream o;
  const AgentConfig defaults;
  for (const ConfigEntry& e : kTable) {
    if (with_docs) {
      static constexpr const char* kTypeNames[] = {"string", "integer", "number", "boolean"};
      o << "\n# " << e.meaning << "\n# " << kTypeNames[static_cast<int>(e.type)];
      if (!e.choices.empty()) o << ", one of " << e.choices;
      else if (e.type == T::kInt || e.type == T::kDouble) o << ", " << FormatDouble(e.min) << ".." << FormatDouble(e.max);
      o << "; default: " << (ValueText(defaults, e).empty() ? "(empty)" : ValueText(defaults, e))
        << "; env " << EnvName(e.name) << ", flag " << FlagName(e.name) << "\n";
    }
    // Secrets are shown commented out: "<set>" or nothing, never the value.
    o << (e.secret ? "# " : "") << e.name << " = " << QuoteForFile(ValueText(config, e)) << "\n";
  }
  return o.str();
}

}  // namespace falcon::agent
