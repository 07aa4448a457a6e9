#include <vector>

#include "tests/comm/driver.h"

namespace lcplan::comm::tests {

// Equal counts only (comm.h): odd sizes, one element and a size no backend block divides.
TEST(AllGather, OddCountPerRankBlockingAndNonBlocking) {
  World w;
  for (size_t n : {size_t{1}, size_t{5}, size_t{1001}})
  for (bool nb : {false, true}) {
    std::vector<float> send(n), recv(n * w.c.size, -1.f);
    for (size_t i = 0; i < n; ++i) send[i] = val(w.c.rank, i);
    if (nb) {
      Request r = iall_gather(w.c, send.data(), recv.data(), n, DType::F32);
      wait(r);
    } else {
      all_gather(w.c, send.data(), recv.data(), n, DType::F32);
    }
    for (int r = 0; r < w.c.size; ++r)
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(recv[r * n + i], val(r, i)) << "from rank " << r;
  }
}

TEST(Broadcast, FromLastRank) {
  World w;
  std::vector<double> buf(3, w.c.rank);
  broadcast(w.c, buf.data(), buf.size(), DType::F64, w.c.size - 1);
  for (double v : buf) EXPECT_EQ(v, w.c.size - 1);
  EXPECT_NE(invalid_argument_of([&] { broadcast(w.c, buf.data(), 1, DType::F64, w.c.size); }), "");
}

}  // namespace lcplan::comm::tests
