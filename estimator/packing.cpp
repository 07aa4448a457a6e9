#include "estimator/packing.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <sstream>

#include "common/user_error.h"
#include "estimator/flops.h"

namespace lcplan {

namespace {

// Uniform in [0, 1) from 53 random bits: the same draws on every platform (std distributions are not specified).
double uniform(std::mt19937_64& rng) { return double(rng() >> 11) * (1.0 / 9007199254740992.0); }

// Each DP rank's sequences (decreasing under a budget) into microbatches: first fit by `capacity` tokens, or without
// one (0) the plan's micro_batch sequences at a time, in the order drawn.
std::vector<std::vector<PackedMicrobatch>> pack_in_order(const std::vector<std::vector<int64_t>>& ranks, const Plan& p,
                                                         int64_t capacity) {
  std::vector<std::vector<PackedMicrobatch>> step(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    std::vector<PackedMicrobatch>& bins = step[r];
    for (int64_t l : ranks[r]) {
      PackedMicrobatch* bin = nullptr;
      if (capacity > 0) {  // first fit (the lengths arrive in decreasing order)
        for (auto& b : bins)
          if (b.tokens + l <= capacity) { bin = &b; break; }
      } else if (!bins.empty() && int(bins.back().lengths.size()) < p.micro_batch) {
        bin = &bins.back();
      }
      if (!bin) bin = &bins.emplace_back();
      bin->lengths.push_back(l);
      bin->tokens += l;
    }
    for (auto& b : bins) std::sort(b.lengths.begin(), b.lengths.end(), std::greater<>());
  }
  return step;
}

// verl's rearrange_micro_batches: the count the fullest rank needs, on every rank (all-reduce max), a multiple of pp
// under the interleaved schedule (Megatron groups microbatches by pp per virtual stage); each rank's sequences (in
// decreasing order) longest first to its lightest microbatch. A rank with fewer sequences than the count runs one
// microbatch per sequence (verl asserts there; no empty microbatch is modelled).
std::vector<std::vector<PackedMicrobatch>> pack_balanced(const std::vector<std::vector<int64_t>>& ranks,
                                                         const std::vector<int64_t>& load, const Plan& p,
                                                         int64_t capacity) {
  int64_t count = 1;
  for (int64_t l : load) count = std::max(count, (l + capacity - 1) / capacity);
  if (p.parallel.vpp > 1) count = (count + p.parallel.pp - 1) / p.parallel.pp * p.parallel.pp;
  std::vector<std::vector<PackedMicrobatch>> step(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    std::vector<PackedMicrobatch>& bins = step[r];
    bins.resize(size_t(std::min<int64_t>(count, int64_t(ranks[r].size()))));
    for (int64_t l : ranks[r]) {
      PackedMicrobatch& b = *std::min_element(bins.begin(), bins.end(), [](const auto& a, const auto& c) {
        return a.tokens < c.tokens;
      });
      b.lengths.push_back(l);
      b.tokens += l;
    }
  }
  return step;
}

}  // namespace

PackedMicrobatch hybrid_cp_busiest_rank(const PackedMicrobatch& mb, int cp, int64_t budget) {
  std::vector<int64_t> load(size_t(cp), 0);
  std::vector<std::vector<std::pair<int64_t, int>>> on{size_t(cp)};  // (length, ranks it is split over)
  std::vector<int64_t> lengths = mb.lengths;
  std::sort(lengths.begin(), lengths.end(), std::greater<>());
  for (int64_t l : lengths) {
    int g = 1;
    while (g < cp && (l + g - 1) / g > budget) g *= 2;
    if (g > cp || cp % g != 0) g = cp;  // cp not a power of two (the plan rules refuse it): the whole group
    // The aligned group of g ranks whose busiest rank is the least loaded.
    int best = 0;
    int64_t best_load = -1;
    for (int s = 0; s + g <= cp; s += g) {
      const int64_t most = *std::max_element(load.begin() + s, load.begin() + s + g);
      if (best_load < 0 || most < best_load) best_load = most, best = s;
    }
    for (int r = best; r < best + g; ++r) load[size_t(r)] += (l + g - 1) / g, on[size_t(r)].push_back({l, g});
  }
  const size_t busiest = size_t(std::max_element(load.begin(), load.end()) - load.begin());
  std::vector<std::pair<int64_t, int>> work = on[busiest];
  std::sort(work.begin(), work.end(), std::greater<>());
  PackedMicrobatch out;
  for (const auto& [l, g] : work)
    for (int k = 0; k < cp / g; ++k) out.lengths.push_back(l), out.splits.push_back(g), out.tokens += l;
  return out;
}

int64_t sequence_multiple(const Plan& p) {
  const Parallel& q = p.parallel;
  return q.cp > 1 ? int64_t(2) * q.cp * q.tp : (p.sequence_parallel && q.tp > 1 ? q.tp : 1);
}

int64_t padded_length(int64_t length, const Plan& p) {
  const int64_t mult = sequence_multiple(p);
  return (length + mult - 1) / mult * mult;
}

std::vector<std::vector<std::vector<PackedMicrobatch>>> draw_steps(const LengthDistribution& dist, const Plan& p,
                                                                  const PackingOptions& o) {
  const int64_t mult = sequence_multiple(p);
  const int dp = data_parallel(p);
  const int64_t capacity = o.tokens_per_microbatch * p.parallel.cp;
  const int64_t longest = padded_length(dist.max_length(), p);
  if (o.tokens_per_microbatch > 0 && longest > capacity)
    throw UserError("the longest sequence (" + std::to_string(longest) + " tokens, padded to a multiple of " +
                    std::to_string(mult) + ") exceeds --tokens-per-microbatch " + std::to_string(o.tokens_per_microbatch) +
                    " x cp " + std::to_string(p.parallel.cp) + " (valid: a budget of at least " +
                    std::to_string((longest + p.parallel.cp - 1) / p.parallel.cp) + " tokens per GPU, or a larger cp)");
  std::vector<double> cumulative(dist.weights.size());
  std::partial_sum(dist.weights.begin(), dist.weights.end(), cumulative.begin());
  std::mt19937_64 rng(o.seed);
  const int sequences = effective_global_batch(p);
  // A step is drawn sequence by sequence: bound the draws so a typo cannot exhaust memory or time.
  constexpr double kMaxDraws = 1e7;
  const double per_step = o.global_tokens > 0 ? double(o.global_tokens) / dist.mean_length() : double(sequences);
  if (per_step * o.samples > kMaxDraws)
    throw UserError("drawing " + std::to_string(o.samples) + " steps of about " + std::to_string(int64_t(per_step)) +
                    " sequences each is too many (valid: at most 10,000,000 sequences over all drawn steps; fewer "
                    "--samples or a smaller step)");
  std::vector<std::vector<std::vector<PackedMicrobatch>>> steps;
  for (int s = 0; s < o.samples; ++s) {
    // The step's sequences, padded.
    std::vector<int64_t> drawn;
    int64_t tokens = 0;
    while (o.global_tokens > 0 ? tokens < o.global_tokens : int(drawn.size()) < sequences) {
      const double u = uniform(rng) * cumulative.back();
      const size_t i = std::min(size_t(std::upper_bound(cumulative.begin(), cumulative.end(), u) - cumulative.begin()),
                                cumulative.size() - 1);
      drawn.push_back(padded_length(dist.lengths[i], p));
      tokens += drawn.back();
    }
    if (int(drawn.size()) < dp)
      throw UserError("a step of " + std::to_string(drawn.size()) + " sequences leaves DP ranks idle (dp = " +
                      std::to_string(dp) + "; valid: a global batch of at least dp sequences)");
    // Balance tokens over DP ranks, longest first to the least loaded (the trainers' sequence balancing).
    std::vector<std::vector<int64_t>> ranks(dp);
    std::vector<int64_t> load(dp, 0);
    std::vector<int64_t> order = drawn;
    if (o.tokens_per_microbatch > 0) std::stable_sort(order.begin(), order.end(), std::greater<>());
    for (size_t k = 0; k < order.size(); ++k) {
      // Fixed micro_batch: every rank takes the same number of sequences, dealt in turn as drawn.
      const int r = o.tokens_per_microbatch > 0 ? int(std::min_element(load.begin(), load.end()) - load.begin()) : int(k % dp);
      ranks[r].push_back(order[k]);
      load[r] += order[k];
    }
    steps.push_back(o.tokens_per_microbatch > 0 && o.policy == PackingPolicy::Balanced
                        ? pack_balanced(ranks, load, p, capacity)
                        : pack_in_order(ranks, p, o.tokens_per_microbatch > 0 ? capacity : 0));
  }
  return steps;
}

Plan microbatch_plan(const Plan& p, const PackedMicrobatch& packed, int microbatches) {
  Plan q = p;
  q.batches = nullptr;  // a microbatch's plan
  const int dp = data_parallel(p);
  const int64_t budget = p.batches ? p.batches->packing.tokens_per_microbatch : 0;
  const bool hybrid = p.hybrid_cp && p.parallel.cp > 1 && budget > 0;
  PackedMicrobatch mb = hybrid ? hybrid_cp_busiest_rank(packed, p.parallel.cp, budget) : packed;
  // Every sequence over all CP ranks is regular CP: the plan without splits.
  if (std::all_of(mb.splits.begin(), mb.splits.end(), [&](int g) { return g == p.parallel.cp; })) mb.splits.clear();
  q.packed_splits.clear();
  if (mb.splits.empty() && std::all_of(mb.lengths.begin(), mb.lengths.end(), [&](int64_t l) { return l == mb.lengths.front(); })) {
    q.seq_len = mb.lengths.front();
    q.micro_batch = int(mb.lengths.size());
    q.packed_lengths.clear();
  } else {
    q.seq_len = mb.tokens;
    q.micro_batch = 1;
    q.packed_lengths = mb.lengths;
    q.packed_splits = mb.splits;
  }
  q.global_batch = q.micro_batch * dp * microbatches;
  return q;
}

namespace {

// One microbatch shape's costs: its step with one and with `ref` microbatches per DP rank (the most any rank drew),
// so a rank's step is the sum of its microbatches' increments plus the fixed part (bubble, optimizer, step
// overhead) they share; its peak with `ref` microbatches in flight, as a pipeline holds them.
struct ShapeCost {
  double one = 0, at_ref = 0, increment = 0, peak = 0, flops = 0;
  double fixed() const { return one - increment; }
  // A rank of k microbatches of this one shape: the plan's own step where it was estimated already (1 or ref).
  double alike(int k) const { return k == 1 ? one : at_ref; }
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = size_t(std::ceil(q * double(v.size()))) - (q > 0 ? 1 : 0);
  return v[std::min(i, v.size() - 1)];
}

}  // namespace

BatchEstimate estimate_batches(const ModelSpec& m, const Plan& p, const Hardware& hw, const Calibration& cal,
                               const LengthDistribution& dist, const PackingOptions& o) {
  const auto steps = draw_steps(dist, p, o);
  int ref = 1;
  for (const auto& step : steps)
    for (const auto& rank : step) ref = std::max(ref, int(rank.size()));
  std::map<std::vector<int64_t>, ShapeCost> shapes;
  Estimate worst_full;  // the full estimate of the first shape with the largest peak (the worst microbatch's)
  double worst_peak = -1;
  auto cost = [&](const PackedMicrobatch& mb) -> const ShapeCost& {
    auto it = shapes.find(mb.lengths);
    if (it != shapes.end()) return it->second;
    ShapeCost c;
    Estimate full = estimate(m, microbatch_plan(p, mb, ref), hw, cal);
    c.at_ref = full.time.step_seconds;
    c.one = ref == 1 ? c.at_ref : estimate_time(m, microbatch_plan(p, mb, 1), hw, cal).step_seconds;
    c.increment = ref == 1 ? c.one : (c.at_ref - c.one) / (ref - 1);
    c.peak = full.memory.peak_bytes;
    if (c.peak > worst_peak) worst_peak = c.peak, worst_full = std::move(full);
    // Model FLOPs count the microbatch's own sequences (under hybrid CP its plan is the busiest rank's work).
    Plan own = p;
    own.hybrid_cp = false;
    c.flops = (p.hybrid_cp ? model_flops_per_step(m, microbatch_plan(own, mb, ref)) : full.time.model_flops_per_step) /
              data_parallel(p) / ref;
    return shapes.emplace(mb.lengths, c).first->second;
  };
  BatchEstimate b;
  b.steps = int(steps.size());
  std::vector<double> step_times, peaks, tokens;
  double flops = 0, drawn_tokens = 0, straggler = 0, rank_sum = 0, mbs = 0;
  const PackedMicrobatch* worst = nullptr;
  for (const auto& step : steps) {
    double slowest = 0, ranks_total = 0;
    for (const auto& rank : step) {
      double t = 0;
      const bool alike = std::all_of(rank.begin(), rank.end(), [&](const PackedMicrobatch& x) { return x.lengths == rank.front().lengths; });
      const int k = int(rank.size());
      if (alike && (k == 1 || k == ref)) {  // one shape: the plan itself, exactly, as its cost estimated it
        t = cost(rank.front()).alike(k);
      } else if (alike) {
        t = estimate_time(m, microbatch_plan(p, rank.front(), k), hw, cal).step_seconds;
      } else {
        double fixed = 0;
        for (const auto& mb : rank) t += cost(mb).increment, fixed += cost(mb).fixed();
        t += fixed / double(rank.size());
      }
      for (const auto& mb : rank) {
        const ShapeCost& c = cost(mb);
        flops += c.flops, drawn_tokens += double(mb.tokens), mbs += 1;
        peaks.push_back(c.peak), tokens.push_back(double(mb.tokens));
        if (!worst || c.peak > cost(*worst).peak) worst = &mb;  // the estimated peak (the search's proxy: tokens)
      }
      slowest = std::max(slowest, t);
      ranks_total += t;
    }
    const double mean_rank = ranks_total / double(step.size());
    step_times.push_back(slowest);
    straggler += (slowest - mean_rank) / slowest;
    rank_sum += mean_rank;
  }
  const double n = double(steps.size());
  b.step_mean = std::accumulate(step_times.begin(), step_times.end(), 0.0) / n;
  b.step_p10 = percentile(step_times, 0.1);
  b.step_p90 = percentile(step_times, 0.9);
  b.rank_mean = rank_sum / n;
  b.straggler_share = straggler / n;
  b.tokens_per_second_per_gpu = drawn_tokens / n / b.step_mean / p.gpus;
  b.tflops_per_gpu = flops / n / b.step_mean / p.gpus / 1e12;
  b.microbatches_mean = mbs / n / double(data_parallel(p));
  b.peak_p99_bytes = percentile(peaks, 0.99);
  b.peak_max_bytes = *std::max_element(peaks.begin(), peaks.end());
  b.peak_p50_bytes = percentile(peaks, 0.5);
  b.peak_p90_bytes = percentile(peaks, 0.9);
  b.tokens_p50 = percentile(tokens, 0.5);
  b.tokens_max = *std::max_element(tokens.begin(), tokens.end());
  constexpr int kBins = 20;
  for (int i = 0; i < kBins; ++i) b.token_histogram.push_back({b.tokens_max * i / kBins, b.tokens_max * (i + 1) / kBins, 0});
  for (double t : tokens) ++b.token_histogram[std::min(kBins - 1, int(t / b.tokens_max * kBins))].count;
  b.worst = *worst;
  b.worst_plan = microbatch_plan(p, *worst, ref);
  b.worst_estimate = std::move(worst_full);  // estimate(m, b.worst_plan, hw, cal), kept when its shape was costed
  b.fits = b.worst_estimate.fits;
  return b;
}

nlohmann::json batch_estimate_to_json(const BatchEstimate& b) {
  nlohmann::json histogram = nlohmann::json::array();
  for (const auto& bin : b.token_histogram) histogram.push_back({bin.low, bin.high, bin.count});
  return {{"steps_drawn", b.steps},
          {"step_seconds", {{"mean", b.step_mean}, {"p10", b.step_p10}, {"p90", b.step_p90}}},
          {"mean_rank_step_seconds", b.rank_mean},
          {"straggler_share", b.straggler_share},
          {"tokens_per_second_per_gpu", b.tokens_per_second_per_gpu},
          {"tflops_per_gpu", b.tflops_per_gpu},
          {"microbatches_per_dp_rank", b.microbatches_mean},
          {"tokens_per_microbatch", {{"p50", b.tokens_p50}, {"max", b.tokens_max}}},
          {"peak_bytes", {{"p50", b.peak_p50_bytes}, {"p90", b.peak_p90_bytes}, {"p99", b.peak_p99_bytes},
                          {"max", b.peak_max_bytes}}},
          {"token_histogram", histogram},
          {"worst_microbatch", b.worst.lengths},
          {"fits", b.fits}};
}

std::string batch_estimate_table(const BatchEstimate& b, const LengthDistribution& dist, const PackingOptions& o) {
  constexpr double GiB = 1024.0 * 1024 * 1024;
  char buf[1024];
  std::string s;
  std::snprintf(buf, sizeof buf,
                "Variable-length batches: %zu distinct lengths (mean %.0f, max %lld tokens), %s, %d steps drawn (seed %llu)\n",
                dist.lengths.size(), dist.mean_length(), static_cast<long long>(dist.max_length()),
                o.tokens_per_microbatch > 0
                    ? ((o.policy == PackingPolicy::Balanced ? "the same microbatch count on every DP rank, balanced by a budget of "
                                                            : "packed first-fit decreasing into ") +
                       std::to_string(o.tokens_per_microbatch) + " tokens per GPU per microbatch")
                          .c_str()
                    : "the plan's micro batch of sequences per microbatch",
                b.steps, static_cast<unsigned long long>(o.seed));
  s += buf;
  std::snprintf(buf, sizeof buf, "  microbatches per DP rank %.1f; tokens per microbatch: median %.0f, max %.0f\n",
                b.microbatches_mean, b.tokens_p50, b.tokens_max);
  s += buf;
  std::snprintf(buf, sizeof buf,
                "  peak memory per GPU: %.2f GiB at the 99th-percentile microbatch, %.2f GiB at the fullest (%zu sequence%s, %lld tokens) -> %s\n",
                b.peak_p99_bytes / GiB, b.peak_max_bytes / GiB, b.worst.lengths.size(), b.worst.lengths.size() == 1 ? "" : "s",
                static_cast<long long>(b.worst.tokens), fit_verdict(b.fits, b.worst_estimate.fits_at_estimate));
  s += buf;
  std::snprintf(buf, sizeof buf,
                "  step: expected %.3f s (10th-90th percentile of the drawn steps %.3f-%.3f s); the mean DP rank %.3f s, "
                "the straggler %.1f%% of the step\n",
                b.step_mean, b.step_p10, b.step_p90, b.rank_mean, 100 * b.straggler_share);
  s += buf;
  std::snprintf(buf, sizeof buf, "  %.1f TFLOP/s per GPU (each sequence's own causal square), %.0f tokens/s per GPU\n",
                b.tflops_per_gpu, b.tokens_per_second_per_gpu);
  s += buf;
  return s;
}

}  // namespace lcplan
