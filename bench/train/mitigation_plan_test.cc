// Tests of the plan schema, its parser, and what each strategy does to a job (ResolvePlan):
// S1 undo after S2, S2 sizes, S3 placement checks, S4 onto spares, and every rejection.
#include "mitigation_plan.h"

#include <gtest/gtest.h>

namespace falcon::train {
namespace {

MitigationPlan Parsed(const char* json) {
  const Result<PlanOffer> o = ParsePlanJson(json);
  EXPECT_TRUE(o.ok()) << json << ": " << o.status().ToString();
  EXPECT_EQ(o.value().rejection, "") << json;
  return o.ok() ? o.value().plan : MitigationPlan{};
}

// 8 ranks (tp 2, dp 2, pp 2), 2 per node on nodes 0..3, one spare node (4).
JobFacts Facts() {
  JobFacts f;
  f.world = 8;
  f.dp = 2;
  f.initial_micro_batches = {4, 4};
  f.total_nodes = 5;
  f.gpus_per_node = 2;
  f.can_replace = true;
  return f;
}

PlanState Launch() { return {{4, 4}, {0, 0, 1, 1, 2, 2, 3, 3}, {}}; }

TEST(MitigationPlanTest, ParsesEveryField) {
  const MitigationPlan p = Parsed(R"({"version": 7, "strategy": "S4", "micro_batches": [3, 5],
      "placement": [0, 0, 4, 4, 2, 2, 3, 3], "exclude_nodes": [1], "restart": true, "note": "ignored"})");
  EXPECT_EQ(p.version, 7);
  EXPECT_EQ(p.strategy, Strategy::kRestart);
  EXPECT_EQ(p.micro_batches, (std::vector<int>{3, 5}));
  EXPECT_EQ(p.placement, (std::vector<int>{0, 0, 4, 4, 2, 2, 3, 3}));
  EXPECT_EQ(p.exclude_nodes, (std::vector<int>{1}));
  EXPECT_EQ(p.restart, std::optional<bool>(true));
  // The protocol's name for the version; the old format (no strategy) is S2.
  EXPECT_EQ(Parsed(R"({"plan_version": 3, "strategy": "S1"})").version, 3);
  const MitigationPlan old = Parsed(R"({"version": 2, "micro_batches": [2, 6]})");
  EXPECT_EQ(old.strategy, Strategy::kRebalance);
  EXPECT_FALSE(old.restart.has_value());
}

TEST(MitigationPlanTest, TextsWithoutAVersionAreNotPlans) {
  for (const char* json : {"nope", "[1]", R"({"micro_batches": [1, 1]})", R"({"version": 0, "strategy": "S1"})",
                           R"({"version": 1.5})", R"({"version": 1, "plan_version": 2})"}) {
    EXPECT_FALSE(ParsePlanJson(json).ok()) << json;
  }
}

TEST(MitigationPlanTest, MalformedPlansAreRejectedOffers) {
  struct Case { const char* json; const char* says; bool strategy_known; };
  for (const Case& c : {Case{R"({"version": 4, "strategy": "S9"})", "unknown strategy \"S9\"", false},
                        Case{R"({"version": 4, "strategy": 2})", "must be a string", false},
                        Case{R"({"version": 4})", "\"strategy\" is missing", true},
                        Case{R"({"version": 4, "strategy": "S2", "micro_batches": [1, 0]})", "integers in [1,", true},
                        Case{R"({"version": 4, "strategy": "S3", "placement": [0, -1]})", "integers in [0,", true},
                        Case{R"({"version": 4, "strategy": "S3", "placement": 3})", "must be an array", true},
                        Case{R"({"version": 4, "strategy": "S4", "restart": "yes"})", "true or false", true}}) {
    const Result<PlanOffer> o = ParsePlanJson(c.json);
    ASSERT_TRUE(o.ok()) << c.json;
    EXPECT_EQ(o.value().plan.version, 4);
    EXPECT_NE(o.value().rejection.find(c.says), std::string::npos) << c.json << ": " << o.value().rejection;
    EXPECT_EQ(o.value().strategy_known, c.strategy_known) << c.json;
  }
}

TEST(MitigationPlanTest, S2ThenS1UndoesTheRebalancing) {
  const JobFacts f = Facts();
  Result<PlanEffect> s2 = ResolvePlan(Parsed(R"({"version": 1, "strategy": "S2", "micro_batches": [2, 6]})"), f, Launch());
  ASSERT_TRUE(s2.ok()) << s2.status().ToString();
  EXPECT_EQ(s2.value().micro_batches, (std::vector<int>{2, 6}));
  EXPECT_EQ(s2.value().placement, Launch().placement);
  EXPECT_FALSE(s2.value().restart);
  const PlanState after{s2.value().micro_batches, s2.value().placement, {}};
  // S1 goes back to the job's own counts, whatever counts the plan carries.
  for (const char* json : {R"({"version": 2, "strategy": "S1"})", R"({"version": 2, "strategy": "S1", "micro_batches": [1, 7]})"}) {
    Result<PlanEffect> s1 = ResolvePlan(Parsed(json), f, after);
    ASSERT_TRUE(s1.ok()) << json;
    EXPECT_EQ(s1.value().micro_batches, (std::vector<int>{4, 4})) << json;
  }
}

TEST(MitigationPlanTest, S3MovesRanksAndKeepsOrSetsCounts) {
  const JobFacts f = Facts();
  const PlanState now{{3, 5}, Launch().placement, {}};
  Result<PlanEffect> e = ResolvePlan(Parsed(R"({"version": 3, "strategy": "S3", "placement": [0, 0, 3, 3, 2, 2, 1, 1]})"), f, now);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e.value().placement, (std::vector<int>{0, 0, 3, 3, 2, 2, 1, 1}));
  EXPECT_EQ(e.value().micro_batches, (std::vector<int>{3, 5}));
  EXPECT_EQ(MovedRanks(now.placement, e.value().placement), (std::vector<int>{2, 3, 6, 7}));
  e = ResolvePlan(Parsed(R"({"version": 3, "strategy": "S3", "placement": [4, 4, 1, 1, 2, 2, 3, 3],
                            "micro_batches": [4, 4]})"), f, now);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e.value().micro_batches, (std::vector<int>{4, 4}));
}

