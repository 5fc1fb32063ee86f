// The warp matrix instructions of kernels/cuda/mma.cuh on the emulated GPU, on hand-computed tiles: the fragment
// layouts against the PTX ISA's figures (written out below as tables, independently of mma.cuh's formulas), mma
// against a triple loop and element by element, ldmatrix against each element's own index, cp.async's deferred
// completion, and planted misuses, each of which must stop the kernel with a message (run as child processes of
// this binary: the "emu mma child:" test cases, skipped in a normal run).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/cuda/emu/warp_mma.h"
#include "kernels/cuda/mma.cuh"
#include "tests/emu/mma_kernels.h"

// kernel_launch.cuh reports a refused launch through cuda_fail, which the dflash library defines
// (kernels/cuda/context.cpp); this binary links only the emulated GPU, so it brings its own.
namespace dflash::kernels::cuda {
void cuda_fail(const char* what, const char* file, int line, const char* error) {
  throw std::runtime_error(std::string("CUDA: ") + what + " failed at " + file + ":" + std::to_string(line) + ": " +
                           error);
}
}  // namespace dflash::kernels::cuda

namespace {

namespace kc = dflash::kernels::cuda;
using emu_mma_test::MmaDefect;

// ---- the PTX ISA's fragment figures, cell by cell: "lane.element" at (row, col) of the tile ----
// "Matrix Fragments for mma.m16n8k16 with floating point type": Figure "MMA .m16n8k16 fragment layout for matrix
// A with .f16 / .bf16 type" (cell T<lane>: a<i>; columns 8–15 after the bar).
const char* const kFigureA[16] = {
    " 0.0  0.1  1.0  1.1  2.0  2.1  3.0  3.1 |  0.4  0.5  1.4  1.5  2.4  2.5  3.4  3.5",
    " 4.0  4.1  5.0  5.1  6.0  6.1  7.0  7.1 |  4.4  4.5  5.4  5.5  6.4  6.5  7.4  7.5",
    " 8.0  8.1  9.0  9.1 10.0 10.1 11.0 11.1 |  8.4  8.5  9.4  9.5 10.4 10.5 11.4 11.5",
    "12.0 12.1 13.0 13.1 14.0 14.1 15.0 15.1 | 12.4 12.5 13.4 13.5 14.4 14.5 15.4 15.5",
    "16.0 16.1 17.0 17.1 18.0 18.1 19.0 19.1 | 16.4 16.5 17.4 17.5 18.4 18.5 19.4 19.5",
    "20.0 20.1 21.0 21.1 22.0 22.1 23.0 23.1 | 20.4 20.5 21.4 21.5 22.4 22.5 23.4 23.5",
    "24.0 24.1 25.0 25.1 26.0 26.1 27.0 27.1 | 24.4 24.5 25.4 25.5 26.4 26.5 27.4 27.5",
    "28.0 28.1 29.0 29.1 30.0 30.1 31.0 31.1 | 28.4 28.5 29.4 29.5 30.4 30.5 31.4 31.5",
    " 0.2  0.3  1.2  1.3  2.2  2.3  3.2  3.3 |  0.6  0.7  1.6  1.7  2.6  2.7  3.6  3.7",
    " 4.2  4.3  5.2  5.3  6.2  6.3  7.2  7.3 |  4.6  4.7  5.6  5.7  6.6  6.7  7.6  7.7",
    " 8.2  8.3  9.2  9.3 10.2 10.3 11.2 11.3 |  8.6  8.7  9.6  9.7 10.6 10.7 11.6 11.7",
    "12.2 12.3 13.2 13.3 14.2 14.3 15.2 15.3 | 12.6 12.7 13.6 13.7 14.6 14.7 15.6 15.7",
    "16.2 16.3 17.2 17.3 18.2 18.3 19.2 19.3 | 16.6 16.7 17.6 17.7 18.6 18.7 19.6 19.7",
    "20.2 20.3 21.2 21.3 22.2 22.3 23.2 23.3 | 20.6 20.7 21.6 21.7 22.6 22.7 23.6 23.7",
    "24.2 24.3 25.2 25.3 26.2 26.3 27.2 27.3 | 24.6 24.7 25.6 25.7 26.6 26.7 27.6 27.7",
    "28.2 28.3 29.2 29.3 30.2 30.3 31.2 31.3 | 28.6 28.7 29.6 29.7 30.6 30.7 31.6 31.7",
};
// Figure "MMA .m16n8k16 fragment layout for matrix B with .f16 / .bf16 type" (row = k, col = n; cell T<lane>: b<i>).
const char* const kFigureB[16] = {
    " 0.0  4.0  8.0 12.0 16.0 20.0 24.0 28.0", " 0.1  4.1  8.1 12.1 16.1 20.1 24.1 28.1",
    " 1.0  5.0  9.0 13.0 17.0 21.0 25.0 29.0", " 1.1  5.1  9.1 13.1 17.1 21.1 25.1 29.1",
    " 2.0  6.0 10.0 14.0 18.0 22.0 26.0 30.0", " 2.1  6.1 10.1 14.1 18.1 22.1 26.1 30.1",
    " 3.0  7.0 11.0 15.0 19.0 23.0 27.0 31.0", " 3.1  7.1 11.1 15.1 19.1 23.1 27.1 31.1",
    " 0.2  4.2  8.2 12.2 16.2 20.2 24.2 28.2", " 0.3  4.3  8.3 12.3 16.3 20.3 24.3 28.3",
    " 1.2  5.2  9.2 13.2 17.2 21.2 25.2 29.2", " 1.3  5.3  9.3 13.3 17.3 21.3 25.3 29.3",
    " 2.2  6.2 10.2 14.2 18.2 22.2 26.2 30.2", " 2.3  6.3 10.3 14.3 18.3 22.3 26.3 30.3",
    " 3.2  7.2 11.2 15.2 19.2 23.2 27.2 31.2", " 3.3  7.3 11.3 15.3 19.3 23.3 27.3 31.3",
};
// Figure "MMA .m16n8k16 fragment layout for accumulator matrix C/D" (cell T<lane>: c<i>).
const char* const kFigureC[16] = {
    " 0.0  0.1  1.0  1.1  2.0  2.1  3.0  3.1", " 4.0  4.1  5.0  5.1  6.0  6.1  7.0  7.1",
    " 8.0  8.1  9.0  9.1 10.0 10.1 11.0 11.1", "12.0 12.1 13.0 13.1 14.0 14.1 15.0 15.1",
    "16.0 16.1 17.0 17.1 18.0 18.1 19.0 19.1", "20.0 20.1 21.0 21.1 22.0 22.1 23.0 23.1",
    "24.0 24.1 25.0 25.1 26.0 26.1 27.0 27.1", "28.0 28.1 29.0 29.1 30.0 30.1 31.0 31.1",
    " 0.2  0.3  1.2  1.3  2.2  2.3  3.2  3.3", " 4.2  4.3  5.2  5.3  6.2  6.3  7.2  7.3",
    " 8.2  8.3  9.2  9.3 10.2 10.3 11.2 11.3", "12.2 12.3 13.2 13.3 14.2 14.3 15.2 15.3",
    "16.2 16.3 17.2 17.3 18.2 18.3 19.2 19.3", "20.2 20.3 21.2 21.3 22.2 22.3 23.2 23.3",
    "24.2 24.3 25.2 25.3 26.2 26.3 27.2 27.3", "28.2 28.3 29.2 29.3 30.2 30.3 31.2 31.3",
};
// ldmatrix: Figure "ldmatrix fragment layout for one 8x8 Matrix with 16-bit elements" (cell T<lane>: half of its
// register; "a group of four threads loads an entire row").
const char* const kFigureLdmatrix[8] = {
    " 0.0  0.1  1.0  1.1  2.0  2.1  3.0  3.1", " 4.0  4.1  5.0  5.1  6.0  6.1  7.0  7.1",
    " 8.0  8.1  9.0  9.1 10.0 10.1 11.0 11.1", "12.0 12.1 13.0 13.1 14.0 14.1 15.0 15.1",
    "16.0 16.1 17.0 17.1 18.0 18.1 19.0 19.1", "20.0 20.1 21.0 21.1 22.0 22.1 23.0 23.1",
    "24.0 24.1 25.0 25.1 26.0 26.1 27.0 27.1", "28.0 28.1 29.0 29.1 30.0 30.1 31.0 31.1",
};
// .trans ("the matrix is loaded in column-major format"): the same figure over the stored matrix's transpose.
const char* const kFigureLdmatrixTrans[8] = {
    " 0.0  4.0  8.0 12.0 16.0 20.0 24.0 28.0", " 0.1  4.1  8.1 12.1 16.1 20.1 24.1 28.1",
    " 1.0  5.0  9.0 13.0 17.0 21.0 25.0 29.0", " 1.1  5.1  9.1 13.1 17.1 21.1 25.1 29.1",
    " 2.0  6.0 10.0 14.0 18.0 22.0 26.0 30.0", " 2.1  6.1 10.1 14.1 18.1 22.1 26.1 30.1",
    " 3.0  7.0 11.0 15.0 19.0 23.0 27.0 31.0", " 3.1  7.1 11.1 15.1 19.1 23.1 27.1 31.1",
};

// A parsed figure: where each (lane, element) sits, and what sits at each cell.
struct Figure {
  int rows = 0, cols = 0;
  std::map<std::pair<int, int>, kc::FragCoord> where;  // (lane, element) → (row, col)
  std::vector<std::vector<std::pair<int, int>>> cell;  // [row][col] → (lane, element)
};
Figure parse(const char* const* text, int rows, int elements_per_lane) {
  Figure f;
  f.rows = rows;
  f.cell.resize(size_t(rows));
  for (int r = 0; r < rows; ++r) {
    std::istringstream line(text[r]);
    std::string tok;
    while (line >> tok) {
      if (tok == "|") continue;
      const size_t dot = tok.find('.');
      const int lane = std::stoi(tok.substr(0, dot)), elem = std::stoi(tok.substr(dot + 1));
      const int c = int(f.cell[size_t(r)].size());
      f.cell[size_t(r)].push_back({lane, elem});
      REQUIRE_MESSAGE(f.where.emplace(std::make_pair(lane, elem), kc::FragCoord{r, c}).second,
                      "the figure names lane " << lane << " element " << elem << " twice");
    }
    if (r == 0) f.cols = int(f.cell[0].size());
    REQUIRE(int(f.cell[size_t(r)].size()) == f.cols);
  }
  REQUIRE(int(f.where.size()) == 32 * elements_per_lane);  // every lane's every element, once
  REQUIRE(f.rows * f.cols == 32 * elements_per_lane);
  return f;
}
const Figure& figure_a() {
  static const Figure f = parse(kFigureA, 16, 8);
  return f;
}
const Figure& figure_b() {
  static const Figure f = parse(kFigureB, 16, 4);
  return f;
}
const Figure& figure_c() {
  static const Figure f = parse(kFigureC, 16, 4);
  return f;
}

uint16_t bf16_bits(float x) {
  const __nv_bfloat16_raw r = __float2bfloat16_rn(x);
  return r.x;
}
uint32_t float_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// Registers of one mma case, placed by the figures (not by mma.cuh).
struct MmaCase {
  std::vector<uint32_t> a = std::vector<uint32_t>(32 * 4, 0);
  std::vector<uint32_t> b = std::vector<uint32_t>(32 * 2, 0);
  std::vector<float> c = std::vector<float>(32 * 4, 0.f);
};
MmaCase place(const float (&a)[16][16], const float (&b)[16][8], const float (&c)[16][8]) {
  MmaCase k;
  for (int r = 0; r < 16; ++r)
    for (int col = 0; col < 16; ++col) {
      const auto [lane, i] = figure_a().cell[size_t(r)][size_t(col)];
      k.a[size_t(lane * 4 + i / 2)] |= uint32_t(bf16_bits(a[r][col])) << (16 * (i % 2));
    }
  for (int r = 0; r < 16; ++r)
    for (int col = 0; col < 8; ++col) {
      const auto [lane, i] = figure_b().cell[size_t(r)][size_t(col)];
      k.b[size_t(lane * 2 + i / 2)] |= uint32_t(bf16_bits(b[r][col])) << (16 * (i % 2));
      const auto [cl, ci] = figure_c().cell[size_t(r)][size_t(col)];
      k.c[size_t(cl * 4 + ci)] = c[r][col];
    }
  return k;
}
// D (16×8) from the lanes' registers d[32][4], read by the C figure.
void unplace(const float* d, float (&out)[16][8]) {
  for (int r = 0; r < 16; ++r)
    for (int col = 0; col < 8; ++col) {
      const auto [lane, i] = figure_c().cell[size_t(r)][size_t(col)];
      out[r][col] = d[lane * 4 + i];
    }
}
void reference(const float (&a)[16][16], const float (&b)[16][8], const float (&c)[16][8], float (&d)[16][8]) {
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) {
      double s = c[m][n];
      for (int k = 0; k < 16; ++k) s += double(a[m][k]) * double(b[k][n]);
      d[m][n] = float(s);
    }
}

