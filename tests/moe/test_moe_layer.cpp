// The distributed MoE layer under mpirun -np 4: chunked == no-chunk bit for bit (small and realistic sizes),
// EP=4 == single rank, gradients vs the double-precision reference and finite differences, overlap really
// overlapping, and bad input failing on every rank.
#include <mpi.h>

#include <array>

#include "tests/comm/mpi_env.h"
#include "kernels/moe/moe_reference.h"
#include "tests/moe/layer_util.h"

LCPLAN_MPI_TEST_MAIN;

namespace lcplan::moe::tests {
namespace {

MoeConfig small_config(Router kind) {
  MoeConfig c;
  c.hidden = 24;
  c.experts = 8;
  c.top_k = 3;
  c.expert_ffn = 20;
  c.shared_ffn = 16;
  c.shared_gate = true;
  c.router = kind;
  if (kind == Router::SigmoidGroupLimited) {
    c.n_group = 4;
    c.topk_group = 2;
    c.scale = 2.5f;
  }
  return c;
}

// Proxy-sized layer: hidden 128, 16 experts (4 per rank at EP=4), top-4, gated shared expert.
MoeConfig realistic_config(Router kind) {
  MoeConfig c;
  c.hidden = 128;
  c.experts = 16;
  c.top_k = 4;
  c.expert_ffn = 64;
  c.shared_ffn = 128;
  c.shared_gate = true;
  c.router = kind;
  if (kind == Router::SigmoidGroupLimited) {
    c.n_group = 8;
    c.topk_group = 4;
    c.scale = 2.5f;
  }
  return c;
}

// Tokens differ per rank; with the sigmoid router a large negative bias starves experts 2, 3 and 5, which also
// keeps group {4,5} out of the small config, so there experts 2-5 (all of EP ranks 1 and 2) receive nothing.
MoeWeights starving_weights(const MoeConfig& c, int rank, int size) {
  MoeWeights w = make_weights(c, rank, size, 7);
  if (c.router == Router::SigmoidGroupLimited) w.expert_bias[2] = w.expert_bias[3] = w.expert_bias[5] = -10.f;
  return w;
}

// Rows each local expert of this rank received in a forward pass, summed over chunks.
std::vector<int64_t> rows_per_local_expert(const comm::Comm& ep, const MoeConfig& c, const MoeWeights& w,
                                           const std::vector<float>& x, int tokens, int chunks) {
  MoeSaved sv;
  std::vector<float> out(x.size());
  moe_forward(ep, c, w, make_chunk_schedule(chunks), x.data(), tokens, out.data(), sv);
  std::vector<int64_t> rows(w.local_experts, 0);
  for (const ChunkBuffers& b : sv.chunks)
    for (int q = 0; q < ep.size; ++q)
      for (int e = 0; e < w.local_experts; ++e) rows[e] += b.lay.recv_by_block[size_t(q) * w.local_experts + e];
  return rows;
}

// Every chunk count 1..4, equal and asymmetric, against the serial no-chunk pass: each output row is computed by
// the same fixed-order kernel whatever its chunk, and the delayed wgrad sums rows in the unchunked order, so every
// tensor must match bit for bit (cpu_gemm.h, moe_cpu.cpp ExpertWgrad).
void expect_chunking_bit_identical(const comm::Comm& ep, const MoeConfig& c, const MoeWeights& w,
                                   const std::vector<float>& x, int T, const std::vector<float>& dout,
                                   const std::string& name) {
  const Pass base = run_pass(ep, c, w, make_chunk_schedule(1), x, T, dout, ExecOptions{false, 64});
  for (int n = 1; n <= 4; ++n)
    for (bool asym : {false, true}) {
      std::vector<double> wts;
      if (asym) wts.assign(n, 1.0), wts[0] = 3.0;  // the first chunk takes a larger share
      const Pass p = run_pass(ep, c, w, make_chunk_schedule(n, wts), x, T, dout, ExecOptions{true, 16});
      expect_bit_identical(p, base, name + " chunks " + std::to_string(n) + (asym ? " asymmetric" : ""));
    }
}

TEST(MoeLayer, ChunkedIsBitIdenticalToNoChunkWithUnevenExperts) {
  World W;
  for (Router kind : {Router::SoftmaxTopK, Router::SigmoidGroupLimited}) {
    const MoeConfig c = small_config(kind);
    const MoeWeights w = starving_weights(c, W.c.rank, W.c.size);
    const int T = 9 + 4 * W.c.rank;
    const auto x = inputs(T, c.hidden, W.c.rank);
    const auto dout = inputs(T, c.hidden, 100 + W.c.rank);
    if (kind == Router::SigmoidGroupLimited && W.c.size == 4) {
      // The starvation is real: EP ranks 1 and 2 own experts 2-5 and receive no rows at all.
      int64_t received = 0;
      for (int64_t r : rows_per_local_expert(W.c, c, w, x, T, 2)) received += r;
      if (W.c.rank == 1 || W.c.rank == 2) EXPECT_EQ(received, 0);
      else EXPECT_GT(received, 0);
    }
    expect_chunking_bit_identical(W.c, c, w, x, T, dout, "small router " + std::to_string(int(kind)));
  }
}

TEST(MoeLayer, ChunkedIsBitIdenticalToNoChunkAtRealisticSize) {
  // Hidden 128 and 300-351 tokens per rank: GEMMs large enough that a shape-dependent BLAS would change kernels
  // between chunk sizes, and wgrad sums over hundreds of rows per expert.
  World W;
  for (Router kind : {Router::SoftmaxTopK, Router::SigmoidGroupLimited}) {
    const MoeConfig c = realistic_config(kind);
    const MoeWeights w = starving_weights(c, W.c.rank, W.c.size);
    const int T = 300 + 17 * W.c.rank;
    const auto x = inputs(T, c.hidden, 3 + W.c.rank);
    const auto dout = inputs(T, c.hidden, 200 + W.c.rank);
    if (kind == Router::SigmoidGroupLimited && W.c.size == 4) {
      // Experts 2, 3 (rank 0) and 5 (rank 1) receive nothing; the others a token-dependent, uneven share.
      const std::vector<int64_t> rows = rows_per_local_expert(W.c, c, w, x, T, 3);
      for (int e = 0; e < w.local_experts; ++e) {
        const int g = w.first_expert + e;
        if (g == 2 || g == 3 || g == 5) {
          EXPECT_EQ(rows[e], 0) << "expert " << g;
        }
      }
      int64_t received = 0;
      for (int64_t r : rows) received += r;
      if (W.c.rank >= 2) {
        EXPECT_GT(received, 0);
      }
    }
    expect_chunking_bit_identical(W.c, c, w, x, T, dout, "realistic router " + std::to_string(int(kind)));
  }
}

TEST(MoeLayer, OverlapDoesNotChangeResults) {
  // Same chunks, same summation order: the overlapped run must be bit-identical to the serial one.
  World W;
  const MoeConfig c = small_config(Router::SoftmaxTopK);
  const MoeWeights w = make_weights(c, W.c.rank, W.c.size, 3);
  const int T = 33;
  const auto x = inputs(T, c.hidden, W.c.rank), dout = inputs(T, c.hidden, 9 + W.c.rank);
  for (int n : {1, 2, 3}) {
    const ChunkSchedule s = make_chunk_schedule(n);
    const Pass serial = run_pass(W.c, c, w, s, x, T, dout, ExecOptions{false, 4});
    const Pass overlapped = run_pass(W.c, c, w, s, x, T, dout, ExecOptions{true, 4});
    expect_bit_identical(overlapped, serial, "chunks " + std::to_string(n));
  }
}

// fp32 layer vs the double reference, as (max abs error) / (max abs value). The fp32 run rounds each product and
// partial sum (u = 6e-8); its longest sums have 40 terms (2F; 38 tokens for weight grads) and chain three GEMMs,
// SwiGLU and the router, so rounding drifts like 3 * sqrt(40) * u = 1.1e-6 (about 3e-7 is observed). A misrouted
// row, a dropped term or a wrong gradient formula is 1e-3 or more.
constexpr double kVsDoubleTol = 2e-6;

TEST(MoeLayer, ExpertParallelEqualsSingleRankAndDoubleReference) {
  World W;
  comm::Comm self = comm::split(W.c, {W.c.rank});
  for (Router kind : {Router::SoftmaxTopK, Router::SigmoidGroupLimited}) {
    const MoeConfig c = small_config(kind);
    const MoeWeights w = starving_weights(c, W.c.rank, W.c.size);
    MoeWeights full = starving_weights(c, 0, 1);
    // Everyone's tokens, gathered so each rank can run the single-rank layer on the whole batch.
    std::vector<int> tokens(W.c.size);
    for (int r = 0; r < W.c.size; ++r) tokens[r] = 5 + 3 * r;
    const int T = tokens[W.c.rank];
    int total = 0, first = 0;
    for (int r = 0; r < W.c.size; ++r) {
      if (r == W.c.rank) first = total;
      total += tokens[r];
    }
    std::vector<float> x_all, d_all;
    for (int r = 0; r < W.c.size; ++r) {
      const auto xr = inputs(tokens[r], c.hidden, r), dr = inputs(tokens[r], c.hidden, 50 + r);
      x_all.insert(x_all.end(), xr.begin(), xr.end());
      d_all.insert(d_all.end(), dr.begin(), dr.end());
    }
    const std::vector<float> x(x_all.begin() + size_t(first) * c.hidden, x_all.begin() + size_t(first + T) * c.hidden);
    const std::vector<float> d(d_all.begin() + size_t(first) * c.hidden, d_all.begin() + size_t(first + T) * c.hidden);
    const Pass dist = run_pass(W.c, c, w, make_chunk_schedule(2), x, T, d);
    const Pass ref = run_pass(self, c, full, make_chunk_schedule(1), x_all, total, d_all);
    const std::string what = "router " + std::to_string(int(kind));

    auto slice = [&](const auto& v) {
      using V = typename std::decay_t<decltype(v)>::value_type;
      return std::vector<V>(v.begin() + size_t(first) * c.hidden, v.begin() + size_t(first + T) * c.hidden);
    };
    const size_t n1 = size_t(c.hidden) * 2 * c.expert_ffn, n2 = size_t(c.expert_ffn) * c.hidden;
    auto local = [&](const auto& v, size_t per_expert) {
      using V = typename std::decay_t<decltype(v)>::value_type;
      return std::vector<V>(v.begin() + w.first_expert * per_expert,
                            v.begin() + (w.first_expert + w.local_experts) * per_expert);
    };
    // Rows are computed by the same fixed-order kernels and each expert's wgrad sums its rows in global token
    // order on both sides (source-major = rank order = the gathered batch's order): bit-identical.
    EXPECT_TRUE(bit_equal(dist.out, slice(ref.out))) << what << " out " << rel_err(dist.out, slice(ref.out));
    EXPECT_TRUE(bit_equal(dist.dx, slice(ref.dx))) << what << " dx " << rel_err(dist.dx, slice(ref.dx));
    EXPECT_TRUE(bit_equal(dist.grads.w1, local(ref.grads.w1, n1))) << what;
    EXPECT_TRUE(bit_equal(dist.grads.w2, local(ref.grads.w2, n2))) << what;
    // Replicated grads are per-rank partial sums reduced over EP: a different summation order, so 1e-6.
    MoeWeights g = dist.grads;
    for (auto* v : {&g.router, &g.shared_w1, &g.shared_w2, &g.shared_gate})
      comm::all_reduce(W.c, v->data(), v->size(), comm::DType::F32, comm::ReduceOp::Sum);
    EXPECT_LE(rel_err(g.router, ref.grads.router), 1e-6) << what;
    EXPECT_LE(rel_err(g.shared_w1, ref.grads.shared_w1), 1e-6) << what;
    EXPECT_LE(rel_err(g.shared_w2, ref.grads.shared_w2), 1e-6) << what;
    EXPECT_LE(rel_err(g.shared_gate, ref.grads.shared_gate), 1e-6) << what;

    // Against the naive token-by-token double reference (no permutation, no communication, no chunks): the one
    // the finite-difference test validates.
    const std::vector<double> xd(x_all.begin(), x_all.end()), dd(d_all.begin(), d_all.end());
    std::vector<double> out_d(xd.size());
    moe_reference_forward(c, full, xd.data(), total, out_d.data());
    const ReferenceGrads<double> rg = moe_reference_backward(c, full, xd.data(), total, dd.data());
    EXPECT_LE(rel_err(dist.out, slice(out_d)), kVsDoubleTol) << what << " out";
    EXPECT_LE(rel_err(dist.dx, slice(rg.dx)), kVsDoubleTol) << what << " dx";
    EXPECT_LE(rel_err(dist.grads.w1, local(rg.w1, n1)), kVsDoubleTol) << what << " w1";
    EXPECT_LE(rel_err(dist.grads.w2, local(rg.w2, n2)), kVsDoubleTol) << what << " w2";
    EXPECT_LE(rel_err(g.router, rg.router), kVsDoubleTol) << what << " router";
    EXPECT_LE(rel_err(g.shared_w1, rg.shared_w1), kVsDoubleTol) << what << " shared_w1";
    EXPECT_LE(rel_err(g.shared_w2, rg.shared_w2), kVsDoubleTol) << what << " shared_w2";
    EXPECT_LE(rel_err(g.shared_gate, rg.shared_gate), kVsDoubleTol) << what << " shared_gate";
  }
  comm::free_comm(self);
}

// Expert tensor parallelism (ETP 2 x EP 2 on 4 ranks, Megatron's expert rank order etp-ep: ETP groups {0,1} and
// {2,3}, EP groups {0,2} and {1,3}): every rank's tokens, output, input gradient and its columns of its experts'
// weight gradients against the double reference on the whole batch. The ETP partial outputs are summed over half
// the FFN columns each, so the fp32 rounding differs from the single-rank layer's, within the same bound.
TEST(MoeLayer, ExpertTensorParallelEqualsDoubleReference) {
  World W;
  if (W.c.size != 4) GTEST_SKIP() << "needs 4 ranks";
  const int etp_rank = W.c.rank % 2, ep_rank = W.c.rank / 2;
  comm::Comm etp = comm::split(W.c, {ep_rank * 2, ep_rank * 2 + 1});
  comm::Comm ep = comm::split(W.c, {etp_rank, etp_rank + 2});
  for (Router kind : {Router::SoftmaxTopK, Router::SigmoidGroupLimited})
    for (int chunks : {1, 2}) {
      const MoeConfig c = small_config(kind);
      MoeWeights w = make_weights(c, ep_rank, 2, 7, etp_rank, 2);
      MoeWeights full = make_weights(c, 0, 1, 7);
      if (kind == Router::SigmoidGroupLimited) {  // starve experts 2, 3 and 5: whole blocks receive nothing
        for (MoeWeights* m : {&w, &full}) m->expert_bias[2] = m->expert_bias[3] = m->expert_bias[5] = -10.f;
      }
      std::vector<int> tokens(W.c.size);
      for (int r = 0; r < W.c.size; ++r) tokens[r] = 4 + 3 * r;
      const int T = tokens[W.c.rank];
      int total = 0, first = 0;
      for (int r = 0; r < W.c.size; ++r) {
        if (r == W.c.rank) first = total;
        total += tokens[r];
      }
      std::vector<double> xd, dd;
      std::vector<float> x, d;
      for (int r = 0; r < W.c.size; ++r) {
        const auto xr = inputs(tokens[r], c.hidden, r), dr = inputs(tokens[r], c.hidden, 50 + r);
        xd.insert(xd.end(), xr.begin(), xr.end());
        dd.insert(dd.end(), dr.begin(), dr.end());
        if (r == W.c.rank) {
          x = xr;
          d = dr;
        }
      }
      Pass p;
      p.out.assign(x.size(), 0.f);
      p.dx.assign(x.size(), 0.f);
      MoeSaved sv;
      moe_forward(ep, etp, c, w, make_chunk_schedule(chunks), x.data(), T, p.out.data(), sv);
      moe_backward(ep, etp, c, w, make_chunk_schedule(chunks), sv, d.data(), p.dx.data(), p.grads);
      std::vector<double> out_d(xd.size());
      moe_reference_forward(c, full, xd.data(), total, out_d.data());
      const ReferenceGrads<double> rg = moe_reference_backward(c, full, xd.data(), total, dd.data());
      const std::string what = "router " + std::to_string(int(kind)) + " chunks " + std::to_string(chunks);
      auto mine = [&](const std::vector<double>& v) {
        return std::vector<double>(v.begin() + size_t(first) * c.hidden, v.begin() + size_t(first + T) * c.hidden);
      };
      EXPECT_LE(rel_err(p.out, mine(out_d)), kVsDoubleTol) << what << " out";
      EXPECT_LE(rel_err(p.dx, mine(rg.dx)), kVsDoubleTol) << what << " dx";
      // This rank's columns of its experts: [gate | up] halves of w1, rows of w2.
      const size_t H = c.hidden, F = c.expert_ffn, Fe = F / 2, f0 = size_t(etp_rank) * Fe;
      std::vector<double> w1, w2;
      for (size_t e = size_t(w.first_expert); e < size_t(w.first_expert + w.local_experts); ++e) {
        for (size_t h = 0; h < H; ++h) {
          for (size_t j = 0; j < Fe; ++j) w1.push_back(rg.w1[(e * H + h) * 2 * F + f0 + j]);
          for (size_t j = 0; j < Fe; ++j) w1.push_back(rg.w1[(e * H + h) * 2 * F + F + f0 + j]);
        }
        w2.insert(w2.end(), rg.w2.begin() + (e * F + f0) * H, rg.w2.begin() + (e * F + f0 + Fe) * H);
      }
      EXPECT_LE(rel_err(p.grads.w1, w1), kVsDoubleTol) << what << " w1";
      EXPECT_LE(rel_err(p.grads.w2, w2), kVsDoubleTol) << what << " w2";
      // Router and shared expert: per-rank partial sums over its own tokens.
      for (auto* v : {&p.grads.router, &p.grads.shared_w1, &p.grads.shared_w2, &p.grads.shared_gate})
        comm::all_reduce(W.c, v->data(), v->size(), comm::DType::F32, comm::ReduceOp::Sum);
      EXPECT_LE(rel_err(p.grads.router, rg.router), kVsDoubleTol) << what << " router";
      EXPECT_LE(rel_err(p.grads.shared_w1, rg.shared_w1), kVsDoubleTol) << what << " shared_w1";
      EXPECT_LE(rel_err(p.grads.shared_w2, rg.shared_w2), kVsDoubleTol) << what << " shared_w2";
      // restore_routing rebuilds exactly the routing state the forward left.
      MoeSaved again;
      again.tokens = sv.tokens;
      again.idx = sv.idx;
      again.counts_recv = sv.counts_recv;
      again.counts_recv_etp = sv.counts_recv_etp;
      restore_routing(c, w, 2, 2, make_chunk_schedule(chunks), again);
      ASSERT_EQ(again.chunks.size(), sv.chunks.size());
      EXPECT_EQ(again.counts_send, sv.counts_send) << what;
      for (size_t k = 0; k < sv.chunks.size(); ++k) {
        EXPECT_EQ(again.chunks[k].rows, sv.chunks[k].rows) << what;
        EXPECT_EQ(again.chunks[k].lay.recv_counts, sv.chunks[k].lay.recv_counts) << what;
        EXPECT_EQ(again.chunks[k].lay.send_displs, sv.chunks[k].lay.send_displs) << what;
        EXPECT_EQ(again.chunks[k].by_block, sv.chunks[k].by_block) << what;
      }
    }
  comm::free_comm(ep);
  comm::free_comm(etp);
}

// A chunk's all-to-all layout counted directly: elements per peer sent (from the chunk's routed slots) and received
// (the peers' counts for this rank, exchanged with MPI_Alltoall), and the rows received per (source, local expert).
struct CountedLayout {
  std::vector<size_t> send_counts, send_displs, recv_counts, recv_displs;
  std::vector<int64_t> recv_by_block;
};
CountedLayout counted_layout(const comm::Comm& ep, const MoeSaved& sv, const ChunkBuffers& b, int L, int H) {
  const int P = ep.size, K = int(sv.idx.size()) / sv.tokens;
  std::vector<int64_t> sent(size_t(P) * L, 0);
  for (int t = b.t0; t < b.t1; ++t)
    for (int k = 0; k < K; ++k) ++sent[size_t(sv.idx[size_t(t) * K + k])];  // expert e is rank e / L's e % L
  CountedLayout c;
  c.recv_by_block.assign(sent.size(), 0);
  MPI_Alltoall(sent.data(), L, MPI_INT64_T, c.recv_by_block.data(), L, MPI_INT64_T, ep.mpi);
  size_t s_at = 0, r_at = 0;
  for (int q = 0; q < P; ++q) {
    int64_t s = 0, r = 0;
    for (int e = 0; e < L; ++e) {
      s += sent[size_t(q) * L + e];
      r += c.recv_by_block[size_t(q) * L + e];
    }
    c.send_counts.push_back(size_t(s) * H);
    c.send_displs.push_back(s_at);
    c.recv_counts.push_back(size_t(r) * H);
    c.recv_displs.push_back(r_at);
    s_at += size_t(s) * H;
    r_at += size_t(r) * H;
  }
  return c;
}

// The layers' per-chunk bookkeeping (chunk_layout, run by moe_pass.h plan_chunks and the GPU layer
// kernels/moe/moe_cuda.cpp) after a real forward on every rank (uneven tokens, starved experts, 3 chunks): the layout
// the forward moved its rows with equals chunk_layout of the saved counts and the layout counted directly, and a
// block table that moves rows received source-major into expert-major order (each expert's rows by source, in
// arrival order), checked row by row on labels.
TEST(MoeLayer, ChunkLayoutIsTheCpuLayersLayout) {
  World W;
  const MoeConfig c = small_config(Router::SigmoidGroupLimited);
  const MoeWeights w = starving_weights(c, W.c.rank, W.c.size);
  const int T = 6 + 5 * W.c.rank, P = W.c.size, L = w.local_experts, N = 3, H = c.hidden;
  const std::vector<float> x = inputs(T, H, W.c.rank);
  std::vector<float> out(x.size());
  MoeSaved sv;
  moe_forward(W.c, c, w, make_chunk_schedule(N), x.data(), T, out.data(), sv);
  int64_t empty_blocks = 0;
  for (int ch = 0; ch < N; ++ch) {
    const ChunkBuffers& b = sv.chunks[size_t(ch)];
    const ChunkLayout lay = chunk_layout(sv.counts_send, sv.counts_recv, P, W.c.rank, N, L, H, ch);
    const std::string what = "chunk " + std::to_string(ch);
    EXPECT_EQ(lay.send_counts, b.lay.send_counts) << what;
    EXPECT_EQ(lay.send_displs, b.lay.send_displs) << what;
    EXPECT_EQ(lay.recv_counts, b.lay.recv_counts) << what;
    EXPECT_EQ(lay.recv_displs, b.lay.recv_displs) << what;
    EXPECT_EQ(lay.recv_by_block, b.lay.recv_by_block) << what;
    // The same layout from first principles: the slots this rank routed in the chunk, counted per (peer, local
    // expert), and what the peers counted for this rank, exchanged here with MPI itself.
    const CountedLayout own = counted_layout(W.c, sv, b, L, H);
    EXPECT_EQ(own.send_counts, b.lay.send_counts) << what;
    EXPECT_EQ(own.send_displs, b.lay.send_displs) << what;
    EXPECT_EQ(own.recv_counts, b.lay.recv_counts) << what;
    EXPECT_EQ(own.recv_displs, b.lay.recv_displs) << what;
    EXPECT_EQ(own.recv_by_block, b.lay.recv_by_block) << what;
    EXPECT_EQ(lay.rows_sent, int64_t(b.t1 - b.t0) * c.top_k) << what;
    EXPECT_EQ(lay.rows_received * H, int64_t(b.xr.size())) << what;
    // Label each received row (source, expert, index within its block), move it by the table, expect the order.
    std::vector<std::array<int64_t, 3>> src, moved(size_t(lay.rows_received), {-1, -1, -1}), want;
    for (int q = 0; q < P; ++q)
      for (int e = 0; e < L; ++e) {
        empty_blocks += lay.recv_by_block[size_t(q) * L + e] == 0;
        for (int64_t i = 0; i < lay.recv_by_block[size_t(q) * L + e]; ++i) src.push_back({q, e, i});
      }
    for (int e = 0; e < L; ++e) {
      EXPECT_EQ(lay.table.expert_off[size_t(e)], int64_t(want.size())) << what << " expert " << e;
      for (int q = 0; q < P; ++q)
        for (int64_t i = 0; i < lay.recv_by_block[size_t(q) * L + e]; ++i) want.push_back({q, e, i});
    }
    for (int k = 0; k < lay.table.nblocks(); ++k) {
      EXPECT_LE(lay.table.blocks[size_t(3 * k + 2)], lay.table.max_block_rows) << what;
      for (int64_t r = 0; r < lay.table.blocks[size_t(3 * k + 2)]; ++r)
        moved[size_t(lay.table.blocks[size_t(3 * k + 1)] + r)] = src[size_t(lay.table.blocks[size_t(3 * k)] + r)];
    }
    EXPECT_EQ(moved, want) << what;
  }
  // The starved experts leave whole blocks empty somewhere: the table skips them.
  comm::all_reduce(W.c, &empty_blocks, 1, comm::DType::I64, comm::ReduceOp::Sum);
  EXPECT_GT(empty_blocks, 0);
  EXPECT_THROW(chunk_layout(sv.counts_send, sv.counts_recv, P, W.c.rank, N, L, H, N), std::invalid_argument);
}

TEST(MoeLayer, GradientsMatchFiniteDifferences) {
  // Tiny layer on each rank's own communicator; the double-precision reference gives the finite differences.
  World W;
  comm::Comm self = comm::split(W.c, {W.c.rank});
  const Router kind = W.c.rank % 2 ? Router::SigmoidGroupLimited : Router::SoftmaxTopK;
  MoeConfig c;
  c.hidden = 8;
  c.experts = 4;
  c.top_k = 2;
  c.expert_ffn = 6;
  c.shared_ffn = 4;
  c.shared_gate = true;
  c.router = kind;
  if (kind == Router::SigmoidGroupLimited) {
    c.n_group = 2;
    c.topk_group = 1;
    c.scale = 1.5f;
  }
  MoeWeights w = make_weights(c, 0, 1, 11 + W.c.rank);
  const int T = 6;
  const auto x = inputs(T, c.hidden, W.c.rank);
  const auto r = inputs(T, c.hidden, 77);  // loss = sum(out * r)  =>  dout = r
  const Pass p = run_pass(self, c, w, make_chunk_schedule(2), x, T, r);
  const std::vector<double> xd(x.begin(), x.end()), rd(r.begin(), r.end());
  const ReferenceGrads<double> rg = moe_reference_backward(c, w, xd.data(), T, rd.data());

  auto loss = [&](const MoeWeights& ww, const std::vector<double>& xx) {
    std::vector<double> out(xx.size());
    moe_reference_forward(c, ww, xx.data(), T, out.data());
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += out[i] * r[i];
    return l;
  };
  // The layer (fp32) within 2e-3 of the step's truncation error; the double reference backward within 1e-5:
  // central differences with h = 1e-3 err by O(h^2) = 1e-6 relative, far below a wrong term.
  auto check = [&](const char* name, std::vector<float>& param, const std::vector<float>& grad,
                   const std::vector<double>& exact) {
    double worst = 0, worst_ref = 0, scale = 0;
    for (size_t i = 0; i < param.size(); ++i) {
      const float orig = param[i];
      param[i] = orig + 1e-3f;
      const double fp = loss(w, xd), hp = double(param[i]);
      param[i] = orig - 1e-3f;
      const double fm = loss(w, xd), hm = double(param[i]);
      param[i] = orig;
      const double fd = (fp - fm) / (hp - hm);
      worst = std::max(worst, std::abs(fd - grad[i]));
      worst_ref = std::max(worst_ref, std::abs(fd - exact[i]));
      scale = std::max(scale, std::abs(fd));
    }
    EXPECT_LE(worst, 2e-3 * scale + 1e-5) << name << " (max |grad| " << scale << ")";
    EXPECT_LE(worst_ref, 1e-5 * scale + 1e-7) << name << " reference backward (max |grad| " << scale << ")";
  };
  check("router", w.router, p.grads.router, rg.router);
  check("w1", w.w1, p.grads.w1, rg.w1);
  check("w2", w.w2, p.grads.w2, rg.w2);
  check("shared_w1", w.shared_w1, p.grads.shared_w1, rg.shared_w1);
  check("shared_w2", w.shared_w2, p.grads.shared_w2, rg.shared_w2);
  check("shared_gate", w.shared_gate, p.grads.shared_gate, rg.shared_gate);
  double worst = 0, worst_ref = 0, scale = 0;
  for (size_t i = 0; i < xd.size(); ++i) {
    std::vector<double> xp = xd, xm = xd;
    xp[i] += 1e-5;
    xm[i] -= 1e-5;
    const double fd = (loss(w, xp) - loss(w, xm)) / 2e-5;
    worst = std::max(worst, std::abs(fd - p.dx[i]));
    worst_ref = std::max(worst_ref, std::abs(fd - rg.dx[i]));
    scale = std::max(scale, std::abs(fd));
  }
  EXPECT_LE(worst, 2e-3 * scale + 1e-5) << "dx";
  EXPECT_LE(worst_ref, 1e-5 * scale + 1e-7) << "reference dx";
  comm::free_comm(self);
}

// True when some communication step's [start, end) intersects a GEMM step's on this rank.
bool comm_meets_gemm(const std::vector<Step>& steps, const std::vector<StepTime>& t) {
  auto gemm = [](StepOp op) {
    return op == StepOp::SharedFwd || op == StepOp::ExpertFwd || op == StepOp::SharedBwd ||
           op == StepOp::ExpertDgrad || op == StepOp::ExpertWgrad;
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].stream != StreamKind::Comm) continue;
    for (size_t j = 0; j < steps.size(); ++j)
      if (gemm(steps[j].op) && t[i].start < t[j].end && t[j].start < t[i].end) return true;
  }
  return false;
}

