// The GPU backend's building blocks against the CPU executor: every op of ops_cuda.h against its ops.h version on the
// same inputs (norms and SwiGLU fp32 with fp64 row sums in a different order; GEMMs fp32 cuBLAS against the CPU's
// fp64 accumulation), DeviceBuf charging the Tracker and the cudaMemGetInfo cross-check, and the CUDA-event phase
// timer. Skips itself without a usable device (CTest reports it skipped); the phase timer's mismatch checks, which
// throw before any CUDA call, run everywhere.
//
// Tolerances: element-wise ops and bf16 conversions exact up to device expf (atol 1e-6, rtol 1e-5); norms atol 1e-5
// rtol 1e-5; GEMMs atol 1e-4 rtol 1e-4 (fp32 accumulation over k <= 300 against fp64).
#include <gtest/gtest.h>

#include <cublas_v2.h>

#include <stdexcept>
#include <vector>

#include "executor/device_buf_cuda.h"
#include "executor/device_memory_check.h"
#include "executor/ops.h"
#include "executor/ops_cuda.h"
#include "executor/phase_timer_cuda.h"
#include "tests/common/check.h"
#include "tests/attention/device_buffer.h"

namespace lcplan::exec::tests {
namespace {

using lcplan::test::check_close;
using lcplan::test::DeviceFloats;
using lcplan::test::randn;

class ExecOpsCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gpu::device_available()) GTEST_SKIP() << "no usable CUDA device";
    CUBLAS_CHECK(cublasCreate(&blas_));
  }
  void TearDown() override {
    if (blas_) CUBLAS_LOG(cublasDestroy(blas_));
  }
  cublasHandle_t blas_ = nullptr;
};

std::vector<bf16> bf16_of(const std::vector<float>& x) {
  std::vector<bf16> y(x.size());
  to_bf16(x.data(), y.data(), x.size());
  return y;
}

// A device copy of bf16 values (tracked, so the buffers also exercise DeviceBuf).
cuda::DeviceBuf<bf16> upload(Tracker& t, const std::vector<bf16>& h) {
  cuda::DeviceBuf<bf16> d(t, Category::Params, h.size());
  CUDA_CHECK(cudaMemcpy(d.data(), h.data(), h.size() * sizeof(bf16), cudaMemcpyHostToDevice));
  return d;
}

TEST_F(ExecOpsCuda, Bf16ConversionsAreExact) {
  lcplan::test::Stream st;
  const std::vector<float> x = randn(1000, 11, 3.0f);
  Tracker t;
  cuda::DeviceBuf<bf16> y(t, Category::Workspace, x.size());
  DeviceFloats dx(x), back(x.size()), rounded(x);
  cuda::to_bf16(dx.get(), y.data(), x.size(), st.get());
  cuda::to_f32(y.data(), back.get(), x.size(), st.get());
  cuda::round_bf16_inplace(rounded.get(), x.size(), st.get());
  std::vector<float> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = round_bf16(x[i]);
  EXPECT_TRUE(check_close("to_bf16 -> to_f32", back.fetch(), want, 0, 0));
  EXPECT_TRUE(check_close("round_bf16_inplace", rounded.fetch(), want, 0, 0));
}

