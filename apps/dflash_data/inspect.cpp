// dflash_data inspect FILE.h5 [--vocab V] [--seq I]: validates a dataset (exit 1 with the reason when it is
// not valid) and prints its statistics; --seq prints one sequence's tokens and loss mask.
#include <cstdio>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "apps/dflash_data/commands.h"
#include "lib/core/cli_app.h"
#include "lib/core/error.h"
#include "lib/io/dataset.h"

namespace dflash::data {

int run_inspect(int argc, char** argv) {
  CliApp app("Validates a dataset (exit 1 with the reason when it is not valid) and prints its statistics.",
             "dflash_data inspect");
  std::string path;
  int64_t vocab = 0;
  std::optional<int64_t> seq;
  app.add_option("FILE", path, "the dataset")->required()->type_name("FILE.h5");
  app.add_option("--vocab", vocab, "also check every token id < V (the target's vocab_size; 0 = only ids >= 0)")
      ->type_name("V")->check(non_negative_number());
  app.add_option("--seq", seq, "print sequence I (token ids, and the loss mask)")->type_name("I")
      ->check(non_negative_number());
  if (!parse_command_line(app, argc, argv)) return 0;
  io::Dataset d(path, vocab);  // validates everything, or throws naming the problem
  io::DatasetStats st = d.stats();
  auto row = [](const char* key, const std::string& value) { std::printf("%-14s %s\n", key, value.c_str()); };
  row("file", path);
  row("sequences", fmt::format("{}", st.sequences));
  row("tokens", fmt::format("{}", st.tokens));
  row("length", fmt::format("min {}  mean {:.2f}  max {}", st.min_len, st.mean_len, st.max_len));
  row("trained", fmt::format("{:.2f}% of tokens have loss_mask = 1 ({} of {})",
                             st.tokens ? 100.0 * double(st.trained_tokens) / double(st.tokens) : 0.0,
                             st.trained_tokens, st.tokens));
  row("max token id", vocab > 0 ? fmt::format("{} (vocab {})", st.max_token, vocab)
                                : fmt::format("{} (no --vocab: only ids >= 0 checked)", st.max_token));
  row("valid", "yes");
  if (seq) {
    io::Sequence s = d.read(*seq);
    std::printf("sequence %lld (%zu tokens)\n", (long long)s.index, s.tokens.size());
    std::printf("  tokens    [%s]\n", fmt::format("{}", fmt::join(s.tokens, ", ")).c_str());
    std::printf("  loss_mask [%s]\n", fmt::format("{}", fmt::join(s.loss_mask, ", ")).c_str());
  }
  return 0;
}

}  // namespace dflash::data
