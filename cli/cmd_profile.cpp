// lcplan profile: measure the real kernels and collectives on this machine and write the calibration profile the
// estimator uses (profiler/README.md defines every case). Runs on one rank or under mpirun; only rank 0 writes, after
// every rank finished, and every rank exits with the same status.
#include <mpi.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/plan_flags.h"
#include "common/data_dir.h"
#include "common/json_file.h"
#include "common/user_error.h"
#include "estimator/calibration.h"
#include "estimator/derived_plan.h"
#include "estimator/hardware.h"
#include "estimator/plan_rules.h"
#include "kernels/comm/comm.h"
#include "models/zoo.h"
#include "profiler/driver.h"
#include "profiler/machine.h"

namespace lcplan {

namespace {

using namespace profiler;

struct ProfileArgs {
  std::string plan, backend, hardware, hardware_out, out, calibration = "default", cases;
  bool quick = false;
  std::string repeat, warmup, max_call_gflop;
  std::string min_bytes, max_bytes, step_factor;
  std::string gemm_tokens, gemm_shapes, expert_tokens, experts, expert_hidden, expert_ffn;
  std::string attention_seqs, attention_heads, head_dim, linear_attention_seqs;
  std::string ce_tokens, ce_hidden, ce_vocab, ce_tiles, moe_tokens, moe_chunks;
};

// "4096", "4k", "64M", "1G" (k = 1024): a positive whole number.
int64_t parse_count(const std::string& text, const std::string& flag, const std::string& valid) {
  const std::string bad = flag + " \"" + text + "\" is not " + valid;
  if (text.empty() || text.size() > 24) throw UserError(bad);
  double mult = 1;
  std::string num = text;
  const char last = char(std::tolower(static_cast<unsigned char>(num.back())));
  if (last == 'k' || last == 'm' || last == 'g') {
    mult = last == 'k' ? 1024.0 : last == 'm' ? 1048576.0 : 1073741824.0;
    num.pop_back();
  }
  const std::optional<double> n = finite_number(num);
  const double v = n.value_or(0) * mult;
  if (!n || !std::isfinite(v) || v < 1 || v > 1e15 || v != std::floor(v)) throw UserError(bad);
  return int64_t(v);
}

std::vector<int64_t> parse_counts(const std::string& text, const std::string& flag, const std::string& valid) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(parse_count(item, flag, valid));
  if (out.empty() || text.back() == ',') throw UserError(flag + " \"" + text + "\" is not " + valid);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// The GPU's hardware profile from its name (cudaGetDeviceProperties), "" when unknown.
std::string hardware_for_device(const std::string& description) {
  const std::pair<const char*, const char*> known[] = {{"GB300", "gb300-nvl72"}, {"GB200", "gb200-nvl72"},
                                                       {"B300", "b300"},         {"B200", "b200"},
                                                       {"H200", "h200"},         {"H800", "h800"},
                                                       {"H100", "h100-sxm-80gb"}, {"A100", "a100-sxm-80gb"}};
  for (const auto& [needle, name] : known)
    if (description.find(needle) != std::string::npos) return name;
  return "";
}

// An output path must name a file in an existing directory (checked before the long run; write_file_atomic
// re-checks everything when it writes).
void check_output_path(const std::string& path, const char* flag) {
  namespace fs = std::filesystem;
  if (path.empty()) throw UserError(std::string(flag) + " needs a non-empty file path");
  std::error_code ec;
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec))
    throw UserError(std::string(flag) + " \"" + path + "\" is in directory \"" + dir.string() +
                    "\", which does not exist (create it first)");
  if (fs::exists(p, ec) && !fs::is_regular_file(p, ec))
    throw UserError(std::string(flag) + " \"" + path + "\" exists and is not a regular file (give a file path)");
}

struct Setup {
  Targets targets;
  std::vector<std::string> cases;
  std::string backend;
  RepeatOptions repeat;
  nlohmann::json start_json;
  Calibration start;
  bool have_hardware = false;
  Hardware hardware;  // when --hardware (or the GPU's own) is known before the run
};

