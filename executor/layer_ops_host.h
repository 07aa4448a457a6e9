// The host backend of the layers' orchestration (executor/layers/, common.h lists the members): host Bufs charged to
// the tracker, the CPU ops of ops.h (fp64-accumulating GEMMs), the CPU kernels and MPI groups. The members that are
// more than one call live in layers.cpp.
#pragma once

#include <algorithm>
#include <cstring>
#include <vector>

#include "executor/layers.h"
#include "executor/ops.h"
#include "executor/ops_math.h"
#include "kernels/attention/attention.h"
#include "kernels/linear_attention/linear_attention.h"
#include "kernels/moe/moe_ops_cpu.h"

namespace lcplan::exec {

// The MoE layer's kernels, fixed-order GEMMs and step runner are the CPU layer's own (kernels/moe/moe_ops_cpu.h).
struct HostOps : moe::cpu::MoeOps {
  template <class T>
  using Buf = exec::Buf<T>;
  Tracker& tr;
  HostOps(Tracker& t) : tr(t) {}  // NOLINT(google-explicit-constructor): HostOps{tracker}, as the other backends

  Buf<float> ws(size_t n) { return Buf<float>(tr, Category::Workspace, n); }
  Buf<bf16> save16(const float* x, size_t n) {
    Buf<bf16> b(tr, Category::Activations, n);
    exec::to_bf16(x, b.data(), n);
    return b;
  }
  Buf<float> save32(const float* x, size_t n) {
    Buf<float> b(tr, Category::Activations, n);
    std::copy(x, x + n, b.data());
    return b;
  }
  Buf<float> load(const Buf<bf16>& b) { return exec::widen(tr, b.data(), b.size()); }
  Buf<float> widen(const bf16* x, size_t n) { return exec::widen(tr, x, n); }

  void round(float* x, size_t n) { round_bf16_inplace(x, n); }
  void to_bf16(const float* x, bf16* y, size_t n) { exec::to_bf16(x, y, n); }
  void copy(const float* src, size_t n, float* dst) { std::copy(src, src + n, dst); }
  void accumulate(const float* src, float* dst, size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] += src[i];
  }
  void residual(const float* a, const float* b, float* out, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = math::residual_y(a[i], b[i]);
  }
  // Columns [c0, c0 + n) of rows [r0, r0 + rows) of a row-major matrix with `cols` columns, out of it or into it.
  static void cols_out(const float* m, int64_t cols, int64_t r0, int64_t rows, int64_t c0, int64_t n, float* out) {
    for (int64_t r = 0; r < rows; ++r) std::memcpy(out + r * n, m + (r0 + r) * cols + c0, sizeof(float) * size_t(n));
  }
  static void cols_in(float* m, int64_t cols, int64_t r0, int64_t rows, int64_t c0, int64_t n, const float* in) {
    for (int64_t r = 0; r < rows; ++r) std::memcpy(m + (r0 + r) * cols + c0, in + r * n, sizeof(float) * size_t(n));
  }

  void matmul(const float* x, const bf16* W, float* y, int64_t rows, int64_t k, int64_t n) {
    exec::matmul(tr, x, W, y, rows, k, n);
  }
  void matmul_bwd(const float* x, const bf16* W, const float* dy, float* dx, float* dW, int64_t rows, int64_t k,
                  int64_t n) {
    exec::matmul_bwd(tr, x, W, dy, dx, dW, rows, k, n);
  }
  // Megatron RowParallelLinear / ColumnParallelLinear backward with sequence parallelism, TP sums in fp64.
  void row_parallel(Ctx& c, const float* x, const bf16* W, float* y, int64_t k, int64_t n);
  void col_parallel_bwd(Ctx& c, const float* x_all, const bf16* W, const float* dy, float* dx, float* dW, int64_t k,
                        int64_t n);

  void rmsnorm(const float* x, const bf16* w, float* y, int64_t rows, int64_t h) { exec::rmsnorm(x, w, y, rows, h); }
  void rmsnorm_bwd(const float* x, const bf16* w, const float* dy, float* dx, float* dw, int64_t rows, int64_t h,
                   bool accumulate_dx) {
    exec::rmsnorm_bwd(x, w, dy, dx, dw, rows, h, accumulate_dx);
  }
  void output_gate(const float* o, const float* gate, float* go, size_t n) { exec::output_gate(o, gate, go, n); }
  void add_bias(float* y, const bf16* b, int64_t rows, int64_t n) { exec::add_bias(y, b, rows, n); }
  void bias_bwd(const float* dy, int64_t rows, int64_t n, float* db) { exec::bias_bwd(dy, rows, n, db); }
  void output_gate_bwd(const float* dgo, const float* o, const float* gate, float* d_o, float* d_gate, size_t n) {
    exec::output_gate_bwd(dgo, o, gate, d_o, d_gate, n);
  }
  void swiglu_fwd(const float* h1, float* act, int64_t rows, int64_t f) { exec::swiglu_fwd(h1, act, rows, f); }
  void swiglu_back(const float* h1, const float* dact, float* dh1, int64_t rows, int64_t f) {
    exec::swiglu_back(h1, dact, dh1, rows, f);
  }
  void embedding_rows(const bf16* table, const int64_t* tokens, int64_t T, int64_t h, int64_t V0, int64_t Vl,
                      float* out) {
    exec::embedding_rows(table, tokens, T, h, V0, Vl, out);
  }
  void embedding_rows_bwd(const int64_t* tokens, const float* dy, int64_t T, int64_t h, int64_t V0, int64_t Vl,
                          float* g) {
    exec::embedding_rows_bwd(tokens, dy, T, h, V0, Vl, g);
  }
  // The whole table's rows of this rank's c.rows tokens, copied as stored (no TP: every row is this rank's).
  void embed_rows16(Ctx& c, const bf16* table, const int64_t* tokens, bf16* x) {
    const int64_t h = c.d.H;
    for (int64_t t = 0; t < c.rows; ++t) std::copy(table + tokens[t] * h, table + (tokens[t] + 1) * h, x + t * h);
  }

