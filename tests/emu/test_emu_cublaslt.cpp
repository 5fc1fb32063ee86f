// The emulated cuBLASLt (kernels/cuda/emu/cublaslt.cpp) through the toolkit's own <cublasLt.h>, on the emulated
// runtime: worked examples with hand-computed results (column- and row-major, transposes, padding, batches,
// alpha / beta, bf16), the documented error statuses, gemm_lt.cpp's row-major swap, and device faults. A fault
// is sticky for the whole process, so each fault case runs in a child process (this binary, one test case).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/emu/cublaslt_math.h"

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

// ---- device memory ----

struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { REQUIRE(cudaMalloc(&ptr, bytes) == cudaSuccess); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

template <class T>
void upload(DeviceBuffer& dst, const std::vector<T>& host) {
  REQUIRE(cudaMemcpy(dst.ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
}
template <class T>
std::vector<T> download(const void* src, size_t count) {
  std::vector<T> host(count);
  REQUIRE(cudaMemcpy(host.data(), src, count * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  return host;
}
template <class T>
std::unique_ptr<DeviceBuffer> on_device(const std::vector<T>& host) {
  auto buf = std::make_unique<DeviceBuffer>(host.size() * sizeof(T));
  upload(*buf, host);
  return buf;
}

std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& v) {
  std::vector<__nv_bfloat16> out;
  for (float x : v) out.push_back(__float2bfloat16_rn(x));
  return out;
}
std::vector<float> to_float(const std::vector<__nv_bfloat16>& v) {
  std::vector<float> out;
  for (__nv_bfloat16 x : v) out.push_back(__bfloat162float(x));
  return out;
}

// ---- cuBLASLt objects, RAII ----

struct Handle {
  cublasLtHandle_t h = nullptr;
  Handle() { REQUIRE(cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS); }
  ~Handle() { cublasLtDestroy(h); }
};

struct LayoutSpec {
  cudaDataType_t type = CUDA_R_32F;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  cublasLtOrder_t order = CUBLASLT_ORDER_COL;
  int32_t batch = 1;
  int64_t batch_stride = 0;  // elements
};

struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  explicit Layout(const LayoutSpec& s) {
    REQUIRE(cublasLtMatrixLayoutCreate(&l, s.type, s.rows, s.cols, s.ld) == CUBLAS_STATUS_SUCCESS);
    const int32_t order = s.order;
    REQUIRE(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof(order)) ==
            CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &s.batch, sizeof(s.batch)) ==
            CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &s.batch_stride,
                                             sizeof(s.batch_stride)) == CUBLAS_STATUS_SUCCESS);
  }
  ~Layout() { cublasLtMatrixLayoutDestroy(l); }
};

struct Desc {
  cublasLtMatmulDesc_t d = nullptr;
  Desc(cublasOperation_t op_a, cublasOperation_t op_b, cublasComputeType_t compute = CUBLAS_COMPUTE_32F,
       cudaDataType_t scale = CUDA_R_32F) {
    REQUIRE(cublasLtMatmulDescCreate(&d, compute, scale) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)) ==
            CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)) ==
            CUBLAS_STATUS_SUCCESS);
  }
  ~Desc() { cublasLtMatmulDescDestroy(d); }
};

struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  explicit Preference(uint64_t max_workspace = 1 << 20) {
    REQUIRE(cublasLtMatmulPreferenceCreate(&p) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace,
                                                 sizeof(max_workspace)) == CUBLAS_STATUS_SUCCESS);
  }
  ~Preference() { cublasLtMatmulPreferenceDestroy(p); }
};

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { REQUIRE(cudaStreamCreate(&s) == cudaSuccess); }
  ~Stream() { cudaStreamDestroy(s); }
};

// One D = alpha · op(A) · op(B) + beta · C as a caller writes it.
struct GemmSpec {
  LayoutSpec a, b, c, d;
  cublasOperation_t op_a = CUBLAS_OP_N, op_b = CUBLAS_OP_N;
  float alpha = 1.0f, beta = 0.0f;
};

struct Heuristic {
  cublasStatus_t status = CUBLAS_STATUS_INTERNAL_ERROR;
  int count = -1;
  cublasLtMatmulHeuristicResult_t result{};
};

Heuristic heuristic(const Handle& h, const Desc& desc, const Layout& a, const Layout& b, const Layout& c,
                    const Layout& d, const Preference& pref) {
  Heuristic r;
  r.status = cublasLtMatmulAlgoGetHeuristic(h.h, desc.d, a.l, b.l, c.l, d.l, pref.p, 1, &r.result, &r.count);
  return r;
}

// Heuristic, cublasLtMatmul on a stream, synchronize: the first status that is not SUCCESS, else SUCCESS.
cublasStatus_t gemm(const GemmSpec& g, const void* a, const void* b, const void* c, void* d) {
  Handle h;
  Desc desc(g.op_a, g.op_b);
  Layout la(g.a), lb(g.b), lc(g.c), ld(g.d);
  Preference pref;
  const Heuristic found = heuristic(h, desc, la, lb, lc, ld, pref);
  if (found.status != CUBLAS_STATUS_SUCCESS) return found.status;
  REQUIRE(found.count == 1);
  DeviceBuffer workspace(found.result.workspaceSize + 1);
  Stream stream;
  const cublasStatus_t st = cublasLtMatmul(h.h, desc.d, &g.alpha, a, la.l, b, lb.l, &g.beta, c, lc.l, d, ld.l,
                                           &found.result.algo, workspace.ptr, found.result.workspaceSize, stream.s);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  REQUIRE(cudaStreamSynchronize(stream.s) == cudaSuccess);
  return CUBLAS_STATUS_SUCCESS;
}

// The worked example: A[2, 3] = [[1, 2, 3], [4, 5, 6]], B[3, 2] = [[7, 8], [9, 10], [11, 12]],
// A·B = [[58, 64], [139, 154]].
const std::vector<float> kA_col = {1, 4, 2, 5, 3, 6};       // column-major, ld 2
const std::vector<float> kB_col = {7, 9, 11, 8, 10, 12};    // column-major, ld 3
const std::vector<float> kAB_col = {58, 139, 64, 154};      // column-major, ld 2
const std::vector<float> kA_row = {1, 2, 3, 4, 5, 6};       // row-major, ld 3
const std::vector<float> kB_row = {7, 8, 9, 10, 11, 12};    // row-major, ld 2
const std::vector<float> kAB_row = {58, 64, 139, 154};      // row-major, ld 2

GemmSpec worked_example(cudaDataType_t ab = CUDA_R_32F, cudaDataType_t cd = CUDA_R_32F) {
  GemmSpec g;
  g.a = {ab, 2, 3, 2};
  g.b = {ab, 3, 2, 3};
  g.c = {cd, 2, 2, 2};
  g.d = {cd, 2, 2, 2};
  return g;
}

