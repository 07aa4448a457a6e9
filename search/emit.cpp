#include "search/emit.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "estimator/derived_plan.h"
#include "parallel/pipeline_split.h"

namespace lcplan {

namespace {

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;

// Tokens per CP rank per microbatch, as 32K when a whole number of K, else exact.
std::string local_tokens_text(const Plan& p) {
  const long long t = static_cast<long long>(local_tokens(p));
  return t % 1024 == 0 ? std::to_string(t / 1024) + "K" : std::to_string(t);
}

// Megatron's --pipeline-model-parallel-layout: per virtual stage E (embedding), t (decoder layer), m (MTP), L (loss).
std::string layout_string(const PipelineSplit& s, int mtp_layers) {
  std::string out;
  for (int c = 0; c < s.chunks(); ++c) {
    if (c > 0) out += "|";
    if (c == 0) out += "E";
    out.append(s.layers_in(c), 't');
    if (c == s.chunks() - 1) out.append(mtp_layers, 'm').append("L");
  }
  return out;
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

std::string search_table(const SearchResult& r, const ReducedRecipe& recipe, bool explain_rejects, int pareto_rows) {
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
    o << "\nbest plans (tokens/s per GPU; TFLOP/s = model FLOPs per GPU; peak = per-GPU peak over stages):\n" << kHeader;
    for (size_t i = 0; i < r.top.size(); ++i) o << row(r.top[i], int(i) + 1);
    o << within_band_note(r.top);
  }
  if (!r.pareto.empty() && pareto_rows > 0) {
    o << "\nPareto front (peak memory vs throughput):\n" << kHeader;
    const size_t step = r.pareto.size() > size_t(pareto_rows) ? r.pareto.size() / pareto_rows : 1;
    for (size_t i = 0; i < r.pareto.size(); i += step) o << row(r.pareto[i], int(i) + 1);
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

// Every plan field Megatron-LM has a flag for (flag names: megatron/training/arguments.py,
// https://github.com/NVIDIA/Megatron-LM); search/megatron_args.h reads them back (the round trip in
// tests/interop/). Comment lines after the flags name what has no flag.
std::string megatron_flags(const Plan& p, const ModelSpec& m) {
  std::ostringstream o;
  const Parallel& q = p.parallel;
  const bool moe = std::any_of(m.layers.begin(), m.layers.end(), [](const LayerSpec& l) { return l.ffn == FfnKind::MoE; });
  const int layers = int(m.layers.size());
  const int mtp = p.mtp_layers >= 0 ? p.mtp_layers : m.mtp_layers;
  o << "--tensor-model-parallel-size " << q.tp << " --pipeline-model-parallel-size " << q.pp;
  const SplitResult split = split_layers(layers, q.pp, q.vpp, p.pipeline);
  if (split.ok) {
    const PipelineSplit& s = split.split;
    switch (s.rule) {
      case SplitRule::Even:
        if (q.vpp > 1) o << " --num-layers-per-virtual-pipeline-stage " << s.max_chunk_layers();
        break;
      case SplitRule::EmbeddingAndLoss:
        // Uneven splits set vpp by count: --num-layers-per-virtual-pipeline-stage would have to count E and L.
        if (q.vpp > 1) o << " --num-virtual-stages-per-pipeline-rank " << q.vpp;
        o << " --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split";
        break;
      case SplitRule::FirstLast:
        if (q.vpp > 1) o << " --num-virtual-stages-per-pipeline-rank " << q.vpp;
        if (p.pipeline.first_stage_layers > 0) o << " --decoder-first-pipeline-num-layers " << p.pipeline.first_stage_layers;
        if (p.pipeline.last_stage_layers > 0) o << " --decoder-last-pipeline-num-layers " << p.pipeline.last_stage_layers;
        break;
      case SplitRule::Explicit:
      case SplitRule::Balanced:
        o << " --pipeline-model-parallel-layout \"" << layout_string(s, mtp) << "\"";
        break;
    }
  }
  o << " --context-parallel-size " << q.cp;
  if (q.cp > 1) o << " --cp-comm-type p2p";
  // Expert TP is explicit: Megatron's default is TP, lcplan's is 1.
  if (moe) o << " --expert-model-parallel-size " << q.ep << " --expert-tensor-parallel-size " << q.etp;
  if (q.tp > 1 && p.sequence_parallel) o << " --sequence-parallel";
  o << " --seq-length " << p.seq_len << " --micro-batch-size " << p.micro_batch << " --global-batch-size "
    << effective_global_batch(p);
  switch (p.optimizer_sharding) {
    case OptimizerSharding::None: o << " --overlap-grad-reduce"; break;
    case OptimizerSharding::DistOpt: o << " --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather"; break;
    case OptimizerSharding::Fsdp:
      o << " --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params --use-distributed-optimizer"
           " --no-gradient-accumulation-fusion --overlap-grad-reduce --overlap-param-gather";
      break;
  }
  if (p.offload.optimizer) o << " --optimizer-cpu-offload --optimizer-offload-fraction 1.0";
  if (p.offload.activations) o << " --cpu-offloading --cpu-offloading-num-layers " << layers - 1;
  switch (p.recompute) {
    case Recompute::None: break;
    case Recompute::Selective: o << " --recompute-granularity selective --recompute-modules core_attn layernorm moe_act"; break;
    case Recompute::Full:
      o << " --recompute-granularity full --recompute-method "
        << (p.recompute_layers > 0 ? "block --recompute-num-layers " + std::to_string(p.recompute_layers)
                                   : "uniform --recompute-num-layers 1");
      break;
  }
  if (p.linear_ce) o << " --cross-entropy-loss-fusion --cross-entropy-fusion-impl linear";
  if (moe) {
    o << " --moe-grouped-gemm";
    if (q.ep > 1)
      o << (p.moe.dispatcher == MoeDispatcher::DeepEP ? " --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep"
                                                      : " --moe-token-dispatcher-type alltoall");
    if (q.ep > 1 && p.moe.a2a_overlap) o << " --overlap-moe-expert-parallel-comm --delay-wgrad-compute";
  }
  if (mtp > 0) o << " --mtp-num-layers " << mtp;
  if (p.moe.capacity_factor > 0) o << " --moe-expert-capacity-factor " << p.moe.capacity_factor << " --moe-pad-expert-input-to-capacity";
  switch (p.precision) {
    case Precision::BF16: break;
    case Precision::FP8: o << " --fp8-format hybrid --fp8-recipe tensorwise"; break;
    case Precision::MXFP8: o << " --fp8-format e4m3 --fp8-recipe mxfp8"; break;
    case Precision::NVFP4: o << " --fp4-format e2m1 --fp4-recipe nvfp4"; break;
  }
  o << " --bf16\n";
  const int mp = q.tp * q.pp * q.cp;
  const int node = p.gpus_per_node > 0 ? p.gpus_per_node : 8;
  const int nodes = p.gpus > node && p.gpus % node == 0 ? p.gpus / node : 1;
  o << "# world size " << p.gpus << " GPUs, the launcher's (e.g. torchrun --nnodes " << nodes << " --nproc-per-node "
    << p.gpus / nodes << "); dp = " << (mp > 0 ? p.gpus / mp : 0) << "\n";
  if (p.optimizer_sharding == OptimizerSharding::Fsdp)
    o << "# fsdp: Megatron-FSDP (optim_grads_params = ZeRO-3) shards experts over the expert-data-parallel group as lcplan "
         "models; Megatron-LM's --use-torch-fsdp2 path refuses the distributed optimizer and is not used here\n";
  if (p.linear_ce)
    o << "# linear CE: --cross-entropy-fusion-impl linear needs Megatron-LM's development branch (PRs #2256, #2739, #3345); "
         "released versions accept only native and te\n";
  if (q.ep > 1 && p.moe.ep_chunks > 1)
    o << "# ep_chunks " << p.moe.ep_chunks
      << ": chunking one MoE layer's all-to-all under its expert GEMMs is lcplan's/bumblebee's schedule (no Megatron flag); "
         "Megatron's nearest is the cross-microbatch overlap, --overlap-moe-expert-parallel-comm (plan moe.a2a_overlap)\n";
  if (q.ep > 1 && q.tp > 1 && !p.sequence_parallel)
    o << "# Megatron requires --sequence-parallel with expert and tensor parallelism; this plan has it off\n";
  if (p.offload.activations && q.pp > 1)
    o << "# Megatron's --cpu-offloading does not support pipeline parallelism (pp = " << q.pp << ")\n";
  o << "# no Megatron flag: hardware " << p.hardware << ", gpus_per_node, routing_imbalance " << p.moe.routing_imbalance
    << " (a modelling input; --moe-router-force-load-balancing is for benchmarks only), implementation " << p.implementation
    << (p.moe.ep_chunks > 1 ? ", ep_chunks " + std::to_string(p.moe.ep_chunks) : std::string()) << "\n";
  return o.str();
}

}  // namespace lcplan
