// Tests of the plan sources: the file watcher (new versions on change only, warnings for texts
// that are not plans), the conversion of the C API's plan into an offer, and --falcon-plans in a
// process without the shim (one warning, no plans, no ack).
#include "plan_source.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

namespace falcon::train {
namespace {

TEST(PlanSourceTest, FileSourceReturnsOnlyNewerVersionsOnChange) {
  char dir[] = "/tmp/falcon-plansource-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/plan.json";
  PlanFileSource src(path);
  std::string warn;
  EXPECT_FALSE(src.Poll(0, &warn).has_value());  // no file yet
  EXPECT_TRUE(warn.empty());
  std::ofstream(path) << R"({"version": 1, "micro_batches": [3, 5]})";
  std::optional<PlanOffer> p = src.Poll(0, &warn);
  ASSERT_TRUE(p.has_value()) << warn;
  EXPECT_EQ(p->source, "file");
  EXPECT_EQ(p->plan.micro_batches, (std::vector<int>{3, 5}));
  EXPECT_FALSE(src.Poll(1, &warn).has_value());  // unchanged file
  std::ofstream(path) << R"({"version": 1, "micro_batches": [3, 6]})";  // same version: not newer
  EXPECT_FALSE(src.Poll(1, &warn).has_value());
  std::ofstream(path) << R"({"version": 2, "strategy": "S7"})";  // a plan, but a bad one: an offer to reject
  p = src.Poll(1, &warn);
  ASSERT_TRUE(p.has_value());
  EXPECT_NE(p->rejection.find("unknown strategy"), std::string::npos) << p->rejection;
  std::ofstream(path) << "{not json";  // not a plan at all: a warning
  EXPECT_FALSE(src.Poll(2, &warn).has_value());
  EXPECT_NE(warn.find("not valid JSON"), std::string::npos) << warn;
  std::remove(path.c_str());
  rmdir(dir);
}

TEST(PlanSourceTest, OffersFromTheCApi) {
  FalconApiPlan api;
  api.info.version = 4;
  api.info.strategy = kFalconStrategyRestart;
  api.info.restart = 1;
  api.exclude_nodes = {2};
  PlanOffer o = OfferFromApi(api);
  EXPECT_EQ(o.source, "falcon");
  EXPECT_EQ(o.rejection, "");
  EXPECT_EQ(o.plan.version, 4);
  EXPECT_EQ(o.plan.strategy, Strategy::kRestart);
  EXPECT_EQ(o.plan.restart, std::optional<bool>(true));
  EXPECT_EQ(o.plan.exclude_nodes, (std::vector<int>{2}));
  api.info.strategy = kFalconStrategyRebalance;
  api.info.restart = 0;
  api.micro_batches = {2, 6};
  o = OfferFromApi(api);
  EXPECT_EQ(o.rejection, "");
  EXPECT_FALSE(o.plan.restart.has_value());
  EXPECT_EQ(o.plan.micro_batches, (std::vector<int>{2, 6}));
  api.info.strategy = 9;
  o = OfferFromApi(api);
  EXPECT_FALSE(o.strategy_known);
  EXPECT_NE(o.rejection.find("unknown strategy code 9"), std::string::npos) << o.rejection;
  api.info.strategy = kFalconStrategyRebalance;
  api.micro_batches = {0, 6};
  EXPECT_NE(OfferFromApi(api).rejection.find("outside [1, 4096]"), std::string::npos);
}

TEST(PlanSourceTest, WithoutTheShimFalconPlansWarnOnceAndNeverOffer) {
  FalconPlanSource src;  // this test binary does not preload libfalcon_shim.so
  EXPECT_FALSE(src.available());
  std::string warn;
  EXPECT_FALSE(src.Poll(0, &warn).has_value());
  EXPECT_NE(warn.find("no falconGetPlan"), std::string::npos) << warn;
  for (int i = 0; i < 3; ++i) {
    std::string again;
    EXPECT_FALSE(src.Poll(0, &again).has_value());
    EXPECT_TRUE(again.empty()) << again;
  }
  const FalconAck ack;
  EXPECT_FALSE(ack.available());
  EXPECT_FALSE(ack.Ack(1, 0));
}

}  // namespace
}  // namespace falcon::train
