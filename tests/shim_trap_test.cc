// The trap and the benchmark executor, end to end: a 4-rank emulated job under the real shim;
// this test plays the agent through the segments' control blocks (SegmentReader). Pauses stop
// every rank at the same call of the world communicator (a consistent cut), validation tasks
// run on the paused ranks, training resumes, and the job's own --check proves no training data
// was lost or corrupted. Deadlines: a pause nobody resumes ends by itself; a target already
// passed is reported, not trapped.
#include <gtest/gtest.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "daemon/shm/segment_dir.h"
#include "daemon/shm/segment_reader.h"
#include "tests/support/subprocess.h"

namespace falcon {
namespace {

using daemon::SegmentReader;
using testing::TempDir;

constexpr int kRanks = 4;
constexpr uint32_t kWorldSlot = 0;  // falcon-emu-job creates its world communicator first

int64_t RealNow() { return testing::WallClockNs(); }

// The same GEMM task (m x n x k, `repeats` timed) for every rank.
std::vector<FalconTask> GemmOnAll(uint32_t repeats, uint32_t m, uint32_t n, uint32_t k) {
  return std::vector<FalconTask>(kRanks, FalconTask{kFalconTaskGemm, repeats, 0, -1, -1, m, n, k, 0, 0, 0, {}});
}

// A ring pass on the validation communicator (rank r of the job is its rank r): r sends to
// r+1, receives from r-1.
std::vector<FalconTask> RingPass(uint64_t bytes) {
  std::vector<FalconTask> ring(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    ring[static_cast<size_t>(r)] = FalconTask{
        kFalconTaskP2p, 3, FALCON_VALIDATION_COMM, (r + 1) % kRanks, (r + kRanks - 1) % kRanks, 0, 0, 0, bytes, 0, 0, {}};
  }
  return ring;
}

// Every rank joins the validation communicator as its job rank, with buffers of `bytes`.
FalconTask Join(int rank, uint64_t bytes) {
  return FalconTask{kFalconTaskCommJoin, 1, 0, -1, -1, kRanks, static_cast<uint32_t>(rank), 0, bytes, 0, 0, {}};
}

class ShimTrapTest : public ::testing::Test {
 protected:
  // A job still running when a test ends early (a failed ASSERT) is killed, never left behind.
  void TearDown() override {
    if (job_ > 0) testing::WaitFor(job_, 0);
  }

