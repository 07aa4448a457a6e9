// lcplan-exec's own overhead per step against the kernels' time (Google Benchmark, one rank):
//   BM_TrackerAddSub     one charge and release of the tracking allocator
//   BM_TrackedBuffer     a 64 KiB Buf (tracked, zeroed) vs BM_RawBuffer the same without tracking
//   BM_GroupSetup        process groups of a one-rank layout (every group kind split from the world) and their free
//   BM_Step              one training step of the scaled Qwen3.5-35B-A3B (scale 64, one layer per kind, 16K tokens
//                        before scaling = 256 tokens, FSDP, full recompute, linear CE, 2 EP chunks); counters: the
//                        tracker operations of the step and their cost at BM_TrackerAddSub's rate, as a share of the step
// and the executor's own rates on this machine where they differ from the kernels `lcplan profile` measures (the
// provenance of the lcplan-exec time overrides in data/calibration/cpu-measured.json):
//   BM_Matmul, BM_MatmulBackward  the executor's dense GEMM (fp64 accumulation, executor/ops.h) forward and backward
//                        (dgrad + wgrad) at the time test's shapes [tokens, in, out]; counter flops (FLOP/s)
//   BM_EigenFp32         the fp32 Eigen GEMM the CPU profile's peak is, at the same shapes
//   BM_LinearCe          the loss kernel as lcplan-exec calls it (kernels/linear_ce fp32, 512-column tiles over all
//                        tokens) [tokens, hidden, vocab], forward + backward; counter flops: the time model's 3 LM-head
//                        GEMMs per second
//   BM_ExpertGemm        one local expert's fc1 + fc2 as the CPU MoE layer runs them [tokens, hidden, expert ffn]
//   BM_OptimizerStep     the optimizer phase's own work on one rank (gradient sync with no peer, gradient norm, Adam)
//                        for the time test's dense model; counter seconds_per_param
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <Eigen/Core>
#include <memory>
#include <vector>

#include "executor/exec_model.h"
#include "executor/executor.h"
#include "executor/ops.h"
#include "executor/param_store.h"
#include "executor/scale.h"
#include "executor/tracking_allocator.h"
#include "kernels/comm/groups.h"
#include "kernels/linear_ce/linear_ce.h"
#include "kernels/moe/cpu_gemm.h"
#include "models/zoo.h"

