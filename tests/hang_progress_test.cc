// Hang diagnosis from live shim segments: falcon-train-emu's ranks over the strict NCCL emulator
// under the real shim (default track mode: device completion tracked with events), a fault
// injected into the running job, every rank's progress read back from its segment while the job
// hangs (progress_reader.h) and diagnosed (analyzer/hang_diagnosis.h): the rank that stopped
// issuing calls, or the communicator whose device work stopped, must be named exactly.
#include <gtest/gtest.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "analyzer/hang_diagnosis.h"
#include "daemon/shm/progress_reader.h"
#include "daemon/shm/segment_dir.h"
#include "daemon/shm/segment_reader.h"
#include "tests/support/subprocess.h"

namespace falcon {
namespace {

using analyzer::Finding;
using analyzer::FindingKind;
using testing::TempDir;

constexpr int kRanks = 8;

std::int64_t MonoNs() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<std::int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

class HangProgressTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (job_ <= 0) return;
    // SIGTERM: the launcher ends its ranks and removes the emulator's job state; SIGKILL after
    // 30 s if it does not.
    kill(job_, SIGTERM);
    testing::WaitFor(job_, 30);
  }

  // An 8-rank TP2 x DP2 x PP2 job (4 ranks per node) that trains until killed.
  void Start(const std::vector<std::string>& extra, const std::vector<std::string>& env = {}) {
    std::vector<std::string> argv{testing::BinDir("bench/emu") + "/falcon-emu-run", "-n", std::to_string(kRanks),
                                  "--ranks-per-node", "4", "--job-timeout", "100", "--lib-dir", testing::EmuLibDir(),
                                  "--preload", testing::PreloadValue(), "--", testing::BinDir("bench/train") +
                                  "/falcon-train-emu", "--tp", "2", "--dp", "2", "--pp", "2", "--compute-ms", "2",
                                  "--iters", "100000", "--progress-every", "0"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    std::vector<std::string> full_env{"FALCON_SHM_DIR=" + dir_.path()};
    full_env.insert(full_env.end(), env.begin(), env.end());
    job_ = testing::Spawn(argv, full_env);
    ASSERT_GT(job_, 0);
  }

  // Every rank's progress once all kRanks have made no ordered call for `quiet_s` (the job
  // hangs); empty if that does not happen within `timeout_s`.
  std::vector<daemon::SegmentProgress> WaitForHang(double quiet_s, double timeout_s) {
    std::vector<daemon::SegmentProgress> ranks;
    const bool hung = testing::WaitUntil(
        [&] {
          ranks.clear();
          auto listed = daemon::ListSegments(dir_.path(), static_cast<uint32_t>(getuid()), false);
          if (!listed.ok() || listed.value().size() != kRanks) return false;
          const std::int64_t now = MonoNs();
          for (const auto& info : listed.value()) {
            auto seg = daemon::SegmentReader::Open(info.path);
            if (!seg.ok()) return false;
            ranks.push_back(daemon::ReadProgress(seg.value(), now));
            const std::int64_t last = ranks.back().last_call_mono_ns;
            if (last == 0 || now - last < static_cast<std::int64_t>(quiet_s * 1e9)) return false;
          }
          return true;
        },
        timeout_s);
    if (!hung) ranks.clear();
    return ranks;
  }

  static std::vector<Finding> Diagnose(const std::vector<daemon::SegmentProgress>& ranks) {
    std::vector<analyzer::RankProgress> progress;
    for (const auto& r : ranks) progress.push_back(r.progress);
    return analyzer::DiagnoseHang(progress);
  }

  static std::string Describe(const std::vector<Finding>& findings) {
    std::ostringstream out;
    for (const Finding& f : findings) out << analyzer::FindingKindName(f.kind) << ": " << f.summary << "\n";
    return out.str();
  }

  TempDir dir_;
  pid_t job_ = -1;
};

// Rank 5 stops issuing NCCL calls (its data loader hangs) before iteration 12: its peers wait in
// their next collective or exchange with it, and the chain of waits leads back to rank 5 alone.
TEST_F(HangProgressTest, AStuckHostIsNamedWhileTheJobWaits) {
  Start({"--inject-stall", "5:12"});
  const auto ranks = WaitForHang(2.0, 90);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kRanks)) << "the job never hung";
  for (const auto& r : ranks) EXPECT_TRUE(r.device_tracked) << "rank " << r.progress.rank;
  const std::vector<Finding> findings = Diagnose(ranks);
  std::set<std::int64_t> culprits;
  for (const Finding& f : findings) {
    EXPECT_NE(f.kind, FindingKind::kMismatch) << Describe(findings);
    EXPECT_NE(f.kind, FindingKind::kDeadlock) << Describe(findings);
    if (f.kind == FindingKind::kNotIssued) culprits.insert(f.culprits.begin(), f.culprits.end());
  }
  EXPECT_EQ(culprits, (std::set<std::int64_t>{5})) << Describe(findings);
  // The operator's view of the same hang: falcon-ctl hang --live.
  const testing::ProcessResult ctl =
      testing::Run({testing::BinDir("daemon") + "/falcon-ctl", "hang", "--live", "--dir", dir_.path(), "--json"}, {}, 60);
  EXPECT_EQ(ctl.exit_code, 1) << ctl.out << ctl.err;  // findings
  const nlohmann::json doc = nlohmann::json::parse(ctl.out, nullptr, false);
  ASSERT_TRUE(doc.is_object()) << ctl.out;
  EXPECT_EQ(doc["ranks"].size(), static_cast<size_t>(kRanks));
  EXPECT_GE(doc["quiet_s"].get<double>(), 2.0);
  std::set<std::int64_t> named;
  for (const auto& f : doc["findings"]) {
    EXPECT_EQ(f["kind"], "not_issued") << f.dump();
    for (const auto& r : f["culprits"]) named.insert(r.get<std::int64_t>());
  }
  EXPECT_EQ(named, (std::set<std::int64_t>{5})) << ctl.out;
}

