// Feature streaming keeps order and content: under mpirun, a target TP group streams packets of sequences of
// varied lengths to its drafter ranks through PacketSender / PacketReceiver (the trainer's code, with the
// back-pressure window and prefetch); every drafter checks that each packet's header is the one it planned and
// that its taps and final hidden equal a single-process target forward of the same tokens:
//   max |received − single| / max |single| ≤ 1e-5 per tensor (TP splits the reductions differently),
// and that tokens and loss mask arrived exactly. Exit 0 only when every check on every rank passed.
//   mpirun -np 7 stream_check --dir DIR --tp 5 --dp 2 [--packets 6]
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <optional>
#include <vector>

#include "lib/comm/layout.h"
#include "lib/comm/mpi_transport.h"
#include "lib/core/args.h"
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
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int failures = 0;
  try {
    Args args(argc, argv, {"dir", "tp", "dp", "packets"});
    const std::string dir = args.str("dir", "");
    DFLASH_CHECK(!dir.empty(), "--dir is required");
    const int tp_size = int(args.integer("tp", 5)), dp = int(args.integer("dp", 2));
    const int packets = int(args.integer("packets", 6));
    const comm::RankLayout layout = comm::make_rank_layout(tp_size, 1, dp, size, rank);
    comm::RoleComms comms(layout, MPI_COMM_WORLD);
    comm::MpiTransport world(comms.world());
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
      comm::MpiTransport tp(comms.tp());
      model::TargetModel target(dir, tp);
      const int H = target.config().hidden;
      train::PacketSender sender(world, /*max_in_flight=*/2);
      for (int k = 0; k < packets; ++k)
        for (int d : layout.drafters_of_group(0)) {
          train::FeaturePacket p;
          train::PacketHeader h;
          h.seq_index = 1000 * d + k;
          h.step = k;
          h.seq_len = seq_len_of(d, k);
          h.tap_width = int(taps.size()) * H;
          h.hidden = H;
          p.allocate(h);
          p.tokens = tokens_of(d, k, target.config().vocab);
          p.loss_mask = mask_of(d, k);
          target.forward(p.tokens.data(), h.seq_len, taps, p.taps.data(), p.final_hidden.data());
          sender.send(std::move(p), layout.drafter_world_rank(d), layout.tp_rank, tp.size());
        }
      sender.flush();
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
        p.seq_len = seq_len_of(d, k_plan);
        ++k_plan;
        return p;
      };
      std::vector<int> sources;
      for (int t = 0; t < tp_size; ++t) sources.push_back(layout.target_world_rank(0, t));
      train::PacketReceiver receiver(world, sources, int(taps.size()) * H, H, 2, plans);
      double worst = 0;
      for (int k = 0; k < packets; ++k) {
        if (k == 1) usleep(200000);  // a slow drafter: the target must wait (back-pressure), not drop or reorder
        train::FeaturePacket p = receiver.next(nullptr);
        const int S = seq_len_of(d, k);
        std::vector<float> taps_ref(size_t(S) * taps.size() * H), final_ref(size_t(S) * H);
        single.forward(p.tokens.data(), S, taps, taps_ref.data(), final_ref.data());
        const double e = std::max(rel_err(p.taps, taps_ref), rel_err(p.final_hidden, final_ref));
        worst = std::max(worst, e);
        if (p.tokens != tokens_of(d, k, single.config().vocab) || p.loss_mask != mask_of(d, k) || e > 1e-5) {
          std::fprintf(stderr, "drafter %d packet %d: tokens %s, mask %s, taps/final rel err %.3e (limit 1e-5)\n", d,
                       k, p.tokens == tokens_of(d, k, single.config().vocab) ? "ok" : "WRONG",
                       p.loss_mask == mask_of(d, k) ? "ok" : "WRONG", e);
          ++failures;
        }
      }
      std::printf("stream_check: drafter %d received %d packets in order; worst taps/final rel err %.3e\n", d,
                  packets, worst);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stream_check rank %d: error: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
