#pragma once
// How every program of the project starts and ends MPI.
// init_mpi: on the emulated GPU (DFLASH_CUDA=EMULATE) the emulated NCCL makes MPI calls from the device worker thread
// while the host thread makes its own, so MPI is initialised with MPI_THREAD_MULTIPLE there (and refused with a clear
// message when the MPI library cannot provide it); a real build initialises with MPI_Init (the project calls MPI from
// one thread).
// run_mpi_program: the main() of an MPI program (the apps that run under mpirun, the MPI test programs).
#include <functional>
#include <string>

namespace dflash::comm {

void init_mpi(int* argc, char*** argv);

// Was this process started by mpirun / srun (Open MPI, PMIx, PMI environment)?
bool launched_by_mpi();

struct MpiProgram {
  std::string name;  // in error messages: "[rank 2] NAME: error: ..."
  // true: without mpirun / srun the body runs with no MPI at all (a plain run must not depend on MPI's singleton
  // start-up working on this machine), and an exception is printed as "NAME: error: ..." with exit code 1.
  // false: MPI is always initialised (a plain run is a world of one).
  bool only_when_launched = false;
  // > -1: MPI_Init_thread at exactly this level instead of init_mpi's choice (tests of the thread level itself)
  int thread_level = -1;
};

// Runs body(with_mpi) between MPI initialisation and MPI_Finalize and returns its exit code. An exception under MPI is
// printed with the rank and aborts MPI_COMM_WORLD with exit code 1: a rank that fails alone must not leave the
// others waiting. Ranks other than 0 wait 2 s first: most errors hit every rank alike, and rank 0's message (and
// its clean-up, e.g. removing a partial output file) should come first.
int run_mpi_program(const MpiProgram& program, int& argc, char**& argv, const std::function<int(bool with_mpi)>& body);

}  // namespace dflash::comm
