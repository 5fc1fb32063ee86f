// The emulated cuBLASLt: the part of <cublasLt.h> the project calls (kernels/cuda/gemm_lt.cpp), written from
// NVIDIA's cuBLASLt documentation (the cuBLAS guide's cuBLASLt API chapter and the doc comments of cublasLt.h).
// Descriptors, preferences and the heuristic are host bookkeeping; cublasLtMatmul validates on the host and
// returns the documented status, then queues the product on the stream (runtime.h). On the device worker the
// product checks that every operand is device memory (else a sticky cudaErrorIllegalAddress, as a real kernel's
// fault), then computes it with cublaslt_math.h.
//
// Supported as the real library does it: CUBLASLT_ORDER_COL / ROW, TRANSA / TRANSB N, T (C = T for real types),
// leading dimensions, strided batches, alpha / beta from host memory (CUBLASLT_POINTER_MODE_HOST) read at call
// time, beta = 0 leaving C unread, in-place (C == D, same layout) and out-of-place (own ld) C / D, compute
// CUBLAS_COMPUTE_32F[_PEDANTIC] with scale CUDA_R_32F for A/B bf16 → C/D bf16 or fp32, and all fp32.
// Refused: every other type, compute or pointer mode, epilogues other than DEFAULT, TRANSC / fill mode, planar
// complex and pointer-array batches (CUBLAS_STATUS_NOT_SUPPORTED: "current implementation ... doesn't support").
// Unlike the real library (silent unless CUBLASLT_LOG_LEVEL ≥ 1), every error status is also printed to stderr
// with its reason, so a CI failure says why; CUBLASLT_LOG_LEVEL=0 silences it.
#include <cublasLt.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>

#include "kernels/cuda/emu/cublaslt_math.h"
#include "kernels/cuda/emu/runtime.h"

namespace dflash::emu {
namespace {

// ---- the objects behind the opaque handles ----

// Attribute values live in 64-bit slots indexed by the attribute's enum value, each holding the documented type
// (memcpy in and out); a size of 0 marks a value the enum does not define.
constexpr uint8_t kLayoutAttrBytes[] = {4, 4, 8, 8, 8, 4, 8, 8, 4};  // TYPE .. BATCH_MODE
constexpr uint8_t kDescAttrBytes[] = {
    4, 4, 4, 4, 4, 4, 4, 4,  // COMPUTE_TYPE, SCALE_TYPE, POINTER_MODE, TRANSA, TRANSB, TRANSC, FILL_MODE, EPILOGUE
    8, 0, 8, 8, 8, 8, 8, 4,  // BIAS_POINTER, -, BIAS_BATCH_STRIDE, AUX_POINTER, AUX_LD, AUX_BATCH_STRIDE,
                             // ALPHA_VECTOR_BATCH_STRIDE, SM_COUNT_TARGET
    0, 8, 8, 8, 8, 8,        // -, A/B/C/D_SCALE_POINTER, AMAX_D_POINTER
    4, 8, 8, 1, 4,           // AUX_DATA_TYPE, AUX_SCALE_POINTER, AUX_AMAX_POINTER, FAST_ACCUM (int8), BIAS_DATA_TYPE
    0, 0, 0, 0,              // -
    4, 4, 4, 4, 4,           // A/B/C/D/AUX _SCALE_MODE
    8, 4, 8};                // D_OUT_SCALE_POINTER, D_OUT_SCALE_MODE, EMULATION_DESCRIPTOR
constexpr uint8_t kPrefAttrBytes[] = {4, 8, 0, 4, 0, 4, 4, 4, 4, 4, 0, 0, 8};  // SEARCH_MODE .. IMPL_MASK

constexpr int kLayoutAttrs = sizeof(kLayoutAttrBytes);
constexpr int kDescAttrs = sizeof(kDescAttrBytes);
constexpr int kPrefAttrs = sizeof(kPrefAttrBytes);

struct LtHandle {};  // the library keeps no per-handle state: descriptors carry everything
struct LtLayout {
  uint64_t attr[kLayoutAttrs] = {};
};
struct LtDesc {
  uint64_t attr[kDescAttrs] = {};
};
struct LtPreference {
  uint64_t attr[kPrefAttrs] = {};
};

template <class T>
T get(const uint64_t* slots, int attr) {
  T v;
  std::memcpy(&v, &slots[attr], sizeof(T));
  return v;
}
template <class T>
void put(uint64_t* slots, int attr, T v) {
  slots[attr] = 0;
  std::memcpy(&slots[attr], &v, sizeof(T));
}

// Every live object this library handed out, so that a null, foreign or destroyed handle is refused with the
// documented status instead of being dereferenced.
enum class Kind { handle, layout, desc, preference };
std::mutex registry_mutex;
std::unordered_map<const void*, Kind>& registry() {
  static std::unordered_map<const void*, Kind> live;
  return live;
}
void register_object(const void* p, Kind k) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry()[p] = k;
}
bool is_live(const void* p, Kind k) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto it = registry().find(p);
  return it != registry().end() && it->second == k;
}
bool unregister_object(const void* p, Kind k) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto it = registry().find(p);
  if (it == registry().end() || it->second != k) return false;
  registry().erase(it);
  return true;
}

