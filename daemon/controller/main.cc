// falcon-controller: the per-job controller (DESIGN.md "The controller"). main() only wires
// (STYLE rule 12): flags, config file and environment (flags > FALCON_CONTROLLER_* > file >
// defaults; the file is read by LoadConfigFile, as the agent reads its own), logging, signal
// handling, the Controller loop. Exit status: 0 after SIGINT/SIGTERM, 2 for bad flags or
// configuration.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "daemon/common/log_escape.h"
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
  // Read by LoadConfigFile after the flags and environment, not by CLI11 (which would take any
  // file, ignore names it does not know and let a device such as /dev/zero be read without end).
  std::string config_file;
  app.add_option("-c,--config", config_file, "config file (name = value lines; see falcon-controller.conf)")
      ->envname("FALCON_CONTROLLER_CONFIG")
      ->configurable(false);
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
  std::vector<std::string> warnings;  // logged once the logger exists
  if (!config_file.empty()) {
    if (const falcon::Status s = falcon::controller::LoadConfigFile(app, config_file, &warnings); !s.ok()) {
      std::fprintf(stderr, "falcon-controller: %s\n", s.message().c_str());
      return kExitUsage;
    }
  }
  if (config.host.empty()) config.host = falcon::protocol::SanitizeKeyPart(HostName());
  if (const falcon::Status s = falcon::controller::CheckConfig(config); !s.ok()) {
    std::fprintf(stderr, "falcon-controller: %s\n", s.message().c_str());
    return kExitUsage;
  }
  if (print_config) {
    for (const std::string& w : warnings) std::fprintf(stderr, "falcon-controller: warning: %s\n", w.c_str());
    const std::string text = falcon::controller::RenderConfig(app, falcon::controller::ConfigStyle::kDocumented);
    std::fputs(text.c_str(), stdout);
    return 0;
  }
  auto log = spdlog::stderr_logger_mt("falcon-controller");
  log->set_pattern("%Y-%m-%dT%H:%M:%S.%e%z %l falcon-controller[%P] %v");
  log->set_level(spdlog::level::from_str(config.log_level));
  log->flush_on(spdlog::level::info);
  for (const std::string& w : warnings) log->warn("event=config_exposed warning={}", falcon::daemon::LogQuoted(w));

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
