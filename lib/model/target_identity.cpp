#include "lib/model/target_identity.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "lib/core/error.h"
#include "lib/io/safetensors.h"

namespace dflash::model {

namespace {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ULL, kFnvPrime = 0x100000001b3ULL;
constexpr size_t kSample = 4096;

void mix_bytes(uint64_t& h, const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= kFnvPrime;
  }
}
void mix(uint64_t& h, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= kFnvPrime;
  }
}

}  // namespace

std::string target_identity(const std::string& target_dir) {
  uint64_t h = kFnvOffset;
  const std::string config_path = (std::filesystem::path(target_dir) / "config.json").string();
  std::ifstream config(config_path, std::ios::binary);
  DFLASH_USER_CHECK(config, "{}: cannot read (a target folder holds config.json and safetensors)", config_path);
  std::stringstream text;
  text << config.rdbuf();
  const std::string bytes = text.str();
  mix_bytes(h, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  const io::Checkpoint weights(target_dir);
  int64_t tensors = 0, parameters = 0;
  for (const std::string& name : weights.names()) {  // sorted: the same order in every folder
    const io::TensorInfo& t = weights.info(name);
    mix_bytes(h, reinterpret_cast<const uint8_t*>(name.data()), name.size());
    mix(h, uint64_t(t.dtype));
    for (int64_t d : t.shape) mix(h, uint64_t(d));
    const uint8_t* data = weights.raw_bytes(name);
    const size_t n = t.end - t.begin, take = std::min(n, kSample);
    mix_bytes(h, data, take);
    mix_bytes(h, data + (n - take) / 2, take);
    mix_bytes(h, data + (n - take), take);
    ++tensors;
    parameters += t.numel();
  }
  return fmt::format("{} tensors, {} parameters, sampled content 0x{:016x}", tensors, parameters, h);
}

}  // namespace dflash::model
