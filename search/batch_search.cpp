#include "search/batch_search.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "search/emit.h"

namespace lcplan {

namespace {

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// The layout the search draws and pads sequences for at CP `cp`: the widest TP searched (the coarsest padding).
Plan draw_plan(const Plan& base, int cp, int tp) {
  Plan draw = base;
  draw.parallel = Parallel{};
  draw.parallel.cp = cp;
  draw.parallel.tp = tp;
  draw.micro_batch = 1;
  return draw;
}

// The fullest microbatch of one drawn step at budget `budget`: most tokens, then the largest sum of squared lengths
// (attention). A proxy chosen before any estimate; estimate_batches then takes each plan's worst by its estimated peak.
PackedMicrobatch fullest_microbatch(const LengthDistribution& dist, const Plan& draw, int64_t budget,
                                    const PackingOptions& packing, int64_t& microbatches) {
  const int cp = draw.parallel.cp;
  PackingOptions o = packing;
  o.tokens_per_microbatch = budget;
  o.samples = 1;
  const auto steps = draw_steps(dist, draw, o);
  PackedMicrobatch best;
  double best_squares = -1;
  int64_t tokens = 0;
  for (const auto& rank : steps.front())
    for (const auto& mb : rank) {
      double squares = 0;
      for (int64_t l : mb.lengths) squares += double(l) * double(l);
      tokens += mb.tokens;
      if (mb.tokens > best.tokens || (mb.tokens == best.tokens && squares > best_squares)) best = mb, best_squares = squares;
    }
  // Microbatches per step at full budget, a multiple of every DP size under this CP (gpus / cp).
  microbatches = round_up((tokens + budget * cp - 1) / (budget * cp), draw.gpus / cp);
  return best;
}

// A budget only caps a microbatch: where a larger one packs every drawn step as a smaller one did, the two rows are
// one run. Keeps the first of each (the smaller budget: budgets ascend within a CP and the sort is stable).
void drop_same_runs(std::vector<BatchCandidate>& top) {
  auto layout = [](const BatchCandidate& c) {
    nlohmann::json j = plan_to_json(c.plan);
    j.erase("batches");
    return j;
  };
  auto same = [&](const BatchCandidate& a, const BatchCandidate& b) {
    const BatchEstimate &x = a.batches, &y = b.batches;
    return x.step_mean == y.step_mean && x.peak_max_bytes == y.peak_max_bytes && x.tokens_max == y.tokens_max &&
           x.microbatches_mean == y.microbatches_mean && layout(a) == layout(b);
  };
  std::vector<BatchCandidate> kept;
  for (BatchCandidate& c : top)
    if (std::none_of(kept.begin(), kept.end(), [&](const BatchCandidate& k) { return same(k, c); }))
      kept.push_back(std::move(c));
  top = std::move(kept);
}

}  // namespace

BatchSearchResult search_batches(const ModelSpec& m, const Plan& base, const PlanSpace& space, const Hardware& hw,
                                 const Calibration& cal, const SearchOptions& opt, const LengthDistribution& dist,
                                 const PackingOptions& packing, const BatchSearchKnobs& knobs) {
  const auto start = std::chrono::steady_clock::now();
  BatchSearchResult out;
  const int tp_max = space.tp.empty() ? 1 : *std::max_element(space.tp.begin(), space.tp.end());
  for (int cp : space.cp) {
    if (base.gpus % (cp * tp_max) != 0) continue;
    const Plan draw = draw_plan(base, cp, tp_max);
    const int64_t longest = padded_length(dist.max_length(), draw);
    // The least budget that holds the longest sequence, rounded up to 1K tokens as trainers' budgets are given.
    const int64_t least = round_up((longest + cp - 1) / cp, 1024);
    std::vector<int64_t> budgets = {packing.tokens_per_microbatch};
    if (packing.tokens_per_microbatch <= 0) budgets = {least, 2 * least, 4 * least};
    for (int64_t budget : budgets) {
      if (budget * cp < longest) continue;  // this CP cannot hold the longest sequence within the budget
      int64_t microbatches = 0;
      const PackedMicrobatch fullest = fullest_microbatch(dist, draw, budget, packing, microbatches);
      Plan sbase = microbatch_plan(base, fullest, 1);
      sbase.global_batch = int(microbatches * sbase.micro_batch);
      PlanSpace sspace = space;
      sspace.cp = {cp};
      sspace.micro_batch = {sbase.micro_batch};
      SearchOptions sopt = opt;
      sopt.top_k = knobs.rerank_per_search;
      const SearchResult r = search_plans(m, sbase, sspace, hw, cal, sopt);
      ++out.searches;
      // A larger budget packs a fuller microbatch (more tokens, more memory): none fits there either.
      if (r.feasible == 0) break;
      out.candidates += r.candidates;
      out.feasible += r.feasible;
      for (const Candidate& c : r.top) {
        BatchCandidate b;
        b.plan = c.plan;
        b.plan.seq_len = padded_length(dist.max_length(), c.plan);
        b.plan.micro_batch = 1;
        b.plan.packed_lengths.clear();
        b.plan.global_batch = base.global_batch;
        b.tokens_per_microbatch = budget;
        PackingOptions o = packing;
        o.tokens_per_microbatch = budget;
        b.plan.batches = std::make_shared<const BatchSpec>(BatchSpec{dist, o});
        o.samples = std::min(packing.samples, knobs.ranking_samples);
        b.batches = estimate_batches(m, b.plan, hw, cal, dist, o);
        if (b.batches.fits && b.batches.peak_max_bytes + opt.headroom_bytes <= hw.hbm_bytes) out.top.push_back(std::move(b));
      }
    }
  }
  auto faster = [](const BatchCandidate& a, const BatchCandidate& b) {
    return a.batches.tokens_per_second_per_gpu > b.batches.tokens_per_second_per_gpu;
  };
  std::stable_sort(out.top.begin(), out.top.end(), faster);
  if (int(out.top.size()) > opt.top_k) out.top.resize(opt.top_k);
  // The plans shown: estimated over every step the options draw, and ranked by that.
  for (BatchCandidate& b : out.top) {
    PackingOptions o = packing;
    o.tokens_per_microbatch = b.tokens_per_microbatch;
    b.batches = estimate_batches(m, b.plan, hw, cal, dist, o);
  }
  std::stable_sort(out.top.begin(), out.top.end(), faster);
  drop_same_runs(out.top);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

BatchRecipe reduce_batch_recipe(const ModelSpec& m, const Plan& base, const Hardware& hw, const Calibration& cal,
                                const SearchOptions& opt, const LengthDistribution& dist, const PackingOptions& packing,
                                const BatchSearchResult& searched, const RecipeRules& rules) {
  BatchRecipe out;
  Plan longest = base;  // one longest sequence per microbatch: the rules' CP and their bends
  longest.seq_len = dist.max_length();
  longest.micro_batch = 1;
  longest.packed_lengths.clear();
  longest.batches.reset();
  out.rules = reduce_recipe(m, longest, hw, cal, opt, SearchResult{}, rules);
  if (!out.rules.found) return out;
  Plan& p = out.plan.plan;
  p = out.rules.plan.plan;
  p.seq_len = padded_length(dist.max_length(), p);
  p.global_batch = base.global_batch;
  const int cp = p.parallel.cp;
  // Local tokens per microbatch at the rule's target, and never below the longest sequence's share.
  out.plan.tokens_per_microbatch = std::max<int64_t>(rules.target_local_seq_max, round_up(p.seq_len, cp) / cp);
  PackingOptions o = packing;
  o.tokens_per_microbatch = out.plan.tokens_per_microbatch;
  p.batches = std::make_shared<const BatchSpec>(BatchSpec{dist, o});
  out.plan.batches = estimate_batches(m, p, hw, cal, dist, o);
  const double usable = hw.hbm_bytes - opt.headroom_bytes;
  out.found = out.plan.batches.fits && out.plan.batches.peak_max_bytes <= usable;
  char buf[256];
  if (!out.found) {
    std::snprintf(buf, sizeof buf, "its fullest microbatch (%lld tokens per GPU) peaks at %.1f GiB, above %.1f GiB usable",
                  static_cast<long long>(out.plan.batches.tokens_max / cp), out.plan.batches.peak_max_bytes / (1 << 30),
                  usable / (1 << 30));
    out.broken.push_back(buf);
    return out;
  }
  if (searched.top.empty()) return out;
  const double best = searched.top.front().batches.tokens_per_second_per_gpu;
  out.throughput_gap = best > 0 ? (best - out.plan.batches.tokens_per_second_per_gpu) / best : 0;
  if (out.throughput_gap > rules.pp_pays_fraction) {
    std::snprintf(buf, sizeof buf, "the recipe loses %.1f%% expected tokens/s to the search's best (%s, %lld tokens per GPU)",
                  100 * out.throughput_gap, plan_label(searched.top.front().plan).c_str(),
                  static_cast<long long>(searched.top.front().tokens_per_microbatch));
    out.broken.push_back(buf);
  }
  return out;
}

std::string batch_recipe_text(const BatchRecipe& r) {
  std::string s = "\nreduced recipe over the batches (local tokens per microbatch as the article's local sequence):\n";
  for (const std::string& line : r.rules.rationale) s += "  " + line + "\n";
  char buf[256];
  std::snprintf(buf, sizeof buf, "  %lld tokens per GPU per microbatch (the rule's local tokens, at least the longest "
                "sequence's share)\n", static_cast<long long>(r.plan.tokens_per_microbatch));
  s += buf;
  for (const std::string& line : r.rules.broken) s += "  bent: " + line + "\n";
  for (const std::string& line : r.broken) s += "  " + line + "\n";
  if (!r.found) return s + "  no rule plan fits its fullest microbatch\n";
  std::snprintf(buf, sizeof buf, "  %s: %.0f tokens/s/GPU expected, step %.3f s, straggler %.1f%%, peak %.2f GiB\n",
                plan_label(r.plan.plan).c_str(), r.plan.batches.tokens_per_second_per_gpu, r.plan.batches.step_mean,
                100 * r.plan.batches.straggler_share, r.plan.batches.peak_max_bytes / (1 << 30));
  return s + buf;
}

std::string batch_search_table(const BatchSearchResult& r, int rows) {
  constexpr double GiB = 1024.0 * 1024 * 1024;
  std::string s;
  char buf[512];
  std::snprintf(buf, sizeof buf, "searched %zu plans in %zu (cp, token budget) searches in %.0f ms; %zu fit at their "
                "fullest microbatch\n\n", r.candidates, r.searches, r.seconds * 1e3, r.feasible);
  s += buf;
  std::snprintf(buf, sizeof buf, "%-3s %-22s %-9s %-10s %-6s %-10s %10s %9s %9s %10s %10s\n", "#", "tp pp vpp cp ep etp dp",
                "sharding", "recompute", "chunks", "budget/GPU", "tok/s/GPU", "TFLOP/s", "step s", "straggler", "peak GiB");
  s += buf;
  for (size_t i = 0; i < r.top.size() && int(i) < rows; ++i) {
    const BatchCandidate& b = r.top[i];
    const Parallel& q = b.plan.parallel;
    char layout[64];
    std::snprintf(layout, sizeof layout, "%d %d %d %d %d %d %d", q.tp, q.pp, q.vpp, q.cp, q.ep, q.etp, data_parallel(b.plan));
    std::string recompute = to_string(b.plan.recompute);
    if (b.plan.recompute == Recompute::Full && b.plan.recompute_layers > 0)
      recompute.append(" ").append(std::to_string(b.plan.recompute_layers));
    std::snprintf(buf, sizeof buf, "%-3zu %-22s %-9s %-10s %-6d %-10lld %10.0f %9.1f %9.3f %9.1f%% %10.2f\n", i + 1,
                  layout, to_string(b.plan.optimizer_sharding), recompute.c_str(), b.plan.moe.ep_chunks,
                  static_cast<long long>(b.tokens_per_microbatch),
                  b.batches.tokens_per_second_per_gpu, b.batches.tflops_per_gpu, b.batches.step_mean,
                  100 * b.batches.straggler_share, b.batches.peak_max_bytes / GiB);
    s += buf;
  }
  if (r.top.empty()) s += "no plan fits its fullest microbatch\n";
  return s;
}

nlohmann::json batch_search_json(const BatchSearchResult& r, const BatchRecipe* recipe) {
  nlohmann::json top = nlohmann::json::array();
  for (const BatchCandidate& b : r.top)
    top.push_back({{"plan", plan_to_json(b.plan)}, {"tokens_per_microbatch", b.tokens_per_microbatch},
                   {"batches", batch_estimate_to_json(b.batches)}});
  nlohmann::json j = {{"searches", r.searches}, {"candidates", r.candidates}, {"feasible", r.feasible},
                      {"seconds", r.seconds}, {"top", top}};
  if (recipe) {
    nlohmann::json broken = recipe->rules.broken;
    for (const std::string& b : recipe->broken) broken.push_back(b);
    j["reduced_recipe"] = {{"found", recipe->found}, {"rationale", recipe->rules.rationale}, {"broken", broken},
                           {"throughput_gap", recipe->throughput_gap}};
    if (recipe->found)
      j["reduced_recipe"].update({{"plan", plan_to_json(recipe->plan.plan)},
                                  {"tokens_per_microbatch", recipe->plan.tokens_per_microbatch},
                                  {"batches", batch_estimate_to_json(recipe->plan.batches)}});
  }
  return j;
}

}  // namespace lcplan
