#include <vector>

#include "kernels/comm/groups.h"
#include "tests/comm/driver.h"

namespace lcplan::comm::tests {

TEST(Split, PairsReduceInsideTheirGroup) {
  World w;
  if (w.c.size % 2) GTEST_SKIP() << "needs an even number of ranks";
  const int base = w.c.rank - w.c.rank % 2;
  Comm g = split(w.c, {base, base + 1});
  EXPECT_EQ(g.size, 2);
  EXPECT_EQ(g.rank, w.c.rank % 2);
  int v = w.c.rank;
  all_reduce(g, &v, 1, DType::I32, ReduceOp::Sum);
  EXPECT_EQ(v, 2 * base + 1);
  free_comm(g);
}

TEST(Split, ListOrderSetsGroupRank) {
  World w;
  std::vector<int> all(w.c.size);
  for (int r = 0; r < w.c.size; ++r) all[r] = w.c.size - 1 - r;  // reversed
  Comm g = split(w.c, all);
  EXPECT_EQ(g.rank, w.c.size - 1 - w.c.rank);
  free_comm(g);
}

TEST(Split, MismatchedGroupSizesFailOnEveryRank) {
  World w;
  if (w.c.size < 3) GTEST_SKIP() << "needs three ranks";
  // Rank 0 claims a group of 3, the others groups of 2 or 1: every rank must throw, none may hang.
  std::vector<int> mine;
  if (w.c.rank == 0) mine = {0, 1, 2};
  else if (w.c.rank == 1) mine = {0, 1};
  else mine = {w.c.rank};
  const std::string msg = invalid_argument_of([&] { split(w.c, mine); });
  EXPECT_NE(msg.find("mismatched groups"), std::string::npos) << msg;
}

TEST(Split, RankOutsideItsOwnGroupFailsOnEveryRank) {
  World w;
  std::vector<int> mine = {w.c.rank};
  if (w.c.rank == w.c.size - 1) mine = {0};
  const std::string msg = invalid_argument_of([&] { split(w.c, mine); });
  EXPECT_NE(msg.find("not in its own group"), std::string::npos) << msg;
}

TEST(Collective, RequireSameAndRaiseIfAny) {
  World w;
  EXPECT_EQ(invalid_argument_of([&] { require_same(w.c, 42, "experts"); }), "");
  const std::string m1 = invalid_argument_of([&] { require_same(w.c, w.c.rank == 1 ? 8 : 6, "experts"); });
  EXPECT_NE(m1.find("disagree on experts"), std::string::npos) << m1;
  const std::string m2 =
      invalid_argument_of([&] { raise_if_any(w.c, w.c.rank >= 1 ? "rank " + std::to_string(w.c.rank) + " bad" : ""); });
  EXPECT_EQ(m2, w.c.size > 1 ? "rank 1 bad" : "");
}

TEST(ProcessGroups, MegatronOrderFromRankLayout) {
  World w;
  if (w.c.size != 4) GTEST_SKIP() << "layout written for 4 ranks";
  // tp=2, ep=2: dense groups pair neighbours {0,1},{2,3}; expert groups (etp=1) pair {0,1},{2,3} too,
  // while dp pairs {0,2},{1,3}.
  const RankLayout l = make_rank_layout(4, /*tp=*/2, /*pp=*/1, /*cp=*/1, /*ep=*/2, /*etp=*/1);
  ProcessGroups pg = make_process_groups(w.c, l);
  EXPECT_EQ(pg.tp.size, 2);
  EXPECT_EQ(pg.dp.size, 2);
  EXPECT_EQ(pg.ep.size, 2);
  EXPECT_EQ(pg.edp.size, 2);
  EXPECT_EQ(pg.pp.size, 1);
  for (Group g : {Group::TP, Group::DP, Group::EP, Group::EDP}) {
    // Sum of global ranks over the group equals the sum of rank_layout's member list: same membership.
    int v = w.c.rank;
    all_reduce(group(pg, g), &v, 1, DType::I32, ReduceOp::Sum);
    int want = 0;
    for (int r : group_ranks(l, g, w.c.rank)) want += r;
    EXPECT_EQ(v, want) << group_name(g);
  }
  free_groups(pg);
  const RankLayout wrong = make_rank_layout(8, 2, 1, 1, 2, 1);
  const std::string msg = invalid_argument_of([&] { make_process_groups(w.c, wrong); });
  EXPECT_NE(msg.find("mpirun -np 8"), std::string::npos) << msg;
}

}  // namespace lcplan::comm::tests
