// The shim's GPU timing in a CUDA program (falcon-emu-job --cuda over the CUDA driver emulator),
// where a real driver would punish a careless tool: a device that stalls must not stop the
// shim's service thread (its heartbeat is how the agent knows the process lives), a framework
// capturing CUDA graphs on another thread must never see its capture invalidated by the shim's
// calls, and a process that loads CUDA after its first NCCL call gets GPU timing from then on.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "daemon/shm/record_json.h"
#include "daemon/shm/segment_dir.h"
#include "daemon/shm/segment_reader.h"
#include "tests/support/subprocess.h"

namespace falcon {
namespace {

using daemon::SegmentReader;
using testing::TempDir;

constexpr int kRanks = 2;

class ShimGpuTimingTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (job_ > 0) testing::WaitFor(job_, 0);
  }

  // Starts a 2-rank CUDA job in profile mode (every call timed with events) that runs until
  // Finish(); `extra` goes to falcon-emu-job, `env` to its environment.
  void Start(std::vector<std::string> extra, std::vector<std::string> env = {}) {
    std::vector<std::string> argv = {testing::BinDir("bench/emu") + "/falcon-emu-run", "-n", std::to_string(kRanks),
                                     "--ranks-per-node", "2", "--job-timeout", "600", "--lib-dir", testing::EmuLibDir(),
                                     "--preload", testing::PreloadValue(), "--",
                                     testing::BinDir("bench/emu") + "/falcon-emu-job", "--iters", "1000000",
                                     "--compute-ms", "2", "--bytes", "65536", "--check", "--stop-file",
                                     dir_.path() + "/stop", "--cuda", testing::BinDir("cuda-emu-lib") + "/libcuda.so.1"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    env.insert(env.end(), {"FALCON_SHM_DIR=" + dir_.path(), "FALCON_KEEP_SEGMENT=1", "FALCON_MODE=profile"});
    out_ = dir_.path() + "/job.out";
    argv.insert(argv.begin(), {"/bin/sh", "-c", "exec \"$0\" \"$@\" > " + out_});
    job_ = testing::Spawn(argv, env);
    ASSERT_GT(job_, 0);
    ASSERT_TRUE(testing::WaitUntil(
        [&] {
          auto listed = daemon::ListSegments(dir_.path(), static_cast<uint32_t>(getuid()), false);
          if (!listed.ok() || listed.value().size() != kRanks) return false;
          segs_.clear();
          for (const auto& info : listed.value()) {
            auto seg = SegmentReader::Open(info.path);
            if (!seg.ok()) return false;
            segs_.push_back(std::move(seg.value()));
          }
          return true;
        },
        60))
        << "segments did not appear";
  }

  int Finish(double timeout_s) {
    if (FILE* f = std::fopen((dir_.path() + "/stop").c_str(), "w")) std::fclose(f);
    const int rc = testing::WaitFor(job_, timeout_s);
    job_ = -1;
    return rc;
  }

  // GPU timing records of rank `r` that carry a device time (result 0).
  size_t GpuTimed(size_t r) const {
    std::vector<FalconRecord> recs;
    daemon::ReadCursor cursor;
    segs_[r].Read(&cursor, ~size_t{0}, SegmentReader::ReadMode::kFinal, &recs);
    return static_cast<size_t>(std::count_if(recs.begin(), recs.end(), [](const FalconRecord& rec) {
      return rec.op == kFalconOpGpuTiming && rec.result == 0;
    }));
  }

  TempDir dir_;
  std::string out_;
  pid_t job_ = -1;
  std::vector<SegmentReader> segs_;
};

// Every event takes 2.5 s to complete, the service thread's own included: it must keep its
// 50 ms heartbeat regardless (it polls, never synchronises), and the job's data stays right.
TEST_F(ShimGpuTimingTest, AStalledDeviceNeverStopsTheServiceThread) {
  Start({}, {"FALCON_EMU_CUDA_EVENT_DELAY_S=2.5"});
  std::vector<int64_t> last(kRanks, 0), last_change(kRanks, 0), worst_gap(kRanks, 0);
  const int64_t until = testing::WallClockNs() + 6'000'000'000LL;
  while (testing::WallClockNs() < until) {
    const int64_t now = testing::WallClockNs();
    for (size_t r = 0; r < segs_.size(); ++r) {
      const int64_t hb = segs_[r].control().heartbeat_mono_ns;
      if (hb != last[r]) {
        if (last_change[r] != 0) worst_gap[r] = std::max(worst_gap[r], now - last_change[r]);
        last[r] = hb;
        last_change[r] = now;
      }
    }
    usleep(10 * 1000);
  }
  for (size_t r = 0; r < segs_.size(); ++r) {
    EXPECT_LT(worst_gap[r], 1'000'000'000LL) << "rank " << r << ": the heartbeat stopped for " << worst_gap[r] / 1000000
                                             << " ms while the device stalled";
  }
  EXPECT_EQ(Finish(120), 0) << testing::ReadFile(out_);
}

// Another thread captures CUDA graphs in the global mode the whole time while every NCCL call
// is timed with events: none of its captures may be invalidated (the job exits 3 if one is),
// and the calls still get device times.
TEST_F(ShimGpuTimingTest, ACaptureOnAnotherThreadIsNeverInvalidated) {
  Start({"--capture-thread"});
  ASSERT_TRUE(testing::WaitUntil([&] { return GpuTimed(0) >= 20 && GpuTimed(1) >= 20; }, 60))
      << "the job's calls got device times";
  usleep(300 * 1000);  // a few more service ticks with captures running
  EXPECT_EQ(Finish(120), 0) << testing::ReadFile(out_);
  const std::string out = testing::ReadFile(out_);
  EXPECT_NE(out.find("invalidated=0"), std::string::npos) << out;
  EXPECT_EQ(out.find("captures=0 "), std::string::npos) << "the capture thread ran\n" << out;
}

// The job loads the CUDA driver only at its third iteration, after its first NCCL calls: the
// shim finds it then and times the calls with events from there on.
TEST_F(ShimGpuTimingTest, TimingStartsWhenCudaAppearsAfterTheFirstCall) {
  Start({"--cuda-after", "3"});
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        for (const SegmentReader& s : segs_) {
          if (s.control().timing_source != kFalconTimingCudaEvents) return false;
        }
        return true;
      },
      30))
      << "the shim never switched to CUDA events";
  ASSERT_TRUE(testing::WaitUntil([&] { return GpuTimed(0) > 0 && GpuTimed(1) > 0; }, 30));
  EXPECT_EQ(Finish(120), 0) << testing::ReadFile(out_);
}

