// The executor's small ops on the CPU, checked against independent math: the norms' and SwiGLU's input gradients
// against central finite differences of their forwards, the weight gradients against the closed forms (each output
// is linear in w), Adam against the paper's update written out in fp64. The GPU ops (ops_cuda.h) run the same
// per-element math (ops_math.h), so these tests also cover what the device computes; executor_ops_cuda_test then
// compares device and CPU. Also the cudaMemGetInfo cross-check's verdicts and the Tracker's live counts.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "executor/device_memory_check.h"
#include "executor/ops.h"
#include "executor/ops_math.h"
#include "executor/tracking_allocator.h"
#include "tests/common/check.h"

namespace lcplan::exec::tests {
namespace {

using lcplan::test::check_close;

std::vector<bf16> bf16_of(const std::vector<float>& x) {
  std::vector<bf16> y(x.size());
  to_bf16(x.data(), y.data(), x.size());
  return y;
}

// sum(dy * f(x)) in fp64 for a forward f over x.
template <class F>
double dot_loss(const std::vector<float>& dy, F f, const std::vector<float>& x) {
  std::vector<float> y(dy.size());
  f(x.data(), y.data());
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += double(dy[i]) * y[i];
  return s;
}

// Central differences of the scalar loss() with respect to every element of x (loss reads x, which is perturbed in
// place and restored).
template <class L>
std::vector<double> central_diff(L loss, std::vector<float>& x, float h = 1e-3f) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float x0 = x[i];
    x[i] = x0 + h;
    const double up = loss();
    x[i] = x0 - h;
    const double dn = loss();
    x[i] = x0;
    g[i] = (up - dn) / (double(x0 + h) - double(x0 - h));
  }
  return g;
}

// Central differences of sum(dy * f(x)) with respect to every element of x.
template <class F>
std::vector<double> numeric_grad(const std::vector<float>& dy, F f, std::vector<float> x, float h = 1e-3f) {
  return central_diff([&] { return dot_loss(dy, f, x); }, x, h);
}

TEST(Ops, RmsNormGradientsMatchFiniteDifferencesAndTheClosedForm) {
  const int64_t rows = 3, h = 37;
  const std::vector<float> x = lcplan::test::randn(size_t(rows * h), 1, 1.0f, 0.3f);
  const std::vector<float> dy = lcplan::test::randn(size_t(rows * h), 2);
  const std::vector<bf16> w = bf16_of(lcplan::test::uniform(size_t(h), 3, 0.5f, 1.5f));
  auto fwd = [&](const float* in, float* out) { rmsnorm(in, w.data(), out, rows, h); };
  std::vector<float> dx(x.size()), dw(size_t(h), 0.25f);  // dw accumulates onto what is there
  rmsnorm_bwd(x.data(), w.data(), dy.data(), dx.data(), dw.data(), rows, h, false);
  EXPECT_TRUE(check_close("dx", dx, numeric_grad(dy, fwd, x), 2e-3, 2e-3));
  std::vector<double> want_dw(size_t(h), 0.25);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < h; ++i) ss += double(x[size_t(r * h + i)]) * x[size_t(r * h + i)];
    const double rstd = 1.0 / std::sqrt(ss / double(h) + 1e-6);
    for (int64_t i = 0; i < h; ++i) want_dw[size_t(i)] += double(dy[size_t(r * h + i)]) * x[size_t(r * h + i)] * rstd;
  }
  EXPECT_TRUE(check_close("dw", dw, want_dw, 1e-5, 1e-5));
  // accumulate_dx adds; in place (dx == dy) gives the same values.
  std::vector<float> acc(x.size(), 1.0f), inplace = dy;
  rmsnorm_bwd(x.data(), w.data(), dy.data(), acc.data(), nullptr, rows, h, true);
  rmsnorm_bwd(x.data(), w.data(), inplace.data(), inplace.data(), nullptr, rows, h, false);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(acc[i], 1.0f + dx[i]) << i;
    ASSERT_EQ(inplace[i], dx[i]) << i;
  }
}

