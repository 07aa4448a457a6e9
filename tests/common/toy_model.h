// A 2-layer toy model small enough to count every byte by hand (see memory_terms_test.cpp for the counts).
#pragma once

#include <cstdint>
#include <string>

#include "estimator/calibration.h"
#include "estimator/hardware.h"
#include "estimator/memory_model.h"
#include "estimator/plan.h"
#include "models/model_spec.h"

namespace lcplan::testing {

// hidden 64, vocab 1000, untied; layer 0: GQA (4 heads, 2 KV, head_dim 16) + dense SwiGLU (ffn 128);
// layer 1: the same attention + MoE (4 experts, top-2, expert ffn 32, no shared expert).
inline ModelSpec toy_model() {
  ModelSpec m;
  m.name = "toy";
  m.hidden = 64;
  m.vocab = 1000;
  m.dense_ffn = 128;
  m.attn.heads = 4;
  m.attn.kv_heads = 2;
  m.attn.head_dim = 16;
  m.moe.num_experts = 4;
  m.moe.top_k = 2;
  m.moe.expert_ffn = 32;
  m.layers = {{MixerKind::FullAttention, FfnKind::Dense, false}, {MixerKind::FullAttention, FfnKind::MoE, false}};
  return m;
}

// A zoo model's plan at everything's default but the model, GPUs and sequence length.
inline Plan zoo_plan(const std::string& model, int gpus, int64_t seq) {
  Plan p;
  p.model = model;
  p.gpus = gpus;
  p.seq_len = seq;
  return p;
}

// A node of 8 GPUs; the memory model reads nothing else of the hardware.
inline Hardware toy_hardware() {
  Hardware h;
  h.name = "toy";
  h.gpus_per_node = 8;
  return h;
}

// Every coefficient zero except the element sizes, so each test turns on only the terms it counts.
inline Calibration bare_calibration() {
  Calibration c;
  c.name = "bare";
  c.logits_bytes_per_element = 4;
  c.linear_ce_vocab_tile = 100;
  c.fsdp_prefetch_units = 1;
  return c;
}

// The toy on 2 GPUs (dp 2) at 128 tokens under the distributed optimizer: the counts of memory_terms_test.cpp.
inline Plan toy_plan() {
  Plan p;
  p.model = "toy";
  p.gpus = 2;
  p.seq_len = 128;
  p.optimizer_sharding = OptimizerSharding::DistOpt;
  return p;
}

// A stage's breakdown at its peak.
inline const MemoryBreakdown& at(const MemoryEstimate& e, int stage) { return e.stages.at(stage).breakdown; }

}  // namespace lcplan::testing
