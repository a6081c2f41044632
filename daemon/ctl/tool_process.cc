// RunTool (tool_process.h): posix_spawn with a stdout pipe, poll() on the pipe and, once it is
// closed, on a pidfd of the child (so the deadline holds while the program finishes after
// closing stdout); without pidfd support (Linux < 5.3) the exit is awaited with short polls.
#include "daemon/ctl/tool_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

extern char** environ;

namespace falcon::ctl {
namespace {

using Clock = std::chrono::steady_clock;

// Milliseconds left before `deadline`, for poll(): 0 once it has passed.
int MsLeft(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 60'000));
}

int OpenPidFd(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

// Kills and reaps the child; the error says why it was stopped.
Status Stop(pid_t pid, const std::string& why) {
  ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return Status::Internal(why);
}

// Waits for the child to exit until the deadline; its wait status, or an error after killing it.
Result<int> Reap(pid_t pid, Clock::time_point deadline, const std::string& name) {
  const int pidfd = OpenPidFd(pid);
  for (;;) {
    int status = 0;
    const pid_t got = ::waitpid(pid, &status, WNOHANG);
    if (got == pid) {
      if (pidfd >= 0) ::close(pidfd);
      return status;
    }
    if (got < 0 && errno != EINTR) {
      if (pidfd >= 0) ::close(pidfd);
      return Status::Internal(name + ": waitpid: " + std::strerror(errno));
    }
    if (Clock::now() >= deadline) {
      if (pidfd >= 0) ::close(pidfd);
      return Stop(pid, name + " did not exit before its deadline: killed");
    }
    pollfd p{pidfd, POLLIN, 0};
    // With a pidfd, wake when the child exits; without one, look again in 20 ms.
    ::poll(pidfd >= 0 ? &p : nullptr, pidfd >= 0 ? 1 : 0, pidfd >= 0 ? MsLeft(deadline) : std::min(20, MsLeft(deadline)));
  }
}

}  // namespace

Result<ToolOutput> RunTool(const ToolRun& run) {
  if (run.argv.empty()) return Status::InvalidArgument("no program to run");
  const std::string& name = run.argv[0];
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Status::Unavailable(std::string("pipe: ") + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);  // dup2 clears O_CLOEXEC on stdout
  std::vector<char*> argv;
  for (const std::string& a : run.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, name.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return Status::Unavailable("cannot run " + name + ": " + std::strerror(rc));
  }
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(run.timeout_s));
  ToolOutput result;
  char buf[65536];
  for (;;) {
    pollfd p{fds[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, MsLeft(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0 && Clock::now() >= deadline) {
      ::close(fds[0]);
      return Stop(pid, name + " did not finish within " + std::to_string(static_cast<long long>(run.timeout_s)) +
                           " s: killed (a larger --timeout may help with many or large dumps)");
    }
    if (ready <= 0) continue;
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // end of output (or a read error: the exit status tells the rest)
    if (result.out.size() + static_cast<std::size_t>(n) > run.max_output) {
      ::close(fds[0]);
      return Stop(pid, name + " wrote more than " + std::to_string(run.max_output) + " bytes: killed");
    }
    result.out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  Result<int> status = Reap(pid, deadline, name);
  if (!status.ok()) return status.status();
  if (WIFSIGNALED(status.value())) {
    return Status::Internal(name + " died of signal " + std::to_string(WTERMSIG(status.value())));
  }
  result.exit_code = WEXITSTATUS(status.value());
  return result;
}

}  // namespace falcon::ctl
