// Integration tests of the shim's recording: real processes under LD_PRELOAD, the no-op NCCL
// underneath (so only the shim is exercised), real shared-memory segments read back with the
// daemon's SegmentReader.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "daemon/shm/record_json.h"
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

// Runs falcon-test-calls under the shim (or not) with segments kept in `dir`.
ProcessResult RunCalls(const TempDir& dir, const std::vector<std::string>& args, std::vector<std::string> env,
                       bool with_shim = true) {
  env.push_back("FALCON_KEEP_SEGMENT=1");
  bool has_dir = false;
  for (const auto& e : env) has_dir |= e.rfind("FALCON_SHM_DIR=", 0) == 0;
  if (!has_dir) env.push_back("FALCON_SHM_DIR=" + dir.path());
  return testing::RunCallsProg(args, std::move(env), with_shim);
}

std::vector<daemon::SegmentInfo> Segments(const TempDir& dir) {
  auto listed = daemon::ListSegments(dir.path(), static_cast<uint32_t>(getuid()), false);
  EXPECT_TRUE(listed.ok()) << listed.status().ToString();
  return listed.ok() ? listed.value() : std::vector<daemon::SegmentInfo>{};
}

uint64_t CheckedProgCalls(const ProcessResult& r) {
  const uint64_t calls = testing::ProgCalls(r);
  EXPECT_GT(calls, 0u) << r.out << r.err;
  return calls;
}

std::vector<FalconRecord> ReadAll(const SegmentReader& seg, daemon::ReadStats* stats = nullptr) {
  std::vector<FalconRecord> out;
  daemon::ReadCursor cursor;
  daemon::ReadStats s = seg.Read(&cursor, ~size_t{0}, SegmentReader::ReadMode::kFinal, &out);
  if (stats != nullptr) *stats = s;
  return out;
}

