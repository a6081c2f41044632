// Input readers for `falcon-ctl analyze-trace`: iteration-time CSV traces (`iter,seconds[,label]`)
// and call-record dumps (JSON lines from `falcon-ctl trace PID --json`), turned into the plain
// values the analyzer takes. Errors are values (an error string naming the line), never thrown.
// Every number read is checked before it is converted: an iteration time must lie in
// [kMinIterationSeconds, kMaxIterationSeconds] (so no ratio of two of them overflows), a record's
// t_start_ns must be a whole number of nanoseconds in 0..INT64_MAX, bytes a whole number >= 0,
// peer a whole number in -1..INT32_MAX.
// Thread-safety: stateless functions. Must never: exit the process, print, or convert a JSON
// number to a type that cannot hold it.
#pragma once

#include <cstdint>
#include <istream>
#include <map>
#include <string>
#include <vector>

#include "analyzer/signature.h"

namespace falcon::ctl {

// Plausible iteration times, seconds: a nanosecond to about eleven days.
inline constexpr double kMinIterationSeconds = 1e-9;
inline constexpr double kMaxIterationSeconds = 1e6;

struct CsvTrace {
  std::vector<double> seconds;  // one per iteration, in file order
};

struct RecordDump {
  // Calls per process (key: "pid", or -1 when absent), ordered by start time ("t_start_ns"; the
  // records of one process come from several per-thread lanes).
  std::map<std::int64_t, std::vector<analyzer::CallRecord>> by_pid;
  std::size_t lines = 0;
};

// Reads `iter,seconds[,label]` rows (an optional header line first). On failure returns false and
// sets `error` to "line N: reason"; a time that is not finite or outside
// [kMinIterationSeconds, kMaxIterationSeconds] is an error.
[[nodiscard]] bool ReadCsvTrace(std::istream& in, CsvTrace& out, std::string& error);

// Reads JSON-lines call records; blank lines are skipped. Same error contract as ReadCsvTrace.
[[nodiscard]] bool ReadRecordDump(std::istream& in, RecordDump& out, std::string& error);

// Whether an iteration time derived from records is plausible (within the CSV bounds); the
// command warns about and leaves out those that are not (0 s: two iterations at one
// timestamp; more than 1e6 s: start times far apart).
[[nodiscard]] inline bool PlausibleIterationSeconds(double s) {
  return s >= kMinIterationSeconds && s <= kMaxIterationSeconds;
}

}  // namespace falcon::ctl
