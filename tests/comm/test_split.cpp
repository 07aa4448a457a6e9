#include <algorithm>
#include <iterator>
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

namespace {
// Global ranks of the members of `g`, in group-rank order, as the group itself sees them.
std::vector<int> members(const Comm& g, int world_rank) {
  std::vector<int> out(g.size, -1);
  all_gather(g, &world_rank, out.data(), 1, DType::I32);
  return out;
}
}  // namespace

TEST(ProcessGroups, MembersAreExactlyRankLayoutsGroups) {
  World w;
  if (w.c.size != 4) GTEST_SKIP() << "layouts written for 4 ranks";
  // Together these give every group kind more than one member somewhere (checked below), e.g. tp=2 cp=2 ep=2
  // etp=2: TP {0,1}, CP {0,2}, TP_CP {0,1,2,3}; pp=2: PP {0,2}; tp=2 ep=2: DP {0,2}, EDP {0,2}.
  struct Dims {
    int tp, pp, cp, ep, etp;
  };
  const Dims layouts[] = {{2, 1, 2, 2, 2}, {1, 2, 1, 2, 1}, {2, 1, 1, 2, 1}, {1, 1, 2, 1, 1}, {1, 1, 1, 4, 1}};
  const Group kinds[] = {Group::TP, Group::CP, Group::DP, Group::PP, Group::DP_CP,
                         Group::TP_CP, Group::EP, Group::ETP, Group::EDP, Group::EP_ETP};
  std::vector<int> widest(std::size(kinds), 1);
  for (const Dims& d : layouts) {
    const RankLayout l = make_rank_layout(4, d.tp, d.pp, d.cp, d.ep, d.etp);
    ProcessGroups pg = make_process_groups(w.c, l);
    for (size_t k = 0; k < std::size(kinds); ++k) {
      const Group g = kinds[k];
      const std::vector<int> want = group_ranks(l, g, w.c.rank);
      EXPECT_EQ(members(group(pg, g), w.c.rank), want)
          << group_name(g) << " of tp=" << d.tp << " pp=" << d.pp << " cp=" << d.cp << " ep=" << d.ep
          << " etp=" << d.etp;
      EXPECT_EQ(group(pg, g).size, static_cast<int>(want.size())) << group_name(g);
      widest[k] = std::max(widest[k], static_cast<int>(want.size()));
    }
    free_groups(pg);
  }
  for (size_t k = 0; k < std::size(kinds); ++k) EXPECT_GT(widest[k], 1) << group_name(kinds[k]) << " never tested";
  const RankLayout wrong = make_rank_layout(8, 2, 1, 1, 2, 1);
  const std::string msg = invalid_argument_of([&] { make_process_groups(w.c, wrong); });
  EXPECT_NE(msg.find("mpirun -np 8"), std::string::npos) << msg;
}

}  // namespace lcplan::comm::tests

namespace lcplan::comm::tests {

// Pipeline links over rings of 2, 3 and 4 stages (the 3-stage ring needs the third colour): each stage's outgoing
// links reach the next stage (activations) and the previous one (gradients), its incoming links come from them, and
// messages in both directions pass at once without tags.
TEST(PipeLinks, EveryStageReachesItsNeighbours) {
  World w;
  if (w.c.size != 4) GTEST_SKIP() << "needs four ranks";
  for (int pp : {2, 3, 4}) {
    // Rings of pp consecutive ranks; the ranks left over form a ring of their own (size 1: no links).
    const int base = w.c.rank < pp ? 0 : pp;
    std::vector<int> ring;
    for (int r = base; r < std::min(w.c.size, base + pp); ++r) ring.push_back(r);
    Comm g = split(w.c, ring);
    PipeLinks l = make_pipe_links(g, nullptr, nullptr, nullptr);
    if (g.size == 1) {
      EXPECT_EQ(l.fwd_out.mpi, MPI_COMM_NULL);
    } else {
      const int n = g.size, s = g.rank, next = (s + 1) % n, prev = (s + n - 1) % n;
      for (const Comm* c : {&l.fwd_out, &l.fwd_in, &l.bwd_out, &l.bwd_in}) ASSERT_EQ(c->size, 2);
      int act = 10 + s, grad = 20 + s, got_act = -1, got_grad = -1;
      Request a = isend(l.fwd_out, &act, 1, DType::I32, link_peer(l.fwd_out));
      Request b = isend(l.bwd_out, &grad, 1, DType::I32, link_peer(l.bwd_out));
      recv(l.fwd_in, &got_act, 1, DType::I32, link_peer(l.fwd_in));
      recv(l.bwd_in, &got_grad, 1, DType::I32, link_peer(l.bwd_in));
      wait(a);
      wait(b);
      EXPECT_EQ(got_act, 10 + prev) << "pp " << pp << " stage " << s;
      EXPECT_EQ(got_grad, 20 + next) << "pp " << pp << " stage " << s;
    }
    free_pipe_links(l);
    free_comm(g);
  }
}

}  // namespace lcplan::comm::tests
