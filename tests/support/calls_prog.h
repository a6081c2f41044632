// Test support: running falcon-test-calls (tests/progs/calls_prog.cc) over the no-op NCCL, with
// or without the shim preloaded. For the shim's integration tests only.
#pragma once

#include <string>
#include <vector>

#include "tests/support/subprocess.h"

namespace falcon::testing {

// Path of the falcon-test-calls program in the build tree.
std::string CallsProg();

// Runs falcon-test-calls with `args` over the no-op NCCL (LD_LIBRARY_PATH), the shim preloaded
// when `with_shim`, and `env` (NAME=VALUE) added to the environment. 120 s deadline.
ProcessResult RunCallsProg(const std::vector<std::string>& args, std::vector<std::string> env, bool with_shim);

// The "calls N" count the program printed (the NCCL calls it made itself); 0 if absent.
unsigned long long ProgCalls(const ProcessResult& r);

}  // namespace falcon::testing
