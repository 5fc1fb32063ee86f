// dflash_data import-jsonl IN.jsonl OUT.h5 [--vocab V]
// One JSON object per line: {"input_ids": [int, ...], "loss_mask": [0|1, ...]} (loss_mask optional, default all
// 1). Writes OUT.h5 through OUT.h5.partial, renamed at the end, so a failed import (a bad line, a full disk)
// leaves no half-written dataset and an existing OUT.h5 unchanged.
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/dflash_data/commands.h"
#include "lib/core/cli_app.h"
#include "lib/core/error.h"
#include "lib/io/dataset.h"

namespace dflash::data {

namespace {

// Reads one line's object into tokens/mask; errors name the file, line and field.
void parse_line(const std::string& where, const std::string& line, int64_t vocab, std::vector<int32_t>& tokens,
                std::vector<uint8_t>& mask) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(fmt::format("{}: not valid JSON ({})", where, e.what()));
  }
  DFLASH_USER_CHECK(j.is_object(), "{}: expected a JSON object with \"input_ids\", found {}", where, j.type_name());
  auto ids = j.find("input_ids");
  DFLASH_USER_CHECK(ids != j.end(), "{}: missing \"input_ids\" (an array of token ids)", where);
  DFLASH_USER_CHECK(ids->is_array(), "{}: \"input_ids\" must be an array of token ids, found {}", where, ids->type_name());
  DFLASH_USER_CHECK(!ids->empty(), "{}: \"input_ids\" is empty; drop the line or give its tokens", where);
  tokens.clear();
  for (size_t i = 0; i < ids->size(); ++i) {
    const auto& v = (*ids)[i];
    DFLASH_USER_CHECK(v.is_number_integer(), "{}: \"input_ids\"[{}] is {}, expected an integer token id", where, i,
                 v.dump());
    int64_t id = v.is_number_unsigned() ? int64_t(std::min<uint64_t>(v.get<uint64_t>(), INT64_MAX)) : v.get<int64_t>();
    DFLASH_USER_CHECK(id >= 0 && id <= std::numeric_limits<int32_t>::max(),
                 "{}: \"input_ids\"[{}] is {}; token ids must be in [0, 2^31)", where, i, id);
    DFLASH_USER_CHECK(vocab <= 0 || id < vocab,
                 "{}: \"input_ids\"[{}] is {} >= --vocab {}; tokenized for another model?", where, i, id, vocab);
    tokens.push_back(int32_t(id));
  }
  mask.assign(tokens.size(), 1);
  auto m = j.find("loss_mask");
  if (m == j.end() || m->is_null()) return;
  DFLASH_USER_CHECK(m->is_array(), "{}: \"loss_mask\" must be an array of 0/1, found {}", where, m->type_name());
  DFLASH_USER_CHECK(m->size() == tokens.size(), "{}: \"loss_mask\" has {} values but \"input_ids\" has {}; give one "
               "0/1 per token", where, m->size(), tokens.size());
  for (size_t i = 0; i < m->size(); ++i) {
    const auto& v = (*m)[i];
    if (v.is_boolean()) {
      mask[i] = v.get<bool>();
      continue;
    }
    DFLASH_USER_CHECK(v.is_number_integer() && (v.get<int64_t>() == 0 || v.get<int64_t>() == 1),
                 "{}: \"loss_mask\"[{}] is {}, expected 0 or 1", where, i, v.dump());
    mask[i] = uint8_t(v.get<int64_t>());
  }
}

}  // namespace

int run_import_jsonl(int argc, char** argv) {
  CliApp app("Converts JSONL of {input_ids, loss_mask?} to an HDF5 dataset (through OUT.h5.partial: a failed import "
             "leaves an existing OUT.h5 unchanged).", "dflash_data import-jsonl");
  std::string in, out;
  int64_t vocab = 0;
  app.add_option("IN", in, "one JSON object per line: {\"input_ids\": [ids...], \"loss_mask\": [0/1...]}; "
                 "loss_mask is optional (default: every token trained); blank lines are skipped")
      ->required()->type_name("IN.jsonl");
  app.add_option("OUT", out, "the dataset to write")->required()->type_name("OUT.h5");
  app.add_option("--vocab", vocab, "reject token ids >= V (the target's vocab_size; 0 = no check)")->type_name("V")
      ->check(non_negative_number());
  if (!parse_command_line(app, argc, argv)) return 0;
  std::ifstream f(in);
  DFLASH_USER_CHECK(f.good(), "{}: cannot open for reading (does the file exist?)", in);

  // The writer removes OUT.h5.partial itself when anything fails (a bad line, a full disk); OUT.h5 is only
  // replaced by commit(), after the file was completely written, closed and fsync'd.
  io::DatasetWriter writer(out + ".partial");
  int64_t lines = 0, no_trained = 0, trained = 0;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  for (std::string line; std::getline(f, line);) {
    ++lines;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    parse_line(fmt::format("{}:{}", in, lines), line, vocab, tokens, mask);
    int64_t t = 0;
    for (uint8_t v : mask) t += v;
    trained += t;
    no_trained += t == 0;
    writer.add(tokens, mask);
  }
  DFLASH_USER_CHECK(!f.bad(), "{}: read error after line {}", in, lines);
  DFLASH_USER_CHECK(writer.sequences() > 0, "{}: no sequences (the file is empty or all lines are blank)", in);
  writer.commit(out);
  std::printf("wrote %s: %lld sequences, %lld tokens, %.1f%% trained (loss_mask = 1)\n", out.c_str(),
              (long long)writer.sequences(), (long long)writer.tokens(),
              100.0 * double(trained) / double(std::max<int64_t>(writer.tokens(), 1)));
  if (no_trained > 0)
    std::printf("note: %lld sequences have no trained token (loss_mask all 0); they give no loss\n",
                (long long)no_trained);
  return 0;
}

}  // namespace dflash::data