TEST(MitigationPlanTest, S4MovesExcludedNodesOntoSparesAndRestarts) {
  JobFacts f = Facts();
  const PlanState now{{2, 6}, Launch().placement, {}};
  Result<PlanEffect> e = ResolvePlan(Parsed(R"({"version": 5, "strategy": "S4", "exclude_nodes": [1], "restart": true})"), f, now);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e.value().placement, (std::vector<int>{0, 0, 4, 4, 2, 2, 3, 3}));
  EXPECT_TRUE(e.value().restart);
  EXPECT_EQ(e.value().micro_batches, (std::vector<int>{4, 4}));  // a restart starts from the job's own counts
  // The plan's placement wins; its counts too.
  e = ResolvePlan(Parsed(R"({"version": 5, "strategy": "S4", "exclude_nodes": [3], "micro_batches": [5, 3],
                            "placement": [0, 0, 1, 1, 2, 2, 4, 4]})"), f, now);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e.value().placement, (std::vector<int>{0, 0, 1, 1, 2, 2, 4, 4}));
  EXPECT_EQ(e.value().micro_batches, (std::vector<int>{5, 3}));
  // Two excluded nodes, one spare: the trainer cannot shrink.
  e = ResolvePlan(Parsed(R"({"version": 5, "strategy": "S4", "exclude_nodes": [1, 2]})"), f, now);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("not enough spare nodes"), std::string::npos) << e.status().message();
  f.total_nodes = 6;
  e = ResolvePlan(Parsed(R"({"version": 5, "strategy": "S4", "exclude_nodes": [2, 1]})"), f, now);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e.value().placement, (std::vector<int>{0, 0, 4, 4, 5, 5, 3, 3}));
}

