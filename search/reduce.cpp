#include "search/reduce.h"

#include <algorithm>
#include <cstdio>

#include "estimator/derived_plan.h"
#include "estimator/frameworks.h"
#include "models/params.h"

namespace lcplan {

namespace {

std::string fmt(const char* f, double a, double b = 0, double c = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, a, b, c);
  return buf;
}

bool has_moe(const ModelSpec& m) {
  return std::any_of(m.layers.begin(), m.layers.end(), [](const LayerSpec& l) { return l.ffn == FfnKind::MoE; });
}

struct Tried {
  bool valid = false, fits = false;
  Candidate c;
  std::string why;  // rule sentence or memory shortfall
};

Tried try_plan(const ModelSpec& m, const Plan& p, const Hardware& hw, const Calibration& cal, const SearchOptions& opt) {
  Tried t;
  t.c.plan = p;
  if (auto v = check_plan(m, p)) {
    t.why = v->message;
    return t;
  }
  t.valid = true;
  t.c.estimate = estimate(m, p, hw, cal);
  t.fits = t.c.estimate.peak_bytes_band.high <= hw.hbm_bytes - opt.headroom_bytes;
  if (!t.fits)
    t.why = fmt("the top of its peak's error band, %.1f GiB (peak %.1f GiB), exceeds %.1f GiB usable",
                t.c.estimate.peak_bytes_band.high / (1 << 30), t.c.estimate.memory.peak_bytes / (1 << 30),
                (hw.hbm_bytes - opt.headroom_bytes) / (1 << 30));
  return t;
}

}  // namespace

