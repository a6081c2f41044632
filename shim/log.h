// Shim logging: one line per event on stderr, prefixed "[falcon-shim <pid>]".
//
// Thread-safe (each line is one write(2)). Never allocates, never blocks beyond the write
// itself, never throws. Must never be called between HOT PATH banners.
// Once-only keys make "degrade with one log line" cheap to honour: LogOnce prints a key's
// message the first time only, from any thread.
#pragma once

#include <cstdint>

namespace falcon::shim {

enum class LogLevel : int { kQuiet = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

// Process-wide log level; set once by the configuration loader (default kWarn).
void SetLogLevel(LogLevel level);

// Keys for messages that must appear at most once per process.
enum class OnceKey : uint32_t {
  kSegmentCreate = 0,
  kMissingSymbol,
  kCommTableFull,
  kThreadTableFull,
  kServiceThread,
  kCudaDriver,
  kCudaContext,
  kUnknownMode,
  kCount_
};

void Log(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void LogOnce(OnceKey key, LogLevel level, const char* fmt, ...) __attribute__((format(printf, 3, 4)));

// Allows LogOnce keys to fire again (used after fork, where the child is a new process).
void ResetLogOnce();

}  // namespace falcon::shim
