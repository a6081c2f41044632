// What `falcon-ctl hang` diagnoses: every rank's progress (analyzer::RankProgress), loaded from
// one source: a falcon-progress document (daemon/shm/progress_json.h) in a file or on stdin, or
// PyTorch Flight Recorder dumps converted by scripts/falcon-flight-recorder, or the live shim
// segments of the processes on this machine (local_progress.h).
// Single-threaded; reads files and runs the converter, writes nothing. Must never: run the
// converter through a shell, or wait for it past its deadline.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "analyzer/hang_diagnosis.h"
#include "falcon/status.h"

namespace falcon::ctl {

inline constexpr const char* kFlightRecorderToolName = "falcon-flight-recorder";
inline constexpr const char* kFlightRecorderToolEnv = "FALCON_FLIGHT_RECORDER_TOOL";

struct HangSourceOptions {
  std::string progress;                      // a falcon-progress document; "-" reads stdin
  std::vector<std::string> flight_recorder;  // dump directories or files, for the converter
  std::string tool;                          // the converter; "" = FindFlightRecorderTool's search
  std::string prefix;                        // dump file name prefix; "" = the converter's default
  double timeout_s = 300;                    // the converter's deadline
  bool live = false;                         // the live segments of this machine
  std::string dir;                           // live: segment directory ("" = the default)
  std::string job;                           // live: only this $FALCON_JOB ("" = every job)
};

struct HangInput {
  std::string source;  // the document's "source": "flight-recorder", "shm", ...
  std::string origin;  // what was read, for people: "progress file x.json", "Flight Recorder dumps in d/"
  std::vector<analyzer::RankProgress> ranks;
  std::vector<std::int64_t> missing_ranks;  // ranks known to exist with nothing read (ascending)
  std::vector<std::int64_t> paused_ranks;   // live: held by a Falcon pause (a validation), not hung
  double quiet_s = -1;  // live: seconds since any rank's latest ordered call (-1: unknown)
};

// The ranks of the one source `options` names. Errors: InvalidArgument (no source, or more than
// one), NotFound (a file or the converter missing), IoError, Corrupt (not a valid document: the
// message has the path of the first bad value), Unavailable / Internal (the converter failed,
// with its exit status; its own messages went to stderr).
[[nodiscard]] Result<HangInput> LoadHangInput(const HangSourceOptions& options);

// A falcon-progress document's text as HangInput. `origin` names it in messages. "missing_ranks",
// when present, must be an array of non-negative integers. Corrupt on anything else.
[[nodiscard]] Result<HangInput> ParseHangDocument(std::string_view text, std::string_view origin);

// The converter to run: `explicit_path` if given, else `env_value` ($FALCON_FLIGHT_RECORDER_TOOL)
// if set, else falcon-flight-recorder in <dir of self_exe>/../share/falcon/ (the install layout,
// which the build tree mirrors) or beside self_exe. Each must be an executable file. NotFound
// names every place looked at.
[[nodiscard]] Result<std::string> FindFlightRecorderTool(const std::string& explicit_path, const char* env_value,
                                                         const std::string& self_exe);

}  // namespace falcon::ctl