// ---- statuses and messages ----

const char* status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* status_string(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "error detected trying to check the license";
  }
  return "unknown error";
}

bool log_errors() {
  static const bool on = [] {
    const char* level = std::getenv("CUBLASLT_LOG_LEVEL");
    return !(level && *level && std::atoi(level) == 0);
  }();
  return on;
}

cublasStatus_t fail(cublasStatus_t status, const char* function, const std::string& why) {
  if (log_errors())
    std::fprintf(stderr, "%semulated cuBLASLt: %s: %s (%s)\n", rank_prefix().c_str(), function, why.c_str(),
                 status_name(status));
  return status;
}

template <class... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream s;
  (s << ... << parts);
  return s.str();
}

const char* type_name(int32_t t) {
  switch (t) {
    case CUDA_R_32F: return "CUDA_R_32F";
    case CUDA_R_16BF: return "CUDA_R_16BF";
    case CUDA_R_16F: return "CUDA_R_16F";
    case CUDA_R_64F: return "CUDA_R_64F";
    case CUDA_R_8I: return "CUDA_R_8I";
    case CUDA_R_32I: return "CUDA_R_32I";
    case CUDA_R_8F_E4M3: return "CUDA_R_8F_E4M3";
    case CUDA_R_8F_E5M2: return "CUDA_R_8F_E5M2";
  }
  return "another cudaDataType";
}

// ---- one matmul, as validated: what the device work captures by value (descriptors may be destroyed first) ----

struct Operand {
  char name = '?';  // A, B, C, D
  lt::Element type = lt::Element::f32;
  int32_t cuda_type = CUDA_R_32F;
  bool row_major = false;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int32_t batch = 1;
  int64_t batch_stride = 0;  // elements
};

struct Problem {
  int64_t m = 0, n = 0, k = 0;  // D[m, n] = op(A)[m, k] · op(B)[k, n]
  int32_t batch = 1;
  bool trans_a = false, trans_b = false;
  Operand a, b, c, d;
  uint64_t types_key = 0;  // compute, scale and the four data types: an algo fits only the types it was found for
};

std::string describe(const Operand& o) {
  std::string s = cat(o.type == lt::Element::bf16 ? "bf16 " : "fp32 ", o.row_major ? "row-major " : "col-major ",
                      o.rows, "x", o.cols, ", ld ", o.ld);
  if (o.batch > 1) s += cat(", batch ", o.batch, " every ", o.batch_stride, " elements");
  return s;
}

// Bytes from the operand's pointer to one past its last element, over the whole batch.
uint64_t extent_bytes(const Operand& o) {
  if (o.rows == 0 || o.cols == 0) return 0;
  using u128 = unsigned __int128;
  const u128 one = o.row_major ? u128(o.rows - 1) * u128(o.ld) + o.cols : u128(o.cols - 1) * u128(o.ld) + o.rows;
  const u128 all = one + u128(o.batch - 1) * u128(o.batch_stride);
  const u128 bytes = all * lt::element_bytes(o.type);
  return bytes > u128(UINT64_MAX) ? UINT64_MAX : uint64_t(bytes);
}

cublasStatus_t read_layout(const char* fn, char name, const LtLayout* l, Operand& o) {
  const uint64_t* v = l->attr;
  o.name = name;
  o.cuda_type = int32_t(get<uint32_t>(v, CUBLASLT_MATRIX_LAYOUT_TYPE));
  o.type = o.cuda_type == CUDA_R_16BF ? lt::Element::bf16 : lt::Element::f32;
  const int32_t order = get<int32_t>(v, CUBLASLT_MATRIX_LAYOUT_ORDER);
  o.row_major = order == CUBLASLT_ORDER_ROW;
  o.rows = get<uint64_t>(v, CUBLASLT_MATRIX_LAYOUT_ROWS);
  o.cols = get<uint64_t>(v, CUBLASLT_MATRIX_LAYOUT_COLS);
  o.ld = get<int64_t>(v, CUBLASLT_MATRIX_LAYOUT_LD);
  o.batch = get<int32_t>(v, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT);
  o.batch_stride = get<int64_t>(v, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET);
  const std::string who = cat(name, "desc");
  if (order != CUBLASLT_ORDER_COL && order != CUBLASLT_ORDER_ROW)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, cat(who, ": order ", order, " (the emulation has COL and ROW)"));
  if (get<uint32_t>(v, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE) != CUBLASLT_BATCH_MODE_STRIDED)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, cat(who, ": pointer-array batches are not emulated"));
  if (get<int64_t>(v, CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET) != 0)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, cat(who, ": planar complex layouts are not emulated"));
  if (o.rows > uint64_t(INT32_MAX) || o.cols > uint64_t(INT32_MAX))
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, cat(who, ": ", o.rows, "x", o.cols, " exceeds int32 dimensions"));
  // The documented rule for CUBLASLT_MATRIX_LAYOUT_LD: non-negative, and large enough that elements do not overlap
  // (≥ rows for ORDER_COL, ≥ cols for ORDER_ROW). Checked here, at use: the order may change after creation.
  const uint64_t min_ld = o.row_major ? o.cols : o.rows;
  if (o.ld < 0 || uint64_t(o.ld) < min_ld)
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                cat(who, ": ld ", o.ld, " < ", o.row_major ? "cols " : "rows ", min_ld, " (", describe(o),
                    "): columns would overlap"));
  if (o.batch < 1)
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn, cat(who, ": batch count ", o.batch, " < 1"));
  if (o.batch_stride < 0)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, cat(who, ": negative batch stride ", o.batch_stride));
  return CUBLAS_STATUS_SUCCESS;
}

