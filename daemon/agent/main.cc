// falcon-agent: the per-node daemon (DESIGN.md "The agent"). main() only wires (STYLE rule 12):
// flags and config (defaults < file < FALCON_AGENT_* < flags), logging, the event loop, the
// Agent, signal handling. Exit status: 0 after SIGINT/SIGTERM, 1 if the agent cannot start,
// 2 for bad flags or configuration.
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <vector>

#include "daemon/agent/agent.h"
#include "daemon/common/log_escape.h"
#include "daemon/protocol/keys.h"
#include "daemon/shm/segment_dir.h"

namespace {

constexpr int kExitStartFailed = 1;
constexpr int kExitUsage = 2;

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

using falcon::agent::AgentConfig;

// Flags, config file, environment: the effective config, or the exit code to return now.
struct Loaded {
  AgentConfig config;
  std::optional<int> exit_code;
  std::vector<std::string> warnings;  // logged once the logger exists
};

Loaded LoadConfig(int argc, char** argv) {
  Loaded out;
  CLI::App app{"falcon-agent: follows the node's Falcon shim segments, detects fail-slow ranks "
               "and reports to Redis. Options below override FALCON_AGENT_<NAME> variables, "
               "which override the config file."};
  std::string config_file;
  bool print_config = false;
  app.add_option("-c,--config", config_file, "config file (default: $FALCON_AGENT_CONFIG)");
  app.add_flag("--print-config", print_config,
               "print the effective configuration, documented, in config-file syntax and exit");
  std::map<std::string, std::string> raw;
  std::vector<std::pair<std::string, CLI::Option*>> options;
  for (const falcon::agent::ConfigEntry& e : falcon::agent::ConfigTable()) {
    const std::string name(e.name);
    options.emplace_back(name, app.add_option(falcon::agent::FlagName(e.name), raw[name],
                                              std::string(e.meaning)));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {  // --help, or a usage error: CLI11's own exit code
    const int rc = app.exit(e);
    out.exit_code = rc == 0 ? 0 : kExitUsage;
    return out;
  }
  if (config_file.empty() && std::getenv("FALCON_AGENT_CONFIG") != nullptr) {
    config_file = std::getenv("FALCON_AGENT_CONFIG");
  }
  std::map<std::string, std::string> given;
  for (const auto& [name, opt] : options) {
    if (opt->count() > 0) given[name] = raw[name];
  }
  falcon::Status s = config_file.empty() ? falcon::Status::Ok()
                                         : falcon::agent::LoadConfigFile(out.config, config_file, &out.warnings);
  if (s.ok()) {
    s = falcon::agent::ApplyEnvironment(out.config, [](const char* n) { return std::getenv(n); });
  }
  if (s.ok()) s = falcon::agent::ApplyFlags(out.config, given);
  if (s.ok()) s = falcon::agent::CheckConfig(out.config);
  if (!s.ok()) {
    std::fprintf(stderr, "falcon-agent: %s\n", s.message().c_str());
    out.exit_code = kExitUsage;
  } else if (print_config) {
    for (const std::string& w : out.warnings) std::fprintf(stderr, "falcon-agent: warning: %s\n", w.c_str());
    std::fputs(falcon::agent::RenderConfig(out.config, falcon::agent::ConfigStyle::kDocumented).c_str(),
               stdout);
    out.exit_code = 0;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  // Reports are built and freed every flush, some of them hundreds of KiB (call_signatures at
  // 10,000 calls/s per rank). Above glibc's mmap threshold each one was a fresh mapping whose
  // pages the kernel zeroed, a quarter of the agent's CPU at full load: keep such blocks in the
  // heap, and the heap's free top, for reuse. Memory stays bounded by the reports' own bounds.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
  const Loaded loaded = LoadConfig(argc, argv);
  if (loaded.exit_code) return *loaded.exit_code;
  const AgentConfig& config = loaded.config;

  auto log = spdlog::stderr_logger_mt("falcon-agent");
  log->set_pattern("%Y-%m-%dT%H:%M:%S.%e%z %l falcon-agent[%P] %v");
  log->set_level(spdlog::level::from_str(config.log_level));
  log->flush_on(spdlog::level::info);
  for (const std::string& w : loaded.warnings) {
    log->warn("event=config_exposed warning={}", falcon::daemon::LogQuoted(w));
  }

  falcon::agent::AgentEnvironment env;
  env.host = config.host.empty() ? falcon::protocol::SanitizeKeyPart(HostName()) : config.host;
  env.shm_dir = config.shm_dir.empty() ? falcon::daemon::DefaultSegmentDir() : config.shm_dir;
  env.uid = static_cast<std::uint32_t>(getuid());
  env.pid = static_cast<std::int32_t>(getpid());

  // A write to a Redis socket that the peer closed, or that Stop() shut down to wake a blocked
  // read, must fail with EPIPE (a transport error the connection handles), not kill the agent:
  // hiredis writes without MSG_NOSIGNAL. Before any thread starts.
  ::signal(SIGPIPE, SIG_IGN);
  boost::asio::io_context io(1);
  falcon::agent::Agent agent(io, config, env, log);
  // Handled from before the start: a SIGTERM while the agent connects waits for io.run() and
  // stops it cleanly instead of killing it half-started.
  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    log->info("event=signal signal={}", sig);
    agent.Stop();
    io.stop();
  });
  const falcon::Status s = agent.Start();
  if (!s.ok()) {
    log->error("event=start_failed reason={}", falcon::daemon::LogQuoted(s.message()));
    return kExitStartFailed;
  }
  io.run();
  agent.Stop();
  return 0;
}
