// The NCCL data plane (lib/comm/nccl_transport.h) on real GPUs, one per rank: bootstrap over MPI, then
//   - all-reduce of floats and doubles, on device buffers and on host buffers (staged): sum of (rank + 1) * (i + 1)
//     must equal (i + 1) * size * (size + 1) / 2 exactly;
//   - broadcast from the last rank; barrier;
//   - a ring of send/receive in one group (rank r sends r's pattern to r + 1), device and host buffers;
//   - with --timeout-check (≥ 2 ranks): rank 0 waits for a message rank 1 never sends; the wait must fail within the
//     timeout with an error naming the operation, the communicator and the world rank (no hang).
//   - the bf16 all-reduce on device buffers (sums_bf16_on_device, ncclBfloat16): small integers, exact;
//   - with --target DIR: a random bf16 target written to DIR, its TP forward on the CUDA backend in bf16 over
//     NCCL with TargetOptions::tp_allreduce fp32 and bf16, each against the fp32 TP forward on the CPU (MPI):
//     max |x - ref| / max |ref| per output within the bf16 bound below, ranks bit-identical, and the two modes
//     different somewhere (the bf16 sum really ran); the errors are printed.
//   - with --ordered DIR [HASH_FILE]: random targets written to DIR (dense; a Qwen3.5 MoE hybrid), their TP forward
//     on the CUDA backend over NCCL with the stream-ordered all-reduce (TargetOptions::ordered_allreduce, the
//     default) and with the host-synchronised one: fp32, bf16 with tp_allreduce fp32 and bf16, outputs on the device
//     and on the host; every pair bit-identical, ranks bit-identical, and the host waits per forward counted
//     (TargetStats::host_waits; pinned for the dense target with device outputs). HASH_FILE (rank 0): a hash of every
//     output, so that runs under two emulator thread orders can be compared (tests/integration/nccl_ordered.sh).
//   - with --ordered-hang DIR: rank 1 never joins; rank 0's forward queues its stream-ordered all-reduces and must
//     fail within the transport's bound (3 s) at the forward's end with the watchdog's error naming the all-reduce,
//     the communicator and the world rank (no unbounded stream synchronisation).
// Without NCCL in the build, without a GPU, or with fewer GPUs than ranks on a node, every rank prints why and
// exits 77 (ctest: skipped). Exit 0 only when every check passed on every rank.
//   mpirun -np N nccl_check [--timeout-check | --target DIR | --ordered DIR [HASH_FILE] | --ordered-hang DIR]
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lib/comm/mpi_init.h"
#include "lib/core/buffer.h"
#include "kernels/backend.h"
#include "lib/comm/data_plane.h"
#include "lib/comm/layout.h"
#include "lib/comm/mpi_transport.h"
#include "lib/comm/nccl_transport.h"
#include "lib/core/error.h"
#include "lib/core/named_enum.h"
#include "lib/core/rng.h"
#include "lib/core/timer.h"
#include "lib/model/random_target.h"
#include "lib/model/target.h"

#if DFLASH_WITH_CUDA
#include <cuda_runtime.h>
#endif

using namespace dflash;

namespace {

int failures = 0;

void expect(bool ok, int rank, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "nccl_check rank %d: FAILED: %s\n", rank, what.c_str());
    ++failures;
  }
}

#if DFLASH_WITH_CUDA
template <typename T>
struct DeviceVec {
  T* p = nullptr;
  size_t n = 0;
  explicit DeviceVec(const std::vector<T>& h) : n(h.size()) {
    DFLASH_CHECK(cudaMalloc(&p, n * sizeof(T)) == cudaSuccess, "cudaMalloc");
    // complete on return (a bare cudaMemcpy from pageable memory is not ordered before NCCL's stream)
    copy_bytes(p, MemoryKind::device, h.data(), MemoryKind::host, n * sizeof(T));
  }
  ~DeviceVec() { cudaFree(p); }
  std::vector<T> host() const {
    std::vector<T> h(n);
    copy_bytes(h.data(), MemoryKind::host, p, MemoryKind::device, n * sizeof(T));
    return h;
  }
};

