// End-to-end tests of falcon-train-emu applying mitigation plans (FALCON §5): real ranks under
// falcon-emu-run over the NCCL emulator. S3 moves ranks off a congested link that carries DP
// traffic and the iterations get faster; S4 leaves a node with a slow GPU or NIC for a spare,
// restarts, rolls back and finishes with --check intact; S1 undoes S2; invalid plans are rejected
// while training goes on; --falcon-plans without the shim warns once, and with it finds the API
// and reports what a restart would cost.
// Plans are written when the job's own output says it is ready for the next one (events, not
// sleeps); iteration times are compared with wide margins (a shared 2-core machine), the
// modelled slowdowns being several times larger than the margins.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "falcon/falcon.h"
#include "falcon/shm_abi.h"

#include "train_test_util.h"

namespace {

using falcon::train::testing::JobResult;
using falcon::train::testing::RunJob;
using nlohmann::json;
namespace fs = std::filesystem;

using TrainMitigationTest = falcon::train::testing::TrainJobTest;

// Replaces the plan file atomically, as a controller would.
void WritePlan(const std::string& path, const std::string& text) {
  std::ofstream(path + ".tmp") << text;
  fs::rename(path + ".tmp", path);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Durations of a report's iterations with first <= iter < last (first runs only).
double MedianDuration(const json& report, int first, int last) {
  std::vector<double> d;
  for (const json& it : report["iterations"]) {
    const int i = it["iter"].get<int>();
    if (i >= first && i < last && !it["redo"].get<bool>()) d.push_back(it["duration_s"].get<double>());
  }
  return Median(d);
}

// True once `line` is rank 0's progress line for iteration `iter` or later.
bool ProgressAtLeast(const std::string& line, int iter) {
  int n = -1;
  const auto pos = line.find("[rank 0] falcon-train-emu: iteration ");
  return pos != std::string::npos && std::sscanf(line.c_str() + pos, "[rank 0] falcon-train-emu: iteration %d done", &n) == 1 &&
         n >= iter;
}

TEST_F(TrainMitigationTest, S3MovesRanksOffACongestedDpLinkAndIterationsGetFaster) {
  // 8 ranks, TP2 x DP2 x PP2, 2 per node: nodes 0 and 1 hold stage 0's two replicas, so the
  // congested link 0-1 carries stage 0's DP all-reduce. Swapping nodes 1 and 3 takes it off the
  // link (only the tiny control all-reduce still crosses it). Modelled per iteration: 30 ms of
  // compute, DP 80 ms before and 1 ms after (inter-node 0.5 GB/s, link factor 100), the control
  // all-reduce 14 ms throughout: ~125 ms before, ~45 ms after.
  const std::string plan = dir_ + "/plan.json";
  int written_after = -1;
  auto on_line = [&](const std::string& line) {
    if (written_after < 0 && ProgressAtLeast(line, 3)) {
      WritePlan(plan, R"({"version": 1, "strategy": "S3", "placement": [0, 0, 3, 3, 2, 2, 1, 1]})");
      written_after = 3;
    }
  };
  const JobResult r = RunJob({"-n", "8", "--ranks-per-node", "2", "--fault-plan",
                              R"({"faults": [{"kind": "link", "nodes": [0, 1], "factor": 100}]})"},
                             {"--tp", "2", "--dp", "2", "--pp", "2", "--iters", "14", "--compute-ms", "1", "--check",
                              "--progress-every", "1", "--plan-file", plan, "--report", ReportSpec()},
                             on_line, {{"FALCON_EMU_INTER_GBPS", "0.5"}});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_GE(written_after, 0) << r.output;
  const json r0 = Report(0);
  ASSERT_EQ(r0["plans"].size(), 1u) << r0["plans"].dump();
  const json& p = r0["plans"][0];
  EXPECT_EQ(p["status"], "applied");
  EXPECT_EQ(p["strategy"], "S3");
  EXPECT_EQ(p["moved_ranks"], json({2, 3, 6, 7}));
  EXPECT_GT(p["modelled_s"].get<double>(), 0.0);  // the state of 4 ranks went over the fabric
  EXPECT_GE(p["cost_s"].get<double>(), p["modelled_s"].get<double>() * 0.9);
  const int at = p["iter"].get<int>();
  ASSERT_LE(at, 11) << "the plan came too late to compare";
  for (int rank = 0; rank < 8; ++rank) {
    const json j = Report(rank);
    ASSERT_EQ(j["plans"].size(), 1u) << rank;
    EXPECT_EQ(j["plans"][0]["iter"], at) << "rank " << rank << " switched at another iteration";
    const int want_node = (rank == 2 || rank == 3) ? 3 : (rank == 6 || rank == 7) ? 1 : rank / 2;
    EXPECT_EQ(j["node"], want_node) << rank;
    EXPECT_EQ(j["launch_node"], rank / 2) << rank;
    for (const json& it : j["iterations"]) {
      EXPECT_EQ(it["node"], it["iter"].get<int>() < at ? rank / 2 : want_node) << rank << " " << it.dump();
    }
  }
  const double before = MedianDuration(r0, 1, at);
  const double after = MedianDuration(r0, at + 1, 14);
  EXPECT_LT(after, 0.75 * before) << "before " << before << " s, after " << after << " s";
}

// S4 with one spare node: the plan excludes node 3 (rank 3's node), the job restarts with rank 3
// on node 4, rolls back to its last checkpoint and completes every iteration with --check.
void RunS4(const std::string& fault, const std::string& report_spec, const std::string& dir, JobResult* out) {
  const std::string plan = dir + "/plan.json";
  bool written = false;
  auto on_line = [&](const std::string& line) {
    if (!written && ProgressAtLeast(line, 4)) {
      WritePlan(plan, R"({"version": 1, "strategy": "S4", "exclude_nodes": [3], "restart": true})");
      written = true;
    }
  };
  *out = RunJob({"-n", "4", "--ranks-per-node", "1", "--fault-plan", fault},
                {"--dp", "2", "--pp", "2", "--iters", "12", "--compute-ms", "2", "--check", "--progress-every", "1",
                 "--plan-file", plan, "--spare-nodes", "1", "--checkpoint-every", "3", "--restart-s", "0.3",
                 "--report", report_spec},
                on_line, {{"FALCON_EMU_INTER_GBPS", "0.5"}});
  EXPECT_TRUE(written) << out->output;
}

void CheckRestart(const std::vector<json>& reports, int iters) {
  const json& first = reports[0]["restarts"];
  ASSERT_EQ(first.size(), 1u) << reports[0].dump();
  const json& x = first[0];
  const int next = x["next_iter"].get<int>(), back = x["rollback_to"].get<int>();
  EXPECT_EQ(back, next / 3 * 3) << x.dump();  // the last checkpoint (every 3 iterations)
  EXPECT_EQ(x["lost_iterations"].get<int>(), next - back);
  EXPECT_GE(x["cost_s"].get<double>(), 0.3 * 0.95);  // --restart-s
  EXPECT_EQ(x["exclude_nodes"], json({3}));
  for (std::size_t rank = 0; rank < reports.size(); ++rank) {
    const json& j = reports[rank];
    EXPECT_EQ(j["status"], "ok") << rank;
    ASSERT_EQ(j["restarts"].size(), 1u) << rank;
    EXPECT_EQ(j["restarts"][0]["next_iter"], next) << rank;
    EXPECT_EQ(j["plans"][0]["status"], "applied") << rank;
    EXPECT_EQ(j["plans"][0]["restart"], true) << rank;
    EXPECT_EQ(j["plans"][0]["placement"], json({0, 1, 2, 4})) << rank;
    // Every iteration ran once, the lost ones twice (marked redo).
    EXPECT_EQ(j["iterations"].size(), static_cast<std::size_t>(iters + next - back)) << rank;
    int redo = 0;
    for (const json& it : j["iterations"]) redo += it["redo"].get<bool>() ? 1 : 0;
    EXPECT_EQ(redo, next - back) << rank;
    EXPECT_EQ(j["summary"]["restarts"], 1) << rank;
  }
  EXPECT_EQ(reports[3]["node"], 4);
  EXPECT_EQ(reports[3]["launch_node"], 3);
}

TEST_F(TrainMitigationTest, S4ExcludesANodeWithASlowGpuRestartsOnASpareAndRollsBack) {
  JobResult r;
  RunS4(R"({"faults": [{"kind": "compute", "ranks": [3], "factor": 4}]})", ReportSpec(), dir_, &r);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<json> reports;
  for (int rank = 0; rank < 4; ++rank) reports.push_back(Report(rank));
  CheckRestart(reports, 12);
  EXPECT_NE(r.output.find("restarts 1 (lost"), std::string::npos) << r.output;
  // Rank 3 left its slow GPU behind: 4x compute before the restart, 1x after.
  const int next = reports[0]["restarts"][0]["next_iter"].get<int>();
  std::size_t seen = 0;
  for (const json& it : reports[3]["iterations"]) {
    const bool before = seen++ < static_cast<std::size_t>(next);
    EXPECT_EQ(it["compute_factor"].get<double>(), before ? 4.0 : 1.0) << it.dump();
    EXPECT_EQ(it["node"], before ? 3 : 4) << it.dump();
  }
}

TEST_F(TrainMitigationTest, S4ExcludesANodeWithASlowNicAndTheJobGetsFaster) {
  JobResult r;
  RunS4(R"({"faults": [{"kind": "nic", "nodes": [3], "factor": 400}]})", ReportSpec(), dir_, &r);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<json> reports;
  for (int rank = 0; rank < 4; ++rank) reports.push_back(Report(rank));
  CheckRestart(reports, 12);
  // The slow NIC carried stage 1's DP all-reduce and rank 3's pipeline traffic: modelled ~65 ms
  // per iteration healthy, ~0.9 s with the NIC 400x slow — far above what a loaded host adds to
  // the wall time of an iteration (up to ~0.5 s seen with the whole suite running at -j2).
  const int next = reports[0]["restarts"][0]["next_iter"].get<int>();
  std::vector<double> before, after;
  std::size_t seen = 0;
  for (const json& it : reports[0]["iterations"]) {
    (seen++ < static_cast<std::size_t>(next) ? before : after).push_back(it["duration_s"].get<double>());
  }
  if (!before.empty()) before.erase(before.begin());  // the first iteration includes start-up
  EXPECT_LT(Median(after), 0.75 * Median(before)) << "before " << Median(before) << " s, after " << Median(after) << " s";
}

TEST_F(TrainMitigationTest, S1AfterS2GoesBackToTheInitialMicroBatches) {
  const std::string plan = dir_ + "/plan.json";
  WritePlan(plan, R"({"version": 1, "micro_batches": [2, 6]})");  // old format: S2, from iteration 1
  int s2_at = -1;
  bool undo_written = false;
  auto on_line = [&](const std::string& line) {
    int v = 0, at = 0;
    const auto pos = line.find("[rank 0] falcon-train-emu: plan version ");
    if (pos != std::string::npos &&
        std::sscanf(line.c_str() + pos, "[rank 0] falcon-train-emu: plan version %d (S2) applies from iteration %d", &v,
                    &at) == 2) {
      s2_at = at;
    }
    if (s2_at >= 0 && !undo_written && ProgressAtLeast(line, s2_at + 1)) {
      WritePlan(plan, R"({"version": 2, "strategy": "S1"})");
      undo_written = true;
    }
  };
  const JobResult r = RunJob({"-n", "4"}, {"--dp", "2", "--pp", "2", "--iters", "12", "--check", "--compute-ms", "0.5",
                                          "--progress-every", "1", "--plan-file", plan, "--report", ReportSpec()},
                             on_line);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(undo_written) << r.output;
  for (int rank = 0; rank < 4; ++rank) {
    const json j = Report(rank);
    ASSERT_EQ(j["plans"].size(), 2u) << rank;
    EXPECT_EQ(j["plans"][0]["strategy"], "S2");
    EXPECT_EQ(j["plans"][1]["strategy"], "S1");
    ASSERT_EQ(j["plan_changes"].size(), 2u) << rank;
    EXPECT_EQ(j["plan_changes"][0]["micro_batches"], json({2, 6}));
    EXPECT_EQ(j["plan_changes"][1]["micro_batches"], json({4, 4}));
    const int s2 = j["plan_changes"][0]["iter"].get<int>(), s1 = j["plan_changes"][1]["iter"].get<int>();
    EXPECT_EQ(s2, 1);
    EXPECT_GT(s1, s2 + 1);
    const int dp = j["coords"]["dp"].get<int>();
    for (const json& it : j["iterations"]) {
      const int i = it["iter"].get<int>();
      const int want = (i >= s2 && i < s1) ? (dp == 0 ? 2 : 6) : 4;
      EXPECT_EQ(it["micro_batches"], want) << "rank " << rank << " iteration " << i;
      EXPECT_EQ(it["plan_version"], i < s2 ? 0 : (i < s1 ? 1 : 2));
    }
  }
}

TEST_F(TrainMitigationTest, InvalidPlansAreRejectedAndTrainingGoesOn) {
  const std::string plan = dir_ + "/plan.json";
  // Each plan is written once the trainer rejected the one before (rank 0's stderr line).
  const std::vector<std::string> plans = {
      R"({"version": 1, "strategy": "S3", "placement": [0, 1, 2, 9]})",   // node out of range
      R"({"version": 2, "strategy": "S9", "micro_batches": [1, 1]})",     // unknown strategy
      R"({"version": 3, "strategy": "S2", "micro_batches": [1, 2, 3]})",  // wrong number of replicas
      R"({"version": 4, "strategy": "S3", "placement": [0, 1]})",         // wrong number of ranks
      R"({"version": 5, "strategy": "S2", "micro_batches": [3, 5]})"};    // valid
  WritePlan(plan, plans[0]);
  std::size_t next = 1;
  auto on_line = [&](const std::string& line) {
    if (next < plans.size() &&
        line.find("[rank 0] falcon-train-emu: rejecting plan version " + std::to_string(next) + " ") != std::string::npos) {
      WritePlan(plan, plans[next++]);
    }
  };
  const JobResult r = RunJob({"-n", "4", "--ranks-per-node", "1"},
                             {"--dp", "2", "--pp", "2", "--iters", "30", "--check", "--compute-ms", "0.5",
                              "--progress-every", "0", "--plan-file", plan, "--report", ReportSpec()},
                             on_line);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(next, plans.size()) << r.output;
  const std::vector<std::string> reasons = {"on node 9; the job has nodes 0..3", "unknown strategy \"S9\"",
                                            "has 3 entries; the job has dp=2", "has 2 entries; the job has 4 ranks"};
  for (int rank = 0; rank < 4; ++rank) {
    const json j = Report(rank);
    EXPECT_EQ(j["iterations"].size(), 30u) << rank;
    ASSERT_EQ(j["plans"].size(), 5u) << j["plans"].dump();
    for (std::size_t i = 0; i < reasons.size(); ++i) {
      const json& p = j["plans"][i];
      EXPECT_EQ(p["version"], static_cast<int>(i + 1));
      EXPECT_EQ(p["status"], "rejected");
      const std::string reason = p["reason"].get<std::string>();
      if (rank == 0) EXPECT_NE(reason.find(reasons[i]), std::string::npos) << reason;
      else EXPECT_EQ(reason, "rejected by rank 0");
    }
    EXPECT_EQ(j["plans"][1]["strategy"], "unknown");
    EXPECT_EQ(j["plans"][4]["status"], "applied");
    EXPECT_EQ(j["summary"]["plans_rejected"], 4);
    EXPECT_EQ(j["node"], rank);  // nothing moved
  }
}

TEST_F(TrainMitigationTest, FalconPlansWithoutTheShimWarnOnceAndTrain) {
  const JobResult r = RunJob({"-n", "2"}, {"--dp", "2", "--iters", "5", "--compute-ms", "0.5", "--falcon-plans",
                                          "--report", ReportSpec()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::size_t warnings = 0;
  for (std::size_t pos = 0; (pos = r.output.find("no falconGetPlan", pos)) != std::string::npos; ++pos) ++warnings;
  EXPECT_EQ(warnings, 1u) << r.output;
  EXPECT_EQ(Report(0)["config"]["plan_source"], "falcon");
  EXPECT_EQ(Report(1)["summary"]["iterations"], 5);
}

#ifdef FALCON_SHIM_LIB
// The S4 cost a rank reported through falconReportCost, read from its kept segment (the shm
// ABI: header -> plan block -> cost words); negative when none was reported.
double ReportedRestartCost(const std::string& segment_path) {
  const int fd = ::open(segment_path.c_str(), O_RDONLY);
  if (fd < 0) return -2;
  struct stat st {};
  void* p = ::fstat(fd, &st) == 0 ? ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0)
                                 : MAP_FAILED;
  ::close(fd);
  if (p == MAP_FAILED) return -2;
  const auto* h = static_cast<const FalconShmHeader*>(p);
  double cost = -1;
  if (h->magic == FALCON_SHM_MAGIC && h->plan_offset + sizeof(FalconPlanBlock) <= static_cast<std::uint64_t>(st.st_size)) {
    const auto* b = reinterpret_cast<const FalconPlanBlock*>(static_cast<const char*>(p) + h->plan_offset);
    const std::uint64_t us = b->cost_us[kFalconStrategyRestart - kFalconStrategyRebalance];
    if (us > 0) cost = static_cast<double>(us) / 1e6;
  }
  ::munmap(p, static_cast<std::size_t>(st.st_size));
  return cost;
}

TEST_F(TrainMitigationTest, FalconPlansUnderTheShimFindTheApiAndReportWhatARestartWouldCost) {
  // The shim is preloaded: the C API resolves, no plan has arrived (no agent), training runs.
  // After each checkpoint every rank reports an S4 restart's cost from its history: --restart-s
  // plus half a checkpoint period of work at its recent iteration time.
  const JobResult r = RunJob({"-n", "2", "--preload", FALCON_SHIM_LIB},
                             {"--dp", "2", "--iters", "6", "--compute-ms", "0.5", "--checkpoint-every", "2",
                              "--restart-s", "7", "--falcon-plans", "--report", ReportSpec()},
                             nullptr, {{"FALCON_SHM_DIR", dir_}, {"FALCON_KEEP_SEGMENT", "1"}});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("no falconGetPlan"), std::string::npos) << r.output;
  EXPECT_EQ(Report(0)["plans"].size(), 0u);
  int segments = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    if (e.path().filename().string().rfind("falcon.", 0) != 0) continue;
    ++segments;
    const double cost = ReportedRestartCost(e.path().string());
    EXPECT_GT(cost, 7.0) << e.path();
    EXPECT_LT(cost, 7.0 + 5.0) << "relaunch + one iteration's worth of a fast job: " << e.path();
  }
  EXPECT_EQ(segments, 2);
}
#endif

}  // namespace
