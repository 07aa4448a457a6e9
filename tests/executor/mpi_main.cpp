// main() of the MPI executor tests: MPI around the whole run; only rank 0 prints progress, every rank its failures.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "executor/tracking_allocator.h"

namespace {

class FailuresOnly : public ::testing::EmptyTestEventListener {
 public:
  explicit FailuresOnly(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed()) std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name(), r.line_number(), r.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  lcplan::exec::retain_freed_host_memory();  // the heap lcplan-exec runs with (executor/tracking_allocator.h)
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& ls = ::testing::UnitTest::GetInstance()->listeners();
    delete ls.Release(ls.default_result_printer());
    ls.Append(new FailuresOnly(rank));
  }
  const int rc = RUN_ALL_TESTS();
  MPI_Finalize();
  return rc;
}
