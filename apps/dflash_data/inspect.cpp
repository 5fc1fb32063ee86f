// dflash_data inspect FILE.h5 [--vocab V] [--seq I]: validates a dataset (exit 1 with the reason when it is
// not valid) and prints its statistics; --seq prints one sequence's tokens and loss mask.
#include <cstdio>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "apps/dflash_data/commands.h"
#include "lib/core/args.h"
#include "lib/core/error.h"
#include "lib/io/dataset.h"

namespace dflash::data {

namespace {
constexpr const char* kUsage =
    "usage: dflash_data inspect FILE.h5 [--vocab V] [--seq I]\n"
    "  --vocab V  also check every token id < V (the target's vocab_size)\n"
    "  --seq I    print sequence I (token ids, and the loss mask)\n";
}

int run_inspect(int argc, char** argv) {
  Args args(argc, argv, {"vocab", "seq"}, {}, kUsage);
  DFLASH_USER_CHECK(args.positional().size() == 1, "expected one FILE.h5, got {} argument(s)\n{}",
               args.positional().size(), kUsage);
  const std::string path = args.positional()[0];
  const int64_t vocab = args.integer("vocab", 0);
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
  if (args.has("seq")) {
    io::Sequence s = d.read(args.integer("seq", 0));
    std::printf("sequence %lld (%zu tokens)\n", (long long)s.index, s.tokens.size());
    std::printf("  tokens    [%s]\n", fmt::format("{}", fmt::join(s.tokens, ", ")).c_str());
    std::printf("  loss_mask [%s]\n", fmt::format("{}", fmt::join(s.loss_mask, ", ")).c_str());
  }
  return 0;
}

}  // namespace dflash::data