// Calls inside an NCCL group do their work at the group's end: the group is timed as one, by
// events around it on its stream, and the timing refers to the group's end record.
TEST_F(ShimGpuTimingTest, AGroupIsTimedAsOneByItsEnd) {
  Start({});
  ASSERT_TRUE(testing::WaitUntil([&] { return GpuTimed(0) >= 200; }, 60));
  EXPECT_EQ(Finish(120), 0) << testing::ReadFile(out_);
  std::vector<FalconRecord> recs;
  daemon::ReadCursor cursor;
  segs_[0].Read(&cursor, ~size_t{0}, SegmentReader::ReadMode::kFinal, &recs);
  std::set<std::pair<uint32_t, uint64_t>> timed;  // (lane, index) of records with a device time
  for (const FalconRecord& r : recs) {
    if (r.op == kFalconOpGpuTiming && r.result == 0) timed.insert({static_cast<uint32_t>(r.peer), r.comm_seq});
  }
  // From the first timed group on (the first calls may precede the service thread's events).
  size_t group_ends = 0, timed_groups = 0;
  std::vector<size_t> untimed;
  for (const FalconRecord& r : recs) {
    if ((r.op == kFalconOpSend || r.op == kFalconOpRecv) && (r.flags & kFalconFlagInGroup) != 0) {
      EXPECT_EQ(r.flags & kFalconFlagGpuPending, 0) << "a call inside a group is not timed alone";
    }
    if (r.op != kFalconOpGroupEnd || r.group_depth != 1) continue;
    const bool has_time = (r.flags & kFalconFlagGpuPending) != 0 && timed.count({r.lane, daemon::RecordIndex(r)}) > 0;
    if (timed_groups == 0 && !has_time) continue;
    ++group_ends;
    if (has_time) ++timed_groups;
    else untimed.push_back(group_ends);
  }
  EXPECT_GT(group_ends, 10u);
  // The job's last groups may end after the service thread's last poll (the process exits):
  // every untimed group must be among the last few.
  for (size_t u : untimed) {
    EXPECT_GE(u + 4, group_ends) << "group " << u << " of " << group_ends << " got no device time; untimed: "
                                 << ::testing::PrintToString(untimed);
  }
}

}  // namespace
}  // namespace falcon
