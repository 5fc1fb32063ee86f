// dflash_bench target: tokens/s of the TP target forward by TP size, and the wall time spent in the row-parallel
// all-reduces. An MPI program: `mpirun -np K dflash_bench target [--tp 1,2,3,5]` runs each TP size in the list
// (≤ K) on ranks [0, tp) while the other ranks sleep, and rank 0 prints one markdown table.
#include "lib/comm/mpi_transport.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "apps/dflash_bench/bench.h"
#include "lib/core/args.h"
#include "lib/core/error.h"
#include "lib/core/memory.h"
#include "lib/core/rng.h"
#include "lib/core/timer.h"
#include "lib/model/random_target.h"
#include "lib/model/target.h"

namespace dflash::bench {

namespace {

// Waits for every world rank without spinning: idle ranks must not steal cores from the ranks being timed.
void quiet_barrier() {
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  int done = 0;
  while (true) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    ::usleep(1000);
  }
}

// FLOPs of one full-model forward over S tokens (GEMMs and attention; norms and RoPE are O(S·H) and left out)
double forward_flops(const model::QwenConfig& c, int S) {
  const double H = c.hidden, qd = double(c.heads) * c.head_dim, kvd = double(c.kv_heads) * c.head_dim;
  const double linear = 2.0 * S * H * (qd + 2 * kvd) + 2.0 * S * qd * H + 3 * 2.0 * S * H * c.intermediate;
  const double attention = 2 * 2.0 * c.heads * c.head_dim * (double(S) * (S + 1) / 2);
  return c.layers * (linear + attention);
}

int bench(int argc, char** argv) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  Args a(argc, argv,
         {"model", "tp", "seq", "reps", "hidden", "layers", "heads", "kv-heads", "head-dim", "intermediate", "vocab",
          "dtype", "seed"},
         {},
         "mpirun -np K dflash_bench target [--tp 1,2,3,5] [--seq 512] [--reps 3] [--model DIR | --hidden 512\n"
         "       --layers 4 --heads 16 --kv-heads 8 --head-dim 32 --intermediate 1536 --vocab 4096 --dtype bf16]\n"
         "TP target forward tokens/s and all-reduce time for each TP size that fits the ranks.\n");
  std::vector<int> tps;
  {
    std::stringstream ss(a.str("tp", "1,2,3,5"));
    std::string part;
    while (std::getline(ss, part, ',')) {
      const int tp = std::stoi(part);
      DFLASH_USER_CHECK(tp >= 1, "--tp: sizes must be ≥ 1, got {}", tp);
      if (tp <= world) tps.push_back(tp);
    }
  }
  DFLASH_USER_CHECK(!tps.empty(), "--tp {}: no size fits in the {} ranks of this run (mpirun -np K)", a.str("tp", ""),
               world);
  const int S = int(a.integer("seq", 512)), reps = int(a.integer("reps", 3));

  std::string dir = a.str("model", "");
  const bool own_model = dir.empty();
  if (own_model) {
    int pid = int(::getpid());
    MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
    dir = (std::filesystem::temp_directory_path() / ("dflash_bench_target_" + std::to_string(pid))).string();
    if (rank == 0) {
      model::RandomTargetSpec s;
      s.hidden = int(a.integer("hidden", 512));
      s.layers = int(a.integer("layers", 4));
      s.heads = int(a.integer("heads", 16));
      s.kv_heads = int(a.integer("kv-heads", 8));
      s.head_dim = int(a.integer("head-dim", 32));
      s.intermediate = int(a.integer("intermediate", 1536));
      s.vocab = int(a.integer("vocab", 4096));
      s.seed = uint64_t(a.integer("seed", 1));
      s.dtype = a.str("dtype", "bf16") == "f32" ? io::DType::F32 : io::DType::BF16;
      model::write_random_target(dir, s);
    }
  }
  quiet_barrier();
  const model::QwenConfig c = model::load_qwen_config(dir);
  double sgemm = 0;
  if (rank == 0) sgemm = sgemm_gflops(S, c.hidden, c.hidden);
  quiet_barrier();

  if (rank == 0) {
    std::printf("target forward: H %d, %d layers, %d/%d heads × %d, intermediate %d, S %d, %d reps, %d world ranks; "
                "sgemm %.1f GFLOP/s (1 rank, [%d,%d]·[%d,%d]ᵀ)\n\n",
                c.hidden, c.layers, c.heads, c.kv_heads, c.head_dim, c.intermediate, S, reps, world, sgemm, S,
                c.hidden, c.hidden, c.hidden);
    std::printf("| TP | Q heads per rank | tokens/s | ms / forward | all-reduce ms / forward (share) | "
                "GFLOP/s per rank | vs sgemm | peak RSS MB (rank 0) |\n|---:|---|---:|---:|---:|---:|---:|---:|\n");
    std::fflush(stdout);
  }
  std::vector<int32_t> tokens(static_cast<size_t>(S));
  Rng rng(5);
  for (auto& t : tokens) t = int32_t(rng.below(uint64_t(c.vocab)));
  const std::vector<int> tap_ids = {0, c.layers - 1};

  for (int tp : tps) {
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, rank < tp ? 0 : MPI_UNDEFINED, rank, &comm);
    if (comm != MPI_COMM_NULL) {
      comm::MpiTransport transport(comm);
      model::TargetModel target(dir, transport);
      std::vector<float> taps(size_t(S) * tap_ids.size() * c.hidden), final_hidden(size_t(S) * c.hidden);
      target.forward(tokens.data(), S, tap_ids, taps.data(), final_hidden.data());  // warm-up
      target.reset_stats();
      transport.barrier();
      for (int r = 0; r < reps; ++r) target.forward(tokens.data(), S, tap_ids, taps.data(), final_hidden.data());
      const double mine[2] = {target.stats().forward_seconds, target.stats().allreduce_seconds};
      double worst[2] = {0, 0}, sum[2] = {0, 0};
      MPI_Reduce(mine, worst, 2, MPI_DOUBLE, MPI_MAX, 0, comm);
      MPI_Reduce(mine, sum, 2, MPI_DOUBLE, MPI_SUM, 0, comm);
      std::string heads;
      for (int r = 0; r < tp; ++r) {
        if (r) heads += ',';
        heads += std::to_string(model::plan_target_shard(c, tp, r, model::TargetOptions{}.mlp_grain).q_count);
      }
      if (rank == 0) {
        const double t = worst[0] / reps, ar = sum[1] / tp / reps;  // slowest rank's forward; mean all-reduce wait
        const double per_rank = forward_flops(c, S) / t / tp * 1e-9;
        std::printf("| %d | %s | %.0f | %.1f | %.1f (%.0f%%) | %.1f | %.2f | %.0f |\n", tp, heads.c_str(), S / t,
                    t * 1e3, ar * 1e3, 100 * ar / t, per_rank, per_rank / sgemm, peak_resident_bytes() / 1e6);
        std::fflush(stdout);
      }
      MPI_Comm_free(&comm);
    }
    quiet_barrier();
  }
  if (own_model && rank == 0) std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace

int run_target(int argc, char** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) MPI_Init(nullptr, nullptr);
  int rc = 1;
  try {
    rc = bench(argc, argv);
  } catch (const std::exception& e) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::fprintf(stderr, "[rank %d] dflash_bench target: error: %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (!initialized) MPI_Finalize();
  return rc;
}

}  // namespace dflash::bench
