// End-to-end tests of the default (PyTorch + Megatron-LM) mode of falcon-train-emu: real rank
// processes under falcon-emu-run, with and without the emulated CUDA driver (streams and
// events). What the NCCL calls look like from outside (no world collective, every split on
// every rank, the watchdog's thread) is checked on the shim's records in
// tests/shim_train_test.cc; here: the groups each rank made, data checks on streams, agreement.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "process_groups.h"
#include "schedule.h"
#include "train_test_util.h"

namespace {

using falcon::train::Group;
using falcon::train::GroupName;
using falcon::train::GroupSpec;
using falcon::train::MegatronGroups;
using falcon::train::MemberIndex;
using falcon::train::Shape;
using falcon::train::testing::JobResult;
using falcon::train::testing::RunJob;
using nlohmann::json;

using MegatronTrainerTest = falcon::train::testing::TrainJobTest;

// The job's environment with the emulated CUDA driver on the library path.
std::vector<std::pair<std::string, std::string>> WithDriver() {
  const char* old = std::getenv("LD_LIBRARY_PATH");
  return {{"LD_LIBRARY_PATH", std::string(FALCON_CUDA_EMU_DIR) + (old && *old ? std::string(":") + old : "")}};
}

// "name.index" of the groups `rank` belongs to, in Megatron's creation order.
std::vector<std::string> ExpectedGroups(const Shape& shape, int rank) {
  std::vector<std::string> names = {"world"};
  for (const GroupSpec& g : MegatronGroups(shape)) {
    if (MemberIndex(g, rank) >= 0) names.push_back(std::string(GroupName(g.kind)) + "." + std::to_string(g.index));
  }
  return names;
}

TEST_F(MegatronTrainerTest, EveryRankSplitsTheWorldForEveryGroupInMegatronOrder) {
  const Shape shape{2, 2, 2};
  const JobResult r = RunJob({"-n", "8"}, {"--tp", "2", "--dp", "2", "--pp", "2", "--iters", "2", "--compute-ms", "0.5",
                                          "--report", ReportSpec()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::size_t groups = MegatronGroups(shape).size();
  for (int rank = 0; rank < 8; ++rank) {
    const json j = Report(rank);
    EXPECT_EQ(j["config"]["mode"], "megatron");
    EXPECT_EQ(j["runtime"]["world_splits"], groups) << rank;  // members and non-members alike
    EXPECT_EQ(j["runtime"]["comm_groups"].get<std::vector<std::string>>(), ExpectedGroups(shape, rank)) << rank;
  }
}

TEST_F(MegatronTrainerTest, LegacyModeMakesTheOldFourCommunicators) {
  const JobResult r = RunJob({"-n", "4"}, {"--tp", "2", "--pp", "2", "--iters", "2", "--compute-ms", "0.5",
                                          "--world-sync", "--report", ReportSpec()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = Report(3);
  EXPECT_EQ(j["config"]["mode"], "world-sync");
  EXPECT_EQ(j["runtime"]["world_splits"], 3);
  EXPECT_EQ(j["runtime"]["watchdog_polls"], 0);
  EXPECT_EQ(j["runtime"]["comm_groups"].size(), 4u);
}

TEST_F(MegatronTrainerTest, LazyInitCreatesOnlyTheGroupsInUseWithoutSplits) {
  const JobResult r = RunJob({"-n", "8"}, {"--tp", "2", "--dp", "2", "--pp", "2", "--iters", "2", "--compute-ms", "0.5",
                                          "--check", "--lazy-init", "--report", ReportSpec()},
                             nullptr, WithDriver());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 8; ++rank) {
    const json j = Report(rank);
    EXPECT_EQ(j["runtime"]["world_splits"], 0);
    std::vector<std::string> kinds;
    for (const json& name : j["runtime"]["comm_groups"]) {
      const std::string s = name.get<std::string>();
      kinds.push_back(s.substr(0, s.find('.')));
    }
    // First uses: TP in the first forward, PP at the first exchange (stage order decides which
    // comes first), then dp-cp, embd (first and last stage), mp. No world.
    std::sort(kinds.begin(), kinds.end());
    EXPECT_EQ(kinds, (std::vector<std::string>{"dp-cp", "embd", "mp", "pp", "tp"})) << rank;
  }
}

TEST_F(MegatronTrainerTest, StreamsPassTheCheckInEveryCommunicatorMode) {
  for (const std::vector<std::string>& extra : std::vector<std::vector<std::string>>{
           {}, {"--nonblocking"}, {"--lazy-init", "--nonblocking"}, {"--dp-mode", "allreduce"}}) {
    std::vector<std::string> args = {"--tp", "2", "--dp", "2", "--pp", "2", "--iters", "3", "--compute-ms", "0.5",
                                     "--check", "--report", ReportSpec()};
    args.insert(args.end(), extra.begin(), extra.end());
    const JobResult r = RunJob({"-n", "8"}, args, nullptr, WithDriver());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (int rank = 0; rank < 8; ++rank) {
      const json j = Report(rank);
      EXPECT_EQ(j["status"], "ok");
      EXPECT_TRUE(j["runtime"]["device_streams"].get<bool>()) << "the emulated driver was not used";
      EXPECT_EQ(j["summary"]["iterations"], 3);
    }
  }
}

TEST_F(MegatronTrainerTest, InjectedCorruptionIsCaughtOnStreams) {
  const JobResult r = RunJob({"-n", "4"}, {"--dp", "2", "--pp", "2", "--iters", "4", "--check", "--compute-ms", "0.5",
                                          "--inject-corruption", "1"},
                             nullptr, WithDriver());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("check failed: rank"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("iteration 1"), std::string::npos) << r.output;
}

TEST_F(MegatronTrainerTest, WatchdogPollsUnlessTurnedOff) {
  // About 0.7 s of training: several 100 ms polling rounds.
  for (const bool on : {true, false}) {
    std::vector<std::string> args = {"--dp", "2", "--iters", "6", "--compute-ms", "5", "--report", ReportSpec()};
    if (!on) args.push_back("--no-watchdog");
    const JobResult r = RunJob({"-n", "2"}, args);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (int rank = 0; rank < 2; ++rank) {
      const json j = Report(rank);
      if (on) EXPECT_GE(j["runtime"]["watchdog_polls"].get<int>(), 2) << rank;
      else EXPECT_EQ(j["runtime"]["watchdog_polls"].get<int>(), 0) << rank;
    }
  }
}

TEST_F(MegatronTrainerTest, CheckpointSavesEndInABarrierAndTrainingGoesOn) {
  const JobResult r = RunJob({"-n", "4"}, {"--tp", "2", "--pp", "2", "--iters", "5", "--check", "--compute-ms", "0.5",
                                          "--checkpoint-every", "2", "--checkpoint-save-ms", "50", "--report",
                                          ReportSpec()},
                             nullptr, WithDriver());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = Report(0);
  EXPECT_EQ(j["checkpoints"]["taken"], 2);
  // Two modelled saves of 50 ms on top of five short iterations.
  const json& its = j["iterations"];
  const double span = its.back()["start_s"].get<double>() - its.front()["start_s"].get<double>();
  EXPECT_GE(span, 0.1);
}

// An 8-rank PP 4 job (2 ranks a node) on per-direction traffic with room for 7 activations,
// checked, 8 micro-batches for 4 iterations, whose plan file holds the pipeline plan `warmup`
// [6, 4, 2, 0] from the first boundary on; `shape` the --tp/--dp flags, `extra` more flags.
JobResult RunPlannedPipeline(const std::string& dir, const std::vector<std::string>& shape,
                             const std::vector<std::string>& extra, const std::string& report) {
  const std::string plan = dir + "/plan.json";
  {
    std::ofstream(plan) << R"({"version": 2, "strategy": "pipeline", "warmup": [6, 4, 2, 0]})";
  }
  std::vector<std::string> args = shape;
  for (const char* a : {"--pp", "4", "--micro-batches", "8", "--iters", "4", "--compute-ms", "0.2", "--check",
                        "--pp-comm", "per-direction", "--activation-limit", "7"}) {
    args.push_back(a);
  }
  args.insert(args.end(), extra.begin(), extra.end());
  for (const std::string& a : {std::string("--plan-file"), plan, std::string("--report"), report}) args.push_back(a);
  return RunJob({"-n", "8", "--ranks-per-node", "2"}, args, nullptr, WithDriver());
}

// --pp-comm per-direction: every stage pair's two directions on their own 2-rank communicators
// (after Megatron's groups), data checked on every receive; a pipeline plan from the file changes
// the warm-up counts from the next iteration on every rank, and each stage then holds the
// activations they imply; the standard schedule and the adapted one both pass the checks.
TEST_F(MegatronTrainerTest, PerDirectionTrafficRunsPipelinePlansWithCheckedData) {
  const Shape shape{1, 2, 4};
  const JobResult r = RunPlannedPipeline(dir_, {"--dp", "2"}, {}, ReportSpec());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<int> warmup = {6, 4, 2, 0};
  for (int rank = 0; rank < 8; ++rank) {
    const json j = Report(rank);
    const int stage = j["coords"]["pp"].get<int>();
    std::vector<std::string> expected = ExpectedGroups(shape, rank);
    for (const GroupSpec& g : MegatronGroups(shape, true)) {
      if (g.kind >= Group::kPpFwdEven && MemberIndex(g, rank) >= 0) {
        expected.push_back(std::string(GroupName(g.kind)) + "." + std::to_string(g.index));
      }
    }
    EXPECT_EQ(j["runtime"]["comm_groups"].get<std::vector<std::string>>(), expected) << rank;
    ASSERT_EQ(j["plans"].size(), 1u) << rank;
    EXPECT_EQ(j["plans"][0]["status"], "applied") << rank;
    EXPECT_EQ(j["plans"][0]["strategy"], "pipeline") << rank;
    EXPECT_EQ(j["plans"][0]["warmup"].get<std::vector<int>>(), warmup) << rank;
    EXPECT_EQ(j["iterations"][0]["warmup"], 4 - stage - 1) << rank;  // standard 1F1B first
    for (std::size_t i = 1; i < j["iterations"].size(); ++i) {
      EXPECT_EQ(j["iterations"][i]["warmup"], warmup[static_cast<std::size_t>(stage)]) << rank;
    }
    EXPECT_EQ(j["runtime"]["peak_activations"], warmup[static_cast<std::size_t>(stage)] + 1) << rank;
  }
}

// --split-backward: each stage runs the F/B/W order BuildSplitBackward gives for the counts in
// force (1F1B's, then a plan's), with the TP all-reduces of B and the gradient buckets after the
// last W data-checked, and holds an activation until its W: at most the counts + 1.
TEST_F(MegatronTrainerTest, SplitBackwardRunsTheFbwOrderWithCheckedData) {
  const JobResult r = RunPlannedPipeline(dir_, {"--tp", "2"}, {"--split-backward"}, ReportSpec());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<int> warmup = {6, 4, 2, 0};
  for (int rank = 0; rank < 8; ++rank) {
    const json j = Report(rank);
    const int stage = j["coords"]["pp"].get<int>();
    EXPECT_EQ(j["status"], "ok") << rank;
    EXPECT_TRUE(j["config"]["split_backward"].get<bool>());
    ASSERT_EQ(j["plans"].size(), 1u) << rank;
    EXPECT_EQ(j["plans"][0]["status"], "applied") << rank;
    const falcon::Result<std::vector<falcon::train::Step>> order =
        falcon::train::BuildSplitBackward(4, stage, 8, warmup, 0.4, 0.4, 0.4);
    ASSERT_TRUE(order.ok());
    EXPECT_EQ(j["runtime"]["schedule"], falcon::train::ToString(order.value())) << rank;
    EXPECT_NE(j["runtime"]["schedule"].get<std::string>().find(" W7"), std::string::npos) << rank;
    EXPECT_EQ(j["runtime"]["peak_activations"], warmup[static_cast<std::size_t>(stage)] + 1) << rank;
  }
}

// Receives posted ahead need streams: a host-only rank (no driver, every call synchronous) is
// refused with the reason instead of waiting forever.
TEST_F(MegatronTrainerTest, PerDirectionTrafficWithoutADriverIsRefused) {
  const JobResult r = RunJob({"-n", "2", "--no-cuda"}, {"--pp", "2", "--iters", "2", "--compute-ms", "0.2", "--pp-comm",
                                                     "per-direction"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--pp-comm per-direction needs a CUDA driver"), std::string::npos) << r.output;
}

// A plan the job cannot run is rejected with its reason and training goes on: beyond the
// activation limit, or with batched pipeline traffic.
TEST_F(MegatronTrainerTest, PipelinePlansBeyondTheJobsMeansAreRejected) {
  const std::string plan = dir_ + "/plan.json";
  {
    std::ofstream(plan) << R"({"version": 1, "strategy": "pipeline", "warmup": [5, 1]})";
  }
  for (const bool per_direction : {true, false}) {
    std::vector<std::string> args = {"--pp", "2", "--micro-batches", "4", "--iters", "3", "--compute-ms", "0.2",
                                     "--check", "--plan-file", plan, "--report", ReportSpec()};
    if (per_direction) {
      for (const char* a : {"--pp-comm", "per-direction", "--activation-limit", "4"}) args.push_back(a);
    }
    const JobResult r = RunJob({"-n", "2", "--ranks-per-node", "1"}, args, nullptr, WithDriver());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string why = per_direction ? "hold 6 micro-batches' activations; the limit is 4" : "--pp-comm per-direction";
    EXPECT_NE(r.output.find(why), std::string::npos) << r.output;
    for (int rank = 0; rank < 2; ++rank) {
      const json j = Report(rank);
      ASSERT_EQ(j["plans"].size(), 1u);
      EXPECT_EQ(j["plans"][0]["status"], "rejected");
      EXPECT_EQ(j["iterations"].back()["warmup"], 1 - j["coords"]["pp"].get<int>());
    }
  }
}

}  // namespace