  // Starts the job and opens every rank's segment read-write, ordered by world rank. The job
  // runs until FinishJob() (at most `iters` iterations), so slow builds never run out of job.
  // `gpu`: the job is a CUDA program over the CUDA driver and cuBLAS emulators (falcon-emu-job
  // --cuda), so the shim takes its GPU paths; `env` is added to the job's environment.
  // `job_args` are appended to the job's command line.
  void StartJob(int iters = 1'000'000, bool gpu = false, std::vector<std::string> env = {},
                const std::vector<std::string>& job_args = {}) {
    std::vector<std::string> argv = {testing::BinDir("bench/emu") + "/falcon-emu-run", "-n", std::to_string(kRanks),
                                     "--ranks-per-node", "2", "--job-timeout", "600", "--lib-dir", testing::EmuLibDir(),
                                     "--preload", testing::PreloadValue(), "--",
                                     testing::BinDir("bench/emu") + "/falcon-emu-job", "--iters", std::to_string(iters),
                                     "--compute-ms", "2", "--bytes", "65536", "--check", "--stop-file",
                                     dir_.path() + "/stop"};
    env.insert(env.end(), {"FALCON_SHM_DIR=" + dir_.path(), "FALCON_KEEP_SEGMENT=1", "FALCON_RING_RECORDS=131072"});
    if (gpu) {
      argv.insert(argv.end(), {"--cuda", testing::BinDir("cuda-emu-lib") + "/libcuda.so.1"});
      env.push_back("FALCON_CUBLAS=" + testing::BinDir("cuda-emu-lib") + "/libcublas.so.13");
    }
    argv.insert(argv.end(), job_args.begin(), job_args.end());
    // The job's stderr (the shims' log lines) goes to job_log(): exec'd by a shell that redirects.
    argv.insert(argv.begin(), {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>>'" + job_log() + "'"});
    job_ = testing::Spawn(argv, env);
    ASSERT_GT(job_, 0);
    ASSERT_TRUE(testing::WaitUntil([&] { return OpenAll(); }, 60)) << "segments did not appear";
  }

  // Asks the job to stop after its current iteration; returns its exit code (-1: still running
  // after timeout_s, and killed).
  int FinishJob(double timeout_s) {
    if (FILE* f = std::fopen((dir_.path() + "/stop").c_str(), "w")) std::fclose(f);
    const int rc = testing::WaitFor(job_, timeout_s);
    job_ = -1;
    return rc;
  }

  bool OpenAll() {
    auto listed = daemon::ListSegments(dir_.path(), static_cast<uint32_t>(getuid()), false);
    if (!listed.ok() || listed.value().size() != kRanks) return false;
    std::vector<std::pair<int, SegmentReader>> found;
    for (const auto& info : listed.value()) {
      auto seg = SegmentReader::Open(info.path, SegmentReader::Access::kReadWrite);
      if (!seg.ok()) return false;
      auto comms = seg.value().Comms();
      if (comms.empty() || comms[0].slot != kWorldSlot) return false;  // world not created yet
      found.emplace_back(comms[0].entry.rank, std::move(seg.value()));
    }
    std::sort(found.begin(), found.end(), [](auto& a, auto& b) { return a.first < b.first; });
    segs_.clear();
    for (auto& f : found) segs_.push_back(std::move(f.second));
    return true;
  }

  // Requests a pause a few iterations ahead on every rank; returns the generations.
  std::vector<uint64_t> PauseAll(int64_t deadline_ns, uint64_t ahead = 90) {
    uint64_t target = 0;
    for (auto& s : segs_) target = std::max(target, s.CommCalls(kWorldSlot));
    std::vector<uint64_t> gens;
    for (auto& s : segs_) gens.push_back(s.RequestPause(kWorldSlot, target + ahead, deadline_ns));
    return gens;
  }

  bool AllIn(FalconPauseState want, const std::vector<uint64_t>& gens, double timeout_s) {
    const bool ok = testing::WaitUntil([&] {
      for (size_t r = 0; r < segs_.size(); ++r) {
        uint64_t ack = 0;
        if (segs_[r].pause_state(&ack) != want || ack != gens[r]) return false;
      }
      return true;
    }, timeout_s);
    for (size_t r = 0; !ok && r < segs_.size(); ++r) {
      uint64_t ack = 0;
      const FalconPauseState st = segs_[r].pause_state(&ack);
      ADD_FAILURE() << "rank " << r << ": state " << st << " for pause " << ack << " (want " << want << " for "
                    << gens[r] << "), world calls " << segs_[r].CommCalls(kWorldSlot);
    }
    return ok;
  }

  // Makes a validation communicator's id on rank 0 and has every rank in `joiners` join it;
  // returns the join results (by rank; ranks not in `joiners` get a default result).
  std::vector<FalconTaskResult> JoinValidationComm(uint64_t bytes, const std::vector<int>& joiners) {
    const uint64_t id_seq = segs_[0].PostTask(FalconTask{kFalconTaskCommId, 1, 0, -1, -1, 0, 0, 0, 0, 0, 0, {}});
    FalconTaskResult id{};
    EXPECT_TRUE(testing::WaitUntil([&] { return segs_[0].TaskDone(id_seq, &id); }, 30));
    EXPECT_EQ(id.status, kFalconTaskOk) << "rank 0 made the unique id";
    uint8_t blob[FALCON_TASK_BLOB_LEN];
    segs_[0].TaskResultBlob(blob);
    std::vector<uint64_t> seqs(segs_.size(), 0);
    for (int r : joiners) seqs[static_cast<size_t>(r)] = segs_[static_cast<size_t>(r)].PostTask(Join(r, bytes), blob);
    std::vector<FalconTaskResult> results(segs_.size());
    EXPECT_TRUE(testing::WaitUntil([&] {
      for (int r : joiners) {
        if (!segs_[static_cast<size_t>(r)].TaskDone(seqs[static_cast<size_t>(r)], &results[static_cast<size_t>(r)])) {
          return false;
        }
      }
      return true;
    }, 30)) << "joins did not finish";
    return results;
  }

  std::vector<FalconTaskResult> JoinAll(uint64_t bytes) {
    std::vector<int> all;
    for (int r = 0; r < kRanks; ++r) all.push_back(r);
    return JoinValidationComm(bytes, all);
  }

  std::vector<FalconTaskResult> RunOnAll(const std::vector<FalconTask>& tasks) {
    std::vector<uint64_t> seqs;
    for (size_t r = 0; r < segs_.size(); ++r) seqs.push_back(segs_[r].PostTask(tasks[r]));
    std::vector<FalconTaskResult> results(segs_.size());
    EXPECT_TRUE(testing::WaitUntil([&] {
      for (size_t r = 0; r < segs_.size(); ++r) {
        if (!segs_[r].TaskDone(seqs[r], &results[r])) return false;
      }
      return true;
    }, 30)) << "tasks did not finish";
    return results;
  }

  std::string job_log() const { return dir_.path() + "/job.log"; }

  TempDir dir_;
  pid_t job_ = -1;
  std::vector<SegmentReader> segs_;
};

TEST_F(ShimTrapTest, PauseValidateResumeCyclesLoseNoTrainingData) {
  // FALCON_TEST_TRAP_CYCLES lowers the count for slow (sanitizer) builds; the default is 50.
  const char* env = std::getenv("FALCON_TEST_TRAP_CYCLES");
  const int cycles = env != nullptr && std::atoi(env) > 0 ? std::atoi(env) : 50;
  StartJob();
  std::vector<double> pause_ms;
  for (int cycle = 0; cycle < cycles; ++cycle) {
    std::vector<uint64_t> gens = PauseAll(RealNow() + 20'000'000'000LL);
    ASSERT_TRUE(AllIn(kFalconPauseTrapped, gens, 30)) << "cycle " << cycle << ": not every rank trapped";
    // Every rank stopped before the same call of the world communicator: a consistent cut.
    uint64_t cut = segs_[0].CommCalls(kWorldSlot);
    for (auto& s : segs_) EXPECT_EQ(s.CommCalls(kWorldSlot), cut) << "cycle " << cycle;

    for (const FalconTaskResult& r : RunOnAll(GemmOnAll(3, 48, 48, 48))) {
      EXPECT_EQ(r.status, kFalconTaskOk);
      EXPECT_GT(r.rate, 0.0);
      EXPECT_LE(r.min_s, r.median_s);
    }
    if (cycle == 0) {  // a process without a GPU has no bf16 GEMM worth comparing
      std::vector<FalconTask> bf16 = GemmOnAll(1, 16, 16, 16);
      for (FalconTask& t : bf16) t.dtype = kFalconGemmBf16;
      for (const FalconTaskResult& r : RunOnAll(bf16)) EXPECT_EQ(r.status, kFalconTaskUnsupported);
    }
    for (const FalconTaskResult& r : JoinAll(32768)) EXPECT_EQ(r.status, kFalconTaskOk) << "cycle " << cycle;
    for (const FalconTaskResult& r : RunOnAll(RingPass(32768))) {
      EXPECT_EQ(r.status, kFalconTaskOk);
      EXPECT_GT(r.rate, 0.0);
    }
    for (size_t r = 0; r < segs_.size(); ++r) segs_[r].RequestResume(gens[r]);
    ASSERT_TRUE(AllIn(kFalconPauseResumed, gens, 10));
    int64_t first_trap = INT64_MAX, last_resume = 0;
    for (auto& s : segs_) {
      first_trap = std::min(first_trap, s.control().trapped_real_ns);
      last_resume = std::max(last_resume, s.control().resumed_real_ns);
    }
    pause_ms.push_back(static_cast<double>(last_resume - first_trap) / 1e6);
  }
  std::sort(pause_ms.begin(), pause_ms.end());
  std::printf("[ pauses   ] %zu cycles (trap -> GEMM x3 -> join -> ring p2p x3 -> resume): p50 %.1f ms, max %.1f ms\n",
              pause_ms.size(), pause_ms[pause_ms.size() / 2], pause_ms.back());
  EXPECT_EQ(FinishJob(120), 0) << "the job's --check found wrong data, or it failed";
  // The benchmark traffic is flagged and takes no per-communicator sequence number.
  std::vector<FalconRecord> recs;
  daemon::ReadCursor cursor;
  segs_[0].Read(&cursor, ~size_t{0}, SegmentReader::ReadMode::kFinal, &recs);
  size_t bench = 0, annotations = 0;
  for (const FalconRecord& r : recs) {
    if (r.flags & kFalconFlagBenchmark) {
      ++bench;
      EXPECT_EQ(r.comm_seq, ~uint64_t{0});
    }
    if (r.op == kFalconOpAnnotation) ++annotations;
  }
  EXPECT_EQ(bench, static_cast<size_t>(cycles) * 4 * 2) << "4 ring passes (1 warm-up + 3) x send+recv per cycle";
  EXPECT_EQ(annotations, static_cast<size_t>(cycles) * 2) << "a begin and an end per pause";
}

TEST_F(ShimTrapTest, DeadlinesEndPausesAndStaleOrBadRequestsAreReported) {
  StartJob();
  // Nobody resumes: the trap lets training go on at the deadline. (Deadlines leave room for a
  // loaded machine: every rank must reach the target call, 30 iterations ahead, before it.)
  std::vector<uint64_t> gens = PauseAll(RealNow() + 8'000'000'000LL);
  ASSERT_TRUE(AllIn(kFalconPauseTrapped, gens, 30));
  ASSERT_TRUE(AllIn(kFalconPauseTimedOut, gens, 20));
  // A target already issued is reported as missed, not trapped.
  std::vector<uint64_t> missed;
  for (auto& s : segs_) missed.push_back(s.RequestPause(kWorldSlot, 0, RealNow() + 20'000'000'000LL));
  ASSERT_TRUE(AllIn(kFalconPauseMissed, missed, 10));
  // A target that is never reached before the deadline expires.
  std::vector<uint64_t> far = PauseAll(RealNow() + 2'000'000'000LL, /*ahead=*/1'000'000'000);
  ASSERT_TRUE(AllIn(kFalconPauseExpired, far, 10));
  // Nonsense is rejected: no such communicator slot, or a deadline in the past.
  std::vector<uint64_t> bad;
  for (auto& s : segs_) bad.push_back(s.RequestPause(1u << 30, 1, RealNow() + 20'000'000'000LL));
  ASSERT_TRUE(AllIn(kFalconPauseRejected, bad, 10));
  bad.clear();
  for (auto& s : segs_) bad.push_back(s.RequestPause(kWorldSlot, 1, RealNow() - 1));
  ASSERT_TRUE(AllIn(kFalconPauseRejected, bad, 10));
  bad.clear();  // a deadline beyond the protocol's hour would keep ranks trapped for ever
  for (auto& s : segs_) bad.push_back(s.RequestPause(kWorldSlot, 1u << 30, RealNow() + 2 * FALCON_PAUSE_MAX_NS));
  ASSERT_TRUE(AllIn(kFalconPauseRejected, bad, 10));
  // The int64_t extremes: INT64_MAX lies beyond the hour; INT64_MIN lies in the past, and the
  // shim must say so without computing INT64_MIN - now (signed overflow: undefined, and in
  // practice a wrap to about +7.5e18 ns), so the distance it logs saturates at INT64_MIN.
  bad.clear();
  for (auto& s : segs_) bad.push_back(s.RequestPause(kWorldSlot, 1u << 30, INT64_MAX));
  ASSERT_TRUE(AllIn(kFalconPauseRejected, bad, 10));
  std::vector<uint64_t> past;
  for (auto& s : segs_) past.push_back(s.RequestPause(kWorldSlot, 1u << 30, INT64_MIN));
  ASSERT_TRUE(AllIn(kFalconPauseRejected, past, 10));
  for (size_t r = 0; r < segs_.size(); ++r) {
    const std::string max_line = "rejected pause request " + std::to_string(bad[r]) + ": deadline more than an hour ahead";
    const std::string min_line = "rejected pause request " + std::to_string(past[r]) + ": deadline in the past (";
    const std::string min_distance = "deadline -9223372036854775808 ns from now)";
    EXPECT_TRUE(testing::WaitUntil([&] {
      const std::string log = testing::ReadFile(job_log());
      const std::size_t at = log.find(min_line);
      return log.find(max_line) != std::string::npos && at != std::string::npos &&
             log.substr(at, log.find('\n', at) - at).find(min_distance) != std::string::npos;
    }, 10)) << "rank " << r << ": want '" << max_line << "' and '" << min_line << "..." << min_distance << "' in\n"
            << testing::ReadFile(job_log());
  }
  bad.clear();  // more targets than the control block holds: refused, never a shorter cut
  const std::vector<FalconPauseTarget> many(FALCON_PAUSE_MAX_TARGETS + 1, FalconPauseTarget{kWorldSlot, 0, 1u << 30});
  for (auto& s : segs_) bad.push_back(s.RequestPause(many, RealNow() + 20'000'000'000LL));
  ASSERT_TRUE(AllIn(kFalconPauseRejected, bad, 10));
  EXPECT_EQ(FinishJob(120), 0) << "the job's --check found wrong data, or it failed";
}

// Several targets: the first call that reaches its communicator's target stops the rank (here
// the world's, the TP and DP targets being far ahead); the control block names the held call's
// communicator, whose count already includes it. A target already passed on any communicator is
// reported missed.
TEST_F(ShimTrapTest, SeveralTargetsStopAtTheFirstOneReached) {
  StartJob();
  uint64_t world = 0;
  for (auto& s : segs_) world = std::max(world, s.CommCalls(kWorldSlot));
  // falcon-emu-job's world calls: init 0, two splits, then per iteration a grouped send/recv and
  // a broadcast: seq 5 + 3i. Target a broadcast, so the stop is before it (not after a group).
  world += 90;
  world += (5 + 3 * 1'000'000 - world) % 3;
  world -= 90;
  std::vector<uint64_t> gens;
  const int64_t deadline = RealNow() + 20'000'000'000LL;
  for (auto& s : segs_) {
    const std::vector<FalconPauseTarget> targets = {
        {1, 0, s.CommCalls(1) + 1'000'000}, {kWorldSlot, 0, world + 90}, {2, 0, s.CommCalls(2) + 1'000'000}};
    gens.push_back(s.RequestPause(targets, deadline));
  }
  ASSERT_TRUE(AllIn(kFalconPauseTrapped, gens, 30));
  for (auto& s : segs_) {
    EXPECT_EQ(s.trapped_comm_slot(), kWorldSlot);
    EXPECT_EQ(s.CommCalls(kWorldSlot), world + 91) << "held before call world + 90, whose number is taken";
  }
  for (size_t r = 0; r < segs_.size(); ++r) segs_[r].RequestResume(gens[r]);
  ASSERT_TRUE(AllIn(kFalconPauseResumed, gens, 10));
  std::vector<uint64_t> missed;
  for (auto& s : segs_) {
    const std::vector<FalconPauseTarget> targets = {{kWorldSlot, 0, s.CommCalls(kWorldSlot) + 1'000'000}, {1, 0, 0}};
    missed.push_back(s.RequestPause(targets, RealNow() + 20'000'000'000LL));
  }
  ASSERT_TRUE(AllIn(kFalconPauseMissed, missed, 10));
  EXPECT_EQ(FinishJob(120), 0) << "the job's --check found wrong data, or it failed";
}

// A CUDA program (over the CUDA driver and cuBLAS emulators): the GEMM runs through cuBLAS on
// device memory, the ring pass moves device buffers on the validation communicator
// through Falcon's own stream, both timed with CUDA events; profile mode times the job's calls
// with events too. The job's --check proves its data survived.
TEST_F(ShimTrapTest, OnAGpuTasksUseDeviceBuffersCublasAndCudaEvents) {
  StartJob(1'000'000, /*gpu=*/true);
  for (auto& s : segs_) EXPECT_EQ(s.control().timing_source, kFalconTimingCudaEvents) << "the shim saw the driver";
  segs_[0].RequestMode(kFalconModeProfile, 1);
  std::vector<uint64_t> gens = PauseAll(RealNow() + 20'000'000'000LL);
  ASSERT_TRUE(AllIn(kFalconPauseTrapped, gens, 30));
  for (const FalconTaskResult& r : RunOnAll(GemmOnAll(3, 64, 32, 48))) {
    EXPECT_EQ(r.status, kFalconTaskOk);
    EXPECT_EQ(r.timing_source, kFalconTimingCudaEvents) << "the GEMM ran on the device path";
    EXPECT_EQ(r.dtype, kFalconGemmF32);
    EXPECT_GT(r.rate, 0.0);
    EXPECT_LE(r.min_s, r.median_s);
    EXPECT_LE(r.median_s, r.max_s);
  }
  // The tensor-core types go through cublasGemmEx (odd sizes: the buffers round up to whole
  // words of the fill); an unknown type is a bad request.
  for (uint8_t dtype : {uint8_t{kFalconGemmBf16}, uint8_t{kFalconGemmF16}}) {
    std::vector<FalconTask> tasks = GemmOnAll(2, 33, 17, 9);
    for (FalconTask& t : tasks) t.dtype = dtype;
    for (const FalconTaskResult& r : RunOnAll(tasks)) {
      EXPECT_EQ(r.status, kFalconTaskOk) << "dtype " << int(dtype);
      EXPECT_EQ(r.dtype, dtype);
      EXPECT_EQ(r.timing_source, kFalconTimingCudaEvents);
      EXPECT_GT(r.rate, 0.0);
    }
  }
  std::vector<FalconTask> bad = GemmOnAll(1, 8, 8, 8);
  for (FalconTask& t : bad) t.dtype = 7;
  for (const FalconTaskResult& r : RunOnAll(bad)) EXPECT_EQ(r.status, kFalconTaskBadRequest);
  for (const FalconTaskResult& r : JoinAll(262144)) {
    EXPECT_EQ(r.status, kFalconTaskOk);
    EXPECT_EQ(r.timing_source, kFalconTimingCudaEvents) << "device buffers";
  }
  for (const FalconTaskResult& r : RunOnAll(RingPass(262144))) {
    EXPECT_EQ(r.status, kFalconTaskOk);
    EXPECT_EQ(r.timing_source, kFalconTimingCudaEvents) << "the transfers ran on the device path";
    EXPECT_GT(r.rate, 0.0);
  }
  for (size_t r = 0; r < segs_.size(); ++r) segs_[r].RequestResume(gens[r]);
  ASSERT_TRUE(AllIn(kFalconPauseResumed, gens, 10));
  EXPECT_EQ(FinishJob(120), 0) << "the job's --check found wrong data, or it failed";
  std::vector<FalconRecord> recs;
  daemon::ReadCursor cursor;
  segs_[0].Read(&cursor, ~size_t{0}, SegmentReader::ReadMode::kFinal, &recs);
  size_t gpu_timed = 0, bench = 0, warmups = 0;
  for (const FalconRecord& r : recs) {
    if (r.op == kFalconOpGpuTiming && r.result == 0) {
      ++gpu_timed;
      EXPECT_GE(r.t_end_ns, r.t_start_ns);
    }
    if (r.flags & kFalconFlagBenchmark) {
      ++bench;
      if (r.count == FALCON_P2P_WARMUP_BYTES) ++warmups;
      else EXPECT_EQ(r.count, 262144u);
    }
  }
  EXPECT_GT(gpu_timed, 0u) << "profile mode timed the job's calls with events";
  EXPECT_EQ(bench, 8u) << "(1 warm-up + 3) x send+recv";
  EXPECT_EQ(warmups, 2u) << "the warm-up moves only enough to set up connections";
}

// A device that never finishes (every event stays pending): the task fails at the pause's
// deadline instead of waiting for ever, the pause ends by itself, and training goes on.
TEST_F(ShimTrapTest, OnAStalledGpuATaskFailsAtThePauseDeadlineAndTrainingGoesOn) {
  StartJob(1'000'000, /*gpu=*/true, {"FALCON_EMU_CUDA_EVENT_DELAY_S=100000"});
  std::vector<uint64_t> gens = PauseAll(RealNow() + 8'000'000'000LL);
  ASSERT_TRUE(AllIn(kFalconPauseTrapped, gens, 30));
  for (const FalconTaskResult& r : RunOnAll(GemmOnAll(2, 32, 32, 32))) EXPECT_EQ(r.status, kFalconTaskFailed);
  ASSERT_TRUE(AllIn(kFalconPauseTimedOut, gens, 20));
  EXPECT_EQ(FinishJob(120), 0) << "the job's --check found wrong data, or it failed";
}

// The GEMM is fenced against the job's queued device work: a kernel the job left running on a
// stream its NCCL calls use keeps the GEMM from starting, so the task fails at the pause's
// deadline (it never measures a device the job still occupies), the pause ends by itself, and
// training goes on.
TEST_F(ShimTrapTest, OnAGpuTheGemmWaitsForTheJobsQueuedWork) {
  StartJob(1'000'000, /*gpu=*/true, {}, {"--side-kernel-s", "100000"});
  std::vector<uint64_t> gens = PauseAll(RealNow() + 8'000'000'000LL);
  ASSERT_TRUE(AllIn(kFalconPauseTrapped, gens, 30));
  for (const FalconTaskResult& r : RunOnAll(GemmOnAll(2, 32, 32, 32))) {
    EXPECT_EQ(r.status, kFalconTaskFailed) << "the GEMM ran while the job's kernel still occupied its device";
  }
  ASSERT_TRUE(AllIn(kFalconPauseTimedOut, gens, 20));
  EXPECT_EQ(FinishJob(120), 0) << "the job's --check found wrong data, or it failed";
}

// Validation traffic never runs on the job's communicators: a P2P task naming one is refused.
// A rank that never joins the validation communicator makes the others' joins fail by the task
// deadline (nobody posts a transfer); a rank that joined but never posts makes its peers'
// transfers fail by the deadline, and the communicator is aborted. Training goes on with its
// data intact after each.
TEST_F(ShimTrapTest, AMissingRankFailsTheRoundByItsDeadlineAndTrainingGoesOn) {
  StartJob();
  std::vector<uint64_t> gens = PauseAll(RealNow() + 30'000'000'000LL);
  ASSERT_TRUE(AllIn(kFalconPauseTrapped, gens, 30));
  std::vector<FalconTask> on_job = RingPass(4096);
  for (FalconTask& t : on_job) t.comm_slot = kWorldSlot;
  for (const FalconTaskResult& r : RunOnAll(on_job)) EXPECT_EQ(r.status, kFalconTaskBadRequest);

  // Rank 3 never joins: the other joins end by their 3 s deadline, failed.
  const int64_t t0 = RealNow();
  const uint64_t id_seq = segs_[0].PostTask(FalconTask{kFalconTaskCommId, 1, 0, -1, -1, 0, 0, 0, 0, 0, 0, {}});
  FalconTaskResult id{};
  ASSERT_TRUE(testing::WaitUntil([&] { return segs_[0].TaskDone(id_seq, &id); }, 30));
  uint8_t blob[FALCON_TASK_BLOB_LEN];
  segs_[0].TaskResultBlob(blob);
  std::vector<uint64_t> seqs;
  for (int r = 0; r < 3; ++r) {
    FalconTask join = Join(r, 4096);
    join.deadline_real_ns = RealNow() + 3'000'000'000LL;
    seqs.push_back(segs_[static_cast<size_t>(r)].PostTask(join, blob));
  }
  std::vector<FalconTaskResult> joined(3);
  ASSERT_TRUE(testing::WaitUntil([&] {
    for (size_t r = 0; r < 3; ++r) {
      if (!segs_[r].TaskDone(seqs[r], &joined[r])) return false;
    }
    return true;
  }, 20)) << "a join waited past its deadline";
  for (const FalconTaskResult& r : joined) EXPECT_EQ(r.status, kFalconTaskFailed);
  EXPECT_LT(RealNow() - t0, 10'000'000'000LL) << "the joins failed by their deadline, not later";

  // Everybody joins; rank 3 never posts its transfer: the others fail by the 3 s deadline.
  for (const FalconTaskResult& r : JoinAll(4096)) ASSERT_EQ(r.status, kFalconTaskOk);
  std::vector<FalconTask> ring = RingPass(4096);
  std::vector<uint64_t> posted;
  for (int r = 0; r < 3; ++r) {
    ring[static_cast<size_t>(r)].deadline_real_ns = RealNow() + 3'000'000'000LL;
    posted.push_back(segs_[static_cast<size_t>(r)].PostTask(ring[static_cast<size_t>(r)]));
  }
  std::vector<FalconTaskResult> moved(3);
  ASSERT_TRUE(testing::WaitUntil([&] {
    for (size_t r = 0; r < 3; ++r) {
      if (!segs_[r].TaskDone(posted[r], &moved[r])) return false;
    }
    return true;
  }, 20)) << "a transfer waited past its deadline";
  EXPECT_EQ(moved[0].status, kFalconTaskFailed) << "rank 0 receives from rank 3";
  EXPECT_EQ(moved[2].status, kFalconTaskFailed) << "rank 2 sends to rank 3";
  for (size_t r = 0; r < segs_.size(); ++r) segs_[r].RequestResume(gens[r]);
  ASSERT_TRUE(AllIn(kFalconPauseResumed, gens, 10));
  EXPECT_EQ(FinishJob(120), 0) << "the job's --check found wrong data, or it failed";
}

// A rank whose device cannot hold the transfer buffers says so when it joins, before anybody
// posts a transfer; the round can stop there and training goes on.
TEST_F(ShimTrapTest, OnAGpuAJoinThatCannotAllocateFailsBeforeAnyTransfer) {
  StartJob(1'000'000, /*gpu=*/true, {"FALCON_EMU_CUDA_OOM_RANKS=2"});
  std::vector<uint64_t> gens = PauseAll(RealNow() + 30'000'000'000LL);
  ASSERT_TRUE(AllIn(kFalconPauseTrapped, gens, 30));
  std::vector<FalconTaskResult> joined = JoinAll(8 << 20);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(joined[static_cast<size_t>(r)].status, r == 2 ? kFalconTaskFailed : kFalconTaskOk) << "rank " << r;
  }
  for (size_t r = 0; r < segs_.size(); ++r) segs_[r].RequestResume(gens[r]);
  ASSERT_TRUE(AllIn(kFalconPauseResumed, gens, 10));
  EXPECT_EQ(FinishJob(120), 0) << "the job's --check found wrong data, or it failed";
}

}  // namespace
}  // namespace falcon