// ---- child processes for the sticky faults ----

struct ChildRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// Runs one test case of this binary in a child process (the fault cases are skipped unless asked for by name).
ChildRun run_child(const std::string& test_case) {
  char self[4096] = {};
  REQUIRE(readlink("/proc/self/exe", self, sizeof(self) - 1) > 0);  // in popen's shell it would name the shell
  const std::string cmd = std::string("'") + self + "' '--test-case=" + test_case + "' --no-skip=true 2>&1";
  ChildRun r;
  FILE* pipe = popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char chunk[4096];
  size_t got;
  while ((got = fread(chunk, 1, sizeof(chunk), pipe)) > 0) r.output.append(chunk, got);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

void check_child(const std::string& test_case, const std::vector<std::string>& expected) {
  const ChildRun r = run_child(test_case);
  INFO("child output:\n" << r.output);
  CHECK(r.exit_code == 0);
  // It ran (a filter that selects nothing passes vacuously), and its assertions held.
  int cases = -1, passed = -1, failed = -1;
  const size_t summary = r.output.find("[doctest] test cases:");
  REQUIRE(summary != std::string::npos);
  REQUIRE(std::sscanf(r.output.c_str() + summary, "[doctest] test cases: %d | %d passed | %d failed", &cases,
                      &passed, &failed) == 3);
  CHECK(passed == 1);
  CHECK(failed == 0);
  for (const std::string& e : expected) CHECK_MESSAGE(r.output.find(e) != std::string::npos, "missing: " << e);
}

}  // namespace

// ---- worked examples ----

TEST_CASE("emu cublaslt: a column-major 2x3 times 3x2 gives the hand-computed product") {
  auto a = on_device(kA_col), b = on_device(kB_col);
  DeviceBuffer d(4 * sizeof(float));
  const GemmSpec g = worked_example();
  REQUIRE(gemm(g, a->ptr, b->ptr, d.ptr, d.ptr) == CUBLAS_STATUS_SUCCESS);
  CHECK(download<float>(d.ptr, 4) == kAB_col);
}

TEST_CASE("emu cublaslt: the heuristic returns one algorithm within the preference") {
  Handle h;
  const GemmSpec g = worked_example();
  Desc desc(CUBLAS_OP_N, CUBLAS_OP_N);
  Layout la(g.a), lb(g.b), lc(g.c), ld(g.d);
  for (uint64_t max_workspace : {uint64_t(0), uint64_t(1000), uint64_t(32) << 20}) {
    CAPTURE(max_workspace);
    Preference pref(max_workspace);
    cublasLtMatmulHeuristicResult_t results[4]{};
    int count = -1;
    REQUIRE(cublasLtMatmulAlgoGetHeuristic(h.h, desc.d, la.l, lb.l, lc.l, ld.l, pref.p, 4, results, &count) ==
            CUBLAS_STATUS_SUCCESS);
    CHECK(count == 1);
    CHECK(results[0].state == CUBLAS_STATUS_SUCCESS);
    CHECK(results[0].wavesCount == 1.0f);
    CHECK(results[0].workspaceSize <= max_workspace);
    if (max_workspace >= (uint64_t(32) << 20)) CHECK(results[0].workspaceSize > 0);  // the workspace path is used
  }
}

TEST_CASE("emu cublaslt: CUBLASLT_ORDER_ROW operands give the same product") {
  SUBCASE("all row-major") {
    auto a = on_device(kA_row), b = on_device(kB_row);
    DeviceBuffer d(4 * sizeof(float));
    GemmSpec g = worked_example();
    g.a = {CUDA_R_32F, 2, 3, 3, CUBLASLT_ORDER_ROW};
    g.b = {CUDA_R_32F, 3, 2, 2, CUBLASLT_ORDER_ROW};
    g.c = g.d = {CUDA_R_32F, 2, 2, 2, CUBLASLT_ORDER_ROW};
    REQUIRE(gemm(g, a->ptr, b->ptr, d.ptr, d.ptr) == CUBLAS_STATUS_SUCCESS);
    CHECK(download<float>(d.ptr, 4) == kAB_row);
  }
  SUBCASE("row-major A, column-major B and D") {
    auto a = on_device(kA_row), b = on_device(kB_col);
    DeviceBuffer d(4 * sizeof(float));
    GemmSpec g = worked_example();
    g.a = {CUDA_R_32F, 2, 3, 3, CUBLASLT_ORDER_ROW};
    REQUIRE(gemm(g, a->ptr, b->ptr, d.ptr, d.ptr) == CUBLAS_STATUS_SUCCESS);
    CHECK(download<float>(d.ptr, 4) == kAB_col);
  }
}

TEST_CASE("emu cublaslt: TRANSA and TRANSB read the stored matrices transposed, C equals T") {
  // Stored Aᵀ[3, 2] column-major is A's row-major array, Bᵀ[2, 3] column-major is B's row-major array.
  auto at = on_device(kA_row), bt = on_device(kB_row), a = on_device(kA_col), b = on_device(kB_col);
  DeviceBuffer d(4 * sizeof(float));
  for (cublasOperation_t op : {CUBLAS_OP_T, CUBLAS_OP_C}) {
    CAPTURE(int(op));
    GemmSpec g = worked_example();
    g.op_a = op;  // op(A) = Aᵀ
    g.a = {CUDA_R_32F, 3, 2, 3};
    REQUIRE(gemm(g, at->ptr, b->ptr, d.ptr, d.ptr) == CUBLAS_STATUS_SUCCESS);
    CHECK(download<float>(d.ptr, 4) == kAB_col);
    g.op_b = op;  // and op(B) = Bᵀ
    g.b = {CUDA_R_32F, 2, 3, 2};
    REQUIRE(gemm(g, at->ptr, bt->ptr, d.ptr, d.ptr) == CUBLAS_STATUS_SUCCESS);
    CHECK(download<float>(d.ptr, 4) == kAB_col);
    g = worked_example();
    g.op_b = op;  // op(B) = Bᵀ alone
    g.b = {CUDA_R_32F, 2, 3, 2};
    REQUIRE(gemm(g, a->ptr, bt->ptr, d.ptr, d.ptr) == CUBLAS_STATUS_SUCCESS);
    CHECK(download<float>(d.ptr, 4) == kAB_col);
  }
}

TEST_CASE("emu cublaslt: ld > rows skips the padding, which stays untouched") {
  // A[2, 3] with lda 4, B[3, 2] with ldb 5: NaN in the padding would poison any sum that read it.
  const std::vector<float> a_padded = {1, 4, kNaN, kNaN, 2, 5, kNaN, kNaN, 3, 6};
  const std::vector<float> b_padded = {7, 9, 11, kNaN, kNaN, 8, 10, 12};
  auto a = on_device(a_padded), b = on_device(b_padded);
  const float s = -999.0f;  // sentinel in D's padding (ldd 3)
  auto d = on_device(std::vector<float>{s, s, s, s, s, s});
  GemmSpec g = worked_example();
  g.a.ld = 4;
  g.b.ld = 5;
  g.c.ld = g.d.ld = 3;
  REQUIRE(gemm(g, a->ptr, b->ptr, d->ptr, d->ptr) == CUBLAS_STATUS_SUCCESS);
  CHECK(download<float>(d->ptr, 6) == std::vector<float>{58, 139, s, 64, 154, s});
}

