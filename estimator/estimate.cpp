#include "estimator/estimate.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace lcplan {

Estimate estimate(const ModelSpec& m, const Plan& p, const Hardware& hw, const Calibration& cal) {
  const DerivedPlan d = derive_plan(m, p, hw);
  return estimate(d, hw, cal, estimate_memory(d, cal));
}

Estimate estimate(const DerivedPlan& d, const Hardware& hw, const Calibration& cal, MemoryEstimate memory) {
  return estimate(d, hw, cal, std::move(memory), estimate_time(d, hw, cal));
}

Estimate estimate(const DerivedPlan& d, const Hardware& hw, const Calibration& cal, MemoryEstimate memory,
                  TimeEstimate time) {
  const Plan& p = *d.plan;
  Estimate e;
  e.memory = std::move(memory);
  e.time = std::move(time);
  e.capacity_bytes = hw.hbm_bytes;
  e.peak_bytes_band = {cal.memory_band.measured_low(e.memory.peak_bytes), cal.memory_band.measured_high(e.memory.peak_bytes)};
  // The time band holds step-time residuals; the rate carries them inversely (the same FLOPs): rate = FLOPs / step.
  e.step_seconds_band = {cal.time_band.measured_low(e.time.step_seconds), cal.time_band.measured_high(e.time.step_seconds)};
  e.tflops_band = {e.time.tflops_per_gpu * e.time.step_seconds / std::max(e.step_seconds_band.high, 1e-300),
                   e.time.tflops_per_gpu * e.time.step_seconds / std::max(e.step_seconds_band.low, 1e-300)};
  e.band_points = cal.time_band.points;
  e.fits_at_estimate = e.memory.peak_bytes <= e.capacity_bytes;
  e.fits = e.peak_bytes_band.high <= e.capacity_bytes;
  if (e.fits_at_estimate && !e.fits) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "peak %.1f GiB fits %s, but the upper end of its error band (%.1f GiB) does not",
                  e.memory.peak_bytes / (1 << 30), hw.name.c_str(), e.peak_bytes_band.high / (1 << 30));
    e.warnings.emplace_back(buf);
  }
  if (!e.fits_at_estimate) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "peak %.1f GiB on stage %d exceeds the %.1f GiB of %s", e.memory.peak_bytes / (1 << 30),
                  e.memory.peak_stage, e.capacity_bytes / (1 << 30), hw.name.c_str());
    e.warnings.emplace_back(buf);
  }
  if (p.parallel.tp > nvlink_domain_gpus(p, hw))
    e.warnings.emplace_back("tp spans more than one node: tensor-parallel collectives cross the network");
  if (p.precision != Precision::BF16 && gemm_peak_flops(hw, p.precision) <= hw.peak_bf16_flops)
    e.warnings.emplace_back(hw.name + " has no faster tensor cores for " + to_string(p.precision) + ": it runs at the bf16 rate");
  return e;
}

const char* fit_verdict(bool fits, bool fits_at_estimate) {
  return fits ? "FITS" : fits_at_estimate ? "MAY NOT FIT (the upper end of its error band exceeds it)" : "DOES NOT FIT";
}

double peak_upper_bound(double peak_bytes, const Calibration& cal) { return cal.memory_band.measured_high(peak_bytes); }

nlohmann::json breakdown_to_json(const MemoryBreakdown& b) {
  nlohmann::json j = nlohmann::json::object();
  for (const MemoryCategoryInfo& c : kMemoryCategories) j[c.name] = b.*c.member;
  return j;
}

