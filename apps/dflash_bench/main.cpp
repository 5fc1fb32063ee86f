// dflash_bench SUBCOMMAND [options]: benchmark programs. Each subcommand lives in its own bench_<name>.cpp;
// they print ratios measured in the same run (e.g. against this machine's BLAS GEMM rate), not absolute claims.
#include "apps/dflash_bench/bench.h"
#include "lib/core/subcommands.h"

namespace {

using dflash::Subcommand;

const Subcommand kSubcommands[] = {
    {"drafter", dflash::bench::run_drafter, "drafter forward+backward over one sequence's anchors vs sgemm rate"},
    {"target", dflash::bench::run_target, "TP target forward tokens/s and all-reduce time (mpirun -np K)"},
    {"loss", dflash::bench::run_loss, "chunked vocab loss (recompute|fused|naive) vs its GEMMs alone, and its memory"},
    {"eval", dflash::bench::run_eval,
     "speculative decoding: greedy vs chain vs tree tokens/s, target forwards per token, tau and tau_tree"},
    {"cuda", dflash::bench::run_cuda, "CUDA backend: vocab loss and drafter fwd+bwd vs their cuBLASLt GEMMs alone"},
    {"numerics", dflash::bench::run_numerics, "bf16 vs fp32 vocab logits: loss and gradient error at the real V"},
    {"stream", dflash::bench::run_stream, "packet GB/s, drafter wait share, TP all-reduce per layer (mpirun -np K)"},
};

}  // namespace

int main(int argc, char** argv) { return dflash::run_subcommand("dflash_bench", kSubcommands, argc, argv); }
