// kernels/cuda/attention_flash_forward.cuh - causal flash attention forward for bf16 on tensor
// cores (FlashAttention-2), head sizes 64 and 128, with an optional packed-document
// (block-causal) mask. Included by attention.cu only.
//
// Parallelisation: one block per (tile of kBlockM query rows, batch * head); each warp owns
// 16 * kMTiles query rows (two m-tiles for D = 64, so that each K/V fragment read from shared
// memory feeds two mma's, as in FlashAttention-2). The block walks the key/value tiles of
// kBlockN rows up to its last query row (causal block skipping: later tiles are never loaded),
// double-buffering them in shared memory with cp.async so that the copy of tile n+1 overlaps the
// math on tile n.
// Per tile and warp: S = Q K^T (mma.sync, fp32), the causal mask on the diagonal tiles, the
// online softmax in fp32 (running max m and sum l per row, exp2f with log2(e) folded into the
// scale), then O += P V with P taken straight from the score registers. At the end
// out = O / l and lse = m * scale + log(l) (natural log, of the scaled scores).
// Query tiles are scheduled heaviest first (the last tile sees the most keys) to shorten the tail.
// Grouped-query attention: qkv rows are [q: NH heads | k: NKV heads | v: NKV heads]; the block of
// query head h reads the K, V tiles of kv head h / (NH/NKV) in place (no copies).
//
// Packed documents (docs: (B,T) document ids, non-decreasing along a sequence; null: causal): a
// query sees only the earlier keys of its own document. The block starts its walk at the tile
// holding the first row of its first query's document (a binary search): every earlier tile
// holds only earlier documents' keys, for every query of the block, and is never loaded. Inside
// the walk a warp skips a tile none of its queries sees (its last key's document is before the
// warp's first query's), and masks per element (ids compared) only a tile whose first key and
// last query lie in different documents; the rules are in attention_flash_documents.cuh. A
// query whose document starts after the first tile its warp computes has no visible key there:
// its running max stays -inf and the online softmax keeps its O and l at zero until its document
// begins. Without docs the walk, the masks and the arithmetic are the causal kernel's, bit for bit.
#pragma once
#include "kernels/cuda/attention_flash_documents.cuh"
#include "kernels/cuda/attention_tiles.cuh"

namespace attention_flash {

using attention_tiles::bf16;

constexpr float kLog2e = 1.4426950408889634f;

template <int D>
struct ForwardConfig {
  static constexpr int kWarps = 4;
  static constexpr int kMTiles = D == 64 ? 2 : 1;  // 16-row tiles per warp
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kWarpRows = 16 * kMTiles;
  static constexpr int kBlockM = kWarpRows * kWarps;  // query rows per block
  static constexpr int kBlockN = 64;                  // keys per iteration
  // Q tile, then two buffers of K, then two of V (bf16).
  static constexpr int kSmemBytes = (kBlockM + 4 * kBlockN) * D * 2;
};

// Online-softmax state of the two rows (g and g+8) a thread holds, and the scaling of a new tile.
// s: the raw scores of this tile (8 keys per n-tile); on return they are the probabilities
// exp(scale * (s - m_new)), and `o` (the output accumulator) has been rescaled by
// exp(scale * (m_old - m_new)).
template <int kN, int kDTiles>
__device__ __forceinline__ void online_softmax(float (&s)[kN][4], float (&o)[kDTiles][4],
                                               float (&row_max)[2], float (&row_sum)[2],
                                               float scale_log2) {
#pragma unroll
  for (int r = 0; r < 2; r++) {
    float mx = row_max[r];
#pragma unroll
    for (int nt = 0; nt < kN; nt++) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the 4 threads of a row
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // Causal: mx is finite, as key 0 is visible to every row and lies in the first tile processed.
    // With packed documents a row may have seen no key yet (mx = -inf): then o and the sum stay
    // 0 (correction 1, and every exp2f(-inf) below is 0).
    const bool none_yet = mx == -INFINITY;
    float correction = none_yet ? 1.f : exp2f((row_max[r] - mx) * scale_log2);  // 0 at first
    row_max[r] = mx;
    float offset = none_yet ? 0.f : mx * scale_log2;
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < kN; nt++) {
#pragma unroll
      for (int e = 2 * r; e < 2 * r + 2; e++) {
        s[nt][e] = exp2f(fmaf(s[nt][e], scale_log2, -offset));  // -inf -> 0
        sum += s[nt][e];
      }
    }
    row_sum[r] = row_sum[r] * correction + sum;  // this thread's share; reduced at the end
#pragma unroll
    for (int dt = 0; dt < kDTiles; dt++) {
      o[dt][2 * r] *= correction;
      o[dt][2 * r + 1] *= correction;
    }
  }
}

