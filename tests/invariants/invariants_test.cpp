// Estimator invariants as seeded property tests: for every zoo model, a seeded sample of random VALID plans (sampled
// until check_plan passes), each checked against the physics the estimator must respect. A violation prints the
// smallest plan that still breaks it (each dimension reduced while the failure persists) and fails the test.
// 10,000 plans per model (2,000 in the sanitizer build); LCPLAN_INVARIANT_PLANS overrides the count (e.g. a soak
// run), LCPLAN_INVARIANT_SEED the seed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "estimator/estimate.h"
#include "estimator/flops.h"
#include "estimator/plan_rules.h"
#include "estimator/time_model.h"
#include "common/data_dir.h"
#include "models/zoo.h"
#include "search/search.h"

using namespace lcplan;

#ifndef LCPLAN_INVARIANT_DEFAULT_PLANS
#define LCPLAN_INVARIANT_DEFAULT_PLANS 10000
#endif

namespace {

struct Ctx {
  ModelSpec m;
  Hardware hw;       // HBM made effectively infinite so the pinned search keeps every plan
  std::vector<Calibration> cals;
};

const Calibration& cal_of(const Ctx& c, const Plan& p) {
  for (const auto& cal : c.cals)
    if (cal.name == p.implementation) return cal;
  return c.cals.front();
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

bool has_moe(const ModelSpec& m) {
  for (const auto& l : m.layers)
    if (l.ffn == FfnKind::MoE) return true;
  return false;
}

// ---- random valid plans -------------------------------------------------------------------------------------

template <typename T>
T pick(std::mt19937_64& rng, const std::vector<T>& v) {
  return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)];
}

std::vector<int> divisors_upto(int n, int cap) {
  std::vector<int> d;
  for (int x = 1; x <= std::min(n, cap); ++x)
    if (n % x == 0) d.push_back(x);
  return d;
}

Plan random_plan(const Ctx& c, std::mt19937_64& rng) {
  const ModelSpec& m = c.m;
  const bool moe = has_moe(m);
  Plan p;
  p.model = m.name;
  p.hardware = c.hw.name;
  p.gpus_per_node = 8;
  p.implementation = pick(rng, std::vector<std::string>{"megatron", "bumblebee", "lcplan-exec"});
  p.parallel.tp = pick(rng, std::vector<int>{1, 1, 2, 4, 8});
  p.parallel.pp = pick(rng, divisors_upto(int(m.layers.size()), 16));
  p.parallel.vpp = p.parallel.pp > 1 ? pick(rng, std::vector<int>{1, 1, 2, 3, 4}) : 1;
  p.parallel.cp = pick(rng, std::vector<int>{1, 1, 2, 4, 8, 16});
  const int dp = pick(rng, std::vector<int>{1, 2, 4, 8, 16, 32});
  p.gpus = p.parallel.tp * p.parallel.pp * p.parallel.cp * dp;
  p.parallel.ep = moe ? pick(rng, std::vector<int>{1, 2, 4, 8, 16, 32, 64}) : 1;
  p.parallel.etp = moe ? pick(rng, std::vector<int>{1, 1, 2}) : 1;
  p.seq_len = pick(rng, std::vector<int64_t>{4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576});
  p.micro_batch = pick(rng, std::vector<int>{1, 1, 2, 4});
  p.global_batch = pick(rng, std::vector<int>{0, 0, 1, 2, 4, 8}) * p.micro_batch * dp;
  p.precision = pick(rng, std::vector<Precision>{Precision::BF16, Precision::FP8});
  p.sequence_parallel = pick(rng, std::vector<bool>{true, true, false});
  p.optimizer_sharding =
      pick(rng, std::vector<OptimizerSharding>{OptimizerSharding::None, OptimizerSharding::DistOpt, OptimizerSharding::Fsdp});
  p.recompute = pick(rng, std::vector<Recompute>{Recompute::None, Recompute::Selective, Recompute::Full});
  if (p.recompute == Recompute::Full) {
    const int per_chunk = int(m.layers.size()) / (p.parallel.pp * p.parallel.vpp);
    p.recompute_layers = std::uniform_int_distribution<int>(0, std::max(0, per_chunk))(rng);
  }
  p.offload.optimizer = pick(rng, std::vector<bool>{false, false, true});
  p.offload.activations = pick(rng, std::vector<bool>{false, false, false, true});
  p.linear_ce = pick(rng, std::vector<bool>{false, true});
  p.moe.ep_chunks = moe ? pick(rng, std::vector<int>{1, 1, 2, 3, 4}) : 1;
  p.moe.routing_imbalance = moe ? pick(rng, std::vector<double>{1.0, 1.0, 1.1, 1.5, 2.0}) : 1.0;
  p.moe.capacity_factor = moe ? pick(rng, std::vector<double>{0, 0, 1.0, 1.25}) : 0;
  return p;
}