TEST_CASE("emu cublaslt: a strided batch of 2 multiplies each pair at its offset") {
  // Batch 1: A₁ = [[1, 0, 0], [0, 0, 1]] picks rows 0 and 2 of B₁ = B + 1.
  const float s = -999.0f;
  std::vector<float> a = kA_col;
  a.insert(a.end(), {s, s});                              // stride 8: two gap elements
  a.insert(a.end(), {1, 0, 0, 0, 0, 1});
  std::vector<float> b = kB_col;
  for (float x : kB_col) b.push_back(x + 1);              // stride 6
  auto da = on_device(a), db = on_device(b);
  auto dd = on_device(std::vector<float>(9, s));          // stride 5: one gap element
  GemmSpec g = worked_example();
  g.a.batch = g.b.batch = g.c.batch = g.d.batch = 2;
  g.a.batch_stride = 8;
  g.b.batch_stride = 6;
  g.c.batch_stride = g.d.batch_stride = 5;
  REQUIRE(gemm(g, da->ptr, db->ptr, dd->ptr, dd->ptr) == CUBLAS_STATUS_SUCCESS);
  CHECK(download<float>(dd->ptr, 9) == std::vector<float>{58, 139, 64, 154, s, 8, 12, 9, 13});
}

TEST_CASE("emu cublaslt: alpha and beta") {
  auto a = on_device(kA_col), b = on_device(kB_col);
  SUBCASE("beta = 0 does not read C: a C full of NaN does not leak") {
    auto c = on_device(std::vector<float>(4, kNaN));
    DeviceBuffer d(4 * sizeof(float));
    GemmSpec g = worked_example();
    g.alpha = 2.0f;
    REQUIRE(gemm(g, a->ptr, b->ptr, c->ptr, d.ptr) == CUBLAS_STATUS_SUCCESS);
    CHECK(download<float>(d.ptr, 4) == std::vector<float>{116, 278, 128, 308});
  }
  SUBCASE("beta = 0 in place over a D full of NaN") {
    auto d = on_device(std::vector<float>(4, kNaN));
    GemmSpec g = worked_example();
    REQUIRE(gemm(g, a->ptr, b->ptr, d->ptr, d->ptr) == CUBLAS_STATUS_SUCCESS);
    CHECK(download<float>(d->ptr, 4) == kAB_col);
  }
  SUBCASE("C != D, each with its own leading dimension, C left as it was") {
    const std::vector<float> c_host = {1, 3, -5, 2, 4, -5};  // C = [[1, 2], [3, 4]], ldc 3
    auto c = on_device(c_host);
    DeviceBuffer d(4 * sizeof(float));
    GemmSpec g = worked_example();
    g.c.ld = 3;
    g.beta = -1.0f;
    REQUIRE(gemm(g, a->ptr, b->ptr, c->ptr, d.ptr) == CUBLAS_STATUS_SUCCESS);
    CHECK(download<float>(d.ptr, 4) == std::vector<float>{57, 136, 62, 150});
    CHECK(download<float>(c->ptr, 6) == c_host);
  }
  SUBCASE("in place: D = alpha AB + beta D") {
    auto d = on_device(std::vector<float>{2, 4, 6, 8});
    GemmSpec g = worked_example();
    g.alpha = 0.5f;
    g.beta = 0.25f;
    REQUIRE(gemm(g, a->ptr, b->ptr, d->ptr, d->ptr) == CUBLAS_STATUS_SUCCESS);
    CHECK(download<float>(d->ptr, 4) == std::vector<float>{29.5f, 70.5f, 33.5f, 79});
  }
}

TEST_CASE("emu cublaslt: bf16 inputs with fp32 and with bf16 output") {
  auto a = on_device(to_bf16(kA_col)), b = on_device(to_bf16(kB_col));
  SUBCASE("fp32 D") {
    DeviceBuffer d(4 * sizeof(float));
    const GemmSpec g = worked_example(CUDA_R_16BF, CUDA_R_32F);
    REQUIRE(gemm(g, a->ptr, b->ptr, d.ptr, d.ptr) == CUBLAS_STATUS_SUCCESS);
    CHECK(download<float>(d.ptr, 4) == kAB_col);
  }
  SUBCASE("bf16 D: 58, 139, 64, 154 are exact in bf16") {
    DeviceBuffer d(4 * sizeof(__nv_bfloat16));
    const GemmSpec g = worked_example(CUDA_R_16BF, CUDA_R_16BF);
    REQUIRE(gemm(g, a->ptr, b->ptr, d.ptr, d.ptr) == CUBLAS_STATUS_SUCCESS);
    CHECK(to_float(download<__nv_bfloat16>(d.ptr, 4)) == kAB_col);
  }
  SUBCASE("bf16 D rounds the fp32 sum once, to nearest even: 257 -> 256, 259 -> 260") {
    // A[1, 2] = [16, 1], B[2, 2] = [[16, 16], [1, 3]]: D = [257, 259], 8 significant bits apart from bf16's 8.
    auto a2 = on_device(to_bf16({16, 1})), b2 = on_device(to_bf16({16, 1, 16, 3}));
    DeviceBuffer d(2 * sizeof(__nv_bfloat16));
    GemmSpec g;
    g.a = {CUDA_R_16BF, 1, 2, 1};
    g.b = {CUDA_R_16BF, 2, 2, 2};
    g.c = g.d = {CUDA_R_16BF, 1, 2, 1};
    REQUIRE(gemm(g, a2->ptr, b2->ptr, d.ptr, d.ptr) == CUBLAS_STATUS_SUCCESS);
    CHECK(to_float(download<__nv_bfloat16>(d.ptr, 2)) == std::vector<float>{256, 260});
  }
}

TEST_CASE("emu cublaslt: the sum over k is fp32, in ascending k") {
  // [2²⁵, 1, -2²⁵, 1] · 1: ascending gives ((2²⁵ + 1) - 2²⁵) + 1 = 1 in fp32, pairwise and descending give 0.
  // [2²⁴, 1, 1] · 1: fp32 gives 2²⁴ (each + 1 rounds away), a wider accumulator 2²⁴ + 2.
  const float big = 33554432.0f, half_big = 16777216.0f;
  auto a = on_device(std::vector<float>{big, half_big, 1, 1, -big, 1, 1, 0});  // A[2, 4] column-major
  auto b = on_device(std::vector<float>{1, 1, 1, 1});
  DeviceBuffer d(2 * sizeof(float));
  GemmSpec g;
  g.a = {CUDA_R_32F, 2, 4, 2};
  g.b = {CUDA_R_32F, 4, 1, 4};
  g.c = g.d = {CUDA_R_32F, 2, 1, 2};
  REQUIRE(gemm(g, a->ptr, b->ptr, d.ptr, d.ptr) == CUBLAS_STATUS_SUCCESS);
  CHECK(download<float>(d.ptr, 2) == std::vector<float>{1, half_big});
}

