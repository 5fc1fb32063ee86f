#include "lib/train/run_plan.h"

#include <limits>
#include <set>

#include "lib/core/error.h"
#include "lib/train/anchors.h"

namespace dflash::train {

namespace {

int or_target(int value, int target_value) { return value > 0 ? value : target_value; }
double or_target(double value, double target_value) { return value > 0 ? value : target_value; }

}  // namespace

RunPlan make_run_plan(const TrainConfig& cfg, const model::QwenConfig& t, int64_t num_sequences) {
  RunPlan p;
  p.target = t;
  const DrafterSection& d = cfg.drafter;
  DFLASH_USER_CHECK(d.hidden == 0 || d.hidden == t.hidden,
               "drafter.hidden = {} but the target's hidden_size is {}: the drafter reads the target's embedding "
               "and hidden states, so set drafter.hidden to 0 (= the target's) or {}",
               d.hidden, t.hidden, t.hidden);
  model::DrafterConfig& c = p.drafter;
  c.hidden = t.hidden;
  c.layers = d.layers;
  c.heads = or_target(d.heads, t.heads);
  c.kv_heads = or_target(d.kv_heads, t.kv_heads);
  c.head_dim = or_target(d.head_dim, t.head_dim);
  c.intermediate = or_target(d.intermediate, t.intermediate);
  c.block_size = d.block_size;
  c.n_taps = cfg.target.n_taps;
  c.vocab = t.vocab;
  DFLASH_USER_CHECK(d.mask_token_id >= 0 && d.mask_token_id < t.vocab,
               "drafter.mask_token_id = {} is outside the target vocabulary [0, {}): use a reserved token row "
               "(151669 for Qwen3, 248070 for Qwen3.5/3.6)",
               d.mask_token_id, t.vocab);
  c.mask_token_id = d.mask_token_id;
  c.rope_theta = or_target(d.rope_theta, t.rope_theta);
  c.rms_norm_eps = or_target(d.rms_eps, t.rms_norm_eps);
  c.window.assign(c.layers, 0);
  for (size_t l = 0; l < d.layer_types.size(); ++l)
    if (d.layer_types[l] == "sliding") {
      DFLASH_USER_CHECK(d.sliding_window > 0,
                   "drafter.layer_types[{}] is \"sliding\" but drafter.sliding_window is {}: set a window (e.g. "
                   "2048)",
                   l, d.sliding_window);
      c.window[l] = d.sliding_window;
    }
  c.validate();

  p.tap_ids = cfg.target.target_layer_ids.empty() ? default_target_layer_ids(t.layers, cfg.target.n_taps)
                                                  : cfg.target.target_layer_ids;
  DFLASH_USER_CHECK(int(p.tap_ids.size()) == cfg.target.n_taps,
               "target.target_layer_ids has {} entries but target.n_taps is {}: give one id per tap", p.tap_ids.size(),
               cfg.target.n_taps);
  for (int id : p.tap_ids)
    DFLASH_USER_CHECK(id >= 0 && id < t.layers,
                 "target layer id {} (target.target_layer_ids) is outside the target's decoder layers [0, {})", id,
                 t.layers);
  DFLASH_USER_CHECK(std::set<int>(p.tap_ids.begin(), p.tap_ids.end()).size() == p.tap_ids.size(),
               "target layer ids repeat a layer; with {} target layers and n_taps = {} give distinct "
               "target.target_layer_ids",
               t.layers, cfg.target.n_taps);

  const LossSection& l = cfg.loss;
  p.loss = l;  // the loss section is the model's settings (lib/model/vocab_loss_settings.h)
  p.loss.block_size = c.block_size;
  // D-PACE replaces the decay (as in every source): the rows keep weight loss_mask · [in sequence] (γ = ∞ gives
  // exp(−(k−1)/γ) = 1), and the loss multiplies each by its block's D-PACE factor
  p.decay_gamma = l.position_weight != model::PositionWeight::decay ? std::numeric_limits<double>::infinity()
                  : l.decay_gamma > 0                              ? l.decay_gamma
                                                                   : default_decay_gamma(c.block_size);

  p.num_sequences = num_sequences;
  const int64_t per_step = int64_t(cfg.layout.drafter_dp) * cfg.optim.micro_batches;
  p.steps_per_epoch = num_sequences / per_step;
  DFLASH_USER_CHECK(p.steps_per_epoch > 0,
               "{} holds {} sequences, fewer than one step needs (layout.drafter_dp {} x optim.micro_batches {} = "
               "{}): use more data or fewer micro-batches",
               cfg.data.path, num_sequences, cfg.layout.drafter_dp, cfg.optim.micro_batches, per_step);
  p.total_steps = cfg.run.steps > 0 ? cfg.run.steps : int64_t(cfg.data.epochs) * p.steps_per_epoch;
  return p;
}

int streamed_length(const TrainConfig& cfg, const io::Dataset& data, int64_t index) {
  const int64_t n = data.length(index);
  return int(cfg.data.max_seq_len > 0 && n > cfg.data.max_seq_len ? cfg.data.max_seq_len : n);
}

}  // namespace dflash::train
