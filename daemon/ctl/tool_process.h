// Running a helper program (the Flight Recorder converter) and capturing what it prints: started
// with posix_spawn, never through a shell, stdin from /dev/null, stdout read into memory, stderr
// passed through to ours, and killed (SIGKILL) when it outlives its deadline.
// Single-threaded; the caller blocks until the program exits or the deadline passes. Must never:
// leave a child behind (every path reaps it), or read more than max_output bytes.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "falcon/status.h"

namespace falcon::ctl {

struct ToolRun {
  std::vector<std::string> argv;  // argv[0] is the program's path (PATH is not searched)
  double timeout_s = 300;         // wall-clock seconds from the start to the exit
  std::size_t max_output = std::size_t{1} << 30;  // bytes of stdout kept; more is an error
};

struct ToolOutput {
  int exit_code = 0;  // the program's exit status (it exited; a signal is an error instead)
  std::string out;    // everything it wrote to stdout
};

// The program's exit status and stdout. Errors: InvalidArgument (empty argv), Unavailable (it
// could not be started: the message names the program and errno's text), Internal (it was
// killed past the deadline, died of a signal, or wrote more than max_output; the message
// says which).
[[nodiscard]] Result<ToolOutput> RunTool(const ToolRun& run);

}  // namespace falcon::ctl
