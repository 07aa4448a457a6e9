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

// The links between neighbouring pipeline stages: activations go stage s -> s + 1 and gradients s -> s - 1 (mod pp,
// the wrap serving interleaved chunks). Each (direction, neighbour pair) has its own two-rank communicator, so on GPUs
// a rank sends on a stream of its own per outgoing link and receives on its compute stream: a large NCCL send holds
// its stream until the peer receives and NCCL matches a pair's messages in issue order without tags, and with one
// stream per rank 1F1B deadlocks (both neighbours send before they receive). This is MPI's order instead: sends never
// hold the rank's work, receives wait (executor/schedule.h simulate_pipeline shows every stage then completes).
struct PipeLinks {
  Comm fwd_out, fwd_in;  // activations to the next stage, from the previous one
  Comm bwd_out, bwd_in;  // gradients to the previous stage, from the next one
};
// The peer's rank in a link (each link holds two ranks).
inline int link_peer(const Comm& link) { return 1 - link.rank; }
// Collective over `pp` (size >= 2; size 1 returns empty links). A NCCL parent gives NCCL links: the outgoing ones on
// `fwd_send_stream` / `bwd_send_stream`, the incoming ones on `recv_stream` (cudaStream_t; ignored for MPI).
PipeLinks make_pipe_links(const Comm& pp, void* recv_stream, void* fwd_send_stream, void* bwd_send_stream);
void free_pipe_links(PipeLinks& l);

}  // namespace lcplan::comm