TEST(Ops, GatedNormGradientsMatchFiniteDifferencesAndTheClosedForm) {
  const int64_t rows = 2, heads = 3, dv = 16, n = rows * heads * dv;
  const std::vector<float> o = lcplan::test::randn(size_t(n), 4), z = lcplan::test::randn(size_t(n), 5);
  const std::vector<float> dy = lcplan::test::randn(size_t(n), 6);
  const std::vector<bf16> w = bf16_of(lcplan::test::uniform(size_t(dv), 7, 0.5f, 1.5f));
  std::vector<float> dO(static_cast<size_t>(n)), dz(static_cast<size_t>(n)), dw(static_cast<size_t>(dv), 0.0f);
  gated_norm_bwd(o.data(), z.data(), w.data(), dy.data(), dO.data(), dz.data(), dw.data(), rows, heads, dv);
  auto by_o = [&](const float* in, float* out) { gated_norm(in, z.data(), w.data(), out, rows, heads, dv); };
  auto by_z = [&](const float* in, float* out) { gated_norm(o.data(), in, w.data(), out, rows, heads, dv); };
  EXPECT_TRUE(check_close("dO", dO, numeric_grad(dy, by_o, o), 2e-3, 2e-3));
  EXPECT_TRUE(check_close("dz", dz, numeric_grad(dy, by_z, z), 2e-3, 2e-3));
  std::vector<double> want_dw(size_t(dv), 0.0);
  for (int64_t r = 0; r < rows * heads; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dv; ++i) ss += double(o[size_t(r * dv + i)]) * o[size_t(r * dv + i)];
    const double rstd = 1.0 / std::sqrt(ss / double(dv) + 1e-6);
    for (int64_t i = 0; i < dv; ++i) {
      const size_t e = size_t(r * dv + i);
      const double silu = z[e] / (1.0 + std::exp(-double(z[e])));
      want_dw[size_t(i)] += double(dy[e]) * o[e] * rstd * silu;
    }
  }
  EXPECT_TRUE(check_close("dw", dw, want_dw, 1e-5, 1e-4));
}

TEST(Ops, SwigluBackwardMatchesFiniteDifferences) {
  const int64_t rows = 4, f = 9;
  const std::vector<float> h1 = lcplan::test::randn(size_t(rows * 2 * f), 8);
  const std::vector<float> dact = lcplan::test::randn(size_t(rows * f), 9);
  std::vector<float> dh1(h1.size());
  swiglu_back(h1.data(), dact.data(), dh1.data(), rows, f);
  auto fwd = [&](const float* in, float* out) { swiglu_fwd(in, out, rows, f); };
  EXPECT_TRUE(check_close("dh1", dh1, numeric_grad(dact, fwd, h1), 2e-3, 2e-3));
}

