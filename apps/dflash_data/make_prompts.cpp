// dflash_data make-prompts --out OUT.h5 --vocab V [--count 64 --min-len 16 --max-len 48 --reserve 1 --seed 1]
// Random prompts for the tiny recipe (data/make_tiny.sh): `count` sequences of uniform lengths in
// [min-len, max-len], token ids uniform in [0, V - reserve) (the top `reserve` ids, e.g. the drafter's mask token,
// never appear), loss_mask 0 everywhere (a prompt is context; regenerate adds the trained continuation).
// Prompt i is drawn from Rng(seed, i) alone, so the first k prompts do not depend on --count.
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "apps/dflash_data/commands.h"
#include "lib/core/cli_app.h"
#include "lib/core/error.h"
#include "lib/core/rng.h"
#include "lib/io/dataset.h"

namespace dflash::data {

int run_make_prompts(int argc, char** argv) {
  CliApp app("Random prompts (loss_mask 0) for the tiny recipe: token ids uniform in [0, V - reserve); "
             "`dflash_data regenerate` appends the target's trained continuation.", "dflash_data make-prompts");
  std::string out;
  int64_t vocab = 0, count = 64, reserve = 1, min_len = 16, max_len = 48;
  uint64_t seed = 1;
  app.add_option("--out", out, "the dataset to write")->required()->type_name("OUT.h5");
  app.add_option("--vocab", vocab, "the target's vocab_size")->required()->type_name("V")->check(positive_number());
  app.add_option("--count", count, "prompts")->check(positive_number());
  app.add_option("--min-len", min_len, "shortest prompt")->check(positive_number());
  app.add_option("--max-len", max_len, "longest prompt");
  app.add_option("--reserve", reserve, "never use the top R ids [V-R, V) (1: the drafter's mask token is V-1)")
      ->type_name("R");
  app.add_option("--seed", seed, "prompt i is drawn from (seed, i) alone");
  if (!parse_command_line(app, argc, argv)) return 0;
  DFLASH_USER_CHECK(reserve >= 0 && reserve < vocab, "--reserve {}: must be in [0, vocab {}) so that some ids remain",
              reserve, vocab);
  DFLASH_USER_CHECK(min_len >= 1 && min_len <= max_len, "--min-len {} --max-len {}: need 1 <= min-len <= max-len",
              min_len, max_len);

  // OUT.h5.partial, renamed by commit() once complete; on any failure the writer removes it (OUT.h5 unchanged)
  io::DatasetWriter writer(out + ".partial");
  std::vector<int32_t> tokens;
  for (int64_t i = 0; i < count; ++i) {
    Rng rng(seed, uint64_t(i));
    tokens.resize(size_t(min_len + int64_t(rng.below(uint64_t(max_len - min_len + 1)))));
    for (auto& t : tokens) t = int32_t(rng.below(uint64_t(vocab - reserve)));
    writer.add(tokens, std::vector<uint8_t>(tokens.size(), 0));
  }
  writer.commit(out);
  std::printf("wrote %s: %lld prompts, %lld tokens, lengths in [%lld, %lld], ids in [0, %lld), loss_mask 0\n",
              out.c_str(), (long long)writer.sequences(), (long long)writer.tokens(), (long long)min_len,
              (long long)max_len, (long long)(vocab - reserve));
  return 0;
}

}  // namespace dflash::data
