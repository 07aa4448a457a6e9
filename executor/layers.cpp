#include "executor/layers.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include <Eigen/Core>

#include "executor/layer_ops_host.h"
#include "executor/layers/decoder_layer.h"
#include "executor/layers/embedding.h"
#include "executor/layers/loss.h"
#include "executor/ops.h"
#include "executor/ops_math.h"
#include "kernels/attention/attention.h"
#include "kernels/linear_ce/linear_ce.h"
#include "kernels/linear_ce/linear_ce_vocab_parallel.h"

namespace lcplan::exec {

int64_t Ctx::chunk_start(int ch) const { return cp == 1 ? 0 : impl::cp_chunk_pos(*this, cp_rank, ch); }

namespace {

using WS = Buf<float>;

// The host ops' workspace (layer_ops_host.h) for the host-only code below, which holds a Ctx rather than an Ops.
WS ws(Ctx& c, size_t n) { return HostOps{c.tr}.ws(n); }

// ---------------------------------------------------------------- tensor and sequence parallelism (Megatron)

// Sequence-parallel reduce-scatter (Megatron reduce_scatter_to_sequence_parallel_region) of fp64 partial sums of the
// executor's GEMMs (ops.h) [tokens x w]: reduced over TP in fp64, this rank's rows rounded once to fp32 into out.
void sp_reduce_scatter64(Ctx& c, const double* partial, float* out, int64_t w) {
  Buf<double> mine(c.tr, Category::Workspace, size_t(c.rows * w));
  comm::reduce_scatter(c.pg.tp, partial, mine.data(), mine.size(), comm::DType::F64, comm::ReduceOp::Sum);
  for (size_t i = 0; i < mine.size(); ++i) out[i] = float(mine[i]);
}

// Row-parallel GEMM (Megatron RowParallelLinear with sequence parallelism): y [rows x n] = the TP sum of x [tokens x
// k] (this rank's k columns) times W [k x n] (this rank's k rows).
void row_parallel(Ctx& c, const float* x, const bf16* W, float* y, int64_t k, int64_t n) {
  if (c.tp == 1) return matmul(c.tr, x, W, y, c.tokens, k, n);
  Buf<double> partial(c.tr, Category::Workspace, size_t(c.tokens * n));
  matmul64(c.tr, x, W, partial.data(), c.tokens, k, n);
  sp_reduce_scatter64(c, partial.data(), y, n);
}

// Column-parallel GEMM backward (Megatron ColumnParallelLinear with sequence parallelism): x_all [tokens x k] is the
// all-gathered input, dy [tokens x n] this rank's columns; dW += x_all^T dy, and the input gradient dy W^T, a partial
// sum over TP, reduce-scattered into dx [rows x k].
void col_parallel_bwd(Ctx& c, const float* x_all, const bf16* W, const float* dy, float* dx, float* dW, int64_t k,
                      int64_t n) {
  if (c.tp == 1) return matmul_bwd(c.tr, x_all, W, dy, dx, dW, c.tokens, k, n);
  Buf<double> partial(c.tr, Category::Workspace, size_t(c.tokens * k));
  matmul_bwd64(c.tr, x_all, W, dy, partial.data(), dW, c.tokens, k, n);
  sp_reduce_scatter64(c, partial.data(), dx, k);
}

// ---------------------------------------------------------------- the loss

// Materialized cross-entropy over a vocabulary shard (Megatron-LM megatron/core/tensor_parallel/cross_entropy.py,
// _VocabParallelCrossEntropy): fp32 logits [tokens x vocab/tp], the row maximum, the sum of exponentials and the
// target logit each all-reduced over TP; the gradient softmax - onehot replaces the logits in the same buffer, as the
// single-rank path holds one fp32 tokens x vocab buffer at a time (the estimator's logits term).
double vocab_parallel_ce(Ctx& c, const float* h, const float* W, const int64_t* targets, float gl, float* lse,
                         float* dh, float* dW) {
  const int64_t T = c.tokens, H = c.d.H, V = c.d.Vl, V0 = c.d.V0;
  Buf<float> lg(c.tr, Category::Logits, size_t(T * V));
  Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> L(lg.data(), T, V);
  using CMap = Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
  L.noalias() = CMap(h, T, H) * CMap(W, V, H).transpose();
  WS mx = ws(c, size_t(T)), st = ws(c, size_t(2 * T));  // per token: max; sum of exp, target logit
  for (int64_t t = 0; t < T; ++t) mx[size_t(t)] = *std::max_element(lg.data() + t * V, lg.data() + (t + 1) * V);
  comm::all_reduce(c.pg.tp, mx.data(), size_t(T), comm::DType::F32, comm::ReduceOp::Max);
  for (int64_t t = 0; t < T; ++t) {
    float se = 0.0f;
    for (int64_t v = 0; v < V; ++v) se += std::exp(lg[size_t(t * V + v)] - mx[size_t(t)]);
    st[size_t(t)] = se;
    const int64_t y = targets[t] - V0;
    st[size_t(T + t)] = y >= 0 && y < V ? lg[size_t(t * V + y)] : 0.0f;
  }
  comm::all_reduce(c.pg.tp, st.data(), size_t(2 * T), comm::DType::F32, comm::ReduceOp::Sum);
  double loss = 0;
  for (int64_t t = 0; t < T; ++t) {
    lse[t] = mx[size_t(t)] + std::log(st[size_t(t)]);
    loss += linear_ce::token_loss(lse[t], st[size_t(T + t)], 0.0f);
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t v = 0; v < V; ++v)
      lg[size_t(t * V + v)] = linear_ce::logit_grad(lg[size_t(t * V + v)], lse[t], v + V0 == targets[t], gl, 0.0f, 0.0f);
  Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(dh, T, H).noalias() =
      L * CMap(W, V, H);
  comm::all_reduce(c.pg.tp, dh, size_t(T * H), comm::DType::F32, comm::ReduceOp::Sum);  // d_hidden: summed over shards
  Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(dW, V, H).noalias() =
      L.transpose() * CMap(h, T, H);
  return loss;
}

}  // namespace

// ---------------------------------------------------------------- HostOps (layer_ops_host.h)

void HostOps::row_parallel(Ctx& c, const float* x, const bf16* W, float* y, int64_t k, int64_t n) {
  exec::row_parallel(c, x, W, y, k, n);
}
void HostOps::col_parallel_bwd(Ctx& c, const float* x_all, const bf16* W, const float* dy, float* dx, float* dW,
                               int64_t k, int64_t n) {
  exec::col_parallel_bwd(c, x_all, W, dy, dx, dW, k, n);
}

void HostOps::attention_fwd(Ctx& c, const attention::Shape& s, const float* q, const float* k, const float* v, float* o,
                            float* lse, const attention::Options& opt) {
  attention::Stats st;
  attention::forward_cpu(s, q, k, v, o, lse, opt, &st);
  Tracker::Charge scratch(c.tr, Category::Workspace, double(st.peak_extra_bytes));
}

void HostOps::attention_bwd(Ctx& c, const attention::Shape& s, const float* q, const float* k, const float* v,
                            const float* o, const float* lse, const float* d_o, float* dq, float* dk, float* dv,
                            const attention::Options& opt) {
  attention::Stats st;
  attention::backward_cpu(s, q, k, v, o, lse, d_o, dq, dk, dv, opt, &st);
  Tracker::Charge scratch(c.tr, Category::Workspace, double(st.peak_extra_bytes));
}

double HostOps::cross_entropy(Ctx& c, const float* h, const float* W, const int64_t* targets, float gl, float* lse,
                              Buf<float>& dh, Buf<float>& dW) {
  const int64_t T = c.tokens, H = c.d.H, V = c.d.Vl;
  const bool vp = c.tp > 1;  // vocabulary-parallel LM head
  const impl::CeCall ce = impl::ce_call(c);
  const linear_ce::Problem& p = ce.p;
  const linear_ce::Options& o = ce.o;
  float loss = 0;
  linear_ce::Stats st;
  const auto F32 = linear_ce::DType::F32;
  if (c.linear_ce) {
    if (vp) linear_ce::forward_vocab_parallel_cpu(c.pg.tp, p, F32, h, W, targets, &loss, lse, o, &st);
    else linear_ce::forward_cpu(p, F32, h, W, targets, &loss, lse, o, &st);
    { Tracker::Charge scratch(c.tr, Category::Logits, double(st.peak_extra_bytes)); }
    dh = Buf<float>(c.tr, Category::Logits, size_t(T * H));
    dW = ws(size_t(V * H));
    if (vp)
      linear_ce::backward_vocab_parallel_cpu(c.pg.tp, p, F32, h, W, targets, lse, &gl, dh.data(), dW.data(), o, &st);
    else
      linear_ce::backward_cpu(p, F32, h, W, targets, lse, &gl, dh.data(), dW.data(), o, &st);
    { Tracker::Charge scratch(c.tr, Category::Logits, double(st.peak_extra_bytes)); }
  } else if (vp) {
    dh = Buf<float>(c.tr, Category::Workspace, size_t(T * H));
    dW = ws(size_t(V * H));
    loss = float(vocab_parallel_ce(c, h, W, targets, gl, lse, dh.data(), dW.data()));
  } else {
    linear_ce::forward_naive_cpu(p, F32, h, W, targets, &loss, lse, o, &st);
    { Tracker::Charge scratch(c.tr, Category::Logits, double(st.peak_extra_bytes)); }
    dh = Buf<float>(c.tr, Category::Workspace, size_t(T * H));
    dW = ws(size_t(V * H));
    linear_ce::backward_naive_cpu(p, F32, h, W, targets, lse, &gl, dh.data(), dW.data(), o, &st);
    { Tracker::Charge scratch(c.tr, Category::Logits, double(st.peak_extra_bytes)); }
  }
  return loss;
}

// ---------------------------------------------------------------- layers.h: the host instance of executor/layers/

void layer_forward(Ctx& c, const UnitLayout& u, const UnitView& w, const LayerSpec& l, Keep keep, LayerSaved& sv,
                   float* out) {
  HostOps o{c.tr};
  impl::layer_forward(o, c, u, w, l, keep, sv, out);
}

void layer_backward(Ctx& c, const UnitLayout& u, const UnitView& w, const UnitGrad& g, const LayerSpec& l, Keep keep,
                    LayerSaved& sv, const float* dout, float* dx) {
  HostOps o{c.tr};
  impl::layer_backward(o, c, u, w, g, l, keep, sv, dout, dx);
}

double loss_forward_backward(Ctx& c, const bf16* fn_w, const bf16* head_w, float* fn_g, float* head_g, const float* x,
                             const int64_t* targets, double grad_scale, float* dx) {
  HostOps o{c.tr};
  return impl::loss_forward_backward(o, c, fn_w, head_w, fn_g, head_g, x, targets, grad_scale, dx);
}

void embedding_forward(Ctx& c, const bf16* table, const int64_t* tokens, bf16* x) {
  HostOps o{c.tr};
  impl::embedding_forward(o, c, table, tokens, x);
}

void embedding_backward(Ctx& c, const int64_t* tokens, const float* dx, float* g) {
  HostOps o{c.tr};
  impl::embedding_backward(o, c, tokens, dx, g);
}

}  // namespace lcplan::exec