Plan random_valid_plan(const Ctx& c, std::mt19937_64& rng) {
  for (int tries = 0;; ++tries) {
    Plan p = random_plan(c, rng);
    if (!check_plan(c.m, p)) return p;
    if (tries > 100000) throw std::runtime_error("no valid plan sampled for " + c.m.name);
  }
}

bool valid(const Ctx& c, const Plan& p) { return !check_plan(c.m, p); }

// ---- measures -------------------------------------------------------------------------------------------------

// Static memory of a stage: what lives for the whole step (parameters, gradients, optimizer state).
double static_bytes(const StageMemory& s) { return s.breakdown.params + s.breakdown.grads + s.breakdown.optimizer; }

// FNV-1a (64-bit) of a model name: a per-model seed that is the same with every standard library, unlike std::hash.
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

// Relative slack for comparisons of sums computed in different orders.
bool le(double a, double b) { return a <= b * (1 + 1e-12) + 1e-6; }

std::string gib(double b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6f GiB", b / (1024.0 * 1024 * 1024));
  return buf;
}

// ---- invariants: each reports whether it compared anything for base plan p, and what broke if something did -----

struct Verdict {
  bool compared = false;               // p was in the invariant's domain and at least one comparison ran
  std::optional<std::string> failure;  // the broken property, in words
};
using Check = std::function<Verdict(const Ctx&, const Plan&)>;

Verdict outside_domain() { return {}; }
Verdict held() { return {true, std::nullopt}; }
Verdict broken(std::string why) { return {true, std::move(why)}; }

struct Invariant {
  const char* name;
  Check check;
};

Verdict finite_and_same_as_search(const Ctx& c, const Plan& p) {
  const Calibration& cal = cal_of(c, p);
  const Estimate e = estimate(c.m, p, c.hw, cal);
  auto bad = [](double x) { return !std::isfinite(x) || x < 0; };
  for (const auto& s : e.memory.stages) {
    const MemoryBreakdown& b = s.breakdown;
    for (double x : {b.params, b.grads, b.optimizer, b.fsdp_buffers, b.activations, b.logits, b.moe_buffers,
                     b.workspace, b.cuda_context, b.fragmentation, s.peak_bytes})
      if (bad(x)) return broken("a memory term of stage " + std::to_string(s.stage) + " is negative or not finite");
  }
  const TimeEstimate& t = e.time;
  const TimeBreakdown& tb = t.breakdown;
  for (double x : {t.step_seconds, t.model_flops_per_step, t.tflops_per_gpu, t.mfu, t.tokens_per_second_per_gpu,
                   tb.compute, tb.recompute, tb.exposed_comm.total(), tb.bubble, tb.launch_overhead, tb.optimizer})
    if (bad(x)) return broken("a time term is negative or not finite");
  if (!(t.step_seconds > 0)) return broken("step time is not positive");

  // The search path: the same plan as the only point of a pinned space must give the identical record.
  PlanSpace s;
  s.tp = {p.parallel.tp};
  s.pp = {p.parallel.pp};
  s.vpp = {p.parallel.vpp};
  s.cp = {p.parallel.cp};
  s.ep = {p.parallel.ep};
  s.etp = {p.parallel.etp};
  s.micro_batch = {p.micro_batch};
  s.ep_chunks = {p.moe.ep_chunks};
  s.sharding = {p.optimizer_sharding};
  s.recompute = {p.recompute};
  s.recompute_layers = {p.recompute_layers};
  s.recompute_fractions = {1.0};
  s.linear_ce = {p.linear_ce};
  s.offload_optimizer = {p.offload.optimizer};
  SearchOptions opt;
  opt.top_k = 1;
  const SearchResult r = search_plans(c.m, p, s, c.hw, cal, opt);
  if (r.top.size() != 1) return broken("the pinned search returned " + std::to_string(r.top.size()) + " plans instead of 1");
  const auto a = estimate_to_json(e, p), b = estimate_to_json(r.top.front().estimate, r.top.front().plan);
  if (a != b) return broken("estimate() and the search path disagree: " + a.dump() + " vs " + b.dump());
  return held();
}