// Everything that can be wrong with the input, checked identically on every rank before any measurement.
Setup prepare(const ProfileArgs& a, const comm::Comm& world, int ranks_per_node) {
  Setup s;
  const std::string dir = data_dir();
  if (a.backend.empty()) s.backend = cuda_unavailable_reason().empty() ? "cuda" : "cpu";
  else if (a.backend == "cpu" || a.backend == "cuda") s.backend = a.backend;
  else throw UserError("--backend \"" + a.backend + "\" is not a backend (valid: cpu, cuda)");
  if (s.backend == "cuda")
    if (const std::string why = cuda_unavailable_reason(); !why.empty())
      throw UserError("--backend cuda cannot run here: " + why + " (use --backend cpu)");
  check_output_path(a.out, "--out");
  if (!a.hardware_out.empty()) {
    check_output_path(a.hardware_out, "--hardware-out");
    if (a.hardware_out == a.out) throw UserError("--hardware-out and --out name the same file \"" + a.out + "\" (give two paths)");
    if (s.backend != "cpu")
      throw UserError("--hardware-out writes the measured hardware profile of a CPU machine; with --backend cuda the "
                      "efficiencies are relative to --hardware's datasheet peaks (leave --hardware-out out)");
    if (!a.hardware.empty())
      throw UserError("--hardware-out measures this machine's peaks and --hardware \"" + a.hardware +
                      "\" gives them; give one of the two");
  }
  s.start_json = read_json_file(
      a.calibration.find('/') != std::string::npos || a.calibration.ends_with(".json") ? a.calibration
                                                                                       : dir + "/data/calibration/" + a.calibration + ".json",
      "calibration file");
  s.start = load_calibration(a.calibration, dir);

  if (!a.hardware.empty()) {
    s.hardware = load_hardware(a.hardware, dir);
    s.have_hardware = true;
    if (s.backend == "cpu" && s.hardware.name.rfind("cpu-", 0) != 0)
      throw UserError("--hardware \"" + a.hardware + "\" is a GPU profile; the CPU backend measures this CPU (give a cpu-* "
                      "profile that lcplan profile wrote, or leave --hardware out and give --hardware-out)");
  } else if (s.backend == "cpu" && a.hardware_out.empty()) {
    throw UserError("the CPU backend measures this machine's peaks: give --hardware-out hw.json to write its hardware "
                    "profile (or --hardware cpu-NAME to reuse one)");
  }

  const bool quick = a.quick;
  if (!a.plan.empty()) {
    Plan p = load_plan_file(a.plan);
    const ModelSpec m = model_for_plan(load_model(p.model, dir), p);
    const Hardware plan_hw = load_hardware(p.hardware, dir);
    p.gpus_per_node = nvlink_domain_gpus(p, plan_hw);
    require_valid_plan(m, p);
    if (s.backend == "cpu" && p.precision != Precision::BF16)
      throw UserError(std::string("the plan's precision ") + to_string(p.precision) +
                      " cannot be profiled on the CPU backend (it times fp32 GEMMs and has no low-precision units; "
                      "use --backend cuda on a GPU, or a bf16 plan)");
    if (s.backend == "cuda" && (p.precision == Precision::MXFP8 || p.precision == Precision::NVFP4))
      throw UserError(std::string("the plan's precision ") + to_string(p.precision) +
                      " is not profiled (lcplan profile times bf16 and fp8 GEMMs; use a bf16 or fp8 plan)");
    const int node = std::min(p.gpus, p.gpus_per_node);
    if (world.size > p.gpus)
      throw UserError("the plan runs " + std::to_string(p.gpus) + " GPUs and " + std::to_string(world.size) +
                      " ranks were launched, more than it needs (launch 1 rank, or whole nodes of " + std::to_string(node) +
                      " ranks up to " + std::to_string(p.gpus) + ")");
    if (world.size != 1 && (world.size % node != 0 || ranks_per_node != node))
      throw UserError("the plan places " + std::to_string(node) + " GPUs on a node and " + std::to_string(world.size) +
                      " ranks were launched (" + std::to_string(ranks_per_node) + " on this node), fewer than a node " +
                      "needs or not whole nodes (launch 1 rank for the kernels alone, or mpirun -np " +
                      std::to_string(node) + " per node)");
    s.targets = plan_targets(m, p, plan_hw, s.backend, quick);
    s.targets.ce_vocab_tiles = {std::max<int64_t>(1, int64_t(s.start.linear_ce_vocab_tile))};
  } else {
    s.targets = default_targets(s.backend, quick);
  }

  Targets& t = s.targets;
  const std::string count = "a whole number or list (e.g. 256,1k,4k; k = 1024)";
  if (!a.gemm_tokens.empty()) t.gemm_tokens = parse_counts(a.gemm_tokens, "--gemm-tokens", count);
  if (!a.gemm_shapes.empty()) {
    t.gemm_classes.clear();
    std::stringstream in(a.gemm_shapes);
    std::string item;
    while (std::getline(in, item, ',')) {
      const size_t x = item.find('x');
      if (x == std::string::npos)
        throw UserError("--gemm-shapes \"" + a.gemm_shapes + "\" has entry \"" + item + "\" that is not NxK (e.g. 4096x4096)");
      const std::string v = "a list of NxK shapes (e.g. 4096x4096,8192x2048)";
      t.gemm_classes.push_back({item, parse_count(item.substr(0, x), "--gemm-shapes", v),
                                parse_count(item.substr(x + 1), "--gemm-shapes", v)});
    }
    if (t.gemm_classes.empty()) throw UserError("--gemm-shapes \"" + a.gemm_shapes + "\" names no shape (e.g. 4096x4096)");
  }
  if (!a.expert_tokens.empty()) t.grouped_tokens = parse_counts(a.expert_tokens, "--expert-tokens", count);
  if (!a.experts.empty()) t.grouped_experts = t.moe_local_experts = int(std::min<int64_t>(1 << 16, parse_count(a.experts, "--experts", "a whole number of local experts")));
  if (!a.expert_hidden.empty()) t.grouped_hidden = t.moe.hidden = int(parse_count(a.expert_hidden, "--expert-hidden", "a whole number"));
  if (!a.expert_ffn.empty()) t.grouped_ffn = t.moe.expert_ffn = int(parse_count(a.expert_ffn, "--expert-ffn", "a whole number"));
  if (!a.attention_seqs.empty()) t.attn_seqs = parse_counts(a.attention_seqs, "--attention-seqs", count);
  if (!a.attention_heads.empty()) {
    const size_t colon = a.attention_heads.find(':');
    const std::string v = "heads or heads:kv_heads with kv_heads dividing heads (e.g. 16:2)";
    t.attn_heads = parse_count(a.attention_heads.substr(0, colon), "--attention-heads", v);
    t.attn_kv_heads = colon == std::string::npos ? t.attn_heads : parse_count(a.attention_heads.substr(colon + 1), "--attention-heads", v);
    if (t.attn_heads % t.attn_kv_heads) throw UserError("--attention-heads \"" + a.attention_heads + "\" is not " + v);
  }
  if (!a.head_dim.empty()) t.attn_head_dim = parse_count(a.head_dim, "--head-dim", "a whole number (e.g. 128)");
  if (!a.linear_attention_seqs.empty()) t.la_seqs = parse_counts(a.linear_attention_seqs, "--linear-attention-seqs", count);
  if (!a.ce_tokens.empty()) t.ce_tokens = parse_counts(a.ce_tokens, "--ce-tokens", count);
  if (!a.ce_hidden.empty()) t.ce_hidden = parse_count(a.ce_hidden, "--ce-hidden", "a whole number");
  if (!a.ce_vocab.empty()) t.ce_vocab = parse_count(a.ce_vocab, "--ce-vocab", "a whole number");
  if (!a.ce_tiles.empty()) t.ce_vocab_tiles = parse_counts(a.ce_tiles, "--ce-tiles", count);
  if (!a.moe_tokens.empty()) t.moe_tokens = parse_counts(a.moe_tokens, "--moe-tokens", count);
  if (!a.moe_chunks.empty()) {
    t.moe_chunks.clear();
    for (int64_t k : parse_counts(a.moe_chunks, "--moe-chunks", "a list of chunk counts from 1 to 4 (e.g. 1,2)")) {
      if (k > 4) throw UserError("--moe-chunks \"" + a.moe_chunks + "\" is not a list of chunk counts from 1 to 4 (e.g. 1,2)");
      t.moe_chunks.push_back(int(k));
    }
  }
  const std::string bytes = "a size in bytes (e.g. 1k, 64M; k = 1024)";
  if (!a.min_bytes.empty()) t.min_bytes = double(parse_count(a.min_bytes, "--min-bytes", bytes));
  if (!a.max_bytes.empty()) t.max_bytes = double(parse_count(a.max_bytes, "--max-bytes", bytes));
  if (t.max_bytes < t.min_bytes)
    throw UserError("--max-bytes " + std::to_string(int64_t(t.max_bytes)) + " is below --min-bytes " +
                    std::to_string(int64_t(t.min_bytes)) + " (give max >= min)");
  if (!a.step_factor.empty()) t.step_factor = cli::parse_number(a.step_factor, "--step-factor", 1.0001, 1024, "a number above 1, e.g. 2");
  if (!a.max_call_gflop.empty()) {
    t.max_call_flops = 1e9 * cli::parse_number(a.max_call_gflop, "--max-call-gflop", 1e-6, 1e6, "a positive number of GFLOP, e.g. 0.5");
  } else if (s.backend == "cpu") {
    // Ranks sharing a node's cores each get their share of the budget, so the run takes the same wall time.
    const double share = std::min(1.0, double(cpu_machine().logical_cpus) / double(std::max(1, ranks_per_node)));
    t.max_call_flops *= share;
  }
  if (s.backend != "cpu" && a.max_call_gflop.empty()) t.max_call_flops = 0;
  if (s.backend == "cpu" && ranks_per_node > 1) {
    // The ranks of a node share its caches and memory: STREAM's rule (arrays of 4x the last-level cache) holds
    // for their copies together, so each rank copies its share (at least 16 MB).
    for (double& b : t.copy_bytes) b = std::max(16e6, b / ranks_per_node);
    t.copy_bytes.erase(std::unique(t.copy_bytes.begin(), t.copy_bytes.end()), t.copy_bytes.end());
  }
  if (!a.cases.empty()) s.cases = parse_cases(a.cases);
  if (!a.repeat.empty()) s.repeat.repeats = cli::parse_int_in(a.repeat, "--repeat", 1, 1000);
  else s.repeat.repeats = quick ? 3 : 5;
  if (!a.warmup.empty()) s.repeat.warmup = cli::parse_int_in(a.warmup, "--warmup", 0, 100);
  if (s.backend == "cpu" && s.cases.empty() == false && !a.hardware_out.empty()) {
    const bool gemm = std::find(s.cases.begin(), s.cases.end(), "gemm") != s.cases.end();
    const bool copy = std::find(s.cases.begin(), s.cases.end(), "copy") != s.cases.end();
    if (!gemm || !copy)
      throw UserError("--hardware-out needs the gemm and copy cases (the CPU's peak and memory bandwidth); add them to "
                      "--cases \"" + a.cases + "\"");
  }
  return s;
}