template <typename T>
void check_allreduce(comm::Transport& t, bool on_device, int rank, int size) {
  const size_t n = 1000;
  std::vector<T> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = T((rank + 1) * (i + 1));
  std::vector<T> got;
  if (on_device) {
    DeviceVec<T> d(x);
    t.allreduce_sum(d.p, n);
    got = d.host();
  } else {
    t.allreduce_sum(x.data(), n);
    got = x;
  }
  bool ok = true;
  for (size_t i = 0; i < n; ++i) ok = ok && got[i] == T((i + 1) * size * (size + 1) / 2);
  expect(ok, rank, std::string("all-reduce of ") + (sizeof(T) == 4 ? "float" : "double") +
                       (on_device ? " (device)" : " (host, staged)"));
}

// bf16 (kernels::bf16's bits) on the device: (rank + 1) * (i % 32) sums to small integers, exact in bf16 at every
// hop of the ring
void check_allreduce_bf16(comm::Transport& t, int rank, int size) {
  const size_t n = 1000;
  const auto bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return uint16_t(u >> 16);  // exact for these integers
  };
  std::vector<uint16_t> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = bits(float((rank + 1) * int(i % 32)));
  expect(t.sums_bf16_on_device(), rank, "NCCL sums bf16 on the device");
  DeviceVec<uint16_t> d(x);
  t.allreduce_sum_bf16_device(d.p, n);
  const std::vector<uint16_t> got = d.host();
  bool ok = true;
  for (size_t i = 0; i < n; ++i) ok = ok && got[i] == bits(float(int(i % 32) * size * (size + 1) / 2));
  expect(ok, rank, "all-reduce of bf16 (device)");
}

// max |a - b| / max |b|
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(double(a[i]) - double(b[i])));
    den = std::max(den, std::fabs(double(b[i])));
  }
  return den > 0 ? num / den : 1.0;
}

