#pragma once
// The NCCL data plane: a Transport over one NCCL communicator, bootstrapped over an MPI communicator (every rank of
// it joins; rank r of MPI = rank r of NCCL). Only in a build with CUDA (DFLASH_WITH_CUDA); elsewhere the factory
// throws a user error naming the fix.
//
// Buffers: device pointers go to NCCL as they are; host pointers (the target forward and FeaturePacket are host
// today) are staged through a device buffer (copy in, NCCL, copy out when the request completes), so the same
// callers work on both data planes.
// Ordering: NCCL has no tags and no probe. Operations between one pair of ranks match in the order they are issued
// (the packet protocol issues them in packet order on both sides); tags are ignored; probe() is an error (probes
// belong to the control plane, MPI). Posted receives cannot be cancelled (cancellable_receives() is false: the
// packet receiver posts a packet's data only after its header arrived on the control plane).
// Streams: each NcclTransport has its own CUDA stream, so the packet links, the TP all-reduce and the DP
// all-reduce never queue behind one another. The stream-ordered all-reduce (allreduce_sum_ordered: the target's TP
// sum) joins the caller's compute stream to NCCL's by events both ways, so neither host waits; its Request's wait
// is the bounded poll below.
// Failure: the communicator is non-blocking (ncclConfig_t.blocking = 0); every wait polls the CUDA event and
// ncclCommGetAsyncError. An NCCL error, or a wait longer than timeout_seconds (> 0), aborts the communicator
// (ncclCommAbort) and throws dflash::Error naming the rank, the communicator and the operation; the trainer's
// handler then aborts the MPI world, so a dead peer never hangs the job.
#include <mpi.h>

#include <memory>
#include <string>

#include "lib/comm/transport.h"

namespace dflash::comm {

// True when this build has NCCL (the CUDA backend).
bool nccl_built();
// Visible CUDA devices of this process (0 without CUDA, a driver or a device; never throws).
int visible_gpus();

// Collective over `bootstrap`: rank 0 creates the NCCL unique id, MPI broadcasts it, every rank initialises its
// communicator on the calling thread's current CUDA device. `name` ("world", "target TP group 1", ...) appears in
// every error. timeout_seconds ≤ 0: waits are unbounded (NCCL errors are still polled and reported).
std::unique_ptr<Transport> make_nccl_transport(MPI_Comm bootstrap, const std::string& name, double timeout_seconds);

}  // namespace dflash::comm
