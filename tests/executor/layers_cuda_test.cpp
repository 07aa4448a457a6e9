// The GPU backend's decoder layers (executor/layers_cuda.h) against the host layers (layers.h) on the same weights and
// inputs: one rank, one GPU. A full-attention + SwiGLU layer (plain, and gated with q/k norm, partial RoPE and a
// sliding window), a gated DeltaNet + SwiGLU layer and Qwen3.5's gated DeltaNet + MoE layer (routed experts in two EP
// chunks, the gated shared expert) forward and backward under every recompute mode, the loss
// (linear CE and materialized logits) and the embedding; and DeepSeek-V3's MLA layer. Both run
// executor/layers/, so the test checks the device ops and kernels in place and that the device layer saves the same
// activation bytes; skips itself without a usable device.
//
// Tolerances: the host GEMMs accumulate in fp64, the device's in fp32, and every stored tensor is rounded to bf16, so
// a rounding difference can flip a bf16 ulp (2^-8 relative) that later ops carry on. Whole tensors are compared by
// relative norm, ||device - host|| / ||host|| < 2e-2; the loss within 1e-3 relative; the embedding exactly.
#include <gtest/gtest.h>

#include <cublas_v2.h>

#include <cmath>
#include <string>
#include <vector>

#include "executor/device_buf_cuda.h"
#include "executor/executor_cuda.h"
#include "executor/layers.h"
#include "executor/layers_cuda.h"
#include "executor/ops.h"
#include "executor/param_store.h"
#include "executor/scale.h"
#include "kernels/comm/groups.h"
#include "tests/common/check.h"
#include "tests/comm/gpu_ranks.h"
#include "tests/executor/exec_util.h"