// Small integers (and halves in C): every partial sum is exact in fp32, in any order.
void example_tiles(float (&a)[16][16], float (&b)[16][8], float (&c)[16][8]) {
  for (int m = 0; m < 16; ++m)
    for (int k = 0; k < 16; ++k) a[m][k] = float((m * 3 + k * 5) % 7 - 3);
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 8; ++n) b[k][n] = float((k * 2 + n * 7) % 5 - 2);
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) c[m][n] = float((m * 8 + n) % 9 - 4) + 0.5f;
}

// ---- child processes for the misuses ----

std::string self_path() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  REQUIRE(n > 0);
  buf[n] = 0;
  return buf;
}
struct ChildRun {
  bool exited_zero = false;
  std::string output;  // stdout and stderr
};
// Runs this binary with only the (skipped) test case `name`.
ChildRun run_child(const std::string& name) {
  std::string cmd = "'";  // built by appends: GCC 12's -Wrestrict misfires on a chain of operator+ here
  cmd += self_path();
  cmd += "' '--test-case=";
  cmd += name;
  cmd += "' --no-skip=true 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  ChildRun r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.exited_zero = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  return r;
}
// In the child: runs the defect and exits with 3 when the emulated GPU reported it as a device fault (the
// processes that the emulator aborts do not get here).
void child(MmaDefect d, const char* name) {
  std::fprintf(stderr, "child: running %s\n", name);
  const cudaError_t rc = emu_mma_test::run_defect(d);
  std::fprintf(stderr, "child: cudaDeviceSynchronize returned %s\n", cudaGetErrorName(rc));
  std::fflush(stderr);
  std::_Exit(rc == cudaSuccess ? 0 : 3);
}

}  // namespace

