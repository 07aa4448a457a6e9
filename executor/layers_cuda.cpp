#include "executor/layers_cuda.h"

#include <algorithm>
#include <stdexcept>

#include "executor/layers/decoder_layer.h"
#include "executor/layers/embedding.h"
#include "executor/layers/loss.h"
#include "executor/ops_cuda.h"
#include "kernels/attention/attention_cuda.h"
#include "kernels/common/cuda_check.h"
#include "kernels/linear_attention/linear_attention_cuda.h"
#include "kernels/linear_ce/linear_ce_cuda.h"
#include "kernels/linear_ce/linear_ce_vocab_parallel_cuda.h"

namespace lcplan::exec::cuda {

namespace {

// Scratch for one call, charged to `cat` while the call's work is queued (freed in the stream's order).
DeviceBuf<float> scratch(Tracker& t, Category cat, size_t bytes) {
  return DeviceBuf<float>(t, cat, (bytes + sizeof(float) - 1) / sizeof(float));
}

}  // namespace

DeviceBuf<bf16> DeviceOps::save16(const float* x, size_t n) {
  DeviceBuf<bf16> b(tr, Category::Activations, n);
  cuda::to_bf16(x, b.data(), n, stream);
  return b;
}

DeviceBuf<float> DeviceOps::save32(const float* x, size_t n) {
  DeviceBuf<float> b(tr, Category::Activations, n);
  copy(x, n, b.data());
  return b;
}

DeviceBuf<float> DeviceOps::widen(const bf16* x, size_t n) {
  DeviceBuf<float> b = ws(n);
  cuda::to_f32(x, b.data(), n, stream);
  return b;
}

void DeviceOps::round(float* x, size_t n) { round_bf16_inplace(x, n, stream); }
void DeviceOps::add_bias(float* y, const bf16* b, int64_t rows, int64_t n) { cuda::add_bias(y, b, rows, n, stream); }
void DeviceOps::bias_bwd(const float* dy, int64_t rows, int64_t n, float* db) {
  cuda::bias_bwd(dy, rows, n, db, stream);
}
void DeviceOps::to_bf16(const float* x, bf16* y, size_t n) { cuda::to_bf16(x, y, n, stream); }
void DeviceOps::copy(const float* src, size_t n, float* dst) {
  if (n) CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
}
void DeviceOps::accumulate(const float* src, float* dst, size_t n) { add_inplace(src, dst, n, stream); }
void DeviceOps::residual(const float* a, const float* b, float* out, size_t n) { cuda::residual(a, b, out, n, stream); }

void DeviceOps::cols_out(const float* m, int64_t cols, int64_t r0, int64_t rows, int64_t c0, int64_t n, float* out) {
  if (rows == 0 || n == 0) return;
  CUDA_CHECK(cudaMemcpy2DAsync(out, size_t(n) * sizeof(float), m + r0 * cols + c0, size_t(cols) * sizeof(float),
                               size_t(n) * sizeof(float), size_t(rows), cudaMemcpyDeviceToDevice, stream));
}
void DeviceOps::cols_in(float* m, int64_t cols, int64_t r0, int64_t rows, int64_t c0, int64_t n, const float* in) {
  if (rows == 0 || n == 0) return;
  CUDA_CHECK(cudaMemcpy2DAsync(m + r0 * cols + c0, size_t(cols) * sizeof(float), in, size_t(n) * sizeof(float),
                               size_t(n) * sizeof(float), size_t(rows), cudaMemcpyDeviceToDevice, stream));
}

void DeviceOps::matmul(const float* x, const bf16* W, float* y, int64_t rows, int64_t k, int64_t n) {
  const size_t bytes = matmul_workspace_bytes(k, n);
  DeviceBuf<float> w = scratch(tr, Category::Workspace, bytes);
  cuda::matmul(handle, x, W, y, rows, k, n, w.data(), bytes, stream);
}

void DeviceOps::matmul_bwd(const float* x, const bf16* W, const float* dy, float* dx, float* dW, int64_t rows, int64_t k,
                           int64_t n) {
  const size_t bytes = matmul_workspace_bytes(k, n);
  DeviceBuf<float> w = scratch(tr, Category::Workspace, bytes);
  cuda::matmul_bwd(handle, x, W, dy, dx, dW, rows, k, n, false, w.data(), bytes, stream);
}

// Megatron RowParallelLinear with sequence parallelism: the fp32 partial sums over this rank's k columns,
// reduce-scattered over TP into this rank's rows (the host sums fp64 partials; here fp32, as Megatron does).
void DeviceOps::row_parallel(Ctx& c, const float* x, const bf16* W, float* y, int64_t k, int64_t n) {
  if (c.tp == 1) return matmul(x, W, y, c.tokens, k, n);
  DeviceBuf<float> partial = ws(size_t(c.tokens * n));
  matmul(x, W, partial.data(), c.tokens, k, n);
  comm::reduce_scatter(c.pg.tp, partial.data(), y, size_t(c.rows * n), comm::DType::F32, comm::ReduceOp::Sum);
}

// ColumnParallelLinear backward: dW += x_all^T dy; the input gradient, a partial sum over TP, reduce-scattered.
void DeviceOps::col_parallel_bwd(Ctx& c, const float* x_all, const bf16* W, const float* dy, float* dx, float* dW,
                                 int64_t k, int64_t n) {
  if (c.tp == 1) return matmul_bwd(x_all, W, dy, dx, dW, c.tokens, k, n);
  DeviceBuf<float> partial = ws(size_t(c.tokens * k));
  matmul_bwd(x_all, W, dy, partial.data(), dW, c.tokens, k, n);
  comm::reduce_scatter(c.pg.tp, partial.data(), dx, size_t(c.rows * k), comm::DType::F32, comm::ReduceOp::Sum);
}

void DeviceOps::rmsnorm(const float* x, const bf16* w, float* y, int64_t rows, int64_t h) {
  cuda::rmsnorm(x, w, y, rows, h, stream);
}
void DeviceOps::rmsnorm_bwd(const float* x, const bf16* w, const float* dy, float* dx, float* dw, int64_t rows,
                            int64_t h, bool accumulate_dx) {
  const size_t bytes = norm_bwd_workspace_bytes(rows);
  DeviceBuf<float> s = scratch(tr, Category::Workspace, bytes);
  cuda::rmsnorm_bwd(x, w, dy, dx, dw, rows, h, accumulate_dx, s.data(), bytes, stream);
}
void DeviceOps::output_gate(const float* o, const float* gate, float* go, size_t n) {
  cuda::output_gate(o, gate, go, n, stream);
}
void DeviceOps::output_gate_bwd(const float* dgo, const float* o, const float* gate, float* d_o, float* d_gate,
                                size_t n) {
  cuda::output_gate_bwd(dgo, o, gate, d_o, d_gate, n, stream);
}
void DeviceOps::swiglu_fwd(const float* h1, float* act, int64_t rows, int64_t f) {
  cuda::swiglu_fwd(h1, act, rows, f, stream);
}
void DeviceOps::swiglu_back(const float* h1, const float* dact, float* dh1, int64_t rows, int64_t f) {
  cuda::swiglu_back(h1, dact, dh1, rows, f, stream);
}
void DeviceOps::embedding_rows(const bf16* table, const int64_t* tokens, int64_t T, int64_t h, int64_t V0, int64_t Vl,
                               float* out) {
  cuda::embedding_rows(table, tokens, T, h, V0, Vl, out, stream);
}
void DeviceOps::embedding_rows_bwd(const int64_t* tokens, const float* dy, int64_t T, int64_t h, int64_t V0,
                                   int64_t Vl, float* g) {
  cuda::embedding_rows_bwd(tokens, dy, T, h, V0, Vl, g, stream);
}
// The whole table is this rank's shard (no TP): its rows widened and rounded back, which is exact.
void DeviceOps::embed_rows16(Ctx& c, const bf16* table, const int64_t* tokens, bf16* x) {
  const int64_t H = c.d.H;
  DeviceBuf<float> rows = ws(size_t(c.rows * H));
  cuda::embedding_rows(table, tokens, c.rows, H, 0, c.d.V, rows.data(), stream);
  cuda::to_bf16(rows.data(), x, rows.size(), stream);
}

void DeviceOps::rope(int64_t len, int64_t heads, int64_t hd, float* x, const attention::RopeOptions& o,
                     bool backward) {
  if (backward) attention::cuda::rope_backward(len, heads, hd, x, x, o, stream);
  else attention::cuda::rope_forward(len, heads, hd, x, x, o, stream);
}

void DeviceOps::attention_fwd(Ctx&, const attention::Shape& s, const float* q, const float* k, const float* v, float* o,
                              float* lse, const attention::Options& opt) {
  attention::cuda::forward(s, q, k, v, o, lse, opt, stream);
}

void DeviceOps::attention_bwd(Ctx&, const attention::Shape& s, const float* q, const float* k, const float* v,
                              const float* o, const float* lse, const float* d_o, float* dq, float* dk, float* dv,
                              const attention::Options& opt) {
  const size_t bytes = attention::cuda::backward_workspace_bytes(s);
  DeviceBuf<float> w = scratch(tr, Category::Workspace, bytes);
  attention::cuda::backward(s, q, k, v, o, lse, d_o, dq, dk, dv, opt, w.data(), bytes, stream);
}

double DeviceOps::cross_entropy(Ctx& c, const float* h, const float* W, const int64_t* targets, float gl, float* lse,
                                DeviceBuf<float>& dh, DeviceBuf<float>& dW) {
  const int64_t T = c.tokens, H = c.d.H, V = c.d.Vl;
  const bool vp = c.tp > 1;  // vocabulary-parallel LM head
  impl::CeCall ce = impl::ce_call(c);
  // Materialized logits: one fp32 tile of every local token by the whole shard, the [tokens x vocab / tp] logits
  // (Megatron's _VocabParallelCrossEntropy, the host's vocab_parallel_ce and forward_naive_cpu), and d_hidden an
  // ordinary activation gradient (workspace) as on the host.
  if (!c.linear_ce) ce.o.vocab_tile = V;
  const linear_ce::Problem& p = ce.p;
  const linear_ce::Options& o = ce.o;
  const auto F32 = linear_ce::DType::F32;
  const size_t bytes = linear_ce::cuda::workspace_bytes(p, F32, o);
  // The loss and the gradient scale live on the device for the kernels; one float each.
  DeviceBuf<float> scalars = ws(2);
  CUDA_CHECK(cudaMemcpyAsync(scalars.data() + 1, &gl, sizeof(float), cudaMemcpyHostToDevice, stream));
  {
    DeviceBuf<float> w = scratch(tr, Category::Logits, bytes);  // the kernel's tiles: the estimator's logits term
    if (vp)
      linear_ce::cuda::forward_vocab_parallel(c.pg.tp, handle, p, F32, h, W, targets, scalars.data(), lse, o, w.data(),
                                              bytes, stream);
    else
      linear_ce::cuda::forward(handle, p, F32, h, W, targets, scalars.data(), lse, o, w.data(), bytes, stream);
  }
  dh = DeviceBuf<float>(tr, c.linear_ce ? Category::Logits : Category::Workspace, size_t(T * H));
  dW = ws(size_t(V * H));
  {
    DeviceBuf<float> w = scratch(tr, Category::Logits, bytes);
    if (vp)
      linear_ce::cuda::backward_vocab_parallel(c.pg.tp, handle, p, F32, h, W, targets, lse, scalars.data() + 1,
                                               dh.data(), dW.data(), o, w.data(), bytes, stream);
    else
      linear_ce::cuda::backward(handle, p, F32, h, W, targets, lse, scalars.data() + 1, dh.data(), dW.data(), o,
                                w.data(), bytes, stream);
  }
  float loss = 0;
  CUDA_CHECK(cudaMemcpyAsync(&loss, scalars.data(), sizeof(float), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return loss;
}

void DeviceOps::gdn_gates(const float* proj, int64_t P, int64_t acol, int64_t bcol, const bf16* a_log,
                          const bf16* dt_bias, int64_t T, int64_t lv, float* gb) {
  cuda::gdn_gates(proj, P, acol, bcol, a_log, dt_bias, T, lv, gb, stream);
}
void DeviceOps::gdn_gates_bwd(const float* proj, int64_t P, int64_t acol, int64_t bcol, const bf16* a_log,
                              const bf16* dt_bias, const float* gb, const float* dg, const float* dbeta, int64_t r0,
                              int64_t n, int64_t lv, float* dproj, float* d_dt_bias, float* d_a_log) {
  cuda::gdn_gates_bwd(proj, P, acol, bcol, a_log, dt_bias, gb, dg, dbeta, r0, n, lv, dproj, d_dt_bias, d_a_log, stream);
}
void DeviceOps::gated_norm(const float* x, const float* z, const bf16* w, float* y, int64_t rows, int64_t heads,
                           int64_t dv) {
  cuda::gated_norm(x, z, w, y, rows, heads, dv, stream);
}
void DeviceOps::gated_norm_bwd(const float* x, const float* z, const bf16* w, const float* dy, float* dx, float* dz,
                               float* dw, int64_t rows, int64_t heads, int64_t dv) {
  const size_t bytes = norm_bwd_workspace_bytes(rows * heads);  // one normalised row per (token, head)
  DeviceBuf<float> s = scratch(tr, Category::Workspace, bytes);
  cuda::gated_norm_bwd(x, z, w, dy, dx, dz, dw, rows, heads, dv, s.data(), bytes, stream);
}
void DeviceOps::conv1d_fwd(const linear_attention::Conv& cv, const float* x, const float* hist, const float* w,
                           float* y) {
  linear_attention::cuda::conv1d_forward(cv, x, hist, w, nullptr, y, stream);
}
void DeviceOps::conv1d_history(const linear_attention::Conv& cv, const float* x, const float* hist, float* next) {
  linear_attention::cuda::conv1d_next_history(cv, x, hist, next, stream);
}
void DeviceOps::conv1d_bwd(const linear_attention::Conv& cv, const float* x, const float* hist, const float* w,
                           const float* dy, float* dx, float* d_hist, float* dw) {
  linear_attention::cuda::conv1d_backward(cv, x, hist, w, nullptr, dy, dx, d_hist, dw, nullptr, stream);
}
void DeviceOps::la_fwd(const linear_attention::Shape& s, const float* q, const float* k, const float* v,
                       const float* g, const float* beta, const float* state_in, float* o, float* state_out,
                       const linear_attention::Options& opt) {
  linear_attention::cuda::forward(s, q, k, v, g, beta, state_in, o, state_out, opt, stream);
}
void DeviceOps::la_bwd(const linear_attention::Shape& s, const float* q, const float* k, const float* v,
                       const float* g, const float* beta, const float* state_in, const float* d_o,
                       const float* d_state_out, float* dq, float* dk, float* dv, float* dg, float* dbeta,
                       float* d_state_in, const linear_attention::Options& opt) {
  const size_t bytes = linear_attention::cuda::backward_workspace_bytes(s, opt);
  DeviceBuf<float> w = scratch(tr, Category::Workspace, bytes);
  linear_attention::cuda::backward(s, q, k, v, g, beta, state_in, d_o, d_state_out, dq, dk, dv, dg, dbeta, d_state_in,
                                   opt, w.data(), bytes, stream);
}
// ---------------------------------------------------------------- the device instance of executor/layers/

void layer_forward(DeviceOps& o, Ctx& c, const UnitLayout& u, const UnitView& w, const LayerSpec& l, Keep keep,
                   DeviceLayerSaved& sv, float* out) {
  impl::layer_forward(o, c, u, w, l, keep, sv, out);
}

void layer_backward(DeviceOps& o, Ctx& c, const UnitLayout& u, const UnitView& w, const UnitGrad& g,
                    const LayerSpec& l, Keep keep, DeviceLayerSaved& sv, const float* dout, float* dx) {
  impl::layer_backward(o, c, u, w, g, l, keep, sv, dout, dx);
}

double loss_forward_backward(DeviceOps& o, Ctx& c, const bf16* fn_w, const bf16* head_w, float* fn_g, float* head_g,
                             const float* x, const int64_t* targets, double grad_scale, float* dx) {
  return impl::loss_forward_backward(o, c, fn_w, head_w, fn_g, head_g, x, targets, grad_scale, dx);
}

void embedding_forward(DeviceOps& o, Ctx& c, const bf16* table, const int64_t* tokens, bf16* x) {
  impl::embedding_forward(o, c, table, tokens, x);
}

void embedding_backward(DeviceOps& o, Ctx& c, const int64_t* tokens, const float* dx, float* g) {
  impl::embedding_backward(o, c, tokens, dx, g);
}

}  // namespace lcplan::exec::cuda
