// Test support: run a real program with extra environment, capture its output, enforce a
// deadline; and temporary directories. For integration tests only.
//
// Run() forks and execs `argv` with the parent's environment plus `env` (NAME=VALUE entries
// override), collects stdout and stderr, and kills the child (SIGKILL) if it outlives
// `timeout_s`. Thread-compatible; not async-signal-safe.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

#include <string>
#include <vector>

namespace falcon::testing {

struct ProcessResult {
  int exit_code = -1;     // exit status, or 128 + signal number
  bool timed_out = false;
  std::string out;
  std::string err;
};

ProcessResult Run(const std::vector<std::string>& argv, const std::vector<std::string>& env, double timeout_s = 60);

// Starts a program without waiting (stdout/stderr go to /dev/null). Returns its pid or -1.
pid_t Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env);
// Waits up to timeout_s for `pid`; returns its exit code, or -1 on timeout (the child is killed).
int WaitFor(pid_t pid, double timeout_s);

// Whether the running process `pid` ignores signal `sig` (the SigIgn mask of /proc/PID/status);
// false if it cannot be read.
bool IgnoresSignal(pid_t pid, int sig);

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The whole content of a file ("" if it cannot be read); for failure messages.
std::string ReadFile(const std::string& path);

// How often `what` occurs in `text` (overlapping occurrences counted): lines of a log.
std::size_t Count(const std::string& text, const std::string& what);

// CLOCK_REALTIME in nanoseconds (the clock of the shim's pause deadlines).
int64_t WallClockNs();

// Polls `cond` every 10 ms until it is true or `timeout_s` passes. Returns its last value.
template <typename Cond>
bool WaitUntil(Cond cond, double timeout_s);

// Paths configured by CMake for the tests (see tests/CMakeLists.txt).
std::string ShimPath();         // libfalcon_shim.so
std::string PreloadValue();     // LD_PRELOAD value: the sanitizer runtime (if any), then the shim
std::string NoopLibDir();       // directory holding the no-op libnccl.so.2
std::string EmuLibDir();        // directory holding the emulator's libnccl.so.2
std::string BinDir(const char* target_dir);  // build directory of a target folder

}  // namespace falcon::testing

#include "tests/support/wait_until.inl"