// Reads the transpose attribute: C is T for real types; CONJG is a placeholder the documentation says is unsupported.
cublasStatus_t read_op(const char* fn, const char* attr, int32_t op, bool& trans) {
  if (op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C) {
    trans = op != CUBLAS_OP_N;
    return CUBLAS_STATUS_SUCCESS;
  }
  if (op == CUBLAS_OP_CONJG) return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, cat(attr, " CUBLAS_OP_CONJG"));
  return fail(CUBLAS_STATUS_INVALID_VALUE, fn, cat(attr, " ", op, " is not a cublasOperation_t"));
}

// Everything both the heuristic and cublasLtMatmul refuse, in the statuses the documentation gives.
cublasStatus_t make_problem(const char* fn, const LtDesc* desc, const LtLayout* la, const LtLayout* lb,
                            const LtLayout* lc, const LtLayout* ldd, Problem& p) {
  const uint64_t* v = desc->attr;
  const int32_t compute = get<int32_t>(v, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE);
  const int32_t scale = get<int32_t>(v, CUBLASLT_MATMUL_DESC_SCALE_TYPE);
  if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_PEDANTIC)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                cat("compute type ", compute, ": the emulation has CUBLAS_COMPUTE_32F (fp32 accumulation) only"));
  if (scale != CUDA_R_32F)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, cat("scale type ", type_name(scale), " with CUBLAS_COMPUTE_32F"));
  const int32_t pointer_mode = get<int32_t>(v, CUBLASLT_MATMUL_DESC_POINTER_MODE);
  if (pointer_mode != CUBLASLT_POINTER_MODE_HOST)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                cat("pointer mode ", pointer_mode, ": the emulation reads alpha and beta from host memory only"));
  const uint32_t epilogue = get<uint32_t>(v, CUBLASLT_MATMUL_DESC_EPILOGUE);
  if (epilogue != CUBLASLT_EPILOGUE_DEFAULT)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, cat("epilogue ", epilogue, ": the emulation has DEFAULT only"));
  if (cublasStatus_t s = read_op(fn, "TRANSA", get<int32_t>(v, CUBLASLT_MATMUL_DESC_TRANSA), p.trans_a)) return s;
  if (cublasStatus_t s = read_op(fn, "TRANSB", get<int32_t>(v, CUBLASLT_MATMUL_DESC_TRANSB), p.trans_b)) return s;
  if (get<int32_t>(v, CUBLASLT_MATMUL_DESC_TRANSC) != CUBLAS_OP_N)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "TRANSC: only CUBLAS_OP_N is supported");
  if (get<int32_t>(v, CUBLASLT_MATMUL_DESC_FILL_MODE) != CUBLAS_FILL_MODE_FULL)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "FILL_MODE: the emulation writes the full matrix only");
  // Documented: scale and amax pointers set for a combination that has none make cublasLtMatmul INVALID_VALUE.
  for (int attr : {CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                   CUBLASLT_MATMUL_DESC_C_SCALE_POINTER, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER,
                   CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER})
    if (get<uint64_t>(v, attr) != 0)
      return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                  cat("matmul descriptor attribute ", attr, " (a scale / amax pointer) is set, but bf16 / fp32 "
                      "matmuls have no matrix scaling"));
  if (get<uint64_t>(v, CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR) != 0)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "EMULATION_DESCRIPTOR: floating point emulation is not emulated");

  const LtLayout* layouts[4] = {la, lb, lc, ldd};
  Operand* operands[4] = {&p.a, &p.b, &p.c, &p.d};
  const char names[4] = {'A', 'B', 'C', 'D'};
  int32_t types[4];
  for (int i = 0; i < 4; ++i) types[i] = int32_t(get<uint32_t>(layouts[i]->attr, CUBLASLT_MATRIX_LAYOUT_TYPE));
  const bool ab_ok = types[0] == types[1] && (types[0] == CUDA_R_16BF || types[0] == CUDA_R_32F);
  const bool cd_ok = types[2] == types[3] &&
                     (types[2] == CUDA_R_32F || (types[2] == CUDA_R_16BF && types[0] == CUDA_R_16BF));
  if (!ab_ok || !cd_ok)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                cat("A ", type_name(types[0]), ", B ", type_name(types[1]), ", C ", type_name(types[2]), ", D ",
                    type_name(types[3]), " with CUBLAS_COMPUTE_32F: the emulation has A/B CUDA_R_16BF with C/D "
                    "CUDA_R_16BF or CUDA_R_32F, and all CUDA_R_32F"));
  for (int i = 0; i < 4; ++i)
    if (cublasStatus_t s = read_layout(fn, names[i], layouts[i], *operands[i])) return s;

  // Shapes: D is m × n; C must match it (in rows, columns and order, documented for out-of-place C ≠ D).
  p.m = int64_t(p.d.rows);
  p.n = int64_t(p.d.cols);
  if (p.c.rows != p.d.rows || p.c.cols != p.d.cols)
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                cat("C is ", p.c.rows, "x", p.c.cols, " but D is ", p.d.rows, "x", p.d.cols));
  if (p.c.row_major != p.d.row_major)
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "C and D have different orders");
  const int64_t a_rows = int64_t(p.trans_a ? p.a.cols : p.a.rows), a_cols = int64_t(p.trans_a ? p.a.rows : p.a.cols);
  const int64_t b_rows = int64_t(p.trans_b ? p.b.cols : p.b.rows), b_cols = int64_t(p.trans_b ? p.b.rows : p.b.cols);
  if (a_rows != p.m)
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                cat("op(A) is ", a_rows, "x", a_cols, " but D has ", p.m, " rows (m)"));
  if (b_cols != p.n)
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                cat("op(B) is ", b_rows, "x", b_cols, " but D has ", p.n, " columns (n)"));
  if (a_cols != b_rows)
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                cat("op(A) is ", a_rows, "x", a_cols, " and op(B) is ", b_rows, "x", b_cols, ": k differs"));
  p.k = a_cols;
  p.batch = p.d.batch;
  for (const Operand* o : {&p.a, &p.b, &p.c})
    if (o->batch != p.batch)
      return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                  cat(o->name, " has batch count ", o->batch, " but D has ", p.batch));
  p.types_key = uint64_t(uint8_t(compute)) | uint64_t(uint8_t(scale)) << 8 | uint64_t(uint8_t(types[0])) << 16 |
                uint64_t(uint8_t(types[1])) << 24 | uint64_t(uint8_t(types[2])) << 32 |
                uint64_t(uint8_t(types[3])) << 40;
  return CUBLAS_STATUS_SUCCESS;
}

