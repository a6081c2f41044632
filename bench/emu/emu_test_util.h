// Test kit for multi-process emulator tests: fork N ranks that share one ncclUniqueId, run a
// body in each, and collect exit codes with a deadline. Everything that touches the emulator runs
// in the children, so each child can set FALCON_EMU_* variables before its first NCCL call.
//
// Thread-safety: call from the test's main thread only (fork). Must never: leave children behind
// (they are killed when the deadline passes), or wait without a deadline.
#ifndef FALCON_BENCH_EMU_EMU_TEST_UTIL_H_
#define FALCON_BENCH_EMU_EMU_TEST_UTIL_H_

#include <nccl.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace falcon::emu::testing {

// A deadline catches a hang, not slowness. Sanitized builds run the emulator several times slower,
// and ctest runs them beside other multi-process tests on few cores: a three-rank matrix that
// takes 13 s alone under ThreadSanitizer took 116 s in a CI run. Deadlines scale with the build.
#if defined(__has_feature)
#define FALCON_EMU_HAS_FEATURE(f) __has_feature(f)  // clang; GCC says __SANITIZE_*__
#else
#define FALCON_EMU_HAS_FEATURE(f) 0
#endif
#if defined(__SANITIZE_THREAD__) || FALCON_EMU_HAS_FEATURE(thread_sanitizer)
inline constexpr double kDeadlineScale = 5;
#elif defined(__SANITIZE_ADDRESS__) || FALCON_EMU_HAS_FEATURE(address_sanitizer)
inline constexpr double kDeadlineScale = 3;
#else
inline constexpr double kDeadlineScale = 1;
#endif

inline double MonoNow() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

using RankBody = std::function<int(int rank, const ncclUniqueId& id)>;

struct RunOptions {
  std::map<std::string, std::string> env;  // set in every child before the body runs
  double deadline_s = 60;  // in an unsanitized build; times kDeadlineScale in a sanitized one
  std::function<void()> after_fork;        // runs in the parent once all children exist
};

// Returns each rank's exit status (0 = success; 128+sig when killed by a signal; -1 = killed at
// the deadline, opt.deadline_s x kDeadlineScale).
inline std::vector<int> RunRanks(int n, const RankBody& body, const RunOptions& opt = {}) {
  ncclUniqueId id{};
  if (ncclGetUniqueId(&id) != ncclSuccess) return std::vector<int>(static_cast<size_t>(n), -2);
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      for (const auto& [k, v] : opt.env) setenv(k.c_str(), v.c_str(), 1);
      setenv("FALCON_EMU_RANK", std::to_string(r).c_str(), 1);
      const int rc = body(r, id);
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  if (opt.after_fork) opt.after_fork();
  std::vector<int> codes(static_cast<size_t>(n), -1);
  size_t left = pids.size();
  const double deadline = MonoNow() + opt.deadline_s * kDeadlineScale;
  useconds_t nap = 200;
  while (left > 0) {
    bool reaped = false;
    for (size_t i = 0; i < pids.size(); ++i) {
      if (pids[i] == 0) continue;
      int st = 0;
      if (waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        pids[i] = 0;
        --left;
        reaped = true;
      }
    }
    if (left == 0) break;
    if (MonoNow() > deadline) {
      for (pid_t p : pids) {
        if (p) kill(p, SIGKILL);
      }
      for (pid_t p : pids) {
        if (p) waitpid(p, nullptr, 0);
      }
      break;
    }
    if (!reaped) {
      usleep(nap);
      if (nap < 20000) nap *= 2;
    } else {
      nap = 200;
    }
  }
  return codes;
}

inline bool AllZero(const std::vector<int>& codes) {
  for (int c : codes) {
    if (c != 0) return false;
  }
  return true;
}

// "0 0 -1(deadline) 137(signal 9)": what each rank's code means, for a failure message.
inline std::string Codes(const std::vector<int>& codes) {
  std::string s;
  for (int c : codes) {
    s += std::to_string(c);
    if (c == -1) s += "(deadline)";
    else if (c > 128) s += "(signal " + std::to_string(c - 128) + ")";
    s += " ";
  }
  return s;
}

// Checks inside a child: print and count failures instead of gtest assertions.
#define EMU_CHECK(cond, ...)                                  \
  do {                                                        \
    if (!(cond)) {                                            \
      std::fprintf(stderr, "CHECK failed %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                      \
      std::fprintf(stderr, "\n");                             \
      ++failures;                                             \
    }                                                         \
  } while (0)

}  // namespace falcon::emu::testing

#endif  // FALCON_BENCH_EMU_EMU_TEST_UTIL_H_
