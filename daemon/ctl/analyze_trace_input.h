// Input readers for `falcon-ctl analyze-trace`: iteration-time CSV traces (`iter,seconds[,label]`)
// and call-record dumps (JSON lines from `falcon-ctl trace PID --json`), turned into the plain
// values the analyzer takes. Errors are values (an error string naming the line), never thrown.
// Thread-safety: stateless functions. Must never: exit the process or print.
#pragma once

#include <cstdint>
#include <istream>
#include <map>
#include <string>
#include <vector>

#include "analyzer/signature.h"

namespace falcon::ctl {

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
// sets `error` to "line N: reason"; non-positive or non-finite times are errors.
[[nodiscard]] bool ReadCsvTrace(std::istream& in, CsvTrace& out, std::string& error);

// Reads JSON-lines call records; blank lines are skipped. Same error contract as ReadCsvTrace.
[[nodiscard]] bool ReadRecordDump(std::istream& in, RecordDump& out, std::string& error);

}  // namespace falcon::ctl
