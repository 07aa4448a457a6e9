// CUDA gated delta rule and conv1d against the CPU implementation: several chunk sizes, GVA ratios, Qwen3.5's head
// dims (dk = dv = 128), state passing, conv1d with history. Skips itself without a usable device (CTest reports it
// skipped); argument checks, which throw before any CUDA call, run everywhere.
//
// Tolerances (CUDA recurrent form vs CPU chunked form, both fp32): o and state atol 1e-5 rtol 1e-4, gradients
// atol 1e-4 rtol 1e-3, conv1d 1e-5.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "kernels/linear_attention/linear_attention_cuda.h"
#include "tests/attention/device_buffer.h"
#include "tests/linear_attention/la_harness.h"

namespace lcplan::linear_attention {
namespace {

using lcplan::test::check_close;
using lcplan::test::DeviceFloats;
using test::Case;
using test::make_case;

test::Result<float> run_cuda(const Case& c) {
  const Shape& s = c.s;
  lcplan::test::Stream st;
  DeviceFloats q(c.q), k(c.k), v(c.v), g(c.g), b(c.beta), s0(c.s0), d_o(c.d_o), dsf(c.ds_final);
  auto r = test::sized<float>(s);
  DeviceFloats o(r.o.size()), state(r.state.size()), dq(r.dq.size()), dk(r.dk.size()), dv(r.dv.size()),
      dg(r.dg.size()), db(r.dbeta.size()), ds0(r.ds0.size());
  const size_t ws_bytes = cuda::backward_workspace_bytes(s, c.o);
  DeviceFloats ws(ws_bytes / sizeof(float) + 1);
  cuda::forward(s, q.get(), k.get(), v.get(), g.get(), b.get(), s0.get(), o.get(), state.get(), c.o, st.get());
  cuda::backward(s, q.get(), k.get(), v.get(), g.get(), b.get(), s0.get(), d_o.get(), dsf.get(), dq.get(), dk.get(),
                 dv.get(), dg.get(), db.get(), ds0.get(), c.o, ws.get(), ws_bytes, st.get());
  CUDA_CHECK(cudaStreamSynchronize(st.get()));
  return {o.fetch(), state.fetch(), dq.fetch(), dk.fetch(), dv.fetch(), dg.fetch(), db.fetch(), ds0.fetch()};
}

struct Config {
  const char* name;
  Shape s;
  int64_t chunk;
};

const Config kConfigs[] = {
    {"chunk7_not_dividing", {50, 2, 4, 16, 12}, 7},
    {"seq_shorter_than_chunk", {20, 1, 2, 8, 8}, 64},
    {"qwen35_dims", {70, 1, 2, 128, 128}, 32},
    {"dv_over_block", {9, 1, 1, 8, 200}, 4},  // dv > 128: two column blocks in the forward
    {"empty", {0, 1, 2, 4, 4}, 8},
};

class LinearAttentionCuda : public ::testing::TestWithParam<Config> {
 protected:
  void SetUp() override {
    if (!gpu::device_available()) GTEST_SKIP() << "no usable CUDA device";
  }
};

TEST_P(LinearAttentionCuda, MatchesCpu) {
  Options o;
  o.chunk = GetParam().chunk;
  const Case c = make_case(GetParam().s, o, 301);
  const auto cpu = test::run_cpu(c);
  const auto gpu = run_cuda(c);
  EXPECT_TRUE(check_close("o", gpu.o, cpu.o, 1e-5, 1e-4));
  EXPECT_TRUE(check_close("state", gpu.state, cpu.state, 1e-5, 1e-4));
  EXPECT_TRUE(check_close("dq", gpu.dq, cpu.dq, 1e-4, 1e-3));
  EXPECT_TRUE(check_close("dk", gpu.dk, cpu.dk, 1e-4, 1e-3));
  EXPECT_TRUE(check_close("dv", gpu.dv, cpu.dv, 1e-4, 1e-3));
  EXPECT_TRUE(check_close("dg", gpu.dg, cpu.dg, 1e-4, 1e-3));
  EXPECT_TRUE(check_close("dbeta", gpu.dbeta, cpu.dbeta, 1e-4, 1e-3));
  EXPECT_TRUE(check_close("dS0", gpu.ds0, cpu.ds0, 1e-4, 1e-3));
}

INSTANTIATE_TEST_SUITE_P(Configs, LinearAttentionCuda, ::testing::ValuesIn(kConfigs),
                         [](const ::testing::TestParamInfo<Config>& i) { return std::string(i.param.name); });

TEST(LinearAttentionCudaConv, MatchesCpu) {
  if (!gpu::device_available()) GTEST_SKIP() << "no usable CUDA device";
  for (const bool silu : {true, false}) {
    const Conv c{37, 10, 4, silu};
    const auto x = lcplan::test::randn(size_t(c.s * c.channels), 401), hist = lcplan::test::randn(size_t(3 * c.channels), 402);
    const auto w = lcplan::test::randn(size_t(c.channels * c.kernel), 403, 0.5f), bias = lcplan::test::randn(size_t(c.channels), 404);
    const auto dy = lcplan::test::randn(x.size(), 405);
    std::vector<float> y(x.size()), dx(x.size()), dh(hist.size()), dw(w.size()), db(bias.size()), nh(hist.size());
    conv1d_forward_cpu(c, x.data(), hist.data(), w.data(), bias.data(), y.data());
    conv1d_backward_cpu(c, x.data(), hist.data(), w.data(), bias.data(), dy.data(), dx.data(), dh.data(), dw.data(), db.data());
    conv1d_next_history(c, x.data(), hist.data(), nh.data());
    lcplan::test::Stream st;
    DeviceFloats gx(x), gh(hist), gw(w), gb(bias), gdy(dy), gy(y.size()), gdx(dx.size()), gdh(dh.size()), gdw(dw.size()),
        gdb(db.size()), gnh(nh.size());
    cuda::conv1d_forward(c, gx.get(), gh.get(), gw.get(), gb.get(), gy.get(), st.get());
    cuda::conv1d_backward(c, gx.get(), gh.get(), gw.get(), gb.get(), gdy.get(), gdx.get(), gdh.get(), gdw.get(), gdb.get(),
                          st.get());
    cuda::conv1d_next_history(c, gx.get(), gh.get(), gnh.get(), st.get());
    EXPECT_TRUE(check_close("y", gy.fetch(), y, 1e-5, 1e-5));
    EXPECT_TRUE(check_close("dx", gdx.fetch(), dx, 1e-5, 1e-5));
    EXPECT_TRUE(check_close("d_history", gdh.fetch(), dh, 1e-5, 1e-5));
    EXPECT_TRUE(check_close("d_weight", gdw.fetch(), dw, 1e-5, 1e-5));
    EXPECT_TRUE(check_close("d_bias", gdb.fetch(), db, 1e-5, 1e-5));
    EXPECT_TRUE(check_close("next history", gnh.fetch(), nh, 0.0, 0.0));
  }
}

TEST(LinearAttentionCudaArgs, BadArgumentsThrowWithoutADevice) {
  Options o;
  float dummy = 0;
  EXPECT_THROW(cuda::forward({4, 2, 3, 4, 4}, &dummy, &dummy, &dummy, &dummy, &dummy, nullptr, &dummy, &dummy, o, nullptr),
               std::invalid_argument);
  EXPECT_THROW(cuda::forward({4, 1, 1, 4, 4}, &dummy, &dummy, &dummy, &dummy, &dummy, nullptr, &dummy, nullptr, o, nullptr),
               std::invalid_argument);  // the CUDA forward needs state_out
  EXPECT_THROW(cuda::backward({4, 1, 1, 4, 4}, &dummy, &dummy, &dummy, &dummy, &dummy, nullptr, &dummy, nullptr, &dummy,
                              &dummy, &dummy, &dummy, &dummy, nullptr, o, &dummy, 4, nullptr),
               std::invalid_argument);  // workspace too small
  EXPECT_THROW(cuda::conv1d_forward({4, 2, 0, true}, &dummy, nullptr, &dummy, nullptr, &dummy, nullptr),
               std::invalid_argument);
}

}  // namespace
}  // namespace lcplan::linear_attention
