#include "search/emit.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "estimator/derived_plan.h"

namespace lcplan {

namespace {

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;

// Tokens per CP rank per microbatch, as 32K when a whole number of K, else exact.
std::string local_tokens_text(const Plan& p) {
  const long long t = static_cast<long long>(local_tokens(p));
  return t % 1024 == 0 ? std::to_string(t / 1024) + "K" : std::to_string(t);
}

std::string row(const Candidate& c, int rank) {
  const Plan& p = c.plan;
  const Estimate& e = c.estimate;
  std::string recompute = to_string(p.recompute);
  if (p.recompute_layers > 0) recompute.append("/").append(std::to_string(p.recompute_layers));
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "%4d %3d %3d %3d %3d %3d %3d %3d %-8s %-9s %-3s %6d %-3s %7s %8.2f %8.1f %9.0f  %s\n", rank, p.parallel.tp,
                p.parallel.pp, p.parallel.vpp, p.parallel.cp, p.parallel.ep, p.parallel.etp, p.micro_batch,
                to_string(p.optimizer_sharding),
                recompute.c_str(),
                p.linear_ce ? "on" : "off", p.moe.ep_chunks, p.offload.optimizer ? "opt" : "-",
                local_tokens_text(p).c_str(), e.memory.peak_bytes / GiB,
                e.time.tflops_per_gpu, e.time.tokens_per_second_per_gpu, e.time.bottleneck.c_str());
  return buf;
}

const char* kHeader =
    "   #  tp  pp vpp  cp  ep etp  mb sharding recompute lce chunks off   local  peakGiB TFLOP/s  tok/s/GPU  bottleneck\n";

nlohmann::json candidate_json(const Candidate& c) { return estimate_to_json(c.estimate, c.plan); }

// Plans whose throughput lies inside the first plan's error band cannot be told apart by the model: say how many.
std::string within_band_note(const std::vector<Candidate>& top) {
  if (top.size() < 2 || top.front().estimate.band_points == 0) return "";
  const Estimate& best = top.front().estimate;
  size_t n = 1;
  while (n < top.size() && top[n].estimate.tflops_band.high >= best.time.tflops_per_gpu) ++n;
  if (n < 2) return "";
  char buf[300];
  std::snprintf(buf, sizeof buf,
                "  plans 1-%zu are closer than their error bands (%.0f-%.0f TFLOP/s for plan 1): the model cannot rank "
                "them; measure them (lcplan tune) before choosing\n",
                n, best.tflops_band.low, best.tflops_band.high);
  return buf;
}

}  // namespace

