// Tests of the Megatron rank layout and the group colors.
#include "layout.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

namespace falcon::train {
namespace {

TEST(LayoutTest, MegatronOrderTpFastestThenDpThenPp) {
  const Shape s{2, 2, 2};
  struct Row { int rank, tp, dp, pp; };
  for (const Row& r : {Row{0, 0, 0, 0}, Row{1, 1, 0, 0}, Row{2, 0, 1, 0}, Row{3, 1, 1, 0}, Row{4, 0, 0, 1},
                       Row{7, 1, 1, 1}}) {
    const Coords c = CoordsOf(s, r.rank);
    EXPECT_EQ(c.tp, r.tp) << r.rank;
    EXPECT_EQ(c.dp, r.dp) << r.rank;
    EXPECT_EQ(c.pp, r.pp) << r.rank;
    EXPECT_EQ(RankOf(s, c), r.rank);
  }
}

// Every group has the expected size, members share the other coordinates, and the member order
// by global rank equals the coordinate along the group's dimension.
TEST(LayoutTest, GroupsPartitionTheWorld) {
  for (const Shape s : {Shape{1, 1, 1}, Shape{2, 2, 2}, Shape{1, 3, 1}, Shape{2, 1, 3}, Shape{2, 4, 2}, Shape{3, 2, 5}}) {
    std::map<int, std::set<int>> tp, dp, pp;
    for (int r = 0; r < s.world(); ++r) {
      const Coords c = CoordsOf(s, r);
      tp[TpGroupOf(s, c)].insert(r);
      dp[DpGroupOf(s, c)].insert(r);
      pp[PpGroupOf(s, c)].insert(r);
    }
    EXPECT_EQ(static_cast<int>(tp.size()), s.dp * s.pp);
    EXPECT_EQ(static_cast<int>(dp.size()), s.tp * s.pp);
    EXPECT_EQ(static_cast<int>(pp.size()), s.tp * s.dp);
    for (auto& [g, members] : pp) {
      ASSERT_EQ(static_cast<int>(members.size()), s.pp);
      int i = 0;
      for (int r : members) EXPECT_EQ(CoordsOf(s, r).pp, i++);
    }
    for (auto& [g, members] : dp) {
      ASSERT_EQ(static_cast<int>(members.size()), s.dp);
      int i = 0;
      for (int r : members) EXPECT_EQ(CoordsOf(s, r).dp, i++);
    }
    for (auto& [g, members] : tp) {
      ASSERT_EQ(static_cast<int>(members.size()), s.tp);
      int i = 0;
      for (int r : members) EXPECT_EQ(CoordsOf(s, r).tp, i++);
    }
  }
}

TEST(LayoutTest, ValidateShape) {
  EXPECT_TRUE(ValidateShape({2, 2, 2}, 8).ok());
  EXPECT_TRUE(ValidateShape({1, 1, 1}, 1).ok());
  const Status bad = ValidateShape({2, 2, 2}, 6);
  EXPECT_EQ(bad.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(bad.message().find("does not equal the world size 6"), std::string::npos) << bad.message();
  EXPECT_FALSE(ValidateShape({0, 1, 1}, 0).ok());
}

}  // namespace
}  // namespace falcon::train
