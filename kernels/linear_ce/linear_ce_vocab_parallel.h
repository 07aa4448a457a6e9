// Vocabulary-parallel linear cross-entropy over an lcplan::comm communicator (MPI on CPUs).
// Each rank passes its weight rows [vocab_start, vocab_start + vocab) of a vocab_total vocabulary, the same hidden
// states and targets; every rank gets the full loss, lse and d_hidden, and the d_weight rows of its own shard.
// Inputs are checked collectively first, so a bad input on one rank makes every rank throw instead of deadlocking.
#pragma once

#include "kernels/comm/comm.h"
#include "kernels/linear_ce/linear_ce.h"

namespace lcplan::linear_ce {

struct VocabShard {
  int64_t start = 0;
  int64_t size = 0;
};
// Contiguous split; the first (vocab_total % ranks) ranks hold one extra row.
VocabShard even_shard(int64_t vocab_total, int rank, int ranks);

// The CrossRankAllReduce hook backed by comm::all_reduce on `c` (fp32, in place).
CrossRankAllReduce comm_all_reduce(const comm::Comm& c);

// Collective over c's MPI side (also for a NCCL communicator; `targets` is host memory): throws
// std::invalid_argument on every rank if any rank's input is invalid, the ranks disagree (tokens, hidden,
// vocab_total, reduction, ignore_index, targets, dtype, softcap, z_loss, vocab_tile, token_tile) or the shards do
// not tile [0, vocab_total) in order.
void check_vocab_parallel(const comm::Comm& c, const Problem& p, DType t, const Options& o, const int64_t* targets);

void forward_vocab_parallel_cpu(const comm::Comm& c, const Problem& p, DType t, const void* hidden, const void* weight,
                                const int64_t* targets, float* loss, float* lse, const Options& o,
                                Stats* stats = nullptr);
void backward_vocab_parallel_cpu(const comm::Comm& c, const Problem& p, DType t, const void* hidden,
                                 const void* weight, const int64_t* targets, const float* lse, const float* grad_loss,
                                 void* d_hidden, void* d_weight, const Options& o, Stats* stats = nullptr);

}  // namespace lcplan::linear_ce