TEST(MoeLayer, OverlapRunsAllToAllDuringGemms) {
  World W;
  const MoeConfig c = realistic_config(Router::SoftmaxTopK);
  const MoeWeights w = make_weights(c, W.c.rank, W.c.size, 5);
  const int T = 384;  // rows per peer well above MPI's eager limit: a send completes only when its peer polls
  const auto x = inputs(T, c.hidden, W.c.rank), dout = inputs(T, c.hidden, 40 + W.c.rank);
  const ChunkSchedule s = make_chunk_schedule(2);
  auto overlapped = [&](bool overlap) {
    MoeSaved sv;
    std::vector<float> out(x.size()), dx(x.size());
    MoeWeights g;
    std::vector<StepTime> tf, tb;
    moe_forward(W.c, c, w, s, x.data(), T, out.data(), sv, ExecOptions{overlap, 16}, &tf);
    moe_backward(W.c, c, w, s, sv, dout.data(), dx.data(), g, ExecOptions{overlap, 16}, &tb);
    return comm_meets_gemm(s.forward, tf) || comm_meets_gemm(s.backward, tb);
  };
  // Serial: each all-to-all is waited on before the next step starts, so intervals never meet (deterministic).
  EXPECT_FALSE(overlapped(false));
  // Overlapped: all-to-alls are issued and progressed from polls inside GEMM row blocks. Whether one is still in
  // flight when a GEMM runs depends on the peers' timing on a loaded machine, so every rank gets several tries;
  // a rank that never overlaps in all of them means the mechanism is broken.
  int seen = 0;
  for (int attempt = 0; attempt < 8; ++attempt) {
    seen = seen || overlapped(true);
    int everyone = seen;
    comm::all_reduce(W.c, &everyone, 1, comm::DType::I32, comm::ReduceOp::Min);
    if (everyone) break;
  }
  EXPECT_TRUE(seen) << "no all-to-all of this rank overlapped a GEMM step in 8 overlapped passes";
}

