// MoE math shared by the CPU reference and the CUDA kernels (LCPLAN_HD): routing of one token and its
// backward, the SwiGLU activation, the stable expert-major permutation and the all-to-all block offsets.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/hd.h"

namespace lcplan::moe {

enum class Router : uint8_t {
  SoftmaxTopK,         // Qwen / Mixtral: softmax over all experts, take the k largest
  SigmoidGroupLimited  // DeepSeek-V3: sigmoid scores + expert bias pick top groups, then top-k inside them
};

struct RouterParams {
  Router kind = Router::SoftmaxTopK;
  int experts = 0;
  int top_k = 0;
  int n_group = 1;       // expert groups (SigmoidGroupLimited)
  int topk_group = 1;    // groups kept per token
  bool normalize = true; // renormalise the k weights to sum to 1 (Qwen3 norm_topk_prob, Mixtral, DeepSeek-V3)
  float scale = 1.0f;    // routed_scaling_factor
};

constexpr int kMaxGroups = 64;  // group selection keeps a 64-bit mask

// Overloads so the routing math runs in float (kernels) and double (finite-difference reference).
LCPLAN_HD float exp_(float x) { return expf(x); }
LCPLAN_HD double exp_(double x) { return exp(x); }
template <class T>
LCPLAN_HD T sigmoid_(T x) { return T(1) / (T(1) + exp_(-x)); }
template <class T>
LCPLAN_HD T silu(T x) { return x * sigmoid_(x); }

LCPLAN_HD bool chosen_(const int* idx, int n, int e) {
  for (int i = 0; i < n; ++i)
    if (idx[i] == e) return true;
  return false;
}

// Routes one token. logits[E] in; scores[E] out (softmax probabilities or sigmoid scores, kept for backward);
// idx[K] experts in descending order of selection score (ties: lower index first); w[K] routing weights.
// bias (E values, may be null) only steers selection, as DeepSeek-V3's aux-loss-free balancing does.
template <class T>
LCPLAN_HD void route_token(const RouterParams& p, const T* logits, const T* bias, T* scores, int* idx, T* w) {
  const int E = p.experts, K = p.top_k;
  if (p.kind == Router::SoftmaxTopK) {
    T mx = logits[0];
    for (int e = 1; e < E; ++e) mx = logits[e] > mx ? logits[e] : mx;
    T sum = 0;
    for (int e = 0; e < E; ++e) sum += (scores[e] = exp_(logits[e] - mx));
    for (int e = 0; e < E; ++e) scores[e] /= sum;
    for (int k = 0; k < K; ++k) {
      int best = -1;
      for (int e = 0; e < E; ++e)
        if (!chosen_(idx, k, e) && (best < 0 || scores[e] > scores[best])) best = e;
      idx[k] = best;
    }
  } else {
    for (int e = 0; e < E; ++e) scores[e] = sigmoid_(logits[e]);
    const int per = E / p.n_group;
    auto biased = [&](int e) { return scores[e] + (bias ? bias[e] : T(0)); };
    // Group score: sum of the group's two best biased scores (one when a group has a single expert).
    uint64_t keep = 0;
    for (int g = 0; g < p.topk_group; ++g) {
      int best = -1;
      T best_score = 0;
      for (int q = 0; q < p.n_group; ++q) {
        if (keep >> q & 1u) continue;
        T a = -T(INFINITY), b = -T(INFINITY);
        for (int e = q * per; e < (q + 1) * per; ++e) {
          const T s = biased(e);
          if (s > a) {
            b = a;
            a = s;
          } else if (s > b) {
            b = s;
          }
        }
        const T gs = per > 1 ? a + b : a;
        if (best < 0 || gs > best_score) {
          best = q;
          best_score = gs;
        }
      }
      keep |= uint64_t{1} << best;
    }
    for (int k = 0; k < K; ++k) {
      int best = -1;
      for (int e = 0; e < E; ++e)
        if ((keep >> (e / per) & 1u) && !chosen_(idx, k, e) && (best < 0 || biased(e) > biased(best))) best = e;
      idx[k] = best;
    }
  }
  T sum = 0;
  for (int k = 0; k < K; ++k) sum += scores[idx[k]];
  for (int k = 0; k < K; ++k) w[k] = T(p.scale) * (p.normalize ? scores[idx[k]] / sum : scores[idx[k]]);
}

// Backward of route_token for fixed selections: dw[K] -> dlogits[E].
template <class T>
LCPLAN_HD void route_token_bwd(const RouterParams& p, const T* scores, const int* idx, const T* dw, T* dlogits) {
  const int E = p.experts, K = p.top_k;
  T sum = 0, dot = 0;  // S = sum of selected scores, dot = sum_k dw_k * s_k
  for (int k = 0; k < K; ++k) {
    sum += scores[idx[k]];
    dot += dw[k] * scores[idx[k]];
  }
  for (int e = 0; e < E; ++e) dlogits[e] = 0;
  for (int k = 0; k < K; ++k)  // ds_k: gradient w.r.t. the selected score (quotient rule when normalised)
    dlogits[idx[k]] = T(p.scale) * (p.normalize ? dw[k] / sum - dot / (sum * sum) : dw[k]);
  if (p.kind == Router::SoftmaxTopK) {
    T inner = 0;  // softmax backward: dl = s * (ds - <ds, s>)
    for (int e = 0; e < E; ++e) inner += dlogits[e] * scores[e];
    for (int e = 0; e < E; ++e) dlogits[e] = scores[e] * (dlogits[e] - inner);
  } else {
    for (int e = 0; e < E; ++e) dlogits[e] *= scores[e] * (T(1) - scores[e]);
  }
}

// SwiGLU on fc1 output [gate | up]: act = silu(gate) * up, and its backward.
template <class T>
LCPLAN_HD T swiglu(T gate, T up) { return silu(gate) * up; }
template <class T>
LCPLAN_HD void swiglu_bwd(T gate, T up, T dact, T* dgate, T* dup) {
  const T s = sigmoid_(gate);
  *dup = dact * gate * s;
  *dgate = dact * up * s * (T(1) + gate * (T(1) - s));
}

// Stable expert-major permutation of n slots: counts[E+1] receives the exclusive offsets of each expert's rows
// (counts[E] = n); row_of_slot[i] is slot i's row. Slots keep their order inside an expert, so the result
// does not depend on how work is split (CPU loop or one GPU thread).
LCPLAN_HD void expert_major_rows(const int* expert_of_slot, int n, int E, int* offsets, int* row_of_slot) {
  for (int e = 0; e <= E; ++e) offsets[e] = 0;
  for (int i = 0; i < n; ++i) ++offsets[expert_of_slot[i] + 1];
  for (int e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  // Reuse offsets as cursors, then shift them back.
  for (int i = 0; i < n; ++i) row_of_slot[i] = offsets[expert_of_slot[i]]++;
  for (int e = E; e > 0; --e) offsets[e] = offsets[e - 1];
  offsets[0] = 0;
}

// Parallel form of expert_major_rows, the one the GPU runs: slots are cut into `tiles` tiles of `tile` slots.
// Phase 1 (one worker per tile) counts the tile's slots per expert into counts[e * tiles + tile]; an exclusive
// scan of that expert-major array gives each (expert, tile) its first row; phase 2 (one worker per tile) walks the
// tile's slots in order from those bases. Tiles of an expert are scanned in slot order and each tile keeps slot
// order, so the rows equal expert_major_rows exactly (stable), whatever the tile size.
LCPLAN_HD int tiles_of(int n, int tile) { return (n + tile - 1) / tile; }
LCPLAN_HD void tile_expert_counts(const int* expert_of_slot, int n, int E, int tile, int ti, int* counts) {
  const int tiles = tiles_of(n, tile);
  for (int e = 0; e < E; ++e) counts[e * tiles + ti] = 0;
  const int end = (ti + 1) * tile < n ? (ti + 1) * tile : n;
  for (int i = ti * tile; i < end; ++i) ++counts[expert_of_slot[i] * tiles + ti];
}
// `base` is the exclusive scan of counts; this tile's column is used as its cursors (no other tile touches it).
LCPLAN_HD void tile_scatter_rows(const int* expert_of_slot, int n, int tile, int ti, int* base, int* row_of_slot) {
  const int tiles = tiles_of(n, tile);
  const int end = (ti + 1) * tile < n ? (ti + 1) * tile : n;
  for (int i = ti * tile; i < end; ++i) row_of_slot[i] = base[expert_of_slot[i] * tiles + ti]++;
}
// offsets[e] = first row of expert e (read from the scanned bases before scattering), offsets[E] = n.
LCPLAN_HD int expert_offset_from_bases(const int* base, int n, int E, int tile, int e) {
  return e < E && n > 0 ? base[e * tiles_of(n, tile)] : n;
}

// Row offsets of block (src s, local expert e) in a buffer of P sources x L local experts, counts[s*L+e] rows.
// Source-major is how rows arrive from the all-to-all; expert-major is what the grouped GEMM wants.
LCPLAN_HD int64_t block_offset_src_major(const int64_t* counts, int P, int L, int s, int e) {
  int64_t off = 0;
  for (int q = 0; q < s; ++q)
    for (int f = 0; f < L; ++f) off += counts[q * L + f];
  for (int f = 0; f < e; ++f) off += counts[s * L + f];
  (void)P;
  return off;
}
LCPLAN_HD int64_t block_offset_expert_major(const int64_t* counts, int P, int L, int s, int e) {
  int64_t off = 0;
  for (int f = 0; f < e; ++f)
    for (int q = 0; q < P; ++q) off += counts[q * L + f];
  for (int q = 0; q < s; ++q) off += counts[q * L + e];
  return off;
}

}  // namespace lcplan::moe