nlohmann::json estimate_to_json(const Estimate& e, const Plan& p) {
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& s : e.memory.stages)
    stages.push_back({{"stage", s.stage},
                      {"layers", s.layers},
                      {"inflight_microbatches", s.inflight_microbatches},
                      {"peak_bytes", s.peak_bytes},
                      {"peak_phase", to_string(s.peak_phase)},
                      {"breakdown", breakdown_to_json(s.breakdown)}});
  const TimeBreakdown& t = e.time.breakdown;
  nlohmann::json j;
  j["plan"] = plan_to_json(p);
  j["memory"] = {{"peak_bytes", e.memory.peak_bytes},
                 {"peak_stage", e.memory.peak_stage},
                 {"peak_phase", to_string(e.memory.peak_phase)},
                 {"capacity_bytes", e.capacity_bytes},
                 {"stages", stages}};
  j["time"] = {{"step_seconds", e.time.step_seconds},
               {"tflops_per_gpu", e.time.tflops_per_gpu},
               {"mfu", e.time.mfu},
               {"tokens_per_second_per_gpu", e.time.tokens_per_second_per_gpu},
               {"model_flops_per_step", e.time.model_flops_per_step},
               {"bottleneck", e.time.bottleneck},
               {"breakdown",
                {{"compute", t.compute},
                 {"compute_attention", t.compute_attention},
                 {"compute_moe", t.compute_moe},
                 {"recompute", t.recompute},
                 {"exposed_comm",
                  {{"tp", t.exposed_comm.tp}, {"cp", t.exposed_comm.cp}, {"ep", t.exposed_comm.ep},
                   {"pp", t.exposed_comm.pp}, {"dp_fsdp", t.exposed_comm.dp_fsdp}}},
                 {"hidden_cp", t.hidden_cp},
                 {"bubble", t.bubble},
                 {"launch_overhead", t.launch_overhead},
                 {"optimizer", t.optimizer},
                 {"offload", t.offload},
                 {"step_overhead", t.step_overhead}}}};
  j["memory"]["band"] = {{"low_bytes", e.peak_bytes_band.low}, {"high_bytes", e.peak_bytes_band.high},
                         {"points", e.band_points}};
  j["time"]["band"] = {{"low_seconds", e.step_seconds_band.low}, {"high_seconds", e.step_seconds_band.high},
                       {"low_tflops", e.tflops_band.low}, {"high_tflops", e.tflops_band.high},
                       {"points", e.band_points}};
  j["fits"] = e.fits;
  j["fits_at_estimate"] = e.fits_at_estimate;
  j["warnings"] = e.warnings;
  return j;
}

std::string run_header(const Plan& p, const std::string& model, const std::string& hardware, bool global_batch_defaulted,
                       bool per_plan) {
  std::string h = model + " on " + std::to_string(p.gpus) + " x " + hardware + ", seq " + std::to_string(p.seq_len) +
                  ", global batch " + std::to_string(effective_global_batch(p)) +
                  (global_batch_defaulted ? " (the default: one sequence per GPU)" : "");
  if (per_plan) {
    const int mbs = num_microbatches(p);
    h += ", micro batch " + std::to_string(p.micro_batch) + ", " + std::to_string(mbs) +
         (mbs == 1 ? " microbatch" : " microbatches") + " per DP rank";
  }
  return h + ", implementation " + p.implementation + "\n";
}