TEST_CASE("emu cublaslt: a 67x45x33 bf16 product with transposes and padding matches a double reference") {
  const int m = 67, n = 45, k = 33, lda = 40, ldb = 50, ldd = 70;  // op(A) = Aᵀ: A is [k, m], lda ≥ k
  uint32_t state = 12345;
  auto next = [&] {  // small multiples of 1/8 in [-2, 2): exact in bf16
    state = state * 1664525u + 1013904223u;
    return float(int(state >> 27) - 16) / 8.0f;
  };
  std::vector<float> a(size_t(lda) * m, kNaN), b(size_t(ldb) * k, kNaN), c(size_t(ldd) * n);
  for (int col = 0; col < m; ++col)
    for (int row = 0; row < k; ++row) a[size_t(col) * lda + row] = next();
  for (int col = 0; col < k; ++col)
    for (int row = 0; row < n; ++row) b[size_t(col) * ldb + row] = next();  // B is [n, k]: op(B) = Bᵀ
  for (float& x : c) x = next();
  auto da = on_device(to_bf16(a)), db = on_device(to_bf16(b));
  auto dd = on_device(c);
  GemmSpec g;
  g.op_a = g.op_b = CUBLAS_OP_T;
  g.a = {CUDA_R_16BF, uint64_t(k), uint64_t(m), lda};
  g.b = {CUDA_R_16BF, uint64_t(n), uint64_t(k), ldb};
  g.c = g.d = {CUDA_R_32F, uint64_t(m), uint64_t(n), ldd};
  g.alpha = 0.75f;
  g.beta = -1.5f;
  REQUIRE(gemm(g, da->ptr, db->ptr, dd->ptr, dd->ptr) == CUBLAS_STATUS_SUCCESS);
  const std::vector<float> out = download<float>(dd->ptr, c.size());
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      double sum = 0, magnitude = 0;
      for (int p = 0; p < k; ++p) {
        const double term = double(a[size_t(i) * lda + p]) * double(b[size_t(p) * ldb + j]);
        sum += term;
        magnitude += std::fabs(term);
      }
      const double want = 0.75 * sum - 1.5 * double(c[size_t(j) * ldd + i]);
      REQUIRE(std::fabs(out[size_t(j) * ldd + i] - want) <= 1e-6 * (magnitude + std::fabs(want)) + 1e-6);
    }
  for (int j = 0; j < n; ++j)  // rows m..ldd of every column are padding
    for (int i = m; i < ldd; ++i) REQUIRE(out[size_t(j) * ldd + i] == c[size_t(j) * ldd + i]);
}

TEST_CASE("emu cublaslt: the reference math alone, on host memory") {
  const float a[6] = {1, 4, 2, 5, 3, 6}, b[6] = {7, 9, 11, 8, 10, 12};
  float d[4] = {kNaN, kNaN, kNaN, kNaN};
  using dflash::emu::lt::Element;
  dflash::emu::lt::gemm(2, 2, 3, 1.0f, {a, Element::f32, 1, 2}, {b, Element::f32, 1, 3}, 0.0f, {},
                        {d, Element::f32, 1, 2});
  CHECK(std::vector<float>(d, d + 4) == kAB_col);
}

// ---- gemm_lt.cpp's use: row-major C[M, N] = op(A) op(B) as the column-major Cᵀ = op(B)ᵀ op(A)ᵀ ----

TEST_CASE("emu cublaslt: gemm_lt's column-major swap computes a row-major product with padded strides") {
  const int M = 3, N = 5, K = 4, ldc = 8;
  for (bool trans_a : {false, true})
    for (bool trans_b : {false, true}) {
      CAPTURE(trans_a);
      CAPTURE(trans_b);
      // Row-major storage: A is [M, K] (or [K, M] when trans_a), B is [K, N] (or [N, K]), both padded.
      const int a_rows = trans_a ? K : M, a_cols = trans_a ? M : K, lda = a_cols + 2;
      const int b_rows = trans_b ? N : K, b_cols = trans_b ? K : N, ldb = b_cols + 3;
      std::vector<float> a(size_t(a_rows) * lda, kNaN), b(size_t(b_rows) * ldb, kNaN);
      for (int r = 0; r < a_rows; ++r)
        for (int c = 0; c < a_cols; ++c) a[size_t(r) * lda + c] = float((r * 3 + c * 5) % 7 - 3);
      for (int r = 0; r < b_rows; ++r)
        for (int c = 0; c < b_cols; ++c) b[size_t(r) * ldb + c] = float((r * 2 + c * 3) % 5 - 2);
      auto op_a = [&](int i, int p) { return trans_a ? a[size_t(p) * lda + i] : a[size_t(i) * lda + p]; };
      auto op_b = [&](int p, int j) { return trans_b ? b[size_t(j) * ldb + p] : b[size_t(p) * ldb + j]; };
      auto da = on_device(to_bf16(a)), db = on_device(to_bf16(b));
      auto dc = on_device(std::vector<float>(size_t(M) * ldc, -999.0f));

      Handle h;
      Stream stream;
      DeviceBuffer workspace(size_t(32) << 20);
      const float alpha = 1.0f, beta = 0.0f;
      {
        // The descriptors die at this scope's end, before the work runs: the product must not need them.
        const cublasOperation_t op_first = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;   // Lt's A = our B
        const cublasOperation_t op_second = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // Lt's B = our A
        Desc desc(op_first, op_second);
        Layout first({CUDA_R_16BF, uint64_t(b_cols), uint64_t(b_rows), ldb});
        Layout second({CUDA_R_16BF, uint64_t(a_cols), uint64_t(a_rows), lda});
        Layout out({CUDA_R_32F, uint64_t(N), uint64_t(M), ldc});
        Preference pref(uint64_t(32) << 20);
        const uint32_t al_first = 256, al_second = 256, al_c = 256;  // cudaMalloc'd: 256-byte aligned
        REQUIRE(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_first,
                                                     sizeof(al_first)) == CUBLAS_STATUS_SUCCESS);
        REQUIRE(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_second,
                                                     sizeof(al_second)) == CUBLAS_STATUS_SUCCESS);
        REQUIRE(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c,
                                                     sizeof(al_c)) == CUBLAS_STATUS_SUCCESS);
        REQUIRE(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c,
                                                     sizeof(al_c)) == CUBLAS_STATUS_SUCCESS);
        const Heuristic found = heuristic(h, desc, first, second, out, out, pref);
        REQUIRE(found.status == CUBLAS_STATUS_SUCCESS);
        REQUIRE(found.count == 1);
        REQUIRE(cublasLtMatmul(h.h, desc.d, &alpha, db->ptr, first.l, da->ptr, second.l, &beta, dc->ptr, out.l,
                               dc->ptr, out.l, &found.result.algo, workspace.ptr, found.result.workspaceSize,
                               stream.s) == CUBLAS_STATUS_SUCCESS);
      }
      REQUIRE(cudaStreamSynchronize(stream.s) == cudaSuccess);
      const std::vector<float> c = download<float>(dc->ptr, size_t(M) * ldc);
      for (int i = 0; i < M; ++i) {
        for (int j = 0; j < N; ++j) {
          float want = 0;
          for (int p = 0; p < K; ++p) want += op_a(i, p) * op_b(p, j);
          CHECK(c[size_t(i) * ldc + j] == want);
        }
        for (int j = N; j < ldc; ++j) CHECK(c[size_t(i) * ldc + j] == -999.0f);
      }
    }
}

