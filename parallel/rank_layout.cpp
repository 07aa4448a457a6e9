#include "parallel/rank_layout.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <stdexcept>

namespace lcplan {

RankLayout make_rank_layout(int world, int tp, int pp, int cp, int ep, int etp) {
  auto positive = [](int v, const char* name) {
    if (v < 1) throw std::invalid_argument(std::string(name) + " = " + std::to_string(v) + " must be at least 1");
  };
  positive(world, "gpus");
  positive(tp, "tp");
  positive(pp, "pp");
  positive(cp, "cp");
  positive(ep, "ep");
  positive(etp, "etp");
  const long model = static_cast<long>(tp) * pp * cp;
  if (world % model != 0)
    throw std::invalid_argument("gpus = " + std::to_string(world) + " is not divisible by tp*pp*cp = " +
                                std::to_string(model));
  RankLayout l;
  l.world = world;
  l.tp = tp;
  l.pp = pp;
  l.cp = cp;
  l.dp = static_cast<int>(world / model);
  l.ep = ep;
  l.etp = etp;
  const int per_stage = world / pp;  // tp*cp*dp ranks in each pipeline stage
  if (per_stage % (static_cast<long>(ep) * etp) != 0)
    throw std::invalid_argument("ep*etp = " + std::to_string(ep * etp) + " does not divide the " +
                                std::to_string(per_stage) + " ranks of a pipeline stage (tp*cp*dp)");
  l.edp = per_stage / (ep * etp);
  return l;
}

namespace {

// Coordinates of a rank in the two orders.
struct Coord {
  int tp, cp, dp, pp, etp, ep, edp;
};

Coord coord(const RankLayout& l, int r) {
  Coord c{};
  const int per_stage = l.world / l.pp;
  c.pp = r / per_stage;
  int in = r % per_stage;
  c.tp = in % l.tp;
  c.cp = (in / l.tp) % l.cp;
  c.dp = in / (l.tp * l.cp);
  c.etp = in % l.etp;
  c.ep = (in / l.etp) % l.ep;
  c.edp = in / (l.etp * l.ep);
  return c;
}

int dense_rank(const RankLayout& l, int tp, int cp, int dp, int pp) {
  return tp + l.tp * (cp + l.cp * (dp + l.dp * pp));
}
int expert_rank(const RankLayout& l, int etp, int ep, int edp, int pp) {
  return etp + l.etp * (ep + l.ep * (edp + l.edp * pp));
}

}  // namespace

std::vector<int> group_ranks(const RankLayout& l, Group g, int rank) {
  if (rank < 0 || rank >= l.world)
    throw std::invalid_argument("rank " + std::to_string(rank) + " outside world of " + std::to_string(l.world));
  const Coord c = coord(l, rank);
  std::vector<int> out;
  switch (g) {
    case Group::TP:
      for (int i = 0; i < l.tp; ++i) out.push_back(dense_rank(l, i, c.cp, c.dp, c.pp));
      break;
    case Group::CP:
      for (int i = 0; i < l.cp; ++i) out.push_back(dense_rank(l, c.tp, i, c.dp, c.pp));
      break;
    case Group::DP:
      for (int i = 0; i < l.dp; ++i) out.push_back(dense_rank(l, c.tp, c.cp, i, c.pp));
      break;
    case Group::PP:
      for (int i = 0; i < l.pp; ++i) out.push_back(dense_rank(l, c.tp, c.cp, c.dp, i));
      break;
    case Group::DP_CP:
      for (int d = 0; d < l.dp; ++d)
        for (int i = 0; i < l.cp; ++i) out.push_back(dense_rank(l, c.tp, i, d, c.pp));
      break;
    case Group::TP_CP:
      for (int i = 0; i < l.cp; ++i)
        for (int t = 0; t < l.tp; ++t) out.push_back(dense_rank(l, t, i, c.dp, c.pp));
      break;
    case Group::EP:
      for (int i = 0; i < l.ep; ++i) out.push_back(expert_rank(l, c.etp, i, c.edp, c.pp));
      break;
    case Group::ETP:
      for (int i = 0; i < l.etp; ++i) out.push_back(expert_rank(l, i, c.ep, c.edp, c.pp));
      break;
    case Group::EDP:
      for (int i = 0; i < l.edp; ++i) out.push_back(expert_rank(l, c.etp, c.ep, i, c.pp));
      break;
    case Group::EP_ETP:
      for (int e = 0; e < l.ep; ++e)
        for (int t = 0; t < l.etp; ++t) out.push_back(expert_rank(l, t, e, c.edp, c.pp));
      break;
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::vector<int>> all_groups(const RankLayout& l, Group g) {
  std::vector<std::vector<int>> groups;
  std::set<int> seen;
  for (int r = 0; r < l.world; ++r) {
    if (seen.count(r)) continue;
    auto members = group_ranks(l, g, r);
    seen.insert(members.begin(), members.end());
    groups.push_back(std::move(members));
  }
  return groups;
}

int group_size(const RankLayout& l, Group g) {
  switch (g) {
    case Group::TP: return l.tp;
    case Group::CP: return l.cp;
    case Group::DP: return l.dp;
    case Group::PP: return l.pp;
    case Group::DP_CP: return l.dp * l.cp;
    case Group::TP_CP: return l.tp * l.cp;
    case Group::EP: return l.ep;
    case Group::ETP: return l.etp;
    case Group::EDP: return l.edp;
    case Group::EP_ETP: return l.ep * l.etp;
  }
  return 1;
}

int group_nodes(const RankLayout& l, Group g, int gpus_per_node) {
  // Every group of a kind is the progression o, o+s, ..., o+(n-1)s with offsets o = a + b*s*n (a < s); the nodes it
  // spans depend only on o mod gpn, so the widest group is found over at most gpn x gpn residues (the search calls
  // this for every plan, so no member lists are built).
  int stride = 1;
  switch (g) {
    case Group::TP: case Group::TP_CP: case Group::ETP: case Group::EP_ETP: stride = 1; break;
    case Group::CP: case Group::DP_CP: stride = l.tp; break;
    case Group::DP: stride = l.tp * l.cp; break;
    case Group::PP: stride = l.world / l.pp; break;
    case Group::EP: stride = l.etp; break;
    case Group::EDP: stride = l.etp * l.ep; break;
  }
  const long long gpn = std::max(1, gpus_per_node), n = group_size(l, g), s = stride, block = s * n;
  // A stride of a node or more puts every member on its own node.
  if (s >= gpn) return static_cast<int>(n);
  // A shorter stride skips no node: a group starting at residue r = o mod gpn spans floor((r + (n-1)s)/gpn) + 1
  // nodes, so the widest group starts at the largest reachable residue. Offsets o = a + b*block, a < s; the
  // residues of b*block repeat after `period` blocks.
  const long long blocks = std::max(1LL, l.world / block);
  const long long period = gpn / std::gcd(block % gpn == 0 ? gpn : block % gpn, gpn);
  long long r_max = 0;
  for (long long b = 0; b < std::min(blocks, period) && r_max < gpn - 1; ++b) {
    const long long c = (b * block) % gpn;  // residue of a = 0; a up to s-1 adds to it, wrapping past gpn-1
    r_max = std::max(r_max, c + s - 1 >= gpn ? gpn - 1 : c + s - 1);
  }
  return static_cast<int>((r_max + (n - 1) * s) / gpn + 1);
}

const char* group_name(Group g) {
  switch (g) {
    case Group::TP: return "tp";
    case Group::CP: return "cp";
    case Group::DP: return "dp";
    case Group::PP: return "pp";
    case Group::DP_CP: return "dp*cp";
    case Group::TP_CP: return "tp*cp";
    case Group::EP: return "ep";
    case Group::ETP: return "etp";
    case Group::EDP: return "edp";
    case Group::EP_ETP: return "ep*etp";
  }
  return "?";
}

const char* to_string(LinkTier t) { return t == LinkTier::NVLink ? "nvlink" : "network"; }

}  // namespace lcplan