TEST_F(ExecOpsCuda, RmsNormForwardAndBackwardMatchTheCpu) {
  lcplan::test::Stream st;
  Tracker t;
  for (int64_t h : {37, 256, 1000}) {  // below, at and above one block of threads
    const int64_t rows = 5;
    const std::vector<float> x = randn(size_t(rows * h), 21, 1.0f, 0.2f), dy = randn(size_t(rows * h), 22);
    const std::vector<bf16> w = bf16_of(lcplan::test::uniform(size_t(h), 23, 0.5f, 1.5f));
    cuda::DeviceBuf<bf16> dw_w = upload(t, w);
    std::vector<float> y(x.size()), dx(x.size(), 0.5f), dw(size_t(h), 0.25f);
    rmsnorm(x.data(), w.data(), y.data(), rows, h);
    rmsnorm_bwd(x.data(), w.data(), dy.data(), dx.data(), dw.data(), rows, h, true);
    DeviceFloats gx(x), gy(x.size()), gdy(dy), gdx(std::vector<float>(x.size(), 0.5f)),
        gdw(std::vector<float>(size_t(h), 0.25f)), inplace(x);
    cuda::DeviceBuf<double> ws(t, Category::Workspace, cuda::norm_bwd_workspace_bytes(rows) / sizeof(double));
    cuda::rmsnorm(gx.get(), dw_w.data(), gy.get(), rows, h, st.get());
    cuda::rmsnorm(inplace.get(), dw_w.data(), inplace.get(), rows, h, st.get());
    cuda::rmsnorm_bwd(gx.get(), dw_w.data(), gdy.get(), gdx.get(), gdw.get(), rows, h, true, ws.data(), ws.bytes(),
                      st.get());
    EXPECT_TRUE(check_close("y", gy.fetch(), y, 1e-5, 1e-5)) << "h " << h;
    EXPECT_TRUE(check_close("y in place", inplace.fetch(), y, 1e-5, 1e-5)) << "h " << h;
    EXPECT_TRUE(check_close("dx", gdx.fetch(), dx, 1e-5, 1e-5)) << "h " << h;
    EXPECT_TRUE(check_close("dw", gdw.fetch(), dw, 1e-5, 1e-5)) << "h " << h;
    // dx written over dy (the q/k-norm backward does this).
    std::vector<float> want_inplace(x.size());
    rmsnorm_bwd(x.data(), w.data(), dy.data(), want_inplace.data(), nullptr, rows, h, false);
    DeviceFloats over(dy);
    cuda::rmsnorm_bwd(gx.get(), dw_w.data(), over.get(), over.get(), nullptr, rows, h, false, ws.data(), ws.bytes(),
                      st.get());
    EXPECT_TRUE(check_close("dx over dy", over.fetch(), want_inplace, 1e-5, 1e-5)) << "h " << h;
  }
  EXPECT_THROW(cuda::rmsnorm_bwd(nullptr, nullptr, nullptr, nullptr, nullptr, 4, 8, false, nullptr, 8, nullptr),
               std::invalid_argument);  // workspace too small: refused before any launch
}

TEST_F(ExecOpsCuda, GatedNormMatchesTheCpu) {
  lcplan::test::Stream st;
  Tracker t;
  const int64_t rows = 6, heads = 4, dv = 128, n = rows * heads * dv;
  const std::vector<float> o = randn(size_t(n), 31), z = randn(size_t(n), 32), dy = randn(size_t(n), 33);
  const std::vector<bf16> w = bf16_of(lcplan::test::uniform(size_t(dv), 34, 0.5f, 1.5f));
  cuda::DeviceBuf<bf16> gw = upload(t, w);
  const size_t ne = size_t(n);
  std::vector<float> y(ne), dO(ne), dz(ne), dw(size_t(dv), 0.0f);
  gated_norm(o.data(), z.data(), w.data(), y.data(), rows, heads, dv);
  gated_norm_bwd(o.data(), z.data(), w.data(), dy.data(), dO.data(), dz.data(), dw.data(), rows, heads, dv);
  DeviceFloats go(o), gz(z), gdy(dy), gy(ne), gdO(ne), gdz(ne),
      gdw(std::vector<float>(size_t(dv), 0.0f));
  cuda::DeviceBuf<double> ws(t, Category::Workspace, cuda::norm_bwd_workspace_bytes(rows * heads) / sizeof(double));
  cuda::gated_norm(go.get(), gz.get(), gw.data(), gy.get(), rows, heads, dv, st.get());
  cuda::gated_norm_bwd(go.get(), gz.get(), gw.data(), gdy.get(), gdO.get(), gdz.get(), gdw.get(), rows, heads, dv,
                       ws.data(), ws.bytes(), st.get());
  EXPECT_TRUE(check_close("y", gy.fetch(), y, 1e-5, 1e-5));
  EXPECT_TRUE(check_close("dO", gdO.fetch(), dO, 1e-5, 1e-5));
  EXPECT_TRUE(check_close("dz", gdz.fetch(), dz, 1e-5, 1e-5));
  EXPECT_TRUE(check_close("dw", gdw.fetch(), dw, 1e-4, 1e-5));
}