TEST(ShimRecordingTest, EveryCallRecordedExactlyOnceFromEightThreads) {
  TempDir dir;
  ProcessResult r = RunCalls(dir, {"--threads", "8", "--iters", "2000"}, {"FALCON_RING_RECORDS=262144"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const uint64_t calls = CheckedProgCalls(r);
  auto segs = Segments(dir);
  ASSERT_EQ(segs.size(), 1u);
  auto seg = SegmentReader::Open(segs[0].path);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  daemon::ReadStats stats;
  std::vector<FalconRecord> recs = ReadAll(seg.value(), &stats);
  EXPECT_EQ(stats.lost, 0u);
  EXPECT_EQ(stats.torn, 0u);
  EXPECT_EQ(seg.value().records_dropped(), 0u);
  EXPECT_EQ(seg.value().queries(), 1u) << "its one ncclGetVersion is counted, not recorded";
  ASSERT_EQ(recs.size() + seg.value().queries(), calls) << "one record per call the program made, queries aside";
  std::map<uint16_t, uint64_t> by_op;
  std::map<uint32_t, std::vector<uint64_t>> seqs_by_comm;
  std::map<uint16_t, std::vector<uint64_t>> seqs_by_lane;
  std::set<uint32_t> comms_seen;
  for (size_t i = 0; i < recs.size(); ++i) {
    seqs_by_lane[recs[i].lane].push_back(daemon::RecordIndex(recs[i]));
    ++by_op[recs[i].op];
    if (recs[i].comm_slot != FALCON_NO_COMM) {
      comms_seen.insert(recs[i].comm_slot);
      if (FalconOpIsOrdered(recs[i].op)) seqs_by_comm[recs[i].comm_slot].push_back(recs[i].comm_seq);
      else EXPECT_EQ(recs[i].comm_seq, ~uint64_t{0}) << "op " << int(recs[i].op) << " is not ordered";
    }
    if (recs[i].op == kFalconOpSend || recs[i].op == kFalconOpRecv) {
      EXPECT_EQ(recs[i].group_depth, 1);
      EXPECT_TRUE(recs[i].flags & kFalconFlagInGroup);
    }
  }
  EXPECT_EQ(by_op[kFalconOpBcast], 8u * 2000u);
  EXPECT_EQ(by_op[kFalconOpBroadcast], 0u) << "NCCL's internal ncclBcast -> ncclBroadcast must not be counted";
  EXPECT_EQ(by_op[kFalconOpAllReduce], 8u * 2000u * 2u);
  EXPECT_EQ(by_op[kFalconOpGroupStart], 8u * 2000u);
  EXPECT_EQ(by_op[kFalconOpCommInitRank], 8u);
  // 8 threads, 4 lanes: up to three concurrent threads own a lane, the rest share the last
  // (a lane is reused once its thread exits); every lane's indices are dense.
  EXPECT_LE(seqs_by_lane.size(), 4u);
  for (auto& [lane, seqs] : seqs_by_lane) {
    std::sort(seqs.begin(), seqs.end());
    for (size_t k = 0; k < seqs.size(); ++k) ASSERT_EQ(seqs[k], k) << "lane " << lane;
  }
  // Per-communicator sequence numbers of ordered calls are dense and in order for each communicator.
  EXPECT_EQ(comms_seen.size(), 16u);    // 8 parents + 8 split children (only destroyed)
  EXPECT_EQ(seqs_by_comm.size(), 8u);   // the parents' ordered calls
  for (auto& [slot, seqs] : seqs_by_comm) {
    for (size_t k = 0; k < seqs.size(); ++k) EXPECT_EQ(seqs[k], k) << "comm slot " << slot;
  }
}

TEST(ShimRecordingTest, ResultsAndErrorCodesIdenticalWithAndWithoutShim) {
  TempDir dir;
  ProcessResult plain = RunCalls(dir, {"--threads", "3", "--iters", "50"}, {}, /*with_shim=*/false);
  ProcessResult traced = RunCalls(dir, {"--threads", "3", "--iters", "50"}, {});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(traced.exit_code, 0) << traced.err;
  EXPECT_EQ(plain.out, traced.out);
  EXPECT_EQ(Segments(dir).size(), 1u);
}

TEST(ShimRecordingTest, RingOverwritesOldestAndCountsLoss) {
  TempDir dir;
  // One thread: all its calls go to its own lane.
  ProcessResult r = RunCalls(dir, {"--iters", "200"}, {"FALCON_RING_RECORDS=64"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const uint64_t calls = CheckedProgCalls(r);
  auto segs = Segments(dir);
  ASSERT_EQ(segs.size(), 1u);
  auto seg = SegmentReader::Open(segs[0].path);
  ASSERT_TRUE(seg.ok());
  ASSERT_EQ(seg.value().queries(), 1u);
  const uint64_t recorded = calls - seg.value().queries();
  EXPECT_EQ(seg.value().head(), recorded);
  EXPECT_EQ(seg.value().records_lost(), recorded - 64) << "no reader consumed anything: every overwrite is a loss";
  daemon::ReadStats stats;
  std::vector<FalconRecord> recs = ReadAll(seg.value(), &stats);
  ASSERT_EQ(recs.size(), 64u);
  EXPECT_EQ(stats.lost, recorded - 64);
  EXPECT_EQ(daemon::RecordIndex(recs.front()), recorded - 64);
  EXPECT_EQ(daemon::RecordIndex(recs.back()), recorded - 1);
  EXPECT_EQ(recs.back().op, kFalconOpCommDestroy);
}

TEST(ShimRecordingTest, TornRecordIsDetectedNotReturned) {
  TempDir dir;
  ASSERT_EQ(RunCalls(dir, {"--iters", "10"}, {}).exit_code, 0);
  auto segs = Segments(dir);
  ASSERT_EQ(segs.size(), 1u);
  {
    // Simulate a writer that died in the middle of record 5: its version stays odd.
    auto rw = SegmentReader::Open(segs[0].path, SegmentReader::Access::kReadWrite);
    ASSERT_TRUE(rw.ok());
    const FalconShmHeader& h = rw.value().header();
    int fd = open(segs[0].path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    void* base = mmap(nullptr, h.segment_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    ASSERT_NE(base, MAP_FAILED);
    auto* ring = reinterpret_cast<FalconRecord*>(static_cast<char*>(base) + h.ring_offset);
    ring[5].version = 2 * 5 + 1;  // lane 0: the program's only calling thread
    ring[5].count = 0xDEADBEEF;
    munmap(base, h.segment_size);
  }
  auto seg = SegmentReader::Open(segs[0].path);
  ASSERT_TRUE(seg.ok());
  std::vector<FalconRecord> live;
  daemon::ReadCursor cursor;
  seg.value().Read(&cursor, ~size_t{0}, SegmentReader::ReadMode::kLive, &live);
  EXPECT_EQ(cursor.next[0], 5u) << "a live reader waits at a record still being written";
  EXPECT_EQ(live.size(), 5u);
  daemon::ReadStats stats;
  std::vector<FalconRecord> all = ReadAll(seg.value(), &stats);
  EXPECT_EQ(stats.torn, 1u);
  EXPECT_EQ(all.size(), seg.value().head() - 1);
  for (const FalconRecord& rec : all) EXPECT_NE(rec.count, 0xDEADBEEFu);
}

TEST(ShimRecordingTest, SegmentIsPrivateAndRemovedAtNormalExit) {
  TempDir dir;
  // Without FALCON_KEEP_SEGMENT the segment disappears at exit.
  ProcessResult r = testing::Run({CallsProg(), "--iters", "5"},
                                 {"LD_LIBRARY_PATH=" + testing::NoopLibDir(), "FALCON_SHM_DIR=" + dir.path(),
                                  "LD_PRELOAD=" + testing::PreloadValue()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(Segments(dir).empty());
  // With it, the segment stays, is 0600, and says the process exited normally.
  ASSERT_EQ(RunCalls(dir, {"--iters", "5"}, {"FALCON_JOB=unit"}).exit_code, 0);
  auto segs = Segments(dir);
  ASSERT_EQ(segs.size(), 1u);
  struct stat st;
  ASSERT_EQ(stat(segs[0].path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(segs[0].state, daemon::SegmentInfo::State::kExited);
  EXPECT_EQ(segs[0].job, "unit");
  EXPECT_EQ(segs[0].exe, "falcon-test-calls");
}

TEST(ShimRecordingTest, ForkChildGetsItsOwnSegment) {
  TempDir dir;
  ProcessResult r = RunCalls(dir, {"--iters", "20", "--fork"}, {});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto segs = Segments(dir);
  ASSERT_EQ(segs.size(), 2u);
  uint64_t total = 0;
  for (const auto& s : segs) {
    total += s.records;
    auto seg = SegmentReader::Open(s.path);
    ASSERT_TRUE(seg.ok());
    total += seg.value().queries();
  }
  const uint64_t child_calls = 2 + 20 * 8 + 3;
  EXPECT_EQ(total, CheckedProgCalls(r) + child_calls) << "parent and child record their own calls, once";
}

TEST(ShimRecordingTest, CrashedProcessSegmentIsOrphanedAndReaped) {
  TempDir dir;
  const std::string gate = dir.path() + "/never";
  pid_t pid = testing::Spawn({CallsProg(), "--iters", "5", "--wait-file", gate},
                             {"LD_LIBRARY_PATH=" + testing::NoopLibDir(), "FALCON_SHM_DIR=" + dir.path(),
                              "LD_PRELOAD=" + testing::PreloadValue()});
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(testing::WaitUntil([&] {
    auto s = Segments(dir);
    return s.size() == 1 && s[0].records > 2;
  }, 30));
  EXPECT_EQ(Segments(dir)[0].state, daemon::SegmentInfo::State::kLive);
  EXPECT_FALSE(daemon::ReapSegment(Segments(dir)[0]).ok()) << "a live segment is never reaped";
  kill(pid, SIGKILL);
  testing::WaitFor(pid, 10);
  auto segs = Segments(dir);
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(segs[0].state, daemon::SegmentInfo::State::kOrphaned);
  EXPECT_TRUE(daemon::ReapSegment(segs[0]).ok());
  EXPECT_TRUE(Segments(dir).empty());
}

}  // namespace
}  // namespace falcon
