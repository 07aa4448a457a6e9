// The device parameter store (executor/param_store_cuda.h) against the host store on 2 ranks: the same units and
// gradients, then the gradient sync, the owned gradient norm and two Adam steps, for each optimizer sharding on DP 2,
// TP 2 (the TP-replicated gradient sum) and EP 2 (the host half runs everywhere). Parameters must agree within one bf16 step (fp32 Adam on both; the
// device may fuse multiply-adds), the norms within 1e-9 relative (fp64 sums in another order). Every rank skips
// together without one usable device per rank; the refusal of MPI groups is checked before any CUDA call and runs
// everywhere.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "executor/param_store_cuda.h"
#include "tests/comm/gpu_ranks.h"
#include "tests/comm/mpi_env.h"
#include "tests/executor/exec_util.h"

LCPLAN_MPI_TEST_MAIN;

namespace lcplan::exec::tests {
namespace {

// A gradient that depends only on (rank, unit, index): both stores get the same inputs.
std::vector<float> gradient(int rank, int u, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float(std::sin(0.37 * double(i) + 1.3 * u + 0.7 * rank)) * 1e-2f;
  return v;
}

struct HostIo {
  Tracker& t;
  void put(const float* h, size_t n, float* p) const { std::copy(h, h + n, p); }
  std::vector<bf16> get(const bf16* p, size_t n) const { return std::vector<bf16>(p, p + n); }
  Buf<float> floats(size_t n) const { return Buf<float>(t, Category::Workspace, n); }
  Buf<bf16> halves(size_t n) const { return Buf<bf16>(t, Category::Workspace, n); }
};

struct DeviceIo {
  Tracker& t;
  cudaStream_t stream;
  void put(const float* h, size_t n, float* p) const {
    CUDA_CHECK(cudaMemcpyAsync(p, h, n * sizeof(float), cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  std::vector<bf16> get(const bf16* p, size_t n) const {
    std::vector<bf16> h(n);
    CUDA_CHECK(cudaMemcpyAsync(h.data(), p, n * sizeof(bf16), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return h;
  }
  cuda::DeviceBuf<float> floats(size_t n) const { return cuda::DeviceBuf<float>(t, Category::Workspace, n); }
  cuda::DeviceBuf<bf16> halves(size_t n) const { return cuda::DeviceBuf<bf16>(t, Category::Workspace, n); }
};

struct Snapshot {
  double grad_sq = 0;  // summed over the steps
  std::vector<std::vector<bf16>> params;  // per unit: the whole padded [dense | expert] array (gathered under FSDP)
};

// Every unit's parameters: the whole padded [dense | expert] array (gathered under FSDP).
template <class Store, class Io>
std::vector<std::vector<bf16>> params(Store& s, const Io& io) {
  std::vector<std::vector<bf16>> out;
  for (int u = 0; u < int(s.units().size()); ++u) {
    const size_t n = s.unit_buffer_elems(u);
    if (s.sharded_params()) {
      auto buf = io.halves(n);
      (void)s.gather(u, buf.data());
      out.push_back(io.get(buf.data(), n));
    } else {
      const size_t nd = s.dense_grad_size(u);
      std::vector<bf16> all = io.get(s.view(u).dense, nd);
      if (n > nd) {
        const std::vector<bf16> e = io.get(s.view(u).expert, n - nd);
        all.insert(all.end(), e.begin(), e.end());
      }
      out.push_back(std::move(all));
    }
  }
  return out;
}

// Two steps of: gradients in (through the FSDP unit buffer, or straight into the dense and expert arrays), sync,
// norm, Adam at lr 1e-2 (so an update moves a bf16 weight of size 0.02 by several steps); then the parameters.
template <class Store, class Io>
Snapshot run(Store& s, int rank, const Io& io) {
  Snapshot out;
  AdamOptions o;
  o.lr = 1e-2;
  for (int step = 1; step <= 2; ++step) {
    s.zero_grads();
    for (int u = 0; u < int(s.units().size()); ++u) {
      const size_t n = s.unit_buffer_elems(u);
      const std::vector<float> g = gradient(rank + step, u, n);
      if (s.sharded_params()) {
        auto buf = io.floats(n);
        const UnitGrad views = s.buffer_grad(u, buf.data());
        EXPECT_EQ(views.dense, buf.data());
        io.put(g.data(), n, buf.data());
        s.reduce_into_shard(u, buf.data());
      } else {
        const size_t nd = s.dense_grad_size(u);
        io.put(g.data(), nd, s.grad(u).dense);
        if (n > nd) io.put(g.data() + nd, n - nd, s.grad(u).expert);
      }
    }
    s.sync_grads();
    out.grad_sq += s.grad_sq_owned();
    s.adam_step(step, o);
  }
  out.params = params(s, io);
  return out;
}

struct Layout {
  const char* name;
  int tp, ep;
};

// Scaled for tp 2 and ep 2 on 2 ranks, so every layout below divides its heads, widths and experts.
ModelSpec model() {
  PlanArgs a;
  a.gpus = 2;
  a.tp = 2;
  a.ep = 2;
  return executor_case(zoo("qwen3.5-35b-a3b"), make_plan("qwen3.5-35b-a3b", a), {64, 1}).model;
}

TEST(DeviceParamStore, RefusesMpiGroups) {
  comm::Comm world = comm::world_mpi();
  {
    const comm::ProcessGroups pg = comm::make_process_groups(world, make_rank_layout(world.size, 1, 1, 1, 1, 1));
    const ModelSpec m = model();
    Tracker t(0);
    std::string msg;
    try {
      DeviceParamStore s(t, pg, model_units(m, make_dims(m)), OptimizerSharding::None, 1, cuda::DeviceMem{});
    } catch (const std::invalid_argument& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find("needs NCCL process groups"), std::string::npos) << msg;
    comm::ProcessGroups g = pg;
    comm::free_groups(g);
  }
  comm::free_comm(world);
}

const Layout kLayouts[] = {{"DP 2", 1, 1}, {"TP 2", 2, 1}, {"EP 2", 1, 2}};
const OptimizerSharding kModes[] = {OptimizerSharding::None, OptimizerSharding::DistOpt, OptimizerSharding::Fsdp};

std::vector<UnitLayout> units_of(const ModelSpec& m, const Layout& l, const comm::ProcessGroups& pg) {
  return model_units(m, make_dims(m, l.tp, pg.tp.rank), ModelShard{pg.ep.rank, l.ep, 0, 1});
}

// The host half, which runs everywhere: the step moves the parameters and the norm is positive (so the device
// comparison below compares a real update, not two untouched copies).
TEST(DeviceParamStore, HostReferenceStepMovesTheParameters) {
  comm::Comm mpi = comm::world_mpi();
  const ModelSpec m = model();
  for (const Layout& l : kLayouts) {
    comm::ProcessGroups pg = comm::make_process_groups(mpi, make_rank_layout(mpi.size, l.tp, 1, 1, l.ep, 1));
    const std::vector<UnitLayout> units = units_of(m, l, pg);
    for (OptimizerSharding mode : kModes) {
      const std::string what = std::string(l.name) + " " + to_string(mode);
      Tracker t(0);
      ParamStore s(t, pg, units, mode, 5);
      const std::vector<std::vector<bf16>> before = params(s, HostIo{t});
      const Snapshot after = run(s, mpi.rank, HostIo{t});
      EXPECT_GT(after.grad_sq, 0) << what;
      size_t moved = 0, total = 0;
      for (size_t u = 0; u < before.size(); ++u)
        for (size_t i = 0; i < before[u].size(); ++i, ++total) moved += before[u][i].bits != after.params[u][i].bits;
      EXPECT_GT(moved, total / 2) << what << ": " << moved << " of " << total << " parameters moved";
    }
    comm::free_groups(pg);
  }
  comm::free_comm(mpi);
}

TEST(DeviceParamStore, MatchesTheHostStore) {
  const std::string skip = lcplan::test::gpu_skip_reason();
  if (!skip.empty()) GTEST_SKIP() << skip;
  lcplan::test::pick_device();
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  comm::Comm mpi = comm::world_mpi();
  comm::Comm nccl = comm::world_nccl(stream);
  const ModelSpec m = model();
  for (const Layout& l : kLayouts) {
    const RankLayout layout = make_rank_layout(mpi.size, l.tp, 1, 1, l.ep, 1);
    comm::ProcessGroups host_pg = comm::make_process_groups(mpi, layout);
    comm::ProcessGroups dev_pg = comm::make_process_groups(nccl, layout);
    const std::vector<UnitLayout> units = units_of(m, l, host_pg);
    for (OptimizerSharding mode : kModes) {
      const std::string what = std::string(l.name) + " " + to_string(mode);
      Tracker th(0), td(0);
      ParamStore host(th, host_pg, units, mode, 5);
      DeviceParamStore dev(td, dev_pg, units, mode, 5, cuda::DeviceMem{stream});
      // The same arrays in the same categories: the tracker sees one store as the other.
      EXPECT_EQ(th.live(Category::Params), td.live(Category::Params)) << what;
      EXPECT_EQ(th.live(Category::Optimizer), td.live(Category::Optimizer)) << what;
      const Snapshot h = run(host, mpi.rank, HostIo{th});
      const Snapshot d = run(dev, mpi.rank, DeviceIo{td, stream});
      EXPECT_NEAR(d.grad_sq, h.grad_sq, 1e-9 * h.grad_sq) << what;
      ASSERT_EQ(d.params.size(), h.params.size()) << what;
      int reported = 0;
      for (size_t u = 0; u < h.params.size() && reported < 5; ++u) {
        ASSERT_EQ(d.params[u].size(), h.params[u].size()) << what;
        for (size_t i = 0; i < h.params[u].size() && reported < 5; ++i) {
          const float a = bf16_to_float(h.params[u][i]), b = bf16_to_float(d.params[u][i]);
          if (std::fabs(a - b) > std::ldexp(std::fabs(a), -7)) {
            ADD_FAILURE() << what << ": unit " << u << " element " << i << " host " << a << " device " << b;
            ++reported;  // stop after the first few mismatches
          }
        }
      }
    }
    comm::free_groups(host_pg);
    comm::free_groups(dev_pg);
  }
  comm::free_comm(nccl);
  comm::free_comm(mpi);
  CUDA_CHECK(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace lcplan::exec::tests
