// The controller's configuration: one typed table (CLI11 options with bounds, defaults and
// meanings), read from a config file (--config or FALCON_CONTROLLER_CONFIG, `name = value`
// lines; config/falcon-controller.conf documents every entry), FALCON_CONTROLLER_<NAME>
// variables and flags (flags win). The file is read and checked as the agent's is (see
// LoadConfigFile). `--print-config` prints the effective values in file syntax.
// Thread-safety: a value type. Must never: print the password.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/controller/mitigation.h"
#include "daemon/controller/validation_run.h"
#include "daemon/redis/redis_options.h"
#include "falcon/status.h"

namespace CLI {
class App;
}

namespace falcon::controller {

struct ControllerConfig {
  std::string job = "default";
  std::string host;  // empty: hostname
  redis::RedisOptions redis;
  std::string log_level = "info";
  int tick_ms = 200;          // longest wait for new stream entries per loop turn
  int view_ms = 1000;         // how often rank and agent keys are re-read
  // Rank and agent keys re-read per second at most, averaged over the re-reads: the view's share
  // of Redis's commands, whatever the controller's own speed (a faster re-read is no reason to
  // ask Redis more often).
  int view_keys_per_s = 8000;
  // /metrics and /healthz. Off by default: one controller runs per job, so several share a
  // host and no fixed port can be everyone's (9465 by convention for one).
  std::string metrics_address = "127.0.0.1";
  int metrics_port = 0;
  int heartbeat_ms = 2000;    // state written at least this often
  double profile_wait_s = 30;  // longest wait for a profile window from every rank
  double retry_after_s = 30;   // a validation that named nobody is retried after this...
  int max_attempts = 3;        // ... this many times per incident
  // An incident opens when at least this fraction of the live ranks is slow: in synchronous
  // training a fail-slow slows every rank, so agreement confirms it; a lone rank's alarm is local
  // noise (its process was descheduled, its node was busy).
  double min_slow_fraction = 0.5;
  double suspicious_ratio = 1.1;
  double gemm_ratio = 1.2;
  double link_ratio = 1.2;
  std::int64_t gemm_batch = 0;  // ranks per GEMM step; 0 = all at once
  bool tree = true;
  ValidationSettings validation;
  MitigationSettings mitigation;
  std::int64_t incidents_maxlen = 10000;
  // The busy report streams (iterations, signatures, profiles) keep this much behind what the
  // controller has read and saved; older entries are trimmed (0: the agents' stream_maxlen alone).
  double stream_retention_s = 30;
  // Hang diagnosis (hang_stage.h): how long to wait for the agents' progress, how often to
  // diagnose an episode that stays open.
  double hang_wait_s = 5;
  double hang_repeat_s = 30;
  // Mismatch detection (mismatch_stage.h): how long a difference waits for the members not
  // heard from yet before it is decided.
  double mismatch_grace_s = 0.3;
};

// Adds every entry as an option (with its environment variable) to `app`. Numbers must be finite
// and within their bounds, text free of control characters, from every source.
void AddConfigOptions(CLI::App& app, ControllerConfig& config);
// Applies config file text (daemon/common/config_file.h's syntax, which the agent's files share;
// --print-config writes it) to the options AddConfigOptions added, after app.parse() took the
// flags and FALCON_CONTROLLER_* variables: an option those set keeps their value. Refused with
// InvalidArgument "<file>:<line>: ...": a name that is not a controller option (unknown, or an
// agent's, which the controller's dashes do not match), an option a file may not set (config,
// print-config, help), a value its option refuses (the flag's bounds and checks: nan and inf
// too). A name given twice: the last wins. `secrets_set` receives "redis-password" when the text
// sets it non-empty.
[[nodiscard]] Status ApplyConfigText(CLI::App& app, std::string_view text, std::string_view file_name,
                                     std::vector<std::string>* secrets_set = nullptr);
// Reads `path` as both daemons read config files (a regular text file of at most 1 MiB) and
// applies it; `warnings` receives what to log (a file that sets the password and that group or
// others may read).
[[nodiscard]] Status LoadConfigFile(CLI::App& app, const std::string& path,
                                    std::vector<std::string>* warnings = nullptr);
// The effective configuration in config file syntax (what --print-config prints): the app's
// description, then each option a file may set, with its meaning as a comment (kDocumented). Numbers and booleans are written bare, text "double-quoted" with `"` and
// `\` escaped, so ApplyConfigText reads every value back unchanged; the password is written
// "<set>" (or "" when empty), never itself.
enum class ConfigStyle { kValues, kDocumented };
std::string RenderConfig(const CLI::App& app, ConfigStyle style);
// Cross-field checks.
[[nodiscard]] Status CheckConfig(const ControllerConfig& config);

}  // namespace falcon::controller
