// dflash_mpi --check's tokenizer check: tokenizer.json of the target folder against config.json's vocab_size and
// eos/bos ids, and against the data's largest token id.
#include <doctest/doctest.h>

#include <fstream>
#include <string>

#include "test_util.h"
#include "lib/core/error.h"
#include "lib/preflight/tokenizer_check.h"

using namespace dflash;
using namespace dflash::preflight;

namespace {

void write(const std::filesystem::path& p, const std::string& text) { std::ofstream(p) << text; }

// A tokenizer of 10 ids: 0..7 in model.vocab, 8 and 9 added special tokens (<|im_end|> = eos).
std::filesystem::path model_dir(const std::string& name, const std::string& config) {
  const auto dir = test::scratch_dir(name);
  write(dir / "tokenizer.json",
        R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "d": 3, "e": 4, "f": 5, "g": 6, "h": 7}},
            "added_tokens": [{"id": 8, "content": "<|im_start|>", "special": true},
                             {"id": 9, "content": "<|im_end|>", "special": true}]})");
  write(dir / "config.json", config);
  return dir;
}

}  // namespace

TEST_CASE("tokenizer check: a matching tokenizer passes and counts its tokens and special ids") {
  const auto dir = model_dir("tok_ok", R"({"vocab_size": 16, "eos_token_id": 9})");
  const TokenizerFacts t = read_tokenizer_facts(dir.string());
  CHECK(t.tokens == 10);
  CHECK(t.special_ids == std::set<int64_t>{8, 9});
  const TokenizerCheck r = check_tokenizer(t, dir.string(), 16, /*data_max_token=*/9, /*mask_token_id=*/12);
  CHECK(r.errors.empty());
  CHECK(r.notes.empty());  // mask token 12 is a reserved row past the tokenizer
}

TEST_CASE("tokenizer check: too many tokens, a non-special eos, data beyond the tokenizer, a producible mask id") {
  const auto dir = model_dir("tok_bad", R"({"vocab_size": 8, "text_config": {"eos_token_id": [9, 3]}})");
  write(dir / "generation_config.json", R"({"bos_token_id": 4})");
  const TokenizerFacts t = read_tokenizer_facts(dir.string());
  const TokenizerCheck r = check_tokenizer(t, dir.string(), 8, /*data_max_token=*/11, /*mask_token_id=*/2);
  REQUIRE(r.errors.size() == 4);
  CHECK(r.errors[0].find("has 10 tokens but config.json's vocab_size is 8") != std::string::npos);
  CHECK(r.errors[1].find("eos/bos id 3 is not a special token") != std::string::npos);
  CHECK(r.errors[2].find("generation_config.json: eos/bos id 4 is not a special token") != std::string::npos);
  CHECK(r.errors[3].find("the data holds token id 11 but") != std::string::npos);
  REQUIRE(r.notes.size() == 1);
  CHECK(r.notes[0].find("drafter.mask_token_id 2 is a token") != std::string::npos);
}

TEST_CASE("tokenizer check: no tokenizer.json is not checked, a file that is not a tokenizer is an error") {
  const auto none = test::scratch_dir("tok_none");
  const TokenizerFacts t = read_tokenizer_facts(none.string());
  CHECK(t.path.empty());
  CHECK(preflight::check_tokenizer(t, none.string(), 8, 100, 2).errors.empty());
  const auto bad = test::scratch_dir("tok_notjson");
  write(bad / "tokenizer.json", R"({"version": "1.0"})");
  CHECK_THROWS_WITH_AS(preflight::read_tokenizer_facts(bad.string()), doctest::Contains("no model.vocab object"),
                       Error);
}
