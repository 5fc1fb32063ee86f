#pragma once
// The main() of an MPI test program: run(argc, argv) between MPI_Init and MPI_Finalize; an exception is printed
// with the rank and aborts the whole job, so a failing rank never leaves the others waiting.
#include <mpi.h>

#include "lib/comm/mpi_init.h"

#include <cstdio>
#include <exception>

namespace dflash::test {

inline int mpi_test_main(const char* name, int argc, char** argv, int (*run)(int, char**)) {
  dflash::comm::init_mpi(&argc, &argv);
  int rc = 1;
  try {
    rc = run(argc, argv);
  } catch (const std::exception& e) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::fprintf(stderr, "[rank %d] %s: error: %s\n", rank, name, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}

}  // namespace dflash::test
