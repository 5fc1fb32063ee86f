// DFlash drafter attention on tensor cores (bf16 inputs, fp32 accumulation and statistics), FlashAttention-2 style:
// mma.sync m16n8k16 for every product, ldmatrix from XOR-swizzled shared tiles, cp.async double buffering, the
// online softmax in registers. Mask and shapes: kernels/attention_shape.h. Unverified on GPU (runs on the emulated
// GPU in CI); the CUDA-core kernels of attention_dflash.cu stay as the fp32 path and as this file's reference.
//
// Work split (no atomics; every output element has one writer and a fixed summation order: the same bits on
// every run):
//   forward    one thread block per (anchor block b, kv head g). Its query tile is the block's B rows × the G
//              query heads of g, j-major (row m = j·G + hh: the G heads of row j are contiguous in q), 16 rows per
//              warp, Q fragments in registers. The block streams only the keys its rows can see: context rows
//              [lo_0, min(a_b, S)) (lo_0 = the first row's window start, 0 for a full layer), then the block's own
//              B keys, in tiles of BC keys shared by all warps. Masks are applied only in partial tiles (the last
//              context tile, the sliding window's edge, the block's own keys when causal). Saves lse.
//   delta      one warp per (query row, head): rowsum(dO ⊙ O) in fp32.
//   dQ         the forward's split: recomputes P = exp(S − lse), dP = dO Vᵀ, dS = P ⊙ (dP − delta), dQ += dS K.
//   dK, dV     one thread block per (key tile of 64, kv head g), 16 keys per warp, K and V fragments in registers.
//              A context tile visits the anchor blocks whose rows see any of its keys (block order: fixed); a
//              block-key tile visits only its own block. Per visited block, the query tile in chunks of 32 rows
//              (Q, dO, lse, delta through shared memory): Sᵀ = K Qᵀ, Pᵀ, dPᵀ = V dOᵀ, dSᵀ; dV += Pᵀ dO, dK += dSᵀ Q.
// Longest first: work per anchor block grows with its anchor (0–S context keys), and the hardware hands out thread
// blocks in blockIdx order, so blockIdx.x = x runs anchor block n_blocks − 1 − x (forward and dQ): with ascending
// anchors (lib/train/anchors sorts them) the longest blocks start first and the short ones fill the tail. Unsorted
// anchors give the same results in another order (each block writes only its own rows). The context tiles of
// dK/dV come longest first by construction (tile 0 is seen by every block). The target's causal attention reverses
// its query tiles likewise (the last rows see the most keys).
//
// Split-K (flash-decoding) for the target's cached attention with few query rows over a long cache: the key tiles
// of each (query tile, kv head) are cut into `splits` contiguous ranges, one thread block each (blockIdx.z); a
// split writes its rows' unnormalised output and (running max, sum) in fp32 to scratch, and a merge kernel (one
// warp per (query row, head)) combines the splits by log-sum-exp in split order: fixed, no atomics. One split is
// the unsplit kernel, writing bf16 out directly.
//
// Fragment mechanics (kernels/cuda/mma.cuh): a score tile is the C fragment of A (16 rows × D, registers) times a
// shared tile's rowsᵀ (ldmatrix, not transposed); a product P·X reuses the score tile's C fragments as the A
// operand (rounded to bf16, as FlashAttention-2 does) against a shared tile's rows (ldmatrix .trans).
#include <algorithm>

#include "kernels/cuda/attention_math.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/split_merge.cuh"

namespace dflash::kernels::cuda {

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.69314718055994531f;
constexpr int kMaxTcWarps = 32;  // an anchor block's query tile of at most 512 rows (block · G), in thread blocks of what
                                 // the kernel's registers allow (row_slices)
constexpr int kKeyTileKV = 64;      // keys per dK/dV thread block: 4 warps of 16
constexpr int kQueryChunk = 32;     // query rows per dK/dV step

// A shared tile of rows × D bf16, row-major, its 16-byte chunks XOR-swizzled by row % 8 so that the 8 row
// addresses of one ldmatrix matrix (same chunk, 8 consecutive rows) fall in 8 different bank groups.
template <int D>
struct SwizzledTile {
  bf16* base;
  __device__ bf16* chunk(int row, int c) const { return base + row * D + ((c ^ (row & 7)) << 3); }
};

// rows [0, n_valid) of src (row stride `stride` elements) into the tile by cp.async; rows [n_valid, n_rows) zero
// (a padded key must give a finite score and a zero value: 0·NaN would poison P·V).
template <int D>
__device__ void load_rows_async(SwizzledTile<D> tile, const bf16* src, size_t stride, int n_valid, int n_rows) {
  constexpr int kChunks = D / 8;
  for (int i = threadIdx.x; i < n_rows * kChunks; i += blockDim.x) {
    const int row = i / kChunks, c = i % kChunks;
    bf16* dst = tile.chunk(row, c);
    if (row < n_valid)
      cp_async_cg(dst, src + size_t(row) * stride + size_t(c) * 8);
    else
      *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
  }
}

__device__ __forceinline__ uint32_t load_b32(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// A fragments (16 rows × D) of this warp's rows m0 + [0, 16) straight from global memory (once per thread block);
// row_ptr(m) is row m's D values, rows ≥ M are zero.
template <int D, typename RowPtr>
__device__ void load_a_rows(MmaFragA (&a)[D / 16], RowPtr row_ptr, int m0, int M) {
  const int lane = threadIdx.x % kWarp, gi = lane >> 2, t = lane & 3;
  const bf16* r0 = m0 + gi < M ? row_ptr(m0 + gi) : nullptr;
  const bf16* r1 = m0 + gi + 8 < M ? row_ptr(m0 + gi + 8) : nullptr;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const int d = 16 * kk + 2 * t;
    a[kk].reg[0] = r0 ? load_b32(r0 + d) : 0u;
    a[kk].reg[1] = r1 ? load_b32(r1 + d) : 0u;
    a[kk].reg[2] = r0 ? load_b32(r0 + d + 8) : 0u;
    a[kk].reg[3] = r1 ? load_b32(r1 + d + 8) : 0u;
  }
}

// c (=) A · tileᵀ: 16 rows × NC tile rows (NC a multiple of 16), summed over D.
template <int D, int NC>
__device__ void mma_a_tile_t(MmaFragC (&c)[NC / 8], const MmaFragA (&a)[D / 16], SwizzledTile<D> tile) {
  const int lane = threadIdx.x % kWarp, mi = lane >> 3, i = lane & 7;
#pragma unroll
  for (int n = 0; n < NC / 8; ++n)
    for (int e = 0; e < 4; ++e) c[n].reg[e] = 0.0f;
#pragma unroll
  for (int n = 0; n < NC / 8; n += 2)
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t r[4];  // matrices: (tile rows 8n.., dims 16kk..), (8n.., 16kk+8..), (8n+8.., 16kk..), (8n+8.., 16kk+8..)
      ldmatrix_x4(r, tile.chunk(8 * n + (mi >> 1) * 8 + i, 2 * kk + (mi & 1)));
      const MmaFragB b0{{r[0], r[1]}}, b1{{r[2], r[3]}};
      mma_m16n8k16_bf16(c[n], a[kk], b0, c[n]);
      mma_m16n8k16_bf16(c[n + 1], a[kk], b1, c[n + 1]);
    }
}

