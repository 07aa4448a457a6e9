// Paired baselines: the same scaled model and data give the same loss and gradient norm (and, after one Adam step,
// the same second loss) under one rank and under every parallel layout and option the executor runs: DP, dist_opt,
// FSDP, CP 2, EP 2 and 4, chunked and unchunked EP, linear CE and materialized logits, every recompute mode, PP 2 and
// 4 with 1F1B and the interleaved schedule (even, first/last and explicit splits), TP 2 and 4 with sequence
// parallelism, ETP 2, a tied embedding across stages, multi-head latent attention, q/k/v biases, and TP + PP + CP + EP
// together
// (8 ranks).
// Recompute modes rebuild bit-identical tensors (ops.h), so they must match the baseline exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "kernels/comm/helpers.h"
#include "tests/executor/exec_util.h"

namespace lcplan::exec::tests {
namespace {

// Different layouts sum in different orders (gradient reductions over ranks, the CP attention's dK/dV
// reduce-scatter, the vocabulary-parallel loss's merges, the ETP and shared-expert partial sums, the materialized vs
// streamed loss); GEMMs accumulate in fp64 (ops.h), so TP's row-parallel partial sums add up to the one-rank value,
// and everything stored is rounded to bf16 where it is produced. The observed differences stay below 1e-7 relative
// (loss 8.2e-8, gradient norm 2.4e-8 at most; PP alone is bit-identical but for the norm's summation over stages):
// the tolerance is 1e-6 relative for both. A wrong layout (a missed reduction, a misplaced CP chunk or pipeline
// message, a wrong head or vocabulary shard) moves them by 1e-3 or more. The second loss follows one Adam step,
// whose update g / (|g| + eps) turns rounding-level differences of near-zero gradients into O(lr) steps: it moves
// by up to 1.1e-6 with TP + CP + EP (8 ranks) and by ~2e-5 in an 8-layer TP model for that reason alone, so its
// tolerance is 1e-5 and the TP cases here have two layers per kind or fewer; a broken optimizer shard or parameter
// gather moves it by far more.
constexpr double kLossTol = 1e-6, kNormTol = 1e-6, kStepLossTol = 1e-5;

struct Config {
  const char* name;
  PlanArgs args;
  bool exact = false;  // must equal the baseline bit for bit
};

PlanArgs base(int64_t seq) {
  PlanArgs a;
  a.seq = seq;
  a.global_batch = 4;
  return a;
}

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

// One scaled model for every layout (the scale rules keep heads divisible by the plan's tp and cp, widths and the
// vocabulary by its tp, experts by its ep, so the model is scaled once for the widest of the comparison), each plan
// scaled to it.
ScaledCase for_model(const ModelSpec& full, const ModelSpec& scaled, const Plan& p, const ScaleOptions& so) {
  ScaledCase sc = executor_case(full, p, so);
  sc.model = scaled;
  sc.plan = scale_plan(p, scaled, so);
  return sc;
}

void run_pairs(const std::string& model, int scale, int64_t seq, const std::vector<Config>& configs,
               const ModelSpec* custom = nullptr, int layers_per_kind = 1) {
  helpers::World w;
  const ModelSpec full = custom ? *custom : zoo(model);
  Parallel widest;
  for (const Config& cfg : configs) {
    widest.cp = std::max(widest.cp, cfg.args.cp);
    widest.ep = std::max(widest.ep, cfg.args.ep);
    widest.tp = std::max(widest.tp, cfg.args.tp);
    widest.etp = std::max(widest.etp, cfg.args.etp);
  }
  const ScaleOptions so{scale, layers_per_kind};
  const ModelSpec scaled = scale_model(full, so, widest);
  ExecOptions o;
  o.steps = 2;
  const ScaledCase b = for_model(full, scaled, make_plan(model, base(seq)), so);
  const ExecResult ref = run_case(w.c, b, o);
  if (w.c.rank == 0)
    std::printf("%-28s loss %.9f / %.9f  grad norm %.9g\n", "baseline (1 rank)", ref.loss[0], ref.loss[1],
                ref.grad_norm[0]);
  for (const Config& cfg : configs) {
    PlanArgs a = cfg.args;
    a.seq = seq;
    a.global_batch = 4;
    const ScaledCase sc = for_model(full, scaled, make_plan(model, a), so);
    const ExecResult r = run_case(w.c, sc, o);
    if (w.c.rank == 0)
      std::printf("%-28s loss %.9f / %.9f  grad norm %.9g  (rel %.1e %.1e %.1e)\n", cfg.name, r.loss[0], r.loss[1],
                  r.grad_norm[0], rel(r.loss[0], ref.loss[0]), rel(r.loss[1], ref.loss[1]),
                  rel(r.grad_norm[0], ref.grad_norm[0]));
    if (cfg.exact) {
      EXPECT_EQ(r.loss[0], ref.loss[0]) << cfg.name;
      EXPECT_EQ(r.grad_norm[0], ref.grad_norm[0]) << cfg.name;
      EXPECT_EQ(r.loss[1], ref.loss[1]) << cfg.name;
    } else {
      EXPECT_LT(rel(r.loss[0], ref.loss[0]), kLossTol) << cfg.name;
      EXPECT_LT(rel(r.grad_norm[0], ref.grad_norm[0]), kNormTol) << cfg.name;
      EXPECT_LT(rel(r.loss[1], ref.loss[1]), kStepLossTol) << cfg.name;
    }
  }
}

PlanArgs c(int gpus, int cp, int ep, OptimizerSharding s = OptimizerSharding::None, Recompute rc = Recompute::None,
           bool lce = true, int chunks = 1, int rl = 0) {
  PlanArgs a;
  a.gpus = gpus;
  a.cp = cp;
  a.ep = ep;
  a.sharding = s;
  a.recompute = rc;
  a.linear_ce = lce;
  a.ep_chunks = chunks;
  a.recompute_layers = rl;
  return a;
}

using OS = OptimizerSharding;
using RC = Recompute;

// A layout with tensor, pipeline and expert tensor parallelism on top of c().
PlanArgs t(PlanArgs a, int tp, int pp, int vpp = 1, int etp = 1) {
  a.tp = tp;
  a.pp = pp;
  a.vpp = vpp;
  a.etp = etp;
  return a;
}
PlanArgs with_layout(PlanArgs a, PipelineLayout l) {
  a.pipeline = std::move(l);
  return a;
}
PipelineLayout first_last(int first, int last) {
  PipelineLayout l;
  l.first_stage_layers = first;
  l.last_stage_layers = last;
  return l;
}
PipelineLayout explicit_layers(std::vector<int> per_virtual_stage) {
  PipelineLayout l;
  l.chunk_layers = std::move(per_virtual_stage);
  return l;
}

TEST(PairedBaselines, Qwen35MoeHybrid) {
  run_pairs("qwen3.5-35b-a3b", 64, 16384,
            {
                {"selective recompute", c(1, 1, 1, OS::None, RC::Selective), true},
                {"full recompute", c(1, 1, 1, OS::None, RC::Full), true},
                {"full recompute, 1 layer", c(1, 1, 1, OS::None, RC::Full, true, 1, 1), true},
                {"ep_chunks 2 (1 rank)", c(1, 1, 1, OS::None, RC::None, true, 2), true},
                {"materialized logits", c(1, 1, 1, OS::None, RC::None, false)},
                {"dp 4", c(4, 1, 1)},
                {"dp 4 dist_opt", c(4, 1, 1, OS::DistOpt)},
                {"dp 4 fsdp", c(4, 1, 1, OS::Fsdp)},
                {"cp 2", c(2, 2, 1)},
                {"cp 2 dp 2 selective", c(4, 2, 1, OS::None, RC::Selective)},
                {"ep 2", c(2, 1, 2, OS::DistOpt)},
                {"ep 4", c(4, 1, 4)},
                {"ep 4 chunks 2", c(4, 1, 4, OS::None, RC::None, true, 2)},
                {"ep 4 chunks 3 full", c(4, 1, 4, OS::DistOpt, RC::Full, true, 3)},
                {"reference recipe", c(4, 2, 4, OS::Fsdp, RC::Full, true, 2)},
            });
}

TEST(PairedBaselines, DenseLlama) {
  run_pairs("llama-3.1-8b", 64, 8192,
            {
                {"selective recompute", c(1, 1, 1, OS::None, RC::Selective), true},
                {"full recompute", c(1, 1, 1, OS::None, RC::Full), true},
                {"materialized logits", c(1, 1, 1, OS::None, RC::None, false)},
                {"dp 4 dist_opt", c(4, 1, 1, OS::DistOpt)},
                {"dp 4 fsdp", c(4, 1, 1, OS::Fsdp)},
                {"cp 2 dp 2 fsdp full", c(4, 2, 1, OS::Fsdp, RC::Full)},
                {"cp 4", c(4, 4, 1)},
            });
}

// Sliding-window attention (no zoo model the executor runs has it): Llama with every other layer sliding over a
// window shorter than the sequence, so CP ranks see chunks whose keys start inside the window.
TEST(PairedBaselines, SlidingWindow) {
  ModelSpec m = zoo("llama-3.1-8b");
  m.attn.sliding_window = 64 * 48;  // 48 tokens after scale 64
  for (size_t i = 0; i < m.layers.size(); i += 2) m.layers[i].sliding = true;
  run_pairs("llama-3.1-8b", 64, 8192,
            {
                {"selective recompute", c(1, 1, 1, OS::None, RC::Selective), true},
                {"cp 2 dp 2", c(4, 2, 1)},
                {"cp 4 fsdp", c(4, 4, 1, OS::Fsdp)},
            },
            &m);
}

// Pipeline parallelism on the hybrid MoE model with two layers of each kind (GDN, GDN, full, full): Megatron's 1F1B
// and interleaved orders, the stages' messages, uneven first/last and explicit splits (one virtual stage empty),
// with DP, EP, FSDP and full recompute of each virtual stage's first layer.
TEST(PairedBaselines, PipelineQwen35) {
  run_pairs("qwen3.5-35b-a3b", 64, 16384,
            {
                {"pp 2 1F1B", t(c(2, 1, 1), 1, 2)},
                {"pp 2 dp 2 dist_opt", t(c(4, 1, 1, OS::DistOpt), 1, 2)},
                {"pp 4 1F1B full", t(c(4, 1, 1, OS::None, RC::Full), 1, 4)},
                {"pp 2 vpp 2 interleaved", t(c(2, 1, 1, OS::None, RC::Selective), 1, 2, 2)},
                {"pp 2 first 1 last 3", with_layout(t(c(2, 1, 1), 1, 2), first_last(1, 3))},
                {"pp 2 vpp 2 explicit 1,2,0,1", with_layout(t(c(2, 1, 1, OS::None, RC::Full, true, 1, 1), 1, 2, 2),
                                                          explicit_layers({1, 2, 0, 1}))},
                {"pp 2 ep 2 fsdp chunks 2", t(c(4, 1, 2, OS::Fsdp, RC::None, true, 2), 1, 2)},
            },
            nullptr, 2);
}

// Tensor parallelism with sequence parallelism on the hybrid MoE model: heads of both mixers, the shared expert
// and the vocabulary split over TP; expert tensor parallelism inside the MoE layer (with EP, and as the TP group).
TEST(PairedBaselines, TensorQwen35) {
  run_pairs("qwen3.5-35b-a3b", 64, 16384,
            {
                {"tp 2", t(c(2, 1, 1), 2, 1)},
                {"tp 2 selective", t(c(2, 1, 1, OS::None, RC::Selective), 2, 1)},
                {"tp 2 materialized logits", t(c(2, 1, 1, OS::None, RC::None, false), 2, 1)},
                {"tp 2 dp 2 ep 2 dist_opt", t(c(4, 1, 2, OS::DistOpt), 2, 1)},
                {"etp 2 ep 2 chunks 2", t(c(4, 1, 2, OS::None, RC::None, true, 2), 1, 1, 1, 2)},
                {"tp 2 etp 2 full", t(c(2, 1, 1, OS::None, RC::Full), 2, 1, 1, 2)},
                {"tp 2 cp 2 fsdp", t(c(4, 2, 1, OS::Fsdp), 2, 1)},
                {"tp 2 pp 2 ep 2 full", t(c(4, 1, 2, OS::DistOpt, RC::Full), 2, 2)},
            });
}

// Multi-head latent attention (DeepSeek-V3: query compression, the sigmoid group-limited router; Moonlight: no query
// compression): the duplicated down-projections and the shared rope key under TP (their gradients summed over TP),
// the padded-v core attention under CP, every recompute mode, and with EP, PP and FSDP.
TEST(PairedModels, MultiHeadLatentAttention) {
  run_pairs("deepseek-v3", 64, 16384,
            {
                {"selective recompute", c(1, 1, 1, OS::None, RC::Selective), true},
                {"full recompute", c(1, 1, 1, OS::None, RC::Full), true},
                {"dp 2 ep 2", c(2, 1, 2, OS::DistOpt)},
                {"cp 2", c(2, 2, 1)},
                {"tp 2", t(c(2, 1, 1), 2, 1)},
                {"tp 2 selective", t(c(2, 1, 1, OS::None, RC::Selective), 2, 1)},
                {"tp 2 cp 2 fsdp", t(c(4, 2, 1, OS::Fsdp), 2, 1)},
                {"pp 2 ep 2 full", t(c(4, 1, 2, OS::DistOpt, RC::Full), 1, 2)},
            });
  run_pairs("moonlight-16b-a3b", 64, 16384,
            {
                {"selective recompute", c(1, 1, 1, OS::None, RC::Selective), true},
                {"tp 2 ep 2", t(c(2, 1, 2), 2, 1)},
                {"cp 2 full", c(2, 2, 1, OS::None, RC::Full)},
            });
}

// GLM-4.5: q/k/v biases (column-parallel with their weight), q/k norm, half-rotary RoPE, the sigmoid router with a
// routed scaling factor, under TP, CP and EP.
TEST(PairedModels, AttentionBiasGlm45) {
  run_pairs("glm-4.5", 64, 16384,
            {
                {"selective recompute", c(1, 1, 1, OS::None, RC::Selective), true},
                {"tp 2", t(c(2, 1, 1), 2, 1)},
                {"cp 2 ep 2 full", c(2, 2, 2, OS::DistOpt, RC::Full)},
            });
}

// Dense model, eight layers: the interleaved schedule at pp 4 (Megatron's warmup of 2 (pp - stage - 1) + pp
// forwards on each stage), with FSDP and full recompute, with DP, and an uneven first/last split at pp 4.
TEST(PairedBaselines, PipelineLlama) {
  run_pairs("llama-3.1-8b", 64, 8192,
            {
                {"pp 4 vpp 2", t(c(4, 1, 1), 1, 4, 2)},
                {"pp 4 vpp 2 fsdp full", t(c(4, 1, 1, OS::Fsdp, RC::Full), 1, 4, 2)},
                {"pp 2 vpp 2 dp 2 dist_opt", t(c(4, 1, 1, OS::DistOpt, RC::Selective), 1, 2, 2)},
                {"pp 4 first 1 last 3", with_layout(t(c(4, 1, 1), 1, 4), first_last(1, 3))},
            },
            nullptr, 8);
}

// Dense model under TP 2 and 4 (GQA heads, the dense MLP and the vocabulary split), with the materialized
// vocabulary-parallel loss, selective recompute, and TP with PP and FSDP.
TEST(PairedBaselines, TensorLlama) {
  run_pairs("llama-3.1-8b", 64, 8192,
            {
                {"tp 2 materialized", t(c(2, 1, 1, OS::None, RC::None, false), 2, 1)},
                {"tp 4", t(c(4, 1, 1), 4, 1)},
                {"tp 4 selective materialized", t(c(4, 1, 1, OS::None, RC::Selective, false), 4, 1)},
                {"tp 2 pp 2 fsdp", t(c(4, 1, 1, OS::Fsdp), 2, 2)},
            },
            nullptr, 2);
}

// A tied embedding: the last stage's copy gets the sum of both stages' gradients and the norm counts it once.
TEST(PairedBaselines, TiedEmbedding) {
  ModelSpec m = zoo("llama-3.1-8b");
  m.tied_embeddings = true;
  run_pairs("llama-3.1-8b", 64, 8192,
            {
                {"pp 2 tied", t(c(2, 1, 1), 1, 2)},
                {"pp 2 tp 2 tied fsdp", t(c(4, 1, 1, OS::Fsdp), 2, 2)},
            },
            &m, 2);
}

// Every dimension at once on 8 ranks (tests/executor/CMakeLists.txt runs this one under mpirun -np 8).
TEST(PairedBaselines8, TensorPipelineContextExpert) {
  helpers::World w;
  if (w.c.size < 8) GTEST_SKIP() << "needs 8 ranks";
  run_pairs("qwen3.5-35b-a3b", 64, 16384,
            {
                {"tp 2 pp 2 cp 2 ep 2 full", t(c(8, 2, 2, OS::DistOpt, RC::Full, true, 2), 2, 2)},
                {"tp2 pp2 vpp2 cp2 ep2 etp2 fsdp", t(c(8, 2, 2, OS::Fsdp, RC::Selective), 2, 2, 2, 2)},
            },
            nullptr, 2);
}

}  // namespace
}  // namespace lcplan::exec::tests
