// Every CPU op's backward against central finite differences in double (formula and eps in fd_check.h):
// loss = Σ r ⊙ op(x) for a fixed random r, so d loss / d x = backward(dy = r). Tolerance: max rel err ≤ 1e-6.
#include <doctest/doctest.h>

#include <limits>
#include <vector>

#include "fd_check.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "lib/core/error.h"

using namespace dflash;
using namespace dflash::test;
using Vec = std::vector<double>;

static double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

constexpr double kTol = 1e-6;

TEST_CASE("linear backward (dx and dW) matches finite differences") {
  const int N = 5, in = 7, out = 4;
  Vec x = random_vector(N * in, 1), W = random_vector(out * in, 2), r = random_vector(N * out, 3);
  Vec dx(N * in, 0.0), dW(out * in, 0.0), y(N * out);
  auto loss = [&] {
    cpu::linear_forward(y.data(), x.data(), W.data(), N, in, out);
    return dot(y, r);
  };
  cpu::linear_backward(dx.data(), dW.data(), r.data(), x.data(), W.data(), N, in, out);
  auto rx = fd_check(x, dx, loss);
  auto rw = fd_check(W, dW, loss);
  INFO("dx: " << describe(rx) << "\ndW: " << describe(rw));
  CHECK(rx.max_rel_err <= kTol);
  CHECK(rw.max_rel_err <= kTol);
  // += semantics: a second backward doubles the gradient
  Vec dx2 = dx;
  cpu::linear_backward(dx2.data(), (double*)nullptr, r.data(), x.data(), W.data(), N, in, out);
  for (size_t i = 0; i < dx.size(); ++i) CHECK(dx2[i] == doctest::Approx(2 * dx[i]).epsilon(1e-14));
}

TEST_CASE("rmsnorm backward (dx and dw) matches finite differences") {
  const int rows = 6, dim = 16;
  Vec x = random_vector(rows * dim, 4), w = random_vector(dim, 5), r = random_vector(rows * dim, 6);
  for (auto& v : w) v += 1.0;
  Vec y(rows * dim), rstd(rows), dx(rows * dim, 0.0), dw(dim, 0.0);
  auto loss = [&] {
    cpu::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, dim, 1e-6);
    return dot(y, r);
  };
  loss();
  cpu::rmsnorm_backward(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), rows, dim);
  auto rx = fd_check(x, dx, loss);
  auto rw = fd_check(w, dw, loss);
  INFO("dx: " << describe(rx) << "\ndw: " << describe(rw));
  CHECK(rx.max_rel_err <= kTol);
  CHECK(rw.max_rel_err <= kTol);
}

TEST_CASE("rope backward matches finite differences and forward preserves norms") {
  const int rows = 5, heads = 3, hd = 8;
  std::vector<int> pos = {0, 1, 7, 100, 4093};
  Vec x = random_vector(rows * heads * hd, 7), r = random_vector(rows * heads * hd, 8);
  Vec y(x.size()), dx(x.size(), 0.0);
  auto loss = [&] {
    cpu::rope_forward(y.data(), x.data(), pos.data(), rows, heads, hd, 10000.0);
    return dot(y, r);
  };
  loss();
  CHECK(dot(y, y) == doctest::Approx(dot(x, x)).epsilon(1e-12));  // a rotation
  for (int i = 0; i < heads * hd; ++i) CHECK(y[i] == x[i]);       // position 0 is the identity
  cpu::rope_backward(dx.data(), r.data(), pos.data(), rows, heads, hd, 10000.0);
  auto rx = fd_check(x, dx, loss);
  INFO(describe(rx));
  CHECK(rx.max_rel_err <= kTol);
}