// acc (+=) P · tile: P is 16 rows × NK in C fragments (rounded to bf16 here), the tile NK rows × D.
template <int D, int NK>
__device__ void mma_p_tile(MmaFragC (&acc)[D / 8], const MmaFragC (&p)[NK / 8], SwizzledTile<D> tile) {
  const int lane = threadIdx.x % kWarp, mi = lane >> 3, i = lane & 7;
#pragma unroll
  for (int ks = 0; ks < NK / 16; ++ks) {
    MmaFragA a;
    a.reg[0] = pack_bf16x2_rn(p[2 * ks].reg[0], p[2 * ks].reg[1]);
    a.reg[1] = pack_bf16x2_rn(p[2 * ks].reg[2], p[2 * ks].reg[3]);
    a.reg[2] = pack_bf16x2_rn(p[2 * ks + 1].reg[0], p[2 * ks + 1].reg[1]);
    a.reg[3] = pack_bf16x2_rn(p[2 * ks + 1].reg[2], p[2 * ks + 1].reg[3]);
#pragma unroll
    for (int dn = 0; dn < D / 8; dn += 2) {
      uint32_t r[4];  // matrices: (rows 16ks.., dims 8dn..), (16ks+8.., 8dn..), (16ks.., 8dn+8..), (16ks+8.., 8dn+8..)
      ldmatrix_x4_trans(r, tile.chunk(16 * ks + (mi & 1) * 8 + i, dn + (mi >> 1)));
      const MmaFragB b0{{r[0], r[1]}}, b1{{r[2], r[3]}};
      mma_m16n8k16_bf16(acc[dn], a, b0, acc[dn]);
      mma_m16n8k16_bf16(acc[dn + 1], a, b1, acc[dn + 1]);
    }
  }
}

// The fragment element (n-tile n, register e) of a lane: its row in the warp's 16 and its column in the tile.
__device__ __forceinline__ int frag_row(int e) { return ((threadIdx.x % kWarp) >> 2) + (e >> 1) * 8; }
__device__ __forceinline__ int frag_col(int n, int e) { return 8 * n + ((threadIdx.x % kWarp) & 3) * 2 + (e & 1); }

// Visibility of one key to query row j of a block anchored at `anchor` (kernels/attention_shape.h).
__device__ __forceinline__ bool sees_ctx(const DFlashAttentionShape& s, int anchor, int hi, int c, int j) {
  if (c >= hi) return false;
  return s.window <= 0 || c >= anchor + j - (s.window - 1);
}
__device__ __forceinline__ bool sees_blk(const DFlashAttentionShape& s, int i, int j) {
  return i < s.block && (s.window <= 0 || i <= j);
}

// The keys one anchor block streams: context tiles over [ctx_lo, ctx_hi), then block-key tiles over [0, block).
struct BlockKeys {
  int anchor, ctx_lo, ctx_hi, lo_last;  // lo_last: the last row's window start (every row sees keys ≥ it)
  int n_ctx_tiles, n_tiles;
};

__device__ BlockKeys block_keys(const DFlashAttentionShape& s, int anchor, int BC) {
  BlockKeys k;
  k.anchor = anchor;
  int hi;
  dflash_ctx_range(s, anchor, 0, k.ctx_lo, hi);
  dflash_ctx_range(s, anchor, s.block - 1, k.lo_last, hi);
  k.ctx_hi = hi;
  k.n_ctx_tiles = (k.ctx_hi - k.ctx_lo + BC - 1) / BC;
  k.n_tiles = k.n_ctx_tiles + (s.block + BC - 1) / BC;
  return k;
}

struct KeyTile {
  bool ctx;
  int start, n;  // context row (ctx) or in-block index of the tile's first key; its valid keys
  bool masked;   // some (row, key) pair of the tile is not visible
};

__device__ KeyTile key_tile(const DFlashAttentionShape& s, const BlockKeys& k, int t, int BC) {
  KeyTile kt;
  kt.ctx = t < k.n_ctx_tiles;
  if (kt.ctx) {
    kt.start = k.ctx_lo + t * BC;
    kt.n = min(BC, k.ctx_hi - kt.start);
    kt.masked = kt.n < BC || (s.window > 0 && kt.start < k.lo_last);
  } else {
    kt.start = (t - k.n_ctx_tiles) * BC;
    kt.n = min(BC, s.block - kt.start);
    kt.masked = kt.n < BC || s.window > 0;
  }
  return kt;
}

// Pointers of one query-tile row m (= j·G + hh) of anchor block b, kv head g, into a [NB, NH, D] tensor.
struct QueryRows {
  int b, g, G, block, heads, D;
  __device__ size_t offset(int m) const {
    return (size_t(b * block + m / G) * heads + size_t(g) * G + m % G) * size_t(D);
  }
  __device__ size_t stat(int m) const { return size_t(b * block + m / G) * heads + size_t(g) * G + m % G; }
};

// The query tile and key stream of one thread block, for the forward kernel below (FwdTiles: the DFlash mask;
// CausalTiles: the target's causal attention over a cache). Each gives: M (rows in the query tile), the offset of
// row m in q/out and its lse index, n_tiles and tile(t) (its K/V rows and whether it needs a mask),
// visible(tile, key column, m), and partial(m) (where a split-K block leaves row m; null o when not split).
struct TileRows {
  const bf16 *k, *v;  // the tile's first K and V rows
  size_t stride;      // elements between consecutive rows
  KeyTile kt;
};

struct DFlashFwdParams {
  const bf16 *k_ctx, *v_ctx, *k_blk, *v_blk;
  const int32_t* anchors;
  DFlashAttentionShape s;
  int rows_per_block;  // query rows (block · G in all) a thread block takes: a slice of them per blockIdx.z when the
                       // whole tile needs more warps than the kernel's registers allow a block on this device
};

// blockIdx.x → work item, longest first (the comment at the top): x = 0 takes the last of n items.
__device__ __forceinline__ int longest_first(int x, int n) { return n - 1 - x; }

