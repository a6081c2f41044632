// Fuzz target: `falcon-ctl analyze-trace`'s CSV reader (iteration times, outside input: any file
// a user points it at), then the detector on what it accepted, as the command runs it. Checked:
// no crash; every accepted time lies within the reader's plausible bounds; every alarm's ratio,
// level and probability is finite (a ratio of inf would print as inf, and as null in JSON).
#include <cmath>
#include <sstream>
#include <string>

#include "analyzer/detector.h"
#include "daemon/ctl/analyze_trace_input.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace falcon;
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  ctl::CsvTrace trace;
  std::string error;
  if (!ctl::ReadCsvTrace(in, trace, error)) {
    if (error.empty()) fuzz::PropertyFailed("a refused trace says nothing about why");
    return 0;
  }
  if (trace.seconds.empty()) fuzz::PropertyFailed("an accepted trace holds no iteration");
  for (const double s : trace.seconds) {
    if (!ctl::PlausibleIterationSeconds(s)) fuzz::PropertyFailed("an implausible iteration time was accepted");
  }
  analyzer::DetectorOptions options;
  analyzer::FailSlowDetector detector(options);
  for (const double s : trace.seconds) {
    const analyzer::DetectorStep step = detector.Push(s);
    if (!step.alarm) continue;
    const analyzer::Alarm& a = *step.alarm;
    if (!std::isfinite(a.ratio) || !std::isfinite(a.level_seconds) || !std::isfinite(a.probability)) {
      fuzz::PropertyFailed("an alarm with a non-finite ratio, level or probability");
    }
  }
  return 0;
}
