#include "lib/job/signals.h"

#include <csignal>

namespace dflash::job {

namespace {
volatile std::sig_atomic_t g_signal = 0;
extern "C" void record_signal(int sig) { g_signal = sig; }
}  // namespace

void install_stop_signal_handlers() {
  struct sigaction sa = {};
  sa.sa_handler = record_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // MPI and file calls resume; the request is acted on at the step boundary
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

int stop_signal() { return g_signal; }

const char* signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    default: return "no signal";
  }
}

}  // namespace dflash::job
