#include <cstdint>
#include <vector>

#include "kernels/common/bf16.h"
#include "tests/comm/driver.h"

namespace lcplan::comm::tests {

// Equal blocks only (comm.h): odd block sizes, one element and a size no backend block divides.
TEST(ReduceScatter, SumOfOddBlocks) {
  World w;
  for (size_t n : {size_t{1}, size_t{3}, size_t{999}})
  for (bool nb : {false, true}) {
    std::vector<float> send(n * w.c.size), recv(n, -1.f);
    for (size_t i = 0; i < send.size(); ++i) send[i] = val(w.c.rank, i);
    if (nb) {
      Request r = ireduce_scatter(w.c, send.data(), recv.data(), n, DType::F32, ReduceOp::Sum);
      wait(r);
    } else {
      reduce_scatter(w.c, send.data(), recv.data(), n, DType::F32, ReduceOp::Sum);
    }
    for (size_t i = 0; i < n; ++i) {
      float want = 0;
      for (int r = 0; r < w.c.size; ++r) want += val(r, w.c.rank * n + i);
      EXPECT_EQ(recv[i], want);
    }
  }
}

// In place, NCCL's convention (recv = this rank's block of send), as the executor's dist-opt gradient shard uses it;
// bf16 too, which MPI reduces through a user op.
TEST(ReduceScatter, InPlaceLeavesTheSumInThisRanksBlock) {
  World w;
  for (size_t n : {size_t{1}, size_t{999}}) {
    std::vector<float> buf(n * w.c.size);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = val(w.c.rank, i);
    float* mine = buf.data() + size_t(w.c.rank) * n;
    reduce_scatter(w.c, buf.data(), mine, n, DType::F32, ReduceOp::Sum);
    for (size_t i = 0; i < n; ++i) {
      float want = 0;
      for (int r = 0; r < w.c.size; ++r) want += val(r, w.c.rank * n + i);
      EXPECT_EQ(mine[i], want) << "n " << n << " element " << i;
    }
  }
  std::vector<uint16_t> b(3 * w.c.size);
  for (size_t i = 0; i < b.size(); ++i) b[i] = f32_to_bf16(float(w.c.rank + 1));
  reduce_scatter(w.c, b.data(), b.data() + 3 * w.c.rank, 3, DType::BF16, ReduceOp::Sum);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(bf16_to_f32(b[3 * w.c.rank + i]), float(w.c.size * (w.c.size + 1) / 2));
}

TEST(ReduceScatter, MaxInt64) {
  World w;
  std::vector<int64_t> send(2 * w.c.size), recv(2);
  for (size_t i = 0; i < send.size(); ++i) send[i] = (w.c.rank + 1) * 1000000000000LL + static_cast<int64_t>(i);
  reduce_scatter(w.c, send.data(), recv.data(), 2, DType::I64, ReduceOp::Max);
  EXPECT_EQ(recv[0], w.c.size * 1000000000000LL + 2 * w.c.rank);
  EXPECT_EQ(recv[1], w.c.size * 1000000000000LL + 2 * w.c.rank + 1);
}

}  // namespace lcplan::comm::tests
