#include "executor/record.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

namespace lcplan::exec {

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

nlohmann::json model_summary(const ModelSpec& m) {
  nlohmann::json j = {{"name", m.name},       {"hidden", m.hidden}, {"vocab", m.vocab},
                      {"layers", m.layers.size()}, {"dense_ffn", m.dense_ffn}, {"tied_embeddings", m.tied_embeddings}};
  if (m.attn.heads)
    j["attention"] = {{"heads", m.attn.heads}, {"kv_heads", m.attn.kv_heads}, {"head_dim", m.attn.head_dim},
                      {"output_gate", m.attn.output_gate}, {"sliding_window", m.attn.sliding_window}};
  if (m.linear.key_heads)
    j["linear_attention"] = {{"key_heads", m.linear.key_heads}, {"value_heads", m.linear.value_heads},
                             {"key_head_dim", m.linear.key_head_dim}, {"value_head_dim", m.linear.value_head_dim},
                             {"conv_kernel", m.linear.conv_kernel}};
  if (m.moe.num_experts)
    j["moe"] = {{"experts", m.moe.num_experts}, {"top_k", m.moe.top_k}, {"expert_ffn", m.moe.expert_ffn},
                {"shared_experts", m.moe.shared_experts}, {"shared_ffn", m.moe.shared_ffn}};
  return j;
}

}  // namespace

std::string host_description() {
  std::string s;
  struct utsname u {};
  if (uname(&u) == 0) s = std::string(u.sysname) + " " + u.release + " " + u.machine;
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const size_t c = line.find(':');
      if (c != std::string::npos) s += ", " + line.substr(c + 2);
      break;
    }
  s += ", " + std::to_string(sysconf(_SC_NPROCESSORS_ONLN)) + " logical CPUs";
  return s;
}

namespace {

// The median over the steps after the first (warm-up).
double later_median(const std::vector<double>& v) {
  return median(std::vector<double>(v.begin() + (v.size() > 1 ? 1 : 0), v.end()));
}

// Memory at the job's peak (its rank and phase), and per phase: the peak rank's memory, every rank's time.
void add_peak_and_phases(const ExecResult& r, Measurement& m) {
  const auto [peak_rank, peak_phase] = job_peak(r);
  const RankReport* pr = nullptr;
  for (const RankReport& rr : r.ranks)
    if (rr.rank == peak_rank) pr = &rr;
  const Snapshot& at = pr->phases[int(peak_phase)].at_peak;
  m.peak_bytes = at.total();
  m.breakdown = at.to_breakdown();
  m.peak_phase = peak_phase;
  m.peak_rank = peak_rank;
  for (int ph = 0; ph < kPhases; ++ph) {
    // Under PP only the last stage has a loss phase, and the peak rank may be on another stage.
    const bool any = std::any_of(r.ranks.begin(), r.ranks.end(), [&](const RankReport& x) { return x.phases[ph].seen; });
    if (!any) continue;
    MeasuredPhase mp;
    if (pr->phases[ph].seen) {
      mp.peak_bytes = pr->phases[ph].at_peak.total();
      mp.breakdown = pr->phases[ph].at_peak.to_breakdown();
      mp.category_peaks = pr->phases[ph].category_max.to_breakdown();
    }
    // Like the step: the median over the steps after the first, each the slowest rank's time in the phase.
    std::vector<double> secs;
    for (const auto& step : r.step_phase_seconds) secs.push_back(step[size_t(ph)]);
    mp.seconds = later_median(secs);
    m.phases[ph] = mp;
  }
}

// Each rank's own peak and workspace high water.
void add_ranks(const ExecResult& r, Measurement& m) {
  for (const RankReport& rr : r.ranks) {
    Phase ph = Phase::Forward;
    Snapshot snap;
    for (int p = 0; p < kPhases; ++p)
      if (rr.phases[p].seen && rr.phases[p].at_peak.total() > snap.total()) {
        ph = Phase(p);
        snap = rr.phases[p].at_peak;
      }
    MeasuredRank mr;
    mr.rank = rr.rank;
    mr.peak_bytes = snap.total();
    mr.peak_phase = ph;
    mr.workspace_high_water_bytes = rr.workspace_high_water;
    m.ranks.push_back(mr);
  }
}

// Implementation facts (not interpreted by validation): workspace, setup, device clocks, routing load, pipeline
// waits and the CPU time per step.
nlohmann::json executor_facts(const ExecOptions& o, const ExecResult& r, const ScaledCase& sc) {
  double ws_high = 0, recv_sum = 0, recv_max = 0, ops = 0, cpu_sum = 0, cpu_max = 0, pairs = 0;
  for (const RankReport& rr : r.ranks) {
    pairs = std::max(pairs, rr.attention_pairs);
    ws_high = std::max(ws_high, rr.workspace_high_water);
    recv_sum += rr.moe_rows_received;
    recv_max = std::max(recv_max, rr.moe_rows_received);
    ops = std::max(ops, rr.tracker_ops);
    cpu_sum += rr.cpu_seconds;
    cpu_max = std::max(cpu_max, rr.cpu_seconds);
  }
  nlohmann::json ex = {{"workspace_reserve_bytes", o.workspace_reserve}, {"workspace_high_water_bytes", ws_high},
                       {"microbatches", r.microbatches}, {"setup_seconds", r.setup_seconds}, {"seed", o.seed},
                       {"linear_ce_vocab_tile", o.ce_vocab_tile}};
  if (r.backend != "cpu" && !r.step_device_phase_seconds.empty()) {
    // The device's own clock per phase (CUDA events on the compute stream), the median over the steps after the
    // first, each the slowest rank's: the phases' seconds are the host clock after the stream drained.
    nlohmann::json dev;
    for (int ph = 0; ph < kPhases; ++ph) {
      std::vector<double> secs;
      for (const auto& step : r.step_device_phase_seconds) secs.push_back(step[size_t(ph)]);
      dev[to_string(Phase(ph))] = later_median(secs);
    }
    ex["device_phase_seconds"] = dev;
  }
  // Per head, forward and recompute: the attention work of a step, the sum of each sequence's causal square.
  if (pairs > 0 && !r.loss.empty()) ex["attention_pairs_per_step_max_rank"] = pairs / double(r.loss.size());
  if (recv_sum > 0) ex["moe_routing_load"] = recv_max / (recv_sum / double(r.ranks.size()));
  // The measured counterpart of the estimator's bubble: the least time any rank spent blocked on others in a step
  // (executor/phase_trace.h); the slowest stage waits least, so a lighter stage's extra wait is imbalance.
  if (sc.plan.parallel.pp > 1) ex["pipeline_wait_seconds"] = later_median(r.step_pipeline_wait_seconds);
  // CPU seconds per step: wall time on a shared machine includes waiting for the cores; these do not.
  ex["cpu_seconds_per_step_max_rank"] = cpu_max / double(r.loss.size());
  ex["cpu_seconds_per_step_all_ranks"] = cpu_sum / double(r.loss.size());
  ex["tracker_operations_per_step"] = ops / double(r.loss.size());
  return ex;
}

}  // namespace

