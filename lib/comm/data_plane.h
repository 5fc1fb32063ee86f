#pragma once
// The two planes of communication. Control (always MPI, host): layout, bootstrap, the stop protocol, packet headers,
// small messages. Data (layout.transport): the packets' tensors, the target TP all-reduce and the drafter DP
// all-reduce, carried by one of two transports behind comm::Transport:
//   mpi  : MpiTransport on host buffers (CPU runs; several ranks sharing a GPU);
//   nccl : NCCL (lib/comm/nccl_transport.h), one GPU per rank; host buffers are staged through the device.
// auto (the default) picks nccl when run.device is cuda and every rank has a GPU of its own, else mpi.
#include <mpi.h>

#include <memory>
#include <string>

#include "lib/comm/transport.h"

namespace dflash::comm {

// What the node looks like to the choice: the most ranks any node runs and the fewest GPUs any node shows them.
struct NodeShape {
  int max_ranks_per_node = 1;
  int min_gpus_per_node = 0;
};

// The plane for layout.transport `requested`. Pure: the rule, for every rank alike.
//   mpi -> mpi; auto -> nccl when cuda, NCCL is built and every rank has its own GPU, else mpi;
//   nccl -> nccl, or a user error naming the reason (no cuda, no NCCL in this build, more ranks than GPUs on a
//   node: NCCL refuses two ranks on one GPU).
DataPlane choose_data_plane(TransportChoice requested, bool cuda_device, bool nccl_in_build, NodeShape node);

// The shape of the job's nodes (collective over `world`: ranks per node from MPI_COMM_TYPE_SHARED, GPUs from CUDA).
NodeShape node_shape(MPI_Comm world);

// A data-plane transport over `comm` (not owned; MPI_COMM_NULL is an error). Nccl is collective over `comm`
// (bootstrap); `name` names the communicator in errors; timeout_seconds bounds NCCL waits (≤ 0: unbounded).
std::unique_ptr<Transport> make_data_transport(DataPlane plane, MPI_Comm comm, const std::string& name,
                                               double timeout_seconds);

}  // namespace dflash::comm
