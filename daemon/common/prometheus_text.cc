// PromWriter. See prometheus_text.h for the contract.
#include "daemon/common/prometheus_text.h"

#include <sys/resource.h>

#include <cstdio>

namespace falcon::daemon {

std::string PromEscape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

double ProcessCpuSeconds() {
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  auto secs = [](const timeval& tv) {
    return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) * 1e-6;
  };
  return secs(ru.ru_utime) + secs(ru.ru_stime);
}

PromWriter::PromWriter(std::string prefix, std::string base_labels)
    : prefix_(std::move(prefix)), base_(std::move(base_labels)) {}

void PromWriter::Head(const char* name, const char* type, const char* help) {
  o_ << "# HELP " << prefix_ << name << " " << help << "\n# TYPE " << prefix_ << name << " " << type << "\n";
}

void PromWriter::Line(const char* name, const std::string& labels, double v) {
  char num[64];
  std::snprintf(num, sizeof num, "%.17g", v);
  o_ << prefix_ << name << "{" << base_ << (labels.empty() ? "" : "," + labels) << "} " << num << "\n";
}

void PromWriter::One(const char* name, const char* type, const char* help, double v) {
  Head(name, type, help);
  Line(name, "", v);
}

}  // namespace falcon::daemon