// ---- the one algorithm: what its cublasLtMatmulAlgo_t holds ----

constexpr uint64_t kAlgoMagic = 0x454d552d4c542d31ull;  // "EMU-LT-1": an algo this library handed out
constexpr size_t kAlgoWorkspaceBytes = 4096;            // scratch the algorithm uses when the preference allows
constexpr uint32_t kWidestAccessBytes = 16;             // a real kernel's widest vector access: its most alignment

// data[0] magic, data[1] types_key, data[2] workspace bytes it needs, data[3] the alignment (bytes) it assumes of
// A, B, C, D, one byte each.
struct AlgoInfo {
  uint64_t types_key = 0;
  size_t workspace = 0;
  uint32_t alignment[4] = {1, 1, 1, 1};
};
cublasLtMatmulAlgo_t encode(const AlgoInfo& info) {
  cublasLtMatmulAlgo_t algo{};
  algo.data[0] = kAlgoMagic;
  algo.data[1] = info.types_key;
  algo.data[2] = info.workspace;
  for (int i = 0; i < 4; ++i) algo.data[3] |= uint64_t(info.alignment[i] & 0xff) << (8 * i);
  return algo;
}
bool decode(const cublasLtMatmulAlgo_t& algo, AlgoInfo& info) {
  if (algo.data[0] != kAlgoMagic) return false;
  info.types_key = algo.data[1];
  info.workspace = size_t(algo.data[2]);
  for (int i = 0; i < 4; ++i) info.alignment[i] = uint32_t(algo.data[3] >> (8 * i)) & 0xff;
  return true;
}

uint32_t alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = kWidestAccessBytes;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

// ---- the device side ----

// Why [p, p + bytes) is not device memory, for the fault message.
std::string not_device_memory(const void* p, uint64_t bytes) {
  if (!p) return "is a null pointer";
  const Allocation* a = find_allocation(p, 1);
  if (!a) return "is not memory the emulated GPU allocated (host memory, or freed)";
  if (!a->device_memory)
    return a->pinned ? "is pinned host memory (cudaMallocHost / cudaHostAlloc), not device memory"
                     : "is host memory, not device memory";
  const uint64_t end = uint64_t(static_cast<const char*>(p) - a->base) + bytes;
  return cat("runs past the end of its allocation (", a->bytes, " bytes at ", static_cast<const void*>(a->base),
             ") by ", end - a->bytes, " bytes");
}

// Checks one operand's whole extent on the device worker; false after reporting the fault.
bool operand_reachable(const std::string& what, const Operand& o, const void* p) {
  const uint64_t bytes = extent_bytes(o);
  if (bytes == 0 || is_device_range(p, bytes)) return true;
  device_fault(cudaErrorIllegalAddress, cat(what, ": ", o.name, " at ", p, " (", describe(o), ", ", bytes,
                                            " bytes) ", not_device_memory(p, bytes)));
  return false;
}

