// kernels/cuda/attention_block.cu - ring attention's block on the GPU (the contracts are in
// kernels/ops_decls.h): the T queries of a chunk, from packed qkv (B,T,(NH+2NKV)HS), against the T
// keys and values of another chunk, from packed kv (B,T,2Ckv) = [k heads | v heads] (Ckv =
// NKV*HS), with a causal mask (key j visible to query i iff j <= i) or none. Grouped-query
// attention: query head h reads kv head h / (NH/NKV) in place (NKV = NH: multi-head, GPT-2).
//   attention_block_forward:  out (B,T,C) and lse (B,NH,T) of the block alone.
//   attention_block_backward: given the final out and lse (over every block) and dout, adds the
//     block's share to dq (B,T,C) and dkv (B,T,2Ckv), fp32, with p = exp(s - lse) recomputed from
//     the final lse and D = rowsum(dout * out):  dS = p (dP - D), dP = dout V^T,
//     dq += scale dS K,  dk += scale dS^T Q,  dv += P^T dout.
//
// Packed documents (q_docs, k_docs: the two chunks' document ids, numbered along the whole
// sequence; null: none): key j is visible to query i only if their ids agree (and j <= i when
// causal). A tile whose keys' ids all differ from the block's queries' is skipped whole (the ids
// never decrease, so the first and last of each side decide), so the work falls with the
// documents' lengths; a query row that sees no key of the block gets out = 0, lse = -inf.
//
// Not yet run on a GPU. They run on the CPU emulator in every `make test` (test/emu/README.md):
// test/gpu/test_attention_block.cu compares them with the CPU backend (kernels/cpu/
// attention_block.cpp, itself tested against float64 by test/test_attention_block.py) under two
// thread orders and AddressSanitizer, and ./train_emu trains with cp = 2 through them to within
// 2e-6 of the one-rank CPU run (test/test_gpu_train.py): evidence for the indexing and the
// synchronisation, none for speed or for the real memory model.
//
// Kernels (CUDA cores, fp32 math, any HS <= 128, fp32 or bf16 storage: the exact path, which
// must match the CPU backend to 1e-5 in fp32; the bf16 tensor-core flash kernels of attention.cu
// are not used here). 256 threads as 16 row groups x 16 column threads; thread (ty, tx) owns rows
// 4 ty .. 4 ty + 3 of a 64-row tile and, in a score tile, the columns tx + 16 j, in an output tile
// the head dimensions tx + 16 k. The 16 threads of a row group are one half-warp, so row maxima
// and sums are half-warp shuffles. Tiles live in shared memory as fp32 rows of kMaxD + 1 floats
// (the odd stride puts the 16 rows a half-warp reads in 16 different banks), filled with 16-byte
// loads when HS and the pointers allow it, zero past T and past HS.
//   forward: one block per (64 queries, batch * query head); walks the key tiles (causal: only up
//     to the diagonal) with the online softmax (running max and sum per row), O += P V with P
//     through shared memory; out = O / l, lse = m + log l.
//   backward: Delta = rowsum(dout * out) first (attention_generic's kernel), then two kernels,
//     each the only writer of what it adds to, so no atomics and a deterministic result:
//     dq: one block per (64 queries, batch * query head), walking the key tiles: S, dP, dS,
//     dq += dS K;
//     dk, dv: one block per (64 keys, batch * kv head), walking, for each of the kv head's query
//     heads in turn, the query tiles (causal: from the diagonal on): S^T, dP^T, dV += P^T dO,
//     dK += dS^T Q; the query heads' shares are summed in registers (no atomics).
//     Both recompute S and dP: the price of determinism without atomics.
#include <cmath>
#include <cstdio>
#include <type_traits>

#include "kernels/cuda/attention_generic.cuh"
#include "kernels/cuda/cuda_common.cuh"

