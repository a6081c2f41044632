// Tests of the ground-truth report: affected faults, summary statistics, JSON fields, paths.
#include "report.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace falcon::train {
namespace {

TEST(ReportTest, FaultsAffectingRankOrNode) {
  const emu::FaultPlanResult p = emu::ParseFaultPlan(R"({"faults": [
      {"kind": "compute", "ranks": [3], "factor": 3},
      {"kind": "compute", "ranks": [4], "factor": 2},
      {"kind": "link", "nodes": [0, 1], "start_s": 5, "factor": 4},
      {"kind": "nic", "nodes": [2], "factor": 2},
      {"kind": "hang", "ranks": [3], "start_s": 1, "duration_s": 2}]})");
  ASSERT_TRUE(p.ok()) << p.error;
  const auto f = FaultsAffecting(*p.plan, 3, {1});
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0].index, 0);
  EXPECT_EQ(f[0].scope, "rank");
  EXPECT_EQ(f[1].index, 2);
  EXPECT_EQ(f[1].scope, "node");
  EXPECT_EQ(f[2].index, 4);
  EXPECT_TRUE(FaultsAffecting(*p.plan, 5, {3}).empty());
  // A rank that ran on several nodes is touched by the faults of each.
  EXPECT_EQ(FaultsAffecting(*p.plan, 5, {3, 2}).size(), 1u);
}

TEST(ReportTest, SummaryStatistics) {
  std::vector<IterationRecord> it;
  for (double d : {0.3, 0.1, 0.2, 0.5}) it.push_back({static_cast<int>(it.size()), 0, d, 4, 0, 1});
  const Summary s = Summarize(it);
  EXPECT_EQ(s.iterations, 4);
  EXPECT_DOUBLE_EQ(s.median_s, 0.25);
  EXPECT_DOUBLE_EQ(s.min_s, 0.1);
  EXPECT_DOUBLE_EQ(s.max_s, 0.5);
  EXPECT_NEAR(s.total_s, 1.1, 1e-12);
  EXPECT_EQ(Summarize({}).iterations, 0);
}

TEST(ReportTest, JsonHasTheSchemaFields) {
  ReportData r;
  r.rank = 3;
  r.world_size = 8;
  r.coords = {1, 1, 0};
  r.options.shape = {2, 2, 2};
  r.iterations = {{0, 0.5, 0.07, 4, 0, 1}, {1, 0.57, 0.08, 2, 1, 3}};
  r.plan_changes = {{1, 1, {2, 6}}};
  PlanRecord applied;
  applied.version = 2;
  applied.strategy = "S4";
  applied.status = "applied";
  applied.cost_s = 1.5;
  applied.restart = true;
  PlanRecord rejected;
  rejected.version = 3;
  rejected.status = "rejected";
  rejected.reason = "placement has 3 entries";
  r.plans = {applied, rejected};
  r.restarts = {{2, 0.6, 8, 5, 3, 0.2, 1, 1.5, {1}}};
  r.checkpoints = {5, 1, 5};
  const auto j = nlohmann::json::parse(ReportJson(r, -1));
  EXPECT_EQ(j["schema"], "falcon.train.report");
  EXPECT_EQ(j["schema_version"], kReportSchemaVersion);
  EXPECT_EQ(j["status"], "ok");
  EXPECT_EQ(j["rank"], 3);
  EXPECT_EQ(j["coords"]["dp"], 1);
  EXPECT_EQ(j["shape"]["pp"], 2);
  EXPECT_EQ(j["iterations"].size(), 2u);
  EXPECT_EQ(j["iterations"][1]["compute_factor"], 3);
  EXPECT_EQ(j["plan_changes"][0]["micro_batches"], nlohmann::json({2, 6}));
  EXPECT_EQ(j["summary"]["iterations"], 2);
  EXPECT_TRUE(j["faults"].is_array());
  EXPECT_TRUE(j["config"].contains("activation_bytes"));
  EXPECT_EQ(j["config"]["plan_source"], "none");
  EXPECT_EQ(j["iterations"][1]["redo"], false);
  EXPECT_EQ(j["plans"][0]["restart"], true);
  EXPECT_EQ(j["plans"][1]["reason"], "placement has 3 entries");
  EXPECT_EQ(j["restarts"][0]["lost_iterations"], 3);
  EXPECT_EQ(j["restarts"][0]["exclude_nodes"], nlohmann::json({1}));
  EXPECT_EQ(j["checkpoints"]["taken"], 1);
  EXPECT_EQ(j["summary"]["plans_applied"], 1);
  EXPECT_EQ(j["summary"]["plans_rejected"], 1);
  EXPECT_EQ(j["summary"]["lost_iterations"], 3);
  EXPECT_DOUBLE_EQ(j["summary"]["mitigation_cost_s"].get<double>(), 1.5);
  EXPECT_NE(SummaryLine(r).find("plans applied 1 rejected 1, restarts 1 (lost 3 iterations)"), std::string::npos)
      << SummaryLine(r);
}

TEST(ReportTest, ReportPaths) {
  EXPECT_EQ(ReportPath("-", 3, 8), "-");
  EXPECT_EQ(ReportPath("/t/r-{rank}.json", 3, 8), "/t/r-3.json");
  EXPECT_EQ(ReportPath("/t/r.json", 3, 8), "/t/r.json.rank3");
  EXPECT_EQ(ReportPath("/t/r.json", 0, 1), "/t/r.json");
}

}  // namespace
}  // namespace falcon::train