// ---- layouts ----

TEST_CASE("emu mma layouts: mma_a/b/c_coord and ldmatrix_coord put every element where the PTX ISA figures do") {
  const struct {
    const char* name;
    const Figure& fig;
    int elements;
    kc::FragCoord (*coord)(int, int);
  } operands[] = {{"A", figure_a(), 8, kc::mma_a_coord},
                  {"B", figure_b(), 4, kc::mma_b_coord},
                  {"C", figure_c(), 4, kc::mma_c_coord}};
  for (const auto& op : operands)
    for (int lane = 0; lane < 32; ++lane)
      for (int i = 0; i < op.elements; ++i) {
        const kc::FragCoord want = op.fig.where.at({lane, i}), got = op.coord(lane, i);
        CHECK_MESSAGE((got.row == want.row && got.col == want.col),
                      op.name << " lane " << lane << " element " << i << ": (" << got.row << ", " << got.col
                              << "), the figure (" << want.row << ", " << want.col << ")");
      }
  const Figure ld = parse(kFigureLdmatrix, 8, 2), ld_trans = parse(kFigureLdmatrixTrans, 8, 2);
  for (int lane = 0; lane < 32; ++lane)
    for (int h = 0; h < 2; ++h) {
      const kc::FragCoord w = ld.where.at({lane, h}), g = kc::ldmatrix_coord(lane, h, false);
      CHECK_MESSAGE((g.row == w.row && g.col == w.col), "ldmatrix lane " << lane << " half " << h);
      const kc::FragCoord wt = ld_trans.where.at({lane, h}), gt = kc::ldmatrix_coord(lane, h, true);
      CHECK_MESSAGE((gt.row == wt.row && gt.col == wt.col), "ldmatrix.trans lane " << lane << " half " << h);
    }
  // a few cells read off the figures by hand
  auto at = [](kc::FragCoord p, int r, int c) { return p.row == r && p.col == c; };
  CHECK(at(kc::mma_a_coord(0, 0), 0, 0));
  CHECK(at(kc::mma_a_coord(5, 3), 9, 3));     // groupID 1, threadID_in_group 1, a3: row + 8, col 2·1 + 1
  CHECK(at(kc::mma_a_coord(31, 7), 15, 15));
  CHECK(at(kc::mma_a_coord(6, 4), 1, 12));
  CHECK(at(kc::mma_b_coord(21, 1), 3, 5));    // b1 of lane 21: k 2·1 + 1, n 5
  CHECK(at(kc::mma_b_coord(2, 2), 12, 0));
  CHECK(at(kc::mma_c_coord(6, 3), 9, 5));
  CHECK(at(kc::ldmatrix_coord(5, 1, false), 1, 3));
  CHECK(at(kc::ldmatrix_coord(5, 1, true), 3, 1));
}

