// lcplan-exec: run a plan on CPUs or GPUs (--backend cuda, executor/executor_cuda.h) under mpirun, every parallel
// dimension on both, and write the measurement record
// (executor/README.md).
//   mpirun -np <gpus> lcplan-exec --plan recipe.json [--steps N] [--layers N] [--scale K] [--backend cpu|cuda]
//                                 [--seed S] [--timeout SECONDS] [--phase-trace trace.json] [--cupti]
//                                 --out measured.json
//   lcplan-exec --help              the usage (Options::print_usage), exit 0
// Bad input: one sentence on every rank, exit 2, no output file. A rank that fails mid-step: every rank prints one
// sentence (the failing rank its error, the others "rank R failed: ..."), exit 1, no output file; waits on peers
// are bounded by --timeout (comm::Watchdog), so the job never hangs.
#include <mpi.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/data_dir.h"
#include "common/json_file.h"
#include "common/user_error.h"
#include "estimator/calibration.h"
#include "estimator/hardware.h"
#include "executor/executor.h"
#include "executor/record.h"
#include "executor/scale.h"
#include "executor/tracking_allocator.h"
#include "kernels/comm/comm.h"
#include "models/zoo.h"
#ifdef LCPLAN_EXEC_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "executor/executor_cuda.h"
#include "kernels/common/cuda_check.h"
#include "profiler/activity.h"
#include "profiler/cupti_tracer.h"
#include "profiler/fit.h"
#endif

namespace {

using lcplan::UserError;

const char* kUsage =
    "lcplan-exec --plan recipe.json --out measured.json [--steps N] [--layers N] [--scale K] [--backend cpu|cuda] "
    "[--seed S] [--timeout SECONDS] [--phase-trace trace.json] [--cupti]";

long long to_int(const std::string& flag, const std::string& v, long long lo, long long hi) {
  size_t used = 0;
  long long x = 0;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty() || x < lo || x > hi)
    throw UserError(flag + " " + v + " is not an integer from " + std::to_string(lo) + " to " + std::to_string(hi));
  return x;
}

// The command line (CUTLASS examples' Options: parse, then print_usage on --help).
struct Options {
  bool help = false;
  std::string plan, out, backend = "cpu", phase_trace;
  int steps = 1, layers = 0, scale = 1;
  unsigned long long seed = 1;
  double timeout = 600;
  bool cupti = false;

  // Reads argv; a bad or missing flag throws UserError naming it. --help only sets `help`.
  void parse(int argc, char** argv) {
    bool have_out = false;
    for (int i = 1; i < argc; ++i) {
      const std::string f = argv[i];
      if (f == "--help" || f == "-h") {
        help = true;
        return;
      }
      auto value = [&]() -> std::string {
        if (i + 1 >= argc || std::string(argv[i + 1]).rfind("--", 0) == 0)
          throw UserError(f + " needs a value (" + kUsage + ")");
        return argv[++i];
      };
      if (f == "--plan") plan = value();
      else if (f == "--out") {
        out = value();
        have_out = true;
      } else if (f == "--steps") steps = int(to_int(f, value(), 1, 1000000));
      else if (f == "--layers") layers = int(to_int(f, value(), 0, 100000));
      else if (f == "--scale") scale = int(to_int(f, value(), 1, 4096));
      else if (f == "--seed") seed = (unsigned long long)to_int(f, value(), 0, (1LL << 62));
      else if (f == "--timeout") timeout = double(to_int(f, value(), 1, 86400));
      else if (f == "--phase-trace") phase_trace = value();
      else if (f == "--cupti") cupti = true;
      else if (f == "--backend") {
        backend = value();
        if (backend != "cpu" && backend != "cuda")
          throw UserError("--backend " + backend + " is not a backend (valid: cpu, cuda)");
      } else {
        throw UserError("unknown argument \"" + f + "\" (" + kUsage + ")");
      }
    }
    check(have_out);
  }

  void print_usage(std::FILE* to) const {
    std::fprintf(to,
                 "usage: mpirun -np <plan gpus> %s\n"
                 "Runs training steps of a plan on CPUs (or GPUs) and writes its measurement record "
                 "(executor/README.md).\n"
                 "  --plan FILE          the plan (recipe JSON, lcplan search --out)\n"
                 "  --out FILE           the measurement record (lcplan validate --measured)\n"
                 "  --steps N            training steps (default 1)\n"
                 "  --scale K            divide widths, heads, experts and sequence by K (default 1)\n"
                 "  --layers N           the first N decoder layers of each kind (default 0: all)\n"
                 "  --backend cpu|cuda   where the step runs (default cpu)\n"
                 "  --seed S             weights and data (default 1)\n"
                 "  --timeout SECONDS    bound on every wait for a peer (default 600)\n"
                 "  --phase-trace FILE   each rank's phases as a Chrome trace\n"
                 "  --cupti              CUPTI device time per phase (with --backend cuda)\n"
                 "  --help               this text\n",
                 kUsage);
  }

