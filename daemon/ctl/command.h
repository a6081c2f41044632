// falcon-ctl subcommands: each lives in its own file and registers itself on the CLI11 app.
//
// Contract for every subcommand:
//  - registration only adds options and a callback; the callback does the work and stores the
//    process exit code in CommandContext::exit_code (see ExitCode);
//  - output for people goes to stdout, diagnostics to stderr; with --json the command prints
//    machine-readable JSON (one document, or JSON lines for streams) and nothing else on stdout;
//  - library exceptions are caught inside the callback and turned into a message + exit code.
// Not thread-safe; falcon-ctl is single-threaded.
#pragma once

namespace CLI {
class App;
}

namespace falcon::ctl {

// Process exit codes, stable for scripts.
enum ExitCode : int {
  kExitOk = 0,           // success; for analysis commands: nothing alarming found
  kExitFound = 1,        // the command worked and found something (alarms, problems)
  kExitUsage = 2,        // bad flags or arguments (main() maps every CLI11 parse error to it)
  kExitInput = 3,        // the input (file, segment, process) is missing or malformed
  kExitUnreachable = 4,  // a service (Redis, agent) could not be reached
  kExitInternal = 5      // a bug: please report
};

struct CommandContext {
  int exit_code = kExitOk;
};

void AddTraceCommand(CLI::App& app, CommandContext& ctx);
void AddSegmentsCommand(CLI::App& app, CommandContext& ctx);
void AddAnalyzeTraceCommand(CLI::App& app, CommandContext& ctx);
void AddDumpCommand(CLI::App& app, CommandContext& ctx);  // dump_command.cc
void AddHangCommand(CLI::App& app, CommandContext& ctx);  // hang_command.cc
// Commands that talk to Redis (redis_cli.h holds their common options).
void AddStatusCommand(CLI::App& app, CommandContext& ctx);     // status_command.cc
void AddIncidentsCommand(CLI::App& app, CommandContext& ctx);  // incidents_command.cc
void AddEventsCommand(CLI::App& app, CommandContext& ctx);     // incidents_command.cc
void AddPlanCommand(CLI::App& app, CommandContext& ctx);       // plan_command.cc
// mode, pause, resume, validate (agent_command.cc)
void AddAgentCommands(CLI::App& app, CommandContext& ctx);

}  // namespace falcon::ctl