// The bf16 target over NCCL, tp_allreduce fp32 and bf16, against the fp32 CPU target over MPI (see the header).
// The bound: 3 layers, each rounding its activations to bf16 a few times (q/k/v, attention, o, norms, gate/up,
// SwiGLU, down, the all-reduce, the residual: ~12 roundings of 2^-8 relative each, compounded over the layers and
// amplified by the norms): 3e-2 of max |ref|; measured below it with room (the printed errors).
void check_target_bf16(const std::string& dir, comm::Transport& nccl, int rank, int size) {
  if (rank == 0) {
    model::RandomTargetSpec spec;
    spec.hidden = 128;
    spec.layers = 3;
    spec.heads = 16;
    spec.kv_heads = 8;
    spec.head_dim = 16;
    spec.intermediate = 160;
    spec.vocab = 160;
    spec.dtype = io::DType::BF16;
    spec.tie = true;
    spec.seed = 11;
    model::write_random_target(dir, spec);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const int S = 48;
  const std::vector<int> tap_ids{0, 2};
  const auto forward = [&](comm::Transport& tp, const model::TargetOptions& opt) {
    model::TargetModel target(dir, tp, opt);
    const int H = target.config().hidden;
    std::vector<int32_t> tokens(static_cast<size_t>(S));
    Rng rng(5);
    for (auto& t : tokens) t = int32_t(rng.below(uint64_t(target.config().vocab)));
    std::vector<float> out(size_t(S) * (tap_ids.size() + 1) * H);
    target.forward(tokens.data(), S, tap_ids, out.data(), out.data() + size_t(S) * tap_ids.size() * H);
    return out;
  };
  comm::MpiTransport mpi(MPI_COMM_WORLD);
  model::TargetOptions cpu;
  cpu.mlp_grain = 8;
  const std::vector<float> ref = forward(mpi, cpu);
  model::TargetOptions gpu = cpu;
  gpu.device = kernels::Device::cuda;
  gpu.precision = kernels::Precision::bf16;
  gpu.tp_allreduce = model::TpAllreduce::fp32;
  const std::vector<float> wide = forward(nccl, gpu);
  gpu.tp_allreduce = model::TpAllreduce::bf16;
  const std::vector<float> narrow = forward(nccl, gpu);
  double errs[2] = {rel_err(wide, ref), rel_err(narrow, ref)}, worst[2] = {0, 0};
  MPI_Allreduce(errs, worst, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  int differs = 0, ranks_differing = 0;
  for (const auto* o : {&wide, &narrow}) {
    std::vector<float> root(*o);
    MPI_Bcast(root.data(), int(root.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
    differs += root != *o;
  }
  MPI_Allreduce(&differs, &ranks_differing, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  size_t changed = 0;
  for (size_t i = 0; i < wide.size(); ++i) changed += wide[i] != narrow[i];
  const double tol = 3e-2;
  expect(worst[0] <= tol && worst[1] <= tol, rank, "bf16 target within 3e-2 of the fp32 CPU target");
  expect(ranks_differing == 0, rank, "every rank holds the same bits");
  expect(size == 1 || changed > 0, rank, "tp_allreduce bf16 changes some bits (the bf16 sum ran)");
  if (rank == 0)
    std::printf("nccl_check: bf16 target, TP %d, S %d, H 128, 3 layers, over NCCL: max rel err against the fp32 CPU "
                "target: tp_allreduce fp32 %.3e, bf16 %.3e (bound %.0e); %zu of %zu outputs differ between the two; "
                "ranks bit-identical: %s\n", size, S, worst[0], worst[1], tol, changed, wide.size(),
                ranks_differing == 0 ? "yes" : "NO");
}

// The targets of --ordered: dense (3 layers) and a Qwen3.5 MoE hybrid (4 layers: 3 Gated DeltaNet, 1 full attention;
// routed and shared experts, so the router's host read settles the attention's sum mid-layer).
void write_ordered_targets(const std::string& dir, int rank, bool with_moe) {
  if (rank == 0) {
    model::RandomTargetSpec dense;
    dense.hidden = 128;
    dense.layers = 3;
    dense.heads = 8;
    dense.kv_heads = 4;
    dense.head_dim = 16;
    dense.intermediate = 160;
    dense.vocab = 160;
    dense.dtype = io::DType::BF16;
    dense.tie = true;
    dense.seed = 17;
    model::write_random_target(dir + "/dense", dense);
    if (with_moe) {
      model::RandomTargetSpec moe = dense;
      moe.layers = 4;
      moe.hybrid = true;
      moe.experts = 4;
      moe.seed = 19;
      model::write_random_target(dir + "/moe", moe);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

struct ForwardResult {
  std::vector<float> out;  // taps then final_hidden, host copy
  long host_waits = 0;
};

// One forward of S tokens with taps {0, last layer} and the final hidden state, outputs in `outputs` memory.
ForwardResult ordered_forward(model::TargetModel& target, MemoryKind outputs) {
  const int S = 40, H = target.config().hidden;
  const std::vector<int> tap_ids{0, target.config().layers - 1};
  std::vector<int32_t> tokens(static_cast<size_t>(S));
  Rng rng(23);
  for (auto& t : tokens) t = int32_t(rng.below(uint64_t(target.config().vocab)));
  const size_t n = size_t(S) * (tap_ids.size() + 1) * size_t(H);
  ForwardResult r;
  r.out.assign(n, 0.f);
  target.reset_stats();
  if (outputs == MemoryKind::host) {
    target.forward(tokens.data(), S, tap_ids, r.out.data(), r.out.data() + size_t(S) * tap_ids.size() * H);
  } else {
    Buffer dev(MemoryKind::device, n * sizeof(float));
    float* d = dev.as<float>();
    target.forward(tokens.data(), S, tap_ids, d, d + size_t(S) * tap_ids.size() * H, MemoryKind::device);
    copy_bytes(r.out.data(), MemoryKind::host, d, MemoryKind::device, n * sizeof(float));
  }
  r.host_waits = target.stats().host_waits;
  return r;
}

uint64_t fnv1a(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// --ordered (see the header): the stream-ordered TP all-reduce against the host-synchronised one.
void check_ordered(const std::string& dir, const std::string& hash_file, comm::Transport& nccl, int rank, int size) {
  write_ordered_targets(dir, rank, true);
  struct Case {
    const char* model;
    kernels::Precision precision;
    model::TpAllreduce sum;
  };
  const Case cases[] = {{"dense", kernels::Precision::fp32, model::TpAllreduce::fp32},
                        {"dense", kernels::Precision::bf16, model::TpAllreduce::fp32},
                        {"dense", kernels::Precision::bf16, model::TpAllreduce::bf16},
                        {"moe", kernels::Precision::bf16, model::TpAllreduce::bf16}};
  std::string hashes;
  for (const Case& c : cases) {
    ForwardResult got[2][2];  // [ordered][outputs on the device]
    int layers = 0;
    for (int ordered = 0; ordered < 2; ++ordered) {
      model::TargetOptions opt;
      opt.mlp_grain = 8;
      opt.device = kernels::Device::cuda;
      opt.precision = c.precision;
      opt.tp_allreduce = c.sum;
      opt.ordered_allreduce = ordered == 1;
      model::TargetModel target(dir + "/" + c.model, nccl, opt);
      layers = target.config().layers;
      for (int dev = 0; dev < 2; ++dev)
        got[ordered][dev] = ordered_forward(target, dev ? MemoryKind::device : MemoryKind::host);
    }
    const std::string name = fmt::format("{} {} tp_allreduce {}", c.model, name_of(c.precision), name_of(c.sum));
    for (int dev = 0; dev < 2; ++dev) {
      const char* where = dev ? "device outputs" : "host outputs";
      expect(got[1][dev].out == got[0][dev].out, rank,
             fmt::format("{}, {}: stream-ordered and host-synchronised all-reduces give the same bits", name, where));
      std::vector<float> root(got[1][dev].out);
      MPI_Bcast(root.data(), int(root.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
      expect(root == got[1][dev].out, rank, fmt::format("{}, {}: every rank holds the same bits", name, where));
      hashes += fmt::format("{} {}: {:016x}\n", name, where, fnv1a(got[1][dev].out));
    }
    // the dense target with device outputs: the host-synchronised path waits twice per all-reduce (the stream, then
    // NCCL's) plus once at the end; the stream-ordered one only at the end (its sums, then the stream)
    if (std::string(c.model) == "dense" && size > 1) {
      expect(got[0][1].host_waits == 4 * layers + 1, rank,
             fmt::format("{}: host-synchronised host waits {} (expected {})", name, got[0][1].host_waits,
                         4 * layers + 1));
      expect(got[1][1].host_waits == 2, rank,
             fmt::format("{}: stream-ordered host waits {} (expected 2)", name, got[1][1].host_waits));
    }
    if (rank == 0)
      std::printf("nccl_check: %s, TP %d, %d layers: host waits per forward, host-synchronised / stream-ordered: "
                  "%ld / %ld (device outputs), %ld / %ld (host outputs: taps and final hidden downloaded); "
                  "bit-identical: %s\n", name.c_str(), size, layers, got[0][1].host_waits, got[1][1].host_waits,
                  got[0][0].host_waits, got[1][0].host_waits,
                  got[1][0].out == got[0][0].out && got[1][1].out == got[0][1].out ? "yes" : "NO");
  }
  if (rank == 0 && !hash_file.empty()) {
    FILE* f = std::fopen(hash_file.c_str(), "w");
    expect(f != nullptr, rank, "cannot write " + hash_file);
    if (f) {
      std::fputs(hashes.c_str(), f);
      std::fclose(f);
    }
  }
}

// --ordered-hang (see the header)
void check_ordered_hang(const std::string& dir, comm::Transport& nccl, int rank) {
  write_ordered_targets(dir, rank, false);
  if (rank == 0) {
    Timer timer;
    std::string error;
    try {
      model::TargetOptions opt;
      opt.mlp_grain = 8;
      opt.device = kernels::Device::cuda;
      model::TargetModel target(dir + "/dense", nccl, opt);
      ordered_forward(target, MemoryKind::device);  // rank 1 never joins
    } catch (const Error& e) {
      error = e.what();
    }
    const bool named = error.find("ncclAllReduce(float)") != std::string::npos &&
                       error.find("stream-ordered") != std::string::npos &&
                       error.find("NCCL target TP group (world rank 0, rank 0 of 2)") != std::string::npos &&
                       error.find("no completion after 3 s") != std::string::npos &&
                       error.find("aborted") != std::string::npos;
    expect(named, rank,
           "the stalled stream-ordered all-reduce fails naming the operation and the rank: '" + error + "'");
    expect(timer.seconds() < 30, rank, "the stalled all-reduce fails within the bound");
    std::printf("nccl_check: a stream-ordered all-reduce nobody joins failed after %.1f s: %s\n", timer.seconds(),
                error.c_str());
  }
  MPI_Barrier(MPI_COMM_WORLD);  // rank 1 idles here; its communicator sees rank 0's abort, or is destroyed
}

void check_ring(comm::Transport& t, bool on_device, int rank, int size) {
  const size_t n = 3000;
  std::vector<int32_t> mine(n), expect_in(n), in(n, -1);
  const int from = (rank + size - 1) % size, to = (rank + 1) % size;
  for (size_t i = 0; i < n; ++i) mine[i] = int32_t(rank * 100000 + i), expect_in[i] = int32_t(from * 100000 + i);
  if (on_device) {
    DeviceVec<int32_t> s(mine), r(in);
    t.group_start();
    comm::Request a = t.isend(s.p, n, to, 1), b = t.irecv(r.p, n, from, 1);
    t.group_end();
    a.wait();
    b.wait();
    in = r.host();
  } else {
    t.group_start();
    comm::Request a = t.isend(mine.data(), n, to, 1), b = t.irecv(in.data(), n, from, 1);
    t.group_end();
    a.wait();
    b.wait();
  }
  expect(in == expect_in, rank, std::string("ring send/receive") + (on_device ? " (device)" : " (host, staged)"));
}
#endif

}  // namespace

int main(int argc, char** argv) {
  return comm::run_mpi_program({"nccl_check"}, argc, argv, [&](bool) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  bool timeout_check = argc > 1 && std::strcmp(argv[1], "--timeout-check") == 0;
  // the emulated GPU refusing the first cudaMalloc (DFLASH_EMU_FAIL_MALLOC=1): the one after the communicator's
  // initialisation; the transport must fail naming it and abort the communicator it made
  const bool alloc_failure_check = argc > 1 && std::strcmp(argv[1], "--alloc-failure-check") == 0;
  const std::string target_dir = argc > 2 && std::strcmp(argv[1], "--target") == 0 ? argv[2] : "";
  const std::string ordered_dir = argc > 2 && std::strcmp(argv[1], "--ordered") == 0 ? argv[2] : "";
  const std::string ordered_hash = !ordered_dir.empty() && argc > 3 ? argv[3] : "";
  const std::string hang_dir = argc > 2 && std::strcmp(argv[1], "--ordered-hang") == 0 ? argv[2] : "";
  if (!hang_dir.empty()) timeout_check = true;  // needs 2 ranks, like --timeout-check
  const comm::NodeShape node = comm::node_shape(MPI_COMM_WORLD);
  if (!comm::nccl_built() || node.max_ranks_per_node > node.min_gpus_per_node || (timeout_check && size < 2)) {
    if (rank == 0)
      std::printf("skipped: needs NCCL in the build (%s) and one GPU per rank: %d rank(s) on a node, %d GPU(s)%s\n",
                  comm::nccl_built() ? "yes" : "no", node.max_ranks_per_node, node.min_gpus_per_node,
                  timeout_check && size < 2 ? "; --timeout-check needs 2 ranks" : "");
    return 77;
  }
#if DFLASH_WITH_CUDA
  {
    kernels::bind_cuda_device(comm::node_local_rank(MPI_COMM_WORLD));
    if (alloc_failure_check) {
      std::string error;
      try {
        comm::make_nccl_transport(MPI_COMM_WORLD, "world", 20);
      } catch (const Error& e) {
        error = e.what();
      }
      expect(error.find("cudaMalloc (barrier scratch)") != std::string::npos, rank,
             "the failed allocation is named: '" + error + "'");
      std::printf("nccl_check: rank %d: the transport failed after its communicator was made: %s\n", rank,
                  error.c_str());
    } else if (!ordered_dir.empty()) {
      std::unique_ptr<comm::Transport> t = comm::make_nccl_transport(MPI_COMM_WORLD, "target TP group", 120);
      check_ordered(ordered_dir, ordered_hash, *t, rank, size);
    } else if (!hang_dir.empty()) {
      std::unique_ptr<comm::Transport> t = comm::make_nccl_transport(MPI_COMM_WORLD, "target TP group", 3);
      check_ordered_hang(hang_dir, *t, rank);
    } else if (!target_dir.empty()) {
      std::unique_ptr<comm::Transport> t = comm::make_nccl_transport(MPI_COMM_WORLD, "target TP group", 120);
      check_target_bf16(target_dir, *t, rank, size);
    } else if (!timeout_check) {
      std::unique_ptr<comm::Transport> t = comm::make_nccl_transport(MPI_COMM_WORLD, "world", 60);
      expect(t->rank() == rank && t->size() == size, rank, "rank and size match MPI's");
      expect(!t->cancellable_receives(), rank, "NCCL receives are not cancellable");
      for (bool dev : {true, false}) {
        check_allreduce<float>(*t, dev, rank, size);
        check_allreduce<double>(*t, dev, rank, size);
        check_ring(*t, dev, rank, size);
      }
      check_allreduce_bf16(*t, rank, size);
      std::vector<int64_t> b(17, rank);
      t->broadcast(b.data(), b.size(), size - 1);
      expect(b == std::vector<int64_t>(17, size - 1), rank, "broadcast from the last rank");
      t->barrier();
      if (rank == 0)
        std::printf("nccl_check: %d rank(s): bootstrap, all-reduce (bf16 too), broadcast, ring, barrier %s\n", size,
                    failures ? "FAILED" : "ok");
    } else {
      std::unique_ptr<comm::Transport> t = comm::make_nccl_transport(MPI_COMM_WORLD, "world", 3);
      if (rank == 0) {
        std::vector<float> x(10);
        Timer timer;
        std::string error;
        try {
          t->recv(x.data(), x.size(), 1, 0);  // rank 1 never sends
        } catch (const Error& e) {
          error = e.what();
        }
        const bool named = error.find("ncclRecv") != std::string::npos &&
                           error.find("NCCL world (world rank 0") != std::string::npos &&
                           error.find("aborted") != std::string::npos;
        expect(named, rank, "the stalled receive fails naming the operation and the rank: '" + error + "'");
        expect(timer.seconds() < 30, rank, "the stalled receive fails within the timeout");
        std::printf("nccl_check: a receive nobody matches failed after %.1f s: %s\n", timer.seconds(), error.c_str());
      }
      MPI_Barrier(MPI_COMM_WORLD);  // rank 1 idles here; its communicator sees rank 0's abort, or is destroyed
    }
  }
#endif
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  return total == 0 ? 0 : 1;
  });
}
