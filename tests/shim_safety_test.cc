// The shim must never break the job: bad environment, no room for its segment, full tables and
// nonsense from the agent all degrade to pass-through (or to less detail), with at most one log
// line each, and never change what the program computes. Real processes, real segments.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "daemon/shm/segment_dir.h"
#include "daemon/shm/segment_reader.h"
#include "tests/support/calls_prog.h"
#include "tests/support/subprocess.h"

namespace falcon {
namespace {

using daemon::SegmentReader;
using testing::ProcessResult;
using testing::TempDir;

using testing::CallsProg;

ProcessResult RunCalls(std::vector<std::string> env, bool with_shim = true,
                       std::vector<std::string> args = {"--threads", "2", "--iters", "30"}) {
  return testing::RunCallsProg(args, std::move(env), with_shim);
}

int CountShimLines(const std::string& err) {
  int n = 0;
  size_t pos = 0;
  while ((pos = err.find("[falcon-shim", pos)) != std::string::npos) {
    ++n;
    ++pos;
  }
  return n;
}

size_t SegmentCount(const std::string& dir) {
  auto listed = daemon::ListSegments(dir, static_cast<uint32_t>(getuid()), false);
  return listed.ok() ? listed.value().size() : 0;
}

struct EnvCase {
  const char* name;
  std::vector<std::string> env;
  int max_log_lines;
  bool expect_segment;
};

void PrintTo(const EnvCase& c, std::ostream* os) { *os << c.name; }

class ShimSafetyEnvTest : public ::testing::TestWithParam<EnvCase> {};

TEST_P(ShimSafetyEnvTest, BadEnvironmentStillPassesCallsThrough) {
  const EnvCase& c = GetParam();
  TempDir dir;
  ProcessResult plain = RunCalls({}, /*with_shim=*/false);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  std::vector<std::string> env = c.env;
  bool has_dir = false;
  for (const auto& e : env) has_dir |= e.rfind("FALCON_SHM_DIR=", 0) == 0;
  // Keep the segment for inspection only where it lands in our temporary directory.
  if (!has_dir) env.push_back("FALCON_SHM_DIR=" + dir.path());
  if (!has_dir) env.push_back("FALCON_KEEP_SEGMENT=1");
  ProcessResult traced = RunCalls(env);
  EXPECT_EQ(traced.exit_code, 0) << traced.err;
  EXPECT_EQ(traced.out, plain.out) << "the shim must not change results or error codes";
  EXPECT_LE(CountShimLines(traced.err), c.max_log_lines) << traced.err;
  EXPECT_EQ(SegmentCount(dir.path()), c.expect_segment ? 1u : 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ShimSafetyEnvTest,
    ::testing::Values(EnvCase{"MissingDir", {"FALCON_SHM_DIR=/nonexistent/falcon"}, 1, false},
                      EnvCase{"RelativeDir", {"FALCON_SHM_DIR=relative/dir"}, 1, false},
                      EnvCase{"DirIsAFile", {"FALCON_SHM_DIR=/proc/self/status"}, 1, false},
                      EnvCase{"RingGarbage", {"FALCON_RING_RECORDS=banana"}, 1, true},
                      EnvCase{"RingNotPowerOfTwo", {"FALCON_RING_RECORDS=1000"}, 1, true},
                      EnvCase{"RingNegative", {"FALCON_RING_RECORDS=-64"}, 1, true},
                      EnvCase{"RingTooLarge", {"FALCON_RING_RECORDS=99999999999999999999999"}, 1, true},
                      EnvCase{"UnknownMode", {"FALCON_MODE=turbo"}, 1, true},
                      EnvCase{"SampleZero", {"FALCON_MODE=sample", "FALCON_SAMPLE_EVERY=0"}, 1, true},
                      EnvCase{"CommCapacityHuge", {"FALCON_COMM_CAPACITY=4294967296"}, 1, true},
                      EnvCase{"BadLogLevel", {"FALCON_LOG=loud"}, 1, true},
                      EnvCase{"BadFallbackLibrary", {"FALCON_NCCL_LIBRARY=/nonexistent/libnccl.so"}, 0, true},
                      EnvCase{"Disabled", {"FALCON_DISABLE=1"}, 0, false},
                      EnvCase{"ModeOff", {"FALCON_MODE=off"}, 0, true},
                      EnvCase{"EverythingWrong",
                              {"FALCON_RING_RECORDS=x", "FALCON_MODE=?", "FALCON_SAMPLE_EVERY=-1",
                               "FALCON_THREAD_CAPACITY=1", "FALCON_KEEP_SEGMENT=maybe"},
                              5, true}),
    [](const ::testing::TestParamInfo<EnvCase>& p) { return std::string(p.param.name); });

TEST(ShimSafetyTest, NoRoomForTheSegmentMeansPassThrough) {
  TempDir dir;
  if (geteuid() != 0 || mount("tmpfs", dir.path().c_str(), "tmpfs", 0, "size=256k,mode=0777") != 0) {
    GTEST_SKIP() << "needs root to mount a tiny tmpfs";
  }
  ProcessResult plain = RunCalls({}, false);
  ProcessResult traced = RunCalls({"FALCON_SHM_DIR=" + dir.path(), "FALCON_KEEP_SEGMENT=1"});
  EXPECT_EQ(traced.exit_code, 0) << traced.err;
  EXPECT_EQ(traced.out, plain.out);
  EXPECT_EQ(CountShimLines(traced.err), 1) << traced.err;
  EXPECT_NE(traced.err.find("cannot reserve"), std::string::npos) << traced.err;
  EXPECT_EQ(SegmentCount(dir.path()), 0u) << "a segment that could not be sized is removed";
  umount(dir.path().c_str());
}

TEST(ShimSafetyTest, FullTablesDegradeToLessDetail) {
  TempDir dir;
  ProcessResult plain = RunCalls({}, false, {"--threads", "12", "--iters", "10"});
  ProcessResult traced = RunCalls({"FALCON_SHM_DIR=" + dir.path(), "FALCON_KEEP_SEGMENT=1", "FALCON_COMM_CAPACITY=16",
                                   "FALCON_THREAD_CAPACITY=4", "FALCON_LOG=info"},
                                  true, {"--threads", "12", "--iters", "10"});
  ASSERT_EQ(traced.exit_code, 0) << traced.err;
  EXPECT_EQ(traced.out, plain.out);
  auto listed = daemon::ListSegments(dir.path(), static_cast<uint32_t>(getuid()), false);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed.value().size(), 1u);
  auto seg = SegmentReader::Open(listed.value()[0].path);
  ASSERT_TRUE(seg.ok());
  EXPECT_EQ(seg.value().header().comm_overflow, 24u - 16u);
  EXPECT_EQ(seg.value().Comms().size(), 16u);
  EXPECT_LE(seg.value().Threads().size(), 4u) << "thread slots are reused, never beyond capacity";
  const unsigned long long calls = testing::ProgCalls(traced);
  ASSERT_GT(calls, 0u) << traced.out;
  EXPECT_EQ(seg.value().head() + seg.value().queries(), calls)
      << "calls on unrecorded communicators are still logged (queries counted)";
}

TEST(ShimSafetyTest, AgentCommandsApplyAndNonsenseIsIgnored) {
  TempDir dir;
  const std::string gate = dir.path() + "/go";
  pid_t pid = testing::Spawn({CallsProg(), "--iters", "40", "--wait-file", gate},
                             {"LD_LIBRARY_PATH=" + testing::NoopLibDir(), "FALCON_SHM_DIR=" + dir.path(),
                              "FALCON_KEEP_SEGMENT=1", "LD_PRELOAD=" + testing::PreloadValue()});
  ASSERT_GT(pid, 0);
  std::string path = daemon::SegmentPathOfPid(dir.path(), static_cast<uint32_t>(getuid()), pid);
  ASSERT_TRUE(testing::WaitUntil([&] { return SegmentReader::Open(path).ok(); }, 30));
  auto opened = SegmentReader::Open(path, SegmentReader::Access::kReadWrite);
  ASSERT_TRUE(opened.ok());
  SegmentReader& seg = opened.value();
  auto acked = [&](uint64_t want) {
    return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(seg.control().command_ack)).load() == want;
  };
  EXPECT_TRUE(testing::WaitUntil([&] { return seg.control().heartbeat_mono_ns > 0; }, 10)) << "heartbeat";
  seg.RequestMode(77, 5);  // an ABI value the shim does not know
  ASSERT_TRUE(testing::WaitUntil([&] { return acked(1); }, 10));
  EXPECT_EQ(seg.control().active_mode, static_cast<uint32_t>(kFalconModeTrack));
  const uint64_t switch_at = seg.head();
  seg.RequestMode(kFalconModeProfile, 1);
  ASSERT_TRUE(testing::WaitUntil([&] { return acked(2); }, 10));
  EXPECT_EQ(seg.control().active_mode, static_cast<uint32_t>(kFalconModeProfile));
  { std::ofstream(gate) << "go"; }
  EXPECT_EQ(testing::WaitFor(pid, 60), 0);
  std::vector<FalconRecord> recs;
  daemon::ReadCursor cursor;
  seg.Read(&cursor, ~size_t{0}, SegmentReader::ReadMode::kFinal, &recs);
  ASSERT_GT(recs.size(), switch_at + 10);
  EXPECT_FALSE(recs.front().flags & kFalconFlagHostEnd) << "track mode records no end time";
  EXPECT_TRUE(recs.back().flags & kFalconFlagHostEnd) << "profile mode (host timing here) records the end time";
  EXPECT_GE(recs.back().t_end_ns, recs.back().t_start_ns);
}

TEST(ShimSafetyTest, ReaderRejectsForeignOrDamagedSegments) {
  TempDir dir;
  const std::string path = dir.path() + "/falcon.0.1";
  auto write = [&](const FalconShmHeader& h, size_t size) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    std::string bytes(std::max(size, sizeof(h)), '\0');
    std::memcpy(bytes.data(), &h, sizeof(h));
    bytes.resize(size);
    f << bytes;
  };
  FalconShmHeader h{};
  write(h, 100);
  EXPECT_EQ(SegmentReader::Open(path).status().code(), Status::Code::kCorrupt);  // too small
  write(h, 1 << 16);
  EXPECT_NE(SegmentReader::Open(path).status().message().find("magic"), std::string::npos);
  h.magic = FALCON_SHM_MAGIC;
  h.abi_version = 99;
  write(h, 1 << 16);
  EXPECT_NE(SegmentReader::Open(path).status().message().find("ABI version 99"), std::string::npos);
  h.abi_version = FALCON_SHM_ABI_VERSION;
  h.header_size = sizeof(FalconShmHeader);
  h.control_size = sizeof(FalconControl);
  h.comm_entry_size = sizeof(FalconCommEntry);
  h.thread_slot_size = sizeof(FalconThreadSlot);
  h.record_size = sizeof(FalconRecord);
  h.segment_size = 1 << 16;
  h.lane_size = sizeof(FalconLane);
  write(h, 1 << 16);
  EXPECT_NE(SegmentReader::Open(path).status().message().find("plan block size 0"), std::string::npos);
  h.plan_size = sizeof(FalconPlanBlock);
  h.lane_count = 4;
  h.lane_capacity = 1 << 20;  // far larger than the file
  h.lane_offset = 2048;
  h.ring_offset = 4096;
  h.control_offset = 640;
  h.comm_offset = 1472;
  h.thread_offset = 1472;
  write(h, 1 << 16);
  EXPECT_NE(SegmentReader::Open(path).status().message().find("outside"), std::string::npos);
  EXPECT_EQ(SegmentReader::Open(dir.path() + "/absent").status().code(), Status::Code::kNotFound);
}

}  // namespace
}  // namespace falcon