namespace ops {
namespace {

constexpr int kThreads = 256;
constexpr int kRows = 64;  // rows a block owns: queries (forward, dq) or keys (dk, dv)
constexpr int kLanes = 16;  // column threads of a row group (a half-warp)

// kMaxD: head sizes up to 64 or up to 128. kInner: the other side's rows per step (keys in the
// forward and dq pass, queries in the dk/dv pass), 16 * kJ, so that a thread holds kJ score
// columns. kCols: head dimensions per thread in an output tile.
template <int kMaxD>
struct Tiles {
  static constexpr int kJ = kMaxD == 64 ? 4 : 2;
  static constexpr int kInner = kLanes * kJ;
  static constexpr int kCols = kMaxD / kLanes;
  static constexpr int kStride = kMaxD + 1;  // floats per row of a q/k/v/dout tile
  static constexpr int kPStride = kInner + 1;  // floats per row of a score tile
  static constexpr int kFwdSmem = ((kRows + 2 * kInner) * kStride + kRows * kPStride) * 4;
  static constexpr int kDqSmem = ((2 * kRows + 2 * kInner) * kStride + kRows * kPStride) * 4;
  static constexpr int kDkDvSmem =
      ((2 * kRows + 2 * kInner) * kStride + 2 * kInner + 2 * kRows * kPStride) * 4;
};

__device__ __forceinline__ int row_group() { return threadIdx.x / kLanes; }
__device__ __forceinline__ int lane16() { return threadIdx.x % kLanes; }

// Max and sum over the 16 threads of a row group (all 32 lanes of the warp take part).
__device__ __forceinline__ float group_max(float x) {
  for (int o = kLanes / 2; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float group_sum(float x) {
  for (int o = kLanes / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// tile[r][d] (stride kMaxD + 1) = src[(row0 + r) * ld + d] for r < kTileRows, d < kMaxD; zero
// where row0 + r >= T or d >= HS. vec: 16-byte loads (HS a multiple of the pack, src aligned).
template <int kTileRows, int kMaxD, typename Elem>
__device__ void load_tile(float* tile, const Elem* src, size_t ld, int row0, int T, int HS,
                          bool vec) {
  constexpr int kStride = kMaxD + 1;
  if (vec) {
    constexpr int P = Pack128<Elem>::size;
    constexpr int kPacks = kMaxD / P;
    for (int i = threadIdx.x; i < kTileRows * kPacks; i += blockDim.x) {
      const int r = i / kPacks, d = (i % kPacks) * P;
      float f[P];
      if (row0 + r < T && d < HS) {
        load_floats<P>(f, src + (size_t)(row0 + r) * ld + d);
      } else {
#pragma unroll
        for (int e = 0; e < P; e++) f[e] = 0.f;
      }
#pragma unroll
      for (int e = 0; e < P; e++) tile[r * kStride + d + e] = f[e];
    }
  } else {
    for (int i = threadIdx.x; i < kTileRows * kMaxD; i += blockDim.x) {
      const int r = i / kMaxD, d = i % kMaxD;
      const bool valid = row0 + r < T && d < HS;
      tile[r * kStride + d] = valid ? to_float(src[(size_t)(row0 + r) * ld + d]) : 0.f;
    }
  }
}

// dst[i] = src[row0 + i] for i < n, 0 past T.
__device__ void load_vector(float* dst, const float* src, int row0, int n, int T) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = row0 + i < T ? src[row0 + i] : 0.f;
}

// acc[i][j] = sum_{d < HS} A[4 ty + i][d] * B[tx + 16 j][d]: a score tile, A and B tiles of
// stride kMaxD + 1.
template <int kMaxD, int kJ>
__device__ __forceinline__ void score_tile(float (&acc)[4][kJ], const float* A, const float* B,
                                           int HS) {
  constexpr int kStride = kMaxD + 1;
  const float* a = A + row_group() * 4 * kStride;
  const float* b = B + lane16() * kStride;
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < kJ; j++) acc[i][j] = 0.f;
#pragma unroll 4
  for (int d = 0; d < HS; d++) {
    float av[4], bv[kJ];
#pragma unroll
    for (int i = 0; i < 4; i++) av[i] = a[i * kStride + d];
#pragma unroll
    for (int j = 0; j < kJ; j++) bv[j] = b[j * kLanes * kStride + d];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
      for (int j = 0; j < kJ; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
  }
}

// acc[i][k] += sum_{j < n} P[4 ty + i][j] * X[j][tx + 16 k]: a score tile (stride kPStride)
// times a q/k/v/dout tile (stride kMaxD + 1), into an output tile.
template <int kMaxD, int kPStride>
__device__ __forceinline__ void accumulate_tile(float (&acc)[4][kMaxD / kLanes], const float* P,
                                                const float* X, int n) {
  constexpr int kStride = kMaxD + 1, kCols = kMaxD / kLanes;
  const float* p = P + row_group() * 4 * kPStride;
  const float* x = X + lane16();
#pragma unroll 2
  for (int j = 0; j < n; j++) {
    float pv[4], xv[kCols];
#pragma unroll
    for (int i = 0; i < 4; i++) pv[i] = p[i * kPStride + j];
#pragma unroll
    for (int k = 0; k < kCols; k++) xv[k] = x[j * kStride + k * kLanes];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
      for (int k = 0; k < kCols; k++) acc[i][k] = fmaf(pv[i], xv[k], acc[i][k]);
  }
}

// The block's mask: causal or not, and the document ids of one sequence's queries and keys
// (null: no document mask).
struct BlockMask {
  bool causal;
  const int* q_docs;
  const int* k_docs;
  // The mask of sequence b (its T ids of each side).
  __device__ BlockMask of_sequence(int b, int T) const {
    if (!q_docs) return *this;
    return {causal, q_docs + (size_t)b * T, k_docs + (size_t)b * T};
  }
  // Key `key` visible to query `query`? Keys and queries past T never are.
  __device__ __forceinline__ bool visible(int query, int key, int T) const {
    return query < T && key < T && (!causal || key <= query) &&
           (!q_docs || q_docs[query] == k_docs[key]);
  }
  // Whether no query of rows [q0, q0 + nq) shares a document with a key of [k0, k0 + nk)
  // (block-uniform: the whole tile is skipped).
  __device__ __forceinline__ bool tile_masked(int q0, int nq, int k0, int nk, int T) const {
    if (!q_docs) return false;
    const int q_last = min(q0 + nq, T) - 1, k_last = min(k0 + nk, T) - 1;
    return k_docs[k_last] < q_docs[q0] || k_docs[k0] > q_docs[q_last];
  }
};

// Where a head lies: q of query head h in the qkv rows [q | k | v] (NH, NKV, NKV heads), k and v
// of kv head g in the kv rows [k | v] (NKV, NKV heads).
struct BlockLayout {
  int NH, NKV, HS;
  __device__ size_t q_ld() const { return (size_t)(NH + 2 * NKV) * HS; }
  __device__ size_t kv_ld() const { return 2 * (size_t)NKV * HS; }
  __device__ int kv_head(int h) const { return h / (NH / NKV); }
  __device__ int v_offset() const { return NKV * HS; }  // v of kv head g, from k of kv head g
};

// --- forward -------------------------------------------------------------------------------------

// Online softmax of one score tile (already scaled and masked to -inf) for the thread's 4 rows:
// updates the running max m and this thread's share of the sum l, rescales o, and writes the
// probabilities exp(s - m) into the shared score tile sP.
template <int kMaxD>
__device__ __forceinline__ void online_softmax(float (&s)[4][Tiles<kMaxD>::kJ],
                                               float (&o)[4][kMaxD / kLanes], float (&m)[4],
                                               float (&l)[4], float* sP) {
  using Cfg = Tiles<kMaxD>;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    float mx = m[i];
#pragma unroll
    for (int j = 0; j < Cfg::kJ; j++) mx = fmaxf(mx, s[i][j]);
    mx = group_max(mx);
    // Key 0 is visible to every row (rows past T included) and lies in the first tile, so mx is
    // finite from then on; the guard keeps a fully masked row at p = 0 instead of NaN.
    const float shift = mx == -INFINITY ? 0.f : mx;
    const float correction = expf(m[i] - shift);  // 0 on the first tile (m = -inf)
    float sum = 0.f;
    float* p_row = sP + (row_group() * 4 + i) * Cfg::kPStride + lane16();
#pragma unroll
    for (int j = 0; j < Cfg::kJ; j++) {
      const float p = expf(s[i][j] - shift);  // -inf -> 0
      p_row[j * kLanes] = p;
      sum += p;
    }
    l[i] = l[i] * correction + sum;
#pragma unroll
    for (int k = 0; k < Cfg::kCols; k++) o[i][k] *= correction;
    m[i] = mx;
  }
}

// grid (ceil(T / kRows), B * NH), kThreads, dynamic smem Tiles::kFwdSmem.
template <typename Elem, int kMaxD>
__global__ void __launch_bounds__(kThreads)
    block_forward_kernel(Elem* __restrict__ out, float* __restrict__ lse,
                         const Elem* __restrict__ qkv, const Elem* __restrict__ kv, int T,
                         BlockLayout lay, BlockMask mask, float scale, bool vec) {
  using Cfg = Tiles<kMaxD>;
  constexpr int kInner = Cfg::kInner, kJ = Cfg::kJ, kCols = Cfg::kCols;
  extern __shared__ float block_smem[];
  float* sQ = block_smem;                   // kRows x kStride
  float* sK = sQ + kRows * Cfg::kStride;    // kInner x kStride
  float* sV = sK + kInner * Cfg::kStride;   // kInner x kStride
  float* sP = sV + kInner * Cfg::kStride;   // kRows x kPStride

  const int m0 = (gridDim.x - 1 - blockIdx.x) * kRows;  // heaviest first when causal
  const int NH = lay.NH, HS = lay.HS;
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int C = NH * HS;
  const BlockMask mk = mask.of_sequence(b, T);
  const Elem* k_src = kv + (size_t)b * T * lay.kv_ld() + lay.kv_head(h) * HS;
  load_tile<kRows, kMaxD>(sQ, qkv + (size_t)b * T * lay.q_ld() + h * HS, lay.q_ld(), m0, T, HS,
                          vec);
  const int key_end = mk.causal ? min(T, m0 + kRows) : T;  // no row of the block sees beyond

  const int row0 = m0 + row_group() * 4;
  float o[4][kCols] = {}, m[4], l[4];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    m[i] = -INFINITY;
    l[i] = 0.f;
  }
  for (int n0 = 0; n0 < key_end; n0 += kInner) {
    if (mk.tile_masked(m0, kRows, n0, kInner, T)) continue;  // another document's keys
    __syncthreads();  // the previous tile's K, V and P are no longer read
    load_tile<kInner, kMaxD>(sK, k_src, lay.kv_ld(), n0, T, HS, vec);
    load_tile<kInner, kMaxD>(sV, k_src + lay.v_offset(), lay.kv_ld(), n0, T, HS, vec);
    __syncthreads();
    float s[4][kJ];
    score_tile<kMaxD, kJ>(s, sQ, sK, HS);
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
      for (int j = 0; j < kJ; j++) {
        const int key = n0 + lane16() + j * kLanes, query = row0 + i;
        // Rows past T keep key 0..T-1 visible (their output is dropped); a row may see no key
        // only with documents.
        const bool seen = key < T && (!mk.causal || key <= query) &&
                          (!mk.q_docs || query >= T || mk.q_docs[query] == mk.k_docs[key]);
        s[i][j] = seen ? s[i][j] * scale : -INFINITY;
      }
    online_softmax<kMaxD>(s, o, m, l, sP);
    __syncthreads();
    accumulate_tile<kMaxD, Cfg::kPStride>(o, sP, sV, min(kInner, T - n0));
  }

  Elem* o_dst = out + (size_t)b * T * C + h * HS;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const float sum = group_sum(l[i]);  // every lane: the shuffles need the whole warp
    const int row = row0 + i;
    if (row >= T) continue;
    const bool empty = sum == 0.f;  // no key of the row's document in this block
    const float inv = empty ? 0.f : 1.f / sum;
#pragma unroll
    for (int k = 0; k < kCols; k++) {
      const int d = lane16() + k * kLanes;
      if (d < HS) o_dst[(size_t)row * C + d] = from_float<Elem>(o[i][k] * inv);
    }
    if (lane16() == 0) lse[(size_t)bh * T + row] = empty ? -INFINITY : m[i] + logf(sum);
  }
}

// --- backward ------------------------------------------------------------------------------------

// grid (ceil(T / kRows), B * NH), kThreads, dynamic smem Tiles::kDqSmem. dq += scale * dS K over
// this block's keys, for 64 queries.
template <typename Elem, int kMaxD>
__global__ void __launch_bounds__(kThreads)
    block_backward_dq_kernel(float* __restrict__ dq, const Elem* __restrict__ dout,
                             const Elem* __restrict__ qkv, const Elem* __restrict__ kv,
                             const float* __restrict__ lse, const float* __restrict__ delta, int T,
                             BlockLayout lay, BlockMask mask, float scale, bool vec) {
  using Cfg = Tiles<kMaxD>;
  constexpr int kInner = Cfg::kInner, kJ = Cfg::kJ, kCols = Cfg::kCols;
  extern __shared__ float block_smem[];
  float* sQ = block_smem;                   // kRows x kStride
  float* sdO = sQ + kRows * Cfg::kStride;   // kRows x kStride
  float* sK = sdO + kRows * Cfg::kStride;   // kInner x kStride
  float* sV = sK + kInner * Cfg::kStride;   // kInner x kStride
  float* sdS = sV + kInner * Cfg::kStride;  // kRows x kPStride

  const int m0 = (gridDim.x - 1 - blockIdx.x) * kRows;  // heaviest first when causal
  const int NH = lay.NH, HS = lay.HS;
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int C = NH * HS;
  const BlockMask mk = mask.of_sequence(b, T);
  const Elem* k_src = kv + (size_t)b * T * lay.kv_ld() + lay.kv_head(h) * HS;
  load_tile<kRows, kMaxD>(sQ, qkv + (size_t)b * T * lay.q_ld() + h * HS, lay.q_ld(), m0, T, HS,
                          vec);
  load_tile<kRows, kMaxD>(sdO, dout + (size_t)b * T * C + h * HS, C, m0, T, HS, vec);
  const int key_end = mk.causal ? min(T, m0 + kRows) : T;

  const int row0 = m0 + row_group() * 4;
  float row_lse[4], row_delta[4];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const bool valid = row0 + i < T;
    row_lse[i] = valid ? lse[(size_t)bh * T + row0 + i] : 0.f;
    row_delta[i] = valid ? delta[(size_t)bh * T + row0 + i] : 0.f;
  }
  float acc[4][kCols] = {};
  for (int n0 = 0; n0 < key_end; n0 += kInner) {
    if (mk.tile_masked(m0, kRows, n0, kInner, T)) continue;  // another document's keys
    __syncthreads();
    load_tile<kInner, kMaxD>(sK, k_src, lay.kv_ld(), n0, T, HS, vec);
    load_tile<kInner, kMaxD>(sV, k_src + lay.v_offset(), lay.kv_ld(), n0, T, HS, vec);
    __syncthreads();
    float s[4][kJ], dp[4][kJ];
    score_tile<kMaxD, kJ>(s, sQ, sK, HS);
    score_tile<kMaxD, kJ>(dp, sdO, sV, HS);  // dP = dO V^T
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
      for (int j = 0; j < kJ; j++) {
        const int key = n0 + lane16() + j * kLanes;
        const float p = mk.visible(row0 + i, key, T) ? expf(s[i][j] * scale - row_lse[i]) : 0.f;
        sdS[(row_group() * 4 + i) * Cfg::kPStride + lane16() + j * kLanes] =
            p * (dp[i][j] - row_delta[i]);
      }
    __syncthreads();
    accumulate_tile<kMaxD, Cfg::kPStride>(acc, sdS, sK, min(kInner, T - n0));
  }

