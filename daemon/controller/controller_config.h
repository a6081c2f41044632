// The controller's configuration: one typed table (CLI11 options with bounds, defaults and
// meanings), read from a config file (--config, TOML/INI syntax; daemon/config/
// falcon-controller.conf documents every entry), FALCON_CONTROLLER_<NAME> variables and flags
// (flags win). `--print-config` prints the effective values in file syntax.
// Thread-safety: a value type. Must never: print the password.
#pragma once

#include <cstdint>
#include <string>

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
};

// Adds every entry as an option (with its environment variable) to `app`.
void AddConfigOptions(CLI::App& app, ControllerConfig& config);
// Cross-field checks.
[[nodiscard]] Status CheckConfig(const ControllerConfig& config);

}  // namespace falcon::controller
