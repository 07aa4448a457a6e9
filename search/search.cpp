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

// One search: the walk over layouts and their options, and what it keeps per layout.
//
// Within a layout, the rules read only ep_chunks, the EP overlap and the recompute choice of the options (not
// sharding, the loss or offload), and so does the derived record; its time costs per stage read ep_chunks and the
// overlap too. So each recompute choice of a layout keeps its verdict and stage costs per MoE options and one derived record (finished by
// derive_options, which redoes only what the option changed) whose plan pointer is `p_`.
class Search {
 public:
  Search(const ModelSpec& m, const Plan& base, const PlanSpace& space, const Hardware& hw, const Calibration& cal,
         const SearchOptions& opt, const Progress& progress)
      : m_(m), space_(space), hw_(hw), cal_(cal), opt_(opt), progress_(progress), p_(base),
        budget_(hw.hbm_bytes - opt.headroom_bytes), total_(space.size()) {}

  SearchResult run() {
    const size_t options = OptionWalk(space_).count();  // plans each layout stands for
    const int layers = static_cast<int>(m_.layers.size());
    for (LayoutWalk layout(space_); !layout.done(); layout.next()) {
      // Layout rules do not depend on the options: check them once with neutral options.
      layout.apply(p_);
      p_.moe.ep_chunks = 1;
      p_.moe.a2a_overlap = false;
      p_.recompute = Recompute::None;
      p_.recompute_layers = 0;
      if (auto v = check_plan(m_, p_)) {
        r_.candidates += options;
        r_.rejects[static_cast<int>(v->rule)] += options;
        continue;
      }
      const int chunk_layers = split_layers(layers, p_.parallel.pp, p_.parallel.vpp, p_.pipeline).split.max_chunk_layers();
      choices_.clear();
      layout_derived_ = false;
      moe_timed_.fill(0);
      for (OptionWalk option(space_); !option.done(); option.next()) {
        if (option.apply(p_, chunk_layers)) visit();
        else ++r_.candidates;
      }
      if (progress_) report();
    }
    std::sort(r_.pareto.begin(), r_.pareto.end(),
              [](const Candidate& a, const Candidate& b) { return score(a).peak < score(b).peak; });
    if (progress_) report();
    return std::move(r_);
  }

 private:
  struct Choice {
    Recompute recompute = Recompute::None;
    int layers = 0;
    int checked_moe = 0, costed_moe = 0;  // the moe_options() `verdict` and `costs` are for (0: none yet)
    std::optional<RuleViolation> verdict;
    bool derived = false;
    DerivedPlan d;
    StageCosts costs;
    size_t peaked = 0;                 // where in d.peak_stages the last plan peaked (looked at first)
    std::array<double, 2> ceiling{};   // tokens_per_second_ceiling by linear_ce, for the ep_chunks beside it
    std::array<int, 2> ceiling_moe{};
  };

  // The MoE options the rules and time costs read besides the recompute choice: ep_chunks and the EP overlap (> 0).
  int moe_options() const { return 2 * p_.moe.ep_chunks + (p_.moe.a2a_overlap ? 1 : 0); }

  Choice& choice_for() {
    for (Choice& c : choices_)
      if (c.recompute == p_.recompute && c.layers == p_.recompute_layers) return c;
    Choice& c = choices_.emplace_back();
    c.recompute = p_.recompute;
    c.layers = p_.recompute_layers;
    return c;
  }

  void report() const {
    SearchProgress s{std::min(r_.candidates, total_), total_, r_.feasible, !r_.top.empty(), 0, 0};
    if (s.has_best) {
      s.best_tokens_per_second_per_gpu = r_.top.front().estimate.time.tokens_per_second_per_gpu;
      s.best_tflops_per_gpu = r_.top.front().estimate.time.tflops_per_gpu;
    }
    progress_(s);
  }

  void visit() {
    ++r_.candidates;
    if (progress_ && (r_.candidates & 1023) == 0) report();
    Choice& choice = choice_for();
    if (choice.checked_moe != moe_options()) {
      choice.verdict = check_plan(m_, p_);
      choice.checked_moe = moe_options();
    }
    if (choice.verdict) {
      ++r_.rejects[static_cast<int>(choice.verdict->rule)];
      return;
    }
    if (opt_.admit && !opt_.admit(p_)) {
      ++r_.refused;
      return;
    }
    ++r_.evaluated;
    if (!choice.derived) {
      if (!layout_derived_) {
        layout_record_ = derive_layout(m_, p_, hw_, any_layout_ ? &layout_record_ : nullptr);
        layout_derived_ = any_layout_ = true;
      }
      choice.d = layout_record_;
      choice.derived = true;
    }
    derive_options(choice.d);
    double peak = 0;
    if (fits(choice, peak)) rank(choice, peak);
  }