  float* dq_dst = dq + (size_t)b * T * C + h * HS;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    if (row0 + i >= T) continue;
#pragma unroll
    for (int k = 0; k < kCols; k++) {
      const int d = lane16() + k * kLanes;
      if (d < HS) dq_dst[(size_t)(row0 + i) * C + d] += scale * acc[i][k];
    }
  }
}

// grid (ceil(T / kRows), B * NKV), kThreads, dynamic smem Tiles::kDkDvSmem. For 64 keys of one
// kv head: dv += P^T dO and dk += scale * dS^T Q over this block's queries of each of the kv
// head's query heads, in order.
template <typename Elem, int kMaxD>
__global__ void __launch_bounds__(kThreads)
    block_backward_dkdv_kernel(float* __restrict__ dkv, const Elem* __restrict__ dout,
                               const Elem* __restrict__ qkv, const Elem* __restrict__ kv,
                               const float* __restrict__ lse, const float* __restrict__ delta,
                               int T, BlockLayout lay, BlockMask mask, float scale, bool vec) {
  using Cfg = Tiles<kMaxD>;
  constexpr int kInner = Cfg::kInner, kJ = Cfg::kJ, kCols = Cfg::kCols;
  extern __shared__ float block_smem[];
  float* sK = block_smem;                      // kRows x kStride
  float* sV = sK + kRows * Cfg::kStride;       // kRows x kStride
  float* sQ = sV + kRows * Cfg::kStride;       // kInner x kStride
  float* sdO = sQ + kInner * Cfg::kStride;     // kInner x kStride
  float* sLse = sdO + kInner * Cfg::kStride;   // kInner
  float* sDelta = sLse + kInner;               // kInner
  float* sP = sDelta + kInner;                 // kRows x kPStride (P^T: keys x queries)
  float* sdS = sP + kRows * Cfg::kPStride;     // kRows x kPStride (dS^T)

  const int key0 = blockIdx.x * kRows;  // causal: the first blocks see the most queries
  const int NH = lay.NH, HS = lay.HS, group = NH / lay.NKV;
  const int b = blockIdx.y / lay.NKV, kv_head = blockIdx.y % lay.NKV;
  const int C = NH * HS;
  const BlockMask mk = mask.of_sequence(b, T);
  const Elem* k_src = kv + (size_t)b * T * lay.kv_ld() + kv_head * HS;
  load_tile<kRows, kMaxD>(sK, k_src, lay.kv_ld(), key0, T, HS, vec);
  load_tile<kRows, kMaxD>(sV, k_src + lay.v_offset(), lay.kv_ld(), key0, T, HS, vec);
  // Causal: queries before key0 see none of these keys.
  const int query_begin = mk.causal ? key0 / kInner * kInner : 0;

  const int my_key0 = key0 + row_group() * 4;
  float dk[4][kCols] = {}, dv[4][kCols] = {};
  for (int h = kv_head * group; h < (kv_head + 1) * group; h++) {
    const size_t bh = (size_t)b * NH + h;
    const Elem* q_src = qkv + (size_t)b * T * lay.q_ld() + h * HS;
    const Elem* do_src = dout + (size_t)b * T * C + h * HS;
    for (int q0 = query_begin; q0 < T; q0 += kInner) {
      if (mk.tile_masked(q0, kInner, key0, kRows, T)) continue;  // another document's queries
      __syncthreads();
      load_tile<kInner, kMaxD>(sQ, q_src, lay.q_ld(), q0, T, HS, vec);
      load_tile<kInner, kMaxD>(sdO, do_src, C, q0, T, HS, vec);
      load_vector(sLse, lse + bh * T, q0, kInner, T);
      load_vector(sDelta, delta + bh * T, q0, kInner, T);
      __syncthreads();
      float s[4][kJ], dp[4][kJ];
      score_tile<kMaxD, kJ>(s, sK, sQ, HS);    // S^T = K Q^T
      score_tile<kMaxD, kJ>(dp, sV, sdO, HS);  // dP^T = V dO^T
#pragma unroll
      for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < kJ; j++) {
          const int qi = lane16() + j * kLanes;
          const float p = mk.visible(q0 + qi, my_key0 + i, T)
                              ? expf(s[i][j] * scale - sLse[qi]) : 0.f;
          const int at = (row_group() * 4 + i) * Cfg::kPStride + qi;
          sP[at] = p;
          sdS[at] = p * (dp[i][j] - sDelta[qi]);
        }
      __syncthreads();
      const int n = min(kInner, T - q0);
      accumulate_tile<kMaxD, Cfg::kPStride>(dv, sP, sdO, n);
      accumulate_tile<kMaxD, Cfg::kPStride>(dk, sdS, sQ, n);
    }
  }

  const size_t kv_ld = lay.kv_ld();
  float* dk_dst = dkv + (size_t)b * T * kv_ld + kv_head * HS;
  float* dv_dst = dk_dst + lay.v_offset();
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int key = my_key0 + i;
    if (key >= T) continue;
