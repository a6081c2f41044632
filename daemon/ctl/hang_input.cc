// Loading falcon-ctl hang's input (hang_input.h): a progress document from a file or stdin, or
// from the Flight Recorder converter's stdout. JSON exceptions stop here and become Corrupt.
#include "daemon/ctl/hang_input.h"

#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <set>

#include "daemon/ctl/local_progress.h"
#include "daemon/ctl/tool_process.h"
#include "daemon/shm/progress_json.h"
#include "daemon/shm/segment_dir.h"

namespace falcon::ctl {
namespace {

constexpr std::size_t kMaxDocumentBytes = std::size_t{1} << 30;

bool IsExecutableFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

std::string SelfExe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

Result<std::string> ReadAll(const std::string& path) {
  std::ifstream file;
  std::istream* in = &std::cin;
  if (path != "-") {
    file.open(path, std::ios::binary);
    if (!file) return Status::NotFound("cannot open '" + path + "': " + std::strerror(errno));
    in = &file;
  }
  std::string text;
  char buf[65536];
  while (in->read(buf, sizeof buf) || in->gcount() > 0) {
    text.append(buf, static_cast<std::size_t>(in->gcount()));
    if (text.size() > kMaxDocumentBytes) return Status::IoError("'" + path + "' is larger than 1 GiB");
  }
  if (in->bad()) return Status::IoError("cannot read '" + path + "'");
  return text;
}

Result<HangInput> FromFlightRecorder(const HangSourceOptions& o) {
  const char* env = std::getenv(kFlightRecorderToolEnv);
  Result<std::string> tool = FindFlightRecorderTool(o.tool, env, SelfExe());
  if (!tool.ok()) return tool.status();
  ToolRun run;
  run.timeout_s = o.timeout_s;
  run.argv = {tool.value()};
  if (!o.prefix.empty()) run.argv.insert(run.argv.end(), {"--prefix", o.prefix});
  run.argv.push_back("--");
  run.argv.insert(run.argv.end(), o.flight_recorder.begin(), o.flight_recorder.end());
  Result<ToolOutput> out = RunTool(run);
  if (!out.ok()) return out.status();
  if (out.value().exit_code != 0) {
    return Status::Corrupt(tool.value() + " exited with status " + std::to_string(out.value().exit_code) +
                           " (its messages are above): no dump could be used");
  }
  std::string origin = "Flight Recorder dumps in";
  for (const std::string& p : o.flight_recorder) origin += " " + p;
  return ParseHangDocument(out.value().out, origin);
}

}  // namespace

Result<HangInput> ParseHangDocument(std::string_view text, std::string_view origin) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    return Status::Corrupt(std::string(origin) + ": not JSON: " + e.what());
  }
  std::string error;
  std::optional<daemon::ProgressDocument> parsed = daemon::ParseProgress(doc, &error);
  if (!parsed) return Status::Corrupt(std::string(origin) + ": " + error);
  HangInput input;
  input.source = parsed->source;
  input.origin = std::string(origin);
  input.ranks = std::move(parsed->ranks);
  if (doc.contains("missing_ranks") && !doc["missing_ranks"].is_null()) {
    const nlohmann::json& missing = doc["missing_ranks"];
    std::set<std::int64_t> ranks;
    if (!missing.is_array()) return Status::Corrupt(std::string(origin) + ": missing_ranks: expected an array");
    for (std::size_t i = 0; i < missing.size(); ++i) {
      if (!missing[i].is_number_integer() || missing[i].get<std::int64_t>() < 0) {
        return Status::Corrupt(std::string(origin) + ": missing_ranks[" + std::to_string(i) +
                               "]: expected a non-negative integer");
      }
      ranks.insert(missing[i].get<std::int64_t>());
    }
    input.missing_ranks.assign(ranks.begin(), ranks.end());
  }
  return input;
}

Result<std::string> FindFlightRecorderTool(const std::string& explicit_path, const char* env_value,
                                           const std::string& self_exe) {
  if (!explicit_path.empty()) {
    if (IsExecutableFile(explicit_path)) return explicit_path;
    return Status::NotFound("--flight-recorder-tool " + explicit_path + " is not an executable file");
  }
  if (env_value != nullptr && *env_value != '\0') {
    if (IsExecutableFile(env_value)) return std::string(env_value);
    return Status::NotFound(std::string(kFlightRecorderToolEnv) + "=" + env_value + " is not an executable file");
  }
  std::vector<std::string> tried;
  if (!self_exe.empty()) {
    const std::string dir = self_exe.substr(0, self_exe.find_last_of('/') + 1);
    tried = {dir + "../share/falcon/" + kFlightRecorderToolName, dir + kFlightRecorderToolName};
    for (const std::string& path : tried) {
      if (IsExecutableFile(path)) return path;
    }
  }
  std::string where;
  for (const std::string& path : tried) where += (where.empty() ? "" : ", ") + path;
  return Status::NotFound(std::string("cannot find ") + kFlightRecorderToolName + " (looked in " +
                          (where.empty() ? "nothing: the path of falcon-ctl is unknown" : where) +
                          "); give --flight-recorder-tool PATH or set " + kFlightRecorderToolEnv);
}

Result<HangInput> FromLiveSegments(const HangSourceOptions& options) {
  LocalProgressOptions local;
  local.dir = options.dir;
  local.job = options.job;
  auto ranks = ReadLocalProgress(local);
  if (!ranks.ok()) return ranks.status();
  const std::string dir = options.dir.empty() ? daemon::DefaultSegmentDir() : options.dir;
  if (ranks.value().empty()) {
    return Status::NotFound("no live traced process in " + dir +
                            (options.job.empty() ? std::string() : " for job '" + options.job + "'") +
                            " (`falcon-ctl segments` lists what exists)");
  }
  HangInput in;
  in.source = "shm";
  in.origin = "live segments in " + dir;
  for (const LocalRank& r : ranks.value()) {
    in.ranks.push_back(r.progress.progress);
    if (r.progress.paused) in.paused_ranks.push_back(r.progress.progress.rank);
    const double quiet = r.AgeSeconds(r.progress.last_call_mono_ns);  // the job's: its youngest
    if (quiet >= 0 && (in.quiet_s < 0 || quiet < in.quiet_s)) in.quiet_s = quiet;
  }
  return in;
}

Result<HangInput> LoadHangInput(const HangSourceOptions& options) {
  const int sources =
      (options.progress.empty() ? 0 : 1) + (options.flight_recorder.empty() ? 0 : 1) + (options.live ? 1 : 0);
  if (sources != 1) {
    return Status::InvalidArgument(sources == 0
                                       ? "give the ranks' progress: --agents, --live, --progress FILE or --flight-recorder PATH"
                                       : "give one source: --live, --progress or --flight-recorder");
  }
  if (options.live) return FromLiveSegments(options);
  if (!options.flight_recorder.empty()) return FromFlightRecorder(options);
  Result<std::string> text = ReadAll(options.progress);
  if (!text.ok()) return text.status();
  return ParseHangDocument(text.value(), options.progress == "-" ? "stdin" : "progress file " + options.progress);
}

}  // namespace falcon::ctl
