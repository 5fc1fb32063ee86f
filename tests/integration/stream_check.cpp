// Feature streaming keeps order and content: under mpirun, a target TP group streams packets of sequences of
// varied lengths to its drafter ranks through PacketSender / PacketReceiver (the trainer's code, with the
// back-pressure window and prefetch); every drafter checks that each packet's header is the one it planned and
// that its taps and final hidden equal a single-process target forward of the same tokens:
//   max |received − single| / max |single| ≤ 1e-5 per tensor (TP splits the reductions differently),
// and that tokens and loss mask arrived exactly. Exit 0 only when every check on every rank passed.
// Every run ends with the trainer's stop protocol (packet.h): with --stop-after K < packets the drafters stop after
// K packets and 0.5 s while the target is still producing; the target must notice, answer with its last step, and
// every rank must finish (no unmatched send or receive, no hang), each drafter dropping at least one packet and at
// most the packets sent past K.
// --wrong-len K: drafter 0 plans a wrong length for packet K; it must fail with "feature stream out of order".
// --plane picks the data plane (lib/comm/data_plane.h) the tensors travel on; the headers always go over MPI.
// mpi_nocancel is MPI behaving as NCCL does for the protocol: receives cannot be cancelled (a cancel fails the
// test), so the receiver must post a packet's data only after its header (the nccl path, checked on any machine).
// nccl needs a GPU per rank: without NCCL in the build or with fewer GPUs than ranks on the node, every rank
// exits 77 (ctest: skipped) with the reason.
// --drafter-memory device: the drafters take their packets in GPU memory, as a GPU drafter does (over mpi: received
// into page-locked staging and uploaded on the receiver's copy stream; ranks may share a GPU). Without a CUDA device
// every rank exits 77 with the reason.
//   mpirun -np 7 stream_check --dir DIR --tp 5 --dp 2 [--packets 6] [--stop-after K] [--wrong-len K]
//          [--plane mpi|mpi_nocancel|nccl] [--drafter-memory host|device]
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <optional>
#include <vector>

#include "lib/comm/mpi_init.h"
#include "kernels/backend.h"
#include "lib/comm/data_plane.h"
#include "lib/comm/layout.h"
#include "lib/comm/nccl_transport.h"
#include "lib/comm/mpi_transport.h"
#include "lib/core/cli_app.h"
#include "lib/core/error.h"
#include "lib/core/rng.h"
#include "lib/model/random_target.h"
#include "lib/model/target.h"
#include "lib/train/packet.h"

using namespace dflash;

namespace {

// The k-th sequence sent to drafter d: length and tokens are pure functions of (d, k).
int seq_len_of(int d, int k) { return 5 + (7 * d + 13 * k) % 40; }
std::vector<int32_t> tokens_of(int d, int k, int vocab) {
  Rng rng(99, uint64_t(d) * 1000 + k);
  std::vector<int32_t> t(seq_len_of(d, k));
  for (auto& x : t) x = int32_t(rng.below(vocab));
  return t;
}
std::vector<uint8_t> mask_of(int d, int k) {
  std::vector<uint8_t> m(seq_len_of(d, k));
  for (size_t i = 0; i < m.size(); ++i) m[i] = uint8_t((i + d + k) % 3 != 0);
  return m;
}

// MPI as the protocol sees NCCL: posted receives cannot be withdrawn (cancellable_receives() false; cancel throws).
class NoCancelTransport final : public comm::Transport {
 public:
  explicit NoCancelTransport(comm::Transport& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void allreduce_sum(float* d, size_t n) override { inner_.allreduce_sum(d, n); }
  void allreduce_sum(double* d, size_t n) override { inner_.allreduce_sum(d, n); }
  void broadcast_bytes(void* d, size_t b, int root) override { inner_.broadcast_bytes(d, b, root); }
  void send_bytes(const void* d, size_t b, int dest, int tag) override { inner_.send_bytes(d, b, dest, tag); }
  void recv_bytes(void* d, size_t b, int src, int tag) override { inner_.recv_bytes(d, b, src, tag); }
  comm::Request isend_bytes(const void* d, size_t b, int dest, int tag) override {
    return wrap(inner_.isend_bytes(d, b, dest, tag));
  }
  comm::Request irecv_bytes(void* d, size_t b, int src, int tag) override {
    return wrap(inner_.irecv_bytes(d, b, src, tag));
  }
  void barrier() override { inner_.barrier(); }
  bool probe(int, int) override { DFLASH_FAIL("probe() on the data plane (NCCL has none)"); }
  bool cancellable_receives() const override { return false; }

 private:
  struct Impl final : comm::Request::Impl {
    comm::Request inner;
    void wait() override { inner.wait(); }
    bool test() override { return inner.test(); }
    void cancel() override { DFLASH_FAIL("a data-plane receive was cancelled: NCCL cannot withdraw one"); }
  };
  static comm::Request wrap(comm::Request r) {
    auto impl = std::make_unique<Impl>();
    impl->inner = std::move(r);
    return comm::Request(std::move(impl));
  }
  comm::Transport& inner_;
};

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, double(std::abs(a[i] - b[i])));
    ref = std::max(ref, double(std::abs(b[i])));
  }
  return ref > 0 ? diff / ref : diff;
}

}  // namespace

