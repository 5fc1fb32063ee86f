#pragma once
// Helpers shared by the unit tests: scratch folders and the small drafter shape most model tests use.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "lib/core/rng.h"
#include "lib/model/drafter_config.h"
#include "lib/model/random_target.h"

namespace dflash::test {

// The small random target the target, cache and decoding tests share (H 32, 4 Q / 2 KV heads of 8, V 64; hybrid:
// Gated DeltaNet layers of 2 key heads × 8 and 4 value heads × 6).
inline model::RandomTargetSpec small_random_target(bool hybrid, int layers, uint64_t seed) {
  model::RandomTargetSpec spec;
  spec.hidden = 32;
  spec.layers = layers;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.head_dim = 8;
  spec.intermediate = 48;
  spec.vocab = 64;
  spec.seed = seed;
  spec.hybrid = hybrid;
  spec.linear_k_heads = 2;
  spec.linear_v_heads = 4;
  spec.linear_k_dim = 8;
  spec.linear_v_dim = 6;
  return spec;
}

// n values drawn from N(0, sd²) by Rng(seed): the same inputs on every run.
inline std::vector<float> random_floats(size_t n, uint64_t seed, double sd = 1.0) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = float(sd * rng.normal());
  return v;
}

// max |a − b| / max |b|: the relative error of a whole tensor against its reference (0 when both are all zero).
template <typename A, typename B>
double max_rel_diff(const std::vector<A>& a, const std::vector<B>& b) {
  REQUIRE(a.size() == b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(double(a[i]) - double(b[i])));
    den = std::max(den, std::fabs(double(b[i])));
  }
  REQUIRE((den > 0 || num == 0));
  return den > 0 ? num / den : 0.0;
}

// |got − want| ≤ atol + rtol·|want| elementwise, reporting the first violation.
inline void require_close(const std::vector<float>& got, const std::vector<float>& want, double rtol, double atol,
                          const char* what) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(double(got[i]) - double(want[i]));
    if (!(d <= atol + rtol * std::fabs(double(want[i])))) {
      INFO(what << ": element " << i << " got " << got[i] << " want " << want[i]);
      REQUIRE(d <= atol + rtol * std::fabs(double(want[i])));
    }
  }
}

// An empty folder `name` inside this process's scratch root; the root is removed when the test binary exits.
inline std::filesystem::path scratch_dir(const std::string& name) {
  namespace fs = std::filesystem;
  static const struct Root {
    fs::path path = fs::temp_directory_path() / ("dflash_tests_" + std::to_string(::getpid()));
    ~Root() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  } root;
  const fs::path d = root.path / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// 2 layers (layer 1 a sliding-window layer), 4 Q / 2 KV heads of 6 (NH·D = 24 ≠ H = 16, so a transposed
// projection cannot pass), block 4, 3 taps, vocab 40 with the mask token at 39.
inline model::DrafterConfig small_drafter_config() {
  model::DrafterConfig c;
  c.hidden = 16;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 6;
  c.intermediate = 20;
  c.block_size = 4;
  c.n_taps = 3;
  c.vocab = 40;
  c.mask_token_id = 39;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-6;
  c.window = {0, 5};
  return c;
}

}  // namespace dflash::test
