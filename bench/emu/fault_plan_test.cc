// Fault plan parsing (valid plans and every invalid case) and the fabric model's use of it: a
// link fault slows exactly the traffic crossing its two nodes, a nic fault all inter-node traffic
// of its node. Pure code, no processes.
// Thread-safety: single-threaded. Must never: touch the environment or the clock.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "fabric_model.h"
#include "fault_plan.h"

namespace falcon::emu {
namespace {

TEST(FaultPlanTest, ParsesEveryKind) {
  const auto r = ParseFaultPlan(R"({"faults": [
    {"kind": "compute", "ranks": [1, 2], "start_s": 30, "duration_s": 60, "factor": 2.5},
    {"kind": "link", "nodes": [0, 1], "start_s": 5, "factor": 4},
    {"kind": "nic", "nodes": [3], "factor": 2},
    {"kind": "hang", "ranks": [7], "start_s": 1, "duration_s": 2}]})");
  ASSERT_TRUE(r.ok()) << r.error;
  const FaultPlan& p = *r.plan;
  ASSERT_EQ(p.faults().size(), 4u);
  EXPECT_DOUBLE_EQ(p.ComputeFactor(1, 29.9), 1.0);
  EXPECT_DOUBLE_EQ(p.ComputeFactor(1, 30), 2.5);
  EXPECT_DOUBLE_EQ(p.ComputeFactor(2, 89.9), 2.5);
  EXPECT_DOUBLE_EQ(p.ComputeFactor(2, 90), 1.0);
  EXPECT_DOUBLE_EQ(p.ComputeFactor(3, 40), 1.0);
  EXPECT_DOUBLE_EQ(p.LinkFactor(0, 1, 1e6), 4.0);  // no duration: forever
  EXPECT_DOUBLE_EQ(p.LinkFactor(1, 0, 6), 4.0);
  EXPECT_DOUBLE_EQ(p.LinkFactor(0, 1, 4), 1.0);
  EXPECT_DOUBLE_EQ(p.LinkFactor(0, 2, 6), 1.0);
  EXPECT_DOUBLE_EQ(p.LinkFactor(2, 3, 0), 2.0);
  EXPECT_DOUBLE_EQ(p.LinkFactor(3, 3, 0), 1.0);  // intra-node traffic never crosses the NIC
  EXPECT_FALSE(p.HangUntil(7, 0.5));
  ASSERT_TRUE(p.HangUntil(7, 1.5));
  EXPECT_DOUBLE_EQ(*p.HangUntil(7, 1.5), 3.0);
  EXPECT_FALSE(p.HangUntil(6, 1.5));
}

TEST(FaultPlanTest, HangWithoutDurationIsForever) {
  const auto r = ParseFaultPlan(R"({"faults": [{"kind": "hang", "ranks": [0]}]})");
  ASSERT_TRUE(r.ok()) << r.error;
  ASSERT_TRUE(r.plan->HangUntil(0, 100));
  EXPECT_TRUE(std::isinf(*r.plan->HangUntil(0, 100)));
}

TEST(FaultPlanTest, EmptyPlanIsValid) {
  const auto r = ParseFaultPlan(R"({"faults": []})");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r.plan->empty());
}

struct BadCase {
  const char* json;
  const char* expect;  // substring of the error
};

class FaultPlanInvalidTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(FaultPlanInvalidTest, RejectsWithClearMessage) {
  const auto r = ParseFaultPlan(GetParam().json);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error.find(GetParam().expect), std::string::npos) << r.error;
}

INSTANTIATE_TEST_SUITE_P(Cases, FaultPlanInvalidTest, ::testing::Values(
    BadCase{"not json", "invalid JSON"},
    BadCase{"[]", "top level"},
    BadCase{"{}", "missing \"faults\""},
    BadCase{R"({"faults": {}})", "missing \"faults\""},
    BadCase{R"({"faults": [], "extra": 1})", "unknown top-level key"},
    BadCase{R"({"faults": [3]})", "faults[0]: must be an object"},
    BadCase{R"({"faults": [{"ranks": [0], "factor": 2}]})", "missing string \"kind\""},
    BadCase{R"({"faults": [{"kind": "disk", "ranks": [0], "factor": 2}]})", "unknown kind \"disk\""},
    BadCase{R"({"faults": [{"kind": "compute", "ranks": [0], "factor": 2, "foo": 1}]})", "unknown key \"foo\""},
    BadCase{R"({"faults": [{"kind": "compute", "ranks": [0], "factor": 2, "start_s": -1}]})", "\"start_s\" must be >= 0"},
    BadCase{R"({"faults": [{"kind": "compute", "ranks": [0], "factor": 2, "duration_s": -5}]})", "\"duration_s\" must be >= 0"},
    BadCase{R"({"faults": [{"kind": "compute", "ranks": [0], "factor": 2, "start_s": "x"}]})", "\"start_s\" must be a number"},
    BadCase{R"({"faults": [{"kind": "compute", "ranks": [0], "factor": 0.5}]})", "\"factor\" must be >= 1"},
    BadCase{R"({"faults": [{"kind": "compute", "ranks": [0]}]})", "\"factor\" is required"},
    BadCase{R"({"faults": [{"kind": "compute", "factor": 2}]})", "requires \"ranks\""},
    BadCase{R"({"faults": [{"kind": "hang"}]})", "requires \"ranks\""},
    BadCase{R"({"faults": [{"kind": "compute", "ranks": [], "factor": 2}]})", "non-empty array"},
    BadCase{R"({"faults": [{"kind": "compute", "ranks": [-1], "factor": 2}]})", "non-negative integers"},
    BadCase{R"({"faults": [{"kind": "compute", "nodes": [0], "factor": 2}]})", "takes \"ranks\""},
    BadCase{R"({"faults": [{"kind": "link", "factor": 2}]})", "requires \"nodes\""},
    BadCase{R"({"faults": [{"kind": "link", "nodes": [1], "factor": 2}]})", "exactly two distinct"},
    BadCase{R"({"faults": [{"kind": "link", "nodes": [1, 1], "factor": 2}]})", "exactly two distinct"},
    BadCase{R"({"faults": [{"kind": "link", "nodes": [0, 1, 2], "factor": 2}]})", "exactly two distinct"},
    BadCase{R"({"faults": [{"kind": "nic", "ranks": [0], "factor": 2}]})", "takes \"nodes\""},
    BadCase{R"({"faults": [{"kind": "compute", "ranks": [0], "factor": 2}, {"kind": "x"}]})", "faults[1]"}));

