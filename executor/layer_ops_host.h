// The host backend of the layers' orchestration (layers_impl.h): host Bufs charged to the tracker, the CPU ops of
// ops.h (fp64-accumulating GEMMs), the CPU kernels and MPI groups. The members that are more than one call live in
// layers.cpp with the host-only mixers and FFNs (gated DeltaNet, MoE) they share helpers with.
#pragma once

#include <algorithm>
#include <cstring>

#include "executor/layers.h"
#include "executor/ops.h"
#include "executor/ops_math.h"
#include "kernels/attention/attention.h"

namespace lcplan::exec {

struct HostOps {
  template <class T>
  using Buf = exec::Buf<T>;
  Tracker& tr;

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

  // The mixers and FFNs that only the host runs.
  void gdn_fwd(Ctx& c, const UnitLayout& u, const UnitView& w, const float* x, Keep keep, LayerSaved& sv,
               const Buf<float>* rebuild_state, float* y);
  void gdn_bwd(Ctx& c, const UnitLayout& u, const UnitView& w, const UnitGrad& g, LayerSaved& sv, const float* dy,
               float* dn1);
  void moe_fwd(Ctx& c, const UnitLayout& u, const UnitView& w, const float* n2, Keep keep, LayerSaved& sv, float* y);
  void moe_bwd(Ctx& c, const UnitLayout& u, const UnitView& w, const UnitGrad& g, LayerSaved& sv, const float* n2,
               const float* dy, float* dn2);
};

}  // namespace lcplan::exec
