#pragma once
// Transport over an MPI communicator (not owned: RoleComms or MPI_COMM_WORLD outlive it). Messages and reductions
// larger than INT_MAX elements are split into pieces, so any size works with MPI's int counts.
#include <mpi.h>

#include "lib/comm/transport.h"

namespace dflash::comm {

class MpiTransport final : public Transport {
 public:
  explicit MpiTransport(MPI_Comm comm);

  MPI_Comm comm() const { return comm_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allreduce_sum(float* data, size_t n) override;
  void allreduce_sum(double* data, size_t n) override;
  void broadcast_bytes(void* data, size_t bytes, int root) override;
  void send_bytes(const void* data, size_t bytes, int dest, int tag) override;
  void recv_bytes(void* data, size_t bytes, int src, int tag) override;
  Request isend_bytes(const void* data, size_t bytes, int dest, int tag) override;
  Request irecv_bytes(void* data, size_t bytes, int src, int tag) override;
  void barrier() override;
  bool probe(int src, int tag) override;

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

}  // namespace dflash::comm
