// dflash_bench stream: the feature stream and the TP all-reduce on one data plane, measured, and the same moved
// to 8 GPUs, modelled. An MPI program: `mpirun -np K dflash_bench stream [--plane mpi|nccl]` runs world ranks
// [0, K-1) as one target TP group and rank K-1 as its drafter, with the trainer's PacketSender / PacketReceiver
// (the back-pressure window and receive depth `--in-flight`). Measured:
//   - packet throughput: bytes the drafter received / the time from the first send to the last packet taken;
//   - the drafter's waiting share: time in PacketReceiver::next / total, with `--drafter-ms` of simulated compute
//     per packet (a sleep: the cores stay free for the transfer, as a GPU drafter's would);
//   - the TP all-reduce per target layer (K-1 ≥ 2): two row-parallel all-reduces of S × H floats (attention output
//     and MLP down projection), the target forward's pattern, best of `--reps`.
// Packets carry taps [S, n_taps·H] and final hidden [S, H] as float32 (the trainer's FeaturePacket); the seed's
// bf16 size is printed beside it. Modelled (labelled so): the same bytes over links of `--link-gbs` (default 450
// GB/s: NVLink 4 per direction on H100/H200) and `--pcie-gbs` (default 55 GB/s: PCIe 5 x16 achievable), for a
// drafter fed by a 5-rank TP group (the drafter's ingress limits) and a ring all-reduce over the TP group.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "lib/comm/mpi_init.h"
#include "apps/dflash_bench/bench.h"
#include "kernels/backend.h"
#include "lib/comm/data_plane.h"
#include "lib/comm/layout.h"
#include "lib/comm/mpi_transport.h"
#include "lib/comm/nccl_transport.h"
#include "lib/core/cli_app.h"
#include "lib/core/error.h"
#include "lib/core/timer.h"
#include "lib/train/packet.h"