// One query row's split-K partial in scratch: unnormalised output [D] and (row max, row sum) in log2 units.
struct PartialRow {
  float *o, *ml;  // null o: the block is not split, it writes out (and lse) itself
};

template <int BC>
struct DFlashTiles {
  DFlashFwdParams p;
  int b, g, G, m_base, M;  // rows [m_base, m_base + M) of the block's block · G
  QueryRows rows;
  BlockKeys keys;
  __device__ DFlashTiles(const DFlashFwdParams& params, int bx, int by, int bz)
      : p(params), b(longest_first(bx, params.s.n_blocks)), g(by), G(params.s.heads / params.s.kv_heads),
        m_base(bz * params.rows_per_block), M(min(params.rows_per_block, params.s.block * G - m_base)),
        rows{b, by, G, params.s.block, params.s.heads, params.s.head_dim},
        keys(block_keys(params.s, params.anchors[b], BC)) {}
  __device__ int n_tiles() const { return keys.n_tiles; }
  __device__ size_t q_offset(int m) const { return rows.offset(m_base + m); }
  __device__ size_t stat(int m) const { return rows.stat(m_base + m); }
  __device__ PartialRow partial(int) const { return {nullptr, nullptr}; }
  __device__ TileRows tile(int t) const {
    const KeyTile kt = key_tile(p.s, keys, t, BC);
    const size_t stride = size_t(p.s.kv_heads) * p.s.head_dim;
    const size_t row = kt.ctx ? size_t(kt.start) : size_t(b) * p.s.block + kt.start;
    const size_t off = row * stride + size_t(g) * p.s.head_dim;
    return {(kt.ctx ? p.k_ctx : p.k_blk) + off, (kt.ctx ? p.v_ctx : p.v_blk) + off, stride, kt};
  }
  __device__ bool visible(const KeyTile& kt, int col, int m) const {
    const int key = kt.start + col, j = (m_base + m) / G;
    return col < kt.n && (kt.ctx ? sees_ctx(p.s, keys.anchor, keys.ctx_hi, key, j) : sees_blk(p.s, key, j));
  }
};

// Causal attention of the target over a cache: query row i (position past + i) sees keys 0 .. past + i of
// k, v [past + n, KVH, D]. A thread block takes R consecutive query rows × the G query heads of kv head g, and of
// their key tiles those of split z: [z · tiles_per_split, (z + 1) · tiles_per_split) (all of them unsplit). A split
// past the block's last key tile has no tiles: its rows write max −∞, sum 0, output 0 (the merge weighs them 0).
struct CausalParams {
  const bf16 *k, *v;
  int n, past, heads, kv_heads, head_dim, R;
  int tiles_per_split;      // key tiles per split (splits = gridDim.z)
  float *part_o, *part_ml;  // [splits, n, heads, D] and [splits, n, heads, 2]; null: one split, no scratch
};

template <int BC>
struct CausalTiles {
  CausalParams p;
  int i0, g, G, M, n_keys, z, first_tile;
  __device__ CausalTiles(const CausalParams& params, int bx, int by, int bz)
      : p(params), i0(longest_first(bx, (params.n + params.R - 1) / params.R) * params.R), g(by),
        G(params.heads / params.kv_heads), M(min(params.R, params.n - i0) * G),
        n_keys(params.past + min(params.R, params.n - i0) + i0), z(bz), first_tile(bz * params.tiles_per_split) {}
  __device__ int n_tiles() const { return max(0, min(p.tiles_per_split, (n_keys + BC - 1) / BC - first_tile)); }
  __device__ size_t q_offset(int m) const {
    return (size_t(i0 + m / G) * p.heads + size_t(g) * G + m % G) * size_t(p.head_dim);
  }
  __device__ size_t stat(int m) const { return 0; }
  __device__ PartialRow partial(int m) const {
    if (!p.part_o) return {nullptr, nullptr};
    const size_t r = (size_t(z) * p.n + i0 + m / G) * p.heads + size_t(g) * G + m % G;
    return {p.part_o + r * p.head_dim, p.part_ml + 2 * r};
  }
  __device__ TileRows tile(int t) const {
    t += first_tile;
    KeyTile kt;
    kt.ctx = true;
    kt.start = t * BC;
    kt.n = min(BC, n_keys - kt.start);
    kt.masked = kt.start + BC > p.past + i0 + 1;  // the first row sees keys < past + i0 + 1
    const size_t stride = size_t(p.kv_heads) * p.head_dim;
    const size_t off = size_t(kt.start) * stride + size_t(g) * p.head_dim;
    return {p.k + off, p.v + off, stride, kt};
  }
  __device__ bool visible(const KeyTile& kt, int col, int m) const {
    return col < kt.n && kt.start + col <= p.past + i0 + m / G;
  }
};

template <int D, int BC>
__device__ void load_tile(SwizzledTile<D> k_s, SwizzledTile<D> v_s, const TileRows& tr) {
  load_rows_async<D>(k_s, tr.k, tr.stride, tr.kt.n, BC);
  load_rows_async<D>(v_s, tr.v, tr.stride, tr.kt.n, BC);
}

