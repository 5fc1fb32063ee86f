#include "lib/train/data_facts.h"

#include <fmt/format.h>

#include "lib/core/error.h"

namespace dflash::train {

namespace {
constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ULL, kFnvPrime = 0x100000001b3ULL;
void mix(uint64_t& h, uint64_t v) {
  h ^= v;
  h *= kFnvPrime;
}
}  // namespace

std::string DataFacts::identity() const {
  return fmt::format("{} sequences, {} tokens, content 0x{:016x}", sequences, tokens, content_hash);
}

DataFacts scan_data_facts(const io::Dataset& data, int mask_token_id, int64_t max_seq_len) {
  DataFacts f;
  f.sequences = data.size();
  f.tokens = data.total_tokens();
  const std::vector<int64_t>& offsets = data.offsets();
  uint64_t h_offsets = kFnvOffset, h_tokens = kFnvOffset, h_mask = kFnvOffset;
  for (int64_t o : offsets) mix(h_offsets, uint64_t(o));
  auto streamed = [&](int64_t seq) {
    const int64_t n = offsets[size_t(seq) + 1] - offsets[size_t(seq)];
    return max_seq_len > 0 && n > max_seq_len ? max_seq_len : n;
  };
  for (int64_t s = 0; s < f.sequences; ++s) f.longest = std::max(f.longest, streamed(s));

  int64_t at = 0, seq = 0;  // file position of the next element and its sequence
  uint8_t previous = 0;     // loss mask of the previous position of the same sequence (0 at a sequence start)
  data.scan([&](const int32_t* tokens, const uint8_t* mask, int64_t n) {
    for (int64_t k = 0; k < n; ++k, ++at) {
      while (at >= offsets[size_t(seq) + 1]) ++seq;  // skips empty sequences too
      const int64_t pos = at - offsets[size_t(seq)];
      if (pos == 0) previous = 0;
      mix(h_tokens, uint32_t(tokens[k]));
      f.max_token = std::max(f.max_token, tokens[k]);
      mix(h_mask, mask[k]);
      if (pos >= streamed(seq)) continue;  // truncated away: never streamed
      if (mask[k]) {
        ++f.trained_tokens;
        if (previous) ++f.anchor_candidates;
        if (tokens[k] == mask_token_id && f.mask_token_trained++ == 0) f.first_mask_seq = seq, f.first_mask_pos = pos;
      }
      previous = mask[k];
    }
  });
  f.content_hash = h_offsets;
  mix(f.content_hash, h_tokens);
  mix(f.content_hash, h_mask);
  return f;
}

void check_data_facts(const DataFacts& f, const TrainConfig& cfg) {
  const std::string& path = cfg.data.path;
  DFLASH_USER_CHECK(f.anchor_candidates > 0,
                    "{}: {} of {} tokens have loss_mask 1{} and no trained token follows another: no anchor can be "
                    "drawn, nothing would be trained; mark the response tokens with loss_mask 1 (data/README.md){}",
                    path, f.trained_tokens, f.tokens, cfg.data.max_seq_len > 0 ? " within data.max_seq_len" : "",
                    cfg.data.max_seq_len > 0 ? " or raise data.max_seq_len" : "");
  DFLASH_USER_CHECK(f.mask_token_trained == 0,
                    "{}: {} trained position(s) hold drafter.mask_token_id = {} (first: sequence {}, position {}): "
                    "the drafter would learn to predict its own mask placeholder; set drafter.mask_token_id to a "
                    "reserved id the data never uses",
                    path, f.mask_token_trained, cfg.drafter.mask_token_id, f.first_mask_seq, f.first_mask_pos);
  DFLASH_USER_CHECK(cfg.drafter.block_size <= f.longest,
                    "drafter.block_size = {} is longer than every sequence of {} (longest{}: {} tokens): no block "
                    "would ever be whole; lower drafter.block_size or use longer sequences",
                    cfg.drafter.block_size, path, cfg.data.max_seq_len > 0 ? " after data.max_seq_len" : "",
                    f.longest);
}

}  // namespace dflash::train
