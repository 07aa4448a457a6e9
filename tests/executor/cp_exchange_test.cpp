// Context parallelism's K/V exchange in the Ops primitives (layers_impl.h cp_gather_kv / cp_scatter_dkv, what the GPU
// backend runs) against the host's own loops (HostOps::gather_kv / scatter_dkv, what the paired tests check), on
// the CPU backend: 4 ranks as CP 2 x DP 2, random K/V and gradients, the two results equal to the bit. So the
// device's exchange differs from the tested one only in the primitives it calls.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "executor/layer_ops_host.h"
#include "executor/layers_impl.h"
#include "kernels/comm/groups.h"
#include "kernels/comm/helpers.h"
#include "tests/attention/check.h"

namespace lcplan::exec::tests {
namespace {

template <class T>
bool same_bits(const T* a, const T* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(T)) == 0;
}

TEST(CpExchange, PrimitivesMatchTheHostLoops) {
  helpers::World w;
  ASSERT_EQ(w.c.size, 4) << "run with mpirun -np 4";
  comm::ProcessGroups pg = comm::make_process_groups(w.c, make_rank_layout(4, 1, 1, 2, 1, 1));
  Dims d;
  d.H = 64;
  d.hq = 4;
  d.hkv = 2;
  d.hd = 16;
  Tracker t;
  Ctx c{t, d, pg};
  c.cp = 2;
  c.cp_rank = pg.cp.rank;
  c.seq = 96;
  c.seq_local = c.seq / c.cp;
  c.chunks = 2;
  c.chunk_len = c.seq_local / 2;
  c.tokens = c.seq_local;
  c.rows = c.tokens;
  const size_t kvc = size_t(d.kv_cols()), L = size_t(c.seq_local);
  // Rank-dependent values, bf16-exact as the layers store them.
  std::vector<float> k = lcplan::test::randn(L * kvc, 100 + uint64_t(w.c.rank));
  std::vector<float> v = lcplan::test::randn(L * kvc, 200 + uint64_t(w.c.rank));
  round_bf16_inplace(k.data(), k.size());
  round_bf16_inplace(v.data(), v.size());
  HostOps o{t};
  const HostOps::FullKV want = o.gather_kv(c, k.data(), v.data());
  const HostOps::FullKV got = impl::cp_gather_kv(o, c, k.data(), v.data());
  EXPECT_TRUE(same_bits(got.k.data(), want.k.data(), got.k.size())) << "gathered K";
  EXPECT_TRUE(same_bits(got.v.data(), want.v.data(), got.v.size())) << "gathered V";
  // Both hold every rank's rows: the local ones back at their positions.
  EXPECT_TRUE(same_bits(want.k.data() + c.chunk_start(0) * int64_t(kvc), k.data(), size_t(c.chunk_len) * kvc));

  const std::vector<float> dK = lcplan::test::randn(size_t(c.seq) * kvc, 300 + uint64_t(w.c.rank));
  const std::vector<float> dV = lcplan::test::randn(size_t(c.seq) * kvc, 400 + uint64_t(w.c.rank));
  std::vector<float> dk_want(L * kvc), dv_want(L * kvc), dk_got(L * kvc), dv_got(L * kvc);
  o.scatter_dkv(c, dK.data(), dV.data(), dk_want.data(), dv_want.data());
  impl::cp_scatter_dkv(o, c, dK.data(), dV.data(), dk_got.data(), dv_got.data());
  EXPECT_TRUE(same_bits(dk_got.data(), dk_want.data(), dk_got.size())) << "scattered dK";
  EXPECT_TRUE(same_bits(dv_got.data(), dv_want.data(), dv_got.size())) << "scattered dV";
  double norm = 0;
  for (float x : dk_want) norm += double(x) * x;
  EXPECT_GT(norm, 0);
  comm::free_groups(pg);
}

}  // namespace
}  // namespace lcplan::exec::tests
