// Tests for the S4 restart planner: spares keep the shape, DP shrinks without them (TP x PP
// kept), "not possible" with its reason, the launch order of the restarted job, and the errors.
#include "analyzer/restart_plan.h"

#include <gtest/gtest.h>

#include <numeric>

namespace falcon::analyzer {
namespace {

using Nodes = std::vector<std::int32_t>;

// tp 8, dp 4, pp 2 on nodes 0..7 of 8 GPUs (64 ranks; one DP group is 2 nodes).
RestartRequest Job(Nodes faulty, Nodes spares = {}) {
  RestartRequest r;
  r.tp = 8;
  r.dp = 4;
  r.pp = 2;
  r.gpus_per_node = 8;
  r.job_nodes.resize(8);
  std::iota(r.job_nodes.begin(), r.job_nodes.end(), 0);
  r.faulty_nodes = std::move(faulty);
  r.spare_nodes = std::move(spares);
  return r;
}

TEST(RestartPlanTest, SparesTakeThePlaceOfFaultyNodes) {
  const RestartPlan plan = PlanRestart(Job({3}, {10, 11})).value();
  EXPECT_EQ(plan.kind, RestartKind::kKeepShape);
  EXPECT_EQ(plan.excluded_nodes, Nodes{3});
  EXPECT_EQ(plan.replacements, (std::vector<NodeReplacement>{{3, 10}}));
  EXPECT_EQ(plan.nodes, (Nodes{0, 1, 2, 10, 4, 5, 6, 7}));
  EXPECT_EQ(plan.idle_nodes, Nodes{11});
  EXPECT_EQ(plan.dp, 4);
  EXPECT_EQ(plan.world_size, 64);
  EXPECT_NE(plan.reason.find("1 spare(s)"), std::string::npos) << plan.reason;
}

TEST(RestartPlanTest, WithoutSparesDataParallelShrinksAndModelParallelStays) {
  const RestartPlan plan = PlanRestart(Job({3})).value();
  EXPECT_EQ(plan.kind, RestartKind::kShrinkDataParallel);
  EXPECT_EQ(plan.tp, 8);
  EXPECT_EQ(plan.pp, 2);
  EXPECT_EQ(plan.dp, 3);  // 7 healthy nodes = 56 GPUs hold 3 replicas of 16
  EXPECT_EQ(plan.world_size, 48);
  EXPECT_EQ(plan.nodes, (Nodes{0, 1, 2, 4, 5, 6}));
  EXPECT_EQ(plan.idle_nodes, Nodes{7});
  EXPECT_TRUE(plan.replacements.empty());
  EXPECT_NE(plan.reason.find("from 4 to 3"), std::string::npos) << plan.reason;
}

TEST(RestartPlanTest, TooFewSparesShrinkLess) {
  const RestartPlan plan = PlanRestart(Job({1, 2, 5}, {9})).value();
  EXPECT_EQ(plan.kind, RestartKind::kShrinkDataParallel);
  EXPECT_EQ(plan.dp, 3);  // 5 survivors + 1 spare = 48 GPUs
  EXPECT_EQ(plan.nodes, (Nodes{0, 9, 3, 4, 6, 7}));
  EXPECT_EQ(plan.replacements, (std::vector<NodeReplacement>{{1, 9}}));
  EXPECT_TRUE(plan.idle_nodes.empty());
}

TEST(RestartPlanTest, NoFaultyNodesKeepsTheJob) {
  const RestartPlan plan = PlanRestart(Job({})).value();
  EXPECT_EQ(plan.kind, RestartKind::kKeepShape);
  EXPECT_EQ(plan.nodes, Job({}).job_nodes);
  EXPECT_EQ(plan.dp, 4);
}

TEST(RestartPlanTest, NotPossibleSaysWhy) {
  RestartRequest one_replica = Job({0});
  one_replica.dp = 1;
  one_replica.pp = 4;  // 32 GPUs on nodes 0..3; 4 more nodes idle
  one_replica.job_nodes = {0, 1, 2, 3};
  RestartPlan plan = PlanRestart(one_replica).value();
  EXPECT_EQ(plan.kind, RestartKind::kNotPossible);
  EXPECT_NE(plan.reason.find("do not fit"), std::string::npos) << plan.reason;
  EXPECT_TRUE(plan.nodes.empty());
  EXPECT_EQ(plan.excluded_nodes, Nodes{0});
  EXPECT_EQ(plan.world_size, 0);

  RestartRequest floor = Job({3});
  floor.min_data_parallel = 4;
  plan = PlanRestart(floor).value();
  EXPECT_EQ(plan.kind, RestartKind::kNotPossible);
  EXPECT_NE(plan.reason.find("below the minimum 4"), std::string::npos) << plan.reason;

  RestartRequest few_microbatches = Job({3});
  few_microbatches.total_microbatches = 2;
  few_microbatches.dp = 2;  // 2 DP groups on 8 nodes, shrink not needed: dp stays 2
  EXPECT_EQ(PlanRestart(few_microbatches).value().kind, RestartKind::kKeepShape);
  few_microbatches.dp = 4;
  few_microbatches.faulty_nodes = {};
  few_microbatches.total_microbatches = 3;
  plan = PlanRestart(few_microbatches).value();
  EXPECT_EQ(plan.kind, RestartKind::kNotPossible);
  EXPECT_NE(plan.reason.find("cannot feed"), std::string::npos) << plan.reason;
}

TEST(RestartPlanTest, RejectsInvalidRequestsNamingTheFault) {
  struct Case {
    RestartRequest request;
    const char* needle;
  };
  std::vector<Case> cases;
  cases.push_back({Job({9}), "faulty node 9 is not in the job"});
  cases.push_back({Job({1}, {2}), "spare node 2 is in the job"});
  cases.push_back({Job({1, 1}), "faulty node 1 is listed twice"});
  cases.push_back({Job({}, {-4}), "spare node -4 is negative"});
  RestartRequest r = Job({});
  r.tp = 0;
  cases.push_back({r, "must be >= 1"});
  r = Job({});
  r.dp = 5;
  cases.push_back({r, "do not fit 8 nodes"});
  r = Job({});
  r.min_data_parallel = 0;
  cases.push_back({r, "min_data_parallel"});
  for (const Case& c : cases) {
    const Result<RestartPlan> plan = PlanRestart(c.request);
    ASSERT_FALSE(plan.ok()) << c.needle;
    EXPECT_EQ(plan.status().code(), Status::Code::kInvalidArgument);
    EXPECT_NE(plan.status().message().find(c.needle), std::string::npos) << plan.status().message();
  }
}

}  // namespace
}  // namespace falcon::analyzer
