// The distributed MoE layer under mpirun -np 4: chunked == no-chunk, EP=4 == single rank, gradients vs
// finite differences, and bad input failing on every rank.
#include <mpi.h>

#include "tests/comm/mpi_env.h"
#include "tests/moe/layer_util.h"

LCPLAN_MPI_TEST_MAIN;

namespace lcplan::moe::tests {
namespace {

struct World {
  comm::Comm c = comm::world_mpi();
  ~World() { comm::free_comm(c); }
};

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

// Tokens differ per rank; with the sigmoid router a large negative bias starves experts 2, 3 and 5, which also
// keeps group {4,5} out, so experts 2-5 (all of EP ranks 1 and 2) receive nothing.
MoeWeights starving_weights(const MoeConfig& c, int rank, int size) {
  MoeWeights w = make_weights(c, rank, size, 7);
  if (c.router == Router::SigmoidGroupLimited) w.expert_bias[2] = w.expert_bias[3] = w.expert_bias[5] = -10.f;
  return w;
}

TEST(MoeLayer, ChunkedEqualsNoChunkWithUnevenExperts) {
  World W;
  for (Router kind : {Router::SoftmaxTopK, Router::SigmoidGroupLimited}) {
    const MoeConfig c = small_config(kind);
    const MoeWeights w = starving_weights(c, W.c.rank, W.c.size);
    const int T = 9 + 4 * W.c.rank;
    const auto x = inputs(T, c.hidden, W.c.rank);
    const auto dout = inputs(T, c.hidden, 100 + W.c.rank);
    const Pass base = run_pass(W.c, c, w, make_chunk_schedule(1), x, T, dout, ExecOptions{false, 64});
    if (kind == Router::SigmoidGroupLimited && W.c.size == 4) {
      // The starvation is real: EP ranks 1 and 2 own experts 2-5 and receive no rows at all.
      MoeSaved sv;
      std::vector<float> out(x.size());
      moe_forward(W.c, c, w, make_chunk_schedule(2), x.data(), T, out.data(), sv);
      size_t received = 0;
      for (const ChunkBuffers& b : sv.chunks) received += b.xr.size();
      if (W.c.rank == 1 || W.c.rank == 2) EXPECT_EQ(received, 0u);
      else EXPECT_GT(received, 0u);
    }
    for (int n = 1; n <= 4; ++n)
      for (const std::vector<double>& weights : {std::vector<double>{}, std::vector<double>(n, 1.0)}) {
        std::vector<double> wts = weights;
        if (!wts.empty()) wts[0] = 3.0;  // asymmetric: the first chunk takes a larger share
        const ChunkSchedule s = make_chunk_schedule(n, wts);
        const Pass p = run_pass(W.c, c, w, s, x, T, dout);
        const std::string what = "router " + std::to_string(int(kind)) + " chunks " + std::to_string(n) +
                                 (wts.empty() ? "" : " asymmetric");
        EXPECT_LE(rel_err(p.out, base.out), 1e-6) << what;
        EXPECT_LE(rel_err(p.dx, base.dx), 1e-6) << what;
        const auto a = tensors(p.grads), b = tensors(base.grads);
        for (size_t i = 0; i < a.size(); ++i) EXPECT_LE(rel_err(*a[i].second, *b[i].second), 1e-6) << what << " " << a[i].first;
      }
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
    EXPECT_TRUE(bit_equal(serial.out, overlapped.out)) << n;
    EXPECT_TRUE(bit_equal(serial.dx, overlapped.dx)) << n;
    const auto a = tensors(serial.grads), b = tensors(overlapped.grads);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(bit_equal(*a[i].second, *b[i].second)) << n << a[i].first;
  }
}

TEST(MoeLayer, ExpertParallelEqualsSingleRank) {
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

    auto slice = [&](const std::vector<float>& v) {
      return std::vector<float>(v.begin() + size_t(first) * c.hidden, v.begin() + size_t(first + T) * c.hidden);
    };
    EXPECT_LE(rel_err(dist.out, slice(ref.out)), 1e-6);
    EXPECT_LE(rel_err(dist.dx, slice(ref.dx)), 1e-6);
    // Local experts' grads are a slice of the full ones; replicated grads are partial sums over ranks.
    const size_t n1 = size_t(c.hidden) * 2 * c.expert_ffn, n2 = size_t(c.expert_ffn) * c.hidden;
    const std::vector<float> w1(ref.grads.w1.begin() + w.first_expert * n1,
                                ref.grads.w1.begin() + (w.first_expert + w.local_experts) * n1);
    const std::vector<float> w2(ref.grads.w2.begin() + w.first_expert * n2,
                                ref.grads.w2.begin() + (w.first_expert + w.local_experts) * n2);
    EXPECT_LE(rel_err(dist.grads.w1, w1), 1e-6);
    EXPECT_LE(rel_err(dist.grads.w2, w2), 1e-6);
    MoeWeights g = dist.grads;
    for (auto* v : {&g.router, &g.shared_w1, &g.shared_w2, &g.shared_gate})
      comm::all_reduce(W.c, v->data(), v->size(), comm::DType::F32, comm::ReduceOp::Sum);
    EXPECT_LE(rel_err(g.router, ref.grads.router), 1e-6);
    EXPECT_LE(rel_err(g.shared_w1, ref.grads.shared_w1), 1e-6);
    EXPECT_LE(rel_err(g.shared_w2, ref.grads.shared_w2), 1e-6);
    EXPECT_LE(rel_err(g.shared_gate, ref.grads.shared_gate), 1e-6);

    // And the single-rank layer against the naive token-by-token reference (independent code path).
    std::vector<float> naive(ref.out.size());
    moe_reference_forward(c, full, x_all.data(), total, naive.data());
    EXPECT_LE(rel_err(ref.out, naive), 1e-5);
  }
  comm::free_comm(self);
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