TEST(MoeLayer, BadInputFailsOnEveryRankWithoutHanging) {
  World W;
  MoeConfig c = small_config(Router::SoftmaxTopK);
  const MoeWeights w = make_weights(c, W.c.rank, W.c.size, 1);
  const auto x = inputs(8, c.hidden, 0);
  std::vector<float> out(x.size());
  MoeSaved sv;
  // EP not dividing experts.
  MoeConfig six = c;
  six.experts = 6;
  std::string m = invalid_argument_of([&] { moe_forward(W.c, six, w, make_chunk_schedule(1), x.data(), 8, out.data(), sv); });
  if (W.c.size == 4) {
    EXPECT_NE(m.find("experts = 6 is not divisible by EP = 4"), std::string::npos) << m;
  }
  EXPECT_NE(invalid_argument_of([&] { make_weights(six, 0, 4, 1); }), "");
  // More chunks than tokens on one rank only: the others must throw too instead of waiting in the all-to-all.
  const int T = W.c.rank == 1 ? 2 : 8;
  m = invalid_argument_of([&] { moe_forward(W.c, c, w, make_chunk_schedule(3), x.data(), T, out.data(), sv); });
  EXPECT_NE(m.find("ep_chunks = 3 is more than the 2 local tokens on EP rank 1"), std::string::npos) << m;
  // Ranks disagreeing on the configuration.
  MoeConfig other = c;
  if (W.c.rank == 0) other.top_k = 2;
  m = invalid_argument_of([&] { moe_forward(W.c, other, w, make_chunk_schedule(1), x.data(), 8, out.data(), sv); });
  EXPECT_NE(m.find("ranks disagree on experts/top_k"), std::string::npos) << m;
  // A poll block of zero rows on one rank only.
  m = invalid_argument_of([&] {
    moe_forward(W.c, c, w, make_chunk_schedule(1), x.data(), 8, out.data(), sv, ExecOptions{true, W.c.rank == 2 ? 0 : 64});
  });
  if (W.c.size > 2) {
    EXPECT_NE(m.find("poll_rows = 0 must be at least 1"), std::string::npos) << m;
  }
  // The communicator still works afterwards (nobody is stuck in a half-done collective).
  int v = 1;
  comm::all_reduce(W.c, &v, 1, comm::DType::I32, comm::ReduceOp::Sum);
  EXPECT_EQ(v, W.c.size);
}

}  // namespace
}  // namespace lcplan::moe::tests
