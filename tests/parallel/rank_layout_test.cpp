// Megatron rank order: group membership and node spans.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "parallel/rank_layout.h"

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

TEST(RankLayout, NodeSpanIsTheWidestGroup) {
  // EP 6 on 12 ranks: {0..5} sits in node 0 but {6..11} straddles nodes 0 and 1.
  EXPECT_EQ(group_nodes(make_rank_layout(12, 1, 1, 1, 6, 1), Group::EP, 8), 2);
  // Brute force over member lists for every layout of small worlds and node sizes.
  const Group kinds[] = {Group::TP, Group::CP, Group::DP, Group::PP, Group::DP_CP, Group::TP_CP,
                         Group::EP, Group::ETP, Group::EDP, Group::EP_ETP};
  int layouts = 0;
  for (int world : {4, 6, 12, 16, 24, 48}) {
    std::vector<int> div;
    for (int d = 1; d <= world; ++d)
      if (world % d == 0) div.push_back(d);
    for (int tp : div)
      for (int pp : div)
        for (int cp : div)
          for (int ep : div)
            for (int etp : {1, 2}) {
              if (world % (tp * pp * cp) != 0) continue;
              RankLayout l;
              try {
                l = make_rank_layout(world, tp, pp, cp, ep, etp);
              } catch (const std::invalid_argument&) {
                continue;
              }
              ++layouts;
              for (int gpn : {2, 3, 4, 6, 8})
                for (Group g : kinds) {
                  int widest = 0;
                  for (const auto& members : all_groups(l, g)) {
                    std::set<int> nodes;
                    for (int r : members) nodes.insert(r / gpn);
                    widest = std::max(widest, int(nodes.size()));
                  }
                  ASSERT_EQ(group_nodes(l, g, gpn), widest) << group_name(g) << " world " << world << " tp " << tp
                                                            << " pp " << pp << " cp " << cp << " ep " << ep
                                                            << " etp " << etp << " gpn " << gpn;
                }
            }
  }
  EXPECT_GT(layouts, 100);
}

TEST(RankLayout, RejectsSizesThatDoNotTile) {
  EXPECT_THROW(make_rank_layout(32, 3, 1, 1, 1, 1), std::invalid_argument);
  EXPECT_THROW(make_rank_layout(32, 1, 1, 1, 64, 1), std::invalid_argument);
  EXPECT_THROW(make_rank_layout(0, 1, 1, 1, 1, 1), std::invalid_argument);
}
