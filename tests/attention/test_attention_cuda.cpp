// CUDA attention against the CPU implementation (same shapes and masks as the CPU tests, head dims up to 256), the
// device merge and RoPE. Skips itself without a usable device (CTest reports it skipped); argument checks, which
// throw before any CUDA call, run everywhere.
//
// Tolerances (CUDA fp32 vs CPU fp32, different summation orders): o, lse atol 1e-5 rtol 1e-4; gradients atol 1e-4
// rtol 1e-3; RoPE 1e-6.
#include <gtest/gtest.h>

#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/attention/attention_cuda.h"
#include "tests/attention/attention_harness.h"
#include "tests/attention/device_buffer.h"

namespace lcplan::attention {
namespace {

using lcplan::test::check_close;
using lcplan::test::DeviceFloats;
using test::Case;
using test::make_case;

test::Result<float> run_cuda(const Case& c) {
  const Shape& s = c.s;
  lcplan::test::Stream st;
  DeviceFloats q(c.q), k(c.k), v(c.v), d_o(c.d_o);
  DeviceFloats o(size_t(s.sq * s.hq * s.d)), lse(size_t(s.hq * s.sq)), dq(size_t(s.sq * s.hq * s.d));
  DeviceFloats dk(size_t(s.sk * s.hkv * s.d)), dv(size_t(s.sk * s.hkv * s.d));
  const size_t ws_bytes = cuda::backward_workspace_bytes(s);
  DeviceFloats ws(ws_bytes / sizeof(float));
  cuda::forward(s, q.get(), k.get(), v.get(), o.get(), lse.get(), c.o, st.get());
  cuda::backward(s, q.get(), k.get(), v.get(), o.get(), lse.get(), d_o.get(), dq.get(), dk.get(), dv.get(), c.o,
                 ws.get(), ws_bytes, st.get());
  CUDA_CHECK(cudaStreamSynchronize(st.get()));
  return {o.fetch(), lse.fetch(), dq.fetch(), dk.fetch(), dv.fetch()};
}

struct Config {
  const char* name;
  Shape s;
  bool causal;
  int64_t window, q_start, k_start;
};

const Config kConfigs[] = {
    {"full", {37, 101, 6, 2, 24}, false, 0, 0, 0},
    {"causal_cp_middle_chunk", {37, 101, 6, 2, 24}, true, 0, 60, 0},
    {"causal_rows_without_keys", {37, 101, 6, 2, 24}, true, 0, 30, 50},
    {"causal_window", {37, 101, 6, 2, 24}, true, 17, 60, 0},
    {"window_not_causal", {37, 101, 6, 2, 24}, false, 9, 40, 0},
    {"mqa_odd_d", {23, 31, 4, 1, 7}, true, 5, 10, 3},
    {"d128", {70, 90, 4, 2, 128}, true, 0, 20, 0},
    {"d256_qwen35_head", {40, 50, 4, 1, 256}, true, 0, 10, 0},  // > 48 KB shared memory: the opt-in path
    {"no_keys", {9, 0, 2, 1, 8}, true, 0, 0, 0},
};

class AttentionCuda : public ::testing::TestWithParam<Config> {
 protected:
  void SetUp() override {
    if (!gpu::device_available()) GTEST_SKIP() << "no usable CUDA device";
  }
};

TEST_P(AttentionCuda, MatchesCpu) {
  const Config& cfg = GetParam();
  Options o;
  o.causal = cfg.causal;
  o.window = cfg.window;
  o.q_start = cfg.q_start;
  o.k_start = cfg.k_start;
  o.q_tile = 9, o.k_tile = 14;
  const Case c = make_case(cfg.s, o, 31);
  const auto cpu = test::run_cpu(c);
  const auto gpu = run_cuda(c);
  EXPECT_TRUE(check_close("o", gpu.o, cpu.o, 1e-5, 1e-4));
  EXPECT_TRUE(check_close("lse", gpu.lse, cpu.lse, 1e-5, 1e-4));
  EXPECT_TRUE(check_close("dq", gpu.dq, cpu.dq, 1e-4, 1e-3));
  EXPECT_TRUE(check_close("dk", gpu.dk, cpu.dk, 1e-4, 1e-3));
  EXPECT_TRUE(check_close("dv", gpu.dv, cpu.dv, 1e-4, 1e-3));
}

INSTANTIATE_TEST_SUITE_P(Configs, AttentionCuda, ::testing::ValuesIn(kConfigs),
                         [](const ::testing::TestParamInfo<Config>& i) { return std::string(i.param.name); });

TEST(AttentionCudaOps, MergeAndRopeMatchCpu) {
  if (!gpu::device_available()) GTEST_SKIP() << "no usable CUDA device";
  const int64_t sq = 11, hq = 3, d = 16;
  auto oa = lcplan::test::randn(size_t(sq * hq * d), 41), ob = lcplan::test::randn(size_t(sq * hq * d), 42);
  auto la = lcplan::test::randn(size_t(sq * hq), 43), lb = lcplan::test::randn(size_t(sq * hq), 44);
  la[0] = -std::numeric_limits<float>::infinity();
  la[1] = lb[1] = -std::numeric_limits<float>::infinity();
  std::vector<float> o_cpu(oa.size()), l_cpu(la.size());
  merge_partials(sq, hq, d, oa.data(), la.data(), ob.data(), lb.data(), o_cpu.data(), l_cpu.data());
  lcplan::test::Stream st;
  DeviceFloats doa(oa), dla(la), dob(ob), dlb(lb);
  cuda::merge_partials(sq, hq, d, doa.get(), dla.get(), dob.get(), dlb.get(), doa.get(), dla.get(), st.get());  // in place
  EXPECT_TRUE(check_close("merged o", doa.fetch(), o_cpu, 1e-6, 1e-6));
  EXPECT_TRUE(check_close("merged lse", dla.fetch(), l_cpu, 1e-6, 1e-6));

  RopeOptions r;
  r.rotary_dim = 8;
  r.theta = 1e7f;
  r.start = 123456;
  const auto x = lcplan::test::randn(size_t(sq * hq * d), 45);
  std::vector<float> y(x.size()), gx(x.size());
  rope_forward_cpu(sq, hq, d, x.data(), y.data(), r);
  rope_backward_cpu(sq, hq, d, x.data(), gx.data(), r);
  DeviceFloats dx(x), dy(x.size()), dg(x);
  cuda::rope_forward(sq, hq, d, dx.get(), dy.get(), r, st.get());
  cuda::rope_backward(sq, hq, d, dg.get(), dg.get(), r, st.get());  // in place
  EXPECT_TRUE(check_close("rope", dy.fetch(), y, 1e-6, 1e-6));
  EXPECT_TRUE(check_close("rope backward", dg.fetch(), gx, 1e-6, 1e-6));
}

// Host-side checks throw before touching a device, so they run on every machine.
TEST(AttentionCudaArgs, BadArgumentsThrowWithoutADevice) {
  const Shape bad{4, 4, 3, 2, 8};
  EXPECT_THROW(cuda::forward(bad, nullptr, nullptr, nullptr, nullptr, nullptr, Options{}, nullptr),
               std::invalid_argument);
  const Shape ok{4, 4, 2, 1, 8};
  EXPECT_THROW(cuda::forward(ok, nullptr, nullptr, nullptr, nullptr, nullptr, Options{}, nullptr),
               std::invalid_argument);
  float dummy = 0;
  EXPECT_THROW(cuda::backward(ok, &dummy, &dummy, &dummy, &dummy, &dummy, &dummy, &dummy, &dummy, &dummy, Options{},
                              &dummy, 1, nullptr),
               std::invalid_argument);  // workspace too small
  RopeOptions r;
  r.rotary_dim = 3;
  EXPECT_THROW(cuda::rope_forward(2, 1, 8, &dummy, &dummy, r, nullptr), std::invalid_argument);
}

}  // namespace
}  // namespace lcplan::attention