TEST_CASE("emu cublaslt: alpha and beta are read at the call, in host pointer mode") {
  auto a = on_device(kA_col), b = on_device(kB_col);
  DeviceBuffer d(4 * sizeof(float));
  const GemmSpec g = worked_example();
  Handle h;
  Desc desc(CUBLAS_OP_N, CUBLAS_OP_N);
  Layout la(g.a), lb(g.b), lc(g.c), ld(g.d);
  Stream stream;
  float alpha = 1.0f, beta = 0.0f;
  REQUIRE(cublasLtMatmul(h.h, desc.d, &alpha, a->ptr, la.l, b->ptr, lb.l, &beta, d.ptr, lc.l, d.ptr, ld.l,
                         nullptr, nullptr, 0, stream.s) == CUBLAS_STATUS_SUCCESS);  // null algo: implicit heuristic
  alpha = 100.0f;  // after the call, before the work runs
  beta = kNaN;
  REQUIRE(cudaStreamSynchronize(stream.s) == cudaSuccess);
  CHECK(download<float>(d.ptr, 4) == kAB_col);
}

// ---- the documented error statuses ----

TEST_CASE("emu cublaslt: ld smaller than the rows (col) or the columns (row) is CUBLAS_STATUS_INVALID_VALUE") {
  Handle h;
  const GemmSpec g = worked_example();
  Desc desc(CUBLAS_OP_N, CUBLAS_OP_N);
  Layout good_a(g.a), lb(g.b), lc(g.c), ld(g.d);
  Preference pref;
  const Heuristic found = heuristic(h, desc, good_a, lb, lc, ld, pref);
  REQUIRE(found.status == CUBLAS_STATUS_SUCCESS);
  auto a = on_device(kA_col), b = on_device(kB_col);
  DeviceBuffer d(4 * sizeof(float)), workspace(found.result.workspaceSize + 1);
  const float alpha = 1, beta = 0;

  LayoutSpec col_short = g.a;  // 2 rows, ld 1: columns would overlap
  col_short.ld = 1;
  LayoutSpec row_short = {CUDA_R_32F, 2, 3, 2, CUBLASLT_ORDER_ROW};  // 3 columns, ld 2
  for (const LayoutSpec& bad : {col_short, row_short}) {
    CAPTURE(int(bad.order));
    Layout la(bad);  // creating it succeeds: the documented statuses of cublasLtMatrixLayoutCreate are ALLOC_FAILED
    const Heuristic r = heuristic(h, desc, la, lb, lc, ld, pref);
    CHECK(r.status == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(r.count == 0);
    CHECK(cublasLtMatmul(h.h, desc.d, &alpha, a->ptr, la.l, b->ptr, lb.l, &beta, d.ptr, lc.l, d.ptr, ld.l,
                         &found.result.algo, workspace.ptr, found.result.workspaceSize,
                         nullptr) == CUBLAS_STATUS_INVALID_VALUE);
  }
  SUBCASE("row-major with ld = the columns < the rows is valid") {
    Layout la({CUDA_R_32F, 2, 3, 3, CUBLASLT_ORDER_ROW});
    LayoutSpec tall_row = {CUDA_R_32F, 3, 2, 2, CUBLASLT_ORDER_ROW};  // ld 2 < 3 rows, = 2 columns
    Layout tall(tall_row);
    const Heuristic r = heuristic(h, desc, la, tall, lc, ld, pref);
    CHECK(r.status == CUBLAS_STATUS_SUCCESS);
    CHECK(r.count == 1);
  }
}

TEST_CASE("emu cublaslt: shapes that disagree are CUBLAS_STATUS_INVALID_VALUE") {
  Handle h;
  Preference pref;
  GemmSpec g = worked_example();
  struct Case {
    const char* what;
    LayoutSpec a, b, c, d;
  };
  const Case cases[] = {
      {"k: op(A) 2x3, op(B) 4x2", g.a, {CUDA_R_32F, 4, 2, 4}, g.c, g.d},
      {"m: op(A) 3x3, D 2x2", {CUDA_R_32F, 3, 3, 3}, g.b, g.c, g.d},
      {"n: op(B) 3x3, D 2x2", g.a, {CUDA_R_32F, 3, 3, 3}, g.c, g.d},
      {"C 2x3, D 2x2", g.a, g.b, {CUDA_R_32F, 2, 3, 2}, g.d},
      {"C row-major, D column-major", g.a, g.b, {CUDA_R_32F, 2, 2, 2, CUBLASLT_ORDER_ROW}, g.d},
      {"batch 2 against 1", {CUDA_R_32F, 2, 3, 2, CUBLASLT_ORDER_COL, 2, 6}, g.b, g.c, g.d},
  };
  Desc desc(CUBLAS_OP_N, CUBLAS_OP_N);
  auto a = on_device(std::vector<float>(32)), b = on_device(std::vector<float>(32));
  DeviceBuffer d(32 * sizeof(float));
  const float alpha = 1, beta = 0;
  for (const Case& c : cases) {
    CAPTURE(c.what);
    Layout la(c.a), lb(c.b), lc(c.c), ld(c.d);
    const Heuristic r = heuristic(h, desc, la, lb, lc, ld, pref);
    CHECK(r.status == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(r.count == 0);
    CHECK(cublasLtMatmul(h.h, desc.d, &alpha, a->ptr, la.l, b->ptr, lb.l, &beta, d.ptr, lc.l, d.ptr, ld.l, nullptr,
                         nullptr, 0, nullptr) == CUBLAS_STATUS_INVALID_VALUE);
  }
  SUBCASE("in place (C == D) needs Cdesc equal to Ddesc") {
    Layout la(g.a), lb(g.b), lc({CUDA_R_32F, 2, 2, 3}), ld(g.d);
    CHECK(cublasLtMatmul(h.h, desc.d, &alpha, a->ptr, la.l, b->ptr, lb.l, &beta, d.ptr, lc.l, d.ptr, ld.l, nullptr,
                         nullptr, 0, nullptr) == CUBLAS_STATUS_INVALID_VALUE);
  }
}

TEST_CASE("emu cublaslt: unsupported types and compute types are NOT_SUPPORTED with returnAlgoCount 0") {
  Handle h;
  Preference pref;
  struct Case {
    const char* what;
    cublasComputeType_t compute;
    cudaDataType_t scale, a, b, cd;
  };
  const Case cases[] = {
      {"fp16 with COMPUTE_32F_FAST_TF32", CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F, CUDA_R_16F, CUDA_R_16F,
       CUDA_R_16F},
      {"fp32 with COMPUTE_32F_FAST_TF32", CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F,
       CUDA_R_32F},
      {"fp16 with COMPUTE_16F", CUBLAS_COMPUTE_16F, CUDA_R_16F, CUDA_R_16F, CUDA_R_16F, CUDA_R_16F},
      {"int8 with COMPUTE_32I", CUBLAS_COMPUTE_32I, CUDA_R_32I, CUDA_R_8I, CUDA_R_8I, CUDA_R_32I},
      {"fp16 with COMPUTE_32F", CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16F, CUDA_R_16F, CUDA_R_32F},
      {"bf16 A with fp32 B", CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_32F, CUDA_R_32F},
      {"fp32 A/B with bf16 C/D", CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_16BF},
      {"bf16 with a bf16 scale type", CUBLAS_COMPUTE_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF},
      {"fp64", CUBLAS_COMPUTE_64F, CUDA_R_64F, CUDA_R_64F, CUDA_R_64F, CUDA_R_64F},
  };
  auto buf = on_device(std::vector<double>(16));
  const double alpha = 1, beta = 0;  // the widest scale type of the cases
  for (const Case& c : cases) {
    CAPTURE(c.what);
    Desc desc(CUBLAS_OP_N, CUBLAS_OP_N, c.compute, c.scale);
    Layout la({c.a, 2, 3, 2}), lb({c.b, 3, 2, 3}), lcd({c.cd, 2, 2, 2});
    cublasLtMatmulHeuristicResult_t result{};
    int count = -1;
    CHECK(cublasLtMatmulAlgoGetHeuristic(h.h, desc.d, la.l, lb.l, lcd.l, lcd.l, pref.p, 1, &result, &count) ==
          CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(count == 0);
    CHECK(cublasLtMatmul(h.h, desc.d, &alpha, buf->ptr, la.l, buf->ptr, lb.l, &beta, buf->ptr, lcd.l, buf->ptr,
                         lcd.l, nullptr, nullptr, 0, nullptr) == CUBLAS_STATUS_NOT_SUPPORTED);
  }
}

TEST_CASE("emu cublaslt: epilogues, device pointer modes, TRANSC and fill modes are NOT_SUPPORTED") {
  Handle h;
  Preference pref;
  const GemmSpec g = worked_example();
  Layout la(g.a), lb(g.b), lc(g.c), ld(g.d);
  struct Case {
    const char* what;
    cublasLtMatmulDescAttributes_t attr;
    int32_t value;
  };
  const Case cases[] = {
      {"epilogue RELU", CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_RELU},
      {"epilogue BIAS", CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS},
      {"pointer mode DEVICE", CUBLASLT_MATMUL_DESC_POINTER_MODE, CUBLASLT_POINTER_MODE_DEVICE},
      {"TRANSC T", CUBLASLT_MATMUL_DESC_TRANSC, CUBLAS_OP_T},
      {"fill mode LOWER", CUBLASLT_MATMUL_DESC_FILL_MODE, CUBLAS_FILL_MODE_LOWER},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    Desc desc(CUBLAS_OP_N, CUBLAS_OP_N);
    REQUIRE(cublasLtMatmulDescSetAttribute(desc.d, c.attr, &c.value, sizeof(c.value)) == CUBLAS_STATUS_SUCCESS);
    const Heuristic r = heuristic(h, desc, la, lb, lc, ld, pref);
    CHECK(r.status == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(r.count == 0);
  }
}

TEST_CASE("emu cublaslt: attributes round-trip, unknown attributes and wrong sizes are INVALID_VALUE") {
  SUBCASE("matrix layout") {
    cublasLtMatrixLayout_t l = nullptr;
    REQUIRE(cublasLtMatrixLayoutCreate(&l, CUDA_R_16BF, 7, 5, 9) == CUBLAS_STATUS_SUCCESS);
    uint32_t type = 0;
    int32_t order = -1, batch = 0;
    uint64_t rows = 0, cols = 0;
    int64_t ld = 0;
    size_t written = 0;
    CHECK(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_TYPE, &type, sizeof(type), &written) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(type == CUDA_R_16BF);
    CHECK(written == sizeof(type));
    CHECK(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof(order), nullptr) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(order == CUBLASLT_ORDER_COL);  // documented default
    CHECK(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, sizeof(rows), nullptr) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof(cols), nullptr) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof(ld), nullptr) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch), nullptr) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(rows == 7);
    CHECK(cols == 5);
    CHECK(ld == 9);
    CHECK(batch == 1);  // documented default
    const int64_t stride = 123;
    CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                           sizeof(stride)) == CUBLAS_STATUS_SUCCESS);
    int64_t stride_back = 0;
    CHECK(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride_back,
                                           sizeof(stride_back), nullptr) == CUBLAS_STATUS_SUCCESS);
    CHECK(stride_back == 123);
    CHECK(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_LD, nullptr, 0, &written) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(written == sizeof(int64_t));  // a size query
    CHECK(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_LD, nullptr, 0, nullptr) ==
          CUBLAS_STATUS_INVALID_VALUE);
    const int32_t ld32 = 9;  // LD is int64_t
    CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_LD, &ld32, sizeof(ld32)) ==
          CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_LD, nullptr, sizeof(int64_t)) ==
          CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatrixLayoutSetAttribute(l, cublasLtMatrixLayoutAttribute_t(99), &stride, sizeof(stride)) ==
          CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, sizeof(uint32_t), nullptr) ==
          CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatrixLayoutDestroy(l) == CUBLAS_STATUS_SUCCESS);
  }
  SUBCASE("matmul descriptor") {
    cublasLtMatmulDesc_t d = nullptr;
    REQUIRE(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
    int32_t compute = 0, trans = -1;
    uint32_t epilogue = 0;
    CHECK(cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, &compute, sizeof(compute),
                                         nullptr) == CUBLAS_STATUS_SUCCESS);
    CHECK(compute == CUBLAS_COMPUTE_32F);
    CHECK(cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans), nullptr) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(trans == CUBLAS_OP_N);
    CHECK(cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue), nullptr) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(epilogue == CUBLASLT_EPILOGUE_DEFAULT);
    const int32_t t = CUBLAS_OP_T;
    CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &t, sizeof(t)) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &trans, sizeof(trans), nullptr) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(trans == CUBLAS_OP_T);
    const int8_t fast_accum = 1;  // the one int8_t attribute
    CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, 1) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &t, sizeof(t)) ==
          CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatmulDescSetAttribute(d, cublasLtMatmulDescAttributes_t(9), &t, sizeof(t)) ==
          CUBLAS_STATUS_INVALID_VALUE);  // a gap in the enum
    CHECK(cublasLtMatmulDescSetAttribute(d, cublasLtMatmulDescAttributes_t(1000), &t, sizeof(t)) ==
          CUBLAS_STATUS_INVALID_VALUE);
    const uint64_t t64 = CUBLAS_OP_T;
    CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &t64, sizeof(t64)) ==
          CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatmulDescDestroy(d) == CUBLAS_STATUS_SUCCESS);
  }
  SUBCASE("preference") {
    cublasLtMatmulPreference_t p = nullptr;
    REQUIRE(cublasLtMatmulPreferenceCreate(&p) == CUBLAS_STATUS_SUCCESS);
    uint64_t workspace = 1;
    uint32_t alignment = 0;
    CHECK(cublasLtMatmulPreferenceGetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                               sizeof(workspace), nullptr) == CUBLAS_STATUS_SUCCESS);
    CHECK(workspace == 0);  // documented default: no workspace
    CHECK(cublasLtMatmulPreferenceGetAttribute(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &alignment,
                                               sizeof(alignment), nullptr) == CUBLAS_STATUS_SUCCESS);
    CHECK(alignment == 256);  // documented default
    const uint32_t w32 = 1024;  // MAX_WORKSPACE_BYTES is uint64_t
    CHECK(cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &w32, sizeof(w32)) ==
          CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatmulPreferenceSetAttribute(p, cublasLtMatmulPreferenceAttributes_t(2), &w32, sizeof(w32)) ==
          CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatmulPreferenceDestroy(p) == CUBLAS_STATUS_SUCCESS);
  }
}