 private:
  // The flags that need one another, after every flag is read.
  void check(bool have_out) const {
    if (plan.empty()) throw UserError(std::string("--plan is required (") + kUsage + ")");
    if (cupti && backend != "cuda")
      throw UserError("--cupti traces the GPU backend's kernels per phase; use it with --backend cuda (--backend is " +
                      backend + ")");
    if (!have_out) throw UserError(std::string("--out is required (") + kUsage + ")");
    if (!phase_trace.empty()) {
      std::error_code e1, e2;
      if (std::filesystem::weakly_canonical(phase_trace, e1) == std::filesystem::weakly_canonical(out, e2))
        throw UserError("--phase-trace " + phase_trace + " is the --out file; give the trace its own path");
    }
  }
};

#ifdef LCPLAN_EXEC_HAVE_CUDA
// --backend cuda on this rank: a device to run it on (the GPU backend runs whatever the CPU backend runs).
void check_cuda_backend() {
  if (!lcplan::gpu::device_available()) throw UserError("--backend cuda: no usable CUDA device on this rank");
}

// One device per rank (node-local rank modulo the node's devices), its stream, cuBLAS handle and NCCL world, for
// the length of the run.
// CUPTI's device time per phase (--cupti): each phase's launches carry the tag step * 16 + phase + 1 (the tracer's
// external correlation ids, profiler/activity.h time_by_tag); per phase, the median over the steps after the first
// of the slowest rank's busy time (union of its activities' intervals on every stream) and kernel time (the sum of
// its kernels' durations), as the record's other phase times.
uint64_t cupti_tag(int step, lcplan::Phase ph) { return uint64_t(step) * 16 + uint64_t(ph) + 1; }

nlohmann::json cupti_phases(const lcplan::comm::Comm& world, const lcplan::profiler::TaggedTime& t, int steps) {
  const int first = steps > 1 ? 2 : 1;
  const int n = (steps - first + 1) * lcplan::exec::kPhases;
  std::vector<double> busy(size_t(2 * n), 0.0);  // [busy | kernel] per (step, phase)
  for (int st = first; st <= steps; ++st)
    for (int ph = 0; ph < lcplan::exec::kPhases; ++ph) {
      const lcplan::profiler::TagTime x = t.of(cupti_tag(st, lcplan::Phase(ph)));
      const size_t i = size_t((st - first) * lcplan::exec::kPhases + ph);
      busy[i] = x.busy_seconds;
      busy[size_t(n) + i] = x.kernel_seconds;
    }
  lcplan::comm::all_reduce(world, busy.data(), busy.size(), lcplan::comm::DType::F64, lcplan::comm::ReduceOp::Max);
  double counts[3] = {double(t.untagged), double(t.conflicting), double(t.dropped)};
  lcplan::comm::all_reduce(world, counts, 3, lcplan::comm::DType::F64, lcplan::comm::ReduceOp::Sum);
  nlohmann::json j, b, k;
  for (int ph = 0; ph < lcplan::exec::kPhases; ++ph) {
    std::vector<double> vb, vk;
    for (int st = first; st <= steps; ++st) {
      const size_t i = size_t((st - first) * lcplan::exec::kPhases + ph);
      vb.push_back(busy[i]);
      vk.push_back(busy[size_t(n) + i]);
    }
    const char* name = lcplan::to_string(lcplan::Phase(ph));
    b[name] = lcplan::profiler::median(vb);  // the record's median (mean of the middle two)
    k[name] = lcplan::profiler::median(vk);
  }
  j["busy_seconds"] = b;
  j["kernel_seconds"] = k;
  j["untagged_activities"] = counts[0];
  j["conflicting_activities"] = counts[1];
  j["dropped_records"] = counts[2];  // non-zero: the times above under-count
  return j;
}

