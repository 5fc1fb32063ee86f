// The fused per-head RMSNorm + RoPE of the CPU backend (kernels/cpu/rope.h: head_norm_rope_forward/backward)
// against the two-op sequence it replaces in the drafter and the target — rmsnorm_forward over rows·heads rows, then
// rope_forward; rope_backward into zeros, then rmsnorm_backward — bit for bit in double and float (the same
// operations in the same order), and its gradients (dx, dw) against central finite differences in double.
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "fd_check.h"
#include "kernels/backend.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"

using namespace dflash;
using namespace dflash::test;

namespace {

template <typename T>
std::vector<T> random_t(size_t n, uint64_t seed, double scale = 1.0) {
  const std::vector<double> d = random_vector(n, seed, scale);
  return std::vector<T>(d.begin(), d.end());
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Fused vs two-op, forward and backward, for one shape.
template <typename T>
void check_equals_two_ops(int rows, int heads, int head_dim, uint64_t seed) {
  CAPTURE(rows);
  CAPTURE(heads);
  CAPTURE(head_dim);
  const size_t n = size_t(rows) * heads * head_dim;
  std::vector<int> pos(static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r) pos[size_t(r)] = (r * 7919 + 3) % 100003;  // angles up to ~1e5 rad
  const auto x = random_t<T>(n, seed, 3.0), w = random_t<T>(size_t(head_dim), seed + 1),
             dy = random_t<T>(n, seed + 2), dx0 = random_t<T>(n, seed + 3), dw0 = random_t<T>(size_t(head_dim), seed + 4);
  const double theta = 1e6;
  const T eps = T(1e-6);

  // two ops, as the drafter ran them
  std::vector<T> y2(n), rstd2(size_t(rows) * heads);
  cpu::rmsnorm_forward(y2.data(), rstd2.data(), x.data(), w.data(), rows * heads, head_dim, eps);
  cpu::rope_forward(y2.data(), y2.data(), pos.data(), rows, heads, head_dim, theta);
  std::vector<T> dn(n, T(0)), dx2 = dx0, dw2 = dw0;
  cpu::rope_backward(dn.data(), dy.data(), pos.data(), rows, heads, head_dim, theta);
  cpu::rmsnorm_backward(dx2.data(), dw2.data(), dn.data(), x.data(), w.data(), rstd2.data(), rows * heads, head_dim);

  std::vector<T> y1(n), rstd1(size_t(rows) * heads), dx1 = dx0, dw1 = dw0;
  cpu::head_norm_rope_forward(y1.data(), rstd1.data(), x.data(), w.data(), pos.data(), rows, heads, head_dim, eps,
                              theta);
  cpu::head_norm_rope_backward(dx1.data(), dw1.data(), dy.data(), x.data(), w.data(), rstd1.data(), pos.data(), rows,
                               heads, head_dim, theta);
  CHECK(same_bits(y1, y2));
  CHECK(same_bits(rstd1, rstd2));
  if (head_dim % 2 == 0) {  // rope_backward leaves an odd head's last dim out; the fused adjoint passes it through
    CHECK(same_bits(dx1, dx2));
    CHECK(same_bits(dw1, dw2));
  }

  // y may alias x; a null dw skips it and leaves dx the same
  std::vector<T> inplace = x, rstd3(rstd1.size()), dx3 = dx0;
  cpu::head_norm_rope_forward(inplace.data(), rstd3.data(), inplace.data(), w.data(), pos.data(), rows, heads,
                              head_dim, eps, theta);
  CHECK(same_bits(inplace, y1));
  cpu::head_norm_rope_backward(dx3.data(), static_cast<T*>(nullptr), dy.data(), x.data(), w.data(), rstd1.data(),
                               pos.data(), rows, heads, head_dim, theta);
  CHECK(same_bits(dx3, dx1));

  // the backend entry points forward to the same kernels
  kernels::Backend<T>& be = kernels::cpu_backend<T>();
  std::vector<T> y4(n), rstd4(rstd1.size()), dx4 = dx0, dw4 = dw0;
  be.head_norm_rope_forward(be.context(), y4.data(), rstd4.data(), x.data(), w.data(), pos.data(), rows, heads,
                            head_dim, double(eps), theta);
  be.head_norm_rope_backward(be.context(), dx4.data(), dw4.data(), dy.data(), x.data(), w.data(), rstd4.data(),
                             pos.data(), rows, heads, head_dim, theta);
  CHECK(same_bits(y4, y1));
  CHECK(same_bits(dx4, dx1));
  CHECK(same_bits(dw4, dw1));
}

}  // namespace

TEST_CASE("head norm rope: fused per-head RMSNorm + RoPE equals rmsnorm then rope bit for bit (double, float)") {
  // head dims of the drafter (128), Qwen3.6's full attention (256), small and odd ones (the last dim of an odd head
  // is normed, never rotated; forward only), one and many heads
  const int shapes[][3] = {{1, 1, 2}, {3, 2, 7}, {5, 3, 16}, {7, 4, 64}, {4, 8, 128}, {3, 2, 256}, {1, 1, 1}};
  uint64_t seed = 100;
  for (const auto& s : shapes) {
    check_equals_two_ops<double>(s[0], s[1], s[2], seed += 10);
    check_equals_two_ops<float>(s[0], s[1], s[2], seed += 10);
  }
}

TEST_CASE("head norm rope: backward (dx, dw) matches central finite differences in double") {
  // loss = Σ r ⊙ rope(rmsnorm(x)) for a fixed random r: d loss / d x and d loss / d w are the backward of dy = r
  for (int head_dim : {8, 9, 32}) {
    CAPTURE(head_dim);
    const int rows = 4, heads = 3;
    const size_t n = size_t(rows) * heads * head_dim;
    const std::vector<int> pos = {0, 5, 311, 40000};
    std::vector<double> x = random_vector(n, 7, 2.0), w = random_vector(size_t(head_dim), 8),
                        r = random_vector(n, 9);
    std::vector<double> y(n), rstd(size_t(rows) * heads);
    auto loss = [&] {
      cpu::head_norm_rope_forward(y.data(), rstd.data(), x.data(), w.data(), pos.data(), rows, heads, head_dim,
                                  1e-6, 10000.0);
      double s = 0;
      for (size_t i = 0; i < n; ++i) s += y[i] * r[i];
      return s;
    };
    loss();
    std::vector<double> dx(n, 0.0), dw(size_t(head_dim), 0.0);
    cpu::head_norm_rope_backward(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), pos.data(), rows,
                                 heads, head_dim, 10000.0);
    const FdResult rx = fd_check(x, dx, loss);
    INFO("dx: " << describe(rx));
    CHECK(rx.max_rel_err <= 1e-6);
    const FdResult rw = fd_check(w, dw, loss);
    INFO("dw: " << describe(rw));
    CHECK(rw.max_rel_err <= 1e-6);
  }
}
