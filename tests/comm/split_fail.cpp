// Ranks pass inconsistent group lists to comm::split; every rank must print the error and the job must exit
// non-zero, never hang (run under mpirun -np 4 by tests/moe/expect_fail.cmake).
//   mismatch: rank 0 claims {0,1,2}, rank 1 {0,1}, the others themselves alone
//   outside:  the last rank names {0}, a group it is not in
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

#include "kernels/comm/comm.h"
#include "kernels/comm/helpers.h"

int main(int argc, char** argv) {
  return lcplan::helpers::mpi_main(argc, argv, "split_fail", [&](int rank) {
    const bool outside = argc > 1 && std::strcmp(argv[1], "outside") == 0;
    lcplan::helpers::World w;
    std::vector<int> mine = {w.c.rank};
    if (outside) {
      if (w.c.rank == w.c.size - 1) mine = {0};
    } else if (w.c.rank == 0) {
      mine = {0, 1, 2};
    } else if (w.c.rank == 1) {
      mine = {0, 1};
    }
    lcplan::comm::Comm g = lcplan::comm::split(w.c, mine);
    lcplan::comm::free_comm(g);
    std::printf("split_fail: rank %d: split accepted inconsistent groups\n", rank);  // exit 0: the test fails
    return 0;
  });
}
