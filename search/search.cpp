#include "search/search.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "parallel/pipeline_split.h"

namespace lcplan {

namespace {

double tokens_per_s(const Candidate& c) { return c.estimate.time.tokens_per_second_per_gpu; }
double peak(const Candidate& c) { return c.estimate.memory.peak_bytes; }

// Better-first ordering for the objective; ties broken by the other metric so results are deterministic.
bool better(const Candidate& a, const Candidate& b, Objective obj) {
  if (obj == Objective::Throughput) {
    if (tokens_per_s(a) != tokens_per_s(b)) return tokens_per_s(a) > tokens_per_s(b);
    return peak(a) < peak(b);
  }
  if (peak(a) != peak(b)) return peak(a) < peak(b);
  return tokens_per_s(a) > tokens_per_s(b);
}

// Keeps the k best candidates (sorted) without storing every feasible plan.
void offer_top(std::vector<Candidate>& top, const Candidate& c, const SearchOptions& opt) {
  if (int(top.size()) == opt.top_k && !better(c, top.back(), opt.objective)) return;
  auto pos = std::upper_bound(top.begin(), top.end(), c,
                              [&](const Candidate& a, const Candidate& b) { return better(a, b, opt.objective); });
  top.insert(pos, c);
  if (int(top.size()) > opt.top_k) top.pop_back();
}

// Pareto front: no other plan has both lower peak and higher throughput.
void offer_pareto(std::vector<Candidate>& front, const Candidate& c) {
  for (const auto& f : front)
    if (peak(f) <= peak(c) && tokens_per_s(f) >= tokens_per_s(c)) return;
  front.erase(std::remove_if(front.begin(), front.end(),
                             [&](const Candidate& f) { return peak(c) <= peak(f) && tokens_per_s(c) >= tokens_per_s(f); }),
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
  // Within a layout the derived record depends only on ep_chunks and the recompute choice (sharding, loss and
  // offload are read from the plan by the models), so each is derived once per layout and reused; its plan pointer
  // is `p`, whose other fields the walk sets before every estimate.
  struct Derived {
    int chunks, layers;
    Recompute recompute;
    DerivedPlan d;
  };
  std::vector<Derived> derived;
  auto derived_for = [&]() -> const DerivedPlan& {
    for (const Derived& e : derived)
      if (e.chunks == p.moe.ep_chunks && e.recompute == p.recompute && e.layers == p.recompute_layers) return e.d;
    derived.push_back({p.moe.ep_chunks, p.recompute_layers, p.recompute, derive_plan(m, p, hw)});
    return derived.back().d;
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
    if (auto v = check_plan(m, p)) {
      ++r.rejects[static_cast<int>(v->rule)];
      return;
    }
    if (opt.admit && !opt.admit(p)) {
      ++r.refused;
      return;
    }
    ++r.evaluated;
    const DerivedPlan& d = derived_for();
    MemoryEstimate mem = estimate_memory(d, cal);
    if (!r.any_valid || mem.peak_bytes < r.smallest_peak.estimate.memory.peak_bytes) {
      r.any_valid = true;
      r.smallest_peak.plan = p;
      r.smallest_peak.estimate.memory = mem;
    }
    if (peak_upper_bound(mem.peak_bytes, cal) > budget) {  // fits only when the upper end of its band fits
      ++r.rejects[kMemoryReject];
      return;
    }
    Candidate c{p, estimate(d, hw, cal, std::move(mem))};
    if (opt.objective == Objective::Memory && tokens_per_s(c) < opt.throughput_floor) return;
    ++r.feasible;
    offer_top(r.top, c, opt);
    offer_pareto(r.pareto, c);
  };
  const size_t options = OptionWalk(space).count();  // plans each layout stands for
  for (LayoutWalk layout(space); !layout.done(); layout.next()) {
    // Layout rules do not depend on the options: check them once with neutral options.
    layout.apply(p);
    p.moe.ep_chunks = 1;
    p.moe.a2a_overlap = false;
    p.recompute = Recompute::None;
    p.recompute_layers = 0;
    if (auto v = check_plan(m, p)) {
      r.candidates += options;
      r.rejects[static_cast<int>(v->rule)] += options;
      continue;
    }
    const int chunk_layers = split_layers(layers, p.parallel.pp, p.parallel.vpp, p.pipeline).split.max_chunk_layers();
    derived.clear();
    for (OptionWalk option(space); !option.done(); option.next()) {
      if (!option.apply(p, chunk_layers)) {
        ++r.candidates;
        continue;
      }
      visit();
    }
    if (progress) report();
  }
  std::sort(r.pareto.begin(), r.pareto.end(), [](const Candidate& a, const Candidate& b) { return peak(a) < peak(b); });
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