TEST(MitigationPlanTest, PlansThatDoNotFitTheJobAreRejectedWithAReason) {
  JobFacts f = Facts();
  const PlanState now = Launch();
  struct Case { const char* json; const char* says; };
  for (const Case& c : {
           Case{R"({"version": 9, "strategy": "S2"})", "S2 needs micro_batches"},
           Case{R"({"version": 9, "strategy": "S2", "micro_batches": [1, 2, 3]})", "has 3 entries; the job has dp=2"},
           Case{R"({"version": 9, "strategy": "S3"})", "S3 needs a placement"},
           Case{R"({"version": 9, "strategy": "S3", "placement": [0, 0, 1, 1]})", "has 4 entries; the job has 8 ranks"},
           Case{R"({"version": 9, "strategy": "S3", "placement": [0, 0, 1, 1, 2, 2, 3, 5]})", "on node 5; the job has nodes 0..4"},
           Case{R"({"version": 9, "strategy": "S3", "placement": [0, 0, 0, 1, 2, 2, 3, 3]})", "more than 2 ranks on node 0"},
           Case{R"({"version": 9, "strategy": "S3", "placement": [0, 0, 1, 1, 2, 2, 3, 3], "restart": true})", "only for S4"},
           Case{R"({"version": 9, "strategy": "S4"})", "S4 needs exclude_nodes or a placement"},
           Case{R"({"version": 9, "strategy": "S4", "exclude_nodes": [1], "restart": false})", "not supported"},
           Case{R"({"version": 9, "strategy": "S4", "exclude_nodes": [1, 1]})", "repeats a node"},
           Case{R"({"version": 9, "strategy": "S4", "exclude_nodes": [7]})", "names node 7"},
           Case{R"({"version": 9, "strategy": "S4", "exclude_nodes": [1], "placement": [0, 0, 1, 1, 2, 2, 3, 3]})",
                "on excluded node 1"}}) {
    const Result<PlanEffect> e = ResolvePlan(Parsed(c.json), f, now);
    ASSERT_FALSE(e.ok()) << c.json;
    EXPECT_NE(e.status().message().find(c.says), std::string::npos) << c.json << ": " << e.status().message();
  }
  f.can_replace = false;  // not under falcon-emu-run: placements cannot change, counts can
  const Result<PlanEffect> e = ResolvePlan(Parsed(R"({"version": 9, "strategy": "S3", "placement": [0, 0, 1, 1, 2, 2, 4, 4]})"), f, now);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("cannot re-place"), std::string::npos) << e.status().message();
  EXPECT_TRUE(ResolvePlan(Parsed(R"({"version": 9, "micro_batches": [1, 7]})"), f, now).ok());
}

TEST(MitigationPlanTest, StrategyNamesAndCodes) {
  for (int code = 1; code <= 5; ++code) {
    const std::optional<Strategy> s = StrategyFromCode(code);
    ASSERT_TRUE(s.has_value());
    EXPECT_EQ(StrategyFromName(StrategyName(*s)), s);
  }
  EXPECT_FALSE(StrategyFromCode(0).has_value());
  EXPECT_FALSE(StrategyFromCode(6).has_value());
  EXPECT_FALSE(StrategyFromName("s2").has_value());
}

// A 4-stage job (dp 2) that runs pipeline plans with up to 6 activations per stage.
JobFacts PipelineFacts() {
  JobFacts f;
  f.world = 8;
  f.dp = 2;
  f.initial_micro_batches = {8, 8};
  f.total_nodes = 8;
  f.gpus_per_node = 1;
  f.pp = 4;
  f.activation_limit = 6;
  return f;
}

PlanState PipelineLaunch() { return {{8, 8}, {0, 1, 2, 3, 4, 5, 6, 7}, {}}; }

