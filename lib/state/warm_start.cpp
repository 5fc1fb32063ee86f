#include "lib/state/warm_start.h"

#include <cstdio>
#include <filesystem>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lib/core/error.h"
#include "lib/state/drafter_source.h"

namespace dflash::state {

namespace fs = std::filesystem;

std::string warm_start_identity(const std::string& init) {
  const std::string dir = [&] {
    try {
      return drafter_source_dir(init);
    } catch (const Error& e) {
      throw Error(fmt::format("drafter.init = {}: {}", init, e.what()));
    }
  }();
  const std::string file = (fs::path(dir) / "model.safetensors").string();
  FILE* f = std::fopen(file.c_str(), "rb");
  DFLASH_USER_CHECK(f, "drafter.init = {}: cannot read {}", init, file);
  uint64_t h = 0xcbf29ce484222325ULL, bytes = 0;
  std::vector<unsigned char> buf(1 << 20);
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) {
    for (size_t i = 0; i < n; ++i) h = (h ^ buf[i]) * 0x100000001b3ULL;
    bytes += n;
  }
  std::fclose(f);
  const bool is_export = fs::exists(fs::path(dir) / "config.json");
  return fmt::format("{} {} (model.safetensors {} bytes, content 0x{:016x})", is_export ? "export" : "checkpoint",
                     dir, bytes, h);
}

WarmStart load_warm_start(const TrainConfig& cfg, const train::RunPlan& plan, std::string identity) {
  const std::string& init = cfg.drafter.init;
  DrafterSource src = [&] {
    try {
      return load_drafter_source(init);
    } catch (const Error& e) {
      throw Error(fmt::format("drafter.init = {}: {}", init, e.what()));
    }
  }();
  const model::DrafterConfig& have = src.drafter.config;
  // the facts a user sets by key, with the key's name; then any other shape field
  auto refuse_if = [&](bool differs, const char* key, const std::string& theirs, const std::string& ours) {
    DFLASH_USER_CHECK(!differs, "drafter.init = {}: its {} is {}, this run has {} = {}; train with the same {} or "
                      "leave drafter.init empty for a random start", src.dir, key, theirs, key, ours, key);
  };
  refuse_if(have.vocab != plan.drafter.vocab, "vocabulary (the target's vocab_size)", fmt::format("{}", have.vocab),
            fmt::format("{}", plan.drafter.vocab));
  refuse_if(have.block_size != plan.drafter.block_size, "drafter.block_size", fmt::format("{}", have.block_size),
            fmt::format("{}", plan.drafter.block_size));
  refuse_if(have.mask_token_id != plan.drafter.mask_token_id, "drafter.mask_token_id",
            fmt::format("{}", have.mask_token_id), fmt::format("{}", plan.drafter.mask_token_id));
  refuse_if(src.drafter.info.target_layer_ids != plan.tap_ids, "target.target_layer_ids",
            fmt::format("[{}]", fmt::join(src.drafter.info.target_layer_ids, ", ")),
            fmt::format("[{}]", fmt::join(plan.tap_ids, ", ")));
  const model::DrafterConfigDifference d = model::first_difference(have, plan.drafter);
  refuse_if(!d.field.empty(), ("drafter." + d.field).c_str(), d.a, d.b);
  return WarmStart{std::move(src.drafter.params), std::move(identity)};
}

}  // namespace dflash::state
