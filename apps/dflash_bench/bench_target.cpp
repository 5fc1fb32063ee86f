// dflash_bench target: tokens/s of the TP target forward by TP size and sequence length, the wall time spent in the
// row-parallel all-reduces, and the compute time of each layer part (Gated DeltaNet mixers, full attention mixers,
// MLPs) against the sgemm rate. An MPI program: `mpirun -np K dflash_bench target [--tp 1,2,3,5] [--seq 512,2048]
// [--arch qwen3|qwen3_5|qwen3_moe|qwen3_5_moe]` runs each TP size in the list (≤ K) on ranks [0, tp) while the other
// ranks sleep, and rank 0 prints one markdown table.
// MoE targets (qwen3_moe, qwen3_5_moe): the MLP column is the routed MLP (router, routing on the host, the held
// experts, the shared expert), and three more columns give the experts per rank, the (token, expert) rows each rank
// computed (max / mean over the ranks: the load the router gave them) and the MLP's share of the forward.
// --device cuda [--precision bf16|fp32]: the forward on the GPUs (each rank binds GPU node-local rank mod GPUs;
// ranks may share one). Every row also reports the GEMM bound: the time of rank 0's shard GEMMs alone (every
// linear of one forward at its shape, on the same backend and precision: cuBLASLt on CUDA, BLAS on the CPU), and
// that bound over the forward's time (1.0 = the forward costs only its GEMMs). On CUDA the stream is synchronised
// around each part (TargetOptions::sync_part_timing), so the per-part columns are the GPU's time, and the outputs go
// to device memory as on the NCCL data plane; a line under the row gives the embedding and the outputs.
#include "lib/comm/mpi_init.h"
#include "lib/comm/mpi_transport.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "apps/dflash_bench/bench.h"
#include "lib/core/cli_app.h"
#include "lib/model/random_target_options.h"
#include "lib/core/error.h"
#include "lib/core/memory.h"
#include "lib/core/rng.h"
#include "lib/core/timer.h"
#include "lib/comm/layout.h"
#include "lib/core/buffer.h"
#include "lib/model/random_target.h"
#include "lib/model/target.h"
#include "lib/model/target_shard.h"
#include "kernels/backend.h"

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

// FLOPs of one full-model forward over S tokens by layer part (GEMMs, attention, conv and delta rule; norms, RoPE
// and gates are O(S·H) and left out), summed over all layers of that kind.
struct PartFlops {
  double linear_attention = 0, full_attention = 0, mlp = 0;
  double total() const { return linear_attention + full_attention + mlp; }
};

PartFlops forward_flops(const model::QwenConfig& c, int S) {
  const double H = c.hidden, s = S, qd = double(c.heads) * c.head_dim, kvd = double(c.kv_heads) * c.head_dim;
  // gated attention (hybrids): q_proj yields query and gate, twice the rows
  const double q_rows = c.hybrid ? 2 * qd : qd;
  const double full = 2.0 * s * H * (q_rows + 2 * kvd) + 2.0 * s * qd * H +  // q/k/v and o projections
                      2 * 2.0 * c.heads * c.head_dim * (s * (s + 1) / 2);     // causal QKᵀ and PV
  double linear = 0;
  if (c.hybrid) {
    const double C = c.linear_conv_dim(), nv = c.linear_v_heads, vd = nv * c.linear_v_dim;
    linear = 2.0 * s * H * (C + vd + 2 * nv) + 2.0 * s * vd * H +  // in_proj_qkv/z/b/a and out_proj
             2.0 * s * C * c.conv_kernel +                          // depthwise causal conv
             // delta rule, recurrent form (the least work): per token and value head kᵀM, the rank-1 update of
             // M [dk, dv] and qᵀM, 2·dk·dv each (the chunked kernel adds O(chunk·(dk + dv)) per token)
             6.0 * s * nv * c.linear_k_dim * c.linear_v_dim;
  }
  const double mlp = 3 * 2.0 * s * H * c.intermediate;
  // routed MLP: the router GEMM (and the shared expert's gate row), k experts' SwiGLU per token, the shared expert
  const double shared = c.shared_expert_intermediate;
  const double moe = 2.0 * s * H * (c.experts + (shared > 0 ? 1 : 0)) +
                     3 * 2.0 * s * H * double(c.moe_intermediate) * c.experts_per_token + 3 * 2.0 * s * H * shared;
  PartFlops f;
  for (int l = 0; l < c.layers; ++l) {
    (c.is_linear(l) ? f.linear_attention : f.full_attention) += c.is_linear(l) ? linear : full;
    f.mlp += c.is_moe(l) ? moe : mlp;
  }
  return f;
}