TEST_CASE("emu mma: pack_bf16x2 puts the lower-index element in bits 0-15; pack_bf16x2_rn rounds to nearest even") {
  CHECK(kc::pack_bf16x2_rn(1.0f, -2.0f) == 0xC0003F80u);
  CHECK(kc::pack_bf16x2_rn(1.00390625f, 1.01171875f) == 0x3F823F80u);  // 1 + 2⁻⁸ → 1; 1 + 3·2⁻⁸ → 1 + 2⁻⁶
  const uint32_t r = kc::pack_bf16x2(__float2bfloat16_rn(3.0f), __float2bfloat16_rn(-0.5f));
  CHECK(__bfloat162float(kc::bf16x2_lo(r)) == 3.0f);
  CHECK(__bfloat162float(kc::bf16x2_hi(r)) == -0.5f);
}

// ---- mma ----

TEST_CASE("emu mma (combine on the host): a tile placed by the figures gives the triple loop's D") {
  float a[16][16], b[16][8], c[16][8], want[16][8], got[16][8];
  example_tiles(a, b, c);
  reference(a, b, c, want);
  const MmaCase k = place(a, b, c);
  dflash::emu::warp_mma_detail::MmaLane lanes[32];
  float d[32][4];
  const void* ins[32];
  void* outs[32];
  for (int l = 0; l < 32; ++l) {
    std::memcpy(lanes[l].a, &k.a[size_t(l) * 4], 16);
    std::memcpy(lanes[l].b, &k.b[size_t(l) * 2], 8);
    std::memcpy(lanes[l].c, &k.c[size_t(l) * 4], 16);
    ins[l] = &lanes[l];
    outs[l] = d[l];
  }
  dflash::emu::warp_mma_detail::mma_combine(ins, outs, 0xffffffffu, nullptr);
  unplace(&d[0][0], got);
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) CHECK_MESSAGE(got[m][n] == want[m][n], "D[" << m << "][" << n << "]");
}

