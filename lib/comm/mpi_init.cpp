#include "lib/comm/mpi_init.h"

#include <mpi.h>

#include <cstdio>

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

}  // namespace dflash::comm
