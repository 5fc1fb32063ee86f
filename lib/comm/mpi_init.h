#pragma once
// MPI_Init for every program of the project. On the emulated GPU (DFLASH_CUDA=EMULATE) the emulated NCCL makes
// MPI calls from the device worker thread while the host thread makes its own, so MPI is initialised with
// MPI_THREAD_MULTIPLE there (and refused with a clear message when the MPI library cannot provide it); a real
// build initialises as before (MPI_Init: the project calls MPI from one thread).
namespace dflash::comm {

void init_mpi(int* argc, char*** argv);

}  // namespace dflash::comm
