// Tests of micro-batch plan parsing, the plan-file watcher and the control word.
#include "mb_plan.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

namespace falcon::train {
namespace {

TEST(MbPlanTest, ParsesValidPlans) {
  const Result<MicroBatchPlan> p = ParseMicroBatchPlan(R"({"version": 3, "micro_batches": [4, 2], "note": "x"})", 2);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p.value().version, 3);
  EXPECT_EQ(p.value().micro_batches, (std::vector<int>{4, 2}));
}

TEST(MbPlanTest, RejectsInvalidPlans) {
  struct Case { const char* json; const char* says; };
  for (const Case& c : {Case{"nope", "not valid JSON"}, Case{"[1]", "not a JSON object"},
                        Case{R"({"micro_batches": [1, 1]})", "\"version\""},
                        Case{R"({"version": 0, "micro_batches": [1, 1]})", "outside"},
                        Case{R"({"version": 1.5, "micro_batches": [1, 1]})", "\"version\""},
                        Case{R"({"version": 1, "micro_batches": [1]})", "dp=2"},
                        Case{R"({"version": 1, "micro_batches": [1, 0]})", "integers in [1,"},
                        Case{R"({"version": 1, "micro_batches": [1, "2"]})", "integers in [1,"},
                        Case{R"({"version": 1})", "must be an array"}}) {
    const Result<MicroBatchPlan> p = ParseMicroBatchPlan(c.json, 2);
    ASSERT_FALSE(p.ok()) << c.json;
    EXPECT_NE(p.status().message().find(c.says), std::string::npos) << p.status().message();
  }
}

TEST(MbPlanTest, WatcherReturnsOnlyNewerVersionsOnChange) {
  char dir[] = "/tmp/falcon-mbplan-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/plan.json";
  PlanFileWatcher w(path, 2);
  std::string warn;
  EXPECT_FALSE(w.Poll(0, &warn).has_value());  // no file yet
  EXPECT_TRUE(warn.empty());
  std::ofstream(path) << R"({"version": 1, "micro_batches": [3, 5]})";
  auto p = w.Poll(0, &warn);
  ASSERT_TRUE(p.has_value()) << warn;
  EXPECT_EQ(p->micro_batches, (std::vector<int>{3, 5}));
  EXPECT_FALSE(w.Poll(1, &warn).has_value());  // unchanged file
  std::ofstream(path) << R"({"version": 1, "micro_batches": [3, 6]})";  // same version: not newer
  EXPECT_FALSE(w.Poll(1, &warn).has_value());
  std::ofstream(path) << R"({"version": 2, "micro_batches": [9]})";
  EXPECT_FALSE(w.Poll(1, &warn).has_value());
  EXPECT_NE(warn.find("dp=2"), std::string::npos) << warn;
  std::remove(path.c_str());
  rmdir(dir);
}

TEST(MbPlanTest, ControlWordRoundTrip) {
  const int world = 4, dp = 2;
  std::vector<std::int32_t> sum(3 + dp, 0);
  for (int r = 0; r < world; ++r) {
    ControlDecision proposal;
    if (r == 0) proposal = {true, MicroBatchPlan{7, {2, 6}}};
    const auto w = PackControl(proposal, dp);
    for (std::size_t i = 0; i < w.size(); ++i) sum[i] += w[i];
  }
  const Result<ControlDecision> d = UnpackControl(sum, world, dp);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_TRUE(d.value().stop);
  ASSERT_TRUE(d.value().new_plan.has_value());
  EXPECT_EQ(d.value().new_plan->version, 7);
  EXPECT_EQ(d.value().new_plan->micro_batches, (std::vector<int>{2, 6}));
  EXPECT_EQ(UnpackControl(sum, world + 1, dp).status().code(), Status::Code::kCorrupt);
  const auto quiet = PackControl(ControlDecision{}, dp);
  std::vector<std::int32_t> q(quiet.size(), 0);
  for (int r = 0; r < world; ++r) for (std::size_t i = 0; i < q.size(); ++i) q[i] += quiet[i];
  const Result<ControlDecision> n = UnpackControl(q, world, dp);
  ASSERT_TRUE(n.ok());
  EXPECT_FALSE(n.value().stop);
  EXPECT_FALSE(n.value().new_plan.has_value());
}

}  // namespace
}  // namespace falcon::train