TEST(FaultPlanTest, LoadsInlineAndFromFile) {
  EXPECT_TRUE(LoadFaultPlan(R"(  {"faults": []})").ok());
  const auto missing = LoadFaultPlan("/nonexistent/plan.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error.find("cannot open"), std::string::npos);
}

// A link fault between nodes 0 and 1 slows exactly the traffic crossing them.
TEST(FabricModelTest, LinkFaultSlowsOnlyAffectedTraffic) {
  const auto r = ParseFaultPlan(R"({"faults": [{"kind": "link", "nodes": [0, 1], "start_s": 10, "duration_s": 10, "factor": 3}]})");
  ASSERT_TRUE(r.ok());
  const FaultPlan& plan = *r.plan;
  FabricParams p;
  const double mb = 1 << 20;
  const double base01 = ModelP2pSeconds(p, nullptr, 0, 1, mb, 15);
  EXPECT_DOUBLE_EQ(ModelP2pSeconds(p, &plan, 0, 1, mb, 15), 3 * base01);
  EXPECT_DOUBLE_EQ(ModelP2pSeconds(p, &plan, 1, 0, mb, 15), 3 * base01);
  EXPECT_DOUBLE_EQ(ModelP2pSeconds(p, &plan, 0, 1, mb, 5), base01);   // before the fault
  EXPECT_DOUBLE_EQ(ModelP2pSeconds(p, &plan, 0, 1, mb, 20), base01);  // after it
  EXPECT_DOUBLE_EQ(ModelP2pSeconds(p, &plan, 0, 2, mb, 15), ModelP2pSeconds(p, nullptr, 0, 2, mb, 15));
  EXPECT_DOUBLE_EQ(ModelP2pSeconds(p, &plan, 1, 1, mb, 15), ModelP2pSeconds(p, nullptr, 1, 1, mb, 15));
  // A ring over nodes {0,0,1,1} crosses 0-1: slowed. A ring over {0,0,2,2} does not.
  const std::vector<int> crossing = {0, 0, 1, 1}, other = {0, 0, 2, 2};
  EXPECT_GT(ModelCollSeconds(p, &plan, CollKind::kAllReduce, crossing, mb, 15),
            2.9 * ModelCollSeconds(p, nullptr, CollKind::kAllReduce, crossing, mb, 15));
  EXPECT_DOUBLE_EQ(ModelCollSeconds(p, &plan, CollKind::kAllReduce, other, mb, 15),
                   ModelCollSeconds(p, nullptr, CollKind::kAllReduce, other, mb, 15));
}

TEST(FabricModelTest, FormulasAndKnobs) {
  FabricParams p;
  const std::vector<int> one_node = {0, 0, 0, 0};
  const double bytes = 4e6;
  // all-reduce: 2(n-1) * (lat + bytes/n / bw) with intra figures.
  EXPECT_NEAR(ModelCollSeconds(p, nullptr, CollKind::kAllReduce, one_node, bytes, 0),
              6 * (2e-6 + 1e6 / 100e9), 1e-12);
  EXPECT_NEAR(ModelCollSeconds(p, nullptr, CollKind::kAllGather, one_node, bytes, 0), 3 * (2e-6 + 1e6 / 100e9), 1e-12);
  EXPECT_NEAR(ModelP2pSeconds(p, nullptr, 0, 1, 25e6, 0), 10e-6 + 1e-3, 1e-12);
  EXPECT_EQ(ModelCollSeconds(p, nullptr, CollKind::kAllReduce, std::vector<int>{0}, bytes, 0), 0.0);
  p.time_scale = 2;
  EXPECT_NEAR(ModelP2pSeconds(p, nullptr, 0, 1, 25e6, 0), 2 * (10e-6 + 1e-3), 1e-12);
  p.enabled = false;
  EXPECT_EQ(ModelCollSeconds(p, nullptr, CollKind::kAllReduce, one_node, bytes, 0), 0.0);
  EXPECT_EQ(ModelP2pSeconds(p, nullptr, 0, 1, bytes, 0), 0.0);
}

}  // namespace
}  // namespace falcon::emu