#pragma unroll
    for (int k = 0; k < kCols; k++) {
      const int d = lane16() + k * kLanes;
      if (d >= HS) continue;
      dk_dst[(size_t)key * kv_ld + d] += scale * dk[i][k];
      dv_dst[(size_t)key * kv_ld + d] += dv[i][k];
    }
  }
}

// --- launchers -----------------------------------------------------------------------------------

struct Shape {
  int B, T, NH, NKV, HS;
  BlockLayout layout() const { return {NH, NKV, HS}; }
};

void check_shape(const Shape& sh) {
  CHECK(sh.B > 0 && sh.T > 0 && sh.NH > 0 && sh.NKV > 0 && sh.HS > 0 && sh.NH % sh.NKV == 0,
        "attention block: bad shape B=%d T=%d NH=%d NKV=%d HS=%d (the kv heads must divide the "
        "query heads)", sh.B, sh.T, sh.NH, sh.NKV, sh.HS);
  CHECK(sh.HS <= 128, "attention block: head size %d > 128 is not supported", sh.HS);
  CHECK((long)sh.B * sh.NH <= 65535, "attention block: B*NH = %ld exceeds the grid limit 65535",
        (long)sh.B * sh.NH);
}

// 16-byte tile loads: HS a whole number of packs (then every row start is one too) and every
// tensor the tiles read aligned.
template <typename Elem>
bool vector_loads(const Shape& sh, std::initializer_list<const void*> pointers) {
  return sh.HS % Pack128<Elem>::size == 0 && aligned16(pointers);
}

