// Shared driver for tests run under mpirun: MPI is initialised once around all tests, and ranks other
// than 0 print only failures (prefixed with their rank) so the log stays readable.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "kernels/comm/comm.h"

namespace lcplan::testing_mpi {

class FailuresOnly : public ::testing::EmptyTestEventListener {
 public:
  explicit FailuresOnly(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                   r.summary());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed())
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
  }

 private:
  int rank_;
};

class MpiEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    int init = 0;
    MPI_CHECK(MPI_Initialized(&init));
    if (!init) MPI_CHECK(MPI_Init(nullptr, nullptr));
    int rank = 0;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    if (rank != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new FailuresOnly(rank));
    }
  }
  void TearDown() override {
    int fin = 0;
    MPI_CHECK(MPI_Finalized(&fin));
    if (!fin) MPI_CHECK(MPI_Finalize());
  }
};

// Include from exactly one translation unit per test binary.
#define LCPLAN_MPI_TEST_MAIN \
  static ::testing::Environment* const lcplan_mpi_env_ = ::testing::AddGlobalTestEnvironment(new ::lcplan::testing_mpi::MpiEnvironment)

}  // namespace lcplan::testing_mpi
