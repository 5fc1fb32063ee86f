#include "apps/dflash_data/regenerate_dataset.h"

#include <string>
#include <vector>

#include <fmt/format.h>

#include "lib/core/error.h"
#include "lib/core/timer.h"

namespace dflash::data {

RegenerateStats regenerate_dataset(model::TargetModel& target, model::GreedyHead& head, const io::Dataset& prompts,
                                   io::DatasetWriter* out, const model::GenerateOptions& options, int64_t limit,
                                   const std::function<void(const RegenerateStats&)>& progress) {
  const int64_t n = model::check_prompts(prompts, limit);  // fail before any generation
  RegenerateStats st;
  Timer timer;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<int32_t> prompt = model::prompt_of(prompts.read(i), prompts.path());
    std::vector<int32_t> continuation;
    try {
      continuation = model::greedy_generate(target, head, prompt, options);
    } catch (const Error& e) {
      throw Error(fmt::format("{}: sequence {}: {}", prompts.path(), i, e.what()));
    }
    tokens = prompt;
    tokens.insert(tokens.end(), continuation.begin(), continuation.end());
    mask.assign(prompt.size(), 0);
    mask.resize(tokens.size(), 1);
    if (out) out->add(tokens, mask);
    st.sequences += 1;
    st.prompt_tokens += int64_t(prompt.size());
    st.new_tokens += int64_t(continuation.size());
    st.eos_stops += int(continuation.size()) < options.max_new_tokens;
    st.seconds = timer.seconds();
    if (progress) progress(st);
  }
  return st;
}

}  // namespace dflash::data
