// dflash_data make-target --out DIR [--hidden 64 --layers 2 --heads 4 --kv-heads 2 --head-dim 16
//   --intermediate 128 --vocab 256 --seed 1 --dtype f32|bf16 --files 1 --tie]
// Writes a random Qwen3 target (config.json + model.safetensors) in the Hugging Face format.
#include <cstdio>

#include "lib/core/args.h"
#include "lib/core/error.h"
#include "lib/model/random_target.h"

namespace dflash::data {

namespace {
constexpr const char* kUsage =
    "usage: dflash_data make-target --out DIR [--hidden 64] [--layers 2] [--heads 4] [--kv-heads 2] [--head-dim 16]\n"
    "         [--intermediate 128] [--vocab 256] [--seed 1] [--dtype f32|bf16] [--files 1] [--rope-theta 1e6] [--tie]\n"
    "Writes a random Qwen3 target (config.json + model.safetensors) in the Hugging Face format.\n"
    "  --out DIR   the model directory to write (required)\n"
    "  --files N   split the layers over N files with a model.safetensors.index.json\n"
    "  --tie       tie_word_embeddings: true (no lm_head.weight)\n";
}  // namespace

int run_make_target(int argc, char** argv) {
  Args a(argc, argv,
         {"out", "hidden", "layers", "heads", "kv-heads", "head-dim", "intermediate", "vocab", "seed", "dtype",
          "files", "rope-theta"},
         {"tie"}, kUsage);
  DFLASH_USER_CHECK(a.has("out"), "--out DIR is required (the model directory to write)\n{}", kUsage);
  model::RandomTargetSpec s;
  model::apply_target_options(a, s);
  const std::string out = a.str("out", "");
  model::write_random_target(out, s);
  std::printf("wrote random Qwen3 target to %s: H %d, %d layers, %d/%d heads × %d, intermediate %d, vocab %d, %s%s\n",
              out.c_str(), s.hidden, s.layers, s.heads, s.kv_heads, s.head_dim, s.intermediate, s.vocab,
              s.dtype == io::DType::BF16 ? "bf16" : "f32", s.tie ? ", tied" : "");
  return 0;
}

}  // namespace dflash::data