// The gated DeltaNet gates and their backward over a segment of rows: elementwise within a few ulps of the CPU (device
// expf / log1pf), the per-head weight-gradient sums in the CPU's row order.
TEST_F(ExecOpsCuda, GdnGatesMatchTheCpu) {
  lcplan::test::Stream st;
  Tracker t;
  const int64_t T = 300, lv = 6, P = 40, bcol = 3, acol = 20, r0 = 64, n = 128;
  std::vector<float> proj = randn(size_t(T * P), 51, 3.0f);
  proj[size_t(70 * P + acol)] = 24.0f;  // softplus's linear branch
  const std::vector<bf16> alog = bf16_of(randn(size_t(lv), 52, 0.5f)), dt = bf16_of(randn(size_t(lv), 53));
  const std::vector<float> dg = randn(size_t(n * lv), 54), dbeta = randn(size_t(n * lv), 55);
  std::vector<float> gb(size_t(T * 2 * lv)), dproj(proj.size(), 0.0f), d_dt(size_t(lv), 0.5f), d_alog(size_t(lv), 0.0f);
  gdn_gates(proj.data(), P, acol, bcol, alog.data(), dt.data(), T, lv, gb.data());
  gdn_gates_bwd(proj.data(), P, acol, bcol, alog.data(), dt.data(), gb.data(), dg.data(), dbeta.data(), r0, n, lv,
                dproj.data(), d_dt.data(), d_alog.data());
  cuda::DeviceBuf<bf16> galog = upload(t, alog), gdt = upload(t, dt);
  DeviceFloats gproj(proj), ggb(gb.size()), gdg(dg), gdbeta(dbeta), gdproj(std::vector<float>(proj.size(), 0.0f)),
      gd_dt(std::vector<float>(size_t(lv), 0.5f)), gd_alog(std::vector<float>(size_t(lv), 0.0f));
  cuda::gdn_gates(gproj.get(), P, acol, bcol, galog.data(), gdt.data(), T, lv, ggb.get(), st.get());
  EXPECT_TRUE(check_close("gb", ggb.fetch(), gb, 1e-6, 1e-6));
  // The backward from the CPU's gates, so only the backward's own rounding is compared.
  DeviceFloats gb_cpu(gb);
  cuda::gdn_gates_bwd(gproj.get(), P, acol, bcol, galog.data(), gdt.data(), gb_cpu.get(), gdg.get(), gdbeta.get(), r0,
                      n, lv, gdproj.get(), gd_dt.get(), gd_alog.get(), st.get());
  EXPECT_TRUE(check_close("dproj", gdproj.fetch(), dproj, 1e-6, 1e-6));
  EXPECT_TRUE(check_close("d_dt_bias", gd_dt.fetch(), d_dt, 1e-5, 1e-6));
  EXPECT_TRUE(check_close("d_a_log", gd_alog.fetch(), d_alog, 1e-5, 1e-6));
}

TEST_F(ExecOpsCuda, SwigluAndAdamMatchTheCpu) {
  lcplan::test::Stream st;
  const int64_t rows = 7, f = 300;
  const std::vector<float> h1 = randn(size_t(rows * 2 * f), 41), dact = randn(size_t(rows * f), 42);
  std::vector<float> act(size_t(rows * f)), dh1(h1.size());
  swiglu_fwd(h1.data(), act.data(), rows, f);
  swiglu_back(h1.data(), dact.data(), dh1.data(), rows, f);
  DeviceFloats gh1(h1), gdact(dact), gact(act.size()), gdh1(h1.size());
  cuda::swiglu_fwd(gh1.get(), gact.get(), rows, f, st.get());
  cuda::swiglu_back(gh1.get(), gdact.get(), gdh1.get(), rows, f, st.get());
  EXPECT_TRUE(check_close("act", gact.fetch(), act, 1e-6, 1e-5));
  EXPECT_TRUE(check_close("dh1", gdh1.fetch(), dh1, 1e-6, 1e-5));

  const size_t n = 5000;
  const std::vector<float> g = randn(n, 43, 0.1f);
  std::vector<float> m = randn(n, 44, 0.01f), v = lcplan::test::uniform(n, 45, 0.0f, 1e-3f), w = randn(n, 46);
  DeviceFloats gg(g), gm(m), gv(v), gmaster(w);
  Tracker t;
  cuda::DeviceBuf<bf16> gp(t, Category::Params, n);
  const math::AdamScalars a = math::adam_scalars(1e-3, 0.9, 0.95, 1e-8, 3);
  cuda::adam(gg.get(), gm.get(), gv.get(), gmaster.get(), gp.data(), n, a, st.get());
  std::vector<float> p(n);
  for (size_t i = 0; i < n; ++i) {
    math::adam_update(g[i], m[i], v[i], w[i], a);
    p[i] = round_bf16(w[i]);
  }
  std::vector<bf16> got_p16(n);
  CUDA_CHECK(cudaStreamSynchronize(st.get()));
  CUDA_CHECK(cudaMemcpy(got_p16.data(), gp.data(), n * sizeof(bf16), cudaMemcpyDeviceToHost));
  std::vector<float> got_p(n);
  to_f32(got_p16.data(), got_p.data(), n);
  EXPECT_TRUE(check_close("m", gm.fetch(), m, 1e-7, 1e-6));
  EXPECT_TRUE(check_close("v", gv.fetch(), v, 1e-9, 1e-6));
  EXPECT_TRUE(check_close("master", gmaster.fetch(), w, 1e-6, 1e-6));
  EXPECT_TRUE(check_close("bf16 params", got_p, p, 1e-2, 1e-2));  // one bf16 ulp where master sits on a tie
}