TEST_CASE("emu cublaslt: null and destroyed handles and descriptors") {
  const GemmSpec g = worked_example();
  Handle h;
  Desc desc(CUBLAS_OP_N, CUBLAS_OP_N);
  Layout la(g.a), lb(g.b), lc(g.c), ld(g.d);
  Preference pref;
  cublasLtMatmulHeuristicResult_t result{};
  int count = -1;
  const float alpha = 1, beta = 0;
  auto buf = on_device(std::vector<float>(8));
  CHECK(cublasLtCreate(nullptr) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasLtDestroy(nullptr) == CUBLAS_STATUS_NOT_INITIALIZED);
  CHECK(cublasLtMatrixLayoutCreate(nullptr, CUDA_R_32F, 2, 2, 2) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasLtMatmulAlgoGetHeuristic(nullptr, desc.d, la.l, lb.l, lc.l, ld.l, pref.p, 1, &result, &count) ==
        CUBLAS_STATUS_NOT_INITIALIZED);
  CHECK(count == 0);
  CHECK(cublasLtMatmulAlgoGetHeuristic(h.h, nullptr, la.l, lb.l, lc.l, ld.l, pref.p, 1, &result, &count) ==
        CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasLtMatmulAlgoGetHeuristic(h.h, desc.d, la.l, nullptr, lc.l, ld.l, pref.p, 1, &result, &count) ==
        CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasLtMatmulAlgoGetHeuristic(h.h, desc.d, la.l, lb.l, lc.l, ld.l, pref.p, 0, &result, &count) ==
        CUBLAS_STATUS_INVALID_VALUE);  // documented: requestedAlgoCount <= 0
  CHECK(cublasLtMatmul(nullptr, desc.d, &alpha, buf->ptr, la.l, buf->ptr, lb.l, &beta, buf->ptr, lc.l, buf->ptr,
                       ld.l, nullptr, nullptr, 0, nullptr) == CUBLAS_STATUS_NOT_INITIALIZED);
  CHECK(cublasLtMatmul(h.h, desc.d, nullptr, buf->ptr, la.l, buf->ptr, lb.l, &beta, buf->ptr, lc.l, buf->ptr, ld.l,
                       nullptr, nullptr, 0, nullptr) == CUBLAS_STATUS_INVALID_VALUE);
  cublasLtMatrixLayout_t gone = nullptr;
  REQUIRE(cublasLtMatrixLayoutCreate(&gone, CUDA_R_32F, 2, 3, 2) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutDestroy(gone) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasLtMatmulAlgoGetHeuristic(h.h, desc.d, gone, lb.l, lc.l, ld.l, pref.p, 1, &result, &count) ==
        CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasLtMatrixLayoutDestroy(gone) == CUBLAS_STATUS_INVALID_VALUE);  // destroyed twice
  cublasLtHandle_t gone_handle = nullptr;
  REQUIRE(cublasLtCreate(&gone_handle) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtDestroy(gone_handle) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasLtMatmul(gone_handle, desc.d, &alpha, buf->ptr, la.l, buf->ptr, lb.l, &beta, buf->ptr, lc.l, buf->ptr,
                       ld.l, nullptr, nullptr, 0, nullptr) == CUBLAS_STATUS_NOT_INITIALIZED);
}

