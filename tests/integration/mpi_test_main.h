#pragma once
// The main() of an MPI test program: run(argc, argv) between MPI_Init and MPI_Finalize; an exception is printed
// with the rank and aborts the whole job, so a failing rank never leaves the others waiting (lib/comm/mpi_init.h).
#include "lib/comm/mpi_init.h"

namespace dflash::test {

inline int mpi_test_main(const char* name, int argc, char** argv, int (*run)(int, char**)) {
  return comm::run_mpi_program({name}, argc, argv, [&](bool) { return run(argc, argv); });
}

}  // namespace dflash::test