// out (=) softmax(q kᵀ / √D) v over each row's visible keys; lse (=) when not null.
template <int D, int BC, template <int> class Tiles, typename Params>
__global__ void flash_forward_tc_kernel(bf16* out, float* lse, const bf16* q, Params params) {
  DFLASH_DYNAMIC_SHARED(uint4, flash_fwd_smem);
  bf16* smem = reinterpret_cast<bf16*>(flash_fwd_smem);
  const SwizzledTile<D> k_s[2] = {{smem}, {smem + BC * D}}, v_s[2] = {{smem + 2 * BC * D}, {smem + 3 * BC * D}};
  const Tiles<BC> tiles(params, blockIdx.x, blockIdx.y, blockIdx.z);
  const int M = tiles.M, n_tiles = tiles.n_tiles();
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, m0 = warp * 16;

  TileRows cur{};  // the tile in use; the next one is found once, when it is prefetched
  if (n_tiles > 0) {
    cur = tiles.tile(0);
    load_tile<D, BC>(k_s[0], v_s[0], cur);
  }
  cp_async_commit_group();
  MmaFragA qa[D / 16];
  load_a_rows<D>(qa, [&](int m) { return q + tiles.q_offset(m); }, m0, M);

  const float scale_log2 = kLog2e / sqrtf(float(D));
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};  // log2 units; row_sum lane-partial
  MmaFragC o[D / 8];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
    for (int e = 0; e < 4; ++e) o[n].reg[e] = 0.0f;

  for (int t = 0; t < n_tiles; ++t) {
    const int stage = t & 1;
    TileRows next = cur;
    if (t + 1 < n_tiles) {
      next = tiles.tile(t + 1);
      load_tile<D, BC>(k_s[stage ^ 1], v_s[stage ^ 1], next);
    }
    cp_async_commit_group();
    cp_async_wait_group<1>();  // tile t has landed (this thread's copies), then everyone's
    __syncthreads();

    MmaFragC sc[BC / 8];
    mma_a_tile_t<D, BC>(sc, qa, k_s[stage]);
#pragma unroll
    for (int n = 0; n < BC / 8; ++n)
      for (int e = 0; e < 4; ++e) sc[n].reg[e] *= scale_log2;
    const KeyTile kt = cur.kt;
    if (kt.masked) {
#pragma unroll
      for (int n = 0; n < BC / 8; ++n)
        for (int e = 0; e < 4; ++e)
          if (!tiles.visible(kt, frag_col(n, e), m0 + frag_row(e))) sc[n].reg[e] = -INFINITY;
    }

    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < BC / 8; ++n)
      for (int e = 0; e < 4; ++e) tile_max[e >> 1] = fmaxf(tile_max[e >> 1], sc[n].reg[e]);
    float alpha[2], m_use[2];
    for (int r = 0; r < 2; ++r) {
      // the 4 lanes of a quad hold the same two rows
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float m_new = fmaxf(row_max[r], tile_max[r]);
      m_use[r] = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing visible yet: exp2(−∞ − 0) = 0, no NaN
      alpha[r] = exp2f(row_max[r] - m_use[r]);
      row_max[r] = m_new;
      row_sum[r] *= alpha[r];
    }
#pragma unroll
    for (int n = 0; n < BC / 8; ++n)
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(sc[n].reg[e] - m_use[e >> 1]);
        sc[n].reg[e] = p;
        row_sum[e >> 1] += p;
      }
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      for (int e = 0; e < 4; ++e) o[n].reg[e] *= alpha[e >> 1];
    mma_p_tile<D, BC>(o, sc, v_s[stage]);
    __syncthreads();  // every warp is done with this stage before tile t + 2 overwrites it
    cur = next;
  }
  cp_async_wait_all();

  for (int r = 0; r < 2; ++r) {
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
  }
#pragma unroll  // o[n].reg[2 r] must be a constant index: o stays in registers
  for (int r = 0; r < 2; ++r) {
    const int m = m0 + (lane >> 2) + 8 * r;
    if (m >= M) continue;
    const PartialRow part = tiles.partial(m);
    if (part.o) {  // a split: unnormalised, in fp32, with its (max, sum) for the merge
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
        *reinterpret_cast<float2*>(part.o + frag_col(n, 2 * r)) = make_float2(o[n].reg[2 * r], o[n].reg[2 * r + 1]);
      if ((lane & 3) == 0) {
        part.ml[0] = row_max[r];
        part.ml[1] = row_sum[r];
      }
      continue;
    }
    const float inv_l = 1.0f / row_sum[r];
    bf16* dst = out + tiles.q_offset(m);
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      *reinterpret_cast<uint32_t*>(dst + frag_col(n, 2 * r)) =
          pack_bf16x2_rn(o[n].reg[2 * r] * inv_l, o[n].reg[2 * r + 1] * inv_l);
    if (lse && (lane & 3) == 0) lse[tiles.stat(m)] = (row_max[r] + log2f(row_sum[r])) * kLn2;
  }
}

// Split-K merge, one warp per (query row, head) r of `rows` (split_merge.cuh; maxima in base 2 here).
template <int D>
__global__ void attention_split_merge_kernel(bf16* out, const float* part_o, const float* part_ml, int rows,
                                             int splits) {
  const int r = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (r >= rows) return;
  merge_split_row<ExpBase::two, D / kWarp>(part_o, part_ml, rows, r, D, splits, [&](int d, float v) {
    out[size_t(r) * D + d] = __float2bfloat16_rn(v);
  });
}

// delta = rowsum(dO ⊙ O), one warp per (query row, head).
__global__ void dflash_delta_kernel(float* delta, const bf16* dout, const bf16* out, long long n_queries, int D) {
  const long long w = (long long)blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (w >= n_queries) return;
  const size_t off = size_t(w) * D;
  float part = 0;
  for (int d = threadIdx.x % kWarp; d < D; d += kWarp) part += to_f(dout[off + d]) * to_f(out[off + d]);
  const float total = warp_sum(part);
  if (threadIdx.x % kWarp == 0) delta[w] = total;
}