lcplan::exec::ExecResult run_cuda(const lcplan::comm::Comm& world, const lcplan::exec::ScaledCase& sc,
                                  lcplan::exec::ExecOptions o, bool cupti, nlohmann::json* cupti_out) {
  MPI_Comm node;
  MPI_CHECK(MPI_Comm_split_type(world.mpi, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int local = 0, devices = 0;
  MPI_CHECK(MPI_Comm_rank(node, &local));
  MPI_CHECK(MPI_Comm_free(&node));
  CUDA_CHECK(cudaGetDeviceCount(&devices));
  CUDA_CHECK(cudaSetDevice(local % devices));
  struct Session {
    cudaStream_t stream = nullptr;
    cublasHandle_t blas = nullptr;
    lcplan::comm::Comm nccl;
    ~Session() {
      if (nccl.nccl) lcplan::comm::free_comm(nccl);
      if (blas) CUBLAS_LOG(cublasDestroy(blas));
      if (stream) CUDA_LOG(cudaStreamDestroy(stream));
    }
  } s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  CUBLAS_CHECK(cublasCreate(&s.blas));
  CUBLAS_CHECK(cublasSetStream(s.blas, s.stream));
  s.nccl = lcplan::comm::world_nccl(s.stream);
  if (!cupti) return lcplan::exec::cuda::run_executor(world, s.nccl, s.stream, s.blas, sc.model, sc.plan, o);
  lcplan::profiler::CuptiTracer tracer(size_t(32) << 20, lcplan::profiler::Tags::On);
  const auto before = o.on_phase;
  o.on_phase = [&tracer, before](const lcplan::exec::PhaseMark& m) {
    if (before) before(m);
    if (m.begin) {
      tracer.push_tag(cupti_tag(m.step, m.phase));
    } else {
      tracer.pop_tag();
    }
  };
  lcplan::exec::ExecResult r = lcplan::exec::cuda::run_executor(world, s.nccl, s.stream, s.blas, sc.model, sc.plan, o);
  CUDA_CHECK(cudaDeviceSynchronize());  // every traced activity finished before CUPTI hands its buffers over
  *cupti_out = cupti_phases(world, lcplan::profiler::time_by_tag(tracer.take()), int(r.loss.size()));
  return r;
}
#else
void check_cuda_backend() {
  throw UserError("--backend cuda: this lcplan-exec was built without CUDA (no nvcc when it was configured); use "
                  "--backend cpu");
}
lcplan::exec::ExecResult run_cuda(const lcplan::comm::Comm&, const lcplan::exec::ScaledCase&, lcplan::exec::ExecOptions,
                                  bool, nlohmann::json*) {
  throw std::logic_error("run_cuda without CUDA (check_cuda_backend refuses first)");
}
#endif

// Rank 0's files: the phase trace (--phase-trace), then the measurement record; a record on disk means the whole run
// succeeded.
void write_outputs(const Options& a, const lcplan::exec::ScaledCase& sc, const lcplan::exec::ExecOptions& o,
                   const lcplan::exec::ExecResult& r, const nlohmann::json& cupti) {
  lcplan::Measurement m = lcplan::exec::measurement_record(sc, o, r, lcplan::exec::host_description());
  if (!cupti.is_null()) m.executor["cupti_phases"] = cupti;
  if (!a.phase_trace.empty()) {
    std::vector<int> stages;
    size_t n = 0;
    for (const lcplan::exec::RankReport& rr : r.ranks) stages.push_back(rr.stage);
    for (const auto& s : r.segments) n += s.size();
    lcplan::write_file_atomic(a.phase_trace, lcplan::exec::phase_trace_json(r.segments, stages).dump() + "\n");
    std::printf("lcplan-exec: phase trace of %zu segments on %zu ranks (chrome://tracing, ui.perfetto.dev); "
                "wrote %s\n", n, r.segments.size(), a.phase_trace.c_str());
  }
  // A measurements file of one record: `lcplan calibrate --measurements` and `lcplan validate` read it as is.
  lcplan::write_file_atomic(a.out, nlohmann::json::array({lcplan::measurement_to_json(m)}).dump(2) + "\n");
  std::printf("lcplan-exec: %s: loss %.6f, grad norm %.6g, step %.3f s, peak %.1f MiB (rank %d, %s); wrote %s\n",
              m.id.c_str(), *m.loss, *m.grad_norm, *m.step_seconds, *m.peak_bytes / 1048576.0, *m.peak_rank,
              lcplan::to_string(*m.peak_phase), a.out.c_str());
}

// LCPLAN_EXEC_FAIL=rank:phase (tests): that rank throws when that phase first begins (in the first step).
void fail_hook(lcplan::exec::ExecOptions& o, int rank) {
  const char* v = std::getenv("LCPLAN_EXEC_FAIL");
  if (!v || !*v) return;
  const std::string s = v;
  const size_t c = s.find(':');
  if (c == std::string::npos) throw UserError("LCPLAN_EXEC_FAIL=" + s + " must be rank:phase (e.g. 2:backward)");
  const int fail_rank = int(to_int("LCPLAN_EXEC_FAIL rank", s.substr(0, c), 0, 1 << 20));
  const std::string name = s.substr(c + 1);
  const lcplan::Phase phase = lcplan::phase_from_string(name, "LCPLAN_EXEC_FAIL phase");
  if (rank != fail_rank) return;
  o.on_phase = [phase, s](const lcplan::exec::PhaseMark& m) {
    if (m.begin && m.step == 1 && m.phase == phase)
      throw std::runtime_error("injected failure at the start of the " + std::string(lcplan::to_string(phase)) +
                               " phase (test hook LCPLAN_EXEC_FAIL=" + s + ")");
  };
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS) {
    std::fprintf(stderr, "lcplan-exec: error: MPI_Init failed (start it with mpirun or srun)\n");
    return 1;
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  lcplan::exec::retain_freed_host_memory();  // steps reuse heap pages (executor/tracking_allocator.h)
  lcplan::comm::Watchdog wd;
  MPI_Comm_dup(MPI_COMM_WORLD, &wd.notices);
  MPI_Comm_set_errhandler(wd.notices, MPI_ERRORS_RETURN);
  // A peer failed (or the timeout passed) inside a wait: report and leave from here, without unwinding the stack
  // (the wait's requests still point into its buffers).
  wd.on_failure = [&wd, rank](int, const std::string& message) {
    std::fprintf(stderr, "lcplan-exec: error (rank %d): %s\n", rank, message.c_str());
    std::fflush(stderr);
    std::vector<MPI_Request> none;
    lcplan::comm::finish_after_failure(wd, none, 10.0);
    std::_Exit(1);
  };
  lcplan::comm::Comm world;
  bool running = false;  // past the checks: a failure now may leave peers waiting on this rank
  try {
    world = lcplan::comm::world_mpi();
    world.watchdog = &wd;
    Options a;
    lcplan::exec::ScaledCase sc;
    lcplan::exec::ExecOptions o;
    std::string err;
    try {
      a.parse(argc, argv);
    } catch (const std::exception& e) {
      err = e.what();
    }
    lcplan::comm::raise_if_any(world, err);
    if (a.help) {  // every rank read the same argv
      if (world.rank == 0) a.print_usage(stdout);
      lcplan::comm::free_comm(world);
      MPI_Comm_free(&wd.notices);
      MPI_Finalize();
      return 0;
    }
    try {  // every rank checks its input; one verdict for all (a file one rank cannot read must not strand the rest)
      wd.timeout_seconds = a.timeout;
      const std::string dir = lcplan::data_dir();
      const lcplan::Plan plan = lcplan::load_plan_file(a.plan);
      const lcplan::ModelSpec model = lcplan::load_model(plan.model, dir);
      if (const std::string e = lcplan::exec::executor_support_error(model, plan); !e.empty()) throw UserError(e);
      sc = lcplan::exec::executor_case(model, plan, {a.scale, a.layers});
      // What runs must split over the plan's ranks too (vocabulary and widths over tp after scaling).
      if (const std::string e = lcplan::exec::executor_support_error(sc.model, sc.plan); !e.empty()) throw UserError(e);
      if (a.backend == "cuda") check_cuda_backend();
      // The executor's own implementation constants (its workspace reservation, its linear-CE tile).
      const lcplan::Calibration cal = lcplan::calibration_for(lcplan::load_calibration("default", dir),
                                                              lcplan::load_hardware(plan.hardware, dir), "lcplan-exec");
      sc.plan.implementation = "lcplan-exec";
      o.steps = a.steps;
      o.seed = a.seed;
      o.workspace_reserve = cal.workspace_bytes;
      o.ce_vocab_tile = std::max<int64_t>(1, int64_t(cal.linear_ce_vocab_tile / 2));  // fp32 tile = the bf16 bytes
      o.gather_segments = !a.phase_trace.empty();
      fail_hook(o, world.rank);
    } catch (const std::exception& e) {
      err = e.what();
    }
    lcplan::comm::raise_if_any(world, err);
    running = true;
    nlohmann::json cupti;
    const lcplan::exec::ExecResult r = a.backend == "cuda" ? run_cuda(world, sc, o, a.cupti, &cupti)
                                                           : lcplan::exec::run_executor(world, sc.model, sc.plan, o);
    if (world.rank == 0) write_outputs(a, sc, o, r, cupti);
    lcplan::comm::free_comm(world);
    MPI_Comm_free(&wd.notices);
    MPI_Finalize();
    return 0;
  } catch (const lcplan::comm::PeerFailure& e) {
    std::fprintf(stderr, "lcplan-exec: error (rank %d): %s\n", rank, e.what());
    std::fflush(stderr);
    std::vector<MPI_Request> none;
    lcplan::comm::finish_after_failure(wd, none, 10.0);
    std::_Exit(1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lcplan-exec: error (rank %d): %s\n", rank, e.what());
    std::fflush(stderr);
    if (!running || dynamic_cast<const UserError*>(&e) || dynamic_cast<const std::invalid_argument*>(&e)) {
      // The same sentence on every rank before any step communication: a clean exit.
      if (!running) {
        MPI_Finalize();
        return 2;
      }
    }
    std::vector<MPI_Request> sent = lcplan::comm::send_failure_notice(wd, e.what());
    lcplan::comm::finish_after_failure(wd, sent, 10.0);
    std::_Exit(running && dynamic_cast<const UserError*>(&e) ? 2 : 1);
  }
}
