#pragma once
// The dflash_mpi program: `dflash_mpi CONFIG.yaml [--set key=value ...]` under mpirun. Sets up the layout, the
// role communicators and the logs, then runs the target or drafter worker on each rank. Any error aborts the whole
// MPI world (no rank is left hanging) after printing one clear message.

namespace dflash::job {

int dflash_mpi_main(int argc, char** argv);

}  // namespace dflash::job
