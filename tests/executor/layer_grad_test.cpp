// Each decoder layer's backward (layers.h, host) against a central difference of its forward: f = <dout, layer(x)>
// along random directions of the input and of every weight tensor. The ops' backward passes have their own
// finite-difference tests (ops_test.cpp) and the paired tests hold layouts to one rank; this checks what neither does,
// the layers' orchestration (which tensor feeds which backward, the sums over heads and over MLA's shared rope key,
// the norms between projections), for full attention, Qwen3.5's gated attention and gated DeltaNet, and MLA with and
// without query compression, each with a dense MLP (MoE routing is piecewise constant: a difference across a routing
// flip is no derivative; the MoE layer has its own test, tests/moe GradientsMatchFiniteDifferences).
//
// The differenced forward is the layers' own code (executor/layers/) on HostOps with the bf16 rounding of intermediate
// tensors turned off: the rounding makes f a step function at the scale of a small step, while without it f is smooth
// to fp32 round-off. The gradient is the production backward (rounded), so the two differ by bf16-level amounts.
// Random directions, not the gradient's own: a gradient component that is missing (a dropped term) moves the
// derivative along a random direction but not along the gradient. Per tensor, three directions; the error
// |measured - predicted| over the three, relative to |measured|, is at most 5% (observed: 2.3% at most, the gated
// DeltaNet's input gradient, whose backward reads bf16-stored activations); dropping MLA's rope-key gradient or its
// kv-norm backward gives 13% and 25% on DeepSeek-V3's input gradient, 29% and 42% on Moonlight's.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "executor/layer_ops_host.h"
#include "executor/layers.h"
#include "executor/layers/decoder_layer.h"
#include "executor/param_store.h"
#include "executor/scale.h"
#include "kernels/comm/groups.h"
#include "tests/common/check.h"
#include "tests/executor/exec_util.h"