int main(int argc, char** argv) {
  CliApp app("The feature stream from a target TP group to the drafters keeps order and content.", "stream_check");
  std::string dir, plane_name = "mpi", drafter_memory = "host";
  int tp_size = 5, dp = 2, packets = 6, wrong_len = -1;
  std::optional<int> stop_after_given;  // default: every packet
  app.add_option("--dir", dir, "scratch folder")->required()->type_name("DIR");
  app.add_option("--tp", tp_size, "target TP size")->check(positive_number());
  app.add_option("--dp", dp, "drafter ranks")->check(positive_number());
  app.add_option("--packets", packets, "packets per drafter")->check(non_negative_number());
  app.add_option("--stop-after", stop_after_given, "stop after this many packets")->check(non_negative_number());
  app.add_option("--wrong-len", wrong_len, "send packet K with a wrong length: expect the receiver's message");
  app.add_option("--plane", plane_name, "the data plane")->check(CLI::IsMember({"mpi", "mpi_nocancel", "nccl"}));
  app.add_option("--drafter-memory", drafter_memory, "where the drafter keeps packets")
      ->check(CLI::IsMember({"host", "device"}));
  if (const std::optional<int> rc = parse_or_exit_code(app, argc, argv)) return *rc;
  const int stop_after = stop_after_given.value_or(packets);
  if (stop_after > packets) {
    std::fprintf(stderr, "stream_check: --stop-after %d outside [0, %d]\n", stop_after, packets);
    return 2;
  }
  return comm::run_mpi_program({"stream_check"}, argc, argv, [&](bool) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int failures = 0;
  {
    const comm::RankLayout layout = comm::make_rank_layout(tp_size, 1, dp, size, rank);
    comm::DataPlane plane = comm::DataPlane::Mpi;
    if (plane_name == "nccl") {
      const comm::NodeShape node = comm::node_shape(MPI_COMM_WORLD);
      if (!comm::nccl_built() || node.max_ranks_per_node > node.min_gpus_per_node) {
        if (rank == 0)
          std::printf("skipped: the nccl data plane needs NCCL in the build (%s) and one GPU per rank (%d ranks on "
                      "a node, %d GPU(s))\n", comm::nccl_built() ? "yes" : "no", node.max_ranks_per_node,
                      node.min_gpus_per_node);
        return 77;
      }
      kernels::bind_cuda_device(comm::node_local_rank(MPI_COMM_WORLD));
      plane = comm::DataPlane::Nccl;
    }
    if (drafter_memory == "device" && plane != comm::DataPlane::Nccl) {
      if (!kernels::cuda_available()) {
        if (rank == 0) std::printf("skipped: --drafter-memory device needs a CUDA device (this build: %s)\n",
                                   comm::nccl_built() ? "CUDA" : "no CUDA");
        return 77;
      }
      kernels::bind_cuda_device(comm::node_local_rank(MPI_COMM_WORLD));
    }
    comm::RoleComms comms(layout, MPI_COMM_WORLD, plane, /*timeout_seconds=*/60);
    comm::MpiTransport world(comms.world());
    NoCancelTransport nocancel(comms.world_data());
    // packets where the trainer keeps them: on the GPU with the nccl plane (device to device), else on the host
    const MemoryKind memory = train::packet_memory(plane == comm::DataPlane::Nccl, comms.world_data());
    const MemoryKind drafter_kind = drafter_memory == "device" ? MemoryKind::device : memory;
    comm::Transport& world_data = plane_name == "mpi_nocancel" ? static_cast<comm::Transport&>(nocancel)
                                                                : comms.world_data();
    if (rank == 0) {
      model::RandomTargetSpec s;  // 16 Q / 8 KV heads: TP 5 splits the KV groups [2,2,2,1,1]
      s.hidden = 32;
      s.layers = 3;
      s.heads = 16;
      s.kv_heads = 8;
      s.head_dim = 8;
      s.intermediate = 64;
      s.vocab = 97;
      s.seed = 5;
      model::write_random_target(dir, s);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const std::vector<int> taps = {0, 2};
    if (layout.role == comm::Role::Target) {
      comm::Transport& tp = comms.tp_data();
      model::TargetModel target(dir, tp);
      const int H = target.config().hidden;
      comm::MpiTransport tp_control(comms.tp());
      train::PacketSender sender(world, world_data, /*max_in_flight=*/2, memory);
      int k = 0;
      for (; k < packets; ++k) {
        if (sender.stop_requested(tp_control)) break;
        for (int d : layout.drafters_of_group(0)) {
          train::PacketHeader h;
          h.seq_index = 1000 * d + k;
          h.step = k;
          h.seq_len = seq_len_of(d, k);
          h.tap_width = int(taps.size()) * H;
          h.hidden = H;
          train::FeaturePacket p = sender.blank(h);
          p.tokens = tokens_of(d, k, target.config().vocab);
          p.loss_mask = mask_of(d, k);
          std::vector<float> t(p.taps.size()), f(p.final_hidden.size());
          target.forward(p.tokens.data(), h.seq_len, taps, t.data(), f.data());
          p.taps.assign(t.data(), t.size());
          p.final_hidden.assign(f.data(), f.size());
          sender.send(std::move(p), layout.drafter_world_rank(d), layout.tp_rank, tp.size());
        }
      }
      std::vector<int> drafter_ranks;
      for (int d : layout.drafters_of_group(0)) drafter_ranks.push_back(layout.drafter_world_rank(d));
      sender.finish(tp_control, k - 1, drafter_ranks);
      if (layout.tp_rank == 0) std::printf("stream_check: the target sent the packets of steps 0..%d\n", k - 1);
    } else {
      comm::SelfTransport self;
      model::TargetModel single(dir, self);
      const int H = single.config().hidden, d = layout.dp_rank;
      int k_plan = 0;
      auto plans = [&]() -> std::optional<train::PacketPlan> {
        if (k_plan == packets) return std::nullopt;
        train::PacketPlan p;
        p.seq_index = 1000 * d + k_plan;
        p.step = k_plan;
        p.seq_len = seq_len_of(d, k_plan) + (d == 0 && k_plan == wrong_len ? 1 : 0);
        ++k_plan;
        return p;
      };
      std::vector<int> sources;
      for (int t = 0; t < tp_size; ++t) sources.push_back(layout.target_world_rank(0, t));
      train::PacketReceiver receiver(world, world_data, sources, int(taps.size()) * H, H, 2, plans, drafter_kind);
      double worst = 0;
      for (int k = 0; k < stop_after; ++k) {
        if (k == 1) usleep(200000);  // a slow drafter: the target must wait (back-pressure), not drop or reorder
        const train::FeaturePacket& p = receiver.next(nullptr);
        if (p.taps.memory() != drafter_kind) {
          std::fprintf(stderr, "drafter %d packet %d: taps in %s memory, expected %s\n", d, k,
                       memory_kind_name(p.taps.memory()), memory_kind_name(drafter_kind));
          ++failures;
        }
        receiver.poll();  // must leave the packet in hand alone
        const int S = seq_len_of(d, k);
        std::vector<float> taps_ref(size_t(S) * taps.size() * H), final_ref(size_t(S) * H);
        single.forward(p.tokens.data(), S, taps, taps_ref.data(), final_ref.data());
        const double e = std::max(rel_err(p.taps.to_host(), taps_ref), rel_err(p.final_hidden.to_host(), final_ref));
        worst = std::max(worst, e);
        if (p.tokens != tokens_of(d, k, single.config().vocab) || p.loss_mask != mask_of(d, k) || e > 1e-5) {
          std::fprintf(stderr, "drafter %d packet %d: tokens %s, mask %s, taps/final rel err %.3e (limit 1e-5)\n", d,
                       k, p.tokens == tokens_of(d, k, single.config().vocab) ? "ok" : "WRONG",
                       p.loss_mask == mask_of(d, k) ? "ok" : "WRONG", e);
          ++failures;
        }
      }
      // stopping early: let the target run ahead first (its window fills), so the stop finds packets in flight
      // that must be drained and dropped, not left unmatched
      if (stop_after < packets) usleep(500000);
      const int dropped = receiver.finish(stop_after, layout.target_world_rank(0, 0));
      if (stop_after < packets && dropped < 1) {
        std::fprintf(stderr, "drafter %d: the target ran 0.5 s ahead of the stop but no packet was dropped\n", d);
        ++failures;
      }
      if (dropped > packets - stop_after) {
        std::fprintf(stderr, "drafter %d: dropped %d packets at the stop, but only %d were sent past step %d\n", d,
                     dropped, packets - stop_after, stop_after - 1);
        ++failures;
      }
      std::printf("stream_check (%s data plane): drafter %d received %d packets in order, stopped, dropped %d; "
                  "worst taps/final rel err %.3e\n", plane_name.c_str(), d, stop_after, dropped, worst);
    }
  }
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  return total == 0 ? 0 : 1;
  });
}