// Gated DeltaNet gates: decay = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b) from the a and b columns of
// in_proj's output; the backward's a, b columns and the per-head dt_bias / A_log sums against central differences of
// sum(dg decay + dbeta beta), over a segment of rows [r0, r0 + n) as the layer calls it.
TEST(Ops, GdnGatesBackwardMatchesFiniteDifferences) {
  const int64_t T = 6, lv = 3, P = 11, bcol = 2, acol = 5, r0 = 2, n = 3;
  std::vector<float> proj = lcplan::test::randn(size_t(T * P), 40, 2.0f);
  proj[size_t(1 * P + acol)] = 25.0f;  // softplus's linear branch (x > 20) on a row outside the segment
  proj[size_t(3 * P + acol)] = 23.0f;  // and on one inside it
  const std::vector<float> alog_f = lcplan::test::randn(size_t(lv), 41, 0.5f), dt_f = lcplan::test::randn(size_t(lv), 42);
  const std::vector<bf16> alog = bf16_of(alog_f), dt = bf16_of(dt_f);
  std::vector<float> gb(size_t(T * 2 * lv));
  gdn_gates(proj.data(), P, acol, bcol, alog.data(), dt.data(), T, lv, gb.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < lv; ++h) {
      const double a = proj[size_t(t * P + acol + h)] + double(bf16_to_float(dt[size_t(h)]));
      const double sp = a > 20 ? a : std::log1p(std::exp(a));
      EXPECT_NEAR(gb[size_t(t * 2 * lv + h)], -std::exp(double(bf16_to_float(alog[size_t(h)]))) * sp,
                  1e-5 * (1 + std::abs(sp)));
      EXPECT_NEAR(gb[size_t(t * 2 * lv + lv + h)], 1 / (1 + std::exp(-double(proj[size_t(t * P + bcol + h)]))), 1e-6);
    }
  const std::vector<float> dg = lcplan::test::randn(size_t(n * lv), 43), dbeta = lcplan::test::randn(size_t(n * lv), 44);
  std::vector<float> dproj(proj.size(), -7.0f), d_dt(size_t(lv), 0.5f), d_alog(size_t(lv), -0.25f);
  gdn_gates_bwd(proj.data(), P, acol, bcol, alog.data(), dt.data(), gb.data(), dg.data(), dbeta.data(), r0, n, lv,
                dproj.data(), d_dt.data(), d_alog.data());
  // The loss of the segment's gates as a function of proj, of dt_bias and of A_log (fp32 parameters standing for bf16).
  auto loss = [&](const std::vector<float>& pr, const std::vector<float>& dtv, const std::vector<float>& alv) {
    double s = 0;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < lv; ++h) {
        const int64_t row = r0 + t;
        s += double(dg[size_t(t * lv + h)]) * math::gdn_decay(pr[size_t(row * P + acol + h)], alv[size_t(h)], dtv[size_t(h)]);
        s += double(dbeta[size_t(t * lv + h)]) * math::sigmoid(pr[size_t(row * P + bcol + h)]);
      }
    return s;
  };
  std::vector<float> dtv(static_cast<size_t>(lv), 0.0f), alv(static_cast<size_t>(lv), 0.0f);
  for (int64_t h = 0; h < lv; ++h) dtv[size_t(h)] = bf16_to_float(dt[size_t(h)]), alv[size_t(h)] = bf16_to_float(alog[size_t(h)]);
  auto segment_loss = [&] { return loss(proj, dtv, alv); };
  const std::vector<double> nproj = central_diff(segment_loss, proj), ndt = central_diff(segment_loss, dtv),
                            nal = central_diff(segment_loss, alv);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t col = 0; col < P; ++col) {
      const size_t i = size_t(t * P + col);
      const bool gate_col = (col >= acol && col < acol + lv) || (col >= bcol && col < bcol + lv);
      if (!gate_col || t < r0 || t >= r0 + n) {
        EXPECT_EQ(dproj[i], -7.0f) << "row " << t << " column " << col << " is not the segment's gate column";
        continue;
      }
      EXPECT_NEAR(dproj[i], nproj[i], 2e-3 * (1 + std::abs(nproj[i]))) << "row " << t << " column " << col;
    }
  for (size_t h = 0; h < size_t(lv); ++h) {
    EXPECT_NEAR(d_dt[h] - 0.5f, ndt[h], 2e-3 * (1 + std::abs(ndt[h]))) << "dt_bias " << h << " (accumulated)";
    EXPECT_NEAR(d_alog[h] + 0.25f, nal[h], 2e-3 * (1 + std::abs(nal[h]))) << "A_log " << h << " (accumulated)";
  }
}

