// main() of the MPI test binaries that bring their own (tests/executor, tests/linear_ce): MPI around the whole run;
// only rank 0 prints progress, every rank its failures (tests/comm/mpi_env.h FailuresOnly).
#include <gtest/gtest.h>
#include <mpi.h>

#include "tests/comm/mpi_env.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& ls = ::testing::UnitTest::GetInstance()->listeners();
    delete ls.Release(ls.default_result_printer());
    ls.Append(new lcplan::testing_mpi::FailuresOnly(rank));
  }
  const int rc = RUN_ALL_TESTS();
  MPI_Finalize();
  return rc;
}
