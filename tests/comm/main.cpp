#include "tests/comm/mpi_env.h"
LCPLAN_MPI_TEST_MAIN;
