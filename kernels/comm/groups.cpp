#include "kernels/comm/groups.h"

#include <algorithm>
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

PipeLinks make_pipe_links(const Comm& pp, void* recv_stream, void* fwd_send_stream, void* bwd_send_stream) {
  PipeLinks l;
  const int n = pp.size, s = pp.rank;
  if (n < 2) return l;
  // Pair e joins stages e and e + 1. A split makes disjoint groups, so the ring's pairs are made in rounds of one
  // colour each: alternate colours, and a third for the closing pair when the ring is odd.
  auto colour = [&](int e) { return n % 2 == 1 && e == n - 1 ? 2 : e % 2; };
  const int rounds = n % 2 == 1 ? 3 : 2;
  const int mine[2] = {s, (s + n - 1) % n};  // the pairs this stage belongs to: (s, s + 1) and (s - 1, s)
  for (int forward = 1; forward >= 0; --forward)
    for (int r = 0; r < rounds; ++r) {
      int e = -1;
      for (int k = 0; k < 2; ++k)
        if (colour(mine[k]) == r) e = mine[k];
      if (e < 0) {  // not in this round: a group of its own, freed at once
        Comm alone = split(pp, {s});
        free_comm(alone);
        continue;
      }
      const int a = e, b = (e + 1) % n;
      Comm c = split(pp, {std::min(a, b), std::max(a, b)});
      // Pair e carries activations e -> e + 1 and gradients e + 1 -> e.
      const bool sends = forward ? s == a : s == b;
      c.stream = sends ? (forward ? fwd_send_stream : bwd_send_stream) : recv_stream;
      Comm& slot = forward ? (sends ? l.fwd_out : l.fwd_in) : (sends ? l.bwd_out : l.bwd_in);
      slot = c;
    }
  return l;
}

void free_pipe_links(PipeLinks& l) {
  for (Comm* c : {&l.fwd_out, &l.fwd_in, &l.bwd_out, &l.bwd_in}) free_comm(*c);
}

}  // namespace lcplan::comm
