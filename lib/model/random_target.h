#pragma once
// Random Qwen3 targets in the Hugging Face format (config.json + model.safetensors, or an index over several
// files), seeded, any size: the models of the tests, the benchmarks and the embedded default.
#include <cstdint>
#include <string>

#include "lib/core/args.h"
#include "lib/io/safetensors.h"
#include "lib/model/qwen_config.h"

namespace dflash::model {

struct RandomTargetSpec {
  int hidden = 64;
  int layers = 2;
  int heads = 4;
  int kv_heads = 2;
  int head_dim = 16;
  int intermediate = 128;
  int vocab = 256;
  uint64_t seed = 1;
  io::DType dtype = io::DType::F32;
  bool tie = false;  // tie_word_embeddings: no lm_head.weight written
  double rms_norm_eps = 1e-6;
  double rope_theta = 1e6;
  int files = 1;  // > 1: model-0000i-of-0000n.safetensors + model.safetensors.index.json, layers split over files

  QwenConfig config() const;
};

// Creates `dir` if needed and writes the model. Every tensor is drawn from its own Rng stream (seed, tensor
// index): linear weights N(0, 1/in), embedding and lm_head N(0, 1), norm weights 1 + N(0, 0.1²) (so that a wrong
// norm weight shows). Throws on an invalid shape (via the config checks) or an unwritable directory.
void write_random_target(const std::string& dir, const RandomTargetSpec& spec);

// Fills `spec` from the size options that are given (--hidden --layers --heads --kv-heads --head-dim
// --intermediate --vocab --seed --files --rope-theta --dtype f32|bf16 --tie); absent ones keep spec's values.
// Shared by `dflash_data make-target` and the tests that make targets.
void apply_target_options(const Args& args, RandomTargetSpec& spec);

}  // namespace dflash::model