TEST(MitigationPlanTest, PipelinePlanSetsWarmupCountsThatLaterPlansKeepAndS1Undoes) {
  const JobFacts f = PipelineFacts();
  const MitigationPlan p = Parsed(R"({"version": 4, "strategy": "pipeline", "warmup": [5, 4, 1, 0]})");
  EXPECT_EQ(p.strategy, Strategy::kPipeline);
  Result<PlanEffect> e = ResolvePlan(p, f, PipelineLaunch());
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e.value().warmup, (std::vector<int>{5, 4, 1, 0}));
  EXPECT_EQ(e.value().micro_batches, (std::vector<int>{8, 8}));
  EXPECT_FALSE(e.value().restart);
  const PlanState adapted{e.value().micro_batches, e.value().placement, e.value().warmup};
  Result<PlanEffect> s2 = ResolvePlan(Parsed(R"({"version": 5, "strategy": "S2", "micro_batches": [7, 9]})"), f, adapted);
  ASSERT_TRUE(s2.ok());
  EXPECT_EQ(s2.value().warmup, adapted.warmup);
  Result<PlanEffect> s1 = ResolvePlan(Parsed(R"({"version": 6, "strategy": "S1"})"), f, adapted);
  ASSERT_TRUE(s1.ok());
  EXPECT_TRUE(s1.value().warmup.empty());
  // With micro-batches, both apply.
  e = ResolvePlan(Parsed(R"({"version": 7, "strategy": "pipeline", "warmup": [3, 2, 1, 0], "micro_batches": [6, 10]})"),
                  f, PipelineLaunch());
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e.value().micro_batches, (std::vector<int>{6, 10}));
}

TEST(MitigationPlanTest, PipelinePlansOutsideTheJobsMeansAreRejectedWithTheReason) {
  JobFacts f = PipelineFacts();
  auto reason = [&](const char* json) {
    Result<PlanEffect> e = ResolvePlan(Parsed(json), f, PipelineLaunch());
    EXPECT_FALSE(e.ok()) << json;
    return e.ok() ? std::string() : e.status().message();
  };
  EXPECT_NE(reason(R"({"version": 1, "strategy": "pipeline", "warmup": [6, 4, 1, 0]})").find("hold 7"), std::string::npos);
  EXPECT_NE(reason(R"({"version": 1, "strategy": "pipeline", "warmup": [3, 4, 1, 0]})").find("increases"), std::string::npos);
  EXPECT_NE(reason(R"({"version": 1, "strategy": "pipeline", "warmup": [3, 2, 1]})").find("pp=4"), std::string::npos);
  EXPECT_NE(reason(R"({"version": 1, "strategy": "pipeline"})").find("needs warmup"), std::string::npos);
  EXPECT_NE(reason(R"({"version": 1, "strategy": "S2", "micro_batches": [8, 8], "warmup": [3, 2, 1, 0]})")
                .find("only for pipeline"),
            std::string::npos);
  f.no_pipeline_plans = "pipeline plans need --pp-comm per-direction";
  EXPECT_EQ(reason(R"({"version": 1, "strategy": "pipeline", "warmup": [3, 2, 1, 0]})"), f.no_pipeline_plans);
  // Malformed counts never reach ResolvePlan.
  const Result<PlanOffer> bad = ParsePlanJson(R"({"version": 1, "strategy": "pipeline", "warmup": [3, -1, 0, 0]})");
  ASSERT_TRUE(bad.ok());
  EXPECT_NE(bad.value().rejection.find("warmup"), std::string::npos);
}

TEST(MitigationPlanTest, S4RestartsOnTheStandardSchedule) {
  const JobFacts f = PipelineFacts();
  const PlanState adapted{{8, 8}, PipelineLaunch().placement, {5, 4, 1, 0}};
  JobFacts g = f;
  g.total_nodes = 9;
  g.can_replace = true;
  Result<PlanEffect> e = ResolvePlan(Parsed(R"({"version": 8, "strategy": "S4", "exclude_nodes": [2], "restart": true})"),
                                     g, adapted);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_TRUE(e.value().restart);
  EXPECT_TRUE(e.value().warmup.empty());
}

}  // namespace
}  // namespace falcon::train