TEST(Ops, OutputGateBackwardMatchesFiniteDifferences) {
  const size_t n = 40;
  const std::vector<float> o = lcplan::test::randn(n, 10), gate = lcplan::test::randn(n, 11, 2.0f);
  const std::vector<float> dgo = lcplan::test::randn(n, 12);
  std::vector<float> d_o(n), d_gate(n), go(n);
  output_gate_bwd(dgo.data(), o.data(), gate.data(), d_o.data(), d_gate.data(), n);
  // The forward rounds to bf16 (what is stored); differentiate the unrounded product.
  auto by_o = [&](const float* in, float* out) {
    for (size_t i = 0; i < n; ++i) out[i] = math::output_gate_y(in[i], gate[i]);
  };
  auto by_gate = [&](const float* in, float* out) {
    for (size_t i = 0; i < n; ++i) out[i] = math::output_gate_y(o[i], in[i]);
  };
  EXPECT_TRUE(check_close("d_o", d_o, numeric_grad(dgo, by_o, o), 2e-3, 2e-3));
  EXPECT_TRUE(check_close("d_gate", d_gate, numeric_grad(dgo, by_gate, gate), 2e-3, 2e-3));
  output_gate(o.data(), gate.data(), go.data(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(go[i], round_bf16(float(o[i] / (1.0 + std::exp(-double(gate[i])))))) << i;
}

TEST(Ops, EmbeddingRowsOfAVocabularyShard) {
  const int64_t h = 3, V0 = 4, Vl = 4;  // this shard holds tokens 4..7
  const std::vector<int64_t> tokens = {5, 1, 7, 5, 9};
  std::vector<float> tf(size_t(Vl * h));
  for (size_t i = 0; i < tf.size(); ++i) tf[i] = float(i + 1);
  const std::vector<bf16> table = bf16_of(tf);
  std::vector<float> out(tokens.size() * size_t(h), -1.0f);
  embedding_rows(table.data(), tokens.data(), int64_t(tokens.size()), h, V0, Vl, out.data());
  const std::vector<float> want = {4, 5, 6, 0, 0, 0, 10, 11, 12, 4, 5, 6, 0, 0, 0};
  EXPECT_EQ(out, want);
  std::vector<float> dy(out.size());
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = float(i);
  std::vector<float> g(size_t(Vl * h), 1.0f);
  embedding_rows_bwd(tokens.data(), dy.data(), int64_t(tokens.size()), h, V0, Vl, g.data());
  // token 5 (row 1) gets rows 0 and 3 of dy, token 7 (row 3) row 2; rows 0 and 2 of the shard stay untouched.
  const std::vector<float> want_g = {1, 1, 1, 1 + 0 + 9, 1 + 1 + 10, 1 + 2 + 11, 1, 1, 1, 1 + 6, 1 + 7, 1 + 8};
  EXPECT_EQ(g, want_g);
}

TEST(Ops, AdamFollowsThePaperWithBiasCorrection) {
  const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8;
  const std::vector<float> grads = {0.5f, -1.25f, 3.0f};
  float m = 0, v = 0, w = 1.0f;
  double M = 0, V = 0, W = 1.0;
  for (int step = 1; step <= 3; ++step) {
    const double g = grads[size_t(step - 1)];
    math::adam_update(float(g), m, v, w, math::adam_scalars(lr, b1, b2, eps, step));
    M = b1 * M + (1 - b1) * g;
    V = b2 * V + (1 - b2) * g * g;
    W -= lr * (M / (1 - std::pow(b1, step))) / (std::sqrt(V / (1 - std::pow(b2, step))) + eps);
    EXPECT_NEAR(m, M, 1e-6) << step;
    EXPECT_NEAR(v, V, 1e-6) << step;
    EXPECT_NEAR(w, W, 1e-6) << step;
  }
  // The first step of bias-corrected Adam moves every weight by lr (|m / c1| / sqrt(v / c2) = 1).
  float m1 = 0, v1 = 0, w1 = 0;
  math::adam_update(-7.0f, m1, v1, w1, math::adam_scalars(lr, b1, b2, eps, 1));
  EXPECT_NEAR(w1, lr, 1e-7);
}

TEST(DeviceMemoryCheck, VerdictsAndOneSentenceForBadInput) {
  const double mib = 1024.0 * 1024.0, base = 900 * mib;
  // 3 allocations of 10 MiB, the driver rounded each up to its 2 MiB page: consistent.
  DeviceMemoryCheck ok = check_device_memory(30 * mib, base + 36 * mib, base, 3);
  EXPECT_TRUE(ok.consistent) << ok.note;
  EXPECT_DOUBLE_EQ(ok.device_bytes, 36 * mib);
  EXPECT_DOUBLE_EQ(ok.allowance, 8 * mib);
  EXPECT_NE(ok.note.find("consistent"), std::string::npos) << ok.note;
  // 100 MiB more in use than tracked (another process, or memory the tracker missed): flagged.
  DeviceMemoryCheck over = check_device_memory(30 * mib, base + 130 * mib, base, 3);
  EXPECT_FALSE(over.consistent);
  EXPECT_NE(over.note.find("differs by more than page rounding"), std::string::npos) << over.note;
  // Less in use than tracked (the tracker charges bytes never allocated): flagged.
  EXPECT_FALSE(check_device_memory(30 * mib, base + 20 * mib, base, 3).consistent);
  try {
    check_device_memory(-1, base, base, 0);
    FAIL() << "a negative byte count was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("tracked bytes = -1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(check_device_memory(0, NAN, base, 0), std::invalid_argument);
}

TEST(Tracker, LiveTotalAndChargesFollowTheBuffers) {
  Tracker t(1000);  // the workspace reservation is not live memory
  EXPECT_EQ(t.live_total(), 0);
  {
    Buf<float> a(t, Category::Activations, 10);
    Buf<bf16> p(t, Category::Params, 8);
    EXPECT_EQ(t.live_total(), 10 * 4 + 8 * 2);
    EXPECT_EQ(t.live_charges(), 2);
    Buf<float> moved = std::move(a);
    EXPECT_EQ(t.live_charges(), 2);
    p.reset();
    EXPECT_EQ(t.live_charges(), 1);
  }
  EXPECT_EQ(t.live_total(), 0);
  EXPECT_EQ(t.live_charges(), 0);
}

}  // namespace
}  // namespace lcplan::exec::tests
