// Parameter counts per layer and per model, split into the buckets the memory model shards differently.
// Bucket rules follow Megatron-LM megatron/training/theoretical_memory_usage.py: TP-sharded (attention,
// dense MLP, shared experts), replicated (norms, router), expert-sharded (routed experts, divided by EP*ETP).
#pragma once

#include "models/model_spec.h"

namespace lcplan {

struct LayerParams {
  double mixer = 0;           // attention / gated DeltaNet / MLA projections (TP-sharded)
  double mixer_replicated = 0;  // small per-layer vectors that stay whole under TP (q/k norms, MLA lora norms)
  double dense_mlp = 0;       // TP-sharded
  double routed_experts = 0;  // all routed experts of the layer (sharded over EP*ETP)
  double shared_experts = 0;  // TP-sharded
  double router = 0;          // replicated: router weight/bias and the shared-expert gate
  double latent_proj = 0;     // replicated (assumed): latent MoE's hidden -> latent and latent -> hidden projections
  double norms = 0;           // replicated: pre-mixer and pre-FFN RMSNorm
  double active_routed = 0;   // routed-expert parameters one token touches (top_k experts)

  double total() const {
    return mixer + mixer_replicated + dense_mlp + routed_experts + shared_experts + router + latent_proj + norms;
  }
  double active() const { return total() - routed_experts + active_routed; }
  double non_expert() const { return total() - routed_experts; }
};

LayerParams layer_params(const ModelSpec& m, const LayerSpec& layer);

// One MTP module: a decoder layer shaped like the model's last layer, plus eh_proj (2h x h) and two norms;
// it shares the embedding and LM head with the main model (DeepSeek-V3 report, section 2.2).
LayerParams mtp_module_params(const ModelSpec& m);

struct ParamCounts {
  double embedding = 0;
  double lm_head = 0;  // 0 when tied
  double final_norm = 0;
  double decoder = 0;  // all decoder layers
  double routed_experts = 0;  // inside decoder
  double mtp = 0;      // all MTP modules
  double total = 0;    // embedding + lm_head + final_norm + decoder (MTP excluded, as publishers count)
  double total_with_mtp = 0;
  double active = 0;   // per-token parameters, embedding and LM head included, MTP excluded
};

ParamCounts count_params(const ModelSpec& m);

}  // namespace lcplan
