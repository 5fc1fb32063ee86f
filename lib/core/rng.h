#pragma once
// Deterministic, counter-based random numbers. Every draw is a pure function of (seed, stream, counter), so a
// rank's randomness is reproducible from a few integers and its state is trivially checkpointed.
#include <cmath>
#include <cstdint>

namespace dflash {

// SplitMix64 finaliser: a bijective 64-bit mix with good avalanche, the core of the generator.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

struct Rng {
  uint64_t seed = 0;     // run seed
  uint64_t stream = 0;   // independent stream (e.g. rank, tensor index, step)
  uint64_t counter = 0;  // draws taken so far: the whole state to checkpoint

  Rng() = default;
  Rng(uint64_t seed_, uint64_t stream_ = 0) : seed(seed_), stream(stream_) {}

  uint64_t next_u64() {
    return mix64(mix64(seed ^ 0x9e3779b97f4a7c15ULL) + mix64(stream + 0x632be59bd9b4e019ULL) +
                 0x9e3779b97f4a7c15ULL * (++counter));
  }
  // uniform in [0, 1) with 53 random bits
  double uniform() { return double(next_u64() >> 11) * 0x1.0p-53; }
  // uniform integer in [0, n) (Lemire's multiply-shift; bias < n / 2^64, negligible here)
  uint64_t below(uint64_t n) { return uint64_t((__uint128_t(next_u64()) * n) >> 64); }
  // standard normal (Box-Muller; one value per call keeps the state a single counter)
  double normal() {
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

}  // namespace dflash
