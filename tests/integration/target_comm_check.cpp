// target_comm_check: the rank layout, role communicators and MpiTransport under mpirun.
//
//   mpirun -np 8 target_comm_check --tp 5 --groups 1 --dp 3      layout + every Transport call, checked values
//   mpirun -np 3 target_comm_check --tp 5 --groups 1 --dp 3 --expect-mismatch
//                                    the layout must refuse the world size on every rank with the expected message
// Exit 0 when every check holds on every rank; a failed check prints it and exits 1; an exception aborts the world.
#include "lib/comm/mpi_transport.h"
#include "tests/integration/mpi_test_main.h"

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "lib/comm/layout.h"
#include "lib/core/cli_app.h"
#include "lib/core/error.h"

using namespace dflash;

namespace {

int failures = 0;
void expect(bool ok, const std::string& what, int rank) {
  if (!ok) {
    std::fprintf(stderr, "[rank %d] FAILED: %s\n", rank, what.c_str());
    ++failures;
  }
}

// all-reduce, broadcast, ring send/recv (blocking and non-blocking, typed and bytes) inside one communicator
void check_transport(comm::Transport& t, const std::string& name, int world_rank) {
  const int r = t.rank(), n = t.size();
  std::vector<float> f = {float(r), 1.f, float(r * r)};
  t.allreduce_sum(f.data(), f.size());
  const float s1 = float(n * (n - 1) / 2), s2 = float((n - 1) * n * (2 * n - 1) / 6);
  expect(f[0] == s1 && f[1] == float(n) && f[2] == s2, name + " allreduce_sum(float)", world_rank);
  std::vector<double> d = {0.5 * r, -1.0};
  t.allreduce_sum(d.data(), d.size());
  expect(d[0] == 0.5 * s1 && d[1] == -n, name + " allreduce_sum(double)", world_rank);

  const int root = n - 1;
  std::vector<int32_t> b(5, r == root ? 42 : -1);
  t.broadcast(b.data(), b.size(), root);
  expect(b == std::vector<int32_t>(5, 42), name + " broadcast", world_rank);
  if (n == 1) return;

  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  // non-blocking ring: post the receive, send, wait both
  std::vector<double> out(1000, double(r)), in(1000, -1);
  comm::Request rr = t.irecv(in.data(), in.size(), prev, 7);
  comm::Request sr = t.isend(out.data(), out.size(), next, 7);
  sr.wait();
  rr.wait();
  expect(in == std::vector<double>(1000, double(prev)) && !rr.pending(), name + " isend/irecv ring", world_rank);
  // blocking, bytes, zero-length message: even ranks send first so that the ring cannot deadlock
  char msg[16] = {}, got[16] = {};
  std::snprintf(msg, sizeof msg, "from %d", r);
  if (r % 2 == 0) {
    t.send_bytes(msg, sizeof msg, next, 8);
    t.recv_bytes(got, sizeof got, prev, 8);
  } else {
    t.recv_bytes(got, sizeof got, prev, 8);
    t.send_bytes(msg, sizeof msg, next, 8);
  }
  expect(std::string(got) == "from " + std::to_string(prev), name + " send/recv bytes", world_rank);
  comm::Request z = t.irecv_bytes(nullptr, 0, prev, 9);
  t.isend_bytes(nullptr, 0, next, 9).wait();
  z.wait();
  t.barrier();
}

int run(int argc, char** argv) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  CliApp app("The rank layout, role communicators and MpiTransport.", "target_comm_check");
  int tp = 5, groups = 1, dp = 3;
  bool expect_mismatch = false;
  app.add_option("--tp", tp, "target TP size")->check(positive_number());
  app.add_option("--groups", groups, "target groups")->check(positive_number());
  app.add_option("--dp", dp, "drafter ranks")->check(positive_number());
  app.add_flag("--expect-mismatch", expect_mismatch, "the world size does not fit the layout: expect the message");
  if (!parse_command_line(app, argc, argv)) return 0;
  if (expect_mismatch) {
    std::string msg;
    try {
      comm::make_rank_layout(tp, groups, dp, world, rank);
    } catch (const Error& e) {
      msg = e.what();
    }
    expect(msg.find("the world has " + std::to_string(world) + " ranks") != std::string::npos &&
               msg.find("mpirun -np " + std::to_string(tp * groups + dp)) != std::string::npos,
           "world-size mismatch error, got: '" + msg + "'", rank);
  } else {
    const comm::RankLayout l = comm::make_rank_layout(tp, groups, dp, world, rank);
    comm::RoleComms comms(l, MPI_COMM_WORLD);
    int size = 0, r = 0;
    if (l.role == comm::Role::Target) {
      expect(comms.tp() != MPI_COMM_NULL && comms.dp() == MPI_COMM_NULL, "target has only a TP communicator", rank);
      MPI_Comm_size(comms.tp(), &size);
      MPI_Comm_rank(comms.tp(), &r);
      expect(size == tp && r == l.tp_rank && l.target_world_rank(l.group, l.tp_rank) == rank, "TP communicator",
             rank);
      comm::MpiTransport t(comms.tp());
      check_transport(t, "tp", rank);
    } else {
      expect(comms.dp() != MPI_COMM_NULL && comms.tp() == MPI_COMM_NULL, "drafter has only a DP communicator", rank);
      MPI_Comm_size(comms.dp(), &size);
      MPI_Comm_rank(comms.dp(), &r);
      expect(size == dp && r == l.dp_rank && l.drafter_world_rank(l.dp_rank) == rank, "DP communicator", rank);
      comm::MpiTransport t(comms.dp());
      check_transport(t, "dp", rank);
    }
    // a target group and the drafters it feeds talk on the world: every drafter receives its group's tp-rank-0 id
    comm::MpiTransport w(MPI_COMM_WORLD);
    check_transport(w, "world", rank);
    if (l.role == comm::Role::Target && l.tp_rank == 0) {
      for (int d : l.drafters_of_group(l.group)) {
        const int32_t g = l.group;
        w.send(&g, 1, l.drafter_world_rank(d), 11);
      }
    } else if (l.role == comm::Role::Drafter) {
      int32_t g = -1;
      w.recv(&g, 1, l.target_world_rank(l.group, 0), 11);
      expect(g == l.group && l.dp_rank % groups == g, "drafter fed by group d % target_groups", rank);
    }
    if (rank == 0) std::printf("target_comm_check: %s … layout %d×%d + %d\n", l.describe().c_str(), tp, groups, dp);
  }
  int bad = failures, total = 0;
  MPI_Allreduce(&bad, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) std::printf("target_comm_check: %d failed checks over %d ranks\n", total, world);
  return total == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) { return dflash::test::mpi_test_main("target_comm_check", argc, argv, run); }
