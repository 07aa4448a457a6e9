// Gated DeltaNet linear attention (the gated delta rule of Qwen3-Next / Qwen3.5 "linear_attention" layers) and the
// causal depthwise conv1d in front of it, fp32, with backward passes and state passing for context parallelism.
// See linear_attention_math.h for the recurrence and its gradients and README.md for costs and sources.
//
// Layouts (row-major, token-major): q, k [S x Hk x dk]; v [S x Hv x dv]; g, beta [S x Hv] (g = log decay, the
// decay is exp(g); Qwen3.5 computes g = -exp(A_log) * softplus(a + dt_bias) <= 0 and beta = sigmoid(b) outside);
// o [S x Hv x dv]; states [Hv x dk x dv]. Value head h reads key head h / (Hv / Hk) (HF's repeat_interleave).
// With qk_l2norm (Qwen3.5's use_qk_l2norm_in_kernel=True) q and k are L2-normalised inside, and their gradients are
// taken through the normalisation; q is then scaled by `scale` (default 1/sqrt(dk)).
//
// Context parallelism: the forward takes the state entering the segment and returns the state leaving it; the
// backward takes dS for the state leaving it and returns dS for the state entering it, to be sent to the previous
// rank. Running [0, a) then [a, S) with the state (forward) and dS (backward) handed over equals one run on [0, S).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/linear_attention/linear_attention_math.h"

namespace lcplan::linear_attention {

struct Shape {
  int64_t s = 0;   // tokens
  int64_t hk = 0;  // query / key heads
  int64_t hv = 0;  // value heads (hv % hk == 0)
  int64_t dk = 0;  // query / key head dim
  int64_t dv = 0;  // value head dim
};

struct Options {
  int64_t chunk = 64;       // chunk length of the chunked forward (and of the backward's saved states)
  bool qk_l2norm = true;    // L2-normalise q and k inside (eps below)
  float l2norm_eps = 1e-6f;
  float scale = 0.0f;       // query scale; 0 means 1/sqrt(dk)
};

// Scratch memory a CPU call allocated (inputs and outputs excluded).
struct Stats {
  size_t peak_extra_bytes = 0;
};

// Throws std::invalid_argument with one sentence naming the first bad size or option.
void validate(const Shape& s, const Options& o);
float resolved_scale(const Shape& s, const Options& o);

// Extra bytes of the CPU paths. The forward's does not depend on s (chunk-sized tiles and one state); the
// backward's grows linearly in s: it recomputes and keeps one [dk x dv] state per chunk boundary of one head at a
// time (ceil(s / chunk) states), plus the chunk's per-token states.
size_t cpu_forward_extra_bytes_bound(const Shape& s, const Options& o);
size_t cpu_backward_extra_bytes_bound(const Shape& s, const Options& o);

// Forward (chunked). state_in [Hv x dk x dv] may be null (zeros); state_out may be null (not returned).
void forward_cpu(const Shape& s, const float* q, const float* k, const float* v, const float* g, const float* beta,
                 const float* state_in, float* o, float* state_out, const Options& opt, Stats* stats = nullptr);

// Backward: d_o [S x Hv x dv] and d_state_out (may be null: zeros) -> dq, dk [S x Hk x dk], dv [S x Hv x dv],
// dg, dbeta [S x Hv] (all overwritten) and d_state_in (may be null: not returned). Nothing is saved by the forward:
// the chunk-boundary states are recomputed with the chunked forward, then each chunk's per-token states, and the
// recurrence is run in reverse (exact up to fp32 rounding).
void backward_cpu(const Shape& s, const float* q, const float* k, const float* v, const float* g, const float* beta,
                  const float* state_in, const float* d_o, const float* d_state_out, float* dq, float* dk, float* dv,
                  float* dg, float* dbeta, float* d_state_in, const Options& opt, Stats* stats = nullptr);

// Token-by-token recurrence in double (HF torch_recurrent_gated_delta_rule), forward and an analytic reverse pass
// that stores every state; for tests only. Same argument conventions as the CPU path.
void forward_reference(const Shape& s, const double* q, const double* k, const double* v, const double* g,
                       const double* beta, const double* state_in, double* o, double* state_out, const Options& opt);
void backward_reference(const Shape& s, const double* q, const double* k, const double* v, const double* g,
                        const double* beta, const double* state_in, const double* d_o, const double* d_state_out,
                        double* dq, double* dk, double* dv, double* dg, double* dbeta, double* d_state_in,
                        const Options& opt);

// ---- causal depthwise conv1d over x [S x C] with weight [C x K] (PyTorch's [C, 1, K] squeezed) ----
// history [(K-1) x C]: the K-1 tokens before x (zeros at the sequence start: pass null; under context parallelism
// the previous rank's last K-1 tokens, see conv1d_next_history). bias [C] may be null (Qwen3.5 has none).

struct Conv {
  int64_t s = 0;         // tokens
  int64_t channels = 0;  // C
  int64_t kernel = 4;    // K
  bool silu = true;      // apply SiLU after the convolution (Qwen3.5 does)
};

void validate_conv(const Conv& c);
// y [S x C] overwritten.
void conv1d_forward_cpu(const Conv& c, const float* x, const float* history, const float* weight, const float* bias,
                        float* y);
// dx [S x C], d_weight [C x K] overwritten; d_history [(K-1) x C] (the gradient to send back to the previous rank)
// and d_bias [C] overwritten when not null. Extra memory: K rows of the pre-activation gradient.
void conv1d_backward_cpu(const Conv& c, const float* x, const float* history, const float* weight, const float* bias,
                         const float* dy, float* dx, float* d_history, float* d_weight, float* d_bias);
// The K-1 tokens the next segment needs as its history: the last K-1 rows of [history; x].
void conv1d_next_history(const Conv& c, const float* x, const float* history, float* next_history);
// Double reference forward (the direct sum), for tests only; the tests check the backward by finite differences of it.
void conv1d_forward_reference(const Conv& c, const double* x, const double* history, const double* weight,
                              const double* bias, double* y);

}  // namespace lcplan::linear_attention
