// Fuzz target: `falcon-ctl analyze-trace --records`'s reader (JSON lines of call records, outside
// input: any dump a user points it at). Checked: no crash, no exception, no undefined conversion
// of a JSON number (UBSan's float-cast-overflow would fire on a 1e300 converted to an integer);
// what is accepted is what the contract promises: every record counted once, start times in
// 0..INT64_MAX, each process's calls in start-time order, peers in -1..INT32_MAX.
#include <sstream>
#include <string>

#include "daemon/ctl/analyze_trace_input.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace falcon;
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  ctl::RecordDump dump;
  std::string error;
  if (!ctl::ReadRecordDump(in, dump, error)) {
    if (error.empty()) fuzz::PropertyFailed("a refused dump says nothing about why");
    return 0;
  }
  size_t calls = 0;
  for (const auto& [pid, records] : dump.by_pid) {
    if (pid < -1) fuzz::PropertyFailed("a pid below -1");
    calls += records.size();
    for (size_t i = 0; i < records.size(); ++i) {
      if (records[i].t_ns < 0) fuzz::PropertyFailed("a negative start time was accepted");
      if (records[i].peer < -1) fuzz::PropertyFailed("a peer below -1 was accepted");
      if (i > 0 && records[i].t_ns < records[i - 1].t_ns) fuzz::PropertyFailed("calls out of start-time order");
    }
  }
  if (calls != dump.lines || calls == 0) fuzz::PropertyFailed("records counted wrongly");
  return 0;
}
