#pragma once
// dflash_eval's evaluation (docs/eval.md): the real acceptance length of a drafter, greedy speculative decoding of
// every prompt with the target and the drafter (lib/eval/spec_decode.h), optionally checked against plain greedy
// decoding, with the teacher-forced τ of the same sequences and tree verification beside it. The target runs as one
// TP group over `tp` (a single process: TP 1), the drafter on its rank 0, which holds the results. The program
// (apps/dflash_eval) parses the options and prints; everything it decides is here.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/device.h"
#include "lib/comm/transport.h"
#include "lib/eval/spec_decode.h"
#include "lib/eval/spec_tree.h"
#include "lib/io/dataset.h"
#include "lib/model/generate.h"
#include "lib/model/target.h"
#include "lib/state/drafter_source.h"

namespace dflash::eval {

struct DrafterEvalOptions {
  std::string target, drafter, prompts;  // --target DIR, --drafter DIR, --prompts P.h5
  kernels::Device device = kernels::Device::cpu;  // --device: where the target's forward runs
  std::optional<kernels::Precision> precision;     // --precision; default: the device's (bf16 on cuda)
  int max_new_tokens = 128;
  int64_t limit = 0;               // only the first K prompts (0 = all)
  int eos = -1;                    // stop a prompt after the target generates it (-1 = never)
  std::optional<int> vocab_limit;  // default: the drafter's mask_token_id when it is the target's last id
  std::optional<int> tree_budget;  // given: also tree decoding
  std::optional<int> tree_topk;    // default 4; needs tree_budget
  bool check_greedy = false;       // also plain greedy decoding, which must give the same tokens
  bool teacher_forced = false;     // also the teacher-forced τ on the generated sequences
};

// What an evaluation found (complete on tp rank 0).
struct DrafterEvalResult {
  nlohmann::ordered_json json;     // what --out writes
  std::vector<std::string> lines;  // the summary the program prints ("eval: tau ...")
};

class DrafterEval {
 public:
  // Loads the drafter, the target (binding the GPU for --device cuda) and the prompts, and checks every option
  // against them: a user error names the option, the value and the fix. Collective over tp.
  DrafterEval(const DrafterEvalOptions& options, comm::Transport& tp);
  ~DrafterEval();
  // "eval: drafter DIR (kind, block B, taps ...) on target DIR (TP k), N prompts, up to M new tokens each"
  std::string describe() const;
  // What the program should warn about before it runs (tp rank 0): a drafter trained against another target.
  std::vector<std::string> warnings() const;
  // Decodes every prompt (collective over tp); the result is complete on tp rank 0.
  DrafterEvalResult run();

 private:
  struct Impl;
  struct Totals;
  DrafterEvalResult summarize(const Totals& t) const;  // rank 0: the JSON and the lines
  std::unique_ptr<Impl> impl_;
};

}  // namespace dflash::eval
