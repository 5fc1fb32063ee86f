#pragma once
// Subcommands of dflash_bench (one bench_<name>.cpp each) and the measurements they share.

namespace dflash::bench {

int run_drafter(int argc, char** argv);
int run_target(int argc, char** argv);  // an MPI program: mpirun -np K dflash_bench target
int run_loss(int argc, char** argv);
int run_cuda(int argc, char** argv);
int run_numerics(int argc, char** argv);  // bf16 vs fp32 vocab logits: the loss and its gradient  // the CUDA backend's loss and drafter vs their cuBLASLt GEMMs
int run_eval(int argc, char** argv);  // greedy vs chain vs tree speculative decoding, TP 1 (bench_eval.cpp)
int run_stream(int argc, char** argv);  // an MPI program: packet throughput and TP all-reduce on one data plane

// sgemm rate of this machine in GFLOP/s for C[M,N] = A[M,K]·B[N,K]ᵀ (the shape of a linear layer), best of
// `reps` after one warm-up: the ceiling that every benchmark reports its ratio against.
double sgemm_gflops(int M, int N, int K, int reps = 3);

}  // namespace dflash::bench