// An odd head_dim's last dim has no rotation partner: forward passes it through, so its gradient is dy itself. The
// two-op rope_backward used to leave it at zero (the fused head_norm_rope was right); y starts as NaN so that a dim
// forward leaves unwritten fails too.
TEST_CASE("rope backward at odd head_dim (the last dim passes through) matches finite differences") {
  for (int hd : {1, 5, 9}) {
    const int rows = 4, heads = 2;
    std::vector<int> pos = {0, 3, 50, 1000};
    Vec x = random_vector(rows * heads * hd, 21 + hd), r = random_vector(rows * heads * hd, 22 + hd);
    Vec y(x.size(), std::numeric_limits<double>::quiet_NaN()), dx(x.size(), 0.0);
    auto loss = [&] {
      cpu::rope_forward(y.data(), x.data(), pos.data(), rows, heads, hd, 10000.0);
      return dot(y, r);
    };
    loss();
    CHECK(dot(y, y) == doctest::Approx(dot(x, x)).epsilon(1e-12));
    for (int row = 0; row < rows * heads; ++row) CHECK(y[size_t(row) * hd + hd - 1] == x[size_t(row) * hd + hd - 1]);
    cpu::rope_backward(dx.data(), r.data(), pos.data(), rows, heads, hd, 10000.0);
    for (int row = 0; row < rows * heads; ++row) CHECK(dx[size_t(row) * hd + hd - 1] == r[size_t(row) * hd + hd - 1]);
    auto rx = fd_check(x, dx, loss);
    INFO("head_dim " << hd << ": " << describe(rx));
    CHECK(rx.max_rel_err <= kTol);
  }
}

// With the last dim passed through, the two-op backward (rope_backward into zeros, then rmsnorm_backward) is the
// fused head_norm_rope_backward bit for bit at odd head_dim too (the even case: test_head_norm_rope.cpp).
TEST_CASE("rope backward at odd head_dim: rope then rmsnorm backward equals the fused head_norm_rope_backward") {
  for (int hd : {1, 5, 9}) {
    const int rows = 3, heads = 2, n = rows * heads;
    std::vector<int> pos = {0, 7, 300};
    Vec x = random_vector(size_t(n) * hd, 31 + hd), w = random_vector(hd, 32 + hd), dy = random_vector(size_t(n) * hd, 33 + hd);
    Vec y(x.size()), rstd(static_cast<size_t>(n)), g(x.size(), 0.0), dx_two(x.size(), 0.0), dw_two(hd, 0.0), dx_fused(x.size(), 0.0),
        dw_fused(hd, 0.0);
    cpu::head_norm_rope_forward(y.data(), rstd.data(), x.data(), w.data(), pos.data(), rows, heads, hd, 1e-6, 1e4);
    cpu::rope_backward(g.data(), dy.data(), pos.data(), rows, heads, hd, 1e4);
    cpu::rmsnorm_backward(dx_two.data(), dw_two.data(), g.data(), x.data(), w.data(), rstd.data(), n, hd);
    cpu::head_norm_rope_backward(dx_fused.data(), dw_fused.data(), dy.data(), x.data(), w.data(), rstd.data(),
                                 pos.data(), rows, heads, hd, 1e4);
    INFO("head_dim " << hd);
    CHECK(dx_two == dx_fused);
    CHECK(dw_two == dw_fused);
  }
}

TEST_CASE("swiglu backward matches finite differences") {
  const int n = 40;
  Vec g = random_vector(n, 9, 2.0), u = random_vector(n, 10), r = random_vector(n, 11);
  Vec h(n), dg(n, 0.0), du(n, 0.0);
  auto loss = [&] {
    cpu::swiglu_forward(h.data(), g.data(), u.data(), n);
    return dot(h, r);
  };
  cpu::swiglu_backward(dg.data(), du.data(), r.data(), g.data(), u.data(), n);
  auto rg = fd_check(g, dg, loss);
  auto ru = fd_check(u, du, loss);
  INFO("dgate: " << describe(rg) << "\ndup: " << describe(ru));
  CHECK(rg.max_rel_err <= kTol);
  CHECK(ru.max_rel_err <= kTol);
}

TEST_CASE("embedding gathers rows (ids are validated by its callers: kernels never throw)") {
  const int vocab = 4, dim = 3;
  Vec table = random_vector(vocab * dim, 12), out(2 * dim);
  std::vector<int32_t> ids = {3, 1};
  cpu::embedding_forward(out.data(), table.data(), ids.data(), 2, dim, vocab);
  for (int i = 0; i < dim; ++i) {
    CHECK(out[i] == table[3 * dim + i]);
    CHECK(out[dim + i] == table[1 * dim + i]);
  }
}
