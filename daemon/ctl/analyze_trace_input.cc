// CSV and JSON-lines readers for analyze-trace. See analyze_trace_input.h for the contract.
#include "daemon/ctl/analyze_trace_input.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <sstream>

namespace falcon::ctl {
namespace {

using nlohmann::json;

std::string LineError(std::size_t line, const std::string& what) {
  return "line " + std::to_string(line) + ": " + what;
}

std::string Number(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

// Parses the second comma-separated field as seconds. Returns false on malformed input.
bool ParseSecondsField(const std::string& row, double& seconds) {
  const auto comma = row.find(',');
  if (comma == std::string::npos) {
    return false;
  }
  const char* begin = row.c_str() + comma + 1;
  char* end = nullptr;
  errno = 0;
  seconds = std::strtod(begin, &end);
  if (end == begin) {
    return false;
  }
  while (*end == ' ' || *end == '\t' || *end == '\r') {
    ++end;
  }
  return *end == '\0' || *end == ',';
}

std::uint64_t ParseCommId(const json& v) {
  if (v.is_string()) {
    return std::strtoull(v.get_ref<const std::string&>().c_str(), nullptr, 16);
  }
  if (v.is_number_unsigned()) {
    return v.get<std::uint64_t>();
  }
  if (v.is_number_integer()) {
    return static_cast<std::uint64_t>(v.get<std::int64_t>());  // two's complement, as written
  }
  return 0;
}

// A whole JSON number in [min, max], without converting one that does not fit; nullopt otherwise.
std::optional<std::int64_t> WholeIn(const json& v, std::int64_t min, std::int64_t max) {
  if (v.is_number_unsigned()) {
    const std::uint64_t u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(max) || max < 0) return std::nullopt;
    return static_cast<std::int64_t>(u);
  }
  if (v.is_number_integer()) {
    const std::int64_t i = v.get<std::int64_t>();
    if (i < min || i > max) return std::nullopt;
    return i;
  }
  return std::nullopt;
}

// One record line; "" and the record, or why it is refused.
std::string ParseRecord(const std::string& row, analyzer::CallRecord& call, std::int64_t& pid) {
  const json j = json::parse(row, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return "bad call record: not valid JSON";
  if (!j.is_object()) return "bad call record: not a JSON object";
  const auto op = j.find("op");
  if (op == j.end() || !op->is_string()) return "bad call record: \"op\" must be a string";
  call.op = analyzer::ParseOpKind(op->get_ref<const std::string&>());
  const auto comm = j.find("comm");
  call.comm = comm == j.end() ? 0 : ParseCommId(*comm);
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  if (const auto bytes = j.find("bytes"); bytes != j.end() && !bytes->is_null()) {
    const std::optional<std::int64_t> b = WholeIn(*bytes, 0, kMax);
    if (!b) return "bad call record: \"bytes\" must be a whole number >= 0";
    call.bytes = static_cast<std::uint64_t>(*b);
  }
  if (const auto peer = j.find("peer"); peer != j.end() && !peer->is_null()) {
    const std::optional<std::int64_t> p = WholeIn(*peer, -1, std::numeric_limits<std::int32_t>::max());
    if (!p) return "bad call record: \"peer\" must be a whole number in -1..2147483647";
    call.peer = static_cast<std::int32_t>(*p);
  }
  const auto t = j.find("t_start_ns");
  if (t == j.end()) return "bad call record: no \"t_start_ns\"";
  const std::optional<std::int64_t> t_ns = WholeIn(*t, 0, kMax);
  if (!t_ns) {
    return "bad call record: \"t_start_ns\" must be a whole number of nanoseconds in 0..9223372036854775807, not " +
           t->dump().substr(0, 40);
  }
  call.t_ns = *t_ns;
  const auto p = j.find("pid");
  pid = p != j.end() && p->is_number_integer() ? WholeIn(*p, -1, kMax).value_or(-1) : -1;
  return "";
}

}  // namespace

bool ReadCsvTrace(std::istream& in, CsvTrace& out, std::string& error) {
  std::string row;
  std::size_t line = 0;
  while (std::getline(in, row)) {
    ++line;
    if (!row.empty() && row.back() == '\r') {
      row.pop_back();
    }
    if (row.empty() || row[0] == '#') {
      continue;
    }
    if (line == 1 && row.find_first_of("0123456789") != 0) {
      continue;  // header
    }
    double seconds = 0.0;
    if (!ParseSecondsField(row, seconds)) {
      error = LineError(line, "malformed row '" + row.substr(0, 60) + "' (want iter,seconds)");
      return false;
    }
    if (!(seconds > 0.0) || !std::isfinite(seconds)) {
      error = LineError(line, "iteration time must be positive and finite");
      return false;
    }
    if (seconds < kMinIterationSeconds || seconds > kMaxIterationSeconds) {
      error = LineError(line, "iteration time " + Number(seconds) + " s is implausible (want " +
                                  Number(kMinIterationSeconds) + " to " + Number(kMaxIterationSeconds) + " s)");
      return false;
    }
    out.seconds.push_back(seconds);
  }
  if (out.seconds.empty()) {
    error = "no iteration times in the input";
    return false;
  }
  return true;
}

bool ReadRecordDump(std::istream& in, RecordDump& out, std::string& error) {
  std::string row;
  std::size_t line = 0;
  while (std::getline(in, row)) {
    ++line;
    if (row.find_first_not_of(" \t\r") == std::string::npos) {
      continue;
    }
    analyzer::CallRecord call;
    std::int64_t pid = -1;
    if (const std::string why = ParseRecord(row, call, pid); !why.empty()) {
      error = LineError(line, why);
      return false;
    }
    out.by_pid[pid].push_back(call);
    ++out.lines;
  }
  if (out.lines == 0) {
    error = "no call records in the input";
    return false;
  }
  // A process's records come from several per-thread lanes ("seq" counts within a lane); its
  // global call order is by start time. Stable: equal times keep file order.
  for (auto& [pid, calls] : out.by_pid) {
    std::stable_sort(calls.begin(), calls.end(),
                     [](const analyzer::CallRecord& a, const analyzer::CallRecord& b) {
                       return a.t_ns < b.t_ns;
                     });
  }
  return true;
}

}  // namespace falcon::ctl