// Kernels with more than 48 KB of dynamic shared memory must opt in, once per kernel.
template <typename Kernel>
void allow_smem(Kernel kernel, int bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

// Blocks of kRows rows for each of `heads` heads (query heads, or kv heads for dk/dv).
dim3 grid_of(const Shape& sh, int heads) {
  return dim3((unsigned)ceil_div(sh.T, kRows), sh.B * heads);
}

// Calls fn.template operator()<kMaxD>() via a tag: fn(std::integral_constant<int, kMaxD>{}).
template <typename Fn>
void dispatch_head_size(int HS, Fn&& fn) {
  if (HS <= 64)
    fn(std::integral_constant<int, 64>{});
  else
    fn(std::integral_constant<int, 128>{});
}

template <typename Elem, int kMaxD>
void launch_forward(void* out, float* lse, const void* qkv, const void* kv, const Shape& sh,
                    BlockMask mask, float scale, cudaStream_t st) {
  using Cfg = Tiles<kMaxD>;
  static const bool smem_ready =
      (allow_smem(block_forward_kernel<Elem, kMaxD>, Cfg::kFwdSmem), true);
  (void)smem_ready;
  const bool vec = vector_loads<Elem>(sh, {qkv, kv});
  block_forward_kernel<Elem, kMaxD><<<grid_of(sh, sh.NH), kThreads, Cfg::kFwdSmem, st>>>(
      (Elem*)out, lse, (const Elem*)qkv, (const Elem*)kv, sh.T, sh.layout(), mask, scale, vec);
  LAUNCH_CHECK();
}

template <typename Elem, int kMaxD>
void launch_backward(float* dq, float* dkv, const void* dout, const void* qkv, const void* kv,
                     const float* lse, const float* delta, const Shape& sh, BlockMask mask,
                     float scale, cudaStream_t st) {
  using Cfg = Tiles<kMaxD>;
  static const bool smem_ready =
      (allow_smem(block_backward_dq_kernel<Elem, kMaxD>, Cfg::kDqSmem),
       allow_smem(block_backward_dkdv_kernel<Elem, kMaxD>, Cfg::kDkDvSmem), true);
  (void)smem_ready;
  const bool vec = vector_loads<Elem>(sh, {dout, qkv, kv});
  block_backward_dq_kernel<Elem, kMaxD><<<grid_of(sh, sh.NH), kThreads, Cfg::kDqSmem, st>>>(
      dq, (const Elem*)dout, (const Elem*)qkv, (const Elem*)kv, lse, delta, sh.T, sh.layout(),
      mask, scale, vec);
  LAUNCH_CHECK();
  block_backward_dkdv_kernel<Elem, kMaxD><<<grid_of(sh, sh.NKV), kThreads, Cfg::kDkDvSmem, st>>>(
      dkv, (const Elem*)dout, (const Elem*)qkv, (const Elem*)kv, lse, delta, sh.T, sh.layout(),
      mask, scale, vec);
  LAUNCH_CHECK();
}

}  // namespace