TEST_CASE("emu mma: a tile from registers placed by the figures, on the emulated GPU, gives the triple loop's D") {
  float a[16][16], b[16][8], c[16][8], want[16][8], got[16][8];
  example_tiles(a, b, c);
  reference(a, b, c, want);
  const MmaCase k = place(a, b, c);
  const std::vector<float> d = emu_mma_test::mma_registers(1, k.a, k.b, k.c);
  unplace(d.data(), got);
  int nonzero = 0;
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) {
      CHECK_MESSAGE(got[m][n] == want[m][n], "D[" << m << "][" << n << "]");
      nonzero += want[m][n] != c[m][n];
    }
  CHECK(nonzero > 64);  // the product matters in most elements
}

TEST_CASE("emu mma: a single 1 in A, B or C lights exactly one D element, in the lane and register of the figure") {
  // case (r, c) of A: A = e(r, c), B = e(c, n0) → D = e(r, n0); case (k, n) of B: A = I, B = e(k, n) → D = e(k, n);
  // case (m, n) of C: A = B = 0, C = e(m, n) → D = e(m, n).
  struct Lit {
    int row, col;  // the D element that must light
  };
  std::vector<MmaCase> cases;
  std::vector<Lit> lit;
  auto add = [&](const float (&a)[16][16], const float (&b)[16][8], const float (&c)[16][8], Lit l) {
    cases.push_back(place(a, b, c));
    lit.push_back(l);
  };
  float a[16][16], b[16][8], c[16][8];
  auto clear = [&] {
    std::memset(a, 0, sizeof a);
    std::memset(b, 0, sizeof b);
    std::memset(c, 0, sizeof c);
  };
  for (int r = 0; r < 16; ++r)
    for (int col = 0; col < 16; ++col) {
      const int n0 = (r + 3 * col) % 8;
      clear();
      a[r][col] = 1.f;
      b[col][n0] = 1.f;
      add(a, b, c, {r, n0});
    }
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 8; ++n) {
      clear();
      for (int i = 0; i < 16; ++i) a[i][i] = 1.f;
      b[k][n] = 1.f;
      add(a, b, c, {k, n});
    }
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) {
      clear();
      c[m][n] = 1.f;
      add(a, b, c, {m, n});
    }
  std::vector<uint32_t> ra, rb;
  std::vector<float> rc;
  for (const MmaCase& k : cases) {
    ra.insert(ra.end(), k.a.begin(), k.a.end());
    rb.insert(rb.end(), k.b.begin(), k.b.end());
    rc.insert(rc.end(), k.c.begin(), k.c.end());
  }
  const std::vector<float> d = emu_mma_test::mma_registers(int(cases.size()), ra, rb, rc);
  for (size_t k = 0; k < cases.size(); ++k) {
    const auto [want_lane, want_reg] = figure_c().cell[size_t(lit[k].row)][size_t(lit[k].col)];
    int lit_count = 0;
    for (int lane = 0; lane < 32; ++lane)
      for (int i = 0; i < 4; ++i) {
        const float v = d[(k * 32 + size_t(lane)) * 4 + size_t(i)];
        const bool here = lane == want_lane && i == want_reg;
        lit_count += v != 0.f;
        CHECK_MESSAGE(v == (here ? 1.f : 0.f), "case " << k << " (D[" << lit[k].row << "][" << lit[k].col
                                                       << "] lights): lane " << lane << " register " << i << " = " << v);
      }
    CHECK(lit_count == 1);
  }
  // read off the figures by hand: case A(9, 3) lights D(9, 2) (n0 = (9 + 3·3) % 8), held by lane 5 (groupID 1,
  // threadID_in_group 1) as c2; A(9, 3) is a3 of lane 5 (register 1, bits 16–31), B(3, 2) is b1 of lane 9
  const size_t k93 = 9 * 16 + 3;
  REQUIRE((lit[k93].row == 9 && lit[k93].col == 2));
  CHECK(d[(k93 * 32 + 5) * 4 + 2] == 1.f);
  CHECK(cases[k93].a[5 * 4 + 1] == 0x3F800000u);
  CHECK(cases[k93].b[9 * 2 + 0] == 0x3F800000u);
}

