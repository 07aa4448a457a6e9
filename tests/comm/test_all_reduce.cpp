#include <cstdint>
#include <vector>

#include "kernels/common/bf16.h"
#include "tests/comm/driver.h"

namespace lcplan::comm::tests {

namespace {
template <class T>
void check_all_reduce(DType t, ReduceOp op, bool nonblocking) {
  World w;
  const size_t n = 7;  // odd, so no backend can assume even splits
  std::vector<T> buf(n);
  for (size_t i = 0; i < n; ++i) buf[i] = static_cast<T>(val(w.c.rank, i));
  if (nonblocking) {
    Request r = iall_reduce(w.c, buf.data(), n, t, op);
    wait(r);
    EXPECT_FALSE(r.active);
  } else {
    all_reduce(w.c, buf.data(), n, t, op);
  }
  for (size_t i = 0; i < n; ++i) {
    T want = static_cast<T>(val(0, i));
    for (int r = 1; r < w.c.size; ++r) {
      const T v = static_cast<T>(val(r, i));
      want = op == ReduceOp::Sum ? want + v : op == ReduceOp::Max ? std::max(want, v) : std::min(want, v);
    }
    EXPECT_EQ(buf[i], want) << dtype_name(t) << " element " << i;
  }
}
}  // namespace

TEST(AllReduce, SumMaxMinEveryNumericType) {
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
    check_all_reduce<float>(DType::F32, op, false);
    check_all_reduce<double>(DType::F64, op, true);
    check_all_reduce<int32_t>(DType::I32, op, false);
    check_all_reduce<int64_t>(DType::I64, op, true);
  }
}

TEST(AllReduce, Bf16UsesUpcastReduction) {
  World w;
  const size_t n = 5;
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min})
    for (bool nb : {false, true}) {
      std::vector<uint16_t> buf(n);
      for (size_t i = 0; i < n; ++i) buf[i] = f32_to_bf16(val(w.c.rank, i) * 0.5f);
      if (nb) {
        Request r = iall_reduce(w.c, buf.data(), n, DType::BF16, op);
        while (!test(r)) {
        }
      } else {
        all_reduce(w.c, buf.data(), n, DType::BF16, op);
      }
      for (size_t i = 0; i < n; ++i) {
        float want = val(0, i) * 0.5f;
        for (int r = 1; r < w.c.size; ++r) {
          const float v = val(r, i) * 0.5f;
          want = op == ReduceOp::Sum ? want + v : op == ReduceOp::Max ? std::max(want, v) : std::min(want, v);
        }
        EXPECT_EQ(bf16_to_f32(buf[i]), want) << "element " << i;  // halves of small integers: exact in bf16
      }
    }
}

TEST(AllReduce, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.00390625f)), 1.0f);       // exactly half an ulp: ties to even (down)
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.01171875f)), 1.015625f);  // 1.5 ulp: ties to even (up)
}

}  // namespace lcplan::comm::tests
