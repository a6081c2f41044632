// CSV and JSON-lines readers for analyze-trace. See analyze_trace_input.h for the contract.
#include "daemon/ctl/analyze_trace_input.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace falcon::ctl {
namespace {

std::string LineError(std::size_t line, const std::string& what) {
  return "line " + std::to_string(line) + ": " + what;
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
  if (end == begin || errno == ERANGE) {
    return false;
  }
  while (*end == ' ' || *end == '\t' || *end == '\r') {
    ++end;
  }
  return *end == '\0' || *end == ',';
}

std::uint64_t ParseCommId(const nlohmann::json& v) {
  if (v.is_string()) {
    return std::strtoull(v.get<std::string>().c_str(), nullptr, 16);
  }
  if (v.is_number_unsigned() || v.is_number_integer()) {
    return v.get<std::uint64_t>();
  }
  return 0;
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
    try {
      const nlohmann::json j = nlohmann::json::parse(row);
      analyzer::CallRecord call;
      call.op = analyzer::ParseOpKind(j.at("op").get<std::string>());
      call.comm = ParseCommId(j.value("comm", nlohmann::json()));
      call.bytes = j.value("bytes", std::uint64_t{0});
      call.peer = static_cast<std::int32_t>(j.value("peer", std::int64_t{-1}));
      call.t_ns = j.at("t_start_ns").get<std::int64_t>();
      const std::int64_t pid = j.contains("pid") && j["pid"].is_number_integer()
                                   ? j["pid"].get<std::int64_t>()
                                   : -1;
      out.by_pid[pid].push_back(call);
      ++out.lines;
    } catch (const nlohmann::json::exception& e) {
      error = LineError(line, std::string("bad call record: ") + e.what());
      return false;
    }
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
