#include "lib/comm/transport.h"

#include "lib/core/error.h"

namespace dflash::comm {

const char* data_plane_name(DataPlane p) { return p == DataPlane::Nccl ? "nccl" : "mpi"; }

void Transport::allreduce_sum_bf16_device(uint16_t*, size_t n) {
  DFLASH_FAIL("a bf16 all-reduce of {} device values on a transport that sums only fp32 host buffers (MPI): callers "
              "ask sums_bf16_on_device() first", n);
}

Request Transport::allreduce_sum_ordered(void*, size_t n, DeviceSum, void*) {
  DFLASH_FAIL("a stream-ordered all-reduce of {} device values on a transport that does not queue on device streams "
              "(MPI): callers ask orders_on_device_streams() first", n);
}

void SelfTransport::send_bytes(const void*, size_t, int dest, int) {
  DFLASH_FAIL("SelfTransport: no rank {} to send to (a group of one has no peers)", dest);
}
void SelfTransport::recv_bytes(void*, size_t, int src, int) {
  DFLASH_FAIL("SelfTransport: no rank {} to receive from (a group of one has no peers)", src);
}
Request SelfTransport::isend_bytes(const void*, size_t, int dest, int) {
  DFLASH_FAIL("SelfTransport: no rank {} to send to (a group of one has no peers)", dest);
}
Request SelfTransport::irecv_bytes(void*, size_t, int src, int) {
  DFLASH_FAIL("SelfTransport: no rank {} to receive from (a group of one has no peers)", src);
}

}  // namespace dflash::comm
