// Paired baselines: the same scaled model and data give the same loss and gradient norm (and, after one Adam step,
// the same second loss) under one rank and under every parallel layout and option the executor runs: DP, dist_opt,
// FSDP, CP 2, EP 2 and 4, chunked and unchunked EP, linear CE and materialized logits, every recompute mode.
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
// reduce-scatter, the materialized vs streamed loss); everything stored is rounded to bf16 where it is produced, and
// the observed differences stay below 1e-7 relative (loss 2.6e-8, gradient norm 7.6e-8 at most): the tolerance is
// 1e-6 relative for both. A wrong layout (a missed reduction, a misplaced CP chunk) moves them by 1e-3 or more.
constexpr double kLossTol = 1e-6, kNormTol = 1e-6;

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

// One scaled model for every layout (the scale rules keep heads divisible by the plan's cp and experts by its ep, so
// the model is scaled once for the widest cp and ep of the comparison), each plan scaled to it.
ScaledCase for_model(const ModelSpec& full, const ModelSpec& scaled, const Plan& p, int scale) {
  ScaledCase sc = executor_case(full, p, {scale, 1});
  sc.model = scaled;
  sc.plan = scale_plan(p, scaled, {scale, 1});
  return sc;
}

void run_pairs(const std::string& model, int scale, int64_t seq, const std::vector<Config>& configs,
               const ModelSpec* custom = nullptr) {
  helpers::World w;
  const ModelSpec full = custom ? *custom : zoo(model);
  Parallel widest;
  for (const Config& cfg : configs) {
    widest.cp = std::max(widest.cp, cfg.args.cp);
    widest.ep = std::max(widest.ep, cfg.args.ep);
  }
  const ModelSpec scaled = scale_model(full, {scale, 1}, widest);
  ExecOptions o;
  o.steps = 2;
  const ScaledCase b = for_model(full, scaled, make_plan(model, base(seq)), scale);
  const ExecResult ref = run_case(w.c, b, o);
  if (w.c.rank == 0)
    std::printf("%-28s loss %.9f / %.9f  grad norm %.9g\n", "baseline (1 rank)", ref.loss[0], ref.loss[1],
                ref.grad_norm[0]);
  for (const Config& cfg : configs) {
    PlanArgs a = cfg.args;
    a.seq = seq;
    a.global_batch = 4;
    const ScaledCase sc = for_model(full, scaled, make_plan(model, a), scale);
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
      EXPECT_LT(rel(r.loss[1], ref.loss[1]), kLossTol) << cfg.name;
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

}  // namespace
}  // namespace lcplan::exec::tests