bool operand_aligned(const std::string& what, const Operand& o, const void* p, uint32_t assumed) {
  if (extent_bytes(o) == 0 || reinterpret_cast<uintptr_t>(p) % assumed == 0) return true;
  device_fault(cudaErrorMisalignedAddress,
               cat(what, ": ", o.name, " at ", p, " is ", alignment_of(p), "-byte aligned, but the algorithm from "
                   "cublasLtMatmulAlgoGetHeuristic assumes ", assumed, " (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_",
                   o.name, "_BYTES promised more than this pointer has)"));
  return false;
}

// op(X) of batch `b` as a strided view: the layout's strides, swapped by a transpose.
lt::ConstMatrix view(const Operand& o, const void* base, int32_t b, bool transpose) {
  lt::ConstMatrix x;
  x.data = static_cast<const char*>(base) + int64_t(b) * o.batch_stride * int64_t(lt::element_bytes(o.type));
  x.type = o.type;
  x.row_stride = o.row_major ? o.ld : 1;
  x.col_stride = o.row_major ? 1 : o.ld;
  if (transpose) std::swap(x.row_stride, x.col_stride);
  return x;
}

}  // namespace
}  // namespace dflash::emu

using namespace dflash::emu;

namespace {

template <class T, class Opaque>
T* object(Opaque* handle) {
  return reinterpret_cast<T*>(handle);
}

cublasStatus_t set_attribute(const char* fn, uint64_t* slots, const uint8_t* sizes, int count, int attr,
                             const void* buf, size_t size) {
  if (attr < 0 || attr >= count || sizes[attr] == 0)
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn, cat("unknown attribute ", attr));
  if (!buf) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, cat("attribute ", attr, ": buf is null"));
  if (size != sizes[attr])
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                cat("attribute ", attr, ": sizeInBytes ", size, ", but it holds ", int(sizes[attr]), " bytes"));
  slots[attr] = 0;
  std::memcpy(&slots[attr], buf, size);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t get_attribute(const char* fn, const uint64_t* slots, const uint8_t* sizes, int count, int attr,
                             void* buf, size_t size, size_t* written) {
  if (attr < 0 || attr >= count || sizes[attr] == 0)
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn, cat("unknown attribute ", attr));
  if (size == 0) {  // documented: a size query
    if (!written) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "sizeInBytes 0 and sizeWritten null");
    *written = sizes[attr];
    return CUBLAS_STATUS_SUCCESS;
  }
  if (!buf) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, cat("attribute ", attr, ": buf is null"));
  if (size != sizes[attr])
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                cat("attribute ", attr, ": sizeInBytes ", size, ", but it holds ", int(sizes[attr]), " bytes"));
  std::memcpy(buf, &slots[attr], size);
  if (written) *written = size;
  return CUBLAS_STATUS_SUCCESS;
}

// The checks at the top of the heuristic and of cublasLtMatmul: live handle, live descriptors.
cublasStatus_t check_objects(const char* fn, cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                             cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                             cublasLtMatrixLayout_t d) {
  if (!handle || !is_live(handle, Kind::handle))
    return fail(CUBLAS_STATUS_NOT_INITIALIZED, fn, "the handle is null or not from cublasLtCreate");
  if (!desc || !is_live(desc, Kind::desc))
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "the matmul descriptor is null or destroyed");
  const cublasLtMatrixLayout_t layouts[4] = {a, b, c, d};
  for (int i = 0; i < 4; ++i)
    if (!layouts[i] || !is_live(layouts[i], Kind::layout))
      return fail(CUBLAS_STATUS_INVALID_VALUE, fn, cat("ABCD"[i], "desc is null or destroyed"));
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t* lightHandle) {
  if (!lightHandle) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate", "lightHandle is null");
  auto* h = new LtHandle;
  register_object(h, Kind::handle);
  *lightHandle = reinterpret_cast<cublasLtHandle_t>(h);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t lightHandle) {
  if (!lightHandle || !unregister_object(lightHandle, Kind::handle))
    return fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy", "the handle is null or not from cublasLtCreate");
  delete object<LtHandle>(lightHandle);
  return CUBLAS_STATUS_SUCCESS;
}

const char* CUBLASWINAPI cublasLtGetStatusName(cublasStatus_t status) { return status_name(status); }

const char* CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t status) { return status_string(status); }

size_t CUBLASWINAPI cublasLtGetVersion(void) { return CUBLAS_VERSION; }

