// Test support: see calls_prog.h.
#include "tests/support/calls_prog.h"

#include <cstdio>

namespace falcon::testing {

std::string CallsProg() { return BinDir("tests") + "/falcon-test-calls"; }

ProcessResult RunCallsProg(const std::vector<std::string>& args, std::vector<std::string> env, bool with_shim) {
  std::vector<std::string> argv{CallsProg()};
  argv.insert(argv.end(), args.begin(), args.end());
  env.push_back("LD_LIBRARY_PATH=" + NoopLibDir());
  if (with_shim) env.push_back("LD_PRELOAD=" + PreloadValue());
  return Run(argv, env, 120);
}

unsigned long long ProgCalls(const ProcessResult& r) {
  unsigned long long calls = 0;
  return std::sscanf(r.out.c_str(), "calls %llu", &calls) == 1 ? calls : 0;
}

}  // namespace falcon::testing
