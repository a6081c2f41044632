// File-based unique-id exchange; see bootstrap.h.
// Thread-safety: no shared state. Must never wait past the deadline.
#include "bootstrap.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace falcon::emu {
namespace {

double MonoSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

int EnvInt(const char* name, int def) {
  const char* v = std::getenv(name);
  if (!v || !*v) return def;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return (end && *end == '\0' && x >= 0 && x < (1 << 30)) ? static_cast<int>(x) : def;
}

}  // namespace

JobEnv ReadJobEnv() {
  JobEnv e;
  e.rank = EnvInt("RANK", 0);
  e.world_size = EnvInt("WORLD_SIZE", 1);
  return e;
}

ncclResult_t BootstrapUniqueId(int rank, ncclUniqueId* id, const BootstrapOptions& options, std::string* error) {
  std::string path = options.path;
  if (path.empty()) {
    const char* env = std::getenv("FALCON_EMU_ID_FILE");
    if (!env || !*env) {
      *error = "bootstrap: no id file (set FALCON_EMU_ID_FILE or pass a path)";
      return ncclSystemError;
    }
    path = env;
  }
  if (rank == 0) {
    const ncclResult_t rc = ncclGetUniqueId(id);
    if (rc != ncclSuccess) {
      *error = "bootstrap: ncclGetUniqueId failed";
      return rc;
    }
    const std::string tmp = path + ".tmp." + std::to_string(getpid());
    const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) {
      *error = "bootstrap: cannot create " + tmp + ": " + std::strerror(errno);
      return ncclSystemError;
    }
    const ssize_t n = write(fd, id->internal, sizeof id->internal);
    const bool ok = n == static_cast<ssize_t>(sizeof id->internal) && fsync(fd) == 0;
    close(fd);
    if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
      unlink(tmp.c_str());
      *error = "bootstrap: cannot publish " + path + ": " + std::strerror(errno);
      return ncclSystemError;
    }
    return ncclSuccess;
  }
  const double deadline = MonoSeconds() + options.timeout_s;
  useconds_t sleep_us = 100;
  while (true) {
    const int fd = open(path.c_str(), O_RDONLY);
    if (fd >= 0) {
      const ssize_t n = read(fd, id->internal, sizeof id->internal);
      close(fd);
      if (n == static_cast<ssize_t>(sizeof id->internal)) return ncclSuccess;
    }
    if (MonoSeconds() > deadline) {
      *error = "bootstrap: rank " + std::to_string(rank) + " gave up waiting for " + path + " after " +
               std::to_string(options.timeout_s) + " s";
      return ncclSystemError;
    }
    usleep(sleep_us);
    if (sleep_us < 20000) sleep_us *= 2;
  }
}

}  // namespace falcon::emu
