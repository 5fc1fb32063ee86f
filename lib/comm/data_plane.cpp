#include "lib/comm/data_plane.h"

#include "lib/comm/mpi_transport.h"
#include "lib/comm/nccl_transport.h"
#include "lib/core/error.h"

namespace dflash::comm {

DataPlane choose_data_plane(TransportChoice requested, bool cuda_device, bool nccl_in_build, NodeShape node) {
  if (requested == TransportChoice::mpi) return DataPlane::Mpi;
  const bool own_gpu = node.max_ranks_per_node <= node.min_gpus_per_node;
  if (requested == TransportChoice::automatic)
    return cuda_device && nccl_in_build && own_gpu ? DataPlane::Nccl : DataPlane::Mpi;
  DFLASH_USER_CHECK(cuda_device, "layout.transport is nccl but run.device is cpu: NCCL moves device memory; set "
                                 "run.device: cuda or layout.transport: mpi");
  DFLASH_USER_CHECK(nccl_in_build, "layout.transport is nccl but this build has no CUDA/NCCL; rebuild with the CUDA "
                                   "toolkit and NCCL installed, or set layout.transport: mpi");
  DFLASH_USER_CHECK(node.min_gpus_per_node > 0,
                    "layout.transport is nccl but a node shows no GPU (no device, no driver, or CUDA_VISIBLE_DEVICES "
                    "empty); run where every rank has a GPU or set layout.transport: mpi");
  DFLASH_USER_CHECK(own_gpu,
                    "layout.transport is nccl but a node runs {} ranks on {} GPU(s): NCCL refuses two ranks on one "
                    "GPU; run at most one rank per GPU (more nodes, or fewer ranks per node) or set "
                    "layout.transport: mpi",
                    node.max_ranks_per_node, node.min_gpus_per_node);
  return DataPlane::Nccl;
}

NodeShape node_shape(MPI_Comm world) {
  MPI_Comm node;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int here = 1;
  MPI_Comm_size(node, &here);
  MPI_Comm_free(&node);
  int mine[2] = {here, -visible_gpus()}, all[2] = {0, 0};  // max of ranks, max of -gpus = -min of gpus
  MPI_Allreduce(mine, all, 2, MPI_INT, MPI_MAX, world);
  return {all[0], -all[1]};
}

std::unique_ptr<Transport> make_data_transport(DataPlane plane, MPI_Comm comm, const std::string& name,
                                               double timeout_seconds) {
  if (plane == DataPlane::Nccl) return make_nccl_transport(comm, name, timeout_seconds);
  return std::make_unique<MpiTransport>(comm);
}

}  // namespace dflash::comm