ReducedRecipe reduce_recipe(const ModelSpec& m, const Plan& base, const Hardware& hw, const Calibration& cal,
                            const SearchOptions& opt, const SearchResult& exhaustive, const RecipeRules& rules) {
  ReducedRecipe out;
  const bool moe = has_moe(m);
  const double total = count_params(m).total;
  Plan p = base;
  p.parallel = {1, 1, 1, 1, 1, 1};
  p.micro_batch = 1;
  p.optimizer_sharding = OptimizerSharding::Fsdp;
  p.recompute = Recompute::Full;
  p.recompute_layers = 0;
  const Framework* framework = find_framework(base.implementation);
  p.linear_ce = !framework || framework->can.linear_ce;
  p.offload.optimizer = p.offload.activations = false;
  p.offload.modules = 0;

  // EP by model size.
  if (moe) {
    const int want = total <= rules.ep_size_threshold_params ? rules.ep_small : rules.ep_large;
    int ep = want;
    while (ep > 1 && (m.moe.num_experts % ep != 0 || base.gpus % ep != 0)) ep /= 2;
    p.parallel.ep = ep;
    out.rationale.push_back(fmt("EP %.0f: the model has %.1fB parameters (rule: EP 8 up to 100B, 32 above)", ep, total / 1e9));
    if (ep != want) out.broken.push_back(fmt("EP rule wanted %.0f but the experts or GPUs only allow %.0f", want, ep));
    // Chunked EP where the framework runs it (estimator/frameworks.h); Megatron-LM's nearest, the cross-microbatch
    // overlap, does not run with full recompute, so its recipe keeps one chunk and no overlap.
    const Framework* fw = find_framework(base.implementation);
    if (!fw || fw->can.chunked_ep) {
      p.moe.ep_chunks = rules.ep_chunks;
      out.rationale.push_back(fmt("chunked EP with %.0f chunks: hides dispatch/combine under expert GEMMs", rules.ep_chunks));
    } else {
      p.moe.ep_chunks = 1;
      p.moe.a2a_overlap = false;
      out.broken.push_back(std::string("chunked EP: ") + fw->name + " does not run it (its cross-microbatch EP overlap does not "
                           "run with full recompute), so the recipe keeps one chunk");
    }
  } else {
    p.moe.ep_chunks = 1;
    out.rationale.push_back("EP 1: dense model");
  }
  out.rationale.push_back("TP 1: removed by default (no model or hardware reason yet)");

  // CP from the target local sequence.
  int cp = 1;
  p.parallel.cp = cp;
  while (local_tokens(p) > rules.target_local_seq_max && cp < base.gpus) p.parallel.cp = cp *= 2;
  out.rationale.push_back(fmt("CP %.0f: local sequence %.0fK tokens (rule: keep it at 16K-32K)", cp,
                              local_tokens(p) / 1024));
  out.rationale.push_back("FSDP (ZeRO-3) for static state, full recompute for activations, linear CE for logits");

  // Bend the rules in the article's order of preference when the rule recipe is invalid or does not fit.
  Tried t = try_plan(m, p, hw, cal, opt);
  if (!t.valid || !t.fits) {
    out.broken.push_back("the rule recipe (TP 1, PP 1, CP " + std::to_string(cp) + ") " +
                         (t.valid ? "does not fit: " : "is invalid: ") + t.why);
    // Bend in order of preference: PP first ("optional 2"), then more CP, then TP, each only as far as needed.
    std::vector<Plan> bends;
    for (int tp : {1, 2, 4, 8})
      for (int cp_mult : {1, 2, 4})
        for (int pp : {1, 2, 4, 8}) {
          Plan b = p;
          b.parallel.tp = tp;
          b.parallel.cp = cp * cp_mult;
          b.parallel.pp = pp;
          bends.push_back(b);
        }
    bool ok = false;
    for (const Plan& b : bends) {
      Tried bt = try_plan(m, b, hw, cal, opt);
      if (bt.valid && bt.fits) {
        t = bt;
        ok = true;
        out.broken.push_back(fmt("bent to PP %.0f, CP %.0f, TP %.0f to fit", b.parallel.pp, b.parallel.cp, b.parallel.tp));
        break;
      }
    }
    if (!ok) return out;
  } else {
    // PP only when it pays: PP 2 must beat PP 1 by the rule's margin.
    Plan p2 = t.c.plan;
    p2.parallel.pp = 2;
    const Tried t2 = try_plan(m, p2, hw, cal, opt);
    const double gain = t2.valid && t2.fits ? t2.c.estimate.time.tokens_per_second_per_gpu /
                                                      t.c.estimate.time.tokens_per_second_per_gpu - 1
                                            : -1;
    if (gain > rules.pp_pays_fraction) {
      out.rationale.push_back(fmt("PP 2: pays %.1f%% throughput over PP 1", 100 * gain));
      t = t2;
    } else {
      out.rationale.push_back(t2.valid && t2.fits ? fmt("PP 1: PP 2 would change throughput by %+.1f%%", 100 * gain)
                                                  : "PP 1: PP 2 is not valid or does not fit here");
    }
  }
  out.found = true;
  out.plan = t.c;
  if (!exhaustive.top.empty()) {
    const Candidate& best = exhaustive.top.front();
    const double bt = best.estimate.time.tokens_per_second_per_gpu;
    out.throughput_gap = bt > 0 ? (bt - out.plan.estimate.time.tokens_per_second_per_gpu) / bt : 0;
    out.memory_delta_bytes = out.plan.estimate.memory.peak_bytes - best.estimate.memory.peak_bytes;
    if (out.throughput_gap > rules.pp_pays_fraction) {
      // Name the rules the faster plan departs from.
      const Parallel& b = best.plan.parallel;
      const Parallel& r = out.plan.plan.parallel;
      std::string diff;
      auto note = [&](const char* rule, int bv, int rv) {
        if (bv != rv) diff += (diff.empty() ? "" : ", ") + std::string(rule) + " " + std::to_string(bv) + " (rule: " + std::to_string(rv) + ")";
      };
      note("EP", b.ep, r.ep);
      note("CP", b.cp, r.cp);
      note("PP", b.pp, r.pp);
      note("TP", b.tp, r.tp);
      if (best.plan.moe.ep_chunks != out.plan.plan.moe.ep_chunks) note("ep_chunks", best.plan.moe.ep_chunks, out.plan.plan.moe.ep_chunks);
      if (best.plan.offload.optimizer != out.plan.plan.offload.optimizer) diff += (diff.empty() ? "" : ", ") + std::string("optimizer offload");
      out.broken.push_back(fmt("the recipe loses %.1f%% throughput to the exhaustive best", 100 * out.throughput_gap) +
                           (diff.empty() ? std::string() : ", which uses " + diff));
    }
  }
  return out;
}

}  // namespace lcplan
