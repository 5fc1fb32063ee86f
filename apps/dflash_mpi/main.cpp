// dflash_mpi CONFIG.yaml [--set key=value ...]: the distributed DFlash drafter trainer (run it under mpirun).
#include "lib/job/trainer.h"

int main(int argc, char** argv) { return dflash::job::dflash_mpi_main(argc, argv); }
