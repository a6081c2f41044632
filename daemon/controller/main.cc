// falcon-controller: the per-job controller (DESIGN.md "The controller"). main() only wires
// (STYLE rule 12): flags, config file and environment (CLI11; flags > FALCON_CONTROLLER_* > file
// > defaults), logging, signal handling, the Controller loop. Exit status: 0 after SIGINT/SIGTERM,
// 2 for bad flags or configuration.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "daemon/controller/controller.h"
#include "daemon/protocol/keys.h"

namespace {

constexpr int kExitUsage = 2;

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  falcon::controller::ControllerConfig config;
  CLI::App app{"falcon-controller: one per job. Reads the agents' reports from Redis, profiles and validates "
               "suspected fail-slows (pause, GEMM, P2P passes, resume), names the slow GPU, link or NIC, and "
               "writes incidents (stream) and alerts (pub/sub). Flags override FALCON_CONTROLLER_<NAME> "
               "variables, which override the config file."};
  app.set_config("-c,--config", "", "config file (TOML/INI: name = value; see falcon-controller.conf)")
      ->envname("FALCON_CONTROLLER_CONFIG");
  bool print_config = false;
  app.add_flag("--print-config", print_config, "print the effective configuration in config-file syntax and exit")
      ->configurable(false);
  falcon::controller::AddConfigOptions(app, config);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExitUsage;
  }
  if (config.host.empty()) config.host = falcon::protocol::SanitizeKeyPart(HostName());
  if (const falcon::Status s = falcon::controller::CheckConfig(config); !s.ok()) {
    std::fprintf(stderr, "falcon-controller: %s\n", s.message().c_str());
    return kExitUsage;
  }
  if (print_config) {
    std::string text = app.config_to_str(true, true);
    // Never print the password: blank its line.
    const std::string key = "redis-password=";
    if (auto at = text.find(key); at != std::string::npos) {
      const auto end = text.find('\n', at);
      text.replace(at, end - at, key + (config.redis.password.empty() ? "\"\"" : "\"<set>\""));
    }
    std::fputs(text.c_str(), stdout);
    return 0;
  }
  auto log = spdlog::stderr_logger_mt("falcon-controller");
  log->set_pattern("%Y-%m-%dT%H:%M:%S.%e%z %l falcon-controller[%P] %v");
  log->set_level(spdlog::level::from_str(config.log_level));
  log->flush_on(spdlog::level::info);

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  // A write to a Redis socket that the peer closed must fail with EPIPE (a transport error the
  // connection handles), not kill the controller: hiredis writes without MSG_NOSIGNAL.
  ::signal(SIGPIPE, SIG_IGN);
  falcon::controller::Controller controller(config, log);
  return controller.Run(g_stop);
}
