#include "lib/comm/transport.h"

#include "lib/core/error.h"

namespace dflash::comm {

const char* data_plane_name(DataPlane p) { return p == DataPlane::Nccl ? "nccl" : "mpi"; }

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