namespace dflash::bench {

namespace {

struct StreamResult {
  double seconds = 0, wait_seconds = 0, bytes = 0;
};

}  // namespace

int run_stream(int argc, char** argv) {
  CliApp app("The feature stream and the TP all-reduce on one data plane, measured (mpirun -np K: ranks [0, K-1) one "
             "target TP group, rank K-1 its drafter), and the same moved to 8 GPUs, modelled.", "dflash_bench stream");
  comm::TransportChoice requested = comm::TransportChoice::mpi;
  int S = 8192, H = 5120, n_taps = 5, packets = 6, in_flight = 2, reps = 3, model_tp = 5;
  double drafter_ms = 0, link_gbs = 450, pcie_gbs = 55;
  add_named_option(app, "--plane", requested, "the data plane",
                   {comm::TransportChoice::mpi, comm::TransportChoice::nccl});
  app.add_option("--seq", S, "sequence length S of a packet")->check(positive_number());
  app.add_option("--hidden", H, "hidden size H")->check(positive_number());
  app.add_option("--taps", n_taps, "tapped layers")->check(positive_number());
  app.add_option("--packets", packets, "packets sent")->check(positive_number());
  app.add_option("--in-flight", in_flight, "the back-pressure window and receive depth")->check(positive_number());
  app.add_option("--drafter-ms", drafter_ms, "simulated drafter compute per packet (a sleep)")
      ->check(non_negative_number());
  app.add_option("--reps", reps, "all-reduce repetitions (best of)")->check(positive_number());
  app.add_option("--link-gbs", link_gbs, "modelled: GPU link GB/s (NVLink 4 per direction)")
      ->check(positive_number());
  app.add_option("--pcie-gbs", pcie_gbs, "modelled: PCIe GB/s (PCIe 5 x16 achievable)")->check(positive_number());
  app.add_option("--target-tp", model_tp, "modelled: the TP group size")->check(positive_number());
  if (!parse_command_line(app, argc, argv)) return 0;
  return comm::run_mpi_program({"dflash_bench stream"}, argc, argv, [&](bool) {
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    DFLASH_USER_CHECK(size >= 2, "dflash_bench stream: run with mpirun -np K, K ≥ 2 (K-1 target ranks, 1 drafter)");
    const int tp = size - 1;
    const comm::RankLayout layout = comm::make_rank_layout(tp, 1, 1, size, rank);
    comm::DataPlane plane = comm::DataPlane::Mpi;
    if (requested == comm::TransportChoice::nccl) {
      plane = comm::choose_data_plane(requested, true, comm::nccl_built(), comm::node_shape(MPI_COMM_WORLD));
      kernels::bind_cuda_device(comm::node_local_rank(MPI_COMM_WORLD));
    }
    comm::RoleComms comms(layout, MPI_COMM_WORLD, plane, /*timeout_seconds=*/600);
    comm::MpiTransport world(comms.world());
    const int tap_width = n_taps * H;
    const double packet_bytes = double(S) * (double(tap_width) + H) * sizeof(float) + double(S) * 5;

    // ---- the stream ----
    StreamResult r;
    MPI_Barrier(MPI_COMM_WORLD);
    Timer total;
    // the tensors where the trainer keeps them: on the GPU with the nccl plane, else on the host
    const MemoryKind memory = train::packet_memory(comms.plane() == comm::DataPlane::Nccl, comms.world_data());
    if (layout.role == comm::Role::Target) {
      comm::MpiTransport tp_control(comms.tp());
      train::PacketSender sender(world, comms.world_data(), in_flight, memory);
      std::vector<float> fill;
      for (int k = 0; k < packets; ++k) {
        train::PacketHeader h;
        h.seq_index = k;
        h.step = k;
        h.seq_len = S;
        h.tap_width = tap_width;
        h.hidden = H;
        train::FeaturePacket p = sender.blank(h);
        for (int i = 0; i < S; ++i) p.tokens[size_t(i)] = i, p.loss_mask[size_t(i)] = 1;
        fill.assign(p.taps.size(), float(k));  // writes every element, as the forward would
        p.taps.assign(fill.data(), fill.size());
        p.final_hidden.assign(fill.data(), p.final_hidden.size());
        sender.send(std::move(p), layout.drafter_world_rank(0), layout.tp_rank, tp);
      }
      sender.finish(tp_control, packets - 1, {layout.drafter_world_rank(0)});
    } else {
      int k_plan = 0;
      auto plans = [&]() -> std::optional<train::PacketPlan> {
        if (k_plan == packets) return std::nullopt;
        train::PacketPlan p;
        p.seq_index = k_plan;
        p.step = k_plan;
        p.seq_len = S;
        ++k_plan;
        return p;
      };
      std::vector<int> sources;
      for (int t = 0; t < tp; ++t) sources.push_back(layout.target_world_rank(0, t));
      train::PacketReceiver receiver(world, comms.world_data(), sources, tap_width, H, in_flight, plans, memory);
      for (int k = 0; k < packets; ++k) {
        const train::FeaturePacket& p = receiver.next(&r.wait_seconds);
        float first = -1, last = -1;  // two elements, from wherever the packet lives
        copy_bytes(&first, MemoryKind::host, p.taps.data() + size_t(k) % p.taps.size(), memory, sizeof(float));
        copy_bytes(&last, MemoryKind::host, p.final_hidden.data() + p.final_hidden.size() - 1, memory, sizeof(float));
        DFLASH_CHECK(first == float(k) && last == float(k), "packet {} arrived with the wrong content", k);
        r.bytes += packet_bytes;
        if (drafter_ms > 0) usleep(useconds_t(drafter_ms * 1000));
      }
      r.seconds = total.seconds();
      receiver.finish(packets, layout.target_world_rank(0, 0));
    }

    // ---- the TP all-reduce of one target layer (two S × H all-reduces) ----
    double allreduce_best = -1;
    if (layout.role == comm::Role::Target && tp >= 2) {
      std::vector<float> x(size_t(S) * H, 1.0f);
      comm::Transport& tpd = comms.tp_data();
      for (int i = 0; i < reps + 1; ++i) {  // the first is a warm-up
        tpd.barrier();
        Timer t;
        tpd.allreduce_sum(x.data(), x.size());
        tpd.allreduce_sum(x.data(), x.size());
        const double s = t.seconds();
        if (i > 0) allreduce_best = allreduce_best < 0 ? s : std::min(allreduce_best, s);
      }
    }
    double stream[3] = {r.seconds, r.wait_seconds, r.bytes};
    MPI_Bcast(stream, 3, MPI_DOUBLE, layout.drafter_world_rank(0), MPI_COMM_WORLD);

    if (rank == 0) {
      const double gb = 1e9, seed_bytes = double(S) * n_taps * H * 2;
      std::printf("dflash_bench stream: %s data plane, %d target rank(s) -> 1 drafter, %d packets of S %d, %d taps x H "
                  "%d (%.3f GB each as float32 taps + final hidden; the seed's bf16 taps alone: %.3f GB), %d in "
                  "flight, drafter compute %.0f ms/packet\n",
                  comm::data_plane_name(plane), tp, packets, S, n_taps, H, packet_bytes / gb, seed_bytes / gb,
                  in_flight, drafter_ms);
      std::printf("| what | value | how |\n| --- | --- | --- |\n");
      std::printf("| packet throughput | %.2f GB/s | measured (%s, this machine) |\n", stream[2] / stream[0] / gb,
                  comm::data_plane_name(plane));
      std::printf("| drafter waiting share | %.0f%% | measured: wait in next() / total %.2f s |\n",
                  100 * stream[1] / stream[0], stream[0]);
      const double compute = packets * drafter_ms / 1e3;
      std::printf("| drafter receive overhead share | %.0f%% | measured: the rest of the total less %.2f s of "
                  "compute: allocating the next packets' buffers and posting their receives (MPI also copies pending "
                  "transfers inside these calls) |\n",
                  100 * std::max(0.0, stream[0] - stream[1] - compute) / stream[0], compute);
      if (allreduce_best >= 0)
        std::printf("| TP all-reduce per target layer | %.1f ms | measured: 2 x all-reduce of [%d, %d] float32 over "
                    "%d ranks, best of %d |\n", 1e3 * allreduce_best, S, H, tp, reps);
      // modelled: a 5-rank TP group feeding one drafter: the drafter's ingress link carries the whole packet;
      // a ring all-reduce moves 2 (n-1)/n of the buffer through each rank's link
      const double ring = 2.0 * (model_tp - 1) / model_tp * double(S) * H * sizeof(float) * 2;
      for (const auto& [name, bw] : {std::pair<const char*, double>{"NVLink", link_gbs}, {"PCIe", pcie_gbs}}) {
        std::printf("| packet time, 8 GPUs over %s | %.1f ms (%.1f ms for bf16 taps) | modelled: packet bytes / %.0f "
                    "GB/s drafter ingress |\n", name, 1e3 * packet_bytes / (bw * gb),
                    1e3 * (seed_bytes + double(S) * H * 2) / (bw * gb), bw);
        std::printf("| TP all-reduce per layer, %d GPUs over %s | %.1f ms (%.1f ms in bf16) | modelled: ring, 2 x "
                    "2(n-1)/n x [%d, %d] / %.0f GB/s |\n", model_tp, name, 1e3 * ring / (bw * gb),
                    1e3 * ring / 2 / (bw * gb), S, H, bw);
      }
    }
    return 0;
  });
}

}  // namespace dflash::bench