template <int D, int BC>
__global__ void dflash_backward_dq_tc_kernel(bf16* dq, const bf16* dout, const float* lse, const float* delta,
                                             const bf16* q, DFlashFwdParams params) {
  DFLASH_DYNAMIC_SHARED(uint4, dflash_dq_smem);
  bf16* smem = reinterpret_cast<bf16*>(dflash_dq_smem);
  const SwizzledTile<D> k_s[2] = {{smem}, {smem + BC * D}}, v_s[2] = {{smem + 2 * BC * D}, {smem + 3 * BC * D}};
  const DFlashTiles<BC> tiles(params, blockIdx.x, blockIdx.y, blockIdx.z);
  const int M = tiles.M, n_tiles = tiles.n_tiles();
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, m0 = warp * 16;

  TileRows cur = tiles.tile(0);  // the tile in use; the next one is found once, when it is prefetched
  load_tile<D, BC>(k_s[0], v_s[0], cur);
  cp_async_commit_group();
  MmaFragA qa[D / 16], da[D / 16];
  load_a_rows<D>(qa, [&](int m) { return q + tiles.q_offset(m); }, m0, M);
  load_a_rows<D>(da, [&](int m) { return dout + tiles.q_offset(m); }, m0, M);
  float lse2[2], dl[2];  // this lane's two rows (rows ≥ M: lse = +∞, so that P = 0 there)
  for (int r = 0; r < 2; ++r) {
    const int m = m0 + (lane >> 2) + 8 * r;
    lse2[r] = m < M ? lse[tiles.stat(m)] * kLog2e : INFINITY;
    dl[r] = m < M ? delta[tiles.stat(m)] : 0.0f;
  }

  const float scale = 1.0f / sqrtf(float(D)), scale_log2 = kLog2e * scale;
  MmaFragC acc[D / 8];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
    for (int e = 0; e < 4; ++e) acc[n].reg[e] = 0.0f;

  for (int t = 0; t < n_tiles; ++t) {
    const int stage = t & 1;
    TileRows next = cur;
    if (t + 1 < n_tiles) {
      next = tiles.tile(t + 1);
      load_tile<D, BC>(k_s[stage ^ 1], v_s[stage ^ 1], next);
    }
    cp_async_commit_group();
    cp_async_wait_group<1>();
    __syncthreads();

    MmaFragC p[BC / 8], ds[BC / 8];
    mma_a_tile_t<D, BC>(p, qa, k_s[stage]);
#pragma unroll
    for (int n = 0; n < BC / 8; ++n)
      for (int e = 0; e < 4; ++e) p[n].reg[e] = exp2f(p[n].reg[e] * scale_log2 - lse2[e >> 1]);
    const KeyTile kt = cur.kt;
    if (kt.masked) {
#pragma unroll
      for (int n = 0; n < BC / 8; ++n)
        for (int e = 0; e < 4; ++e)
          if (!tiles.visible(kt, frag_col(n, e), m0 + frag_row(e))) p[n].reg[e] = 0.0f;
    }
    mma_a_tile_t<D, BC>(ds, da, v_s[stage]);  // dP = dO Vᵀ
#pragma unroll
    for (int n = 0; n < BC / 8; ++n)
      for (int e = 0; e < 4; ++e)
        ds[n].reg[e] = cuda_math::attention_dscore(p[n].reg[e], ds[n].reg[e], dl[e >> 1]);
    mma_p_tile<D, BC>(acc, ds, k_s[stage]);  // dQ += dS K
    __syncthreads();
    cur = next;
  }
  cp_async_wait_all();

  for (int r = 0; r < 2; ++r) {
    const int m = m0 + (lane >> 2) + 8 * r;
    if (m >= M) continue;
    bf16* dst = dq + tiles.q_offset(m);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      uint32_t* cell = reinterpret_cast<uint32_t*>(dst + frag_col(n, 2 * r));
      const uint32_t old = *cell;
      *cell = pack_bf16x2_rn(__bfloat162float(bf16x2_lo(old)) + scale * acc[n].reg[2 * r],
                             __bfloat162float(bf16x2_hi(old)) + scale * acc[n].reg[2 * r + 1]);
    }
  }
}

// One key tile of the dK/dV pass: kKeyTileKV keys, either context rows [start, start + n) or block keys
// [start, start + n) of block `b`.
struct KvTile {
  bool ctx;
  int b, start, n;
};

__device__ KvTile kv_tile(const DFlashAttentionShape& s, int x) {
  const int n_ctx_tiles = (s.ctx_len + kKeyTileKV - 1) / kKeyTileKV;
  const int per_block = (s.block + kKeyTileKV - 1) / kKeyTileKV;
  KvTile t;
  t.ctx = x < n_ctx_tiles;
  if (t.ctx) {
    t.b = -1;
    t.start = x * kKeyTileKV;
    t.n = min(kKeyTileKV, s.ctx_len - t.start);
  } else {
    t.b = (x - n_ctx_tiles) / per_block;
    t.start = ((x - n_ctx_tiles) % per_block) * kKeyTileKV;
    t.n = min(kKeyTileKV, s.block - t.start);
  }
  return t;
}

// Whether any row of anchor block b sees a key of a context tile.
__device__ bool block_sees_ctx_tile(const DFlashAttentionShape& s, int anchor, const KvTile& t) {
  int lo, hi;
  dflash_ctx_range(s, anchor, 0, lo, hi);
  return t.start < hi && lo < t.start + t.n;
}

// The (block, query chunk) steps of one dK/dV thread block, in order; b = n_blocks ends.
struct KvStep {
  int b, chunk;
};

__device__ KvStep first_kv_step(const DFlashAttentionShape& s, const int32_t* anchors, const KvTile& t) {
  if (!t.ctx) return {t.b, 0};
  int b = 0;
  while (b < s.n_blocks && !block_sees_ctx_tile(s, anchors[b], t)) ++b;
  return {b, 0};
}

__device__ KvStep next_kv_step(const DFlashAttentionShape& s, const int32_t* anchors, const KvTile& t, KvStep st,
                               int n_chunks) {
  if (++st.chunk < n_chunks) return st;
  if (!t.ctx) return {s.n_blocks, 0};
  int b = st.b + 1;
  while (b < s.n_blocks && !block_sees_ctx_tile(s, anchors[b], t)) ++b;
  return {b, 0};
}

template <int D>
struct ChunkStage {  // one query chunk in shared memory
  SwizzledTile<D> q, dout;
  float *lse2, *delta;
};