TEST_CASE("emu mma: cp.async, ldmatrix and mma of a tile in shared memory give the triple loop's D") {
  float a[16][16], b[16][8], c[16][8], want[16][8], twice[16][8];
  example_tiles(a, b, c);
  reference(a, b, c, want);
  reference(a, b, want, twice);
  std::vector<uint16_t> ha(256), b_kn(128), b_nk(128);
  std::vector<float> hc(128);
  for (int m = 0; m < 16; ++m)
    for (int k = 0; k < 16; ++k) ha[size_t(m * 16 + k)] = bf16_bits(a[m][k]);
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 8; ++n) {
      b_kn[size_t(k * 8 + n)] = bf16_bits(b[k][n]);
      b_nk[size_t(n * 16 + k)] = bf16_bits(b[k][n]);
    }
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) hc[size_t(m * 8 + n)] = c[m][n];
  for (const bool kn : {true, false})
    for (const int times : {1, 2}) {
      CAPTURE(kn);
      CAPTURE(times);
      const std::vector<float> d = emu_mma_test::mma_tile(ha, kn ? b_kn : b_nk, kn, hc, times);
      for (int m = 0; m < 16; ++m)
        for (int n = 0; n < 8; ++n)
          CHECK_MESSAGE(d[size_t(m * 8 + n)] == (times == 1 ? want : twice)[m][n], "D[" << m << "][" << n << "]");
    }
}