Verdict sharding_order(const Ctx& c, const Plan& p) {
  const Calibration& cal = cal_of(c, p);
  Plan q = p;
  q.optimizer_sharding = OptimizerSharding::Fsdp;
  const MemoryEstimate fsdp = estimate_memory(c.m, q, c.hw, cal);
  q.optimizer_sharding = OptimizerSharding::DistOpt;
  const MemoryEstimate dist = estimate_memory(c.m, q, c.hw, cal);
  q.optimizer_sharding = OptimizerSharding::None;
  const MemoryEstimate none = estimate_memory(c.m, q, c.hw, cal);
  for (size_t i = 0; i < fsdp.stages.size(); ++i) {
    const double f = static_bytes(fsdp.stages[i]), d = static_bytes(dist.stages[i]), n = static_bytes(none.stages[i]);
    if (!le(f, d) || !le(d, n))
      return broken("stage " + std::to_string(i) + " static memory fsdp " + gib(f) + ", dist_opt " + gib(d) + ", none " + gib(n));
  }
  return {!fsdp.stages.empty(), std::nullopt};
}

Verdict linear_ce_never_raises_peak(const Ctx& c, const Plan& p) {
  // Domain: linear CE keeps an fp32 d_hidden (4*hidden bytes per token) and a vocabulary tile while materialized logits
  // cost 4*vocab/tp; with a local vocabulary below ~2x hidden (mixtral/llama-405b at tp 8) streaming really can cost
  // more, and nobody would choose it there.
  if (double(c.m.vocab) / p.parallel.tp < 2.0 * c.m.hidden) return outside_domain();
  const Calibration& cal = cal_of(c, p);
  Plan q = p;
  q.linear_ce = false;
  const double off = estimate_memory(c.m, q, c.hw, cal).peak_bytes;
  q.linear_ce = true;
  const double on = estimate_memory(c.m, q, c.hw, cal).peak_bytes;
  if (!le(on, off)) return broken("peak with linear CE " + gib(on) + " > without " + gib(off));
  return held();
}

// Each stage reports the breakdown of its own peak phase, so two plans whose stages peak in different phases (the
// loss phase taking over, say) would compare activations of different moments. This view pins the phase instead:
// without logits (materialized logits priced at 0 bytes, linear CE off) the backward phase, which holds every saved
// activation plus the rematerialized layer, is the peak or ties with the forward phase (then with equal activations),
// so every stage's activations are its backward-phase activations. Logits never change the activations themselves.
MemoryEstimate backward_phase_view(const Ctx& c, Plan p) {
  Calibration cal = cal_of(c, p);
  cal.logits_bytes_per_element = 0;
  p.linear_ce = false;
  return estimate_memory(c.m, p, c.hw, cal);
}

// Backward-phase activations of plan b never above those of plan a, stage by stage (views from backward_phase_view).
Verdict activations_not_above(const MemoryEstimate& a, const MemoryEstimate& b, const std::string& an,
                              const std::string& bn) {
  for (size_t i = 0; i < a.stages.size(); ++i) {
    const StageMemory &sa = a.stages[i], &sb = b.stages[i];
    for (const StageMemory* s : {&sa, &sb})
      if (s->peak_phase != Phase::Backward && s->peak_phase != Phase::Forward)
        return broken("stage " + std::to_string(i) + " peaks in the " + to_string(s->peak_phase) +
                      " phase even without logits, so the test's fixed-phase view no longer holds");
    if (!le(sb.breakdown.activations, sa.breakdown.activations))
      return broken("stage " + std::to_string(i) + " backward-phase activations with " + bn + " " +
                    gib(sb.breakdown.activations) + " > with " + an + " " + gib(sa.breakdown.activations));
  }
  return {!a.stages.empty(), std::nullopt};
}