namespace lcplan::exec::tests {
namespace {

constexpr double kRelNorm = 2e-2;

double rel_norm(const std::vector<float>& got, const std::vector<float>& want) {
  double d = 0, w = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    d += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    w += double(want[i]) * want[i];
  }
  return std::sqrt(d / std::max(w, 1e-300));
}

template <class T>
std::vector<T> download(const T* d, size_t n) {
  std::vector<T> h(n);
  // cudaMemcpy runs on the legacy stream, which the non-blocking stream_ does not order against: wait for its kernels
  // (compute-sanitizer's slower kernels exposed the race on an H200, 2026-11-27).
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

template <class T>
cuda::DeviceBuf<T> upload(Tracker& t, Category c, const T* h, size_t n) {
  cuda::DeviceBuf<T> d(t, c, n);
  CUDA_CHECK(cudaMemcpy(d.data(), h, n * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

std::vector<float> bf16_values(size_t n, uint64_t seed, float scale) {
  std::vector<float> x = lcplan::test::randn(n, seed, scale);
  round_bf16_inplace(x.data(), x.size());
  return x;
}

// The layer a case runs: Llama's attention, Qwen3.5's gated attention or gated DeltaNet (with a SwiGLU MLP), or
// Qwen3.5's gated DeltaNet with its MoE FFN, or DeepSeek-V3's MLA.
enum class Mixer { Llama, GatedAttention, GatedDeltaNet, GatedDeltaNetMoe, Mla };
constexpr Mixer kMixers[] = {Mixer::Llama, Mixer::GatedAttention, Mixer::GatedDeltaNet, Mixer::GatedDeltaNetMoe,
                             Mixer::Mla};
constexpr int kMoeChunks = 2;  // EP chunks of the MoE case (one rank: the chunks split its tokens)

// The model a case runs: Llama-3.1-8B scaled by 32 to one layer, with Qwen3.5's attention features or its gated
// DeltaNet (Qwen3.5-35B-A3B's, scaled the same way) in place of the attention.
ModelSpec case_model(Mixer mixer) {
  if (mixer == Mixer::Mla)  // DeepSeek-V3's first layer: MLA with query compression, a dense MLP
    return executor_case(zoo("deepseek-v3"), make_plan("deepseek-v3", {.seq = 8192}), {32, 1}).model;
  Plan p = make_plan("llama-3.1-8b", {.seq = 8192});
  ModelSpec m = executor_case(zoo("llama-3.1-8b"), p, {32, 1}).model;
  if (mixer == Mixer::GatedDeltaNet || mixer == Mixer::GatedDeltaNetMoe) {
    const Plan qp = make_plan("qwen3.5-35b-a3b", {.seq = 8192});
    const ModelSpec q = executor_case(zoo("qwen3.5-35b-a3b"), qp, {32, 1}).model;
    m.linear = q.linear;
    m.layers[0].mixer = MixerKind::LinearAttention;
    if (mixer == Mixer::GatedDeltaNetMoe) {
      m.moe = q.moe;
      m.layers[0].ffn = FfnKind::MoE;
    }
  }
  if (mixer == Mixer::GatedAttention) {
    m.attn.output_gate = true;
    m.attn.qk_norm = true;
    m.attn.partial_rotary = 0.25;
    m.attn.sliding_window = 64;
    m.layers[0].sliding = true;
  }
  return m;
}

class LayersCuda : public ::testing::Test {
 public:
  static Ctx ctx(Tracker& t, const Dims& d, const comm::ProcessGroups& pg, int64_t seq) {
    Ctx c{t, d, pg};
    c.seq = seq;
    c.seq_local = seq;
    c.chunk_len = seq;
    c.tokens = seq;
    c.rows = seq;
    c.linear_ce = true;
    c.ce_vocab_tile = 256;
    c.sched = moe::make_chunk_schedule(kMoeChunks, {}, d.moe.shared_ffn > 0);
    return c;
  }

 protected:
  void SetUp() override {
    skip_ = lcplan::test::gpu_skip_reason();
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    lcplan::test::pick_device();
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&blas_));
    CUBLAS_CHECK(cublasSetStream(blas_, stream_));
    mpi_ = comm::world_mpi();
    nccl_ = comm::world_nccl(stream_);
    const RankLayout layout = make_rank_layout(1, 1, 1, 1, 1, 1);
    host_pg_ = comm::make_process_groups(mpi_, layout);
    dev_pg_ = comm::make_process_groups(nccl_, layout);
  }
  void TearDown() override {
    if (!skip_.empty()) return;
    comm::free_groups(host_pg_);
    comm::free_groups(dev_pg_);
    comm::free_comm(nccl_);
    comm::free_comm(mpi_);
    CUBLAS_LOG(cublasDestroy(blas_));
    CUDA_LOG(cudaStreamDestroy(stream_));
  }
  std::string skip_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  comm::Comm mpi_, nccl_;
  comm::ProcessGroups host_pg_, dev_pg_;
};

constexpr int64_t kSeq = 256;
const Keep kKeeps[] = {Keep::All, Keep::Selective, Keep::InputOnly};

std::string case_name(Mixer mixer, Keep keep) {
  const char* name = mixer == Mixer::Llama            ? "llama attention"
                     : mixer == Mixer::GatedAttention ? "gated attention"
                     : mixer == Mixer::GatedDeltaNet  ? "gated DeltaNet"
                     : mixer == Mixer::Mla            ? "MLA"
                                                      : "gated DeltaNet + MoE";
  return std::string(name) + ", keep " + std::to_string(int(keep));
}

// One layer's forward and backward on the host: the reference of the device run, from the same weights and inputs.
struct HostRun {
  std::vector<bf16> x16;
  std::vector<float> dout, out, dx, grad, expert_grad;
  double saved_bytes = 0;  // activations the forward kept
};
HostRun host_layer(const comm::ProcessGroups& pg, const ModelSpec& m, Keep keep, ParamStore& ps, Tracker& th) {
  const Dims d = make_dims(m);
  const UnitLayout& u = ps.units()[1];  // the decoder layer
  Ctx c = LayersCuda::ctx(th, d, pg, kSeq);
  const size_t n = size_t(kSeq * d.H);
  HostRun r;
  const std::vector<float> x = bf16_values(n, 11, 1.0f);
  r.dout = bf16_values(n, 12, 1e-2f);
  r.x16.resize(n);
  to_bf16(x.data(), r.x16.data(), n);
  LayerSaved sv;
  sv.x = Buf<bf16>(th, Category::Activations, n);
  std::copy(r.x16.begin(), r.x16.end(), sv.x.data());
  r.out.resize(n);
  r.dx.resize(n);
  r.grad.assign(u.n_dense, 0.0f);
  r.expert_grad.assign(u.n_expert, 0.0f);
  layer_forward(c, u, ps.view(1), m.layers[0], keep, sv, r.out.data());
  r.saved_bytes = th.live(Category::Activations);
  layer_backward(c, u, ps.view(1), UnitGrad{r.grad.data(), u.n_expert ? r.expert_grad.data() : nullptr}, m.layers[0],
                 keep, sv, r.dout.data(), r.dx.data());
  return r;
}

TEST_F(LayersCuda, LayerForwardAndBackwardMatchTheHost) {
  for (Mixer mixer : kMixers)
    for (Keep keep : kKeeps) {
      const std::string what = case_name(mixer, keep);
      const ModelSpec m = case_model(mixer);
      const Dims d = make_dims(m);
      Tracker th(0), td(0);
      ParamStore ps(th, host_pg_, model_units(m, d), OptimizerSharding::None, 7);
      const HostRun h = host_layer(host_pg_, m, keep, ps, th);
      const UnitLayout& u = ps.units()[1];
      cuda::DeviceBuf<bf16> wdev = upload(td, Category::Params, ps.view(1).dense, u.n_dense);
      cuda::DeviceBuf<bf16> edev = upload(td, Category::Params, ps.view(1).expert, u.n_expert);
      const UnitView wv{wdev.data(), u.n_expert ? edev.data() : nullptr};
      Ctx cd = ctx(td, d, dev_pg_, kSeq);
      const size_t n = h.x16.size();
      cuda::DeviceOps o{td, blas_, stream_};
      cuda::DeviceLayerSaved sd;
      sd.x = upload(td, Category::Activations, h.x16.data(), n);
      cuda::DeviceBuf<float> out_d(td, Category::Workspace, n), dx_d(td, Category::Workspace, n);
      cuda::DeviceBuf<float> g_d(td, Category::Grads, u.n_dense), ge_d(td, Category::Grads, u.n_expert);
      cuda::DeviceBuf<float> dout_d = upload(td, Category::Workspace, h.dout.data(), n);
      cuda::layer_forward(o, cd, u, wv, m.layers[0], keep, sd, out_d.data());
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      EXPECT_EQ(td.live(Category::Activations), h.saved_bytes) << what << ": the device layer saves other bytes";
      cuda::layer_backward(o, cd, u, wv, UnitGrad{g_d.data(), u.n_expert ? ge_d.data() : nullptr}, m.layers[0], keep,
                           sd, dout_d.data(), dx_d.data());
      CUDA_CHECK(cudaStreamSynchronize(stream_));

      EXPECT_LT(rel_norm(download(out_d.data(), n), h.out), kRelNorm) << what << ": layer output";
      EXPECT_LT(rel_norm(download(dx_d.data(), n), h.dx), kRelNorm) << what << ": input gradient";
      EXPECT_LT(rel_norm(download(g_d.data(), u.n_dense), h.grad), kRelNorm) << what << ": weight gradients";
      if (u.n_expert) {
        EXPECT_LT(rel_norm(download(ge_d.data(), u.n_expert), h.expert_grad), kRelNorm) << what << ": expert gradients";
      }
      EXPECT_EQ(td.live(Category::Activations), 0) << what << ": backward frees the saved tensors";
    }
}

// The host half of every case, which runs everywhere: the reference the device is held to is a real layer step (every
// recompute mode computes the same values, the gradients are not zero) and not an empty comparison.
TEST(LayersCudaReference, HostCasesRunAndAgreeAcrossRecomputeModes) {
  comm::Comm mpi = comm::world_mpi();
  comm::ProcessGroups pg = comm::make_process_groups(mpi, make_rank_layout(1, 1, 1, 1, 1, 1));
  for (Mixer mixer : kMixers) {
    const ModelSpec m = case_model(mixer);
    std::vector<HostRun> runs;
    for (Keep keep : kKeeps) {
      Tracker th(0);
      ParamStore ps(th, pg, model_units(m, make_dims(m)), OptimizerSharding::None, 7);
      runs.push_back(host_layer(pg, m, keep, ps, th));
      double g2 = 0;
      for (float g : runs.back().grad) g2 += double(g) * g;
      EXPECT_GT(g2, 0) << case_name(mixer, keep);
    }
    for (size_t k = 1; k < runs.size(); ++k) {
      EXPECT_EQ(runs[k].out, runs[0].out) << case_name(mixer, kKeeps[k]);
      EXPECT_EQ(runs[k].dx, runs[0].dx) << case_name(mixer, kKeeps[k]);
      EXPECT_EQ(runs[k].grad, runs[0].grad) << case_name(mixer, kKeeps[k]);
      EXPECT_EQ(runs[k].expert_grad, runs[0].expert_grad) << case_name(mixer, kKeeps[k]);
    }
    EXPECT_GT(runs[0].saved_bytes, runs[2].saved_bytes);  // full recompute keeps only the input
  }
  comm::free_groups(pg);
  comm::free_comm(mpi);
}

TEST_F(LayersCuda, LossAndEmbeddingMatchTheHost) {
  const ModelSpec m = case_model(Mixer::Llama);
  const Dims d = make_dims(m);
  Tracker th(0), td(0);
  ParamStore ps(th, host_pg_, model_units(m, d), OptimizerSharding::None, 7);
  const std::vector<UnitLayout>& units = ps.units();
  const size_t emb = 0, fn = units.size() - 2, head = units.size() - 1;
  Ctx ch = ctx(th, d, host_pg_, kSeq), cd = ctx(td, d, dev_pg_, kSeq);
  cuda::DeviceOps o{td, blas_, stream_};
  const size_t n = size_t(kSeq * d.H);
  std::vector<int64_t> tokens(kSeq), targets(kSeq);
  for (int64_t t = 0; t < kSeq; ++t) {
    tokens[size_t(t)] = (t * 7919) % d.V;
    targets[size_t(t)] = (t * 104729 + 3) % d.V;
  }
  cuda::DeviceBuf<int64_t> tok_d = upload(td, Category::Workspace, tokens.data(), tokens.size());
  cuda::DeviceBuf<int64_t> tgt_d = upload(td, Category::Workspace, targets.data(), targets.size());

  // embedding: rows copied exactly, their gradient scatter-added in token order
  const UnitView ew = ps.view(int(emb));
  cuda::DeviceBuf<bf16> table = upload(td, Category::Params, ew.dense, units[emb].n_dense);
  std::vector<bf16> x_h(n);
  embedding_forward(ch, ew.dense, tokens.data(), x_h.data());
  cuda::DeviceBuf<bf16> x_d(td, Category::Activations, n);
  cuda::embedding_forward(o, cd, table.data(), tok_d.data(), x_d.data());
  const std::vector<bf16> x_back = download(x_d.data(), n);
  size_t differ = 0;
  for (size_t i = 0; i < n; ++i) differ += x_back[i].bits != x_h[i].bits;
  EXPECT_EQ(differ, 0u) << "embedding rows";
  const std::vector<float> dy = bf16_values(n, 21, 1e-2f);
  std::vector<float> ge_h(units[emb].n_dense, 0.0f);
  embedding_backward(ch, tokens.data(), dy.data(), ge_h.data());
  cuda::DeviceBuf<float> dy_d = upload(td, Category::Workspace, dy.data(), n);
  cuda::DeviceBuf<float> ge_d(td, Category::Grads, units[emb].n_dense);
  cuda::embedding_backward(o, cd, tok_d.data(), dy_d.data(), ge_d.data());
  EXPECT_LT(rel_norm(download(ge_d.data(), ge_h.size()), ge_h), 1e-6) << "embedding gradient";

  // loss: final norm, LM head, linear CE (then materialized logits: one tile of the whole vocabulary) and their
  // backward
  for (bool linear : {true, false}) {
    SCOPED_TRACE(linear ? "linear CE" : "materialized logits");
    ch.linear_ce = cd.linear_ce = linear;
    const std::vector<float> x = bf16_values(n, 22, 1.0f);
    const double scale = 1.0 / double(kSeq);
    std::vector<float> dx_h(n), fg_h(units[fn].n_dense, 0.0f), hg_h(units[head].n_dense, 0.0f);
    const double loss_h = loss_forward_backward(ch, ps.view(int(fn)).dense, ps.view(int(head)).dense, fg_h.data(),
                                                hg_h.data(), x.data(), targets.data(), scale, dx_h.data());
    cuda::DeviceBuf<bf16> fw = upload(td, Category::Params, ps.view(int(fn)).dense, units[fn].n_dense);
    cuda::DeviceBuf<bf16> hw = upload(td, Category::Params, ps.view(int(head)).dense, units[head].n_dense);
    cuda::DeviceBuf<float> x_dev = upload(td, Category::Workspace, x.data(), n), dx_d(td, Category::Workspace, n);
    cuda::DeviceBuf<float> fg_d(td, Category::Grads, units[fn].n_dense), hg_d(td, Category::Grads, units[head].n_dense);
    const double loss_d = cuda::loss_forward_backward(o, cd, fw.data(), hw.data(), fg_d.data(), hg_d.data(),
                                                      x_dev.data(), tgt_d.data(), scale, dx_d.data());
    EXPECT_NEAR(loss_d, loss_h, 1e-3 * std::abs(loss_h)) << "summed loss";
    EXPECT_LT(rel_norm(download(dx_d.data(), n), dx_h), kRelNorm) << "loss input gradient";
    EXPECT_LT(rel_norm(download(fg_d.data(), fg_h.size()), fg_h), kRelNorm) << "final-norm gradient";
    EXPECT_LT(rel_norm(download(hg_d.data(), hg_h.size()), hg_h), kRelNorm) << "LM-head gradient";
  }
}

}  // namespace
}  // namespace lcplan::exec::tests