std::string estimate_table(const Estimate& e, const Plan& p, const ModelSpec& m, const Hardware& hw) {
  constexpr double GiB = 1024.0 * 1024.0 * 1024.0, GB = 1e9;
  std::ostringstream o;
  char line[512];
  const Parallel& q = p.parallel;
  o << run_header(p, m.name, hw.name, p.global_batch == 0, true);
  const std::string group = p.microbatch_group > 0 ? " (microbatch group " + std::to_string(p.microbatch_group) + ")" : "";
  const std::string layers = (p.recompute_layers > 0 ? " (" + std::to_string(p.recompute_layers) + " layers)" : "") +
                             std::string(p.distribute_saved_activations ? ", distributed over tp" : "");
  std::snprintf(line, sizeof line,
                "tp %d  pp %d  vpp %d%s  cp %d  ep %d  etp %d  dp %d | %s | recompute %s%s | %s | ep_chunks %d | %s\n",
                q.tp, q.pp, q.vpp, group.c_str(), q.cp, q.ep, q.etp, data_parallel(p),
                to_string(p.optimizer_sharding), to_string(p.recompute), layers.c_str(),
                p.linear_ce ? "linear CE" : "materialized logits", p.moe.ep_chunks, to_string(p.precision));
  o << line << "\nMemory per GPU (GiB), per pipeline stage at its peak phase\n";
  // One printf-formatted piece of a row.
  auto cell = [&line](const char* format, auto... args) {
    std::snprintf(line, sizeof line, format, args...);
    return line;
  };
  o << cell("%-6s %-9s", "stage", "phase");
  for (const MemoryCategoryInfo& c : kMemoryCategories) o << cell(" %7s", c.column);
  o << cell(" | %7s %7s\n", "GiB", "GB");
  for (const auto& s : e.memory.stages) {
    o << cell("%-6d %-9s", s.stage, to_string(s.peak_phase));
    for (const MemoryCategoryInfo& c : kMemoryCategories)
      o << cell(" %7.2f", s.breakdown.*c.member / GiB);
    o << cell(" | %7.2f %7.2f\n", s.peak_bytes / GiB, s.peak_bytes / GB);
  }
  std::snprintf(line, sizeof line, "peak: %.2f GiB (%.2f GB) on stage %d during %s; capacity %.2f GiB -> %s\n",
                e.memory.peak_bytes / GiB, e.memory.peak_bytes / GB, e.memory.peak_stage,
                to_string(e.memory.peak_phase), e.capacity_bytes / GiB, fit_verdict(e.fits, e.fits_at_estimate));
  o << line;
  if (e.band_points > 0) {
    std::snprintf(line, sizeof line, "  error band (10th-90th percentile of the profile's validation): %.2f-%.2f GiB\n",
                  e.peak_bytes_band.low / GiB, e.peak_bytes_band.high / GiB);
    o << line;
  }
  const TimeEstimate& t = e.time;
  const TimeBreakdown& b = t.breakdown;
  std::snprintf(line, sizeof line,
                "\nTime per step: %.3f s  |  %.1f TFLOP/s per GPU (model FLOPs)  |  MFU %.1f%%  |  %.0f tokens/s per GPU\n"
                "  compute %.3f s, recompute %.3f s, bubble %.3f s, launch %.3f s, optimizer %.3f s, offload %.3f s, step %.3f s\n"
                "  exposed comm: tp %.3f s, cp %.3f s, ep %.3f s, pp %.3f s, dp/fsdp %.3f s  (bottleneck: %s)\n",
                t.step_seconds, t.tflops_per_gpu, 100 * t.mfu, t.tokens_per_second_per_gpu, b.compute, b.recompute,
                b.bubble, b.launch_overhead, b.optimizer, b.offload, b.step_overhead, b.exposed_comm.tp, b.exposed_comm.cp, b.exposed_comm.ep,
                b.exposed_comm.pp, b.exposed_comm.dp_fsdp, t.bottleneck.c_str());
  o << line;
  if (b.compute > 0) {
    const double other = std::max(0.0, b.compute - b.compute_attention - b.compute_moe);
    std::snprintf(line, sizeof line, "  of compute: attention cores %.3f s (%.0f%%), MoE layers %.3f s (%.0f%%), other %.3f s (%.0f%%)\n",
                  b.compute_attention, 100 * b.compute_attention / b.compute, b.compute_moe,
                  100 * b.compute_moe / b.compute, other, 100 * other / b.compute);
    o << line;
  }
  if (b.hidden_cp > 0 || b.exposed_comm.cp > 0) {
    std::snprintf(line, sizeof line, "  context parallel (%s): %.3f s of exchange, %.3f s of it hidden under attention\n",
                  to_string(p.comm.cp), b.hidden_cp + b.exposed_comm.cp, b.hidden_cp);
    o << line;
  }
  if (e.band_points > 0) {
    std::snprintf(line, sizeof line, "  error band: %.3f-%.3f s per step, %.0f-%.0f TFLOP/s per GPU (%d validated runs)\n",
                  e.step_seconds_band.low, e.step_seconds_band.high, e.tflops_band.low, e.tflops_band.high, e.band_points);
    o << line;
  }
  for (const auto& w : e.warnings) o << "warning: " << w << "\n";
  return o.str();
}

}  // namespace lcplan
