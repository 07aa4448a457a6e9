#include <numeric>
#include <type_traits>
#include <vector>

#include "kernels/comm/backend.h"
#include "tests/comm/driver.h"

namespace lcplan::comm::tests {

namespace {
// Uneven, with empty pairs: rank s sends (s + 2d) % 4 elements to rank d.
size_t count(int s, int d) { return static_cast<size_t>((s + 2 * d) % 4); }
float payload(int s, int d, size_t i) { return static_cast<float>(s * 1000 + d * 100 + static_cast<int>(i)); }
}  // namespace

TEST(AllToAllV, UnevenCountsWithEmptyPairs) {
  World w;
  const int P = w.c.size;
  for (bool nb : {false, true}) {
    std::vector<size_t> sc(P), sd(P), rc(P), rd(P);
    for (int d = 0; d < P; ++d) sc[d] = count(w.c.rank, d);
    exchange_counts(w.c, sc.data(), rc.data(), 1);
    for (int s = 0; s < P; ++s) EXPECT_EQ(rc[s], count(s, w.c.rank)) << "counts exchanged from rank " << s;
    std::exclusive_scan(sc.begin(), sc.end(), sd.begin(), size_t{0});
    // Receive displacements in reverse rank order with a gap: the call must honour them, not assume packing.
    size_t off = 1;
    for (int s = P - 1; s >= 0; --s) {
      rd[s] = off;
      off += rc[s] + 1;
    }
    std::vector<float> send(std::accumulate(sc.begin(), sc.end(), size_t{0}));
    for (int d = 0; d < P; ++d)
      for (size_t i = 0; i < sc[d]; ++i) send[sd[d] + i] = payload(w.c.rank, d, i);
    std::vector<float> recv(off, -1.f);
    if (nb) {
      Request r = iall_to_all_v(w.c, send.data(), sc.data(), sd.data(), recv.data(), rc.data(), rd.data(), DType::F32);
      while (!test(r)) {
      }
    } else {
      all_to_all_v(w.c, send.data(), sc.data(), sd.data(), recv.data(), rc.data(), rd.data(), DType::F32);
    }
    for (int s = 0; s < P; ++s) {
      for (size_t i = 0; i < rc[s]; ++i) EXPECT_EQ(recv[rd[s] + i], payload(s, w.c.rank, i));
      EXPECT_EQ(recv[rd[s] - 1], -1.f) << "gap before rank " << s << "'s block was overwritten";
    }
  }
}

TEST(AllToAllV, CountsCutIntoPiecesArriveWhole) {
  // Counts beyond a piece (2^30 elements normally) go as several messages; with 3-element pieces the uneven
  // counts below (0..7 elements, gaps between blocks) take 0 to 3 pieces each, both ways, two calls in flight.
  World w;
  const int P = w.c.size;
  detail::set_all_to_all_piece(3);
  std::vector<size_t> sc(P), sd(P), rc(P), rd(P);
  for (int d = 0; d < P; ++d) sc[d] = size_t((w.c.rank * 3 + d * 5) % 8);
  exchange_counts(w.c, sc.data(), rc.data(), 1);
  size_t so = 0, ro = 0;
  for (int r = 0; r < P; ++r) {
    sd[r] = so, so += sc[r] + 2;
    rd[r] = ro, ro += rc[r] + 1;
  }
  std::vector<double> send(so, -7.0), recv1(ro, -1.0), recv2(ro, -1.0);
  for (int d = 0; d < P; ++d)
    for (size_t i = 0; i < sc[d]; ++i) send[sd[d] + i] = payload(w.c.rank, d, i);
  Request a = iall_to_all_v(w.c, send.data(), sc.data(), sd.data(), recv1.data(), rc.data(), rd.data(), DType::F64);
  Request b = iall_to_all_v(w.c, send.data(), sc.data(), sd.data(), recv2.data(), rc.data(), rd.data(), DType::F64);
  wait(b);
  wait(a);
  detail::set_all_to_all_piece(size_t(1) << 30);
  for (int s = 0; s < P; ++s) {
    for (size_t i = 0; i < rc[s]; ++i) {
      EXPECT_EQ(recv1[rd[s] + i], payload(s, w.c.rank, i)) << "from " << s << " element " << i;
      EXPECT_EQ(recv2[rd[s] + i], payload(s, w.c.rank, i)) << "from " << s << " element " << i;
    }
    EXPECT_EQ(recv1[rd[s] + rc[s]], -1.0) << "gap after rank " << s << "'s block was overwritten";
  }
  EXPECT_NE(invalid_argument_of([] { detail::set_all_to_all_piece(0); }), "");
}

TEST(AllToAllV, TwoInFlightAtOnce) {
  // The chunked MoE schedule keeps several all-to-alls outstanding; they must not mix.
  World w;
  const int P = w.c.size;
  std::vector<size_t> c1(P, 2), c2(P, 3), d1(P), d2(P);
  for (int r = 0; r < P; ++r) {
    d1[r] = 2 * r;
    d2[r] = 3 * r;
  }
  std::vector<int32_t> s1(2 * P), s2(3 * P), r1(2 * P), r2(3 * P);
  for (int i = 0; i < 2 * P; ++i) s1[i] = w.c.rank * 100 + i;
  for (int i = 0; i < 3 * P; ++i) s2[i] = -(w.c.rank * 100 + i);
  Request a = iall_to_all_v(w.c, s1.data(), c1.data(), d1.data(), r1.data(), c1.data(), d1.data(), DType::I32);
  Request b = iall_to_all_v(w.c, s2.data(), c2.data(), d2.data(), r2.data(), c2.data(), d2.data(), DType::I32);
  wait(b);
  wait(a);
  for (int s = 0; s < P; ++s) {
    for (int i = 0; i < 2; ++i) EXPECT_EQ(r1[2 * s + i], s * 100 + 2 * w.c.rank + i);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(r2[3 * s + i], -(s * 100 + 3 * w.c.rank + i));
  }
}

TEST(AllToAllV, RequestIsMoveOnlyAndCompletesAfterAMove) {
  static_assert(!std::is_copy_constructible_v<Request> && !std::is_copy_assignable_v<Request>,
                "a copy would complete the same MPI requests twice");
  World w;
  const int P = w.c.size;
  std::vector<size_t> cnt(P, 1), displ(P);
  for (int r = 0; r < P; ++r) displ[r] = size_t(r);
  std::vector<int64_t> s(P), got(P, -1);
  for (int r = 0; r < P; ++r) s[r] = w.c.rank * 10 + r;
  Request a = iall_to_all_v(w.c, s.data(), cnt.data(), displ.data(), got.data(), cnt.data(), displ.data(), DType::I64);
  std::vector<Request> held;
  held.push_back(std::move(a));  // the handles move with it: a reallocation must not strand them
  held.reserve(8);
  wait(held[0]);
  EXPECT_FALSE(held[0].active);
  for (int r = 0; r < P; ++r) EXPECT_EQ(got[r], r * 10 + w.c.rank);
}

}  // namespace lcplan::comm::tests