template <int D>
__device__ void load_query_chunk(const ChunkStage<D>& cs, const DFlashAttentionShape& s, KvStep st, int g,
                                 const bf16* q, const bf16* dout, const float* lse, const float* delta) {
  const int G = s.heads / s.kv_heads, M = s.block * G, m_first = st.chunk * kQueryChunk;
  const int n = min(kQueryChunk, M - m_first);
  const QueryRows rows{st.b, g, G, s.block, s.heads, D};
  // rows m_first .. m_first + n: runs of G heads at stride D within a row j, then the next row's: one source row
  // per query row, so load row by row.
  constexpr int kChunks = D / 8;
  for (int i = threadIdx.x; i < kQueryChunk * kChunks; i += blockDim.x) {
    const int r = i / kChunks, c = i % kChunks;
    bf16* q_dst = cs.q.chunk(r, c);
    bf16* do_dst = cs.dout.chunk(r, c);
    if (r < n) {
      const size_t off = rows.offset(m_first + r) + size_t(c) * 8;
      cp_async_cg(q_dst, q + off);
      cp_async_cg(do_dst, dout + off);
    } else {
      *reinterpret_cast<uint4*>(q_dst) = make_uint4(0u, 0u, 0u, 0u);
      *reinterpret_cast<uint4*>(do_dst) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
  for (int r = threadIdx.x; r < kQueryChunk; r += blockDim.x) {
    cs.lse2[r] = r < n ? lse[rows.stat(m_first + r)] * kLog2e : INFINITY;  // padded queries: P = 0
    cs.delta[r] = r < n ? delta[rows.stat(m_first + r)] : 0.0f;
  }
}

template <int D>
__global__ void dflash_backward_dkv_tc_kernel(bf16* dk_ctx, bf16* dv_ctx, bf16* dk_blk, bf16* dv_blk,
                                              const bf16* dout, const float* lse, const float* delta, const bf16* q,
                                              const bf16* k_ctx, const bf16* v_ctx, const bf16* k_blk,
                                              const bf16* v_blk, const int32_t* anchors, DFlashAttentionShape s) {
  DFLASH_DYNAMIC_SHARED(uint4, dflash_dkv_smem);
  bf16* smem = reinterpret_cast<bf16*>(dflash_dkv_smem);
  constexpr int QC = kQueryChunk;
  float* stats = reinterpret_cast<float*>(smem + 4 * QC * D);
  const ChunkStage<D> stage_s[2] = {{{smem}, {smem + QC * D}, stats, stats + QC},
                                    {{smem + 2 * QC * D}, {smem + 3 * QC * D}, stats + 2 * QC, stats + 3 * QC}};
  const KvTile tile = kv_tile(s, blockIdx.x);
  const int g = blockIdx.y, G = s.heads / s.kv_heads, M = s.block * G, n_chunks = (M + QC - 1) / QC;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, k0 = warp * 16;
  const size_t kv_stride = size_t(s.kv_heads) * D;
  const size_t first_row = tile.ctx ? size_t(tile.start) : size_t(tile.b) * s.block + tile.start;
  const bf16* k_src = (tile.ctx ? k_ctx : k_blk) + first_row * kv_stride + size_t(g) * D;
  const bf16* v_src = (tile.ctx ? v_ctx : v_blk) + first_row * kv_stride + size_t(g) * D;

  KvStep st = first_kv_step(s, anchors, tile);
  if (st.b < s.n_blocks) load_query_chunk<D>(stage_s[0], s, st, g, q, dout, lse, delta);
  cp_async_commit_group();
  MmaFragA ka[D / 16], va[D / 16];
  load_a_rows<D>(ka, [&](int r) { return k_src + size_t(r) * kv_stride; }, k0, tile.n);
  load_a_rows<D>(va, [&](int r) { return v_src + size_t(r) * kv_stride; }, k0, tile.n);

  const float scale = 1.0f / sqrtf(float(D)), scale_log2 = kLog2e * scale;
  MmaFragC dk[D / 8], dv[D / 8];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
    for (int e = 0; e < 4; ++e) dk[n].reg[e] = dv[n].reg[e] = 0.0f;

  for (int step = 0; st.b < s.n_blocks; ++step) {
    const ChunkStage<D>& cur = stage_s[step & 1];
    const KvStep next = next_kv_step(s, anchors, tile, st, n_chunks);
    if (next.b < s.n_blocks) load_query_chunk<D>(stage_s[(step & 1) ^ 1], s, next, g, q, dout, lse, delta);
    cp_async_commit_group();
    cp_async_wait_group<1>();
    __syncthreads();

    // this warp's 16 keys × the chunk's QC queries
    MmaFragC p[QC / 8], ds[QC / 8];
    mma_a_tile_t<D, QC>(p, ka, cur.q);
#pragma unroll
    for (int n = 0; n < QC / 8; ++n)
      for (int e = 0; e < 4; ++e) p[n].reg[e] = exp2f(p[n].reg[e] * scale_log2 - cur.lse2[frag_col(n, e)]);
    const int anchor = anchors[st.b];
    int lo0, hi;
    dflash_ctx_range(s, anchor, 0, lo0, hi);
    // padded keys (≥ tile.n) are never stored; padded queries have P = 0: only visibility needs a mask
    if (s.window > 0 || (tile.ctx && tile.start + tile.n > hi)) {
#pragma unroll
      for (int n = 0; n < QC / 8; ++n)
        for (int e = 0; e < 4; ++e) {
          const int key = tile.start + k0 + frag_row(e), j = (st.chunk * QC + frag_col(n, e)) / G;
          if (!(tile.ctx ? sees_ctx(s, anchor, hi, key, j) : sees_blk(s, key, j))) p[n].reg[e] = 0.0f;
        }
    }
    mma_a_tile_t<D, QC>(ds, va, cur.dout);  // dPᵀ = V dOᵀ
#pragma unroll
    for (int n = 0; n < QC / 8; ++n)
      for (int e = 0; e < 4; ++e)
        ds[n].reg[e] = cuda_math::attention_dscore(p[n].reg[e], ds[n].reg[e], cur.delta[frag_col(n, e)]);
    mma_p_tile<D, QC>(dv, p, cur.dout);  // dV += Pᵀ dO
    mma_p_tile<D, QC>(dk, ds, cur.q);    // dK += dSᵀ Q
    __syncthreads();
    st = next;
  }
  cp_async_wait_all();

  bf16* dk_dst = (tile.ctx ? dk_ctx : dk_blk) + first_row * kv_stride + size_t(g) * D;
  bf16* dv_dst = (tile.ctx ? dv_ctx : dv_blk) + first_row * kv_stride + size_t(g) * D;
  for (int r = 0; r < 2; ++r) {
    const int key = k0 + (lane >> 2) + 8 * r;
    if (key >= tile.n) continue;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      const size_t off = size_t(key) * kv_stride + frag_col(n, 2 * r);
      uint32_t* kc = reinterpret_cast<uint32_t*>(dk_dst + off);
      uint32_t* vc = reinterpret_cast<uint32_t*>(dv_dst + off);
      const uint32_t ko = *kc, vo = *vc;
      *kc = pack_bf16x2_rn(__bfloat162float(bf16x2_lo(ko)) + scale * dk[n].reg[2 * r],
                           __bfloat162float(bf16x2_hi(ko)) + scale * dk[n].reg[2 * r + 1]);
      *vc = pack_bf16x2_rn(__bfloat162float(bf16x2_lo(vo)) + dv[n].reg[2 * r],
                           __bfloat162float(bf16x2_hi(vo)) + dv[n].reg[2 * r + 1]);
    }
  }
}

constexpr int key_tile_for(int D) { return D > 128 ? 32 : 64; }

size_t key_stream_smem(int D) { return size_t(4) * key_tile_for(D) * D * sizeof(bf16); }  // K, V × 2 stages
size_t query_chunk_smem(int D) { return size_t(4) * kQueryChunk * D * sizeof(bf16) + 4 * kQueryChunk * sizeof(float); }


bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// How an anchor block's query tile (block · G rows, 16 a warp) is cut into thread blocks: as few slices as the
// kernel's registers allow on this device (its maxThreadsPerBlock: 8 warps at 255 registers), the warps spread
// evenly over them. One slice (the whole tile a block) wherever it fits: B 16 × G 4, or B 32 × G 4 at head_dim 128.
struct RowSlices {
  int slices, warps;  // grid.z, warps a block
};
RowSlices row_slices(int rows, const cudaFuncAttributes& kernel) {
  const int need = (rows + 15) / 16, most = std::max(1, kernel.maxThreadsPerBlock / kWarp);
  const int slices = (need + most - 1) / most;
  return {slices, (need + slices - 1) / slices};
}

template <int D>
void forward_tc(cudaStream_t st, bf16* out, float* lse, const bf16* q, const bf16* k_ctx, const bf16* v_ctx,
                const bf16* k_blk, const bf16* v_blk, const int32_t* anchors, const DFlashAttentionShape& s) {
  constexpr int BC = key_tile_for(D);
  constexpr auto kernel = flash_forward_tc_kernel<D, BC, DFlashTiles, DFlashFwdParams>;
  const RowSlices cut =
      row_slices(s.block * (s.heads / s.kv_heads), kernel_attributes<kernel>("dflash_attention_forward"));
  const size_t smem = key_stream_smem(D);
  allow_dynamic_smem<kernel>(smem, "dflash_attention_forward");
  DFLASH_LAUNCH(dim3(unsigned(s.n_blocks), unsigned(s.kv_heads), unsigned(cut.slices)), cut.warps * kWarp, smem, st,
                flash_forward_tc_kernel<D, BC, DFlashTiles, DFlashFwdParams>)(
      out, lse, q, DFlashFwdParams{k_ctx, v_ctx, k_blk, v_blk, anchors, s, cut.warps * 16});
}

// Query rows per causal thread block: about 128 rows of the query tile (R positions × G heads), at most 512, and
// no more positions than there are (a decode step: 1 position, ⌈G / 16⌉ warps, not 8 idle ones).
int causal_rows_per_block(int G, int n) { return std::min(G >= 128 ? 1 : 128 / G, n); }

// The split-K policy (attention_cached_splits): enough thread blocks for about one per SM of an H100/H200 (132),
// each split at least kMinSplitTiles key tiles (so that its K/V streaming, double-buffered, outweighs writing and
// merging its D + 2 floats per row), at most kMaxSplits.
constexpr int kSplitTargetBlocks = 132;
constexpr int kMinSplitTiles = 4;
constexpr int kMaxSplits = 64;

// Key tiles of the longest query tile (its last row sees past + n keys), and the tiles per split for `splits`.
int causal_key_tiles(int n, int past, int D) { return (past + n + key_tile_for(D) - 1) / key_tile_for(D); }
int tiles_per_split(int n, int past, int D, int splits) {
  const int tiles = causal_key_tiles(n, past, D);
  return (tiles + splits - 1) / splits;
}

template <int D>
void causal_tc(cudaStream_t st, bf16* out, const bf16* q, const bf16* k, const bf16* v, int n, int past, int NH,
               int KVH, int splits, float* scratch) {
  constexpr int BC = key_tile_for(D);
  const int G = NH / KVH, R = causal_rows_per_block(G, n);
  const cudaFuncAttributes fa =
      kernel_attributes<flash_forward_tc_kernel<D, BC, CausalTiles, CausalParams>>("attention_causal_forward");
  if ((R * G + 15) / 16 * kWarp > fa.maxThreadsPerBlock) {  // only past G = 128 (R = 1): the tile is one position
    const std::string why = std::to_string(G) + " query heads a kv head need " + std::to_string((R * G + 15) / 16) +
                            " warps; this kernel may have " + std::to_string(fa.maxThreadsPerBlock / kWarp) +
                            " a block on this device (attention_causal_tc_supports refuses this shape)";
    cuda_fail("attention_causal_forward", __FILE__, __LINE__, why.c_str());
  }
  const int warps = (R * G + 15) / 16;
  const size_t smem = key_stream_smem(D);
  allow_dynamic_smem<flash_forward_tc_kernel<D, BC, CausalTiles, CausalParams>>(smem, "attention_causal_forward");
  // splits covering the longest query tile's key tiles with none empty there (e.g. 7 tiles asked in 4: 2 a split)
  const int per_split = tiles_per_split(n, past, D, splits);
  splits = (causal_key_tiles(n, past, D) + per_split - 1) / per_split;
  CausalParams params{k, v, n, past, NH, KVH, D, R, per_split, nullptr, nullptr};
  if (splits > 1) {
    params.part_o = scratch;
    params.part_ml = scratch + size_t(splits) * n * NH * D;
  }
  DFLASH_LAUNCH(dim3(unsigned((n + R - 1) / R), unsigned(KVH), unsigned(splits)), warps * kWarp, smem, st,
                flash_forward_tc_kernel<D, BC, CausalTiles, CausalParams>)(out, nullptr, q, params);
  if (splits == 1) return;
  constexpr int kMergeWarps = 8;
  const int rows = n * NH;
  DFLASH_LAUNCH(unsigned((rows + kMergeWarps - 1) / kMergeWarps), kMergeWarps * kWarp, 0, st,
                attention_split_merge_kernel<D>)(out, params.part_o, params.part_ml, rows, splits);
}

template <int D>
void backward_tc(cudaStream_t st, bf16* dq, bf16* dk_ctx, bf16* dv_ctx, bf16* dk_blk, bf16* dv_blk,
                 const bf16* dout, const bf16* out, const float* lse, const bf16* q, const bf16* k_ctx,
                 const bf16* v_ctx, const bf16* k_blk, const bf16* v_blk, const int32_t* anchors,
                 const DFlashAttentionShape& s, float* delta) {
  constexpr int BC = key_tile_for(D);
  const long long queries = (long long)s.n_blocks * s.block * s.heads;
  constexpr int kDeltaWarps = 8;
  DFLASH_LAUNCH(unsigned((queries + kDeltaWarps - 1) / kDeltaWarps), kDeltaWarps * kWarp, 0, st,
                dflash_delta_kernel)(delta, dout, out, queries, D);
  const RowSlices cut = row_slices(s.block * (s.heads / s.kv_heads),
                                   kernel_attributes<dflash_backward_dq_tc_kernel<D, BC>>("dflash_attention_backward"));
  const size_t smem_q = key_stream_smem(D);
  allow_dynamic_smem<dflash_backward_dq_tc_kernel<D, BC>>(smem_q, "dflash_attention_backward (dQ)");
  DFLASH_LAUNCH(dim3(unsigned(s.n_blocks), unsigned(s.kv_heads), unsigned(cut.slices)), cut.warps * kWarp, smem_q, st,
                dflash_backward_dq_tc_kernel<D, BC>)(
      dq, dout, lse, delta, q, DFlashFwdParams{k_ctx, v_ctx, k_blk, v_blk, anchors, s, cut.warps * 16});
  const int n_kv_tiles = (s.ctx_len + kKeyTileKV - 1) / kKeyTileKV +
                         s.n_blocks * ((s.block + kKeyTileKV - 1) / kKeyTileKV);
  const size_t smem_kv = query_chunk_smem(D);
  allow_dynamic_smem<dflash_backward_dkv_tc_kernel<D>>(smem_kv, "dflash_attention_backward (dK, dV)");
  DFLASH_LAUNCH(dim3(unsigned(n_kv_tiles), unsigned(s.kv_heads)), (kKeyTileKV / 16) * kWarp, smem_kv, st,
                dflash_backward_dkv_tc_kernel<D>)(dk_ctx, dv_ctx, dk_blk, dv_blk, dout, lse, delta, q, k_ctx, v_ctx,
                                                   k_blk, v_blk, anchors, s);
}

}  // namespace