TEST_CASE("emu cublaslt: the algorithm's workspace and identity are checked by cublasLtMatmul") {
  Handle h;
  const GemmSpec g = worked_example();
  Desc desc(CUBLAS_OP_N, CUBLAS_OP_N);
  Layout la(g.a), lb(g.b), lc(g.c), ld(g.d);
  Preference pref(uint64_t(1) << 20);
  const Heuristic found = heuristic(h, desc, la, lb, lc, ld, pref);
  REQUIRE(found.status == CUBLAS_STATUS_SUCCESS);
  REQUIRE(found.result.workspaceSize > 0);
  auto a = on_device(kA_col), b = on_device(kB_col);
  DeviceBuffer d(4 * sizeof(float)), workspace(found.result.workspaceSize);
  const float alpha = 1, beta = 0;
  Stream stream;
  CHECK(cublasLtMatmul(h.h, desc.d, &alpha, a->ptr, la.l, b->ptr, lb.l, &beta, d.ptr, lc.l, d.ptr, ld.l,
                       &found.result.algo, workspace.ptr, found.result.workspaceSize - 1,
                       stream.s) == CUBLAS_STATUS_INVALID_VALUE);  // documented: less than the algo needs
  CHECK(cublasLtMatmul(h.h, desc.d, &alpha, a->ptr, la.l, b->ptr, lb.l, &beta, d.ptr, lc.l, d.ptr, ld.l,
                       &found.result.algo, nullptr, found.result.workspaceSize,
                       stream.s) == CUBLAS_STATUS_INVALID_VALUE);
  const cublasLtMatmulAlgo_t foreign{};
  CHECK(cublasLtMatmul(h.h, desc.d, &alpha, a->ptr, la.l, b->ptr, lb.l, &beta, d.ptr, lc.l, d.ptr, ld.l, &foreign,
                       workspace.ptr, found.result.workspaceSize, stream.s) == CUBLAS_STATUS_INVALID_VALUE);
  Layout bf_a({CUDA_R_16BF, 2, 3, 2}), bf_b({CUDA_R_16BF, 3, 2, 3});  // the fp32 algo with bf16 operands
  CHECK(cublasLtMatmul(h.h, desc.d, &alpha, a->ptr, bf_a.l, b->ptr, bf_b.l, &beta, d.ptr, lc.l, d.ptr, ld.l,
                       &found.result.algo, workspace.ptr, found.result.workspaceSize,
                       stream.s) == CUBLAS_STATUS_INVALID_VALUE);
  REQUIRE(cublasLtMatmul(h.h, desc.d, &alpha, a->ptr, la.l, b->ptr, lb.l, &beta, d.ptr, lc.l, d.ptr, ld.l,
                         &found.result.algo, workspace.ptr, found.result.workspaceSize,
                         stream.s) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cudaStreamSynchronize(stream.s) == cudaSuccess);
  CHECK(download<float>(d.ptr, 4) == kAB_col);
  SUBCASE("a preference promising less than the element size has no algorithm") {
    const uint32_t one = 1;
    REQUIRE(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &one,
                                                 sizeof(one)) == CUBLAS_STATUS_SUCCESS);
    const Heuristic none = heuristic(h, desc, la, lb, lc, ld, pref);
    CHECK(none.status == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(none.count == 0);
  }
}

