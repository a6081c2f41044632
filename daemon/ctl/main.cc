// falcon-ctl: the operator's command line. main() only wires the subcommands together.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

#include "daemon/ctl/command.h"

int main(int argc, char** argv) {
  CLI::App app{"falcon-ctl: inspect Falcon call logs, analyse iteration-time traces, query and command a job through Redis"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "falcon-ctl 0.1.0");
  falcon::ctl::CommandContext ctx;
  falcon::ctl::AddTraceCommand(app, ctx);
  falcon::ctl::AddSegmentsCommand(app, ctx);
  falcon::ctl::AddAnalyzeTraceCommand(app, ctx);
  falcon::ctl::AddDumpCommand(app, ctx);
  falcon::ctl::AddHangCommand(app, ctx);
  falcon::ctl::AddStatusCommand(app, ctx);
  falcon::ctl::AddIncidentsCommand(app, ctx);
  falcon::ctl::AddEventsCommand(app, ctx);
  falcon::ctl::AddPlanCommand(app, ctx);
  falcon::ctl::AddAgentCommands(app, ctx);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version print and succeed; every usage error prints CLI11's message and exits
    // kExitUsage (CLI11's own codes, 100 and up, are not part of our contract).
    const int rc = app.exit(e);
    return rc == 0 ? falcon::ctl::kExitOk : falcon::ctl::kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "falcon-ctl: internal error: %s\n", e.what());
    return falcon::ctl::kExitInternal;
  }
  return ctx.exit_code;
}
