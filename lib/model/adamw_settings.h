#pragma once
// The AdamW constants (lib/model/adamw.h). The config's `optim` section IS this struct plus the schedule keys
// (lib/config/config.h: OptimSection derives from it), so each default below is the one docs/config.md shows.

namespace dflash::model {

struct AdamWSettings {
  double lr = 6e-4;           // optim.lr: the peak learning rate (the schedule scales it per step)
  double weight_decay = 0.0;  // decoupled; applied only where decay_mask is 1 (matrices, not norm weights)
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
};

}  // namespace dflash::model