// The linears of one forward on one TP shard (lib/model/target_layers.cpp, target.cpp): y[S, out] = x[S, in] · Wᵀ.
struct GemmShape {
  int in = 0, out = 0, count = 0;  // count: how many such GEMMs one forward runs
  int rows = 0;                    // rows of x; 0 = the sequence length S
};

// MoE layers: the router [S, H]·[E(+1), H]ᵀ, the shared expert over the shard's channels, and each held expert's
// three GEMMs at the rows uniform routing gives it (S·k / E, at least 1): the router's real choice varies around that.
std::vector<GemmShape> shard_gemms(const model::QwenConfig& c, const model::TargetShard& s, int S) {
  std::vector<GemmShape> shapes;
  auto add = [&](int in, int out, int rows = 0) {
    if (in <= 0 || out <= 0) return;
    for (GemmShape& g : shapes)
      if (g.in == in && g.out == out && g.rows == rows) {
        ++g.count;
        return;
      }
    shapes.push_back({in, out, 1, rows});
  };
  const int expert_rows = c.experts > 0 ? std::max(1, int(double(S) * c.experts_per_token / c.experts + 0.5)) : 0;
  const int H = c.hidden, qd = s.q_count * c.head_dim, kvd = s.kv_count * c.head_dim;
  const int ic = int(s.mlp_end - s.mlp_begin);
  const int nk = s.linear.group_count, nv = s.linear.member_count;
  const int qkd = nk * c.linear_k_dim, vd = nv * c.linear_v_dim;
  for (int l = 0; l < c.layers; ++l) {
    if (c.is_linear(l)) {
      add(H, 2 * qkd + vd);  // in_proj_qkv
      add(H, vd);            // in_proj_z
      add(H, nv);            // in_proj_b
      add(H, nv);            // in_proj_a
      add(vd, H);            // out_proj
    } else {
      add(H, c.hybrid ? 2 * qd : qd);  // q_proj (hybrid: query and gate rows)
      add(H, kvd);                     // k_proj
      add(H, kvd);                     // v_proj
      add(qd, H);                      // o_proj
    }
    if (c.is_moe(l)) {
      add(H, c.experts + (c.shared_expert_intermediate > 0 ? 1 : 0));  // router (+ the shared expert's gate)
      for (int e = 0; e < s.expert_count; ++e) {
        add(H, c.moe_intermediate, expert_rows);  // expert gate_proj
        add(H, c.moe_intermediate, expert_rows);  // expert up_proj
        add(c.moe_intermediate, H, expert_rows);  // expert down_proj
      }
      if (c.shared_expert_intermediate <= 0) continue;  // else the shared expert, over the shard's channels (below)
    }
    add(H, ic);  // gate_proj
    add(H, ic);  // up_proj
    add(ic, H);  // down_proj
  }
  return shapes;
}

// Seconds of one forward's GEMMs alone on `be`: each shape timed over `reps` after a warm-up, times its count.
template <typename T>
double gemm_bound_seconds(kernels::Backend<T>& be, const std::vector<GemmShape>& shapes, int S, int reps) {
  ExecContext& ctx = be.context();
  double total = 0;
  for (const GemmShape& g : shapes) {
    const int M = g.rows > 0 ? g.rows : S;
    Buffer x(be.memory(), size_t(M) * g.in * sizeof(T)), w(be.memory(), size_t(g.out) * g.in * sizeof(T)),
        y(be.memory(), size_t(M) * g.out * sizeof(T));
    be.zero(ctx, x.data(), x.bytes());  // values do not change a GEMM's time
    be.zero(ctx, w.data(), w.bytes());
    be.linear_forward(ctx, y.as<T>(), x.as<T>(), w.as<T>(), M, g.in, g.out);  // warm-up (cuBLASLt heuristics)
    be.synchronize(ctx);
    Timer t;
    for (int r = 0; r < reps; ++r) be.linear_forward(ctx, y.as<T>(), x.as<T>(), w.as<T>(), M, g.in, g.out);
    be.synchronize(ctx);
    total += t.seconds() / reps * g.count;
  }
  return total;
}

// The bound on the backend the target runs on (a pair make_backend has: fp32 anywhere, bf16 on CUDA).
double gemm_bound(kernels::Device device, kernels::Precision precision, const std::vector<GemmShape>& shapes, int S,
                  int reps) {
  if (precision == kernels::Precision::bf16)
    return gemm_bound_seconds(*kernels::make_backend<kernels::bf16>(device), shapes, S, reps);
  return gemm_bound_seconds(*kernels::make_backend<float>(device), shapes, S, reps);
}