// ---- matrix layouts ----

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type,
                                                       uint64_t rows, uint64_t cols, int64_t ld) {
  if (!matLayout) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutCreate", "matLayout is null");
  auto* l = new LtLayout;
  put<uint32_t>(l->attr, CUBLASLT_MATRIX_LAYOUT_TYPE, uint32_t(type));
  put<int32_t>(l->attr, CUBLASLT_MATRIX_LAYOUT_ORDER, CUBLASLT_ORDER_COL);
  put<uint64_t>(l->attr, CUBLASLT_MATRIX_LAYOUT_ROWS, rows);
  put<uint64_t>(l->attr, CUBLASLT_MATRIX_LAYOUT_COLS, cols);
  put<int64_t>(l->attr, CUBLASLT_MATRIX_LAYOUT_LD, ld);
  put<int32_t>(l->attr, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, 1);
  put<int64_t>(l->attr, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, 0);
  put<int64_t>(l->attr, CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET, 0);
  put<uint32_t>(l->attr, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, CUBLASLT_BATCH_MODE_STRIDED);
  register_object(l, Kind::layout);
  *matLayout = reinterpret_cast<cublasLtMatrixLayout_t>(l);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  if (!matLayout) return CUBLAS_STATUS_SUCCESS;
  if (!unregister_object(matLayout, Kind::layout))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutDestroy", "not a live layout (destroyed twice?)");
  delete object<LtLayout>(matLayout);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                             cublasLtMatrixLayoutAttribute_t attr, const void* buf,
                                                             size_t sizeInBytes) {
  const char* fn = "cublasLtMatrixLayoutSetAttribute";
  if (!matLayout || !is_live(matLayout, Kind::layout))
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "matLayout is null or destroyed");
  return set_attribute(fn, object<LtLayout>(matLayout)->attr, kLayoutAttrBytes, kLayoutAttrs, attr, buf,
                       sizeInBytes);
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout,
                                                             cublasLtMatrixLayoutAttribute_t attr, void* buf,
                                                             size_t sizeInBytes, size_t* sizeWritten) {
  const char* fn = "cublasLtMatrixLayoutGetAttribute";
  if (!matLayout || !is_live(matLayout, Kind::layout))
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "matLayout is null or destroyed");
  return get_attribute(fn, object<LtLayout>(matLayout)->attr, kLayoutAttrBytes, kLayoutAttrs, attr, buf,
                       sizeInBytes, sizeWritten);
}

// ---- matmul descriptors ----

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc,
                                                     cublasComputeType_t computeType, cudaDataType_t scaleType) {
  if (!matmulDesc) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescCreate", "matmulDesc is null");
  auto* d = new LtDesc;
  put<int32_t>(d->attr, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, computeType);
  put<int32_t>(d->attr, CUBLASLT_MATMUL_DESC_SCALE_TYPE, scaleType);
  put<int32_t>(d->attr, CUBLASLT_MATMUL_DESC_POINTER_MODE, CUBLASLT_POINTER_MODE_HOST);
  put<int32_t>(d->attr, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_N);
  put<int32_t>(d->attr, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  put<int32_t>(d->attr, CUBLASLT_MATMUL_DESC_TRANSC, CUBLAS_OP_N);
  put<int32_t>(d->attr, CUBLASLT_MATMUL_DESC_FILL_MODE, CUBLAS_FILL_MODE_FULL);
  put<uint32_t>(d->attr, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_DEFAULT);
  put<int32_t>(d->attr, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, -1);
  put<int32_t>(d->attr, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, -1);
  register_object(d, Kind::desc);
  *matmulDesc = reinterpret_cast<cublasLtMatmulDesc_t>(d);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  if (!matmulDesc) return CUBLAS_STATUS_SUCCESS;
  if (!unregister_object(matmulDesc, Kind::desc))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescDestroy", "not a live descriptor (destroyed twice?)");
  delete object<LtDesc>(matmulDesc);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                           cublasLtMatmulDescAttributes_t attr, const void* buf,
                                                           size_t sizeInBytes) {
  const char* fn = "cublasLtMatmulDescSetAttribute";
  if (!matmulDesc || !is_live(matmulDesc, Kind::desc))
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "matmulDesc is null or destroyed");
  return set_attribute(fn, object<LtDesc>(matmulDesc)->attr, kDescAttrBytes, kDescAttrs, attr, buf, sizeInBytes);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                           cublasLtMatmulDescAttributes_t attr, void* buf,
                                                           size_t sizeInBytes, size_t* sizeWritten) {
  const char* fn = "cublasLtMatmulDescGetAttribute";
  if (!matmulDesc || !is_live(matmulDesc, Kind::desc))
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "matmulDesc is null or destroyed");
  return get_attribute(fn, object<LtDesc>(matmulDesc)->attr, kDescAttrBytes, kDescAttrs, attr, buf, sizeInBytes,
                       sizeWritten);
}

