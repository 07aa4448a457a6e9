#include "estimator/plan.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>

#include "common/json_file.h"
#include "common/user_error.h"
#include "models/model_spec.h"

namespace lcplan {

int data_parallel(const Plan& p) {
  const Parallel& q = p.parallel;
  if (q.tp <= 0 || q.pp <= 0 || q.cp <= 0) return 0;
  // 64-bit and stopping early: tp*pp*cp of unchecked input can overflow int (and, all three huge, int64).
  const int64_t tp_pp = int64_t(q.tp) * q.pp;
  if (tp_pp > p.gpus) return 0;
  return static_cast<int>(p.gpus / (tp_pp * q.cp));
}

ModelSpec model_for_plan(ModelSpec m, const Plan& p) {
  if (p.mtp_layers >= 0) m.mtp_layers = p.mtp_layers;
  return m;
}

int effective_global_batch(const Plan& p) {
  if (p.global_batch > 0) return p.global_batch;
  // Default, the same for estimate and search: one sequence per GPU, rounded up to whole microbatches per DP rank,
  // so every layout of a search trains on the same tokens per step. Saturates instead of overflowing int on absurd
  // input; check_plan then rejects the batch.
  const int64_t per_step = int64_t(p.micro_batch) * data_parallel(p);
  if (per_step <= 0) return std::max(p.gpus, 0);
  const int64_t gb = (int64_t(p.gpus) + per_step - 1) / per_step * per_step;
  return static_cast<int>(std::clamp<int64_t>(gb, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
}

int num_microbatches(const Plan& p) {
  const int64_t per_step = int64_t(p.micro_batch) * data_parallel(p);
  return per_step > 0 ? static_cast<int>(effective_global_batch(p) / per_step) : 0;
}

const char* to_string(Precision v) {
  switch (v) {
    case Precision::BF16: return "bf16";
    case Precision::FP8: return "fp8";
    case Precision::MXFP8: return "mxfp8";
    case Precision::NVFP4: return "nvfp4";
  }
  return "?";
}
const char* to_string(OptimizerSharding v) {
  switch (v) {
    case OptimizerSharding::None: return "none";
    case OptimizerSharding::DistOpt: return "dist_opt";
    case OptimizerSharding::Fsdp: return "fsdp";
  }
  return "?";
}
const char* to_string(Recompute v) {
  switch (v) {
    case Recompute::None: return "none";
    case Recompute::Selective: return "selective";
    case Recompute::Full: return "full";
  }
  return "?";
}

const char* to_string(MoeDispatcher d) { return d == MoeDispatcher::DeepEP ? "deepep" : "alltoall"; }
MoeDispatcher parse_dispatcher(const std::string& s) {
  if (s == "alltoall") return MoeDispatcher::AllToAll;
  if (s == "deepep") return MoeDispatcher::DeepEP;
  throw UserError("moe dispatcher \"" + s + "\" is not valid (use alltoall or deepep)");
}

Precision parse_precision(const std::string& s) {
  if (s == "bf16") return Precision::BF16;
  if (s == "fp8") return Precision::FP8;
  if (s == "mxfp8") return Precision::MXFP8;
  if (s == "nvfp4") return Precision::NVFP4;
  throw UserError("precision \"" + s + "\" is not valid (use bf16, fp8, mxfp8 or nvfp4)");
}
OptimizerSharding parse_optimizer_sharding(const std::string& s) {
  if (s == "none") return OptimizerSharding::None;
  if (s == "dist_opt") return OptimizerSharding::DistOpt;
  if (s == "fsdp") return OptimizerSharding::Fsdp;
  throw UserError("optimizer_sharding \"" + s + "\" is not valid (use none, dist_opt or fsdp)");
}
Recompute parse_recompute(const std::string& s) {
  if (s == "none") return Recompute::None;
  if (s == "selective") return Recompute::Selective;
  if (s == "full") return Recompute::Full;
  throw UserError("recompute \"" + s + "\" is not valid (use none, selective or full)");
}

int64_t parse_size(const std::string& text, const std::string& what) {
  const std::string bad = what + " \"" + text + "\" is not a valid size (use a positive whole number of tokens, "
                          "optionally with k/K or m/M, e.g. 131072, 128k, 1.5M)";
  if (text.empty() || text.size() > 32) throw UserError(bad);
  std::string num = text;
  double mult = 1;
  const char last = text.back();
  if (last == 'k' || last == 'K') mult = 1024.0;
  else if (last == 'm' || last == 'M') mult = 1024.0 * 1024.0;
  else if (last == 'g' || last == 'G') mult = 1024.0 * 1024.0 * 1024.0;
  if (mult != 1) num.pop_back();
  if (num.empty()) throw UserError(bad);
  int dots = 0;
  for (char ch : num) {
    if (ch == '.') ++dots;
    else if (ch < '0' || ch > '9') throw UserError(bad);
  }
  if (dots > 1 || num.front() == '.' || num.back() == '.') throw UserError(bad);
  const double v = std::stod(num) * mult;
  if (!(v >= 1) || v > 1e15 || std::floor(v) != v) throw UserError(bad);
  return static_cast<int64_t>(v);
}

namespace {

void check_keys(const nlohmann::json& j, const std::set<std::string>& allowed, const std::string& where) {
  if (!j.is_object()) throw UserError(where + " must be a JSON object");
  for (const auto& [k, _] : j.items())
    if (!allowed.count(k)) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      throw UserError(where + " has unknown key \"" + k + "\" (valid keys: " + list + ")");
    }
}

int get_int(const nlohmann::json& j, const char* key, const std::string& where, int fallback) {
  if (!j.contains(key)) return fallback;
  const auto& v = j.at(key);
  if (!v.is_number_integer() || v.get<int64_t>() < std::numeric_limits<int>::min() ||
      v.get<int64_t>() > std::numeric_limits<int>::max())
    throw UserError(where + "\"" + key + "\" must be an integer");
  return static_cast<int>(v.get<int64_t>());
}

double get_double(const nlohmann::json& j, const char* key, const std::string& where, double fallback) {
  if (!j.contains(key)) return fallback;
  const auto& v = j.at(key);
  if (!v.is_number()) throw UserError(where + "\"" + key + "\" must be a number");
  return v.get<double>();
}

bool get_bool(const nlohmann::json& j, const char* key, const std::string& where, bool fallback) {
  if (!j.contains(key)) return fallback;
  const auto& v = j.at(key);
  if (!v.is_boolean()) throw UserError(where + "\"" + key + "\" must be true or false");
  return v.get<bool>();
}

std::string get_string(const nlohmann::json& j, const char* key, const std::string& where, const std::string& fallback) {
  if (!j.contains(key)) return fallback;
  const auto& v = j.at(key);
  if (!v.is_string()) throw UserError(where + "\"" + key + "\" must be a string");
  return v.get<std::string>();
}

}  // namespace

Plan plan_from_json(const nlohmann::json& j) {
  const std::string w = "plan: ";
  check_keys(j,
             {"model", "hardware", "gpus", "gpus_per_node", "seq_len", "micro_batch", "global_batch", "precision",
              "parallel", "pipeline", "sequence_parallel", "optimizer_sharding", "recompute", "recompute_layers", "offload",
              "linear_ce", "mtp_layers", "moe", "implementation", "dp"},
             "plan");
  Plan p;
  p.model = get_string(j, "model", w, "");
  if (p.model.empty()) throw UserError("plan: \"model\" is missing (give a zoo name or a config.json path)");
  p.hardware = get_string(j, "hardware", w, p.hardware);
  p.gpus = get_int(j, "gpus", w, 0);
  p.gpus_per_node = get_int(j, "gpus_per_node", w, 0);
  if (j.contains("seq_len")) {
    const auto& v = j.at("seq_len");
    if (v.is_string()) p.seq_len = parse_size(v.get<std::string>(), "plan: \"seq_len\"");
    else if (v.is_number_integer()) p.seq_len = v.get<int64_t>();
    else throw UserError("plan: \"seq_len\" must be an integer or a size string such as \"128k\"");
  }
  p.micro_batch = get_int(j, "micro_batch", w, 1);
  p.global_batch = get_int(j, "global_batch", w, 0);
  p.precision = parse_precision(get_string(j, "precision", w, "bf16"));
  if (j.contains("parallel")) {
    const auto& par = j.at("parallel");
    check_keys(par, {"tp", "pp", "vpp", "cp", "ep", "etp", "dp"}, "plan \"parallel\"");
    const std::string pw = "plan: parallel.";
    p.parallel.tp = get_int(par, "tp", pw, 1);
    p.parallel.pp = get_int(par, "pp", pw, 1);
    p.parallel.vpp = get_int(par, "vpp", pw, 1);
    p.parallel.cp = get_int(par, "cp", pw, 1);
    p.parallel.ep = get_int(par, "ep", pw, 1);
    p.parallel.etp = get_int(par, "etp", pw, 1);
  }
  if (j.contains("pipeline")) {
    const auto& pl = j.at("pipeline");
    check_keys(pl, {"first_stage_layers", "last_stage_layers", "layers"}, "plan \"pipeline\"");
    p.pipeline.first_stage_layers = get_int(pl, "first_stage_layers", "plan: pipeline.", 0);
    p.pipeline.last_stage_layers = get_int(pl, "last_stage_layers", "plan: pipeline.", 0);
    if (pl.contains("layers")) {
      const auto& list = pl.at("layers");
      if (!list.is_array() || list.size() > 4096)
        throw UserError("plan: pipeline.\"layers\" must be a list of decoder layers per virtual stage (at most 4096)");
      for (const auto& v : list) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 1 << 20)
          throw UserError("plan: pipeline.\"layers\" entries must be whole numbers of layers (0 or more)");
        p.pipeline.chunk_layers.push_back(int(v.get<int64_t>()));
      }
    }
  }
  p.sequence_parallel = get_bool(j, "sequence_parallel", w, true);
  p.optimizer_sharding = parse_optimizer_sharding(get_string(j, "optimizer_sharding", w, "dist_opt"));
  p.recompute = parse_recompute(get_string(j, "recompute", w, "none"));
  p.recompute_layers = get_int(j, "recompute_layers", w, 0);
  if (j.contains("offload")) {
    const auto& off = j.at("offload");
    check_keys(off, {"optimizer", "activations"}, "plan \"offload\"");
    p.offload.optimizer = get_bool(off, "optimizer", "plan: offload.", false);
    p.offload.activations = get_bool(off, "activations", "plan: offload.", false);
  }
  p.linear_ce = get_bool(j, "linear_ce", w, false);
  p.mtp_layers = get_int(j, "mtp_layers", w, -1);
  if (p.mtp_layers < -1 || p.mtp_layers > 16)
    throw UserError("plan: \"mtp_layers\" = " + std::to_string(p.mtp_layers) + " is out of range (valid: 0 to 16, or -1 for the model's)");
  if (j.contains("moe")) {
    const auto& m = j.at("moe");
    check_keys(m, {"ep_chunks", "routing_imbalance", "capacity_factor", "a2a_overlap", "dispatcher"}, "plan \"moe\"");
    p.moe.ep_chunks = get_int(m, "ep_chunks", "plan: moe.", 1);
    p.moe.routing_imbalance = get_double(m, "routing_imbalance", "plan: moe.", 1.0);
    p.moe.capacity_factor = get_double(m, "capacity_factor", "plan: moe.", 0.0);
    p.moe.a2a_overlap = get_bool(m, "a2a_overlap", "plan: moe.", false);
    p.moe.dispatcher = parse_dispatcher(get_string(m, "dispatcher", "plan: moe.", "alltoall"));
  }
  p.implementation = get_string(j, "implementation", w, p.implementation);
  // dp may be present in emitted recipes for the reader's benefit; it must agree with the derived value.
  if (j.contains("dp") && (!j.at("dp").is_number_integer() || j.at("dp").get<int64_t>() != data_parallel(p)))
    throw UserError("plan: \"dp\" is derived from gpus/(tp*pp*cp) = " + std::to_string(data_parallel(p)) +
                    " and must not be given a different value");
  return p;
}