// ---- ldmatrix ----

TEST_CASE("emu ldmatrix: x1, x2, x4 and .trans hand each lane the elements the figure names; lanes past 8·count "
          "are ignored") {
  const Figure ld = parse(kFigureLdmatrix, 8, 2), ld_trans = parse(kFigureLdmatrixTrans, 8, 2);
  for (const int num : {1, 2, 4})
    for (const bool trans : {false, true}) {
      CAPTURE(num);
      CAPTURE(trans);
      // matrix m, row i comes from lane 8m + i: a scattered row of the 32-row tile, either half of it
      std::vector<int> offset(32, -1);
      for (int lane = 0; lane < 8 * num; ++lane) {
        const int m = lane / 8, i = lane % 8;
        offset[size_t(lane)] = ((5 * lane + 3) % 32) * 16 + 8 * ((m + i) % 2);
      }
      const std::vector<uint32_t> out = emu_mma_test::ldmatrix(num, trans, offset);
      const Figure& fig = trans ? ld_trans : ld;
      for (int lane = 0; lane < 32; ++lane)
        for (int m = 0; m < 4; ++m) {
          uint32_t want = 0xdeadbeefu;
          if (m < num) {
            want = 0;
            for (int h = 0; h < 2; ++h) {
              const kc::FragCoord p = fig.where.at({lane, h});  // (row, col) of matrix m as stored
              want |= uint32_t(offset[size_t(8 * m + p.row)] + p.col) << (16 * h);
            }
          }
          CHECK_MESSAGE(out[size_t(lane * 4 + m)] == want, "lane " << lane << " register " << m);
        }
    }
  // by hand: x1, lane 5 holds row 1, columns 2 and 3; with .trans rows 2 and 3 of column 1
  std::vector<int> offset(32, -1);
  for (int i = 0; i < 8; ++i) offset[size_t(i)] = i * 16;  // row i of the tile, columns 0–7
  CHECK(emu_mma_test::ldmatrix(1, false, offset)[5 * 4] == (uint32_t(1 * 16 + 2) | uint32_t(1 * 16 + 3) << 16));
  CHECK(emu_mma_test::ldmatrix(1, true, offset)[5 * 4] == (uint32_t(2 * 16 + 1) | uint32_t(3 * 16 + 1) << 16));
}

// ---- cp.async ----