  auto loss = [&](const MoeWeights& ww, const std::vector<double>& xx) {
    std::vector<double> out(xx.size());
    moe_reference_forward(c, ww, xx.data(), T, out.data());
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += out[i] * r[i];
    return l;
  };
  const std::vector<double> xd(x.begin(), x.end());
  auto check = [&](const char* name, std::vector<float>& param, const std::vector<float>& grad) {
    double worst = 0, scale = 0;
    for (size_t i = 0; i < param.size(); ++i) {
      const float orig = param[i];
      param[i] = orig + 1e-3f;
      const double fp = loss(w, xd), hp = double(param[i]);
      param[i] = orig - 1e-3f;
      const double fm = loss(w, xd), hm = double(param[i]);
      param[i] = orig;
      const double fd = (fp - fm) / (hp - hm);
      worst = std::max(worst, std::abs(fd - grad[i]));
      scale = std::max(scale, std::abs(fd));
    }
    EXPECT_LE(worst, 2e-3 * scale + 1e-5) << name << " (max |grad| " << scale << ")";
  };
  check("router", w.router, p.grads.router);
  check("w1", w.w1, p.grads.w1);
  check("w2", w.w2, p.grads.w2);
  check("shared_w1", w.shared_w1, p.grads.shared_w1);
  check("shared_w2", w.shared_w2, p.grads.shared_w2);
  check("shared_gate", w.shared_gate, p.grads.shared_gate);
  double worst = 0, scale = 0;
  for (size_t i = 0; i < xd.size(); ++i) {
    std::vector<double> xp = xd, xm = xd;
    xp[i] += 1e-5;
    xm[i] -= 1e-5;
    const double fd = (loss(w, xp) - loss(w, xm)) / 2e-5;
    worst = std::max(worst, std::abs(fd - p.dx[i]));
    scale = std::max(scale, std::abs(fd));
  }
  EXPECT_LE(worst, 2e-3 * scale + 1e-5) << "dx";
  comm::free_comm(self);
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
  // The communicator still works afterwards (nobody is stuck in a half-done collective).
  int v = 1;
  comm::all_reduce(W.c, &v, 1, comm::DType::I32, comm::ReduceOp::Sum);
  EXPECT_EQ(v, W.c.size);
}

}  // namespace
}  // namespace lcplan::moe::tests
