// falcon-agent's configuration: one typed table (STYLE rule 11). Each entry has a name, a type,
// bounds, a meaning and a member of AgentConfig; defaults are AgentConfig's initialisers (one
// place). Sources, later ones winning: defaults < config file (`name = value` lines, `#`
// comments, "double-quoted" values that hold a '#'; unknown names, bad values, binary files and
// anything but a regular file of at most 1 MiB are refused) < environment (FALCON_AGENT_<NAME>)
// < command-line flags (--name-with-dashes).
// config/falcon-agent.conf is RenderConfig() of the defaults (a test keeps them in sync).
// Thread-safety: the table is immutable; functions are thread-compatible on their AgentConfig.
// Must never: read the environment itself (the caller passes a lookup), or print the password.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "falcon/status.h"

namespace falcon::agent {

struct AgentConfig {
  std::string job = "default";
  std::string host;      // empty: gethostname()
  std::string shm_dir;   // empty: $FALCON_SHM_DIR, else /dev/shm
  std::int64_t poll_ms = 100;
  std::int64_t read_batch = 65536;
  bool reap_orphans = false;
  std::string redis_host = "127.0.0.1";
  std::int64_t redis_port = 6379;
  std::string redis_user;
  std::string redis_password;
  std::int64_t redis_db = 0;
  std::int64_t redis_connect_timeout_ms = 1000;
  std::int64_t redis_timeout_ms = 2000;
  std::int64_t redis_backoff_min_ms = 100;
  std::int64_t redis_backoff_max_ms = 5000;
  std::int64_t heartbeat_ms = 2000;
  std::int64_t key_ttl_s = 10;
  std::int64_t flush_ms = 500;
  std::int64_t flush_batch = 512;
  std::int64_t profile_ms = 10000;
  std::int64_t stream_maxlen = 100000;
  std::int64_t outbox_max = 100000;
  std::int64_t command_block_ms = 1000;
  std::int64_t command_poll_ms = 2;
  std::int64_t mode_ack_timeout_ms = 3000;
  std::string trap_backend = "shim";
  std::int64_t trap_wait_ms = 30000;
  std::string metrics_address = "127.0.0.1";
  std::int64_t metrics_port = 9464;
  std::string log_level = "info";
  double acf_threshold = 0.95;
  std::int64_t tracker_window = 100000;
  double min_change = 0.10;
  double cp_threshold = 0.9;
  double rho_floor = 0.1;
  std::int64_t series_cycles = 16;
  std::int64_t series_every_ms = 1000;
  std::int64_t history_calls = 16384;
  std::int64_t stall_check_ms = 1000;
  double stall_floor_s = 5.0;
  double stall_factor = 4.0;
  double stall_startup_s = 120.0;
  std::int64_t signature_ms = 200;
  std::int64_t signature_full_seqs = 4096;
};

struct ConfigEntry {
  enum class Type { kString, kInt, kDouble, kBool };
  std::string_view name;
  Type type;
  double min;
  double max;
  std::string_view meaning;
  std::variant<std::string AgentConfig::*, std::int64_t AgentConfig::*, double AgentConfig::*,
               bool AgentConfig::*>
      member;
  std::string_view choices = {};  // kString: '|'-separated allowed values, "" = any
  bool secret = false;            // never printed
};

std::span<const ConfigEntry> ConfigTable();
const ConfigEntry* FindEntry(std::string_view name);

// Sets one entry from text; `origin` ("file:3", "FALCON_AGENT_X", "--x") names the source.
[[nodiscard]] Status SetFromText(AgentConfig& config, const ConfigEntry& entry,
                                 std::string_view text, std::string_view origin);
// The current value as text (secret values as "<set>" / "").
std::string ValueText(const AgentConfig& config, const ConfigEntry& entry);

// `secrets_set`, when given, receives the names of the secret entries the text set non-empty.
[[nodiscard]] Status ApplyConfigText(AgentConfig& config, std::string_view text,
                                     std::string_view file_name,
                                     std::vector<std::string>* secrets_set = nullptr);
// Reads `path` as both daemons read config files (daemon/common/config_file.h: a regular text
// file of at most 1 MiB) and applies it. `warnings`, when given, receives what the caller should
// log: a file that sets redis_password and that group or others may read.
[[nodiscard]] Status LoadConfigFile(AgentConfig& config, const std::string& path,
                                    std::vector<std::string>* warnings = nullptr);
// FALCON_AGENT_<NAME> for every entry, via `getenv_fn` (returns nullptr when unset).
[[nodiscard]] Status ApplyEnvironment(AgentConfig& config,
                                      const std::function<const char*(const char*)>& getenv_fn);
// Flag values as given on the command line, by entry name.
[[nodiscard]] Status ApplyFlags(AgentConfig& config, const std::map<std::string, std::string>& flags);
// Cross-field checks (backoff_min <= backoff_max, ...).
[[nodiscard]] Status CheckConfig(const AgentConfig& config);

std::string EnvName(std::string_view name);   // FALCON_AGENT_POLL_MS
std::string FlagName(std::string_view name);  // --poll-ms

enum class ConfigStyle { kValues, kDocumented };
// The config in file syntax; kDocumented adds each entry's meaning, type, bounds and default.
std::string RenderConfig(const AgentConfig& config, ConfigStyle style);

}  // namespace falcon::agent