// FALCON_DEVICE_PROGRESS=0: no events, nothing tracked on the device; the issued counts alone
// still lead to the rank that stopped issuing.
TEST_F(HangProgressTest, WithoutDeviceProgressTheIssuedCountsStillNameTheRank) {
  Start({"--inject-stall", "2:10"}, {"FALCON_DEVICE_PROGRESS=0"});
  const auto ranks = WaitForHang(2.0, 90);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kRanks)) << "the job never hung";
  for (const auto& r : ranks) {
    EXPECT_FALSE(r.device_tracked) << "rank " << r.progress.rank;
    for (const auto& c : r.progress.comms) {
      if (c.issued != 0) {
        EXPECT_FALSE(c.completion_known) << "rank " << r.progress.rank;
      }
    }
  }
  const std::vector<Finding> findings = Diagnose(ranks);
  std::set<std::int64_t> culprits;
  for (const Finding& f : findings) {
    if (f.kind == FindingKind::kNotIssued) culprits.insert(f.culprits.begin(), f.culprits.end());
  }
  EXPECT_EQ(culprits, (std::set<std::int64_t>{2})) << Describe(findings);
}

// Rank 3's device stops completing its collectives 6 s into the job (a GPU or link hang): every
// member issued the call the job waits in, and its device work does not finish; the work other
// ranks queued after it (behind cross-stream waits the shim does not see) is not blamed.
TEST_F(HangProgressTest, ADeviceHangIsNamedWithItsCommunicator) {
  Start({}, {R"(FALCON_EMU_FAULT_PLAN={"faults": [{"kind": "hang", "ranks": [3], "start_s": 6}]})"});
  const auto ranks = WaitForHang(2.0, 90);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kRanks)) << "the job never hung";
  const std::vector<Finding> findings = Diagnose(ranks);
  // Completion alone cannot tell which member's GPU or link holds the call: the communicator is
  // named, with its members that wait — rank 3 among them — and nothing else is.
  std::size_t not_completing = 0;
  for (const Finding& f : findings) {
    EXPECT_NE(f.kind, FindingKind::kMismatch) << Describe(findings);
    EXPECT_NE(f.kind, FindingKind::kDeadlock) << Describe(findings);
    if (f.kind != FindingKind::kNotCompleting) continue;
    ++not_completing;
    EXPECT_NE(std::find(f.waiting.begin(), f.waiting.end(), 3), f.waiting.end()) << Describe(findings);
  }
  EXPECT_EQ(not_completing, 1u) << Describe(findings);
}

}  // namespace
}  // namespace falcon
