// Process groups of a parallel layout, built from Megatron's rank order (parallel/rank_layout.h) so the
// communicators and the estimator agree on who talks to whom.
#pragma once

#include "parallel/rank_layout.h"
#include "kernels/comm/comm.h"

namespace lcplan::comm {

struct ProcessGroups {
  RankLayout layout;
  Comm tp, cp, dp, pp, dp_cp, tp_cp;  // dense view
  Comm ep, etp, edp, ep_etp;          // expert view
};

// Collective over `world`: every rank splits every group kind. Throws std::invalid_argument on every rank
// when `layout.world` differs from the communicator's size.
ProcessGroups make_process_groups(const Comm& world, const RankLayout& layout);
// The communicator of group kind `g`.
const Comm& group(const ProcessGroups& pg, Group g);
void free_groups(ProcessGroups& pg);

}  // namespace lcplan::comm