std::vector<size_t> pareto_rows_shown(size_t n, size_t rows, size_t chosen) {
  std::vector<size_t> out;
  if (n == 0) return out;
  const size_t k = std::min(n, std::max<size_t>(rows, 2));
  for (size_t i = 0; i < k; ++i) out.push_back(k == 1 ? 0 : (i * (n - 1) + (k - 1) / 2) / (k - 1));
  if (chosen < n) out.push_back(chosen);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string search_table(const SearchResult& r, const ReducedRecipe& recipe, bool explain_rejects, int pareto_rows,
                         Objective objective) {
  std::ostringstream o;
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "searched %zu plans in %.1f ms (%.2f M plans/s): %zu passed the rules, %zu fit\n", r.candidates,
                r.seconds * 1e3, r.seconds > 0 ? r.candidates / r.seconds / 1e6 : 0.0, r.evaluated, r.feasible);
  o << buf;
  if (explain_rejects) {
    o << "\nrejected per rule:\n";
    for (int i = 0; i <= kMemoryReject; ++i) {
      if (r.rejects[i] == 0) continue;
      std::snprintf(buf, sizeof buf, "  %-36s %zu\n", i == kMemoryReject ? "memory_below_capacity_minus_headroom"
                                                                         : rule_name(static_cast<Rule>(i)),
                    r.rejects[i]);
      o << buf;
    }
  }
  if (!r.top.empty()) {
    o << (objective == Objective::Memory
              ? "\nbest plans by peak memory, lowest first (above the throughput floor; TFLOP/s = model FLOPs per GPU):\n"
              : "\nbest plans by tokens/s per GPU (TFLOP/s = model FLOPs per GPU; peak = per-GPU peak over stages):\n")
      << kHeader;
    for (size_t i = 0; i < r.top.size(); ++i) o << row(r.top[i], int(i) + 1);
    o << within_band_note(r.top);
  }
  if (!r.pareto.empty() && pareto_rows > 0) {
    size_t chosen = std::string::npos;  // the chosen plan (the best plan) where it lies on the front
    for (size_t i = 0; i < r.pareto.size() && !r.top.empty(); ++i)
      if (plan_to_json(r.pareto[i].plan) == plan_to_json(r.top.front().plan)) chosen = i;
    const std::vector<size_t> shown = pareto_rows_shown(r.pareto.size(), size_t(pareto_rows), chosen);
    std::snprintf(buf, sizeof buf,
                  "\nPareto front (peak memory vs throughput, ascending memory; # = position on the front of %zu; * = the "
                  "chosen plan):\n",
                  r.pareto.size());
    o << buf << kHeader;
    for (size_t i : shown) {
      std::string line = row(r.pareto[i], int(i) + 1);
      if (i == chosen) line[0] = '*';
      o << line;
    }
    if (shown.size() < r.pareto.size()) {
      std::snprintf(buf, sizeof buf, "  (%zu of %zu front plans shown: both ends and evenly spaced points between; "
                                     "--json lists every one)\n",
                    shown.size(), r.pareto.size());
      o << buf;
    }
  }
  o << "\nreduced recipe (article section 2.5 rules):\n";
  if (!recipe.found) {
    o << "  no plan following or bending the rules fits\n";
  } else {
    o << kHeader << row(recipe.plan, 0);
    for (const auto& line : recipe.rationale) o << "  - " << line << "\n";
    if (!r.top.empty()) {
      std::snprintf(buf, sizeof buf, "  distance to the exhaustive best: %.1f%% throughput, %+.2f GiB peak memory\n",
                    100 * recipe.throughput_gap, recipe.memory_delta_bytes / GiB);
      o << buf;
    }
  }
  for (const auto& b : recipe.broken) o << "  ! " << b << "\n";
  return o.str();
}

nlohmann::json search_json(const SearchResult& r, const ReducedRecipe& recipe) {
  nlohmann::json top = nlohmann::json::array(), pareto = nlohmann::json::array(), rejects = nlohmann::json::object();
  for (const auto& c : r.top) top.push_back(candidate_json(c));
  for (const auto& c : r.pareto) pareto.push_back(candidate_json(c));
  for (int i = 0; i <= kMemoryReject; ++i)
    rejects[i == kMemoryReject ? "memory_below_capacity_minus_headroom" : rule_name(static_cast<Rule>(i))] = r.rejects[i];
  nlohmann::json j = {{"candidates", r.candidates}, {"evaluated", r.evaluated}, {"feasible", r.feasible},
                      {"seconds", r.seconds},       {"rejects", rejects},       {"top", top},
                      {"pareto", pareto}};
  if (recipe.found)
    j["reduced_recipe"] = {{"estimate", candidate_json(recipe.plan)},
                           {"rationale", recipe.rationale},
                           {"broken", recipe.broken},
                           {"throughput_gap", recipe.throughput_gap},
                           {"memory_delta_bytes", recipe.memory_delta_bytes}};
  else
    j["reduced_recipe"] = {{"broken", recipe.broken}};
  return j;
}

std::string plan_label(const Plan& p) {
  const Parallel& q = p.parallel;
  // Built with append: GCC 12 warns (-Wrestrict, a false positive) on chains of operator+ here.
  std::string s;
  auto add = [&s](const char* name, int v) { s.append(s.empty() ? "" : " ").append(name).append(" ").append(std::to_string(v)); };
  add("tp", q.tp);
  add("pp", q.pp);
  if (q.vpp > 1) add("vpp", q.vpp);
  add("cp", q.cp);
  add("ep", q.ep);
  if (q.etp > 1) add("etp", q.etp);
  add("mb", p.micro_batch);
  s.append(" ").append(to_string(p.optimizer_sharding)).append(" ").append(to_string(p.recompute));
  if (p.recompute_layers > 0) s.append("/").append(std::to_string(p.recompute_layers));
  if (p.linear_ce) s.append(" lce");
  if (p.moe.ep_chunks > 1) add("chunks", p.moe.ep_chunks);
  if (p.offload.optimizer) s.append(" offload-opt");
  return s;
}

}  // namespace lcplan