// ---- heuristic preferences ----

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (!pref) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceCreate", "pref is null");
  auto* p = new LtPreference;
  put<uint32_t>(p->attr, CUBLASLT_MATMUL_PREF_SEARCH_MODE, CUBLASLT_SEARCH_BEST_FIT);
  put<uint64_t>(p->attr, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, 0);  // documented default: no workspace
  put<uint32_t>(p->attr, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, CUBLASLT_REDUCTION_SCHEME_MASK);
  for (int attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                   CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    put<uint32_t>(p->attr, attr, 256);
  put<float>(p->attr, CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT, 0.0f);
  put<uint64_t>(p->attr, CUBLASLT_MATMUL_PREF_IMPL_MASK, ~uint64_t(0));
  register_object(p, Kind::preference);
  *pref = reinterpret_cast<cublasLtMatmulPreference_t>(p);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  if (!pref) return CUBLAS_STATUS_SUCCESS;
  if (!unregister_object(pref, Kind::preference))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceDestroy",
                "not a live preference (destroyed twice?)");
  delete object<LtPreference>(pref);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                                 cublasLtMatmulPreferenceAttributes_t attr,
                                                                 const void* buf, size_t sizeInBytes) {
  const char* fn = "cublasLtMatmulPreferenceSetAttribute";
  if (!pref || !is_live(pref, Kind::preference))
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "pref is null or destroyed");
  return set_attribute(fn, object<LtPreference>(pref)->attr, kPrefAttrBytes, kPrefAttrs, attr, buf, sizeInBytes);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                                 cublasLtMatmulPreferenceAttributes_t attr, void* buf,
                                                                 size_t sizeInBytes, size_t* sizeWritten) {
  const char* fn = "cublasLtMatmulPreferenceGetAttribute";
  if (!pref || !is_live(pref, Kind::preference))
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "pref is null or destroyed");
  return get_attribute(fn, object<LtPreference>(pref)->attr, kPrefAttrBytes, kPrefAttrs, attr, buf, sizeInBytes,
                       sizeWritten);
}

// ---- the heuristic: one algorithm, when the problem and the preference allow it ----

cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle,
                                                           cublasLtMatmulDesc_t operationDesc,
                                                           cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                                           cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                                           cublasLtMatmulPreference_t preference,
                                                           int requestedAlgoCount,
                                                           cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                                           int* returnAlgoCount) {
  const char* fn = "cublasLtMatmulAlgoGetHeuristic";
  if (returnAlgoCount) *returnAlgoCount = 0;
  if (cublasStatus_t s = check_objects(fn, lightHandle, operationDesc, Adesc, Bdesc, Cdesc, Ddesc)) return s;
  if (!preference || !is_live(preference, Kind::preference))
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "the preference is null or destroyed");
  if (requestedAlgoCount <= 0)
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn, cat("requestedAlgoCount ", requestedAlgoCount, " <= 0"));
  if (!heuristicResultsArray || !returnAlgoCount)
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "heuristicResultsArray or returnAlgoCount is null");
  Problem p;
  if (cublasStatus_t s = make_problem(fn, object<LtDesc>(operationDesc), object<LtLayout>(Adesc),
                                      object<LtLayout>(Bdesc), object<LtLayout>(Cdesc), object<LtLayout>(Ddesc), p))
    return s;

  const uint64_t* pref = object<LtPreference>(preference)->attr;
  if (get<uint32_t>(pref, CUBLASLT_MATMUL_PREF_SEARCH_MODE) != CUBLASLT_SEARCH_BEST_FIT)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "search mode: the emulation has CUBLASLT_SEARCH_BEST_FIT only");
  AlgoInfo info;
  info.types_key = p.types_key;
  const Operand* operands[4] = {&p.a, &p.b, &p.c, &p.d};
  const int align_attr[4] = {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                             CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i) {
    const uint32_t promised = get<uint32_t>(pref, align_attr[i]);
    const uint32_t element = uint32_t(lt::element_bytes(operands[i]->type));
    if (promised < element)  // no kernel reads elements that straddle their own size
      return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                  cat("MIN_ALIGNMENT_", operands[i]->name, "_BYTES ", promised, " < the element size ", element,
                      ": no algorithm"));
    info.alignment[i] = promised < kWidestAccessBytes ? promised : kWidestAccessBytes;
  }
  // Fault injection for the callers' fallback: DFLASH_EMU_CUBLASLT_REFUSE_LD=N answers "no algorithm" for any
  // layout whose leading dimension is not a multiple of N bytes, as a real cuBLASLt may for odd ones.
  if (const char* refuse = std::getenv("DFLASH_EMU_CUBLASLT_REFUSE_LD")) {
    const long n = std::atol(refuse);
    for (const Operand* o : operands)
      if (n > 0 && (o->ld * int64_t(lt::element_bytes(o->type))) % n != 0)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                    cat("DFLASH_EMU_CUBLASLT_REFUSE_LD=", n, ": the leading dimension of ", o->name, " is ",
                        o->ld * int64_t(lt::element_bytes(o->type)), " bytes: no algorithm"));
  }
  const float max_waves = get<float>(pref, CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT);
  if (max_waves > 0.0f && max_waves < 1.0f)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, cat("MAX_WAVES_COUNT ", max_waves, " < the algorithm's 1.0"));
  const uint64_t impl = CUBLASLT_NUMERICAL_IMPL_FLAGS_FMA | CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_32F |
                        (p.a.type == lt::Element::bf16 ? CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16BF
                                                       : CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_32F);
  if ((get<uint64_t>(pref, CUBLASLT_MATMUL_PREF_IMPL_MASK) & impl) != impl)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "IMPL_MASK excludes FMA with fp32 accumulation: no algorithm");
  const uint64_t max_workspace = get<uint64_t>(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES);
  info.workspace = max_workspace >= kAlgoWorkspaceBytes ? kAlgoWorkspaceBytes : 0;

  cublasLtMatmulHeuristicResult_t& r = heuristicResultsArray[0];
  r = cublasLtMatmulHeuristicResult_t{};
  r.algo = encode(info);
  r.workspaceSize = info.workspace;
  r.state = CUBLAS_STATUS_SUCCESS;
  r.wavesCount = 1.0f;
  *returnAlgoCount = 1;
  return CUBLAS_STATUS_SUCCESS;
}