  // The peak over the stages that can peak (the one that peaked last first) decides the plan. A plan that neither
  // fits nor is the smallest so far is rejected as soon as one stage shows it; the full memory estimate is made only
  // for a plan that is kept (the smallest, or one that joins the best or the front).
  bool fits(Choice& choice, double& peak) {
    const DerivedPlan& d = choice.d;
    const double smallest = r_.smallest_peak.estimate.memory.peak_bytes;
    peak = -1;
    const size_t stages = d.peak_stages.size(), first = choice.peaked;
    for (size_t i = 0; i < stages; ++i) {
      const size_t at = (first + i) % stages;
      const double stage_peak = stage_memory(d, cal_, d.peak_stages[at]).peak_bytes;
      if (stage_peak > peak) peak = stage_peak, choice.peaked = at;
      if (peak_upper_bound(peak, cal_) > budget_ && r_.any_valid && peak >= smallest) {
        ++r_.rejects[kMemoryReject];
        return false;
      }
    }
    if (!r_.any_valid || peak < smallest) {
      r_.any_valid = true;
      r_.smallest_peak.plan = p_;
      r_.smallest_peak.estimate.memory = estimate_memory(d, cal_);
    }
    if (peak_upper_bound(peak, cal_) > budget_) {  // fits only when the upper end of its band fits
      ++r_.rejects[kMemoryReject];
      return false;
    }
    return true;
  }

  // A plan that fits: counted, and kept when it joins the best or the front. One that could not be kept even at
  // its ceiling rate is counted by that ceiling alone (the ranking never prefers a slower plan); only the floor of
  // the memory objective can need its exact rate.
  void rank(Choice& choice, double peak) {
    const DerivedPlan& d = choice.d;
    const int moe = moe_options(), lce = p_.linear_ce ? 1 : 0;
    if (choice.costed_moe != moe) {
      if (!moe_timed_[moe]) moe_time_[moe] = moe_layer_time(d, hw_, cal_), moe_timed_[moe] = 1;
      choice.costs = stage_costs(d, hw_, cal_, moe_time_[moe]);
      choice.costed_moe = moe;
    }
    if (choice.ceiling_moe[lce] != moe) {
      choice.ceiling[lce] = tokens_per_second_ceiling(d, cal_, choice.costs, p_.linear_ce);
      choice.ceiling_moe[lce] = moe;
    }
    const Score best_case{choice.ceiling[lce], peak};
    const bool floored = opt_.objective == Objective::Memory && opt_.throughput_floor > 0;
    if (floored && best_case.tokens_per_s < opt_.throughput_floor) return;
    if (!floored && !joins_top(r_.top, best_case, opt_) && !joins_pareto(r_.pareto, best_case)) {
      ++r_.feasible;
      return;
    }
    TimeEstimate time = estimate_time(d, hw_, cal_, choice.costs);
    const Score s{time.tokens_per_second_per_gpu, peak};
    if (opt_.objective == Objective::Memory && s.tokens_per_s < opt_.throughput_floor) return;
    ++r_.feasible;
    if (!joins_top(r_.top, s, opt_) && !joins_pareto(r_.pareto, s)) return;
    const Candidate c{p_, estimate(d, hw_, cal_, estimate_memory(d, cal_), std::move(time))};
    assert(c.estimate.memory.peak_bytes == peak);  // the peak stages' peak is the peak over all stages
    offer_top(r_.top, c, opt_);
    offer_pareto(r_.pareto, c);
  }

  const ModelSpec& m_;
  const PlanSpace& space_;
  const Hardware& hw_;
  const Calibration& cal_;
  const SearchOptions& opt_;
  const Progress& progress_;
  Plan p_;
  const double budget_;
  const size_t total_;
  SearchResult r_;
  std::vector<Choice> choices_;
  DerivedPlan layout_record_;  // the layout's part of the derived records (derive_layout), made on first use
  bool layout_derived_ = false, any_layout_ = false;
  // The layout's MoE layer per moe_options(), for every choice.
  std::array<MoeLayerTime, 2 * (moe::kMaxChunks + 1)> moe_time_;
  std::array<char, 2 * (moe::kMaxChunks + 1)> moe_timed_{};
};

}  // namespace

SearchResult search_plans(const ModelSpec& m, const Plan& base, const PlanSpace& space, const Hardware& hw,
                          const Calibration& cal, const SearchOptions& opt, const Progress& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  SearchResult r = Search(m, base, space, hw, cal, opt, progress).run();
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