nlohmann::json plan_to_json(const Plan& p) {
  nlohmann::json j;
  j["model"] = p.model;
  j["hardware"] = p.hardware;
  j["gpus"] = p.gpus;
  if (p.gpus_per_node > 0) j["gpus_per_node"] = p.gpus_per_node;
  j["seq_len"] = p.seq_len;
  j["micro_batch"] = p.micro_batch;
  j["global_batch"] = effective_global_batch(p);
  j["precision"] = to_string(p.precision);
  j["parallel"] = {{"tp", p.parallel.tp}, {"pp", p.parallel.pp}, {"vpp", p.parallel.vpp},
                   {"cp", p.parallel.cp}, {"ep", p.parallel.ep}, {"etp", p.parallel.etp}};
  if (!p.pipeline.empty()) {
    nlohmann::json pl = nlohmann::json::object();
    if (p.pipeline.first_stage_layers > 0) pl["first_stage_layers"] = p.pipeline.first_stage_layers;
    if (p.pipeline.last_stage_layers > 0) pl["last_stage_layers"] = p.pipeline.last_stage_layers;
    if (!p.pipeline.chunk_layers.empty()) pl["layers"] = p.pipeline.chunk_layers;
    j["pipeline"] = pl;
  }
  j["sequence_parallel"] = p.sequence_parallel;
  j["optimizer_sharding"] = to_string(p.optimizer_sharding);
  j["recompute"] = to_string(p.recompute);
  if (p.recompute_layers > 0) j["recompute_layers"] = p.recompute_layers;
  j["offload"] = {{"optimizer", p.offload.optimizer}, {"activations", p.offload.activations}};
  j["linear_ce"] = p.linear_ce;
  if (p.mtp_layers >= 0) j["mtp_layers"] = p.mtp_layers;
  j["moe"] = {{"ep_chunks", p.moe.ep_chunks}, {"routing_imbalance", p.moe.routing_imbalance},
              {"capacity_factor", p.moe.capacity_factor}};
  if (p.moe.a2a_overlap) j["moe"]["a2a_overlap"] = true;
  if (p.moe.dispatcher != MoeDispatcher::AllToAll) j["moe"]["dispatcher"] = to_string(p.moe.dispatcher);
  j["implementation"] = p.implementation;
  return j;
}

