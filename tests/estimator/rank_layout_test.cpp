// Megatron rank order: group membership and node spans.
#include <gtest/gtest.h>

#include <set>

#include "estimator/rank_layout.h"

using namespace lcplan;

TEST(RankLayout, DenseOrderIsTpCpDpPp) {
  const RankLayout l = make_rank_layout(32, /*tp=*/2, /*pp=*/4, /*cp=*/2, /*ep=*/8, /*etp=*/1);
  EXPECT_EQ(l.dp, 2);
  EXPECT_EQ(group_ranks(l, Group::TP, 0), (std::vector<int>{0, 1}));
  EXPECT_EQ(group_ranks(l, Group::CP, 0), (std::vector<int>{0, 2}));
  EXPECT_EQ(group_ranks(l, Group::DP, 0), (std::vector<int>{0, 4}));
  EXPECT_EQ(group_ranks(l, Group::PP, 0), (std::vector<int>{0, 8, 16, 24}));
  // Expert order etp-ep-edp-pp: EP 8 takes the 8 ranks of a stage.
  EXPECT_EQ(group_ranks(l, Group::EP, 3), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(l.edp, 1);
}

TEST(RankLayout, GroupsPartitionTheWorld) {
  const RankLayout l = make_rank_layout(64, 2, 2, 4, 4, 2);
  for (Group g : {Group::TP, Group::CP, Group::DP, Group::PP, Group::DP_CP, Group::EP, Group::ETP, Group::EDP}) {
    std::set<int> seen;
    for (const auto& members : all_groups(l, g)) {
      EXPECT_EQ(int(members.size()), group_size(l, g)) << group_name(g);
      for (int r : members) EXPECT_TRUE(seen.insert(r).second) << group_name(g) << " rank " << r;
    }
    EXPECT_EQ(int(seen.size()), 64) << group_name(g);
  }
}

TEST(RankLayout, NodeSpanFlipsWhenAGroupLeavesTheNode) {
  // EP 8 with tp = cp = 1 sits in one 8-GPU node; EP 16 spans two.
  EXPECT_EQ(group_nodes(make_rank_layout(32, 1, 1, 1, 8, 1), Group::EP, 8), 1);
  EXPECT_EQ(group_nodes(make_rank_layout(32, 1, 1, 1, 16, 1), Group::EP, 8), 2);
  // CP 4 after TP 4 strides by 4: 16 ranks, two nodes.
  EXPECT_EQ(group_nodes(make_rank_layout(32, 4, 1, 4, 1, 1), Group::CP, 8), 2);
  EXPECT_EQ(group_nodes(make_rank_layout(32, 4, 1, 2, 1, 1), Group::CP, 8), 1);
}

TEST(RankLayout, RejectsSizesThatDoNotTile) {
  EXPECT_THROW(make_rank_layout(32, 3, 1, 1, 1, 1), std::invalid_argument);
  EXPECT_THROW(make_rank_layout(32, 1, 1, 1, 64, 1), std::invalid_argument);
  EXPECT_THROW(make_rank_layout(0, 1, 1, 1, 1, 1), std::invalid_argument);
}
