// Shim logging: see log.h. Formatting happens into a stack buffer; one write(2) per line.
#include "shim/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>

namespace falcon::shim {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kWarn)};
std::atomic<uint32_t> g_once_fired[static_cast<uint32_t>(OnceKey::kCount_)];

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kWarn: return "warning";
    case LogLevel::kInfo: return "info";
    case LogLevel::kDebug: return "debug";
    case LogLevel::kQuiet: break;
  }
  return "";
}

void VLog(LogLevel level, const char* fmt, va_list ap) {
  if (static_cast<int>(level) > g_level.load(std::memory_order_relaxed)) return;
  char line[512];
  int n = std::snprintf(line, sizeof(line), "[falcon-shim %d] %s: ", static_cast<int>(getpid()),
                        LevelName(level));
  if (n < 0) return;
  size_t used = static_cast<size_t>(n);
  int m = std::vsnprintf(line + used, sizeof(line) - used, fmt, ap);
  if (m > 0) used += static_cast<size_t>(m);
  if (used > sizeof(line) - 2) used = sizeof(line) - 2;
  line[used++] = '\n';
  // A failed write to stderr is not worth failing over: the job matters, the log does not.
  ssize_t ignored = write(STDERR_FILENO, line, used);
  (void)ignored;
}

}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level), std::memory_order_relaxed); }

void Log(LogLevel level, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  VLog(level, fmt, ap);
  va_end(ap);
}

void LogOnce(OnceKey key, LogLevel level, const char* fmt, ...) {
  if (g_once_fired[static_cast<uint32_t>(key)].exchange(1, std::memory_order_relaxed) != 0) return;
  va_list ap;
  va_start(ap, fmt);
  VLog(level, fmt, ap);
  va_end(ap);
}

void ResetLogOnce() {
  for (auto& fired : g_once_fired) fired.store(0, std::memory_order_relaxed);
}

}  // namespace falcon::shim