bool dflash_attention_tc_supports(const DFlashAttentionShape& s, std::initializer_list<const void*> tensors) {
  const int D = s.head_dim;
  if (D != 64 && D != 128 && D != 256) return false;
  if (s.kv_heads <= 0 || s.heads % s.kv_heads != 0) return false;
  // any block · G: a query tile wider than one thread block's warps is cut into slices (row_slices)
  if (s.block * (s.heads / s.kv_heads) > kMaxTcWarps * 16) return false;
  for (const void* p : tensors)
    if (p && !aligned16(p)) return false;  // cp.async moves 16-byte chunks
  return true;
}

bool attention_causal_tc_supports(int q_heads, int kv_heads, int head_dim, std::initializer_list<const void*> tensors) {
  if (head_dim != 64 && head_dim != 128 && head_dim != 256) return false;
  // a query tile is R positions × G heads with R·G ≤ 128 (8 warps, what 255 registers a thread allow) but for
  // G > 128, where one position's G heads are the tile
  if (kv_heads <= 0 || q_heads % kv_heads != 0 || q_heads / kv_heads > 128) return false;
  for (const void* p : tensors)
    if (p && !aligned16(p)) return false;
  return true;
}

int attention_cached_splits(int n, int past, int q_heads, int kv_heads, int head_dim) {
  if (n <= 0 || past < 0 || !attention_causal_tc_supports(q_heads, kv_heads, head_dim, {})) return 1;
  const int R = causal_rows_per_block(q_heads / kv_heads, n);
  const long long blocks = (long long)((n + R - 1) / R) * kv_heads;
  const long long by_sms = (kSplitTargetBlocks + blocks - 1) / blocks;  // 1 once the unsplit grid fills the GPU
  const long long by_keys = causal_key_tiles(n, past, head_dim) / kMinSplitTiles;
  const int asked = int(std::max(1LL, std::min({by_sms, by_keys, (long long)kMaxSplits})));
  // as the launcher cuts them: equal whole-tile ranges (33 asked of 256 tiles: 8 a split, 32 splits)
  const int per_split = tiles_per_split(n, past, head_dim, asked);
  return (causal_key_tiles(n, past, head_dim) + per_split - 1) / per_split;
}

