#include "search/search.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cstdio>
#include <optional>

#include "parallel/chunk_schedule.h"
#include "parallel/pipeline_split.h"

namespace lcplan {

namespace {

// What the ranking reads of a plan: tokens/s per GPU and peak memory.
struct Score {
  double tokens_per_s = 0, peak = 0;
};
Score score(const Candidate& c) { return {c.estimate.time.tokens_per_second_per_gpu, c.estimate.memory.peak_bytes}; }

// Better-first ordering for the objective; ties broken by the other metric so results are deterministic.
bool better(Score a, Score b, Objective obj) {
  if (obj == Objective::Throughput) {
    if (a.tokens_per_s != b.tokens_per_s) return a.tokens_per_s > b.tokens_per_s;
    return a.peak < b.peak;
  }
  if (a.peak != b.peak) return a.peak < b.peak;
  return a.tokens_per_s > b.tokens_per_s;
}

// A plan scoring `s` would join the k best (offer_top keeps it).
bool joins_top(const std::vector<Candidate>& top, Score s, const SearchOptions& opt) {
  return int(top.size()) < opt.top_k || better(s, score(top.back()), opt.objective);
}

// Keeps the k best candidates (sorted) without storing every feasible plan.
void offer_top(std::vector<Candidate>& top, const Candidate& c, const SearchOptions& opt) {
  if (!joins_top(top, score(c), opt)) return;
  auto pos = std::upper_bound(top.begin(), top.end(), c, [&](const Candidate& a, const Candidate& b) {
    return better(score(a), score(b), opt.objective);
  });
  top.insert(pos, c);
  if (int(top.size()) > opt.top_k) top.pop_back();
}

// A plan scoring `s` would join the Pareto front: no plan on it has both lower peak and higher throughput.
bool joins_pareto(const std::vector<Candidate>& front, Score s) {
  for (const auto& f : front)
    if (score(f).peak <= s.peak && score(f).tokens_per_s >= s.tokens_per_s) return false;
  return true;
}

void offer_pareto(std::vector<Candidate>& front, const Candidate& c) {
  const Score s = score(c);
  if (!joins_pareto(front, s)) return;
  front.erase(std::remove_if(front.begin(), front.end(),
                             [&](const Candidate& f) { return s.peak <= score(f).peak && s.tokens_per_s >= score(f).tokens_per_s; }),
              front.end());
  front.push_back(c);
}

}  // namespace

SearchResult search_plans(const ModelSpec& m, const Plan& base, const PlanSpace& space, const Hardware& hw,
                          const Calibration& cal, const SearchOptions& opt, const Progress& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  SearchResult r;
  const double budget = hw.hbm_bytes - opt.headroom_bytes;
  const size_t total = space.size();
  const int layers = static_cast<int>(m.layers.size());
  Plan p = base;
  // Within a layout, the rules read only ep_chunks and the recompute choice of the options (not sharding, the loss
  // or offload), and so does the derived record; its time costs per stage read ep_chunks too. So each recompute
  // choice of a layout keeps its verdict and stage costs per ep_chunks value and one derived record (finished by
  // derive_options, which redoes only what the option changed) whose plan pointer is `p`.
  struct Choice {
    Recompute recompute = Recompute::None;
    int layers = 0;
    int checked_chunks = 0, costed_chunks = 0;  // the ep_chunks `verdict` and `costs` are for (0: none yet)
    std::optional<RuleViolation> verdict;
    bool derived = false;
    DerivedPlan d;
    StageCosts costs;
    size_t peaked = 0;  // where in d.peak_stages the last plan peaked (looked at first)
  };
  std::vector<Choice> choices;
  DerivedPlan layout_record;  // the layout's part of the derived records (derive_layout), made on first use
  bool layout_derived = false;
  // The layout's MoE layer per ep_chunks value, which every recompute choice shares.
  std::array<MoeLayerTime, moe::kMaxChunks + 1> moe_time;
  std::array<char, moe::kMaxChunks + 1> moe_timed{};
  auto choice_for = [&]() -> Choice& {
    for (Choice& c : choices)
      if (c.recompute == p.recompute && c.layers == p.recompute_layers) return c;
    Choice& c = choices.emplace_back();
    c.recompute = p.recompute;
    c.layers = p.recompute_layers;
    return c;
  };
  auto report = [&]() {
    SearchProgress s{std::min(r.candidates, total), total, r.feasible, !r.top.empty(), 0, 0};
    if (s.has_best) {
      s.best_tokens_per_second_per_gpu = r.top.front().estimate.time.tokens_per_second_per_gpu;
      s.best_tflops_per_gpu = r.top.front().estimate.time.tflops_per_gpu;
    }
    progress(s);
  };
  auto visit = [&]() {
    ++r.candidates;
    if (progress && (r.candidates & 1023) == 0) report();
    Choice& choice = choice_for();
    if (choice.checked_chunks != p.moe.ep_chunks) {
      choice.verdict = check_plan(m, p);
      choice.checked_chunks = p.moe.ep_chunks;
    }
    if (choice.verdict) {
      ++r.rejects[static_cast<int>(choice.verdict->rule)];
      return;
    }
    if (opt.admit && !opt.admit(p)) {
      ++r.refused;
      return;
    }
    ++r.evaluated;
    if (!choice.derived) {
      if (!layout_derived) layout_record = derive_layout(m, p, hw), layout_derived = true;
      choice.d = layout_record;
      choice.derived = true;
    }
    DerivedPlan& d = choice.d;
    derive_options(d);
    // The peak over the stages that can peak (the one that peaked last first) decides the plan. A plan that neither
    // fits nor is the smallest so far is rejected as soon as one stage shows it; the full memory estimate is made
    // only for a plan that is kept (the smallest, or one that joins the best or the front).
    double peak = -1;
    const size_t stages = d.peak_stages.size(), first = choice.peaked;
    for (size_t i = 0; i < stages; ++i) {
      const size_t at = (first + i) % stages;
      const double stage_peak = stage_memory(d, cal, d.peak_stages[at]).peak_bytes;
      if (stage_peak > peak) peak = stage_peak, choice.peaked = at;
      if (peak_upper_bound(peak, cal) > budget && r.any_valid && peak >= r.smallest_peak.estimate.memory.peak_bytes) {
        ++r.rejects[kMemoryReject];
        return;
      }
    }
    if (!r.any_valid || peak < r.smallest_peak.estimate.memory.peak_bytes) {
      r.any_valid = true;
      r.smallest_peak.plan = p;
      r.smallest_peak.estimate.memory = estimate_memory(d, cal);
    }
    if (peak_upper_bound(peak, cal) > budget) {  // fits only when the upper end of its band fits
      ++r.rejects[kMemoryReject];
      return;
    }
    if (choice.costed_chunks != p.moe.ep_chunks) {
      if (moe_timed[p.moe.ep_chunks] == 0) moe_time[p.moe.ep_chunks] = moe_layer_time(d, hw, cal), moe_timed[p.moe.ep_chunks] = 1;
      choice.costs = stage_costs(d, hw, cal, moe_time[p.moe.ep_chunks]);
      choice.costed_chunks = p.moe.ep_chunks;
    }
    TimeEstimate time = estimate_time(d, hw, cal, choice.costs);
    const Score s{time.tokens_per_second_per_gpu, peak};
    if (opt.objective == Objective::Memory && s.tokens_per_s < opt.throughput_floor) return;
    ++r.feasible;
    if (!joins_top(r.top, s, opt) && !joins_pareto(r.pareto, s)) return;
    const Candidate c{p, estimate(d, hw, cal, estimate_memory(d, cal), std::move(time))};
    assert(c.estimate.memory.peak_bytes == peak);  // the peak stages' peak is the peak over all stages
    offer_top(r.top, c, opt);
    offer_pareto(r.pareto, c);
  };
  const size_t options = OptionWalk(space).count();  // plans each layout stands for
  for (LayoutWalk layout(space); !layout.done(); layout.next()) {
    // Layout rules do not depend on the options: check them once with neutral options.
    layout.apply(p);
    p.moe.ep_chunks = 1;
    p.recompute = Recompute::None;
    p.recompute_layers = 0;
    if (auto v = check_plan(m, p)) {
      r.candidates += options;
      r.rejects[static_cast<int>(v->rule)] += options;
      continue;
    }
    const int chunk_layers = split_layers(layers, p.parallel.pp, p.parallel.vpp, p.pipeline).split.max_chunk_layers();
    choices.clear();
    layout_derived = false;
    moe_timed.fill(0);
    for (OptionWalk option(space); !option.done(); option.next()) {
      if (!option.apply(p, chunk_layers)) {
        ++r.candidates;
        continue;
      }
      visit();
    }
    if (progress) report();
  }
  std::sort(r.pareto.begin(), r.pareto.end(),
            [](const Candidate& a, const Candidate& b) { return score(a).peak < score(b).peak; });
  if (progress) report();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::string explain_infeasible(const SearchResult& r, const Hardware& hw, const SearchOptions& opt) {
  char buf[512];
  if (r.any_valid) {
    const Plan& p = r.smallest_peak.plan;
    const MemoryEstimate& mem = r.smallest_peak.estimate.memory;
    std::snprintf(buf, sizeof buf,
                  "no plan fits: memory is the tightest constraint; the smallest peak found is %.1f GiB (before its error band) "
                  "(tp %d pp %d cp %d ep %d, %s, recompute %s) against %.1f GiB usable on %s (%.1f GiB headroom)",
                  mem.peak_bytes / (1 << 30), p.parallel.tp, p.parallel.pp, p.parallel.cp, p.parallel.ep,
                  to_string(p.optimizer_sharding), to_string(p.recompute), (hw.hbm_bytes - opt.headroom_bytes) / (1 << 30),
                  hw.name.c_str(), opt.headroom_bytes / (1 << 30));
    return buf;
  }
  if (r.refused > 0)
    return "no plan fits: the " + std::to_string(r.refused) + " valid plans are all ones this search was told to leave out "
           "(plans the launcher cannot run, or runs that did not fit)";
  int worst = 0;
  for (int i = 0; i < kMemoryReject; ++i)
    if (r.rejects[i] > r.rejects[worst]) worst = i;
  std::snprintf(buf, sizeof buf, "no valid plan: every one of the %zu candidates breaks a rule; the tightest is %s (%zu rejections)",
                r.candidates, rule_name(static_cast<Rule>(worst)), r.rejects[worst]);
  return buf;
}

}  // namespace lcplan