void attention_block_forward(void* out, float* lse, const void* qkv, const void* kv, int B, int T,
                             int NH, int NKV, int HS, bool causal, DType dt, Stream s,
                             const int* q_docs, const int* k_docs) {
  OP_SPAN(attention_block_forward);
  if (is_dry(s)) return;
  const Shape sh{B, T, NH, NKV, HS};
  const BlockMask mask{causal, q_docs, k_docs};
  check_shape(sh);
  // What the trainer logs as the attention used (ops::attention_impl_name): with ring attention
  // these kernels, never the attention_forward choice between flash and cuDNN.
  if (!s->attention_note[0])
    std::snprintf(s->attention_note, sizeof(s->attention_note), "ring blocks (hand-written)");
  const float scale = 1.0f / std::sqrt((float)HS);
  dispatch_dtype(dt, [&](auto tag) {
    using Elem = decltype(tag);
    dispatch_head_size(HS, [&](auto max_d) {
      launch_forward<Elem, decltype(max_d)::value>(out, lse, qkv, kv, sh, mask, scale,
                                                   s->stream);
    });
  });
}

void attention_block_backward(float* dq, float* dkv, const void* dout, const void* out,
                              const float* lse, const void* qkv, const void* kv, int B, int T,
                              int NH, int NKV, int HS, bool causal, DType dt, Stream s,
                              const int* q_docs, const int* k_docs) {
  OP_SPAN(attention_block_backward);
  if (is_dry(s)) return;
  const Shape sh{B, T, NH, NKV, HS};
  const BlockMask mask{causal, q_docs, k_docs};
  check_shape(sh);
  const float scale = 1.0f / std::sqrt((float)HS);
  float* delta = (float*)stream_scratch(s, (size_t)B * NH * T * sizeof(float));
  dispatch_dtype(dt, [&](auto tag) {
    using Elem = decltype(tag);
    const dim3 rows_grid((unsigned)ceil_div(T, attention_generic::kRowsPerBlock), B * NH);
    attention_generic::backward_delta_kernel<Elem>
        <<<rows_grid, 32 * attention_generic::kRowsPerBlock, 0, s->stream>>>(
            delta, (const Elem*)dout, (const Elem*)out, T, NH, HS);
    LAUNCH_CHECK();
    dispatch_head_size(HS, [&](auto max_d) {
      launch_backward<Elem, decltype(max_d)::value>(dq, dkv, dout, qkv, kv, lse, delta, sh,
                                                    mask, scale, s->stream);
    });
  });
}

}  // namespace ops
