// analyze-trace's readers on crafted inputs: what they accept, and every out-of-range or
// wrongly typed number refused with the line that holds it (never converted as it stands: a
// 1e26 t_start_ns used to become 0 ns, a 1e308 iteration time an infinite ratio).
#include "daemon/ctl/analyze_trace_input.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>

namespace falcon::ctl {
namespace {

TEST(AnalyzeTraceInputTest, CsvTimesMustBePlausible) {
  struct Case {
    std::string text;
    std::string error;  // "" = accepted
  } cases[] = {
      {"iter,seconds\n0,0.5\n1,0.25,label\n", ""},
      {"0,1e-9\n1,1e6\n", ""},
      {"0,0.5\n1,1e308\n", "line 2: iteration time 1e+308 s is implausible (want 1e-09 to 1e+06 s)"},
      {"0,1000001\n", "line 1: iteration time 1e+06 s is implausible"},
      {"0,1e-10\n", "line 1: iteration time 1e-10 s is implausible"},
      {"0,1e999\n", "line 1: iteration time must be positive and finite"},
      {"0,nan\n", "line 1: iteration time must be positive and finite"},
      {"0,inf\n", "line 1: iteration time must be positive and finite"},
      {"0,-1\n", "line 1: iteration time must be positive and finite"},
      {"0,0\n", "line 1: iteration time must be positive and finite"},
      {"0,1e-400\n", "line 1: iteration time must be positive and finite"},
      {"0;1\n", "line 1: malformed row"},
      {"", "no iteration times in the input"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    std::istringstream in(c.text);
    CsvTrace trace;
    std::string error;
    const bool ok = ReadCsvTrace(in, trace, error);
    EXPECT_EQ(ok, c.error.empty()) << error;
    if (!c.error.empty()) {
      EXPECT_EQ(error.rfind(c.error, 0), 0u) << error;
    }
  }
}

TEST(AnalyzeTraceInputTest, RecordNumbersAreCheckedBeforeTheyAreConverted) {
  const std::string good = R"({"op":"ncclAllReduce","comm":"00000000000abcde","bytes":4096,"peer":-1,"t_start_ns":1000,"pid":7})";
  struct Case {
    std::string line;
    std::string error;  // "" = accepted
  } cases[] = {
      {good, ""},
      {R"({"op":"ncclSend","comm":12,"peer":3,"t_start_ns":9223372036854775807})", ""},
      {R"({"op":"ncclAllReduce","t_start_ns":1e26})", "line 2: bad call record: \"t_start_ns\" must be a whole number"},
      {R"({"op":"ncclAllReduce","t_start_ns":1.5})", "line 2: bad call record: \"t_start_ns\" must be a whole number"},
      {R"({"op":"ncclAllReduce","t_start_ns":-1})", "line 2: bad call record: \"t_start_ns\" must be a whole number"},
      {R"({"op":"ncclAllReduce","t_start_ns":9223372036854775808})", "line 2: bad call record: \"t_start_ns\""},
      {R"({"op":"ncclAllReduce","t_start_ns":"5"})", "line 2: bad call record: \"t_start_ns\""},
      {R"({"op":"ncclAllReduce"})", "line 2: bad call record: no \"t_start_ns\""},
      {R"({"op":"ncclAllReduce","t_start_ns":5,"bytes":1e300})", "line 2: bad call record: \"bytes\""},
      {R"({"op":"ncclAllReduce","t_start_ns":5,"bytes":-1})", "line 2: bad call record: \"bytes\""},
      {R"({"op":"ncclSend","t_start_ns":5,"peer":1e300})", "line 2: bad call record: \"peer\""},
      {R"({"op":"ncclSend","t_start_ns":5,"peer":2147483648})", "line 2: bad call record: \"peer\""},
      {R"({"op":"ncclSend","t_start_ns":5,"peer":-2})", "line 2: bad call record: \"peer\""},
      {R"({"op":7,"t_start_ns":5})", "line 2: bad call record: \"op\" must be a string"},
      {R"([1,2])", "line 2: bad call record: not a JSON object"},
      {R"({"op":)", "line 2: bad call record: not valid JSON"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.line);
    std::istringstream in(good + "\n" + c.line + "\n\n");
    RecordDump dump;
    std::string error;
    const bool ok = ReadRecordDump(in, dump, error);
    EXPECT_EQ(ok, c.error.empty()) << error;
    if (!c.error.empty()) {
      EXPECT_EQ(error.rfind(c.error, 0), 0u) << error;
    }
    if (ok) {
      EXPECT_EQ(dump.lines, 2u);
    }
  }
  std::istringstream in(good + "\n" + R"({"op":"ncclAllReduce","t_start_ns":500,"pid":7})" + "\n");
  RecordDump dump;
  std::string error;
  ASSERT_TRUE(ReadRecordDump(in, dump, error)) << error;
  ASSERT_EQ(dump.by_pid.at(7).size(), 2u);
  EXPECT_EQ(dump.by_pid.at(7)[0].t_ns, 500) << "ordered by start time";
  EXPECT_EQ(dump.by_pid.at(7)[1].bytes, 4096u);
  EXPECT_EQ(dump.by_pid.at(7)[1].comm, 0xabcdeu);
}

TEST(AnalyzeTraceInputTest, PlausibleIterationSecondsAreTheCsvBounds) {
  EXPECT_FALSE(PlausibleIterationSeconds(0));
  EXPECT_FALSE(PlausibleIterationSeconds(1e-10));
  EXPECT_TRUE(PlausibleIterationSeconds(1e-9));
  EXPECT_TRUE(PlausibleIterationSeconds(1e6));
  EXPECT_FALSE(PlausibleIterationSeconds(1e6 + 1));
  EXPECT_FALSE(PlausibleIterationSeconds(9.2e9));
}

}  // namespace
}  // namespace falcon::ctl
