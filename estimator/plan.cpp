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

// Megatron-LM schedules.py: microbatch_group_size_per_vp_stage defaults to pp.
int microbatch_group_size(const Plan& p) { return p.microbatch_group > 0 ? p.microbatch_group : p.parallel.pp; }

// Megatron-LM's uniform method checkpoints recompute_layers layers at once; the block method each layer it recomputes.
int layers_per_checkpoint(const Plan& p) {
  return p.recompute_method == RecomputeMethod::Uniform ? std::max(1, p.recompute_layers) : 1;
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

const char* to_string(MoeDispatcher d) {
  switch (d) {
    case MoeDispatcher::AllToAll: return "alltoall";
    case MoeDispatcher::AllGather: return "allgather";
    case MoeDispatcher::DeepEP: return "deepep";
    case MoeDispatcher::HybridEP: return "hybridep";
  }
  return "?";
}
MoeDispatcher parse_dispatcher(const std::string& s) {
  for (MoeDispatcher d : {MoeDispatcher::AllToAll, MoeDispatcher::AllGather, MoeDispatcher::DeepEP, MoeDispatcher::HybridEP})
    if (s == to_string(d)) return d;
  throw UserError("moe dispatcher \"" + s + "\" is not valid (use alltoall, allgather, deepep or hybridep)");
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
  return v.get<double>() + 0.0;  // -0 is 0: a field reads and writes one zero (fuzz/corpus/run_settings/regress-*)
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

std::vector<std::string> get_names(const nlohmann::json& j, const char* key, const std::string& where) {
  const auto& v = j.at(key);
  if (!v.is_array() || v.size() > 32) throw UserError(where + "\"" + key + "\" must be a list of module names");
  std::vector<std::string> out;
  for (const auto& x : v) {
    if (!x.is_string()) throw UserError(where + "\"" + key + "\" must be a list of module names");
    out.push_back(x.get<std::string>());
  }
  return out;
}

const std::vector<Dtype> kGradDtypes = {Dtype::FP32, Dtype::BF16};
const std::vector<Dtype> kMainParamDtypes = {Dtype::FP32, Dtype::FP16};
const std::vector<Dtype> kMomentDtypes = {Dtype::FP32, Dtype::BF16, Dtype::FP16, Dtype::FP8};
const std::vector<Dtype> kRouterDtypes = {Dtype::BF16, Dtype::FP32, Dtype::FP64};

void read_offload(const nlohmann::json& j, Plan& p) {
  if (!j.contains("offload")) return;
  const auto& off = j.at("offload");
  check_keys(off, {"optimizer", "activations", "optimizer_fraction", "modules", "modules_fraction"}, "plan \"offload\"");
  const std::string w = "plan: offload.";
  p.offload.optimizer = get_bool(off, "optimizer", w, false);
  p.offload.activations = get_bool(off, "activations", w, false);
  p.offload.optimizer_fraction = get_double(off, "optimizer_fraction", w, 1.0);
  p.offload.modules_fraction = get_double(off, "modules_fraction", w, 1.0);
  if (off.contains("modules")) p.offload.modules = parse_modules(get_names(off, "modules", w), offload_module_names(), "offload module");
}

// Routing: an explicit imbalance says which routing it is when "routing" is absent (1 = forced balance).
void read_moe(const nlohmann::json& j, Plan& p) {
  p.assumed |= kFieldRouting | kFieldRoutingImbalance | kFieldRouterDtype | kFieldPermuteFusion;
  if (!j.contains("moe")) return;
  const auto& m = j.at("moe");
  check_keys(m, {"ep_chunks", "routing_imbalance", "capacity_factor", "a2a_overlap", "dispatcher", "routing", "router_dtype",
                 "permute_fusion", "pad_to_capacity", "rank_capacity_factor", "paged_stash"},
             "plan \"moe\"");
  const std::string w = "plan: moe.";
  p.moe.ep_chunks = get_int(m, "ep_chunks", w, 1);
  p.moe.routing_imbalance = get_double(m, "routing_imbalance", w, 1.0);
  p.moe.capacity_factor = get_double(m, "capacity_factor", w, 0.0);
  p.moe.a2a_overlap = get_bool(m, "a2a_overlap", w, false);
  p.moe.dispatcher = parse_dispatcher(get_string(m, "dispatcher", w, "alltoall"));
  p.moe.pad_to_capacity = get_bool(m, "pad_to_capacity", w, true);
  p.moe.rank_capacity_factor = get_double(m, "rank_capacity_factor", w, 0.0);
  p.moe.paged_stash = get_bool(m, "paged_stash", w, false);
  if (m.contains("routing")) {
    p.moe.routing = parse_routing(get_string(m, "routing", w, ""));
    p.assumed &= ~kFieldRouting;
  }
  if (m.contains("routing_imbalance")) {
    p.assumed &= ~kFieldRoutingImbalance;
    if (p.assumed & kFieldRouting) p.moe.routing = p.moe.routing_imbalance > 1 ? Routing::AuxLoss : Routing::Forced;
    p.assumed &= ~kFieldRouting;
  } else if (!(p.assumed & kFieldRouting) && p.moe.routing == Routing::Forced) {
    p.assumed &= ~kFieldRoutingImbalance;  // forced balance: 1
  }
  if (m.contains("router_dtype")) {
    p.moe.router_dtype = parse_dtype(get_string(m, "router_dtype", w, ""), "moe router_dtype", kRouterDtypes);
    p.assumed &= ~kFieldRouterDtype;
  }
  if (m.contains("permute_fusion")) p.moe.permute_fusion = get_bool(m, "permute_fusion", w, true), p.assumed &= ~kFieldPermuteFusion;
}

void read_optimizer(const nlohmann::json& j, Plan& p) {
  p.assumed |= kFieldGradDtype | kFieldOptimizerDtypes;
  if (!j.contains("optimizer")) return;
  const auto& o = j.at("optimizer");
  check_keys(o, {"grad_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype", "precision_aware", "instances"},
             "plan \"optimizer\"");
  const std::string w = "plan: optimizer.";
  OptimizerNumerics& n = p.optimizer;
  if (o.contains("grad_dtype")) n.grad = parse_dtype(get_string(o, "grad_dtype", w, ""), "optimizer grad_dtype", kGradDtypes), p.assumed &= ~kFieldGradDtype;
  if (o.contains("main_params_dtype") || o.contains("exp_avg_dtype") || o.contains("exp_avg_sq_dtype") || o.contains("precision_aware"))
    p.assumed &= ~kFieldOptimizerDtypes;
  n.main_params = parse_dtype(get_string(o, "main_params_dtype", w, "fp32"), "optimizer main_params_dtype", kMainParamDtypes);
  n.exp_avg = parse_dtype(get_string(o, "exp_avg_dtype", w, "fp32"), "optimizer exp_avg_dtype", kMomentDtypes);
  n.exp_avg_sq = parse_dtype(get_string(o, "exp_avg_sq_dtype", w, "fp32"), "optimizer exp_avg_sq_dtype", kMomentDtypes);
  n.precision_aware = get_bool(o, "precision_aware", w, false);
  n.instances = get_int(o, "instances", w, 1);
}

void read_fp8(const nlohmann::json& j, Plan& p) {
  p.assumed |= kFieldFp8Recipe | kFieldFp8ParamGather | kFieldFp8Attention;
  if (!j.contains("fp8")) return;
  const auto& f = j.at("fp8");
  check_keys(f, {"recipe", "param_gather", "attention"}, "plan \"fp8\"");
  const std::string w = "plan: fp8.";
  if (f.contains("recipe")) p.fp8.recipe = parse_fp8_recipe(get_string(f, "recipe", w, "")), p.assumed &= ~kFieldFp8Recipe;
  if (f.contains("param_gather")) p.fp8.param_gather = get_bool(f, "param_gather", w, false), p.assumed &= ~kFieldFp8ParamGather;
  if (f.contains("attention")) p.fp8.attention = get_bool(f, "attention", w, false), p.assumed &= ~kFieldFp8Attention;
}

void read_graphs_and_comm(const nlohmann::json& j, Plan& p) {
  p.assumed |= kFieldCudaGraphs | kFieldDpOverlap | kFieldTpOverlap | kFieldCpComm;
  if (j.contains("cuda_graphs")) {
    const auto& g = j.at("cuda_graphs");
    check_keys(g, {"impl", "modules"}, "plan \"cuda_graphs\"");
    p.cuda_graphs.impl = parse_graph_impl(get_string(g, "impl", "plan: cuda_graphs.", "none"));
    if (g.contains("modules")) p.cuda_graphs.modules = parse_modules(get_names(g, "modules", "plan: cuda_graphs."), graph_module_names(), "cuda graph module");
    p.assumed &= ~kFieldCudaGraphs;
  }
  if (!j.contains("comm")) return;
  const auto& c = j.at("comm");
  check_keys(c, {"overlap_grad_reduce", "overlap_param_gather", "tp_overlap", "cp", "cp_a2a_size"}, "plan \"comm\"");
  const std::string w = "plan: comm.";
  if (c.contains("overlap_grad_reduce") || c.contains("overlap_param_gather")) p.assumed &= ~kFieldDpOverlap;
  p.comm.overlap_grad_reduce = get_bool(c, "overlap_grad_reduce", w, true);
  p.comm.overlap_param_gather = get_bool(c, "overlap_param_gather", w, true);
  if (c.contains("tp_overlap")) p.comm.tp_overlap = get_bool(c, "tp_overlap", w, true), p.assumed &= ~kFieldTpOverlap;
  if (c.contains("cp")) p.comm.cp = parse_cp_comm(get_string(c, "cp", w, "p2p")), p.assumed &= ~kFieldCpComm;
  p.comm.cp_a2a_size = get_int(c, "cp_a2a_size", w, 0);
}

void read_recompute(const nlohmann::json& j, Plan& p) {
  const std::string w = "plan: ";
  p.recompute = parse_recompute(get_string(j, "recompute", w, "none"));
  p.recompute_layers = get_int(j, "recompute_layers", w, 0);
  p.recompute_method = parse_recompute_method(get_string(j, "recompute_method", w, "block"));
  if (j.contains("recompute_modules"))
    p.recompute_modules = parse_modules(get_names(j, "recompute_modules", w), recompute_module_names(), "recompute module");
}

}  // namespace

Plan plan_from_json(const nlohmann::json& j) {
  const std::string w = "plan: ";
  check_keys(j,
             {"model", "hardware", "gpus", "gpus_per_node", "seq_len", "micro_batch", "global_batch", "precision",
              "parallel", "pipeline", "sequence_parallel", "optimizer_sharding", "recompute", "recompute_layers",
              "recompute_method", "recompute_modules", "distribute_saved_activations", "offload", "linear_ce", "mtp_layers", "moe", "optimizer", "fp8",
              "cuda_graphs", "comm", "implementation", "dp", "packed_lengths", "packed_splits", "batches", "hybrid_cp"},
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
  if (j.contains("packed_lengths")) {
    const auto& v = j.at("packed_lengths");
    if (!v.is_array()) throw UserError("plan: \"packed_lengths\" must be a list of sequence lengths (tokens)");
    for (const auto& e : v) {
      if (!e.is_number_integer() || e.get<int64_t>() < 1)
        throw UserError("plan: \"packed_lengths\" holds " + e.dump() + "; each entry must be a positive integer");
      p.packed_lengths.push_back(e.get<int64_t>());
    }
  }
  if (j.contains("packed_splits")) {
    const auto& v = j.at("packed_splits");
    if (!v.is_array()) throw UserError("plan: \"packed_splits\" must be a list of CP rank counts, one per packed length");
    for (const auto& e : v) {
      if (!e.is_number_integer() || e.get<int64_t>() < 1 || e.get<int64_t>() > 1 << 20)
        throw UserError("plan: \"packed_splits\" holds " + e.dump() + "; each entry must be a whole number of CP ranks, 1 or more");
      p.packed_splits.push_back(int(e.get<int64_t>()));
    }
  }
  if (j.contains("batches")) p.batches = std::make_shared<const BatchSpec>(batch_spec_from_json(j.at("batches")));
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
    check_keys(pl, {"first_stage_layers", "last_stage_layers", "layers", "microbatch_group"}, "plan \"pipeline\"");
    p.microbatch_group = get_int(pl, "microbatch_group", "plan: pipeline.", 0);
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
  read_recompute(j, p);
  read_offload(j, p);
  p.linear_ce = get_bool(j, "linear_ce", w, false);
  p.distribute_saved_activations = get_bool(j, "distribute_saved_activations", w, false);
  p.hybrid_cp = get_bool(j, "hybrid_cp", w, false);
  p.mtp_layers = get_int(j, "mtp_layers", w, -1);
  if (p.mtp_layers < -1 || p.mtp_layers > 16)
    throw UserError("plan: \"mtp_layers\" = " + std::to_string(p.mtp_layers) + " is out of range (valid: 0 to 16, or -1 for the model's)");
  read_moe(j, p);
  read_optimizer(j, p);
  read_fp8(j, p);
  read_graphs_and_comm(j, p);
  p.implementation = get_string(j, "implementation", w, p.implementation);
  // dp may be present in emitted recipes for the reader's benefit; it must agree with the derived value.
  if (j.contains("dp") && (!j.at("dp").is_number_integer() || j.at("dp").get<int64_t>() != data_parallel(p)))
    throw UserError("plan: \"dp\" is derived from gpus/(tp*pp*cp) = " + std::to_string(data_parallel(p)) +
                    " and must not be given a different value");
  return p;
}

namespace {

// The run settings (estimator/run_settings.h), each written unless the plan left it to its implementation.
void write_run_settings(const Plan& p, nlohmann::json& j) {
  const auto given = [&](uint32_t field) { return !(p.assumed & field); };
  if (p.recompute_method != RecomputeMethod::Block) j["recompute_method"] = to_string(p.recompute_method);
  if (p.recompute == Recompute::Selective && given(kFieldRecomputeModules))
    j["recompute_modules"] = module_list(p.recompute_modules, recompute_module_names());
  if (p.offload.optimizer && p.offload.optimizer_fraction != 1.0) j["offload"]["optimizer_fraction"] = p.offload.optimizer_fraction;
  if (p.offload.modules_fraction != 1.0) j["offload"]["modules_fraction"] = p.offload.modules_fraction;
  if (p.offload.modules) j["offload"]["modules"] = module_list(p.offload.modules, offload_module_names());
  nlohmann::json& moe = j["moe"];
  if (given(kFieldRouting)) moe["routing"] = to_string(p.moe.routing);
  if (!given(kFieldRoutingImbalance)) moe.erase("routing_imbalance");
  if (given(kFieldRouterDtype)) moe["router_dtype"] = to_string(p.moe.router_dtype);
  if (given(kFieldPermuteFusion)) moe["permute_fusion"] = p.moe.permute_fusion;
  if (p.moe.capacity_factor > 0) moe["pad_to_capacity"] = p.moe.pad_to_capacity;
  if (p.moe.rank_capacity_factor > 0) moe["rank_capacity_factor"] = p.moe.rank_capacity_factor;
  if (p.moe.paged_stash) moe["paged_stash"] = true;
  nlohmann::json opt = nlohmann::json::object();
  if (given(kFieldGradDtype)) opt["grad_dtype"] = to_string(p.optimizer.grad);
  if (given(kFieldOptimizerDtypes)) {
    opt["main_params_dtype"] = to_string(p.optimizer.main_params);
    opt["exp_avg_dtype"] = to_string(p.optimizer.exp_avg);
    opt["exp_avg_sq_dtype"] = to_string(p.optimizer.exp_avg_sq);
    opt["precision_aware"] = p.optimizer.precision_aware;
  }
  if (p.optimizer.instances != 1) opt["instances"] = p.optimizer.instances;
  if (!opt.empty()) j["optimizer"] = opt;
  nlohmann::json fp8 = nlohmann::json::object();
  if (given(kFieldFp8Recipe)) fp8["recipe"] = to_string(p.fp8.recipe);
  if (given(kFieldFp8ParamGather)) fp8["param_gather"] = p.fp8.param_gather;
  if (given(kFieldFp8Attention)) fp8["attention"] = p.fp8.attention;
  if (!fp8.empty()) j["fp8"] = fp8;
  if (given(kFieldCudaGraphs)) {
    j["cuda_graphs"] = {{"impl", to_string(p.cuda_graphs.impl)}};
    if (p.cuda_graphs.modules) j["cuda_graphs"]["modules"] = module_list(p.cuda_graphs.modules, graph_module_names());
  }
  nlohmann::json comm = nlohmann::json::object();
  if (given(kFieldDpOverlap)) {
    comm["overlap_grad_reduce"] = p.comm.overlap_grad_reduce;
    comm["overlap_param_gather"] = p.comm.overlap_param_gather;
  }
  if (given(kFieldTpOverlap)) comm["tp_overlap"] = p.comm.tp_overlap;
  if (given(kFieldCpComm)) comm["cp"] = to_string(p.comm.cp);
  if (p.comm.cp_a2a_size > 0) comm["cp_a2a_size"] = p.comm.cp_a2a_size;
  if (!comm.empty()) j["comm"] = comm;
}

}  // namespace

nlohmann::json plan_to_json(const Plan& p) {
  nlohmann::json j;
  j["model"] = p.model;
  j["hardware"] = p.hardware;
  j["gpus"] = p.gpus;
  if (p.gpus_per_node > 0) j["gpus_per_node"] = p.gpus_per_node;
  j["seq_len"] = p.seq_len;
  j["micro_batch"] = p.micro_batch;
  if (!p.packed_lengths.empty()) j["packed_lengths"] = p.packed_lengths;
  if (!p.packed_splits.empty()) j["packed_splits"] = p.packed_splits;
  if (p.batches) j["batches"] = batch_spec_to_json(*p.batches);
  j["global_batch"] = effective_global_batch(p);
  j["precision"] = to_string(p.precision);
  j["parallel"] = {{"tp", p.parallel.tp}, {"pp", p.parallel.pp}, {"vpp", p.parallel.vpp},
                   {"cp", p.parallel.cp}, {"ep", p.parallel.ep}, {"etp", p.parallel.etp}};
  if (!p.pipeline.empty() || p.microbatch_group > 0) {
    nlohmann::json pl = nlohmann::json::object();
    if (p.microbatch_group > 0) pl["microbatch_group"] = p.microbatch_group;
    if (p.pipeline.first_stage_layers > 0) pl["first_stage_layers"] = p.pipeline.first_stage_layers;
    if (p.pipeline.last_stage_layers > 0) pl["last_stage_layers"] = p.pipeline.last_stage_layers;
    if (!p.pipeline.chunk_layers.empty()) pl["layers"] = p.pipeline.chunk_layers;
    j["pipeline"] = pl;
  }
  j["sequence_parallel"] = p.sequence_parallel;
  j["optimizer_sharding"] = to_string(p.optimizer_sharding);
  j["recompute"] = to_string(p.recompute);
  if (p.recompute_layers > 0) j["recompute_layers"] = p.recompute_layers;
  if (p.distribute_saved_activations) j["distribute_saved_activations"] = true;
  j["offload"] = {{"optimizer", p.offload.optimizer}, {"activations", p.offload.activations}};
  j["linear_ce"] = p.linear_ce;
  if (p.hybrid_cp) j["hybrid_cp"] = true;
  if (p.mtp_layers >= 0) j["mtp_layers"] = p.mtp_layers;
  j["moe"] = {{"ep_chunks", p.moe.ep_chunks}, {"routing_imbalance", p.moe.routing_imbalance},
              {"capacity_factor", p.moe.capacity_factor}};
  if (p.moe.a2a_overlap) j["moe"]["a2a_overlap"] = true;
  if (p.moe.dispatcher != MoeDispatcher::AllToAll) j["moe"]["dispatcher"] = to_string(p.moe.dispatcher);
  write_run_settings(p, j);
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

void resolve_plan_paths(Plan& p, const std::string& dir) {
  p.model = resolved_from(p.model, dir);
  p.hardware = resolved_from(p.hardware, dir);
}

Plan load_plan_file(const std::string& path) {
  Plan p = plan_from_json(read_json_file(path, "plan file"));
  resolve_plan_paths(p, std::filesystem::path(path).parent_path().string());
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