TEST_CASE("emu cublaslt: version and status strings") {
  CHECK(cublasLtGetVersion() == size_t(CUBLAS_VERSION));
  CHECK(std::string(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED)) == "CUBLAS_STATUS_NOT_SUPPORTED");
  CHECK(std::string(cublasLtGetStatusName(CUBLAS_STATUS_INVALID_VALUE)) == "CUBLAS_STATUS_INVALID_VALUE");
  CHECK(std::string(cublasLtGetStatusString(CUBLAS_STATUS_SUCCESS)) == "success");
  CHECK(std::string(cublasLtGetStatusString(CUBLAS_STATUS_INVALID_VALUE)).find("invalid") != std::string::npos);
}

// ---- device faults: sticky, so each runs in its own child process ----

namespace {

// The worked example with A, B, D as given; cublasLtMatmul must accept it, the fault comes at the synchronize.
void expect_fault(const void* a, const void* b, void* d, cudaError_t fault) {
  const GemmSpec g = worked_example();
  Handle h;
  Desc desc(CUBLAS_OP_N, CUBLAS_OP_N);
  Layout la(g.a), lb(g.b), lc(g.c), ld(g.d);
  Preference pref(0);  // no workspace, and the default alignment promises: 256 bytes
  const Heuristic found = heuristic(h, desc, la, lb, lc, ld, pref);
  REQUIRE(found.status == CUBLAS_STATUS_SUCCESS);
  Stream stream;
  const float alpha = 1, beta = 0;
  CHECK(cublasLtMatmul(h.h, desc.d, &alpha, a, la.l, b, lb.l, &beta, d, lc.l, d, ld.l, &found.result.algo, nullptr,
                       0, stream.s) == CUBLAS_STATUS_SUCCESS);  // validated on the host: nothing wrong there
  CHECK(cudaStreamSynchronize(stream.s) == fault);
  CHECK(cudaDeviceSynchronize() == fault);  // sticky
  CHECK(cublasLtMatmul(h.h, desc.d, &alpha, a, la.l, b, lb.l, &beta, d, lc.l, d, ld.l, &found.result.algo, nullptr,
                       0, stream.s) == CUBLAS_STATUS_EXECUTION_FAILED);
}

}  // namespace

TEST_CASE("emu cublaslt child: a host pointer as A" * doctest::skip()) {
  auto b = on_device(kB_col);
  DeviceBuffer d(4 * sizeof(float));
  expect_fault(kA_col.data(), b->ptr, d.ptr, cudaErrorIllegalAddress);
}

TEST_CASE("emu cublaslt child: A runs past its allocation" * doctest::skip()) {
  DeviceBuffer a(4 * sizeof(float));  // 2x3 with ld 2 spans 6 floats
  auto b = on_device(kB_col);
  DeviceBuffer d(4 * sizeof(float));
  expect_fault(a.ptr, b->ptr, d.ptr, cudaErrorIllegalAddress);
}

TEST_CASE("emu cublaslt child: pinned host memory as D" * doctest::skip()) {
  auto a = on_device(kA_col), b = on_device(kB_col);
  void* d = nullptr;
  REQUIRE(cudaMallocHost(&d, 4 * sizeof(float)) == cudaSuccess);
  expect_fault(a->ptr, b->ptr, d, cudaErrorIllegalAddress);
  cudaFreeHost(d);
}

TEST_CASE("emu cublaslt child: B less aligned than the heuristic was promised" * doctest::skip()) {
  auto a = on_device(kA_col);
  DeviceBuffer b(8 * sizeof(float));
  DeviceBuffer d(4 * sizeof(float));
  expect_fault(a->ptr, static_cast<char*>(b.ptr) + 4, d.ptr, cudaErrorMisalignedAddress);
}

TEST_CASE("emu cublaslt: device faults are sticky errors at the next synchronize, naming the operand") {
  SUBCASE("a host pointer as A") {
    check_child("emu cublaslt child: a host pointer as A",
                {"emulated GPU: ", "cublasLtMatmul(m 2, n 2, k 3): A at 0x",
                 "(fp32 col-major 2x3, ld 2, 24 bytes) is not memory the emulated GPU allocated"});
  }
  SUBCASE("A runs past its allocation") {
    check_child("emu cublaslt child: A runs past its allocation",
                {"cublasLtMatmul(m 2, n 2, k 3): A at 0x", "runs past the end of its allocation (16 bytes at 0x",
                 ") by 8 bytes"});
  }
  SUBCASE("pinned host memory as D") {
    check_child("emu cublaslt child: pinned host memory as D",
                {"cublasLtMatmul(m 2, n 2, k 3): D at 0x", "is pinned host memory"});
  }
  SUBCASE("B less aligned than promised") {
    check_child("emu cublaslt child: B less aligned than the heuristic was promised",
                {"cublasLtMatmul(m 2, n 2, k 3): B at 0x", "is 4-byte aligned, but the algorithm from "
                 "cublasLtMatmulAlgoGetHeuristic assumes 16"});
  }
}
