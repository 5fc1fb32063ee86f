#pragma once
// SIGTERM and SIGUSR1 (what slurm sends before a time limit, e.g. `#SBATCH --signal=USR1@300`) ask the job to
// finish its current step, write a checkpoint and exit cleanly. The handler only records the request; the
// drafter ranks agree on it at the next step boundary (it rides on the step's all-reduce).

namespace dflash::job {

void install_stop_signal_handlers();
// The signal number received (SIGTERM or SIGUSR1), or 0.
int stop_signal();
const char* signal_name(int signal);

}  // namespace dflash::job
