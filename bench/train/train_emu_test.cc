// End-to-end tests of falcon-train-emu: real rank processes under falcon-emu-run over the NCCL
// emulator. Every test waits on process exit (or on a progress line), never on a fixed sleep;
// falcon-emu-run's --job-timeout bounds each job.
#include <string>
#include <vector>

#include "train_test_util.h"

namespace {

using falcon::train::testing::JobResult;
using falcon::train::testing::RunJob;
using nlohmann::json;
namespace fs = std::filesystem;

using TrainEmuTest = falcon::train::testing::TrainJobTest;

TEST_F(TrainEmuTest, Tp2Dp2Pp2CheckPassesAndReportHasTheSchema) {
  const JobResult r = RunJob({"-n", "8", "--ranks-per-node", "4"},
                             {"--tp", "2", "--dp", "2", "--pp", "2", "--iters", "3", "--check", "--report", ReportSpec()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0] falcon-train-emu: 8 ranks tp=2 dp=2 pp=2"), std::string::npos) << r.output;
  for (int rank = 0; rank < 8; ++rank) {
    const json j = Report(rank);
    ASSERT_FALSE(j.is_discarded()) << rank;
    EXPECT_EQ(j["schema"], "falcon.train.report");
    EXPECT_EQ(j["schema_version"], 2);
    EXPECT_EQ(j["status"], "ok");
    EXPECT_EQ(j["rank"], rank);
    EXPECT_EQ(j["world_size"], 8);
    EXPECT_EQ(j["node"], rank / 4);
    EXPECT_EQ(j["coords"]["tp"], rank % 2);
    EXPECT_EQ(j["coords"]["dp"], (rank / 2) % 2);
    EXPECT_EQ(j["coords"]["pp"], rank / 4);
    ASSERT_EQ(j["iterations"].size(), 3u);
    double prev_end = 0;
    for (const json& it : j["iterations"]) {
      EXPECT_GE(it["start_s"].get<double>(), prev_end - 1e-6);
      EXPECT_GT(it["duration_s"].get<double>(), 0.0);
      EXPECT_EQ(it["micro_batches"], 4);
      prev_end = it["start_s"].get<double>() + it["duration_s"].get<double>();
    }
    EXPECT_TRUE(j["faults"].is_array());
    EXPECT_EQ(j["summary"]["iterations"], 3);
    EXPECT_LE(j["summary"]["min_s"].get<double>(), j["summary"]["median_s"].get<double>());
    EXPECT_LE(j["summary"]["median_s"].get<double>(), j["summary"]["max_s"].get<double>());
  }
}

TEST_F(TrainEmuTest, SmallAndOddShapesPassCheck) {
  struct Case { int n; std::vector<std::string> args; };
  for (const Case& c : {Case{1, {}}, Case{3, {"--dp", "3", "--dp-mode", "rs-ag"}}, Case{6, {"--tp", "2", "--pp", "3"}},
                        Case{5, {"--pp", "5", "--micro-batches", "3"}}}) {
    std::vector<std::string> args = c.args;
    for (const char* a : {"--iters", "3", "--check", "--compute-ms", "1", "--report", "-"}) args.push_back(a);
    const JobResult r = RunJob({"-n", std::to_string(c.n)}, args);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("status=ok"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("\"schema\":\"falcon.train.report\""), std::string::npos) << r.output;
  }
}

TEST_F(TrainEmuTest, ComputeFaultOnOneRankSlowsEveryRank) {
  // 10 ms of modelled compute per layer: modelled time, not how busy the host is, sets the pace.
  const std::vector<std::string> args = {"--dp", "2", "--pp", "2", "--iters", "6", "--compute-ms", "10",
                                         "--progress-every", "0", "--report", ReportSpec()};
  const JobResult healthy = RunJob({"-n", "4"}, args);
  ASSERT_EQ(healthy.exit_code, 0) << healthy.output;
  const std::vector<double> base = Medians(4);
  const JobResult slow = RunJob({"-n", "4", "--fault-plan", R"({"faults":[{"kind":"compute","ranks":[3],"factor":3}]})"},
                                args);
  ASSERT_EQ(slow.exit_code, 0) << slow.output;
  const std::vector<double> faulty = Medians(4);
  for (int rank = 0; rank < 4; ++rank) {
    // Synchronous training: the straggler (3x compute) holds everyone back. The ideal ratio is
    // about 2.5; 1.4 leaves room for a noisy, shared 2-core machine.
    EXPECT_GT(faulty[static_cast<std::size_t>(rank)], 1.4 * base[static_cast<std::size_t>(rank)])
        << "rank " << rank << ": " << faulty[static_cast<std::size_t>(rank)] << " vs " << base[static_cast<std::size_t>(rank)];
    const json j = Report(rank);
    EXPECT_EQ(j["faults"].size(), rank == 3 ? 1u : 0u) << j["faults"].dump();
    EXPECT_EQ(j["iterations"][0]["compute_factor"].get<double>(), rank == 3 ? 3.0 : 1.0);
  }
  EXPECT_EQ(Report(3)["faults"][0]["kind"], "compute");
  EXPECT_EQ(Report(3)["faults"][0]["scope"], "rank");
}

TEST_F(TrainEmuTest, BadShapeExitsTwoWithAClearMessage) {
  const JobResult r = RunJob({"-n", "4"}, {"--tp", "2", "--dp", "3"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("tp*dp*pp = 6 (tp=2 dp=3 pp=1) does not equal the world size 4"), std::string::npos)
      << r.output;
}

TEST_F(TrainEmuTest, InjectedCorruptionFailsTheCheck) {
  const JobResult r = RunJob({"-n", "4"}, {"--tp", "2", "--pp", "2", "--iters", "4", "--check", "--compute-ms", "1",
                                          "--inject-corruption", "2"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("check failed: rank"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("iteration 2"), std::string::npos) << r.output;
}

// Fault injections that leave the job hung (strict emulator): a few seconds of falcon-emu-run's
// --job-timeout (exit 124) after the injection line; rank 0 reports every iteration, and none
// from the injected one on (every rank's iteration ends in the grad norm over mp = the world).
void ExpectHungAt(const JobResult& r, const std::string& line, int iter) {
  EXPECT_EQ(r.exit_code, 124) << r.output;
  EXPECT_NE(r.output.find(line), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" ns)\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("iteration " + std::to_string(iter - 1) + " done"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("iteration " + std::to_string(iter) + " done"), std::string::npos) << r.output;
}

TEST_F(TrainEmuTest, InjectedCountMismatchHangsTheJob) {
  const JobResult r = RunJob({"-n", "4", "--job-timeout", "6"},
                             {"--tp", "2", "--pp", "2", "--iters", "4", "--compute-ms", "0.5", "--progress-every", "1",
                              "--inject-mismatch", "1:1:count"});
  ExpectHungAt(r, "rank 1: --inject-mismatch: ncclAllReduce on tp in iteration 1 issued with count 8193 instead of 8192", 1);
}

TEST_F(TrainEmuTest, InjectedDatatypeMismatchOnDpFailsAtTheLenientDeadlineNamingBothCalls) {
  const JobResult r = RunJob({"-n", "4", "--timeout", "1"},
                             {"--tp", "2", "--dp", "2", "--iters", "4", "--compute-ms", "0.5", "--progress-every", "1",
                              "--inject-mismatch", "2:1:dtype:dp"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << r.output;
  EXPECT_NE(r.output.find("rank 2: --inject-mismatch: ncclReduceScatter on dp in iteration 1 issued with ncclFloat16"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("call mismatch"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(count=24576, half,"), std::string::npos) << r.output;  // the emulator's names
  EXPECT_NE(r.output.find("(count=24576, float,"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("iteration 1 done"), std::string::npos) << r.output;
}

TEST_F(TrainEmuTest, InjectedSwapDeadlocksTheJob) {
  const JobResult r = RunJob({"-n", "4", "--job-timeout", "6"},
                             {"--tp", "2", "--pp", "2", "--iters", "4", "--compute-ms", "0.5", "--progress-every", "1",
                              "--inject-swap", "3:1"});
  ExpectHungAt(r, "rank 3: --inject-swap: ncclAllReduce(grad norm) on mp and ncclAllReduce(embedding gradients) on embd "
                  "swapped in iteration 1 (from ", 1);
}

// Checks that every rank ran the same plan versions at the same iterations, with its replica's
// micro-batch count, and returns the first iteration of `version`.
int SwitchIteration(const std::vector<json>& reports, int version, const std::vector<int>& plan) {
  int first = -1;
  for (std::size_t rank = 0; rank < reports.size(); ++rank) {
    const json& j = reports[rank];
    const json& changes = j["plan_changes"];
    EXPECT_EQ(changes.size(), 1u) << rank;
    if (changes.empty()) return -1;
    EXPECT_EQ(changes[0]["version"], version);
    const int at = changes[0]["iter"].get<int>();
    if (first < 0) first = at;
    EXPECT_EQ(at, first) << "rank " << rank << " switched at another iteration";
    const int dp = j["coords"]["dp"].get<int>();
    for (const json& it : j["iterations"]) {
      const bool after = it["iter"].get<int>() >= at;
      EXPECT_EQ(it["plan_version"], after ? version : 0);
      EXPECT_EQ(it["micro_batches"], after ? plan[static_cast<std::size_t>(dp)] : 4);
    }
  }
  return first;
}

TEST_F(TrainEmuTest, PlanPresentAtStartAppliesFromIterationOneOnAllRanks) {
  const std::string plan = dir_ + "/plan.json";
  std::ofstream(plan) << R"({"version": 1, "micro_batches": [2, 6]})";
  const JobResult r = RunJob({"-n", "8"}, {"--tp", "2", "--dp", "2", "--pp", "2", "--iters", "3", "--check",
                                          "--compute-ms", "1", "--plan-file", plan, "--report", ReportSpec()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<json> reports;
  for (int rank = 0; rank < 8; ++rank) reports.push_back(Report(rank));
  EXPECT_EQ(SwitchIteration(reports, 1, {2, 6}), 1);
}

TEST_F(TrainEmuTest, PlanWrittenMidRunSwitchesAllRanksAtOneIteration) {
  const std::string plan = dir_ + "/plan.json";
  bool written = false;
  auto on_line = [&](const std::string& line) {
    // Rank 0's progress line for iteration 2: write the plan atomically (temp + rename).
    if (written || line.find("[rank 0] falcon-train-emu: iteration 2 done") == std::string::npos) return;
    std::ofstream(plan + ".tmp") << R"({"version": 5, "micro_batches": [1, 3, 2]})";
    fs::rename(plan + ".tmp", plan);
    written = true;
  };
  const JobResult r = RunJob({"-n", "6"}, {"--dp", "3", "--pp", "2", "--iters", "40", "--check", "--compute-ms", "0.5",
                                          "--progress-every", "1", "--plan-file", plan, "--report", ReportSpec()},
                             on_line);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(written) << r.output;
  std::vector<json> reports;
  for (int rank = 0; rank < 6; ++rank) reports.push_back(Report(rank));
  const int at = SwitchIteration(reports, 5, {1, 3, 2});
  EXPECT_GE(at, 3);
  EXPECT_LT(at, 40) << "the plan was never applied";
}

TEST_F(TrainEmuTest, DurationStopsAllRanksAtTheSameIteration) {
  const JobResult r = RunJob({"-n", "4"}, {"--tp", "2", "--pp", "2", "--duration-s", "0.5", "--compute-ms", "0.5",
                                          "--report", ReportSpec()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json first = Report(0);
  const std::size_t n = first["iterations"].size();
  ASSERT_GE(n, 1u);
  const json& last = first["iterations"][n - 1];
  // Rank 0 decided to stop at the first boundary at or after 0.5 s since the job epoch.
  EXPECT_GE(last["start_s"].get<double>() + last["duration_s"].get<double>(), 0.5);
  if (n >= 2) {
    EXPECT_LT(first["iterations"][n - 2]["start_s"].get<double>(), 0.5);
  }
  for (int rank = 1; rank < 4; ++rank) EXPECT_EQ(Report(rank)["iterations"].size(), n) << rank;
}

TEST_F(TrainEmuTest, SixteenRanksTwoPerNodeSmoke) {
  const JobResult r = RunJob({"-n", "16", "--ranks-per-node", "2"},
                             {"--tp", "2", "--dp", "4", "--pp", "2", "--iters", "3", "--check", "--report", ReportSpec()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 16; ++rank) {
    const json j = Report(rank);
    EXPECT_EQ(j["node"], rank / 2);
    EXPECT_EQ(j["summary"]["iterations"], 3);
  }
}

}  // namespace
