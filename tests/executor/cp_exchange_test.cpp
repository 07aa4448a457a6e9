// Context parallelism's K/V exchange in the Ops primitives (layers/core_attention.h cp_gather_kv / cp_scatter_dkv,
// which both backends run) on HostOps against plain reference loops written out token by token below: 4 ranks as
// CP 2 x DP 2, random K/V and gradients, equal to the bit. The paired tests check the exchange inside whole CP layers;
// this one pins its layout (who holds which chunk, the [k | v] packing) on its own.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "executor/layer_ops_host.h"
#include "executor/layers/core_attention.h"
#include "executor/ops.h"
#include "kernels/comm/groups.h"
#include "kernels/comm/helpers.h"
#include "tests/common/check.h"

namespace lcplan::exec::tests {
namespace {

// Reference gather: each rank's local rows bf16-rounded and placed at its chunks' positions (chunks r and 2cp-1-r).
void gather_reference(const Ctx& c, const float* k_loc, const float* v_loc, float* K, float* V) {
  const int64_t kvc = c.d.kv_cols(), L = c.seq_local, Sc = c.chunk_len;
  std::vector<bf16> mine(size_t(L * 2 * kvc)), all(size_t(c.cp * L * 2 * kvc));
  for (int64_t t = 0; t < L; ++t) {
    to_bf16(k_loc + t * kvc, mine.data() + t * 2 * kvc, size_t(kvc));
    to_bf16(v_loc + t * kvc, mine.data() + t * 2 * kvc + kvc, size_t(kvc));
  }
  comm::all_gather(c.pg.cp, mine.data(), all.data(), mine.size(), comm::DType::BF16);
  for (int j = 0; j < c.cp; ++j)
    for (int ch = 0; ch < 2; ++ch) {
      const int64_t pos = int64_t(ch == 0 ? j : 2 * c.cp - 1 - j) * Sc;
      for (int64_t t = 0; t < Sc; ++t) {
        const bf16* src = all.data() + (int64_t(j) * L + ch * Sc + t) * 2 * kvc;
        to_f32(src, K + (pos + t) * kvc, size_t(kvc));
        to_f32(src + kvc, V + (pos + t) * kvc, size_t(kvc));
      }
    }
}

// Reference scatter: the whole sequence's dK/dV summed over CP, each rank keeping its chunks' rows.
void scatter_reference(const Ctx& c, const float* dK, const float* dV, float* dk, float* dv) {
  const int64_t kvc = c.d.kv_cols(), L = c.seq_local, Sc = c.chunk_len;
  std::vector<float> packed(size_t(c.cp * L * 2 * kvc)), mine(size_t(L * 2 * kvc));
  for (int j = 0; j < c.cp; ++j)
    for (int ch = 0; ch < 2; ++ch) {
      const int64_t pos = int64_t(ch == 0 ? j : 2 * c.cp - 1 - j) * Sc;
      for (int64_t t = 0; t < Sc; ++t) {
        float* dst = packed.data() + (int64_t(j) * L + ch * Sc + t) * 2 * kvc;
        std::copy(dK + (pos + t) * kvc, dK + (pos + t + 1) * kvc, dst);
        std::copy(dV + (pos + t) * kvc, dV + (pos + t + 1) * kvc, dst + kvc);
      }
    }
  comm::reduce_scatter(c.pg.cp, packed.data(), mine.data(), mine.size(), comm::DType::F32, comm::ReduceOp::Sum);
  for (int64_t t = 0; t < L; ++t) {
    std::copy(mine.data() + t * 2 * kvc, mine.data() + t * 2 * kvc + kvc, dk + t * kvc);
    std::copy(mine.data() + t * 2 * kvc + kvc, mine.data() + (t + 1) * 2 * kvc, dv + t * kvc);
  }
}

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
  std::vector<float> K(size_t(c.seq) * kvc), V(K.size());
  gather_reference(c, k.data(), v.data(), K.data(), V.data());
  const impl::FullKV<HostOps> got = impl::cp_gather_kv(o, c, k.data(), v.data());
  EXPECT_TRUE(same_bits(got.k.data(), K.data(), K.size())) << "gathered K";
  EXPECT_TRUE(same_bits(got.v.data(), V.data(), V.size())) << "gathered V";
  // Both hold every rank's rows: the local ones back at their positions.
  EXPECT_TRUE(same_bits(K.data() + c.chunk_start(0) * int64_t(kvc), k.data(), size_t(c.chunk_len) * kvc));

  const std::vector<float> dK = lcplan::test::randn(size_t(c.seq) * kvc, 300 + uint64_t(w.c.rank));
  const std::vector<float> dV = lcplan::test::randn(size_t(c.seq) * kvc, 400 + uint64_t(w.c.rank));
  std::vector<float> dk_want(L * kvc), dv_want(L * kvc), dk_got(L * kvc), dv_got(L * kvc);
  scatter_reference(c, dK.data(), dV.data(), dk_want.data(), dv_want.data());
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
