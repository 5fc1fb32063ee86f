#include "lib/comm/mpi_transport.h"

#include <algorithm>
#include <climits>
#include <vector>

#include "lib/core/error.h"

namespace dflash::comm {

namespace {

constexpr size_t kPiece = size_t(1) << 30;  // elements per MPI call: below INT_MAX

void check(int rc, const char* what, int rank) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  DFLASH_FAIL("{} failed on rank {}: {}", what, rank, std::string(msg, size_t(len)));
}

class MpiRequest final : public Request::Impl {
 public:
  std::vector<MPI_Request> reqs;
  int rank = 0;
  void wait() override {
    check(MPI_Waitall(int(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE), "MPI_Waitall", rank);
    reqs.clear();
  }
  bool test() override {
    int done = 0;
    check(MPI_Testall(int(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall", rank);
    return done != 0;
  }
  void cancel() override {
    for (MPI_Request& r : reqs)
      if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);  // completes at once for an unmatched receive
    check(MPI_Waitall(int(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE), "MPI_Waitall (cancel)", rank);
    reqs.clear();
  }
};

}  // namespace

MpiTransport::MpiTransport(MPI_Comm comm) : comm_(comm) {
  DFLASH_CHECK(comm != MPI_COMM_NULL, "MpiTransport: null communicator (this rank has no such role)");
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &size_);
}

void MpiTransport::allreduce_sum(float* data, size_t n) {
  for (size_t off = 0; off < n; off += kPiece) {
    check(MPI_Allreduce(MPI_IN_PLACE, data + off, int(std::min(kPiece, n - off)), MPI_FLOAT, MPI_SUM, comm_),
          "MPI_Allreduce(float)", rank_);
  }
}

void MpiTransport::allreduce_sum(double* data, size_t n) {
  for (size_t off = 0; off < n; off += kPiece) {
    check(MPI_Allreduce(MPI_IN_PLACE, data + off, int(std::min(kPiece, n - off)), MPI_DOUBLE, MPI_SUM, comm_),
          "MPI_Allreduce(double)", rank_);
  }
}

void MpiTransport::broadcast_bytes(void* data, size_t bytes, int root) {
  auto* p = static_cast<char*>(data);
  for (size_t off = 0; off < bytes; off += kPiece) {
    check(MPI_Bcast(p + off, int(std::min(kPiece, bytes - off)), MPI_BYTE, root, comm_), "MPI_Bcast", rank_);
  }
}

// Large messages go as consecutive pieces with the same tag: MPI keeps their order between one pair of ranks.
void MpiTransport::send_bytes(const void* data, size_t bytes, int dest, int tag) {
  isend_bytes(data, bytes, dest, tag).wait();
}

void MpiTransport::recv_bytes(void* data, size_t bytes, int src, int tag) { irecv_bytes(data, bytes, src, tag).wait(); }

Request MpiTransport::isend_bytes(const void* data, size_t bytes, int dest, int tag) {
  auto r = std::make_unique<MpiRequest>();
  r->rank = rank_;
  const auto* p = static_cast<const char*>(data);
  size_t off = 0;
  do {  // a zero-byte message is still one message
    const size_t n = std::min(kPiece, bytes - off);
    r->reqs.emplace_back();
    check(MPI_Isend(p + off, int(n), MPI_BYTE, dest, tag, comm_, &r->reqs.back()), "MPI_Isend", rank_);
    off += n;
  } while (off < bytes);
  return Request(std::move(r));
}

Request MpiTransport::irecv_bytes(void* data, size_t bytes, int src, int tag) {
  auto r = std::make_unique<MpiRequest>();
  r->rank = rank_;
  auto* p = static_cast<char*>(data);
  size_t off = 0;
  do {
    const size_t n = std::min(kPiece, bytes - off);
    r->reqs.emplace_back();
    check(MPI_Irecv(p + off, int(n), MPI_BYTE, src, tag, comm_, &r->reqs.back()), "MPI_Irecv", rank_);
    off += n;
  } while (off < bytes);
  return Request(std::move(r));
}

void MpiTransport::barrier() { check(MPI_Barrier(comm_), "MPI_Barrier", rank_); }

bool MpiTransport::probe(int src, int tag) {
  int flag = 0;
  check(MPI_Iprobe(src < 0 ? MPI_ANY_SOURCE : src, tag, comm_, &flag, MPI_STATUS_IGNORE), "MPI_Iprobe", rank_);
  return flag != 0;
}

}  // namespace dflash::comm
