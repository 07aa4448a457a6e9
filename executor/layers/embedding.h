// The vocabulary-parallel embedding over an Ops (common.h), forward and backward.
#pragma once

#include <cstdint>

#include "executor/layers/common.h"

namespace lcplan::exec::impl {

template <class Ops>
void embedding_forward(Ops& o, Ctx& c, const bf16* table, const int64_t* tokens, bf16* x) {
  if (c.tp == 1) return o.embed_rows16(c, table, tokens, x);
  // Rows outside this rank's shard are zero; the reduce-scatter sums the one rank holding each row into its owner
  // (Megatron VocabParallelEmbedding + reduce_scatter_to_sequence_parallel_region): exact, one non-zero per element.
  const int64_t H = c.d.H, R = c.rows, T = c.tokens, V0 = c.d.V0, Vl = c.d.Vl;
  WsOf<Ops> all = o.ws(size_t(T * H)), mine = o.ws(size_t(R * H));
  o.embedding_rows(table, tokens, T, H, V0, Vl, all.data());
  comm::reduce_scatter(c.pg.tp, all.data(), mine.data(), size_t(R * H), comm::DType::F32, comm::ReduceOp::Sum);
  o.to_bf16(mine.data(), x, size_t(R * H));
}

template <class Ops>
void embedding_backward(Ops& o, Ctx& c, const int64_t* tokens, const float* dx, float* g) {
  const int64_t H = c.d.H, V0 = c.d.V0, Vl = c.d.Vl;
  const Rows<Ops> d = sp_gather(o, c, dx, H);
  o.embedding_rows_bwd(tokens, d.p, c.tokens, H, V0, Vl, g);
}

}  // namespace lcplan::exec::impl
