// FLOPs accounting per layer kind, and model FLOPs per step as Megatron reports them.
//
// ---- Definition of model FLOPs (README "tflops_per_gpu") -------------------------------------------------------
// A multiply-add counts 2 FLOPs. For one sequence of s tokens, the forward FLOPs are the sum of:
//  * every weight GEMM a token passes through: 2 x (weights it multiplies) per token. Attention / gated DeltaNet /
//    MLA projections, dense MLP, shared experts, the router (2*h*E), the top_k routed experts a token is sent to
//    (top_k x one expert; with token dropping and capacity factor c the experts are padded to capacity, so routed
//    work is top_k x c -- the executed count; the model count stays top_k, as Megatron's formula has no c), the
//    LM head (2*h*V per token) and, per MTP module, its eh_proj (2*2h*h), one decoder layer and another LM head.
//  * softmax attention core (QK^T and PV): 4 x heads x head_dim x (average keys a query sees) per token; causal
//    attention sees on average s/2 keys (half the square), a sliding window w sees w - w^2/(2s) (w < s);
//    MLA uses (qk_nope + qk_rope) for QK^T and v_head_dim for PV.
//  * gated DeltaNet (chunked delta rule, chunk C = 64): per token and value head 2*C*(3*dk + 2*dv) inside the
//    chunk (K K^T, Q K^T, the WY products, the intra-chunk output) + 6*dk*dv for the state (q S, W S, S update),
//    plus the causal depthwise conv 2*kernel*(2*key_dim + value_dim): linear in s.
//  * embedding lookups, norms, activations, softmax/loss elementwise work: 0 (memory-bound, not counted).
// Training model FLOPs = 3 x forward (backward = 2 x forward), times the sequences in the global batch.
// Recomputation is NOT counted (Megatron-LM num_floating_point_operations, training.py); tflops_per_gpu =
// model_flops_per_step / step_seconds / gpus / 1e12, and MFU divides that by the peak of the plan's precision.
// ------------------------------------------------------------------------------------------------------------------
#pragma once

#include <cstdint>
#include <vector>

#include "estimator/plan.h"
#include "models/model_spec.h"

namespace lcplan {

// Forward FLOPs of one decoder layer for one sequence of `seq` tokens, split by the kernel class that runs them.
struct LayerFlops {
  double proj = 0;         // mixer projections (dense GEMMs)
  double attn_core = 0;    // softmax attention QK^T + PV (flash attention)
  double linear_core = 0;  // gated DeltaNet chunked delta rule + causal conv (linear attention kernels)
  double dense_mlp = 0;    // dense MLP GEMMs
  double router = 0;       // router GEMM
  double routed = 0;       // routed-expert grouped GEMMs (top_k, or top_k x capacity factor when `executed`)
  double shared = 0;       // shared-expert GEMMs
  double latent = 0;       // latent MoE's hidden -> latent and latent -> hidden projections (dense GEMMs)
  double total() const { return proj + attn_core + linear_core + dense_mlp + router + routed + shared + latent; }
};

// Memory traffic around one layer's GEMMs, in elements per token (per routed token copy for the experts), forward
// and backward together: what low-precision quantization and the MLP activation read and write.
struct LayerTraffic {
  double mixer_io = 0;        // sum over the mixer's projection GEMMs of input + output width
  double mlp_io = 0;          // the same for the dense MLP or the shared experts
  double routed_gemm_io = 0;  // the same for one routed copy through one expert (fc1 and fc2)
  double act = 0;             // MLP / shared-expert activation (SwiGLU: read gate+up, write out; backward 5 more)
  double routed_act = 0;      // the same for one routed copy
};
LayerTraffic layer_traffic(const ModelSpec& m, const LayerSpec& layer);

// `capacity_factor` > 0 counts routed work padded to capacity (executed FLOPs); 0 counts top_k (model FLOPs).
// `packed` (non-empty: `seq` tokens packed from sequences of these lengths, THD) sets the attention's keys per query.
LayerFlops layer_forward_flops(const ModelSpec& m, const LayerSpec& layer, double seq, double capacity_factor = 0,
                               const std::vector<int64_t>& packed = {});

// Average number of keys a query attends to in a causal sequence of `seq` tokens (window 0 = full causal).
double causal_context(double seq, double window);
// The same over a packed microbatch (each sequence attends only to itself): the token-weighted mean of
// causal_context over `packed`, so the attention core costs the sum of each sequence's square, not the sum's square
// (Megatron-LM counts THD attention by the sum of L_i^2, training.py). Empty `packed`: causal_context(seq, window).
double packed_context(double seq, double window, const std::vector<int64_t>& packed);

double lm_head_forward_flops(const ModelSpec& m, double seq);
// All MTP modules: eh_proj + one decoder layer shaped like the last + the shared LM head, each.
double mtp_forward_flops(const ModelSpec& m, double seq, const std::vector<int64_t>& packed = {});
// Whole model forward for one sequence: decoder layers + LM head + MTP.
double model_forward_flops(const ModelSpec& m, double seq, const std::vector<int64_t>& packed = {});
// Megatron-style model FLOPs of one training step of the plan (whole job, recompute excluded).
double model_flops_per_step(const ModelSpec& m, const Plan& p);

}  // namespace lcplan
