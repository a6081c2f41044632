// Placeholder: `falcon-ctl analyze-trace` lands with the detection core.
#include <CLI/CLI.hpp>

#include "daemon/ctl/command.h"

namespace falcon::ctl {
void AddAnalyzeTraceCommand(CLI::App& /*app*/, CommandContext& /*ctx*/) {}
}  // namespace falcon::ctl