  void rope(int64_t len, int64_t heads, int64_t hd, float* x, const attention::RopeOptions& o, bool backward) {
    if (backward) attention::rope_backward_cpu(len, heads, hd, x, x, o);
    else attention::rope_forward_cpu(len, heads, hd, x, x, o);
  }
  void attention_fwd(Ctx& c, const attention::Shape& s, const float* q, const float* k, const float* v, float* o,
                     float* lse, const attention::Options& opt);
  void attention_bwd(Ctx& c, const attention::Shape& s, const float* q, const float* k, const float* v,
                     const float* o, const float* lse, const float* d_o, float* dq, float* dk, float* dv,
                     const attention::Options& opt);
  // Cross-entropy summed over the gathered tokens `h` against the LM head W (fp32), its backward scaled by gl:
  // returns the loss, fills lse and allocates dh (tokens x hidden) and dW (vocab shard x hidden).
  double cross_entropy(Ctx& c, const float* h, const float* W, const int64_t* targets, float gl, float* lse,
                       Buf<float>& dh, Buf<float>& dW);

  // Gated DeltaNet: the gates, the gated norm, the causal conv1d and the delta rule (kernels/linear_attention); the
  // kernels' own scratch is charged to workspace at its peak, as they report it.
  void gdn_gates(const float* proj, int64_t P, int64_t acol, int64_t bcol, const bf16* a_log, const bf16* dt_bias,
                 int64_t T, int64_t lv, float* gb) {
    exec::gdn_gates(proj, P, acol, bcol, a_log, dt_bias, T, lv, gb);
  }
  void gdn_gates_bwd(const float* proj, int64_t P, int64_t acol, int64_t bcol, const bf16* a_log, const bf16* dt_bias,
                     const float* gb, const float* dg, const float* dbeta, int64_t r0, int64_t n, int64_t lv,
                     float* dproj, float* d_dt_bias, float* d_a_log) {
    exec::gdn_gates_bwd(proj, P, acol, bcol, a_log, dt_bias, gb, dg, dbeta, r0, n, lv, dproj, d_dt_bias, d_a_log);
  }
  void gated_norm(const float* x, const float* z, const bf16* w, float* y, int64_t rows, int64_t heads, int64_t dv) {
    exec::gated_norm(x, z, w, y, rows, heads, dv);
  }
  void gated_norm_bwd(const float* x, const float* z, const bf16* w, const float* dy, float* dx, float* dz, float* dw,
                      int64_t rows, int64_t heads, int64_t dv) {
    exec::gated_norm_bwd(x, z, w, dy, dx, dz, dw, rows, heads, dv);
  }
  void conv1d_fwd(const linear_attention::Conv& cv, const float* x, const float* hist, const float* w, float* y) {
    linear_attention::conv1d_forward_cpu(cv, x, hist, w, nullptr, y);
  }
  void conv1d_history(const linear_attention::Conv& cv, const float* x, const float* hist, float* next) {
    linear_attention::conv1d_next_history(cv, x, hist, next);
  }
  void conv1d_bwd(const linear_attention::Conv& cv, const float* x, const float* hist, const float* w, const float* dy,
                  float* dx, float* d_hist, float* dw) {
    linear_attention::conv1d_backward_cpu(cv, x, hist, w, nullptr, dy, dx, d_hist, dw, nullptr);
  }
  void la_fwd(const linear_attention::Shape& s, const float* q, const float* k, const float* v, const float* g,
              const float* beta, const float* state_in, float* o, float* state_out, const linear_attention::Options& opt) {
    linear_attention::Stats st;
    linear_attention::forward_cpu(s, q, k, v, g, beta, state_in, o, state_out, opt, &st);
    Tracker::Charge scratch(tr, Category::Workspace, double(st.peak_extra_bytes));
  }
  void la_bwd(const linear_attention::Shape& s, const float* q, const float* k, const float* v, const float* g,
              const float* beta, const float* state_in, const float* d_o, const float* d_state_out, float* dq,
              float* dk, float* dv, float* dg, float* dbeta, float* d_state_in, const linear_attention::Options& opt) {
    linear_attention::Stats st;
    linear_attention::backward_cpu(s, q, k, v, g, beta, state_in, d_o, d_state_out, dq, dk, dv, dg, dbeta, d_state_in,
                                   opt, &st);
    Tracker::Charge scratch(tr, Category::Workspace, double(st.peak_extra_bytes));
  }

  // The MoE layer's state (layers/moe.h, kernels/moe/moe_pass.h): the MoE buffers; and its saved routing counts.
  template <class T>
  Buf<T> moe_buf(size_t n) {
    return Buf<T>(tr, Category::MoeBuffers, n);
  }
  Buf<int64_t> upload(const std::vector<int64_t>& v) { return copy_of(v, Category::MoeBuffers); }
  Buf<int64_t> save_counts(const std::vector<int64_t>& v) { return copy_of(v, Category::Activations); }
  std::vector<int64_t> load_counts(const Buf<int64_t>& b) { return std::vector<int64_t>(b.data(), b.data() + b.size()); }
  void to_f32(const bf16* x, float* y, size_t n) { exec::to_f32(x, y, n); }

 private:
  Buf<int64_t> copy_of(const std::vector<int64_t>& v, Category c) {
    Buf<int64_t> b(tr, c, v.size());
    std::copy(v.begin(), v.end(), b.data());
    return b;
  }
};

}  // namespace lcplan::exec