// grid (ceil(T / kBlockM), B * NH), block kThreads, dynamic smem kSmemBytes. docs: (B,T) or null.
template <int D>
__global__ void __launch_bounds__(ForwardConfig<D>::kThreads)
    flash_forward_kernel(bf16* __restrict__ out, float* __restrict__ lse,
                         const bf16* __restrict__ qkv, int T, int NH, int NKV, float scale,
                         const int* __restrict__ docs) {
  using Cfg = ForwardConfig<D>;
  using namespace attention_tiles;
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kThreads = Cfg::kThreads;
  constexpr int kM = Cfg::kMTiles, kWarpRows = Cfg::kWarpRows;
  constexpr int kN = kBlockN / 8, kDTiles = D / 8;
  extern __shared__ __align__(128) unsigned char attention_smem[];
  bf16* sQ = reinterpret_cast<bf16*>(attention_smem);
  bf16* sK = sQ + kBlockM * D;      // two buffers of kBlockN * D
  bf16* sV = sK + 2 * kBlockN * D;  // two buffers of kBlockN * D

  const int m_block = gridDim.x - 1 - blockIdx.x;  // heaviest first
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH, kv_head = h / (NH / NKV);
  const int C = NH * D;
  const size_t ld = (size_t)(NH + 2 * NKV) * D;
  const bf16* q_src = qkv + (size_t)b * T * ld + h * D;
  const bf16* k_src = qkv + (size_t)b * T * ld + (NH + kv_head) * D;
  const bf16* v_src = k_src + NKV * D;
  const int m0 = m_block * kBlockM;
  const int n_tiles = min((T + kBlockN - 1) / kBlockN, (m0 + kBlockM + kBlockN - 1) / kBlockN);
  const SequenceDocs seq = sequence_docs(docs, b, T);
  const int n_first = seq.ids ? seq.first_row(m0) / kBlockN : 0;  // earlier tiles: masked

  load_tile_async<kBlockM, D, kThreads>(sQ, q_src, ld, m0, T);
  load_tile_async<kBlockN, D, kThreads>(sK, k_src, ld, n_first * kBlockN, T);
  load_tile_async<kBlockN, D, kThreads>(sV, v_src, ld, n_first * kBlockN, T);
  cp_async_commit();

  const int warp = threadIdx.x >> 5;
  const int warp_row0 = m0 + kWarpRows * warp;  // first query row of this warp
  const int warp_row_last = warp_row0 + kWarpRows - 1;
  const float scale_log2 = scale * kLog2e;
  int row_doc[kM][2] = {};  // the document ids of the rows this thread holds (with docs)
  if (seq.ids)
#pragma unroll
    for (int mt = 0; mt < kM; mt++)
#pragma unroll
      for (int r = 0; r < 2; r++) row_doc[mt][r] = seq.at(warp_row0 + 16 * mt + frag_row(2 * r));
  float o[kM][kDTiles][4] = {};
  float row_max[kM][2], row_sum[kM][2];
#pragma unroll
  for (int mt = 0; mt < kM; mt++)
#pragma unroll
    for (int r = 0; r < 2; r++) {
      row_max[mt][r] = -INFINITY;
      row_sum[mt][r] = 0.f;
    }

  for (int n = n_first; n < n_tiles; n++) {
    const int buf = (n - n_first) & 1;
    if (n + 1 < n_tiles) {
      load_tile_async<kBlockN, D, kThreads>(sK + (buf ^ 1) * kBlockN * D, k_src, ld,
                                            (n + 1) * kBlockN, T);
      load_tile_async<kBlockN, D, kThreads>(sV + (buf ^ 1) * kBlockN * D, v_src, ld,
                                            (n + 1) * kBlockN, T);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int n0 = n * kBlockN;
    // Causal: otherwise the whole tile is in the warp's future. Documents: some query sees a key.
    const bool computes = seq.ids ? seq.sees(warp_row0, warp_row_last, n0, n0 + kBlockN - 1)
                                  : n0 <= warp_row_last;
    if (computes) {
      count_tile(kForwardTiles);
      const bf16* tK = sK + buf * kBlockN * D;
      const bf16* tV = sV + buf * kBlockN * D;
      float s[kM][kN][4] = {};
      gemm_abt<D, kM, kN>(s, sQ, kWarpRows * warp, tK, 0);
      const bool mixed = seq.ids && !seq.one_document(warp_row_last, n0);  // mask the ids too
      if (n0 + kBlockN - 1 > warp_row0 || mixed) {  // diagonal tile (this also masks keys >= T)
#pragma unroll
        for (int mt = 0; mt < kM; mt++)
#pragma unroll
          for (int nt = 0; nt < kN; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
              int key = n0 + frag_col(nt, e), row = warp_row0 + 16 * mt + frag_row(e);
              if (key > row || (mixed && seq.at(key) != row_doc[mt][e >> 1]))
                s[mt][nt][e] = -INFINITY;
            }
      }
#pragma unroll
      for (int mt = 0; mt < kM; mt++)
        online_softmax<kN, kDTiles>(s[mt], o[mt], row_max[mt], row_sum[mt], scale_log2);
      gemm_pv<D, kM, kN>(o, s, tV, 0);
    }
    __syncthreads();  // the buffer is refilled in the next iteration
  }

  // Epilogue: complete the row sums over the 4 threads of each row, normalise, store.
  const int lane = threadIdx.x & 31;
  bf16* o_dst = out + (size_t)b * T * C + h * D;
#pragma unroll
  for (int mt = 0; mt < kM; mt++)
#pragma unroll
    for (int r = 0; r < 2; r++) {
      float sum = row_sum[mt][r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int row = warp_row0 + 16 * mt + frag_row(2 * r);
      if (row >= T) continue;
      const float inv = 1.f / sum;
#pragma unroll
      for (int dt = 0; dt < kDTiles; dt++) {
        __nv_bfloat162 v =
            __floats2bfloat162_rn(o[mt][dt][2 * r] * inv, o[mt][dt][2 * r + 1] * inv);
        *reinterpret_cast<__nv_bfloat162*>(o_dst + (size_t)row * C + frag_col(dt, 2 * r)) = v;
      }
      if ((lane & 3) == 0) lse[(size_t)bh * T + row] = row_max[mt][r] * scale + logf(sum);
    }
}

}  // namespace attention_flash
