// What each case sweeps: defaults per backend, or exactly the shapes one plan runs (`lcplan profile --plan`), and
// the CPU budget rule that shrinks a shape too slow to time.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "estimator/hardware.h"
#include "estimator/plan.h"
#include "kernels/moe/moe_layer.h"
#include "models/model_spec.h"

namespace lcplan::profiler {

struct GemmClass {
  std::string name;  // the model's GEMM it stands for ("attn_qkv", "lm_head") or "NxK"
  int64_t n = 0, k = 0;
};

// The plan's parallel sizes the collectives and the MoE layer reproduce on the launched ranks.
struct PlanGroups {
  int tp = 1, cp = 1, ep = 1, etp = 1, pp = 1;
};

struct Targets {
  std::string plan;                   // "" or a one-line summary of the plan whose shapes these are
  std::vector<std::string> notes;     // where a plan shape was taken from / adapted

  std::vector<int64_t> gemm_tokens;   // m
  std::vector<GemmClass> gemm_classes;

  int grouped_experts = 0;            // local experts
  int64_t grouped_hidden = 0, grouped_ffn = 0;
  std::vector<int64_t> grouped_tokens;  // tokens per local expert

  int64_t attn_heads = 0, attn_kv_heads = 0, attn_head_dim = 0;
  std::vector<int64_t> attn_seqs;

  int64_t la_key_heads = 0, la_value_heads = 0, la_key_dim = 0, la_value_dim = 0;
  std::vector<int64_t> la_seqs;

  int64_t ce_hidden = 0, ce_vocab = 0, ce_token_tile = 0;
  std::vector<int64_t> ce_tokens, ce_vocab_tiles;

  moe::MoeConfig moe;                 // experts = experts per rank x EP group (set by the case from the ranks it runs)
  int moe_local_experts = 0;
  std::vector<int64_t> moe_tokens;    // local tokens per rank
  std::vector<int> moe_chunks;

  double min_bytes = 0, max_bytes = 0, step_factor = 2;
  std::vector<double> copy_bytes;

  bool has_plan_groups = false;
  PlanGroups groups;

  double max_call_flops = 0;          // CPU budget of one timed call (0: none)
};

// Defaults of a backend ("cpu" or "cuda"); quick = fewer points.
Targets default_targets(const std::string& backend, bool quick);

// The shapes `p` runs on one rank: local and hidden tokens, the model's GEMMs (TP-sharded), experts per rank and
// tokens per local expert per chunk, local attention sequence and heads, the vocabulary share, chunk counts, the
// messages its groups send. `p` must be valid for `m`; `hw` is the plan's hardware (its node size).
Targets plan_targets(const ModelSpec& m, const Plan& p, const Hardware& hw, const std::string& backend, bool quick);

// Geometric sequence lo, lo*f, ... up to hi, hi included (integers, deduplicated).
std::vector<int64_t> geometric(int64_t lo, int64_t hi, double factor);

// One dimension a budget may shrink: halved (rounded down, never below `floor`). Lower groups shrink first; within a
// group the largest dimension is halved first, so the shape keeps its proportions.
struct Dim {
  const char* name;
  int64_t* value;
  int64_t floor;
  int group = 0;
};
// Halves dims (lowest group with a dim above its floor; the largest such dim of it) until flops() <= budget or every
// dim is at its floor. Returns "" when nothing changed, else "name a->b, ..." for the note.
std::string shrink_to_budget(const std::vector<Dim>& dims, const std::function<double()>& flops, double budget);

}  // namespace lcplan::profiler