// MPI for the profile's lifetime: initialized here when not yet (a plain `lcplan profile` is a one-rank world),
// finalized on every exit path so mpirun sees a clean end.
struct MpiSession {
  bool owned = false;
  MpiSession() {
    int init = 0;
    MPI_Initialized(&init);
    if (!init) {
      int provided = 0;
      MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
      owned = true;
    }
  }
  ~MpiSession() {
    if (owned) MPI_Finalize();
  }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
};

int ranks_on_this_node(const comm::Comm& world) {
  MPI_Comm local;
  MPI_CHECK(MPI_Comm_split_type(world.mpi, MPI_COMM_TYPE_SHARED, world.rank, MPI_INFO_NULL, &local));
  int n = 1;
  MPI_CHECK(MPI_Comm_size(local, &n));
  MPI_CHECK(MPI_Comm_free(&local));
  return n;
}

// Returns "" or the error of the lowest failing rank, the same on every rank.
std::string agreed_error(const comm::Comm& world, const std::string& mine) {
  try {
    comm::raise_if_any(world, mine);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// Rank 0 prints the one sentence (as lcplan's main would), then every rank leaves together with status 2: a rank
// that exited first would make mpirun kill rank 0 before it printed.
int fail_everywhere(const comm::Comm& world, const std::string& err) {
  if (world.rank == 0) {
    std::fprintf(stderr, "lcplan: error: %s\n", err.c_str());
    std::fflush(stderr);
  }
  MPI_Barrier(world.mpi);
  return 2;
}

int run_profile_command(const ProfileArgs& a, const std::string& command_line) {
  MpiSession mpi;
  comm::Comm world = comm::world_mpi();
  // The provenance names the launch too: the rank count is part of what was measured.
  const std::string command = (world.size > 1 ? "mpirun -np " + std::to_string(world.size) + " " : "") + command_line;
  struct FreeWorld {
    comm::Comm& c;
    ~FreeWorld() {
      try {
        comm::free_comm(c);
      } catch (...) {
      }
    }
  } free_world{world};
  const bool root = world.rank == 0;
  const int per_node = ranks_on_this_node(world);
  Setup s;
  std::string err;
  try {
    s = prepare(a, world, per_node);
  } catch (const UserError& e) {
    err = e.what();
  }
  err = agreed_error(world, err);
  if (!err.empty()) return fail_everywhere(world, err);

  auto log = [&](const std::string& line) {
    if (root) std::printf("[profile] %s\n", line.c_str()), std::fflush(stdout);
  };
  std::unique_ptr<Device> dev;
  try {
    dev = s.backend == "cuda" ? make_cuda_device(world, s.repeat) : make_cpu_device(world, s.repeat);
  } catch (const UserError& e) {
    err = e.what();
  }
  err = agreed_error(world, err);
  if (!err.empty()) return fail_everywhere(world, err);
  if (s.backend == "cuda" && !s.have_hardware) {
    const std::string guess = hardware_for_device(dev->description());
    err = guess.empty() ? "this GPU (" + dev->description() + ") has no hardware profile lcplan knows; give --hardware NAME or a JSON path" : "";
    err = agreed_error(world, err);
    if (!err.empty()) return fail_everywhere(world, err);
    s.hardware = load_hardware(guess, data_dir());
    s.have_hardware = true;
  }
  log("backend " + s.backend + " on " + std::to_string(world.size) + " rank(s): " + dev->description());
  if (!s.targets.plan.empty()) log("plan: " + s.targets.plan);
  if (s.targets.max_call_flops > 0) log("CPU budget per timed call: " + gflop(s.targets.max_call_flops));

  const ProfileRun run = run_profile(*dev, world, s.targets, s.cases, log);
  dev.reset();

  // Rank 0 derives and writes; every rank learns whether that worked and exits alike.
  if (root) {
    try {
      const std::string date = utc_date();
      Hardware hw = s.hardware;
      nlohmann::json hw_json;
      if (!s.have_hardware) {
        const CpuMachine m = cpu_machine();
        CpuFacts f{cpu_profile_name(m), m.model, date, command, m.memory_bytes, run.ranks_per_node};
        try {
          hw_json = cpu_hardware_json(run.data, f);
        } catch (const std::invalid_argument& e) {
          throw UserError(std::string("no hardware profile can be written: ") + e.what());
        }
        hw = hardware_from_json(hw_json, f.name);
      }
      const Derived derived = derive_coefficients(run.data, hw, s.start);
      OutputFacts facts{run.device, date, command, a.calibration};
      nlohmann::json out = calibration_with_profile(s.start_json, hw, run, derived, s.targets, facts);
      out["name"] = std::filesystem::path(a.out).stem().string();  // a new profile, named like its file
      if (!hw_json.is_null()) write_file_atomic(a.hardware_out, hw_json.dump(2) + "\n");
      write_file_atomic(a.out, out.dump(2) + "\n");
      std::fputs(summary_table(derived, hw, run).c_str(), stdout);
      if (!hw_json.is_null()) std::printf("wrote %s (hardware %s)\n", a.hardware_out.c_str(), hw.name.c_str());
      std::printf("wrote %s (use: lcplan estimate --calibration %s --hardware %s ...)\n", a.out.c_str(), a.out.c_str(),
                  hw_json.is_null() ? hw.name.c_str() : a.hardware_out.c_str());
    } catch (const UserError& e) {
      err = e.what();
    }
  }
  err = agreed_error(world, err);
  if (!err.empty()) return fail_everywhere(world, err);
  return 0;
}

}  // namespace

void register_profile(CLI::App& app, int& exit_code, std::string command) {
  auto a = std::make_shared<ProfileArgs>();
  auto* cmd = app.add_subcommand(cli::kProfileCommand, cli::kProfileAbout);
  cmd->add_option("--out", a->out, "write the calibration profile here")->required();
  cmd->add_option("--plan", a->plan, "recipe.json: profile exactly the shapes this plan runs");
  cmd->add_option("--backend", a->backend, "cpu or cuda (default: cuda when a device is usable, else cpu)");
  cmd->add_option("--hardware", a->hardware,
                  "hardware profile the efficiencies are relative to (GPU default: the device's; CPU: a cpu-* profile)");
  cmd->add_option("--hardware-out", a->hardware_out, "CPU backend: write this machine's measured hardware profile here");
  cmd->add_option("--calibration", a->calibration, "starting profile copied into the output (default: default)");
  cmd->add_option("--cases", a->cases,
                  "comma list of cases (gemm, grouped_gemm, attention, linear_attention, linear_ce, moe_layer, "
                  "collectives, copy, launch; default: all)");
  cmd->add_flag("--quick", a->quick, "fewer sizes and repeats");
  cmd->add_option("--repeat", a->repeat, "timed repeats per point (median reported; default 5, quick 3)");
  cmd->add_option("--warmup", a->warmup, "untimed runs before the repeats (default 1)");
  cmd->add_option("--max-call-gflop", a->max_call_gflop,
                  "largest timed call in GFLOP (CPU default: 4, quick 2, shared among the ranks on a node); larger "
                  "shapes are shrunk, as the output's notes state");
  cmd->add_option("--min-bytes", a->min_bytes, "collectives: smallest message (e.g. 1k)");
  cmd->add_option("--max-bytes", a->max_bytes, "collectives: largest message (e.g. 64M)");
  cmd->add_option("--step-factor", a->step_factor, "collectives: size multiplier between points (e.g. 2)");
  cmd->add_option("--gemm-tokens", a->gemm_tokens, "gemm: token counts m (e.g. 64,256,1k)");
  cmd->add_option("--gemm-shapes", a->gemm_shapes, "gemm: NxK classes (e.g. 4096x4096,8192x2048)");
  cmd->add_option("--expert-tokens", a->expert_tokens, "grouped_gemm: tokens per local expert (e.g. 16,64,256)");
  cmd->add_option("--experts", a->experts, "grouped_gemm, moe_layer: local experts per rank");
  cmd->add_option("--expert-hidden", a->expert_hidden, "grouped_gemm, moe_layer: hidden size");
  cmd->add_option("--expert-ffn", a->expert_ffn, "grouped_gemm, moe_layer: expert intermediate size");
  cmd->add_option("--attention-seqs", a->attention_seqs, "attention: local sequence lengths (e.g. 1k,4k)");
  cmd->add_option("--attention-heads", a->attention_heads, "attention: heads or heads:kv_heads (e.g. 16:2)");
  cmd->add_option("--head-dim", a->head_dim, "attention: head dim");
  cmd->add_option("--linear-attention-seqs", a->linear_attention_seqs, "linear_attention: sequence lengths");
  cmd->add_option("--ce-tokens", a->ce_tokens, "linear_ce: token counts");
  cmd->add_option("--ce-hidden", a->ce_hidden, "linear_ce: hidden size");
  cmd->add_option("--ce-vocab", a->ce_vocab, "linear_ce: vocabulary (this rank's share)");
  cmd->add_option("--ce-tiles", a->ce_tiles, "linear_ce: vocabulary tile sizes");
  cmd->add_option("--moe-tokens", a->moe_tokens, "moe_layer: local tokens per rank");
  cmd->add_option("--moe-chunks", a->moe_chunks, "moe_layer: chunk counts (1 to 4)");
  cmd->callback([a, &exit_code, command]() { exit_code = run_profile_command(*a, command); });
}

}  // namespace lcplan
