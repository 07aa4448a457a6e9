#include "kernels/moe/moe_kernels_cpu.h"

#include <algorithm>
#include <cstring>

namespace lcplan::moe::cpu {

void route(const float* logits, const float* bias, const RouterParams& p, int tokens, float* scores, int* idx,
           float* w) {
  for (int t = 0; t < tokens; ++t)
    route_token(p, logits + size_t(t) * p.experts, bias, scores + size_t(t) * p.experts, idx + size_t(t) * p.top_k,
                w + size_t(t) * p.top_k);
}

void route_bwd(const float* scores, const int* idx, const float* dw, const RouterParams& p, int tokens,
               float* dlogits) {
  for (int t = 0; t < tokens; ++t)
    route_token_bwd(p, scores + size_t(t) * p.experts, idx + size_t(t) * p.top_k, dw + size_t(t) * p.top_k,
                    dlogits + size_t(t) * p.experts);
}

void chunk_counts(const int* idx, int top_k, int experts, const std::vector<int>& bounds, int* counts) {
  const int chunks = int(bounds.size()) - 1;
  std::fill(counts, counts + size_t(chunks) * experts, 0);
  for (int c = 0; c < chunks; ++c)
    for (int64_t slot = int64_t(bounds[size_t(c)]) * top_k; slot < int64_t(bounds[size_t(c) + 1]) * top_k; ++slot)
      ++counts[size_t(c) * experts + size_t(idx[slot])];
}

void expert_major_rows(const int* expert_of_slot, int n, int experts, int* row_of_slot) {
  std::vector<int> offsets(size_t(experts) + 1);
  moe::expert_major_rows(expert_of_slot, n, experts, offsets.data(), row_of_slot);
}

void permute(const float* x, const int* row_of_slot, int tokens, int top_k, int hidden, float* xp) {
  for (int i = 0; i < tokens * top_k; ++i)
    std::memcpy(xp + size_t(row_of_slot[i]) * hidden, x + size_t(i / top_k) * hidden, sizeof(float) * size_t(hidden));
}

void unpermute(const float* yp, const int* row_of_slot, const float* w, int tokens, int top_k, int hidden,
               const float* shared, const float* gate, float* out) {
  for (int t = 0; t < tokens; ++t) {
    float* o = out + size_t(t) * hidden;
    std::fill(o, o + hidden, 0.0f);
    for (int k = 0; k < top_k; ++k) {  // fixed k order: the sum does not depend on the chunking
      const float wk = w ? w[size_t(t) * top_k + k] : 1.0f;
      const float* y = yp + size_t(row_of_slot[t * top_k + k]) * hidden;
      for (int h = 0; h < hidden; ++h) o[h] += wk * y[h];
    }
    if (!shared) continue;
    const float g = gate ? gate[t] : 1.0f;
    for (int h = 0; h < hidden; ++h) o[h] += g * shared[size_t(t) * hidden + h];
  }
}

void unpermute_bwd(const float* dout, const float* yp, const int* row_of_slot, const float* w, int tokens, int top_k,
                   int hidden, float* dyp, float* dw) {
  for (int t = 0; t < tokens; ++t)
    for (int k = 0; k < top_k; ++k) {
      const size_t row = size_t(row_of_slot[t * top_k + k]);
      const float wk = w[size_t(t) * top_k + k];
      const float* d = dout + size_t(t) * hidden;
      const float* y = yp + row * hidden;
      float dot = 0;
      for (int h = 0; h < hidden; ++h) {
        dyp[row * hidden + h] = wk * d[h];
        dot += d[h] * y[h];
      }
      dw[size_t(t) * top_k + k] = dot;
    }
}

void swiglu(const float* h1, int64_t rows, int ffn, float* act) {
  for (int64_t r = 0; r < rows; ++r)
    for (int j = 0; j < ffn; ++j) act[r * ffn + j] = moe::swiglu(h1[r * 2 * ffn + j], h1[r * 2 * ffn + ffn + j]);
}

void swiglu_bwd(const float* h1, const float* dact, int64_t rows, int ffn, float* dh1) {
  for (int64_t r = 0; r < rows; ++r)
    for (int j = 0; j < ffn; ++j)
      moe::swiglu_bwd(h1[r * 2 * ffn + j], h1[r * 2 * ffn + ffn + j], dact[r * ffn + j], &dh1[r * 2 * ffn + j],
                      &dh1[r * 2 * ffn + ffn + j]);
}

void add(const float* a, const float* b, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void copy_blocks(const float* in, float* out, const int64_t* blocks, int nblocks, int hidden, bool to_expert_major) {
  for (int i = 0; i < nblocks; ++i) {
    const int64_t* b = blocks + 3 * size_t(i);
    const int64_t from = to_expert_major ? b[0] : b[1], to = to_expert_major ? b[1] : b[0];
    std::memcpy(out + to * hidden, in + from * hidden, sizeof(float) * size_t(b[2] * hidden));
  }
}

void shared_gate(const float* x, const float* g, int tokens, int hidden, float* sgate) {
  for (int t = 0; t < tokens; ++t) {
    float z = 0;
    for (int h = 0; h < hidden; ++h) z += x[size_t(t) * hidden + h] * g[h];
    sgate[t] = sigmoid_(z);
  }
}

void shared_gate_bwd(const float* dout, const float* sout, const float* sgate, int tokens, int hidden, float* dso,
                     float* dz) {
  for (int t = 0; t < tokens; ++t) {
    const float g = sgate ? sgate[t] : 1.0f;
    float dot = 0;
    for (int h = 0; h < hidden; ++h) {
      const float d = dout[size_t(t) * hidden + h];
      dso[size_t(t) * hidden + h] = g * d;
      dot += d * sout[size_t(t) * hidden + h];
    }
    if (sgate) dz[t] = dot * (g * (1.0f - g));  // through the sigmoid gate
  }
}

}  // namespace lcplan::moe::cpu
