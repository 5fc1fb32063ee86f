#include "lib/model/adamw.h"

#include <algorithm>
#include <cmath>

#include "lib/core/error.h"

namespace dflash {

void adamw_step(float* params, const float* grads, size_t n, AdamWState& st, const AdamWSettings& s, double lr,
                const std::vector<uint8_t>& decay_mask) {
  DFLASH_CHECK(decay_mask.empty() || decay_mask.size() == n, "adamw: decay mask has {} entries for {} parameters",
               decay_mask.size(), n);
  if (st.m.empty()) {
    st.m.assign(n, 0.0f);
    st.v.assign(n, 0.0f);
  }
  DFLASH_CHECK(st.m.size() == n && st.v.size() == n, "adamw: state holds {} moments for {} parameters", st.m.size(),
               n);
  st.step += 1;
  const double bc1 = 1.0 - std::pow(s.beta1, double(st.step)), bc2 = 1.0 - std::pow(s.beta2, double(st.step));
  const float b1 = float(s.beta1), b2 = float(s.beta2);
  const float step_size = float(lr / bc1), inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2)), eps = float(s.eps);
  const float decay = float(lr * s.weight_decay);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const float g = grads[i];
    st.m[i] = b1 * st.m[i] + (1.0f - b1) * g;
    st.v[i] = b2 * st.v[i] + (1.0f - b2) * g * g;
    if (decay != 0.0f && (decay_mask.empty() || decay_mask[i])) params[i] -= decay * params[i];
    params[i] -= step_size * st.m[i] / (std::sqrt(st.v[i]) * inv_sqrt_bc2 + eps);
  }
}

double global_norm(const float* g, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += double(g[i]) * g[i];
  return std::sqrt(s);
}

double clip_global_norm(float* g, size_t n, double max_norm) {
  const double norm = global_norm(g, n);
  if (max_norm > 0 && norm > max_norm) {
    const float scale = float(max_norm / (norm + 1e-6));
    for (size_t i = 0; i < n; ++i) g[i] *= scale;
  }
  return norm;
}

double lr_at(int64_t step, int64_t total_steps, double lr, double warmup_ratio, double min_lr_ratio) {
  const int64_t warmup = int64_t(std::ceil(warmup_ratio * double(total_steps)));
  if (step < warmup) return lr * double(step + 1) / double(warmup);
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup - 1);
  const double progress = std::min(1.0, double(step - warmup) / double(decay_steps));
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return lr * (min_lr_ratio + (1.0 - min_lr_ratio) * cosine);
}

}  // namespace dflash
