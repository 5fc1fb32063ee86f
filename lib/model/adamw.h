#pragma once
// AdamW on fp32 master weights, global-norm gradient clipping, and the LR schedule (linear warmup + cosine).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "lib/model/adamw_settings.h"

namespace dflash::model {

struct AdamWState {
  std::vector<float> m, v;  // [P] first and second moments, fp32
  int64_t step = 0;         // updates taken (the bias corrections use step after increment)
};

// The constants of update number `step` (1-based, after increment): bias corrections folded in.
kernels::AdamWCoeffs adamw_coeffs(const AdamWSettings& s, int64_t step, double lr);

// One update on a backend: params, m, v [n] (=), all fp32 in the backend's memory; decay_mask [n] of 0/1 there too.
// step: the update's number (1-based), for the bias corrections.
template <typename T>
void adamw_update(kernels::Backend<T>& be, ExecContext& ec, float* params, const float* grads, float* m, float* v,
                  const uint8_t* decay_mask, size_t n, int64_t step, const AdamWSettings& s, double lr);

// Scales grads (=) on a backend so that their global norm is at most max_norm; returns the norm before clipping.
// max_norm <= 0 disables clipping.
template <typename T>
double clip_global_norm(kernels::Backend<T>& be, ExecContext& ec, float* grads, size_t n, double max_norm);

// The same on host memory with the CPU backend.
// One update of params [P] from grads [P] at learning rate lr: params (=), state (=).
// decay_mask: [P] of 0/1, or empty for "decay everything".
void adamw_step(float* params, const float* grads, size_t n, AdamWState& state, const AdamWSettings& s, double lr,
                const std::vector<uint8_t>& decay_mask);

// sqrt(Σ g²) accumulated in double (order fixed: index order).
double global_norm(const float* grads, size_t n);

double clip_global_norm(float* grads, size_t n, double max_norm);

// LR at step (0-based) of total_steps: linear warmup from lr/warmup to lr over warmup_steps, then cosine decay
// to min_lr_ratio·lr at the last step.
double lr_at(int64_t step, int64_t total_steps, double lr, double warmup_ratio, double min_lr_ratio);

}  // namespace dflash::model
