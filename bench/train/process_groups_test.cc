// Tests of Megatron's process groups as data (process_groups.h): creation order, membership,
// and that every rank belongs to exactly one group of each kind it must.
#include "process_groups.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

namespace falcon::train {
namespace {

TEST(ProcessGroupsTest, OrderIsMegatronsAndEmbeddingGroupsFollowTheirPipelineGroup) {
  const std::vector<GroupSpec> g = MegatronGroups({2, 2, 2});
  std::vector<std::string> kinds;
  for (const GroupSpec& s : g) {
    if (kinds.empty() || kinds.back() != GroupName(s.kind)) kinds.push_back(GroupName(s.kind));
  }
  // dp-cp x4, dp x4, cp x8, mp x2, tp x4, then (pp, embd, pos-embd) per PP group, tp-dp-cp x2,
  // tp-dp x2, tp-cp x4.
  std::vector<std::string> expected = {"dp-cp", "dp", "cp", "mp", "tp"};
  for (int i = 0; i < 4; ++i) {
    for (const char* k : {"pp", "embd", "pos-embd"}) expected.push_back(k);
  }
  for (const char* k : {"tp-dp-cp", "tp-dp", "tp-cp"}) expected.push_back(k);
  EXPECT_EQ(kinds, expected);
  EXPECT_EQ(g.size(), 4u + 4 + 8 + 2 + 4 + 12 + 2 + 2 + 4);
}

TEST(ProcessGroupsTest, MembersMatchTheLayoutForManyShapes) {
  for (int tp = 1; tp <= 3; ++tp) {
    for (int dp = 1; dp <= 3; ++dp) {
      for (int pp = 1; pp <= 4; ++pp) {
        const Shape shape{tp, dp, pp};
        const std::vector<GroupSpec> groups = MegatronGroups(shape);
        for (int r = 0; r < shape.world(); ++r) {
          const Coords c = CoordsOf(shape, r);
          std::map<Group, int> count;
          for (const GroupSpec& g : groups) {
            const int me = MemberIndex(g, r);
            if (me < 0) continue;
            ++count[g.kind];
            switch (g.kind) {
              case Group::kTp:
                EXPECT_EQ(me, c.tp);
                EXPECT_EQ(g.index, TpGroupOf(shape, c));
                break;
              case Group::kDp:
              case Group::kDpCp:
                EXPECT_EQ(me, c.dp);
                EXPECT_EQ(g.index, DpGroupOf(shape, c));
                break;
              case Group::kPp:
                EXPECT_EQ(me, c.pp);
                EXPECT_EQ(g.index, PpGroupOf(shape, c));
                break;
              case Group::kMp:
                EXPECT_EQ(static_cast<int>(g.ranks.size()), tp * pp);
                EXPECT_EQ(g.index, c.dp);
                break;
              case Group::kEmbd:
                EXPECT_TRUE(c.pp == 0 || c.pp == pp - 1);
                EXPECT_EQ(g.ranks.size(), pp > 1 ? 2u : 1u);
                break;
              case Group::kPosEmbd:
                EXPECT_EQ(c.pp, 0);
                break;
              case Group::kTpDp:
              case Group::kTpDpCp:
                EXPECT_EQ(static_cast<int>(g.ranks.size()), tp * dp);
                break;
              default:
                break;
            }
          }
          for (Group k : {Group::kDpCp, Group::kDp, Group::kCp, Group::kMp, Group::kTp, Group::kPp, Group::kTpDpCp,
                          Group::kTpDp, Group::kTpCp}) {
            EXPECT_EQ(count[k], 1) << GroupName(k) << " rank " << r << " " << ToString(shape);
          }
          EXPECT_EQ(count[Group::kEmbd], c.pp == 0 || c.pp == pp - 1 ? 1 : 0);
          EXPECT_EQ(count[Group::kPosEmbd], c.pp == 0 ? 1 : 0);
        }
      }
    }
  }
}

TEST(ProcessGroupsTest, DpGroupTimesMpGroupIsTheWorld) {
  // The control word is summed over the DP group, then over the MP group: the two must cover
  // every rank exactly once (a DP group and an MP group meet in exactly one rank).
  const Shape shape{2, 3, 2};
  const std::vector<GroupSpec> groups = MegatronGroups(shape);
  for (const GroupSpec& dp : groups) {
    if (dp.kind != Group::kDpCp) continue;
    for (const GroupSpec& mp : groups) {
      if (mp.kind != Group::kMp) continue;
      int common = 0;
      for (int r : dp.ranks) common += MemberIndex(mp, r) >= 0 ? 1 : 0;
      EXPECT_EQ(common, 1);
    }
  }
}

TEST(ProcessGroupsTest, PerDirectionPairsComeLastAndGiveEachRankOneGroupPerKind) {
  const Shape shape{2, 2, 4};
  const std::vector<GroupSpec> plain = MegatronGroups(shape);
  const std::vector<GroupSpec> all = MegatronGroups(shape, true);
  ASSERT_EQ(all.size(), plain.size() + 2 * 4 * 3);  // 2 directions x (tp*dp) pipelines x (pp-1) pairs
  for (std::size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(all[i].ranks, plain[i].ranks);
  std::map<std::pair<int, Group>, int> per_rank_kind;
  for (std::size_t i = plain.size(); i < all.size(); ++i) {
    const GroupSpec& g = all[i];
    ASSERT_EQ(g.ranks.size(), 2u);
    const Coords a = CoordsOf(shape, g.ranks[0]), b = CoordsOf(shape, g.ranks[1]);
    EXPECT_EQ(a.tp, b.tp);
    EXPECT_EQ(a.dp, b.dp);
    EXPECT_EQ(b.pp, a.pp + 1);  // the lower stage is index 0 (megatron_trainer.cc relies on it)
    const bool fwd = g.kind == Group::kPpFwdEven || g.kind == Group::kPpFwdOdd;
    EXPECT_EQ(g.kind, PpPairGroup(fwd, a.pp));
    for (int r : g.ranks) EXPECT_EQ(++per_rank_kind[std::make_pair(r, g.kind)], 1) << GroupName(g.kind) << " rank " << r;
  }
  // A middle stage's rank is in 4 pair groups (both neighbours, both directions), an end stage's in 2.
  std::map<int, int> count;
  for (const auto& [key, n] : per_rank_kind) count[key.first] += n;
  for (int r = 0; r < shape.world(); ++r) {
    const int st = CoordsOf(shape, r).pp;
    EXPECT_EQ(count[r], st == 0 || st == shape.pp - 1 ? 2 : 4) << r;
  }
}

}  // namespace
}  // namespace falcon::train