// The real peak (every phase, logits included) of plan b never above plan a's, stage by stage.
Verdict peak_not_above(const MemoryEstimate& a, const MemoryEstimate& b, const std::string& an, const std::string& bn) {
  for (size_t i = 0; i < a.stages.size(); ++i)
    if (!le(b.stages[i].peak_bytes, a.stages[i].peak_bytes))
      return broken("stage " + std::to_string(i) + " peak with " + bn + " " + gib(b.stages[i].peak_bytes) + " > with " +
                    an + " " + gib(a.stages[i].peak_bytes));
  return {!a.stages.empty(), std::nullopt};
}

Verdict recompute_never_raises_activations(const Ctx& c, const Plan& p) {
  const Calibration& cal = cal_of(c, p);
  const int per_chunk = int(c.m.layers.size()) / (p.parallel.pp * p.parallel.vpp);
  Plan none = p, sel = p, all = p;
  none.recompute = Recompute::None;
  none.recompute_layers = 0;
  sel.recompute = Recompute::Selective;
  sel.recompute_layers = 0;
  all.recompute = Recompute::Full;
  all.recompute_layers = 0;
  const MemoryEstimate vn = backward_phase_view(c, none), vs = backward_phase_view(c, sel), va = backward_phase_view(c, all);
  // Selective only drops saved tensors: nothing else changes, so its real peak cannot rise either.
  if (auto v = activations_not_above(vn, vs, "none", "selective"); v.failure || !v.compared) return v;
  if (auto v = peak_not_above(estimate_memory(c.m, none, c.hw, cal), estimate_memory(c.m, sel, c.hw, cal), "none", "selective"); v.failure)
    return v;
  if (auto v = activations_not_above(vs, va, "selective", "full(all layers)"); v.failure) return v;
  // Full recompute of the first k layers of each virtual stage (Megatron "block"): more layers, less memory.
  // The ladder starts at none (k = 0 layers) and ends at all layers; the plan's own k and its neighbours are checked.
  std::vector<int> ks = {1, p.recompute_layers - 1, p.recompute_layers, p.recompute_layers + 1};
  std::sort(ks.begin(), ks.end());
  ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
  MemoryEstimate prev = vn;
  std::string prev_name = "none";
  for (int k : ks) {
    if (k < 1 || k >= per_chunk) continue;
    Plan q = all;
    q.recompute_layers = k;
    const MemoryEstimate vk = backward_phase_view(c, q);
    const std::string name = "full(" + std::to_string(k) + " layers)";
    if (auto v = activations_not_above(prev, vk, prev_name, name); v.failure) return v;
    prev = vk;
    prev_name = name;
  }
  return activations_not_above(prev, va, prev_name, "full(all layers)");
}

Verdict ep_never_raises_expert_params(const Ctx& c, const Plan& p) {
  Plan q = p;
  q.parallel.ep *= 2;
  if (!valid(c, q)) return outside_domain();
  for (int s = 0; s < p.parallel.pp; ++s) {
    const double a = derive_plan(c.m, p, c.hw).stages[s].params.expert, b = derive_plan(c.m, q, c.hw).stages[s].params.expert;
    if (!le(b, a))
      return broken("stage " + std::to_string(s) + " expert parameters at ep " + std::to_string(q.parallel.ep) + " " +
                    std::to_string(b) + " > at ep " + std::to_string(p.parallel.ep) + " " + std::to_string(a));
  }
  return {p.parallel.pp > 0, std::nullopt};
}

Verdict cp_never_raises_layer_activations(const Ctx& c, const Plan& p) {
  Plan q = p;
  q.parallel.cp *= 2;
  q.gpus *= 2;  // keep dp: CP takes its ranks from new GPUs, not from data parallelism
  if (q.global_batch > 0 && q.global_batch % (q.micro_batch * data_parallel(q)) != 0) return outside_domain();
  if (!valid(c, q)) return outside_domain();
  for (const LayerSpec& l : c.m.layers)
    for (bool rec : {false, true}) {
      const LayerActivation a = layer_activation(c.m, p, l, rec), b = layer_activation(c.m, q, l, rec);
      if (!le(b.saved, a.saved) || !le(b.full, a.full))
        return broken("layer activation at cp " + std::to_string(q.parallel.cp) + " (saved " + gib(b.saved) + ", full " +
                      gib(b.full) + ") > at cp " + std::to_string(p.parallel.cp) + " (saved " + gib(a.saved) + ", full " +
                      gib(a.full) + ")" + (rec ? " (recomputed layer)" : ""));
    }
  return {!c.m.layers.empty(), std::nullopt};
}