TEST_F(ExecOpsCuda, OutputGateAndEmbeddingMatchTheCpu) {
  lcplan::test::Stream st;
  Tracker t;
  const size_t n = 3000;
  const std::vector<float> o = randn(n, 61), gate = randn(n, 62, 2.0f), dgo = randn(n, 63);
  std::vector<float> go(n), d_o(n), d_gate(n);
  output_gate(o.data(), gate.data(), go.data(), n);
  output_gate_bwd(dgo.data(), o.data(), gate.data(), d_o.data(), d_gate.data(), n);
  DeviceFloats g_o(o), g_gate(gate), g_dgo(dgo), g_go(n), g_do(n), g_dgate(n);
  cuda::output_gate(g_o.get(), g_gate.get(), g_go.get(), n, st.get());
  cuda::output_gate_bwd(g_dgo.get(), g_o.get(), g_gate.get(), g_do.get(), g_dgate.get(), n, st.get());
  EXPECT_TRUE(check_close("go", g_go.fetch(), go, 1e-2, 1e-2));  // bf16 outputs: one ulp where expf differs
  EXPECT_TRUE(check_close("d_o", g_do.fetch(), d_o, 1e-6, 1e-5));
  EXPECT_TRUE(check_close("d_gate", g_dgate.fetch(), d_gate, 1e-6, 1e-5));

  const int64_t T = 300, h = 40, V0 = 100, Vl = 50;
  std::vector<int64_t> tokens(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) tokens[size_t(i)] = (i * 37) % 200;  // half in the shard, repeats included
  const std::vector<bf16> table = bf16_of(randn(size_t(Vl * h), 64));
  const std::vector<float> dy = randn(size_t(T * h), 65);
  std::vector<float> rows(size_t(T * h)), g(size_t(Vl * h), 0.5f);
  embedding_rows(table.data(), tokens.data(), T, h, V0, Vl, rows.data());
  embedding_rows_bwd(tokens.data(), dy.data(), T, h, V0, Vl, g.data());
  cuda::DeviceBuf<bf16> g_table = upload(t, table);
  cuda::DeviceBuf<int64_t> g_tokens(t, Category::Workspace, tokens.size());
  CUDA_CHECK(cudaMemcpy(g_tokens.data(), tokens.data(), tokens.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
  DeviceFloats g_rows(rows.size()), g_dy(dy), g_g(std::vector<float>(g.size(), 0.5f));
  cuda::embedding_rows(g_table.data(), g_tokens.data(), T, h, V0, Vl, g_rows.get(), st.get());
  cuda::embedding_rows_bwd(g_tokens.data(), g_dy.get(), T, h, V0, Vl, g_g.get(), st.get());
  EXPECT_TRUE(check_close("embedding rows", g_rows.fetch(), rows, 0, 0));
  EXPECT_TRUE(check_close("embedding grad", g_g.fetch(), g, 0, 0));  // same additions in the same order
}

// The q/k/v bias and its gradient: the same additions in the same order (column sums row by row).
TEST_F(ExecOpsCuda, BiasMatchesTheCpu) {
  lcplan::test::Stream st;
  Tracker t;
  const int64_t rows = 123, n = 77;
  const std::vector<float> y0 = randn(size_t(rows * n), 71), dy = randn(size_t(rows * n), 72);
  const std::vector<bf16> b = bf16_of(randn(size_t(n), 73));
  std::vector<float> y = y0, db(size_t(n), 0.25f);
  add_bias(y.data(), b.data(), rows, n);
  bias_bwd(dy.data(), rows, n, db.data());
  cuda::DeviceBuf<bf16> g_b = upload(t, b);
  DeviceFloats g_y(y0), g_dy(dy), g_db(std::vector<float>(size_t(n), 0.25f));
  cuda::add_bias(g_y.get(), g_b.data(), rows, n, st.get());
  cuda::bias_bwd(g_dy.get(), rows, n, g_db.get(), st.get());
  EXPECT_TRUE(check_close("add_bias", g_y.fetch(), y, 0, 0));
  EXPECT_TRUE(check_close("bias_bwd", g_db.fetch(), db, 0, 0));
}

TEST_F(ExecOpsCuda, GemmsMatchTheCpu) {
  lcplan::test::Stream st;
  const int64_t rows = 33, k = 300, n = 70;
  const std::vector<float> x = randn(size_t(rows * k), 51), dy = randn(size_t(rows * n), 52);
  const std::vector<bf16> W = bf16_of(randn(size_t(k * n), 53, 0.05f));
  Tracker t;
  std::vector<float> y(size_t(rows * n)), dx(size_t(rows * k), 1.0f), dW(size_t(k * n), 0.5f);
  matmul(t, x.data(), W.data(), y.data(), rows, k, n);
  matmul_bwd(t, x.data(), W.data(), dy.data(), dx.data(), dW.data(), rows, k, n, true);
  cuda::DeviceBuf<bf16> gW = upload(t, W);
  DeviceFloats gx(x), gdy(dy), gy(y.size()), gdx(std::vector<float>(dx.size(), 1.0f)),
      gdW(std::vector<float>(dW.size(), 0.5f));
  cuda::DeviceBuf<float> ws(t, Category::Workspace, cuda::matmul_workspace_bytes(k, n) / sizeof(float));
  cuda::matmul(blas_, gx.get(), gW.data(), gy.get(), rows, k, n, ws.data(), ws.bytes(), st.get());
  cuda::matmul_bwd(blas_, gx.get(), gW.data(), gdy.get(), gdx.get(), gdW.get(), rows, k, n, true, ws.data(),
                   ws.bytes(), st.get());
  EXPECT_TRUE(check_close("y", gy.fetch(), y, 1e-4, 1e-4));
  EXPECT_TRUE(check_close("dx", gdx.fetch(), dx, 1e-4, 1e-4));
  EXPECT_TRUE(check_close("dW", gdW.fetch(), dW, 1e-4, 1e-4));
}

TEST_F(ExecOpsCuda, DeviceBufsAreTrackedAndCrossCheckedWithTheDriver) {
  Tracker t;
  CUDA_CHECK(cudaFree(nullptr));  // the context exists before the baseline
  const double base = cuda::device_used_bytes();
  {
    cuda::DeviceBuf<float> a(t, Category::Activations, size_t(16) << 20);  // 64 MiB
    cuda::DeviceBuf<bf16> b(t, Category::Params, size_t(5) << 20);         // 10 MiB
    EXPECT_EQ(t.live_total(), double(64 + 10) * 1024 * 1024);
    EXPECT_EQ(t.live_charges(), 2);
    const DeviceMemoryCheck c = check_device_memory(t.live_total(), cuda::device_used_bytes(), base, t.live_charges());
    EXPECT_TRUE(c.consistent) << c.note;
  }
  EXPECT_EQ(t.live_total(), 0);
}

TEST_F(ExecOpsCuda, PhaseTimerSumsEachPhasesEvents) {
  lcplan::test::Stream st;
  const size_t n = size_t(1) << 24;
  DeviceFloats x(n);
  cuda::PhaseTimer timer(st.get());
  timer.begin(Phase::Forward);
  for (int i = 0; i < 4; ++i) cuda::round_bf16_inplace(x.get(), n, st.get());
  timer.end(Phase::Forward);
  timer.begin(Phase::Optimizer);
  cuda::round_bf16_inplace(x.get(), n, st.get());
  timer.end(Phase::Optimizer);
  const auto s = timer.seconds();
  EXPECT_GT(s[size_t(Phase::Forward)], 0.0);
  EXPECT_GT(s[size_t(Phase::Optimizer)], 0.0);
  EXPECT_EQ(s[size_t(Phase::Loss)], 0.0);
  EXPECT_EQ(s[size_t(Phase::Backward)], 0.0);
}

// Mismatched marks are refused before any CUDA call, so this runs without a device.
TEST(ExecPhaseTimer, MismatchedMarksAreRefused) {
  cuda::PhaseTimer timer(nullptr);
  EXPECT_THROW(timer.end(Phase::Forward), std::logic_error);
  EXPECT_NO_THROW(timer.seconds());
  EXPECT_FALSE(timer.open());
}

}  // namespace
}  // namespace lcplan::exec::tests
