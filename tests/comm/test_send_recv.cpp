#include <vector>

#include "tests/comm/driver.h"

namespace lcplan::comm::tests {

TEST(SendRecv, RingWithUnevenSizes) {
  World w;
  const int P = w.c.size, next = (w.c.rank + 1) % P, prev = (w.c.rank + P - 1) % P;
  // Rank r sends r+1 elements: every message has a different size.
  std::vector<double> out(w.c.rank + 1), in(prev + 1, -1);
  for (size_t i = 0; i < out.size(); ++i) out[i] = w.c.rank + 0.25 * i;
  Request rr = irecv(w.c, in.data(), in.size(), DType::F64, prev, 7);
  Request rs = isend(w.c, out.data(), out.size(), DType::F64, next, 7);
  wait(rs);
  wait(rr);
  for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(in[i], prev + 0.25 * i);
}

TEST(SendRecv, BlockingPairs) {
  World w;
  if (w.c.size < 2) GTEST_SKIP() << "needs two ranks";
  const int partner = w.c.rank ^ 1;
  if (partner >= w.c.size) return;
  std::vector<int64_t> buf(3 + w.c.rank % 2, w.c.rank);
  if (w.c.rank % 2 == 0) {
    send(w.c, buf.data(), buf.size(), DType::I64, partner);
    std::vector<int64_t> got(4);
    recv(w.c, got.data(), got.size(), DType::I64, partner);
    for (auto v : got) EXPECT_EQ(v, partner);
  } else {
    std::vector<int64_t> got(3);
    recv(w.c, got.data(), got.size(), DType::I64, partner);
    send(w.c, buf.data(), buf.size(), DType::I64, partner);
    for (auto v : got) EXPECT_EQ(v, partner);
  }
}

// Both sides of each pair send before they receive: one call each, and every message lands (sizes differ per pair).
TEST(SendRecv, ExchangeBetweenPartners) {
  World w;
  if (w.c.size < 2) GTEST_SKIP() << "needs two ranks";
  const int partner = w.c.rank ^ 1;
  if (partner >= w.c.size) return;
  const size_t n = 5 + size_t(w.c.rank / 2);
  std::vector<float> mine(n), got(n, -1);
  for (size_t i = 0; i < n; ++i) mine[i] = float(w.c.rank * 100 + int(i));
  sendrecv(w.c, mine.data(), got.data(), n, DType::F32, partner, 3);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(got[i], float(partner * 100 + int(i)));
  double v = 0;
  EXPECT_NE(invalid_argument_of([&] { sendrecv(w.c, &v, &v, 1, DType::F64, w.c.size, 3); }).find("peer"),
            std::string::npos);
}

TEST(SendRecv, ReservedAndNegativeTagsAreRefused) {
  World w;
  double v = 0;
  for (int tag : {-1, kAllToAllTag}) {
    const std::string m = invalid_argument_of([&] { send(w.c, &v, 1, DType::F64, w.c.rank, tag); });
    EXPECT_NE(m.find("reserved for all_to_all_v"), std::string::npos) << m;
    EXPECT_NE(invalid_argument_of([&] { Request r = irecv(w.c, &v, 1, DType::F64, w.c.rank, tag); }), "");
  }
}

TEST(DType, Bytes) {
  EXPECT_EQ(dtype_bytes(DType::F32), 4u);
  EXPECT_EQ(dtype_bytes(DType::F64), 8u);
  EXPECT_EQ(dtype_bytes(DType::BF16), 2u);
  EXPECT_EQ(dtype_bytes(DType::I32), 4u);
  EXPECT_EQ(dtype_bytes(DType::I64), 8u);
}

}  // namespace lcplan::comm::tests