namespace {

using namespace lcplan;
using namespace lcplan::exec;

double g_ns_per_op = 0;  // measured by BM_TrackerAddSub, used by BM_Step's overhead counter

void BM_TrackerAddSub(benchmark::State& s) {
  Tracker t(1 << 20);
  t.set_phase(Phase::Forward);
  for (auto _ : s) {
    t.add(Category::Activations, 4096);
    t.sub(Category::Activations, 4096);
  }
  benchmark::DoNotOptimize(t.now());
  s.SetItemsProcessed(s.iterations() * 2);
}
BENCHMARK(BM_TrackerAddSub);

void BM_TrackedBuffer(benchmark::State& s) {
  Tracker t(0);
  t.set_phase(Phase::Forward);
  for (auto _ : s) {
    Buf<float> b(t, Category::Workspace, 16384);
    benchmark::DoNotOptimize(b.data());
  }
}
BENCHMARK(BM_TrackedBuffer);

void BM_RawBuffer(benchmark::State& s) {
  for (auto _ : s) {
    std::unique_ptr<float[]> b(new float[16384]());
    benchmark::DoNotOptimize(b.get());
  }
}
BENCHMARK(BM_RawBuffer);

void BM_GroupSetup(benchmark::State& s) {
  comm::Comm world = comm::world_mpi();
  const RankLayout l = make_rank_layout(world.size, 1, 1, 1, 1, 1);
  for (auto _ : s) {
    comm::ProcessGroups pg = comm::make_process_groups(world, l);
    comm::free_groups(pg);
  }
  comm::free_comm(world);
}
BENCHMARK(BM_GroupSetup)->Iterations(50)->Unit(benchmark::kMillisecond);

void BM_Step(benchmark::State& s) {
  comm::Comm world = comm::world_mpi();
  const ModelSpec full = load_model("qwen3.5-35b-a3b", LCPLAN_SOURCE_DIR);
  Plan p;
  p.model = "qwen3.5-35b-a3b";
  p.gpus = world.size;
  p.seq_len = 16384;
  p.optimizer_sharding = OptimizerSharding::Fsdp;
  p.recompute = Recompute::Full;
  p.linear_ce = true;
  p.moe.ep_chunks = 2;
  const ScaledCase sc = executor_case(full, p, {64, 1});
  ExecOptions o;
  o.workspace_reserve = 1 << 24;
  double ops = 0, step = 0, setup = 0;
  for (auto _ : s) {
    const ExecResult r = run_executor(world, sc.model, sc.plan, o);
    ops = r.ranks[0].tracker_ops;
    step = r.step_seconds[0];
    setup = r.setup_seconds;
  }
  s.counters["tracker_ops"] = ops;
  s.counters["setup_ms"] = setup * 1e3;
  s.counters["tracking_us"] = ops * g_ns_per_op * 1e-3;
  s.counters["tracking_share"] = step > 0 ? ops * g_ns_per_op * 1e-9 / step : 0;
  comm::free_comm(world);
}
BENCHMARK(BM_Step)->Iterations(3)->Unit(benchmark::kMillisecond);

// Deterministic operands in [-1, 1) (the values do not change the work; no denormals).
std::vector<float> operand(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float((seed = seed * 1664525u + 1013904223u) >> 8) / float(1 << 23) - 1.0f;
  return v;
}
std::vector<bf16> operand_bf16(size_t n, uint32_t seed) {
  const std::vector<float> f = operand(n, seed);
  std::vector<bf16> b(n);
  to_bf16(f.data(), b.data(), n);
  return b;
}

// The dense projections of the time test's models at scale 16 and 1024 tokens per rank: qkv, attention output, MLP
// up (gate | up) and down.
void gemm_shapes(benchmark::internal::Benchmark* b) {
  for (auto a : {std::vector<int64_t>{1024, 256, 384}, {1024, 256, 256}, {1024, 256, 1792}, {1024, 896, 256}})
    b->Args(a);
  b->Unit(benchmark::kMillisecond);
}

void BM_Matmul(benchmark::State& s) {
  const int64_t T = s.range(0), K = s.range(1), N = s.range(2);
  Tracker t(0);
  t.set_phase(Phase::Forward);
  const std::vector<float> x = operand(size_t(T * K), 1);
  const std::vector<bf16> W = operand_bf16(size_t(K * N), 2);
  std::vector<float> y(size_t(T * N));
  for (auto _ : s) {
    matmul(t, x.data(), W.data(), y.data(), T, K, N);
    benchmark::DoNotOptimize(y.data());
  }
  s.counters["flops"] = benchmark::Counter(2.0 * T * K * N, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Matmul)->Apply(gemm_shapes);

void BM_MatmulBackward(benchmark::State& s) {
  const int64_t T = s.range(0), K = s.range(1), N = s.range(2);
  Tracker t(0);
  t.set_phase(Phase::Backward);
  const std::vector<float> x = operand(size_t(T * K), 1), dy = operand(size_t(T * N), 3);
  const std::vector<bf16> W = operand_bf16(size_t(K * N), 2);
  std::vector<float> dx(size_t(T * K)), dW(size_t(K * N));
  for (auto _ : s) {
    matmul_bwd(t, x.data(), W.data(), dy.data(), dx.data(), dW.data(), T, K, N);
    benchmark::DoNotOptimize(dW.data());
  }
  s.counters["flops"] = benchmark::Counter(4.0 * T * K * N, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_MatmulBackward)->Apply(gemm_shapes);

void BM_EigenFp32(benchmark::State& s) {
  const int64_t T = s.range(0), K = s.range(1), N = s.range(2);
  using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const std::vector<float> xv = operand(size_t(T * K), 1), wv = operand(size_t(K * N), 2);
  const Mat x = Eigen::Map<const Mat>(xv.data(), T, K), W = Eigen::Map<const Mat>(wv.data(), K, N);
  Mat y(T, N);
  for (auto _ : s) {
    y.noalias() = x * W;
    benchmark::DoNotOptimize(y.data());
  }
  s.counters["flops"] = benchmark::Counter(2.0 * T * K * N, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_EigenFp32)->Apply(gemm_shapes);

// The time test's loss shapes (tokens per rank, hidden, vocabulary at scale 16).
void BM_LinearCe(benchmark::State& s) {
  const int64_t T = s.range(0), H = s.range(1), V = s.range(2);
  const std::vector<float> h = operand(size_t(T * H), 4), W = operand(size_t(V * H), 5);
  std::vector<int64_t> targets(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) targets[size_t(i)] = (i * 7919) % V;
  linear_ce::Problem p;
  p.tokens = T;
  p.hidden = H;
  p.vocab = V;
  linear_ce::Options o;
  o.reduction = linear_ce::Reduction::Sum;
  o.vocab_tile = std::min<int64_t>(512, V);  // lcplan-exec's tile (half the profile's memory.linear_ce_vocab_tile)
  o.token_tile = T;
  std::vector<float> lse(static_cast<size_t>(T)), dh(static_cast<size_t>(T * H)), dW(static_cast<size_t>(V * H));
  const float one = 1.0f;
  float loss = 0;
  for (auto _ : s) {
    linear_ce::forward_cpu(p, linear_ce::DType::F32, h.data(), W.data(), targets.data(), &loss, lse.data(), o);
    linear_ce::backward_cpu(p, linear_ce::DType::F32, h.data(), W.data(), targets.data(), lse.data(), &one, dh.data(),
                            dW.data(), o);
    benchmark::DoNotOptimize(dW.data());
  }
  s.counters["flops"] = benchmark::Counter(6.0 * T * H * V, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_LinearCe)->Args({1024, 256, 8016})->Args({1024, 256, 2000})->Args({1024, 128, 15512})
    ->Unit(benchmark::kMillisecond);

// One local expert's fc1 and fc2 forward as the CPU MoE layer runs them for lcplan-exec (kernels/moe/cpu_gemm.h
// gemm_rows, a progress poll every 64 rows) [tokens, hidden, expert ffn]; counter flops.
void BM_ExpertGemm(benchmark::State& s) {
  const int64_t T = s.range(0);
  const int H = int(s.range(1)), F = int(s.range(2));
  const std::vector<float> x = operand(size_t(T * H), 6), w1 = operand(size_t(H) * 2 * F, 7),
                           w2 = operand(size_t(F) * H, 8);
  std::vector<float> h1(size_t(T) * 2 * F), act(size_t(T) * F, 0.5f), y(size_t(T * H));
  for (auto _ : s) {
    moe::cpu::gemm_rows(x.data(), w1.data(), h1.data(), T, H, 2 * F, [] {}, 64);
    moe::cpu::gemm_rows(act.data(), w2.data(), y.data(), T, F, H, [] {}, 64);
    benchmark::DoNotOptimize(y.data());
  }
  s.counters["flops"] = benchmark::Counter(6.0 * T * H * F, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_ExpertGemm)->Args({512, 256, 896})->Args({512, 128, 32})->Args({128, 512, 256})
    ->Unit(benchmark::kMillisecond);

void BM_OptimizerStep(benchmark::State& s) {
  comm::Comm world = comm::world_mpi();
  {
    const ModelSpec full = load_model("llama-3.1-8b", LCPLAN_SOURCE_DIR);
    Plan p;
    p.model = "llama-3.1-8b";
    p.gpus = 1;
    p.seq_len = 16384;
    const ScaledCase sc = executor_case(full, p, {16, 2});
    const comm::ProcessGroups pg = comm::make_process_groups(world, make_rank_layout(1, 1, 1, 1, 1, 1));
    Tracker t(0);
    t.set_phase(Phase::Optimizer);
    ParamStore ps(t, pg, model_units(sc.model, make_dims(sc.model)), OptimizerSharding::None, 1);
    int step = 0;
    for (auto _ : s) {
      ps.sync_grads();
      benchmark::DoNotOptimize(ps.grad_sq_owned());
      ps.adam_step(++step, AdamOptions{});
    }
    s.counters["params"] = ps.local_param_elems();
    // Parameters per CPU second, inverted: CPU seconds per parameter (shown in s; x 1e9 for ns).
    s.counters["seconds_per_param"] =
        benchmark::Counter(ps.local_param_elems(),
                           benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
    comm::ProcessGroups g = pg;
    comm::free_groups(g);
  }
  comm::free_comm(world);
}
BENCHMARK(BM_OptimizerStep)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {  // the tracker's cost per operation, for BM_Step's overhead counter
    Tracker t(0);
    t.set_phase(Phase::Forward);
    const int n = 2000000;
    const double t0 = MPI_Wtime();
    for (int i = 0; i < n; ++i) {
      t.add(Category::Activations, 64);
      t.sub(Category::Activations, 64);
    }
    g_ns_per_op = (MPI_Wtime() - t0) / (2.0 * n) * 1e9;
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  MPI_Finalize();
  return 0;
}
