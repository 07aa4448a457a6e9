#include "search/batch_search.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace lcplan {

namespace {

// Best plans of each (cp, budget) fixed-length search that are estimated over the drawn batches.
constexpr int kRerankPerSearch = 3;
// Steps drawn to rank them (the options' --samples estimate the ones shown).
constexpr int kRankingSamples = 4;

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

}  // namespace

BatchSearchResult search_batches(const ModelSpec& m, const Plan& base, const PlanSpace& space, const Hardware& hw,
                                 const Calibration& cal, const SearchOptions& opt, const LengthDistribution& dist,
                                 const PackingOptions& packing) {
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
      sopt.top_k = kRerankPerSearch;
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
        o.samples = std::min(packing.samples, kRankingSamples);
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
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
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
    const std::string recompute = std::string(to_string(b.plan.recompute)) +
                                  (b.plan.recompute == Recompute::Full && b.plan.recompute_layers > 0
                                       ? " " + std::to_string(b.plan.recompute_layers) : "");
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

nlohmann::json batch_search_json(const BatchSearchResult& r) {
  nlohmann::json top = nlohmann::json::array();
  for (const BatchCandidate& b : r.top)
    top.push_back({{"plan", plan_to_json(b.plan)}, {"tokens_per_microbatch", b.tokens_per_microbatch},
                   {"batches", batch_estimate_to_json(b.batches)}});
  return {{"searches", r.searches}, {"candidates", r.candidates}, {"feasible", r.feasible}, {"seconds", r.seconds},
          {"top", top}};
}

}  // namespace lcplan