std::vector<int> int_list(const std::string& option, const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    int v = 0;
    size_t used = 0;
    try {
      v = std::stoi(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    DFLASH_USER_CHECK(used > 0 && used == part.size(),
                      "--{} {}: '{}' is not an integer (a comma-separated list such as 1,2,3)", option, text, part);
    DFLASH_USER_CHECK(v >= 1, "--{}: values must be ≥ 1, got {}", option, v);
    out.push_back(v);
  }
  DFLASH_USER_CHECK(!out.empty(), "--{}: empty list", option);
  return out;
}

// "12.3 (45, 0.40)": ms per forward (GFLOP/s per rank, over sgemm); "—" for a part the model lacks
std::string part_cell(double seconds, double flops, int tp, double sgemm) {
  if (flops <= 0) return "—";
  char buf[64];
  const double rate = seconds > 0 ? flops / seconds / tp * 1e-9 : 0;
  std::snprintf(buf, sizeof buf, "%.1f (%.1f, %.2f)", seconds * 1e3, rate, rate / sgemm);
  return buf;
}

struct TargetBenchOptions {
  std::string tp = "1,2,3,5", seq = "512", model;
  kernels::Device device = kernels::Device::cpu;
  std::optional<kernels::Precision> precision;  // default: kernels::default_precision(device)
  int reps = 3;
};

int bench(const TargetBenchOptions& a, const model::RandomTargetOptions& target_options) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  std::vector<int> tps;
  for (int tp : int_list("tp", a.tp))
    if (tp <= world) tps.push_back(tp);
  DFLASH_USER_CHECK(!tps.empty(), "--tp {}: no size fits in the {} ranks of this run (mpirun -np K)", a.tp, world);
  const std::vector<int> seqs = int_list("seq", a.seq);
  const int reps = a.reps;
  const kernels::Device device = a.device;
  const kernels::Precision precision = a.precision.value_or(kernels::default_precision(device));
  const std::string refusal = kernels::backend_refusal(device, precision);
  DFLASH_USER_CHECK(refusal.empty(), "--precision {} on --device {}: {}", name_of(precision), name_of(device), refusal);
  const bool cuda = device == kernels::Device::cuda;
  if (cuda) kernels::bind_cuda_device(comm::node_local_rank(MPI_COMM_WORLD));

  std::string dir = a.model;
  const bool own_model = dir.empty();
  if (own_model) {
    int pid = int(::getpid());
    MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
    dir = (std::filesystem::temp_directory_path() / ("dflash_bench_target_" + std::to_string(pid))).string();
    if (rank == 0) {
      model::RandomTargetSpec s;  // the bench's default size; hybrid heads sized like Qwen3.5's (dk = dv = 2·32)
      s.hidden = 512;
      s.layers = 4;
      s.heads = 16;
      s.kv_heads = 8;
      s.head_dim = 32;
      s.intermediate = 1536;
      s.vocab = 4096;
      s.dtype = io::DType::BF16;
      s.linear_k_heads = 4;
      s.linear_v_heads = 8;
      s.linear_k_dim = 64;
      s.linear_v_dim = 64;
      // MoE: 16 experts, top 4, whose active width (4 × 384, or 4 × 256 + the shared 512) is the dense default's
      // 1536, so that a MoE row compares with the dense one at the same active FLOPs per token
      const std::string arch = target_options.arch().value_or("qwen3");
      if (arch == "qwen3_moe" || arch == "qwen3_5_moe") {
        s.experts = 16;
        s.experts_per_token = 4;
        s.moe_intermediate = arch == "qwen3_moe" ? 384 : 256;
        s.shared_expert_intermediate = 512;  // qwen3_5_moe only (a Qwen3-MoE has none)
      }
      target_options.apply(s);
      model::write_random_target(dir, s);
    }
  }
  quiet_barrier();
  const model::QwenConfig c = model::load_qwen_config(dir);
  std::vector<double> sgemm(seqs.size(), 0.0);
  if (rank == 0)
    // the CPU's sgemm rate is the yardstick of a CPU run; a cuda run's is its GEMM bound (the column): not measured
    for (size_t i = 0; i < seqs.size(); ++i) sgemm[i] = cuda ? std::nan("") : sgemm_gflops(seqs[i], c.hidden, c.hidden);
  quiet_barrier();

  if (rank == 0) {
    int n_linear = 0;
    for (int l = 0; l < c.layers; ++l) n_linear += c.is_linear(l) ? 1 : 0;
    const bool moe = c.experts > 0;
    std::printf("target forward (%s): H %d, %d layers (%d Gated DeltaNet, %d full attention), %d/%d heads × %d, "
                "intermediate %d, %d reps, %d world ranks",
                c.hybrid ? (moe ? "qwen3_5_moe" : "qwen3_5") : (moe ? "qwen3_moe" : "qwen3"), c.hidden, c.layers,
                n_linear, c.layers - n_linear, c.heads, c.kv_heads, c.head_dim, c.intermediate, reps, world);
    if (c.hybrid)
      std::printf("; DeltaNet %d k / %d v heads × %d/%d, conv %d", c.linear_k_heads, c.linear_v_heads,
                  c.linear_k_dim, c.linear_v_dim, c.conv_kernel);
    if (moe) {
      int n_moe = 0;
      for (int l = 0; l < c.layers; ++l) n_moe += c.is_moe(l) ? 1 : 0;
      std::printf("; experts in %d of %d layers: %d experts, top %d, width %d%s", n_moe, c.layers, c.experts,
                  c.experts_per_token, c.moe_intermediate, c.norm_topk_prob ? " (renormalised)" : "");
      if (c.shared_expert_intermediate > 0) std::printf(", shared expert %d", c.shared_expert_intermediate);
    }
    std::printf("\nsgemm (1 rank, [S,%d]·[%d,%d]ᵀ) GFLOP/s:", c.hidden, c.hidden, c.hidden);
    for (size_t i = 0; i < seqs.size(); ++i) std::printf(" S %d: %.1f", seqs[i], sgemm[i]);
    std::printf("\n%s %s; parts: ms / forward on the slowest rank (GFLOP/s per rank, over sgemm)%s; GEMM bound: "
                "rank 0's shard GEMMs alone on the same backend\n\n",
                name_of(device), name_of(precision), cuda ? " (cuda: the stream synchronised around each part)" : "");
    std::printf("| TP | S | Q heads per rank | tokens/s | ms / forward | all-reduce ms / forward (share) | "
                "DeltaNet mixers | full attention mixers | MLPs | GFLOP/s per rank | vs sgemm | GEMM bound ms | "
                "bound / time | peak RSS MB (rank 0) |%s\n"
                "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|%s\n",
                moe ? " experts per rank | expert rows per rank max / mean | MLP share of forward |" : "",
                moe ? "---|---:|---:|" : "");
    std::fflush(stdout);
  }
  const std::vector<int> tap_ids = {0, c.layers - 1};

  for (int tp : tps) {
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, rank < tp ? 0 : MPI_UNDEFINED, rank, &comm);
    if (comm != MPI_COMM_NULL) {
      comm::MpiTransport transport(comm);
      model::TargetOptions options;
      options.device = device;
      options.precision = precision;
      options.sync_part_timing = cuda;  // each part's time is the GPU's (the stream synchronised around it)
      model::TargetModel target(dir, transport, options);
      const model::TargetShard shard0 = model::plan_target_shard(c, tp, 0, options.mlp_grain);
      std::string heads, experts;
      for (int r = 0; r < tp; ++r) {
        if (r) {
          heads += ',';
          experts += ',';
        }
        const model::TargetShard sr = model::plan_target_shard(c, tp, r, model::TargetOptions{}.mlp_grain);
        heads += std::to_string(sr.q_count);
        experts += std::to_string(sr.expert_count);
      }
      for (size_t si = 0; si < seqs.size(); ++si) {
        const int S = seqs[si];
        std::vector<int32_t> tokens(static_cast<size_t>(S));
        Rng rng(5);
        for (auto& t : tokens) t = int32_t(rng.below(uint64_t(c.vocab)));
        // the outputs where the training job's data plane takes them: device memory on cuda (the NCCL plane),
        // host memory on the CPU
        const MemoryKind out_kind = cuda ? MemoryKind::device : MemoryKind::host;
        Buffer taps(out_kind, size_t(S) * tap_ids.size() * c.hidden * sizeof(float)),
            final_hidden(out_kind, size_t(S) * c.hidden * sizeof(float));
        auto forward = [&] {
          target.forward(tokens.data(), S, tap_ids, taps.as<float>(), final_hidden.as<float>(), out_kind);
        };
        forward();  // warm-up
        target.reset_stats();
        transport.barrier();
        for (int r = 0; r < reps; ++r) forward();
        const model::TargetStats& st = target.stats();
        // after the forwards: the bound runs alone on the GPU (ranks of this group may share one)
        transport.barrier();
        const double bound = rank == 0 ? gemm_bound(device, precision, shard_gemms(c, shard0, S), S, reps) : 0.0;
        enum { kForward, kAllreduce, kLinear, kFull, kMlp, kN };
        const double mine[kN] = {st.forward_seconds, st.allreduce_seconds, st.linear_attention_seconds,
                                 st.full_attention_seconds, st.mlp_seconds};
        double worst[kN] = {}, sum[kN] = {};
        MPI_Reduce(mine, worst, kN, MPI_DOUBLE, MPI_MAX, 0, comm);
        MPI_Reduce(mine, sum, kN, MPI_DOUBLE, MPI_SUM, 0, comm);
        // MoE: the (token, expert) rows each rank's experts computed over the timed forwards
        const long long rows = st.expert_rows;
        long long rows_max = 0, rows_sum = 0;
        MPI_Reduce(&rows, &rows_max, 1, MPI_LONG_LONG, MPI_MAX, 0, comm);
        MPI_Reduce(&rows, &rows_sum, 1, MPI_LONG_LONG, MPI_SUM, 0, comm);
        if (rank == 0) {
          const double t = worst[kForward] / reps, ar = sum[kAllreduce] / tp / reps;  // slowest forward; mean wait
          const PartFlops f = forward_flops(c, S);
          const double per_rank = f.total() / t / tp * 1e-9, g = sgemm[si];
          auto part = [&](double seconds, double flops) { return part_cell(seconds, flops, tp, g); };
          std::printf("| %d | %d | %s | %.0f | %.1f | %.1f (%.0f%%) | %s | %s | %s | %.1f | %.2f | %.2f | %.2f | %.0f |",
                      tp, S, heads.c_str(), S / t, t * 1e3, ar * 1e3, 100 * ar / t,
                      part(worst[kLinear] / reps, f.linear_attention).c_str(),
                      part(worst[kFull] / reps, f.full_attention).c_str(), part(worst[kMlp] / reps, f.mlp).c_str(),
                      per_rank, per_rank / g, bound * 1e3, bound / t, peak_resident_bytes() / 1e6);
          if (c.experts > 0) {
            // rows per forward; the MLP share: the slowest rank's MLP time over the slowest forward (not on cuda,
            // where the parts are launch times)
            const double mean = double(rows_sum) / tp / reps, most = double(rows_max) / reps;
            char share[32];
            std::snprintf(share, sizeof share, "%.0f%%", 100 * worst[kMlp] / worst[kForward]);
            std::printf(" %s | %.0f / %.0f (%.2f) | %s |", experts.c_str(), most, mean, mean > 0 ? most / mean : 0.0,
                        share);
          }
          std::printf("\n");
          if (cuda)
            std::printf("  (rank 0, synchronised: embedding %.2f ms, taps and final hidden to device memory %.2f ms, "
                        "the rest of the forward outside the parts %.2f ms)\n",
                        st.embed_seconds / reps * 1e3, st.output_seconds / reps * 1e3,
                        (st.forward_seconds - st.embed_seconds - st.output_seconds - st.linear_attention_seconds -
                         st.full_attention_seconds - st.mlp_seconds - st.allreduce_seconds) / reps * 1e3);
          std::fflush(stdout);
        }
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
  CliApp app("TP target forward tokens/s, all-reduce time and per layer part compute time for each TP size that "
             "fits the ranks (mpirun -np K) and each sequence length; MoE targets also the experts and expert rows "
             "per rank and the routed MLP's share of the forward. The default target: H 512, 4 layers, 16/8 heads x "
             "32, intermediate 1536, vocab 4096, bf16 (qwen3_5: DeltaNet 4/8 heads x 64; MoE: 16 experts, top 4, "
             "width 384, qwen3_5_moe 256 + a shared 512).", "dflash_bench target");
  TargetBenchOptions o;
  app.add_option("--tp", o.tp, "TP sizes, each run on ranks [0, tp) (those > K skipped)")->type_name("LIST");
  app.add_option("--seq", o.seq, "sequence lengths")->type_name("LIST");
  app.add_option("--reps", o.reps, "timed forwards (best of)")->check(positive_number());
  add_named_option(app, "--device", o.device, "where the forward runs");
  add_named_option(app, "--precision", o.precision, "fp32 or bf16 (cuda only; its default)",
                   {kernels::Precision::fp32, kernels::Precision::bf16});
  app.add_option("--model", o.model, "a target directory instead of a random one")->type_name("DIR");
  const model::RandomTargetOptions target_options(app);
  if (!parse_command_line(app, argc, argv)) return 0;
  return comm::run_mpi_program({"dflash_bench target"}, argc, argv,
                               [&](bool) { return bench(o, target_options); });
}

}  // namespace dflash::bench
