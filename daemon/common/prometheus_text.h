// Prometheus text exposition (format 0.0.4) for both daemons' /metrics: HELP and TYPE lines,
// samples with a fixed set of base labels (job, host) plus per-line ones, escaped values.
// Thread-safety: a value type, one owner. Must never: do I/O.
#pragma once

#include <sstream>
#include <string>

namespace falcon::daemon {

// A label value with backslashes, quotes and newlines escaped.
std::string PromEscape(const std::string& v);

// This process's CPU time, user + system, all threads, seconds (getrusage; 0 if it fails).
double ProcessCpuSeconds();

class PromWriter {
 public:
  // `prefix` starts every metric name ("falcon_agent_"); `base_labels` ("job=\"x\",host=\"y\"")
  // goes into every sample.
  PromWriter(std::string prefix, std::string base_labels);
  void Head(const char* name, const char* type, const char* help);
  void Line(const char* name, const std::string& labels, double v);
  // Head and one sample without labels of its own.
  void One(const char* name, const char* type, const char* help, double v);
  std::string str() const { return o_.str(); }

 private:
  std::string prefix_;
  std::string base_;
  std::ostringstream o_;
};

}  // namespace falcon::daemon
