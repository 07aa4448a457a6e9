// Softmax attention without the [Sq x Sk] score matrix (fp32), its backward, the context-parallel merge of partial
// results, and RoPE. See attention_math.h for the per-element math (shared with the CUDA kernels) and README.md.
//
// Layouts (row-major, token-major): q [Sq x Hq x D], k and v [Sk x Hkv x D], o [Sq x Hq x D], lse [Hq x Sq]
// (fp32, natural log). Grouped-query attention: Hq % Hkv == 0 and query head h reads kv head h / (Hq / Hkv).
// Positions are absolute: query i is at q_start + i, key j at k_start + j, so a context-parallel rank computes its
// (query chunk, key chunk) pairs with the chunks' offsets and merges the partial results with merge_partials().
//
// A query row that sees no key (everything masked, or Sk = 0) gets o = 0, lse = -inf, and zero gradients.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/attention/attention_math.h"

namespace lcplan::attention {

struct Shape {
  int64_t sq = 0;   // query tokens
  int64_t sk = 0;   // key / value tokens
  int64_t hq = 0;   // query heads
  int64_t hkv = 0;  // key / value heads (hq % hkv == 0)
  int64_t d = 0;    // head dim (q, k and v)
};

struct Options {
  bool causal = true;
  int64_t window = 0;   // > 0: sliding window, keys with query_pos - key_pos >= window are hidden
  int64_t q_start = 0;  // absolute position of query 0
  int64_t k_start = 0;  // absolute position of key 0
  float scale = 0.0f;   // softmax scale; 0 means 1 / sqrt(d)
  int64_t q_tile = 64;  // CPU tile sizes (the CUDA kernels use their own)
  int64_t k_tile = 128;
};

// Explicit accounting of the scratch memory a CPU call allocated (inputs and outputs excluded).
struct Stats {
  size_t peak_extra_bytes = 0;
};

// Throws std::invalid_argument with one sentence naming the first bad size or option.
void validate(const Shape& s, const Options& o);
float resolved_scale(const Shape& s, const Options& o);
// Number of visible (query, key) pairs per head; the FLOP model multiplies it (forward_flops, backward_flops).
double visible_pairs(const Shape& s, const Options& o);

// Upper bounds on the CPU paths' extra bytes. Neither depends on sk: the forward holds a q_tile x k_tile score tile
// and a q_tile x D accumulator; the backward two q_tile x k_tile tiles and D_i = rowsum(do * o), Hq * Sq floats.
size_t cpu_forward_extra_bytes_bound(const Shape& s, const Options& o);
size_t cpu_backward_extra_bytes_bound(const Shape& s, const Options& o);

// Forward: o [Sq x Hq x D], lse [Hq x Sq] are overwritten.
void forward_cpu(const Shape& s, const float* q, const float* k, const float* v, float* o, float* lse,
                 const Options& opt, Stats* stats = nullptr);

// Backward from the forward's o and lse and the upstream gradient d_o: dq [Sq x Hq x D], dk and dv [Sk x Hkv x D]
// are overwritten (dk, dv summed over the query heads of each kv head). Under context parallelism pass the merged
// (o, lse) of the whole row with each key chunk: the chunks' dq then sum to the full dq and each chunk's dk, dv are
// that chunk's full gradients.
void backward_cpu(const Shape& s, const float* q, const float* k, const float* v, const float* o, const float* lse,
                  const float* d_o, float* dq, float* dk, float* dv, const Options& opt, Stats* stats = nullptr);

// Log-sum-exp merge of two partial results over disjoint key sets for the same queries (o [Sq x Hq x D],
// lse [Hq x Sq]): lse = log(e^lse_a + e^lse_b), o = e^(lse_a - lse) o_a + e^(lse_b - lse) o_b. The outputs may
// alias either input. Two empty rows merge to o = 0, lse = -inf.
void merge_partials(int64_t sq, int64_t hq, int64_t d, const float* o_a, const float* lse_a, const float* o_b,
                    const float* lse_b, float* o, float* lse);

// Naive double-precision reference, materialising the whole [Sq x Sk] score matrix per head; for tests only.
void forward_reference(const Shape& s, const double* q, const double* k, const double* v, double* o, double* lse,
                       const Options& opt);
void backward_reference(const Shape& s, const double* q, const double* k, const double* v, const double* d_o,
                        double* dq, double* dk, double* dv, const Options& opt);

// ---- RoPE over x [S x H x D], token i at absolute position start + i ----

struct RopeOptions {
  int64_t rotary_dim = -1;  // the first rotary_dim dims of each head are rotated (even, <= D); -1 means D
  float theta = 10000.0f;   // base (Qwen3.5: 1e7 with rotary_dim = D / 4)
  int64_t start = 0;        // absolute position of token 0
};

// Throws std::invalid_argument naming the first bad size or option.
void validate_rope(int64_t s, int64_t h, int64_t d, const RopeOptions& o);
// y = RoPE(x); y may equal x (in place). Dims past rotary_dim are copied unchanged.
void rope_forward_cpu(int64_t s, int64_t h, int64_t d, const float* x, float* y, const RopeOptions& o);
// dx = RoPE^T(dy) (the inverse rotation); dx may equal dy.
void rope_backward_cpu(int64_t s, int64_t h, int64_t d, const float* dy, float* dx, const RopeOptions& o);

}  // namespace lcplan::attention
