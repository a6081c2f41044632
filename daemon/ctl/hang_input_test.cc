// falcon-ctl hang's input: where the Flight Recorder converter is looked for, what a document
// must hold, and real programs run under RunTool (exit status, output, the deadline, the output
// cap), standing in for the converter where LoadHangInput runs it.
#include "daemon/ctl/hang_input.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "daemon/ctl/tool_process.h"

namespace falcon::ctl {
namespace {

namespace fs = std::filesystem;

class HangInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/falcon-hang-input-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes `text` to dir_/name with `mode`; returns the path.
  std::string Write(const std::string& name, const std::string& text, fs::perms mode = fs::perms::owner_all) {
    const fs::path path = fs::path(dir_) / name;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
    fs::permissions(path, mode);
    return path.string();
  }

  std::string dir_;
};

constexpr const char* kDoc =
    R"({"format": "falcon-progress", "version": 1, "source": "flight-recorder", "missing_ranks": [3, 1, 3],
        "ranks": [{"rank": 0, "comms": [{"comm": "ab", "nranks": 4, "comm_rank": 0, "issued": 2, "completed": 2}]}]})";

TEST_F(HangInputTest, ConverterIsFoundWhereTheInstallPutsIt) {
  const std::string installed = Write("share/falcon/falcon-flight-recorder", "#!/bin/sh\n");
  const std::string beside = Write("bin/falcon-flight-recorder", "#!/bin/sh\n");
  const std::string self = dir_ + "/bin/falcon-ctl";

  Result<std::string> found = FindFlightRecorderTool("", nullptr, self);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(found.value(), dir_ + "/bin/../share/falcon/falcon-flight-recorder");

  fs::remove(installed);
  found = FindFlightRecorderTool("", "", self);  // an empty variable counts as unset
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(found.value(), beside);

  // The flag, then the variable, come first, and must name executable files.
  const std::string other = Write("elsewhere/tool", "#!/bin/sh\n");
  EXPECT_EQ(FindFlightRecorderTool("", other.c_str(), self).value(), other);
  EXPECT_EQ(FindFlightRecorderTool(other, "/nonexistent", self).value(), other);
  const std::string plain = Write("plain", "not executable", fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(FindFlightRecorderTool(plain, nullptr, self).status().message(),
            "--flight-recorder-tool " + plain + " is not an executable file");
  EXPECT_EQ(FindFlightRecorderTool("", dir_.c_str(), self).status().message(),
            "FALCON_FLIGHT_RECORDER_TOOL=" + dir_ + " is not an executable file");

  fs::remove(beside);
  found = FindFlightRecorderTool("", nullptr, self);
  EXPECT_EQ(found.status().code(), Status::Code::kNotFound);
  EXPECT_EQ(found.status().message(), "cannot find falcon-flight-recorder (looked in " + dir_ +
                                          "/bin/../share/falcon/falcon-flight-recorder, " + dir_ +
                                          "/bin/falcon-flight-recorder); give --flight-recorder-tool PATH or set "
                                          "FALCON_FLIGHT_RECORDER_TOOL");
}

TEST_F(HangInputTest, DocumentsAreCheckedMissingRanksIncluded) {
  Result<HangInput> in = ParseHangDocument(kDoc, "test");
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_EQ(in.value().source, "flight-recorder");
  EXPECT_EQ(in.value().origin, "test");
  ASSERT_EQ(in.value().ranks.size(), 1u);
  EXPECT_EQ(in.value().missing_ranks, (std::vector<std::int64_t>{1, 3}));

  struct Case {
    std::string text, error;
  } cases[] = {
      {"{", "test: not JSON: "},
      {R"({"format": "falcon-progress", "version": 1, "ranks": [], "missing_ranks": {}})",
       "test: missing_ranks: expected an array"},
      {R"({"format": "falcon-progress", "version": 1, "ranks": [], "missing_ranks": [0, -2]})",
       "test: missing_ranks[1]: expected a non-negative integer"},
      {R"({"format": "falcon-progress", "version": 1, "ranks": [{"rank": 0}]})", "test: ranks[0].comms: missing"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    Result<HangInput> bad = ParseHangDocument(c.text, "test");
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), Status::Code::kCorrupt);
    EXPECT_EQ(bad.status().message().substr(0, c.error.size()), c.error);
  }
}