Measurement measurement_record(const ScaledCase& sc, const ExecOptions& o, const ExecResult& r,
                               const std::string& host) {
  Measurement m;
  m.plan = sc.plan;
  m.id = "lcplan-exec " + sc.plan.model + " gpus " + std::to_string(sc.plan.gpus) + " scale " +
         std::to_string(sc.scale.factor) +
         (sc.scale.layers_per_kind ? " layers/kind " + std::to_string(sc.scale.layers_per_kind) : "");
  m.source = "lcplan-exec, CPU backend (fp32 compute, bf16 storage)";
  m.scope = MeasurementScope::Step;
  add_peak_and_phases(r, m);
  add_ranks(r, m);
  m.step_seconds = std::max(1e-9, later_median(r.step_seconds));
  MeasuredScale s;
  s.factor = sc.scale.factor;
  s.layers_per_kind = sc.scale.layers_per_kind;
  s.mtp_dropped = sc.mtp_dropped;
  s.kept_layers = sc.kept_layers;
  s.model = model_summary(sc.model);
  m.scale = s;
  m.steps = int(r.loss.size());
  m.loss = r.loss.front();
  m.grad_norm = r.grad_norm.front();
  for (size_t i = 0; i < r.loss.size(); ++i) m.per_step.push_back({r.loss[i], r.grad_norm[i], r.step_seconds[i]});
  m.backend = r.backend;
  m.device = r.device;
  m.host = host;
  m.executor = executor_facts(o, r, sc);
  std::string notes;
  for (const std::string& n : sc.notes) notes += (notes.empty() ? "" : "; ") + n;
  for (const std::string& n : r.notes) notes += (notes.empty() ? "" : "; ") + n;
  if (sc.mtp_dropped)
    notes += (notes.empty() ? "" : "; ") + std::string("MTP modules are not built: compare with the estimate of the "
                                                       "model with mtp_layers = 0 (the record's scale.model)");
  m.notes = notes;
  return m;
}

}  // namespace lcplan::exec
