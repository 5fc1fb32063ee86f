#include "lib/model/adamw.h"

#include <algorithm>
#include <cmath>

#include "lib/core/error.h"

namespace dflash::model {

kernels::AdamWCoeffs adamw_coeffs(const AdamWSettings& s, int64_t step, double lr) {
  const double bc1 = 1.0 - std::pow(s.beta1, double(step)), bc2 = 1.0 - std::pow(s.beta2, double(step));
  kernels::AdamWCoeffs k;
  k.beta1 = float(s.beta1);
  k.beta2 = float(s.beta2);
  k.step_size = float(lr / bc1);
  k.inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  k.eps = float(s.eps);
  k.decay = float(lr * s.weight_decay);
  return k;
}

template <typename T>
void adamw_update(kernels::Backend<T>& be, ExecContext& ec, float* params, const float* grads, float* m, float* v,
                  const uint8_t* decay_mask, size_t n, int64_t step, const AdamWSettings& s, double lr) {
  be.adamw_step(ec, params, grads, m, v, decay_mask, n, adamw_coeffs(s, step, lr));
}

template <typename T>
double clip_global_norm(kernels::Backend<T>& be, ExecContext& ec, float* g, size_t n, double max_norm) {
  const double norm = std::sqrt(be.sum_squares(ec, g, n));
  if (max_norm > 0 && norm > max_norm) be.scale_master(ec, g, max_norm / (norm + 1e-6), n);
  return norm;
}

template void adamw_update<float>(kernels::Backend<float>&, ExecContext&, float*, const float*, float*, float*,
                                  const uint8_t*, size_t, int64_t, const AdamWSettings&, double);
template double clip_global_norm<float>(kernels::Backend<float>&, ExecContext&, float*, size_t, double);
template void adamw_update<kernels::bf16>(kernels::Backend<kernels::bf16>&, ExecContext&, float*, const float*, float*,
                                          float*, const uint8_t*, size_t, int64_t, const AdamWSettings&, double);
template double clip_global_norm<kernels::bf16>(kernels::Backend<kernels::bf16>&, ExecContext&, float*, size_t,
                                                double);

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
  const std::vector<uint8_t> all(decay_mask.empty() ? n : 0, 1);  // "decay everything"
  adamw_update(kernels::cpu_backend<float>(), kernels::host_exec_context(), params, grads, st.m.data(), st.v.data(),
               decay_mask.empty() ? all.data() : decay_mask.data(), n, st.step, s, lr);
}

double global_norm(const float* g, size_t n) {
  return std::sqrt(kernels::cpu_backend<float>().sum_squares(kernels::host_exec_context(), g, n));
}

double clip_global_norm(float* g, size_t n, double max_norm) {
  return clip_global_norm(kernels::cpu_backend<float>(), kernels::host_exec_context(), g, n, max_norm);
}

double lr_at(int64_t step, int64_t total_steps, double lr, double warmup_ratio, double min_lr_ratio) {
  const int64_t warmup = int64_t(std::ceil(warmup_ratio * double(total_steps)));
  if (step < warmup) return lr * double(step + 1) / double(warmup);
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup - 1);
  const double progress = std::min(1.0, double(step - warmup) / double(decay_steps));
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return lr * (min_lr_ratio + (1.0 - min_lr_ratio) * cosine);
}

}  // namespace dflash::model
