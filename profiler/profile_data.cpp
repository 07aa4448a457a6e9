#include "profiler/profile_data.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "estimator/time_model.h"
#include "profiler/fit.h"

namespace lcplan::profiler {

const char* to_string(Coll c) {
  switch (c) {
    case Coll::AllToAll: return "all_to_all";
    case Coll::AllGather: return "all_gather";
    case Coll::ReduceScatter: return "reduce_scatter";
    case Coll::AllReduce: return "all_reduce";
    case Coll::SendRecv: return "send_recv";
  }
  return "all_reduce";
}

double bus_factor(Coll c, int ranks) {
  const double n = std::max(ranks, 1);
  switch (c) {
    case Coll::AllReduce: return 2 * (n - 1) / n;
    case Coll::AllGather:
    case Coll::ReduceScatter:
    case Coll::AllToAll: return (n - 1) / n;
    case Coll::SendRecv: return 1;
  }
  return 1;
}

namespace {

nlohmann::json overlap_json(const OverlapSummary& s) {
  return {{"compute_busy", s.compute_busy}, {"comm_busy", s.comm_busy}, {"both_busy", s.both},
          {"makespan", s.makespan}, {"overlap", s.overlap()}};
}

std::string num(double v, int digits = 3) {
  std::ostringstream o;
  o.precision(digits);
  o << v;
  return o.str();
}

}  // namespace

nlohmann::json to_json(const ProfileData& d) {
  using nlohmann::json;
  json j = {{"backend", d.backend}};
  json g = json::array();
  for (const auto& r : d.gemm)
    g.push_back({{"m", r.m}, {"n", r.n}, {"k", r.k}, {"type", r.type}, {"class", r.shape_class}, {"seconds", r.seconds},
                 {"flops_per_second", r.flops() / r.seconds}});
  j["gemm"] = g;
  json gg = json::array();
  for (const auto& r : d.grouped)
    gg.push_back({{"experts", r.experts}, {"tokens_per_expert", r.tokens_per_expert}, {"hidden", r.hidden},
                  {"ffn", r.ffn}, {"seconds", r.seconds}, {"flops_per_second", r.flops() / r.seconds}});
  j["grouped_gemm"] = gg;
  json at = json::array();
  for (const auto& r : d.attention)
    at.push_back({{"seq", r.seq}, {"heads", r.heads}, {"kv_heads", r.kv_heads}, {"head_dim", r.head_dim},
                  {"forward_flops", r.forward_flops}, {"seconds", r.seconds},
                  {"flops_per_second", 3.5 * r.forward_flops / r.seconds}});
  j["attention"] = at;
  json la = json::array();
  for (const auto& r : d.linear_attention)
    la.push_back({{"seq", r.seq}, {"key_heads", r.key_heads}, {"value_heads", r.value_heads}, {"key_dim", r.key_dim},
                  {"value_dim", r.value_dim}, {"forward_flops", r.forward_flops}, {"seconds", r.seconds},
                  {"flops_per_second", 3 * r.forward_flops / r.seconds}});
  j["linear_attention"] = la;
  json ce = json::array();
  for (const auto& r : d.linear_ce) {
    json row = {{"tokens", r.tokens}, {"hidden", r.hidden}, {"vocab", r.vocab}, {"vocab_tile", r.vocab_tile},
                {"token_tile", r.token_tile}, {"type", r.type}, {"linear_seconds", r.linear_seconds}};
    if (r.materialized_seconds > 0) {
      row["materialized_seconds"] = r.materialized_seconds;
      row["slowdown"] = r.linear_seconds / r.materialized_seconds;
    }
    ce.push_back(row);
  }
  j["linear_ce"] = ce;
  json moe = json::array();
  for (const auto& r : d.moe)
    moe.push_back({{"ranks", r.ranks}, {"tokens", r.tokens}, {"chunks", r.chunks}, {"overlap", r.overlap},
                   {"hidden", r.hidden}, {"experts", r.experts}, {"top_k", r.top_k}, {"ffn", r.ffn},
                   {"shared_ffn", r.shared_ffn}, {"forward_seconds", r.forward}, {"backward_seconds", r.backward},
                   {"forward_streams", overlap_json(r.fwd)}, {"backward_streams", overlap_json(r.bwd)}});
  j["moe_layer"] = moe;
  json co = json::array();
  for (const auto& r : d.collectives)
    co.push_back({{"group", r.group}, {"ranks", r.ranks}, {"nodes", r.nodes}, {"tier", to_string(r.tier)},
                  {"collective", to_string(r.coll)}, {"bytes", r.bytes}, {"seconds", r.seconds},
                  {"bus_bandwidth", r.bus_bandwidth()}});
  j["collectives"] = co;
  json cp = json::array();
  for (const auto& r : d.copy) cp.push_back({{"bytes", r.bytes}, {"seconds", r.seconds}, {"bandwidth", r.bandwidth()}});
  j["copy"] = cp;
  json ln = json::array();
  for (const auto& r : d.launch) ln.push_back({{"what", r.what}, {"seconds", r.seconds}});
  j["launch"] = ln;
  j["notes"] = d.notes;
  return j;
}

Derived derive_coefficients(const ProfileData& d, const Hardware& hw, const Calibration& start) {
  const double linear_ce_tile = start.linear_ce_vocab_tile;
  Derived out;
  auto put = [&](const char* key, double v, const std::string& how) { out.coefficients[key] = {v, how}; };
  auto own = [&](const char* key) {
    if (auto it = out.coefficients.find(key); it != out.coefficients.end()) it->second.own_kernel = true;
  };
  auto curve = [&](const char* eff_key, const char* half_key, const char* what, const char* unit,
                   const std::vector<double>& x, const std::vector<double>& y) {
    if (x.empty()) return;
    const CurveFit f = fit_saturating(x, y);
    const std::string how = "least-squares fit of max*x/(x+half) to " + std::to_string(f.points) + " " + what +
                            " points (x = " + unit + "; rms residual " + num(f.rms, 2) + ")";
    put(eff_key, f.max, how);
    if (half_key) put(half_key, f.half, how);
    out.fits[eff_key] = {{"max", f.max}, {"half", f.half}, {"rms", f.rms}, {"points", f.points}, {"x", unit}};
  };

  // Dense GEMMs at the bf16 peak (fp32 on CPUs: the CPU profile's peaks are its fp32 rate).
  std::vector<double> gx, gy;
  for (const auto& r : d.gemm)
    if (r.type != "fp8") gx.push_back(double(r.m)), gy.push_back(r.flops() / r.seconds / hw.peak_bf16_flops);
  curve("time.gemm_efficiency", "time.gemm_half_tokens", "dense GEMM", "tokens", gx, gy);

  // fp8 at the fp8 peak relative to bf16 at the bf16 peak, shape by shape.
  std::vector<double> ratios;
  for (const auto& r8 : d.gemm) {
    if (r8.type != "fp8") continue;
    for (const auto& r16 : d.gemm)
      if (r16.type == "bf16" && r16.m == r8.m && r16.n == r8.n && r16.k == r8.k)
        ratios.push_back((r8.flops() / r8.seconds / hw.peak_fp8_flops) / (r16.flops() / r16.seconds / hw.peak_bf16_flops));
  }
  if (!ratios.empty())
    put("time.fp8_gemm_ratio", median(ratios),
        "median over " + std::to_string(ratios.size()) + " shapes of fp8 efficiency (at the fp8 peak) / bf16 efficiency");

  std::vector<double> ex, ey;
  for (const auto& r : d.grouped)
    ex.push_back(double(r.tokens_per_expert)), ey.push_back(r.flops() / r.seconds / hw.peak_bf16_flops);
  curve("time.grouped_gemm_efficiency", "time.grouped_gemm_half_tokens", "grouped expert GEMM", "tokens per local expert",
        ex, ey);

  std::vector<double> ax, ay;
  for (const auto& r : d.attention)
    ax.push_back(double(r.seq)),
        ay.push_back((1 + attention_backward_units(double(r.head_dim), start)) * r.forward_flops / r.seconds /
                     (hw.peak_bf16_flops * attention_head_dim_factor(double(r.head_dim))));
  curve("time.attention_efficiency", "time.attention_half_seq", "attention forward+backward", "local sequence", ax, ay);
  own("time.attention_efficiency"), own("time.attention_half_seq");

  std::vector<double> le;
  for (const auto& r : d.linear_attention) le.push_back(3 * r.forward_flops / r.seconds / hw.peak_bf16_flops);
  if (!le.empty())
    put("time.linear_attention_efficiency", median(le),
        "median over " + std::to_string(le.size()) + " gated DeltaNet forward+backward points (model FLOPs x 3)");
  own("time.linear_attention_efficiency");

  std::vector<double> slow;
  bool tile_match = false;
  for (const auto& r : d.linear_ce) tile_match |= r.materialized_seconds > 0 && double(r.vocab_tile) == linear_ce_tile;
  for (const auto& r : d.linear_ce)
    if (r.materialized_seconds > 0 && (!tile_match || double(r.vocab_tile) == linear_ce_tile))
      slow.push_back(r.linear_seconds / r.materialized_seconds);
  if (!slow.empty())
    put("time.linear_ce_slowdown", median(slow),
        "median over " + std::to_string(slow.size()) + " shapes of linear-CE / materialized loss time" +
            (tile_match ? " at vocabulary tile " + num(linear_ce_tile, 6) : std::string(" over every tile")));
  own("time.linear_ce_slowdown");

  // Memory-bound passes: the copies of the largest quarter of sizes (past the caches).
  if (!d.copy.empty()) {
    double largest = 0;
    for (const auto& r : d.copy) largest = std::max(largest, r.bytes);
    std::vector<double> bw;
    for (const auto& r : d.copy)
      if (r.bytes * 4 >= largest) bw.push_back(r.bandwidth() / hw.hbm_bandwidth);
    put("time.hbm_efficiency", std::min(1.0, median(bw)),
        "median over " + std::to_string(bw.size()) + " large copies of (read + write bytes) / time / hbm_bandwidth");
  }
  if (!d.launch.empty()) {
    std::vector<double> s;
    for (const auto& r : d.launch) s.push_back(r.seconds);
    put("time.launch_seconds", median(s), "median host seconds per launch (" + d.launch.front().what + ")");
  }

  // Collectives per link tier: ring collectives (and send/recv) share one alpha-beta line in bus bytes; the
  // all-to-all has its own bandwidth, its fixed cost beyond the ring latency is the MoE call cost.
  for (const LinkTier tier : {LinkTier::NVLink, LinkTier::Network}) {
    const bool net = tier == LinkTier::Network;
    const double link = net ? hw.network_bandwidth : hw.nvlink_bandwidth;
    std::vector<double> rx, rt, ax2, at2;
    for (const auto& r : d.collectives) {
      if (r.tier != tier || r.ranks < 2 || r.seconds <= 0) continue;
      const double x = r.bytes * bus_factor(r.coll, r.ranks);
      if (r.coll == Coll::AllToAll) ax2.push_back(x), at2.push_back(r.seconds);
      else rx.push_back(x), rt.push_back(r.seconds);
    }
    double ring_alpha = -1;
    const std::string tname = net ? "network" : "intra-node";
    try {
      if (rx.size() >= 2) {
        const AlphaBetaFit f = fit_alpha_beta(rx, rt);
        const std::string how = "alpha-beta fit (weights 1/t^2) of " + std::to_string(f.points) + " " + tname +
                                " all-gather/reduce-scatter/all-reduce/send-recv points in nccl-tests bus bytes (rms " +
                                num(100 * f.rms_rel, 2) + "%)";
        ring_alpha = f.alpha;
        put(net ? "time.network_latency" : "time.nvlink_latency", f.alpha, how);
        put(net ? "time.network_efficiency" : "time.nvlink_efficiency", std::min(1.0, f.bandwidth / link),
            how + "; bus bandwidth " + num(f.bandwidth / 1e9) + " GB/s over " + num(link / 1e9) + " GB/s");
        out.fits[net ? "network_ring" : "nvlink_ring"] = {{"alpha", f.alpha}, {"bandwidth", f.bandwidth},
                                                           {"rms_rel", f.rms_rel}, {"points", f.points}};
      }
    } catch (const std::invalid_argument& e) {
      out.notes.push_back(tname + " ring collectives not fitted: " + e.what());
    }
    try {
      if (ax2.size() >= 2) {
        const AlphaBetaFit f = fit_alpha_beta(ax2, at2);
        const std::string how = "alpha-beta fit of " + std::to_string(f.points) + " " + tname +
                                " all-to-all points, bytes x (n-1)/n (rms " + num(100 * f.rms_rel, 2) + "%); " +
                                num(f.bandwidth / 1e9) + " GB/s over " + num(link / 1e9) + " GB/s";
        put(net ? "time.a2a_network_efficiency" : "time.a2a_nvlink_efficiency", std::min(1.0, f.bandwidth / link), how);
        if (!net && ring_alpha >= 0)
          put("time.a2a_latency", std::max(0.0, f.alpha - ring_alpha),
              "all-to-all fixed cost " + num(f.alpha * 1e6) + " us minus the ring latency " + num(ring_alpha * 1e6) +
                  " us (the estimator adds both per MoE all-to-all call)");
        out.fits[net ? "network_all_to_all" : "nvlink_all_to_all"] = {
            {"alpha", f.alpha}, {"bandwidth", f.bandwidth}, {"rms_rel", f.rms_rel}, {"points", f.points}};
      }
    } catch (const std::invalid_argument& e) {
      out.notes.push_back(tname + " all-to-all not fitted: " + e.what());
    }
  }
  return out;
}

nlohmann::json cpu_hardware_json(const ProfileData& d, const CpuFacts& f) {
  double flops = 0, copy = 0, intra = 0, cross = 0, p2p = 0;
  for (const auto& r : d.gemm) flops = std::max(flops, r.flops() / r.seconds);
  // STREAM's rule: only copies well past the caches measure memory (the largest quarter of the sizes).
  double largest = 0;
  for (const auto& r : d.copy) largest = std::max(largest, r.bytes);
  for (const auto& r : d.copy)
    if (r.bytes * 4 >= largest) copy = std::max(copy, r.bandwidth());
  for (const auto& r : d.collectives) {
    if (r.ranks < 2 || r.coll == Coll::AllToAll) continue;
    (r.tier == LinkTier::NVLink ? intra : cross) = std::max(r.tier == LinkTier::NVLink ? intra : cross, r.bus_bandwidth());
    if (r.tier == LinkTier::NVLink && r.coll == Coll::SendRecv) p2p = std::max(p2p, r.bus_bandwidth());
  }
  if (flops <= 0) throw std::invalid_argument("a CPU hardware profile needs the GEMM case (its peak is the best GEMM rate)");
  if (copy <= 0) throw std::invalid_argument("a CPU hardware profile needs the copy case (its memory bandwidth)");
  constexpr double kHeadroom = 0.95;  // measured best / 0.95: efficiencies against these peaks stay below 1
  const double peak = flops / kHeadroom, hbm = copy / kHeadroom;
  const double nvl = intra > 0 ? intra / kHeadroom : hbm;
  const double net = cross > 0 ? cross / kHeadroom : nvl;
  const double host = p2p > 0 ? p2p / kHeadroom : hbm;
  std::string source = "measured by lcplan profile on " + f.cpu_model + " (" + f.date + ", `" + f.command +
                       "`); CPU ranks stand in for GPUs: peak_bf16_flops = peak_fp8_flops = the best fp32 Eigen GEMM "
                       "rate / 0.95 (" + num(flops / 1e9) + " GFLOP/s; a CPU has no bf16 or fp8 tensor cores, so "
                       "the peaks are equal and low precision runs at the bf16 rate); hbm_bandwidth = the best "
                       "STREAM-like copy (read + write) of the largest sizes / 0.95 (" + num(copy / 1e9) + " GB/s); hbm_bytes = node memory / " +
                       std::to_string(f.ranks_per_node) + " ranks; ";
  source += intra > 0 ? "nvlink_bandwidth = the best intra-node MPI bus bandwidth / 0.95 (" + num(intra / 1e9) + " GB/s); "
                      : "nvlink_bandwidth = the copy bandwidth (one rank: no intra-node collective measured); ";
  source += cross > 0 ? "network_bandwidth = the best cross-node MPI bus bandwidth / 0.95 (" + num(cross / 1e9) + " GB/s); "
                      : "network_bandwidth = nvlink_bandwidth (the launch spanned one node: no network measured); ";
  source += p2p > 0 ? "host_bandwidth = the best intra-node MPI send/recv bandwidth / 0.95"
                    : "host_bandwidth = the copy bandwidth (no send/recv measured)";
  source += "; gpus_per_node = MPI ranks on the node";
  return {{"name", f.name},
          {"description", "CPU node measured by lcplan profile (" + f.cpu_model + ", " + std::to_string(f.ranks_per_node) +
                              " rank(s) per node); CPU measurements, not a GPU"},
          {"hbm_bytes", std::floor(f.memory_bytes / std::max(1, f.ranks_per_node))},
          {"hbm_bandwidth", hbm},
          {"peak_bf16_flops", peak},
          {"peak_fp8_flops", peak},
          {"nvlink_bandwidth", nvl},
          {"network_bandwidth", net},
          {"host_bandwidth", host},
          {"gpus_per_node", f.ranks_per_node},
          {"block_scaled", false},
          {"source", source}};
}

}  // namespace lcplan::profiler