TEST_F(HangInputTest, ExactlyOneSourceIsTaken) {
  HangSourceOptions none;
  EXPECT_EQ(LoadHangInput(none).status().code(), Status::Code::kInvalidArgument);
  HangSourceOptions both;
  both.progress = "x.json";
  both.flight_recorder = {"dumps/"};
  EXPECT_EQ(LoadHangInput(both).status().message(), "give one source: --live, --progress or --flight-recorder");
  HangSourceOptions live_and_file;
  live_and_file.live = true;
  live_and_file.progress = "x.json";
  EXPECT_EQ(LoadHangInput(live_and_file).status().code(), Status::Code::kInvalidArgument);
  HangSourceOptions live_empty;  // a directory without segments
  live_empty.live = true;
  live_empty.dir = dir_;
  EXPECT_EQ(LoadHangInput(live_empty).status().code(), Status::Code::kNotFound);
  HangSourceOptions absent;
  absent.progress = dir_ + "/absent.json";
  EXPECT_EQ(LoadHangInput(absent).status().code(), Status::Code::kNotFound);
  HangSourceOptions file;
  file.progress = Write("p.json", kDoc);
  Result<HangInput> in = LoadHangInput(file);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_EQ(in.value().origin, "progress file " + file.progress);
}

// A stand-in converter: prints the document and its arguments' count on stderr, or fails.
TEST_F(HangInputTest, TheConverterRunsWithTheDumpPathsAndItsFailureIsBadInput) {
  HangSourceOptions o;
  o.tool = Write("conv", std::string("#!/bin/sh\n[ \"$1\" = --prefix ] && [ \"$2\" = pre_ ] && [ \"$3\" = -- ] && "
                                     "[ \"$4\" = d1 ] && [ \"$5\" = d2 ] || exit 9\ncat <<'EOF'\n") + kDoc + "\nEOF\n");
  o.prefix = "pre_";
  o.flight_recorder = {"d1", "d2"};
  Result<HangInput> in = LoadHangInput(o);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_EQ(in.value().origin, "Flight Recorder dumps in d1 d2");
  EXPECT_EQ(in.value().missing_ranks, (std::vector<std::int64_t>{1, 3}));

  o.prefix = "other_";
  in = LoadHangInput(o);
  EXPECT_EQ(in.status().code(), Status::Code::kCorrupt);
  EXPECT_EQ(in.status().message(), o.tool + " exited with status 9 (its messages are above): no dump could be used");
}

TEST_F(HangInputTest, RunToolCapturesOutputAndExitStatus) {
  ToolRun run;
  run.argv = {"/bin/echo", "hello", "world"};
  Result<ToolOutput> out = RunTool(run);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out.value().exit_code, 0);
  EXPECT_EQ(out.value().out, "hello world\n");

  run.argv = {"/bin/sh", "-c", "read x; echo \"[$x]\"; exit 7"};  // stdin is /dev/null: read gets nothing
  out = RunTool(run);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out.value().exit_code, 7);
  EXPECT_EQ(out.value().out, "[]\n");

  run.argv = {dir_ + "/no-such-program"};
  out = RunTool(run);
  EXPECT_EQ(out.status().code(), Status::Code::kUnavailable);
  EXPECT_EQ(out.status().message(), "cannot run " + dir_ + "/no-such-program: No such file or directory");

  EXPECT_EQ(RunTool(ToolRun{}).status().code(), Status::Code::kInvalidArgument);
}

TEST_F(HangInputTest, RunToolKillsAProgramPastItsDeadlineOrItsOutputCap) {
  struct Case {
    std::vector<std::string> argv;
    std::size_t max_output;
    std::string error;
  } cases[] = {
      {{"/bin/sleep", "30"}, 1024, "/bin/sleep did not finish within 1 s: killed"},
      // Closes its stdout first: the deadline still holds while it runs on.
      {{"/bin/sh", "-c", "exec >&-; exec sleep 30"}, 1024, "/bin/sh did not exit before its deadline: killed"},
      {{"/bin/sh", "-c", "head -c 100000 /dev/zero; exec sleep 30"}, 1000, "/bin/sh wrote more than 1000 bytes: killed"},
      {{"/bin/sh", "-c", "kill -TERM $$"}, 1024, "/bin/sh died of signal 15"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.argv.back());
    ToolRun run;
    run.argv = c.argv;
    run.timeout_s = 1;
    run.max_output = c.max_output;
    const auto start = std::chrono::steady_clock::now();
    Result<ToolOutput> out = RunTool(run);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(out.status().code(), Status::Code::kInternal);
    EXPECT_EQ(out.status().message().substr(0, c.error.size()), c.error);
    EXPECT_LT(took, 10.0);  // never the 30 s the program would take
  }
}

}  // namespace
}  // namespace falcon::ctl
