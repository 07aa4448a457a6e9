#include "kernels/comm/groups.h"

#include <stdexcept>
#include <string>

namespace lcplan::comm {

ProcessGroups make_process_groups(const Comm& world, const RankLayout& layout) {
  // Every rank knows both numbers, so the check is local yet identical everywhere: no rank can hang.
  if (layout.world != world.size)
    throw std::invalid_argument("the parallel layout is for " + std::to_string(layout.world) +
                                " ranks but the job has " + std::to_string(world.size) +
                                "; start it with mpirun -np " + std::to_string(layout.world));
  ProcessGroups pg;
  pg.layout = layout;
  auto make = [&](Group g) { return split(world, group_ranks(layout, g, world.rank)); };
  pg.tp = make(Group::TP);
  pg.cp = make(Group::CP);
  pg.dp = make(Group::DP);
  pg.pp = make(Group::PP);
  pg.dp_cp = make(Group::DP_CP);
  pg.tp_cp = make(Group::TP_CP);
  pg.ep = make(Group::EP);
  pg.etp = make(Group::ETP);
  pg.edp = make(Group::EDP);
  pg.ep_etp = make(Group::EP_ETP);
  return pg;
}

const Comm& group(const ProcessGroups& pg, Group g) {
  switch (g) {
    case Group::TP: return pg.tp;
    case Group::CP: return pg.cp;
    case Group::DP: return pg.dp;
    case Group::PP: return pg.pp;
    case Group::DP_CP: return pg.dp_cp;
    case Group::TP_CP: return pg.tp_cp;
    case Group::EP: return pg.ep;
    case Group::ETP: return pg.etp;
    case Group::EDP: return pg.edp;
    case Group::EP_ETP: return pg.ep_etp;
  }
  throw std::invalid_argument("unknown group kind");
}

void free_groups(ProcessGroups& pg) {
  for (Comm* c : {&pg.tp, &pg.cp, &pg.dp, &pg.pp, &pg.dp_cp, &pg.tp_cp, &pg.ep, &pg.etp, &pg.edp, &pg.ep_etp})
    free_comm(*c);
}

}  // namespace lcplan::comm