Verdict micro_batch_never_lowers_activations(const Ctx& c, const Plan& p) {
  Plan q = p;
  q.micro_batch *= 2;
  if (!valid(c, q)) return outside_domain();
  const Calibration& cal = cal_of(c, p);
  const std::string big = "micro_batch " + std::to_string(q.micro_batch), small = "micro_batch " + std::to_string(p.micro_batch);
  if (auto v = activations_not_above(backward_phase_view(c, q), backward_phase_view(c, p), big, small); v.failure || !v.compared)
    return v;
  // Every term grows with the tokens of a microbatch, so the peak must not drop either.
  return peak_not_above(estimate_memory(c.m, q, c.hw, cal), estimate_memory(c.m, p, c.hw, cal), big, small);
}

Verdict flops_per_token_layout_free(const Ctx& c, const Plan& p) {
  // Reference: the same model, sequence and precision on one GPU with no parallelism at all.
  Plan ref = p;
  ref.parallel = {};
  ref.gpus = 1;
  ref.micro_batch = 1;
  ref.global_batch = 1;
  const double tokens_p = double(effective_global_batch(p)) * p.seq_len, tokens_r = double(ref.seq_len);
  const double fp = model_flops_per_step(c.m, p) / tokens_p, fr = model_flops_per_step(c.m, ref) / tokens_r;
  const double fe = estimate(c.m, p, c.hw, cal_of(c, p)).time.model_flops_per_step / tokens_p;
  if (std::abs(fp - fr) > 1e-9 * fr || std::abs(fe - fr) > 1e-9 * fr)
    return broken("model FLOPs per token " + std::to_string(fp) + " (estimate: " + std::to_string(fe) +
                  ") differ from the single-GPU layout's " + std::to_string(fr));
  return held();
}

// A faster kernel, link or host never predicts a slower step: each coefficient below moved towards speed (an
// efficiency, overlap or precision ratio half-way to its bound, a rate x1.5, a cost or half-size / 1.5) must not raise
// the step time. One coefficient per plan, picked by the plan's hash, keeps the test's run time (every coefficient still
// meets thousands of plans per model).
Verdict faster_coefficient_never_slows_step(const Ctx& c, const Plan& p) {
  struct Speed {
    double Calibration::*member;
    int direction;  // +1: larger is faster; -1: smaller is faster
  };
  static const Speed speeds[] = {
      {&Calibration::gemm_efficiency, 1},         {&Calibration::grouped_gemm_efficiency, 1},
      {&Calibration::attention_efficiency, 1},    {&Calibration::linear_attention_efficiency, 1},
      {&Calibration::fp8_gemm_ratio, 1},          {&Calibration::fp8_grouped_gemm_ratio, 1},
      {&Calibration::hbm_efficiency, 1},          {&Calibration::nvlink_efficiency, 1},
      {&Calibration::network_efficiency, 1},      {&Calibration::a2a_nvlink_efficiency, 1},
      {&Calibration::a2a_network_efficiency, 1},  {&Calibration::tp_overlap, 1},
      {&Calibration::ep_overlap, 1},              {&Calibration::dp_overlap, 1},
      {&Calibration::host_link_efficiency, 1},    {&Calibration::cpu_adam_params_per_second, 1},
      {&Calibration::gemm_half_tokens, -1},       {&Calibration::grouped_gemm_half_tokens, -1},
      {&Calibration::attention_half_seq, -1},     {&Calibration::launch_seconds, -1},
      {&Calibration::step_overhead_seconds, -1},  {&Calibration::nvlink_latency, -1},
      {&Calibration::network_latency, -1},        {&Calibration::a2a_latency, -1},
      {&Calibration::moe_sync_seconds, -1},       {&Calibration::interference, -1},
      {&Calibration::linear_ce_slowdown, -1},     {&Calibration::elementwise_passes, -1},
      {&Calibration::moe_permute_passes, -1},     {&Calibration::optimizer_bytes_per_param, -1},
  };
  const Calibration& cal = cal_of(c, p);
  const Speed& sp = speeds[fnv1a(plan_to_json(p).dump()) % std::size(speeds)];
  const CoefficientInfo* info = nullptr;
  for (const auto& ci : coefficient_table())
    if (ci.member == sp.member) info = &ci;
  if (!info) return broken("a speed coefficient is missing from coefficient_table()");
  const double v = cal.*sp.member;
  double faster = sp.direction < 0 ? v / 1.5 : info->hi <= 2 ? v + (info->hi - v) / 2 : v * 1.5;
  if (faster == v) return outside_domain();  // already at its bound (or zero)
  Calibration q = cal;
  q.*sp.member = faster;
  const double before = estimate_time(c.m, p, c.hw, cal).step_seconds, after = estimate_time(c.m, p, c.hw, q).step_seconds;
  if (!le(after, before))
    return broken(std::string(info->key) + " " + std::to_string(v) + " -> " + std::to_string(faster) + " (" + p.implementation +
                  ") raised the step time " + std::to_string(before) + " -> " + std::to_string(after) + " s");
  return held();
}