size_t attention_cached_split_scratch_floats(int n, int q_heads, int head_dim, int splits) {
  if (splits <= 1 || n <= 0 || q_heads <= 0) return 0;
  return size_t(splits) * size_t(n) * size_t(q_heads) * (size_t(head_dim) + 2);
}

void launch_attention_cached_forward_tc(cudaStream_t st, bf16* out, const bf16* q, const bf16* k, const bf16* v,
                                        int n, int past, int q_heads, int kv_heads, int head_dim, int splits,
                                        float* scratch) {
  if (n <= 0 || q_heads <= 0) return;
  if (splits > 1 && !scratch)
    cuda_fail("launch_attention_cached_forward_tc", __FILE__, __LINE__, "split-K needs its scratch");
  splits = std::max(1, std::min(splits, causal_key_tiles(n, past, head_dim)));
  switch (head_dim) {
    case 64: return causal_tc<64>(st, out, q, k, v, n, past, q_heads, kv_heads, splits, scratch);
    case 128: return causal_tc<128>(st, out, q, k, v, n, past, q_heads, kv_heads, splits, scratch);
    case 256: return causal_tc<256>(st, out, q, k, v, n, past, q_heads, kv_heads, splits, scratch);
    default: cuda_fail("launch_attention_cached_forward_tc", __FILE__, __LINE__, "head_dim must be 64, 128 or 256");
  }
}

void launch_dflash_attention_forward_tc(cudaStream_t st, bf16* out, float* lse, const bf16* q, const bf16* k_ctx,
                                        const bf16* v_ctx, const bf16* k_blk, const bf16* v_blk,
                                        const int32_t* anchors, const DFlashAttentionShape& s) {
  if ((long long)s.n_blocks * s.block * s.heads <= 0) return;
  switch (s.head_dim) {
    case 64: return forward_tc<64>(st, out, lse, q, k_ctx, v_ctx, k_blk, v_blk, anchors, s);
    case 128: return forward_tc<128>(st, out, lse, q, k_ctx, v_ctx, k_blk, v_blk, anchors, s);
    case 256: return forward_tc<256>(st, out, lse, q, k_ctx, v_ctx, k_blk, v_blk, anchors, s);
    default: cuda_fail("launch_dflash_attention_forward_tc", __FILE__, __LINE__, "head_dim must be 64, 128 or 256");
  }
}

void launch_dflash_attention_backward_tc(cudaStream_t st, bf16* dq, bf16* dk_ctx, bf16* dv_ctx, bf16* dk_blk,
                                         bf16* dv_blk, const bf16* dout, const bf16* out, const float* lse,
                                         const bf16* q, const bf16* k_ctx, const bf16* v_ctx, const bf16* k_blk,
                                         const bf16* v_blk, const int32_t* anchors, const DFlashAttentionShape& s,
                                         float* delta) {
  if ((long long)s.n_blocks * s.block * s.heads <= 0) return;
  switch (s.head_dim) {
    case 64:
      return backward_tc<64>(st, dq, dk_ctx, dv_ctx, dk_blk, dv_blk, dout, out, lse, q, k_ctx, v_ctx, k_blk, v_blk,
                             anchors, s, delta);
    case 128:
      return backward_tc<128>(st, dq, dk_ctx, dv_ctx, dk_blk, dv_blk, dout, out, lse, q, k_ctx, v_ctx, k_blk, v_blk,
                              anchors, s, delta);
    case 256:
      return backward_tc<256>(st, dq, dk_ctx, dv_ctx, dk_blk, dv_blk, dout, out, lse, q, k_ctx, v_ctx, k_blk, v_blk,
                              anchors, s, delta);
    default: cuda_fail("launch_dflash_attention_backward_tc", __FILE__, __LINE__, "head_dim must be 64, 128 or 256");
  }
}

}  // namespace dflash::kernels::cuda
