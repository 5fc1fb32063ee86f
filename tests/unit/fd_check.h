#pragma once
// Gradient checks by central finite differences, shared by every op test (Flashlight's Jacobian-test idea).
//
//   numeric_i = (f(x + eps·e_i) − f(x − eps·e_i)) / (2·eps)
//   rel_err_i = |analytic_i - numeric_i| / max(|analytic_i|, |numeric_i|, floor),
//   floor     = floor_frac * max_j |analytic_j|   (over the checked elements of the tensor)
//
// In double with eps = 1e-5 the truncation error is O(eps^2 * third derivative) ~ 1e-10 and the rounding error
// O(1e-16 |f| / eps) ~ 1e-11 |f|, so a correct gradient lands near 1e-9 relative; the tests require <= 1e-6.
// `floor` (default 1e-3 of the tensor's largest gradient) keeps elements whose true gradient is ~0 from turning
// that rounding noise into a huge relative error: they are measured against the tensor's own gradient scale.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "lib/core/rng.h"

namespace dflash::test {

struct FdResult {
  double max_rel_err = 0;
  size_t worst_index = 0;
  double worst_analytic = 0, worst_numeric = 0;
  size_t checked = 0;
};

// Checks analytic[i] = d loss / d x[i] for the given indices (all when `indices` is empty).
// `loss` must recompute the scalar from the current contents of x.
inline FdResult fd_check(std::vector<double>& x, const std::vector<double>& analytic,
                         const std::function<double()>& loss, std::vector<size_t> indices = {},
                         double eps = 1e-5, double floor_frac = 1e-3) {
  if (indices.empty())
    for (size_t i = 0; i < x.size(); ++i) indices.push_back(i);
  double scale = 0;
  for (size_t i : indices) scale = std::max(scale, std::abs(analytic[i]));
  const double floor = std::max(floor_frac * scale, 1e-300);
  FdResult r;
  for (size_t i : indices) {
    const double saved = x[i];
    x[i] = saved + eps;
    const double fp = loss();
    x[i] = saved - eps;
    const double fm = loss();
    x[i] = saved;
    const double numeric = (fp - fm) / (2 * eps);
    const double err =
        std::abs(analytic[i] - numeric) / std::max({std::abs(analytic[i]), std::abs(numeric), floor});
    if (r.checked == 0 || err > r.max_rel_err) {
      r.max_rel_err = err;
      r.worst_index = i;
      r.worst_analytic = analytic[i];
      r.worst_numeric = numeric;
    }
    ++r.checked;
  }
  return r;
}

// `count` distinct indices drawn from [0, n) (all of them when n ≤ count), deterministic in `seed`.
inline std::vector<size_t> sample_indices(size_t n, size_t count, uint64_t seed) {
  std::vector<size_t> all(n);
  for (size_t i = 0; i < n; ++i) all[i] = i;
  if (n <= count) return all;
  Rng rng(seed, 7);
  for (size_t i = 0; i < count; ++i) std::swap(all[i], all[i + rng.below(n - i)]);
  all.resize(count);
  return all;
}

inline std::vector<double> random_vector(size_t n, uint64_t seed, double scale = 1.0) {
  Rng rng(seed, 1);
  std::vector<double> v(n);
  for (auto& x : v) x = scale * rng.normal();
  return v;
}

inline std::string describe(const FdResult& r) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "max rel err %.3e over %zu elements (worst index %zu: analytic %.12e, numeric %.12e)",
                r.max_rel_err, r.checked, r.worst_index, r.worst_analytic, r.worst_numeric);
  return buf;
}

}  // namespace dflash::test