const std::vector<Invariant>& invariants() {
  static const std::vector<Invariant> all = {
      {"estimate finite, non-negative and identical to the search path", finite_and_same_as_search},
      {"static memory: fsdp <= dist_opt <= none", sharding_order},
      {"linear CE never raises the peak", linear_ce_never_raises_peak},
      {"more recompute never raises activation memory", recompute_never_raises_activations},
      {"larger EP never raises per-GPU expert parameters", ep_never_raises_expert_params},
      {"larger CP never raises a layer's per-GPU activations", cp_never_raises_layer_activations},
      {"doubling micro batch never lowers activation memory", micro_batch_never_lowers_activations},
      {"FLOPs per token independent of the parallel layout", flops_per_token_layout_free},
      {"a faster kernel, link or host never slows the step", faster_coefficient_never_slows_step},
  };
  return all;
}

// ---- shrinking ---------------------------------------------------------------------------------------------------

// Smaller neighbours of a plan, one dimension at a time (dp kept when a model-parallel size shrinks).
std::vector<Plan> smaller(const Plan& p) {
  std::vector<Plan> out;
  auto add = [&](auto edit) {
    Plan q = p;
    edit(q);
    out.push_back(q);
  };
  const int dp = data_parallel(p);
  auto shrink_par = [&](int Parallel::*dim) {
    if (p.parallel.*dim > 1)
      add([&](Plan& q) {
        const int old = q.parallel.*dim;
        q.parallel.*dim = old / 2 > 0 ? old / 2 : 1;
        if (dim == &Parallel::tp || dim == &Parallel::pp || dim == &Parallel::cp) q.gpus = q.gpus / old * (q.parallel.*dim);
      });
  };
  for (auto dim : {&Parallel::tp, &Parallel::pp, &Parallel::vpp, &Parallel::cp, &Parallel::ep, &Parallel::etp})
    shrink_par(dim);
  if (p.parallel.pp > 1) add([](Plan& q) { q.gpus /= q.parallel.pp; q.parallel.pp = 1; q.parallel.vpp = 1; });
  if (p.parallel.vpp > 1) add([](Plan& q) { q.parallel.vpp = 1; });
  if (dp > 1) add([&](Plan& q) { q.gpus /= 2; if (q.global_batch) q.global_batch = std::max(1, q.global_batch / 2); });
  if (p.micro_batch > 1) add([](Plan& q) { q.micro_batch /= 2; });
  if (p.seq_len > 4096) add([](Plan& q) { q.seq_len /= 2; });
  if (p.global_batch != 0) add([](Plan& q) { q.global_batch = 0; });
  if (p.recompute_layers > 1) add([](Plan& q) { q.recompute_layers -= 1; });
  if (p.moe.ep_chunks > 1) add([](Plan& q) { q.moe.ep_chunks = 1; });
  if (p.moe.routing_imbalance != 1.0) add([](Plan& q) { q.moe.routing_imbalance = 1.0; });
  if (p.moe.capacity_factor != 0) add([](Plan& q) { q.moe.capacity_factor = 0; });
  if (p.offload.optimizer) add([](Plan& q) { q.offload.optimizer = false; });
  if (p.offload.activations) add([](Plan& q) { q.offload.activations = false; });
  if (p.precision != Precision::BF16) add([](Plan& q) { q.precision = Precision::BF16; });
  if (p.recompute == Recompute::Full) add([](Plan& q) { q.recompute = Recompute::Selective; q.recompute_layers = 0; });
  if (p.recompute == Recompute::Selective) add([](Plan& q) { q.recompute = Recompute::None; });
  if (p.optimizer_sharding != OptimizerSharding::DistOpt) add([](Plan& q) { q.optimizer_sharding = OptimizerSharding::DistOpt; });
  if (!p.sequence_parallel) add([](Plan& q) { q.sequence_parallel = true; });
  return out;
}

