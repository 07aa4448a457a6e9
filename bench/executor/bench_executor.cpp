// lcplan-exec's own overhead per step against the kernels' time (Google Benchmark, one rank):
//   BM_TrackerAddSub     one charge and release of the tracking allocator
//   BM_TrackedBuffer     a 64 KiB Buf (tracked, zeroed) vs BM_RawBuffer the same without tracking
//   BM_GroupSetup        process groups of a one-rank layout (every group kind split from the world) and their free
//   BM_Step              one training step of the scaled Qwen3.5-35B-A3B (scale 64, one layer per kind, 16K tokens
//                        before scaling = 256 tokens, FSDP, full recompute, linear CE, 2 EP chunks); counters: the
//                        tracker operations of the step and their cost at BM_TrackerAddSub's rate, as a share of the step
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <memory>

#include "executor/executor.h"
#include "executor/scale.h"
#include "executor/tracking_allocator.h"
#include "kernels/comm/groups.h"
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
