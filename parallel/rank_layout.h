// Megatron-LM's rank order: which global ranks form each parallel group.
// Dense layers order ranks tp-cp-dp-pp (tp fastest); expert layers etp-ep-edp-pp.
// Source: Megatron-LM megatron/core/parallel_state.py (RankGenerator with order "tp-cp-ep-dp-pp").
// Used by the estimator (does a group cross nodes?) and by the communicators (which ranks to split).
#pragma once

#include <string>
#include <vector>

namespace lcplan {

struct RankLayout {
  int world = 1;
  int tp = 1, cp = 1, dp = 1, pp = 1;   // dense view: world = tp*cp*dp*pp
  int etp = 1, ep = 1, edp = 1;         // expert view: world = etp*ep*edp*pp
};

enum class Group { TP, CP, DP, PP, DP_CP, TP_CP, EP, ETP, EDP, EP_ETP };

// Throws std::invalid_argument naming the rule broken when sizes do not tile the world.
RankLayout make_rank_layout(int world, int tp, int pp, int cp, int ep, int etp);

// Global ranks in the `g` group that contains `rank`, ascending.
std::vector<int> group_ranks(const RankLayout& l, Group g, int rank);

// Every group of kind `g` (each a list of global ranks); together they partition the world.
std::vector<std::vector<int>> all_groups(const RankLayout& l, Group g);

// Member count of a group kind.
int group_size(const RankLayout& l, Group g);

// Nodes spanned by the widest group of kind `g` (the slowest group sets a collective's time).
int group_nodes(const RankLayout& l, Group g, int gpus_per_node);

// Where a group's traffic runs: NVLink when every rank of the widest group sits in one node (group_nodes == 1),
// else the network.
enum class LinkTier { NVLink, Network };
const char* to_string(LinkTier t);

const char* group_name(Group g);

}  // namespace lcplan