Plan shrink(const Ctx& c, Plan p, const Check& check) {
  for (bool progress = true; progress;) {
    progress = false;
    for (const Plan& q : smaller(p))
      if (valid(c, q) && check(c, q).failure) {
        p = q;
        progress = true;
        break;
      }
  }
  return p;
}

// ---- the test ----------------------------------------------------------------------------------------------------

class Invariants : public ::testing::TestWithParam<std::string> {};

TEST_P(Invariants, HoldOnRandomValidPlans) {
  const std::string dir = data_dir();
  Ctx c;
  c.m = load_model(GetParam(), dir);
  c.hw = load_hardware("h100-sxm-80gb", dir);
  c.hw.hbm_bytes = 1e30;  // every plan "fits", so the pinned search always returns it
  // The shipped profile resolved for each implementation, and the priors (named after the implementation they serve).
  const Calibration profile = load_calibration("default", dir);
  for (const char* n : {"megatron", "bumblebee"}) {
    c.cals.push_back(calibration_for(profile, c.hw.name, n));
    c.cals.back().name = n;
  }
  c.cals.push_back(load_calibration("priors", dir));
  c.cals.back().name = "lcplan-exec";
  const int plans = env_int("LCPLAN_INVARIANT_PLANS", LCPLAN_INVARIANT_DEFAULT_PLANS);
  const uint64_t seed = uint64_t(env_int("LCPLAN_INVARIANT_SEED", 7)) * 1000003 + fnv1a(GetParam());
  std::mt19937_64 rng(seed);

  const auto& inv = invariants();
  std::vector<int> failures(inv.size(), 0), applies(inv.size(), 0);
  std::vector<std::optional<Plan>> first(inv.size());
  for (int i = 0; i < plans; ++i) {
    const Plan p = random_valid_plan(c, rng);
    for (size_t k = 0; k < inv.size(); ++k) {
      const Verdict v = inv[k].check(c, p);
      if (v.failure && failures[k]++ == 0) first[k] = p;
      applies[k] += v.compared;
    }
  }
  std::printf("%s: %d valid plans (seed %llu); plans each invariant compared something on:\n", GetParam().c_str(),
              plans, static_cast<unsigned long long>(seed));
  for (size_t k = 0; k < inv.size(); ++k) {
    std::printf("  %6d  (%5.1f%%)  %s\n", applies[k], 100.0 * applies[k] / plans, inv[k].name);
    // Dense models have no EP to grow; every other invariant must compare on at least 5% of the plans.
    const bool may_be_empty = !has_moe(c.m) && std::string(inv[k].name).find("EP") != std::string::npos;
    if (!may_be_empty) {
      EXPECT_GE(applies[k], plans / 20) << inv[k].name << " compared on too few plans to mean anything";
    }
  }
  for (size_t k = 0; k < inv.size(); ++k) {
    if (failures[k] == 0) continue;
    const Plan small = shrink(c, *first[k], inv[k].check);
    ADD_FAILURE() << GetParam() << ": invariant \"" << inv[k].name << "\" broken by " << failures[k] << " of " << plans
                  << " plans (seed " << seed << "); smallest plan that breaks it:\n"
                  << plan_to_json(small).dump() << "\n  " << *inv[k].check(c, small).failure;
  }
}

std::vector<std::string> zoo() { return zoo_names(data_dir()); }

INSTANTIATE_TEST_SUITE_P(Zoo, Invariants, ::testing::ValuesIn(zoo()), [](const auto& info) {
  std::string s = info.param;
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
});

}  // namespace
