#include "lib/comm/mpi_init.h"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <thread>

namespace dflash::comm {

void init_mpi(int* argc, char*** argv) {
#if defined(DFLASH_CUDA_EMULATED)
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    std::fprintf(stderr, "error: the emulated GPU's NCCL needs MPI_THREAD_MULTIPLE (its device thread calls MPI), but "
                         "this MPI library provides only level %d; use an MPI built with thread support (Debian's "
                         "Open MPI has it)\n", provided);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
#else
  MPI_Init(argc, argv);
#endif
}

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
    if (std::getenv(v)) return true;
  return false;
}

int run_mpi_program(const MpiProgram& program, int& argc, char**& argv,
                    const std::function<int(bool with_mpi)>& body) {
  if (program.only_when_launched && !launched_by_mpi()) {
    try {
      return body(false);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: error: %s\n", program.name.c_str(), e.what());
      return 1;
    }
  }
  if (program.thread_level >= 0) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, program.thread_level, &provided);
  } else {
    init_mpi(&argc, &argv);
  }
  int rc = 1;
  try {
    rc = body(true);
  } catch (const std::exception& e) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::fprintf(stderr, "[rank %d] %s: error: %s\n", rank, program.name.c_str(), e.what());
    std::fflush(stderr);
    if (rank != 0) std::this_thread::sleep_for(std::chrono::seconds(2));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}

}  // namespace dflash::comm