namespace {

// A model or hardware value that names a file rather than a zoo entry or shipped profile.
bool names_a_path(const std::string& v) { return v.find('/') != std::string::npos || v.ends_with(".json"); }

// `v` (relative to the working directory) re-expressed relative to `dir`.
std::string relative_to(const std::string& v, const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  if (!names_a_path(v) || fs::path(v).is_absolute()) return v;
  std::error_code ec;
  const fs::path rel = fs::relative(fs::absolute(v), fs::absolute(dir), ec);
  return ec || rel.empty() ? fs::absolute(v).string() : rel.string();
}

// `v` as stored in a recipe in `dir`, as a path the working directory can open.
std::string resolved_from(const std::string& v, const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  if (!names_a_path(v) || fs::path(v).is_absolute()) return v;
  const fs::path beside = dir / v;
  std::error_code ec;
  return fs::exists(beside, ec) ? beside.lexically_normal().string() : v;
}

}  // namespace

Plan load_plan_file(const std::string& path) {
  Plan p = plan_from_json(read_json_file(path, "plan file"));
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  p.model = resolved_from(p.model, dir);
  p.hardware = resolved_from(p.hardware, dir);
  return p;
}

void write_plan_file(const std::string& path, const Plan& plan) {
  Plan p = plan;
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  p.model = relative_to(p.model, dir.empty() ? "." : dir);
  p.hardware = relative_to(p.hardware, dir.empty() ? "." : dir);
  write_file_atomic(path, plan_to_json(p).dump(2) + "\n");
}

}  // namespace lcplan