TEST_CASE("emu cp.async: copies land only at the wait that covers their group; wait_group 1 leaves the newest "
          "pending; an empty group counts; the state is freed; DFLASH_EMU_CP_ASYNC=issue lands them at the issue") {
  // the two ends of what a GPU may do: at the covering wait (the default) or at the issue (DFLASH_EMU_CP_ASYNC)
  const char* mode = std::getenv("DFLASH_EMU_CP_ASYNC");
  const bool at_issue = mode && std::string(mode) == "issue";
  MESSAGE("cp.async lands at the " << (at_issue ? "issue" : "wait"));
  std::vector<float> src(32 * 12), src2(32);
  for (int l = 0; l < 32; ++l) {
    for (int j = 0; j < 12; ++j) src[size_t(l * 12 + j)] = float(l * 100 + j) + 0.25f;
    src2[size_t(l)] = -float(l) - 0.5f;
  }
  const auto o = emu_mma_test::cp_async_staging(src, src2);
  const uint32_t fill = 0xffffffffu;  // shared memory's 0xFF fill
  // words landed after each snapshot: none; group 1 (0–3); groups 1, 2 (0–7, the open copies are in no group);
  // everything issued (0–10) after wait_all; word 11 is never written
  const int landed_at_wait[4] = {0, 4, 8, 11}, landed_at_issue[4] = {11, 11, 11, 11};
  const int* landed = at_issue ? landed_at_issue : landed_at_wait;
  for (int s = 0; s < 4; ++s)
    for (int l = 0; l < 32; ++l)
      for (int j = 0; j < 12; ++j) {
        const uint32_t got = o.snapshot[size_t((s * 32 + l) * 12 + j)];
        const uint32_t want = j < landed[s] ? float_bits(src[size_t(l * 12 + j)]) : fill;
        CHECK_MESSAGE(got == want, "snapshot " << s << " lane " << l << " word " << j);
      }
  const uint32_t pending_at_wait[5] = {4, 3, 2, 0, 0}, pending_at_issue[5] = {0, 0, 0, 0, 0};
  const uint32_t* pending = at_issue ? pending_at_issue : pending_at_wait;
  for (int l = 0; l < 32; ++l) {
    CHECK_MESSAGE(o.after_empty_group[size_t(l)] == float_bits(src2[size_t(l)]), "lane " << l);
    for (int k = 0; k < 5; ++k) CHECK_MESSAGE(o.pending[size_t(l * 5 + k)] == pending[k], "lane " << l << " step " << k);
    CHECK(o.state_freed[size_t(l)] == 1u);
  }
}

// ---- misuses ----

TEST_CASE("emu mma: each planted misuse stops the kernel with a message naming the instruction, the thread and "
          "the fault") {
  const struct {
    const char* child;
    std::vector<std::string> says;
  } defects[] = {
      {"cp_async_misaligned_source",
       {"cp.async.cg.shared.global at ", "mma_kernels.cu:", "block (0,0,0) thread (5,0,0)",
        "source address", "is not 16-byte aligned"}},
      {"cp_async_misaligned_destination",
       {"cp.async.ca.shared.global at ", "thread (5,0,0)", "destination address", "is not 8-byte aligned"}},
      {"cp_async_source_not_global",
       {"cp.async.ca.shared.global at ", "thread (5,0,0)", "does not lie inside one cudaMalloc"}},
      {"cp_async_overlapping_writes",
       {"cp.async.ca.shared.global at ", "thread (5,0,0)", "overlaps the 8-byte destination", "no cp.async.wait_group"}},
      {"ldmatrix_misaligned_row",
       {"ldmatrix.sync.aligned.m8n8.x4.shared.b16 at ", "thread (3,0,0) (warp 0, lane 3)",
        "row 3 of matrix 0", "is not 16-byte aligned"}},
      {"ldmatrix_global_row",
       {"ldmatrix.sync.aligned.m8n8.x4.shared.b16 at ", "lane 6", "row 6 of matrix 0", "cudaMalloc"}},
      {"mma_lane_skips",
       {"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 at ", "mma_kernels.cu:", "names lane 5",
        "thread (5,0,0) has exited"}},
  };
  for (const auto& d : defects) {
    CAPTURE(d.child);
    const ChildRun r = run_child(std::string("emu mma child: ") + d.child);
    CAPTURE(r.output);
    CHECK(r.output.find(std::string("child: running ") + d.child) != std::string::npos);  // the case ran
    CHECK(!r.exited_zero);
    CHECK(r.output.find("child: cudaDeviceSynchronize returned cudaSuccess") == std::string::npos);
    for (const std::string& s : d.says) CHECK_MESSAGE(r.output.find(s) != std::string::npos, "says \"" << s << "\"");
  }
}

#define DFLASH_MMA_CHILD(name) \
  TEST_CASE("emu mma child: " #name * doctest::skip()) { child(MmaDefect::name, #name); }
DFLASH_MMA_CHILD(cp_async_misaligned_source)
DFLASH_MMA_CHILD(cp_async_misaligned_destination)
DFLASH_MMA_CHILD(cp_async_source_not_global)
DFLASH_MMA_CHILD(cp_async_overlapping_writes)
DFLASH_MMA_CHILD(ldmatrix_misaligned_row)
DFLASH_MMA_CHILD(ldmatrix_global_row)
DFLASH_MMA_CHILD(mma_lane_skips)