namespace lcplan::exec::tests {
namespace {

constexpr double kTol = 0.05;   // relative error over a tensor's three directions
constexpr double kStep = 0.01;  // displacement: 1% of the tensor's rms per element (before bf16 rounding)
constexpr int kDirections = 3;
constexpr int64_t kSeq = 128;

// HostOps without the rounding of intermediate tensors, residual sums and gated outputs to bf16 (stored tensors
// still round: the forward below keeps nothing).
struct SmoothOps : HostOps {
  void round(float*, size_t) {}
  void residual(const float* a, const float* b, float* out, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
  }
  void output_gate(const float* o, const float* gate, float* go, size_t n) {
    for (size_t i = 0; i < n; ++i) go[i] = math::output_gate_y(o[i], gate[i]);
  }
};

struct LayerCase {
  const char* name;
  const char* model;
  int layer;  // index in the model scaled to one layer of each kind
};

struct LayerSetup {
  comm::Comm mpi;
  comm::ProcessGroups pg;
  ModelSpec m;
  Dims d;
  std::vector<UnitLayout> units;
  int layer = 0;
  LayerSetup(const LayerCase& k) {
    mpi = comm::world_mpi();
    pg = comm::make_process_groups(mpi, make_rank_layout(1, 1, 1, 1, 1, 1));
    m = executor_case(zoo(k.model), make_plan(k.model, {.seq = 8192}), {64, 1}).model;
    layer = k.layer;
    m.layers[size_t(layer)].ffn = FfnKind::Dense;
    if (m.dense_ffn == 0) m.dense_ffn = 4 * m.hidden;
    d = make_dims(m);
    units = model_units(m, d);
  }
  ~LayerSetup() {
    comm::free_groups(pg);
    comm::free_comm(mpi);
  }
  const UnitLayout& unit() const { return units[size_t(1 + layer)]; }
  const LayerSpec& spec() const { return m.layers[size_t(layer)]; }
  Ctx ctx(Tracker& t) const {
    Ctx c{t, d, pg};
    c.seq = c.seq_local = c.chunk_len = c.tokens = c.rows = kSeq;
    return c;
  }
};

// f = <dout, layer(x)> by the smooth forward.
double smooth_f(const LayerSetup& s, const std::vector<bf16>& w, const std::vector<bf16>& x,
                const std::vector<float>& dout) {
  Tracker t(0);
  Ctx c = s.ctx(t);
  LayerSaved sv;
  sv.x = Buf<bf16>(t, Category::Activations, x.size());
  std::copy(x.begin(), x.end(), sv.x.data());
  std::vector<float> out(x.size());
  SmoothOps o{{t}};
  impl::layer_forward(o, c, s.unit(), UnitView{w.data(), nullptr}, s.spec(), Keep::InputOnly, sv, out.data());
  double f = 0;
  for (size_t i = 0; i < out.size(); ++i) f += double(dout[i]) * out[i];
  return f;
}

double rms(const float* v, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += double(v[i]) * v[i];
  return std::sqrt(s / double(std::max<size_t>(n, 1)));
}

class LayerGrad : public ::testing::TestWithParam<LayerCase> {};

TEST_P(LayerGrad, BackwardMatchesCentralDifferences) {
  const LayerCase& k = GetParam();
  const LayerSetup s(k);
  const UnitLayout& u = s.unit();
  ASSERT_EQ(u.n_expert, 0u);
  Tracker ts(0);
  ParamStore ps(ts, s.pg, s.units, OptimizerSharding::None, 7);
  const UnitView v0 = ps.view(1 + s.layer);
  const std::vector<bf16> w(v0.dense, v0.dense + u.n_dense);
  const size_t n = size_t(kSeq * s.d.H);
  const std::vector<float> xf = lcplan::test::randn(n, 11, 1.0f), dout = lcplan::test::randn(n, 12, 1.0f);
  std::vector<bf16> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = float_to_bf16(xf[i]);

  // The production forward and backward: the gradients under test.
  std::vector<float> dx(n), g(u.n_dense, 0.0f);
  {
    Tracker t(0);
    Ctx c = s.ctx(t);
    LayerSaved sv;
    sv.x = Buf<bf16>(t, Category::Activations, n);
    std::copy(x.begin(), x.end(), sv.x.data());
    std::vector<float> out(n);
    layer_forward(c, u, UnitView{w.data(), nullptr}, s.spec(), Keep::All, sv, out.data());
    layer_backward(c, u, UnitView{w.data(), nullptr}, UnitGrad{g.data(), nullptr}, s.spec(), Keep::All, sv,
                   dout.data(), dx.data());
  }

  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal;
  // Displaces `len` values from `off` of `base` (bf16) along random directions; returns the relative error.
  auto check = [&](bool input, size_t off, size_t len, const std::string& what) {
    const std::vector<bf16>& base = input ? x : w;
    const std::vector<float>& grad = input ? dx : g;
    std::vector<float> vals(len);
    for (size_t i = 0; i < len; ++i) vals[i] = bf16_to_float(base[off + i]);
    const double step = kStep * std::max(rms(vals.data(), len), 1e-2);
    double err2 = 0, meas2 = 0, pred2 = 0;
    for (int dir = 0; dir < kDirections; ++dir) {
      std::vector<bf16> plus = base, minus = base;
      double predicted = 0;
      for (size_t i = 0; i < len; ++i) {
        // An exactly symmetric displacement +-dv, both ends bf16 values: any asymmetry would leave second-order terms
        // in the difference, which along a random direction add up while the first-order ones partly cancel.
        const float p = bf16_to_float(float_to_bf16(float(vals[i] + step * normal(rng))));
        const float dv = p - vals[i], m = vals[i] - dv;
        if (bf16_to_float(float_to_bf16(m)) != m) continue;  // the other end is no bf16 value: leave this one
        plus[off + i] = float_to_bf16(p);
        minus[off + i] = float_to_bf16(m);
        predicted += double(grad[off + i]) * 2.0 * double(dv);
      }
      const double measured = input ? smooth_f(s, w, plus, dout) - smooth_f(s, w, minus, dout)
                                    : smooth_f(s, plus, x, dout) - smooth_f(s, minus, x, dout);
      err2 += (measured - predicted) * (measured - predicted);
      meas2 += measured * measured;
      pred2 += predicted * predicted;
    }
    EXPECT_GT(meas2, 0) << k.name << ": " << what << " does not move f";
    EXPECT_LE(std::sqrt(err2 / std::max(meas2, 1e-300)), kTol)
        << k.name << ": " << what << " (rms measured " << std::sqrt(meas2 / kDirections) << ", predicted "
        << std::sqrt(pred2 / kDirections) << ")";
  };
  check(true, 0, n, "input gradient");
  for (const TensorSpec& t : u.tensors) check(false, t.offset, t.size, "gradient of " + t.name);
}

// Scaled to one layer of each kind: Llama attention, Qwen3.5's gated DeltaNet and gated attention (q/k norm, partial
// RoPE, output gate), DeepSeek-V3's MLA with query compression, Moonlight's without, GLM-4.5's attention with q/k/v
// biases.
const LayerCase kCases[] = {
    {"llama_attention", "llama-3.1-8b", 0},        {"qwen_gated_deltanet", "qwen3.5-35b-a3b", 0},
    {"qwen_gated_attention", "qwen3.5-35b-a3b", 1}, {"deepseek_mla", "deepseek-v3", 0},
    {"moonlight_mla", "moonlight-16b-a3b", 0},      {"glm_attention_bias", "glm-4.5", 0},
};

INSTANTIATE_TEST_SUITE_P(Layers, LayerGrad, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace lcplan::exec::tests