// ---- the product ----

cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                                           const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc,
                                           const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                                           const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                                           cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
                                           void* workspace, size_t workspaceSizeInBytes, cudaStream_t stream) {
  const char* fn = "cublasLtMatmul";
  if (cublasStatus_t s = check_objects(fn, lightHandle, computeDesc, Adesc, Bdesc, Cdesc, Ddesc)) return s;
  Problem p;
  if (cublasStatus_t s = make_problem(fn, object<LtDesc>(computeDesc), object<LtLayout>(Adesc),
                                      object<LtLayout>(Bdesc), object<LtLayout>(Cdesc), object<LtLayout>(Ddesc), p))
    return s;
  if (!alpha || !beta) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "alpha or beta is null");
  // Documented in-place form: C == D with Cdesc equal to Ddesc (an out-of-place D may have its own ld).
  if (C == D && (p.c.ld != p.d.ld || p.c.batch_stride != p.d.batch_stride))
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                cat("C == D (in place) but Cdesc (", describe(p.c), ") differs from Ddesc (", describe(p.d), ")"));

  AlgoInfo info;
  if (algo) {
    if (!decode(*algo, info))
      return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "algo was not returned by cublasLtMatmulAlgoGetHeuristic");
    if (info.types_key != p.types_key)
      return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "algo was found for other compute / data types");
  } else {  // documented: a null algo runs an implicit heuristic query (default preferences: no workspace)
    info.types_key = p.types_key;
    const void* pointers[4] = {A, B, C, D};
    for (int i = 0; i < 4; ++i) info.alignment[i] = alignment_of(pointers[i]);
  }
  if (workspaceSizeInBytes < info.workspace)
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                cat("workspaceSizeInBytes ", workspaceSizeInBytes, " < the ", info.workspace,
                    " bytes the algo needs (heuristic result's workspaceSize)"));
  if (info.workspace > 0 && !workspace)
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "workspace is null but the algo needs one");

  // Host pointer mode: alpha and beta are read now, in the scale type (fp32); the caller may reuse them at once.
  float alpha_value, beta_value;
  std::memcpy(&alpha_value, alpha, sizeof(float));
  std::memcpy(&beta_value, beta, sizeof(float));

  std::string what = cat("cublasLtMatmul(m ", p.m, ", n ", p.n, ", k ", p.k);
  if (p.batch > 1) what += cat(", batch ", p.batch);
  what += ")";
  auto run = [p, A, B, C, D, alpha_value, beta_value, workspace, info, what]() {
    const bool read_c = beta_value != 0.0f;
    if (!operand_reachable(what, p.a, A) || !operand_reachable(what, p.b, B) ||
        (read_c && !operand_reachable(what, p.c, C)) || !operand_reachable(what, p.d, D))
      return;
    if (info.workspace > 0 && !is_device_range(workspace, info.workspace)) {
      device_fault(cudaErrorIllegalAddress, cat(what, ": workspace at ", workspace, " (", info.workspace,
                                                " bytes) ", not_device_memory(workspace, info.workspace)));
      return;
    }
    if (!operand_aligned(what, p.a, A, info.alignment[0]) || !operand_aligned(what, p.b, B, info.alignment[1]) ||
        (read_c && !operand_aligned(what, p.c, C, info.alignment[2])) ||
        !operand_aligned(what, p.d, D, info.alignment[3]))
      return;
    // The algorithm's scratch: left holding a NaN pattern, as a real kernel leaves it holding partial sums.
    if (info.workspace > 0) std::memset(workspace, 0xff, info.workspace);
    for (int32_t b = 0; b < p.batch; ++b) {
      const lt::ConstMatrix a = view(p.a, A, b, p.trans_a), bm = view(p.b, B, b, p.trans_b);
      const lt::ConstMatrix c = read_c ? view(p.c, C, b, false) : lt::ConstMatrix{};
      const lt::ConstMatrix d_view = view(p.d, D, b, false);
      const lt::Matrix d{const_cast<void*>(d_view.data), d_view.type, d_view.row_stride, d_view.col_stride};
      lt::gemm(p.m, p.n, p.k, alpha_value, a, bm, beta_value, c, d);
    }
  };
  const cudaError_t queued = enqueue(stream, Work{what, std::move(run), {}});
  if (queued != cudaSuccess)
    return fail(CUBLAS_STATUS_EXECUTION_FAILED, fn, cat(what, ": the stream refused the work: ",
                                                        cudaGetErrorString(queued)));
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
