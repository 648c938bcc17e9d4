// kernels/cuda/attention_tiles.cuh - the warp-level building blocks of the tensor-core flash
// attention kernels (attention_flash_forward.cuh, attention_flash_backward.cuh):
//   - cp.async copies global -> shared (16 bytes, zero-filled past the end of the sequence),
//   - tiles of `rows x D` bf16 in shared memory whose 16-byte chunks are XOR-swizzled by the row
//     (chunk c of row r lives at chunk c ^ (r % 8)), so that the 8 row addresses of one ldmatrix
//     fall into 8 different bank groups: conflict-free for D = 64 (128-byte rows) and 128,
//   - ldmatrix (plain and .trans) of 16x16 operand blocks feeding the bf16 mma.sync m16n8k16 with
//     fp32 accumulators (the PTX wrappers are in attention_ptx.cuh).
//
// Fragment layouts (PTX ISA, "mma.m16n8k16", g = lane / 4, q = lane % 4):
//   A (16x16, row-major) a0: (g, 2q..2q+1)  a1: (g+8, 2q..)  a2: (g, 8+2q..)  a3: (g+8, 8+2q..)
//   B (16x8, "col")      b0: (k 2q..2q+1, n g)               b1: (k 8+2q.., n g)
//   C (16x8, fp32)       c0,c1: (g, 2q..2q+1)                c2,c3: (g+8, 2q..2q+1)
// So the fp32 C fragments of two neighbouring n-tiles, rounded to bf16 and paired, are exactly the
// A fragment of the next product (P @ V uses the scores' registers directly, FlashAttention-2).
//
// A tile is read three ways:
//   load_a        rows r0..r0+15 as the A operand              (Q in Q K^T)
//   load_b        rows n0..n0+15 as the B operand of X @ tile^T  (K in Q K^T: B[k][n] = K[n][k])
//   load_b_trans  rows k0..k0+15 as the B operand of X @ tile    (V in P V:   B[k][n] = V[k][n])
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

#include "kernels/cuda/attention_ptx.cuh"

namespace attention_tiles {

typedef __nv_bfloat16 bf16;

// Two floats rounded to bf16 and packed, `lo` in the low half (the lower column index).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// --- swizzled tiles ------------------------------------------------------------------------------

// Element offset of 16-byte chunk `chunk` (8 bf16) of row `row` in a tile with D columns.
template <int D>
__device__ __forceinline__ int tile_offset(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) << 3);
}

// Starts the copy of rows row0..row0+kRows-1 of a (T x D) matrix whose rows are `ld` elements
// apart into a swizzled tile; rows >= T are zero-filled. Every thread of the block calls it.
template <int kRows, int D, int kThreads>
__device__ __forceinline__ void load_tile_async(bf16* tile, const bf16* src, size_t ld, int row0,
                                                int T) {
  constexpr int kChunksPerRow = D / 8;
  for (int i = threadIdx.x; i < kRows * kChunksPerRow; i += kThreads) {
    int r = i / kChunksPerRow, c = i % kChunksPerRow;
    int t = row0 + r;
    bool valid = t < T;
    const bf16* from = src + (size_t)(valid ? t : 0) * ld + c * 8;
    cp_async_16(tile + tile_offset<D>(r, c), from, valid);
  }
}

// Starts the copy of kRows floats src[row0 ..] into smem; entries with row >= T become 0.
template <int kRows>
__device__ __forceinline__ void load_rows_async(float* dst, const float* src, int row0, int T) {
  for (int i = threadIdx.x; i < kRows; i += blockDim.x) {
    bool valid = row0 + i < T;
    cp_async_4(dst + i, src + (valid ? row0 + i : 0), valid);
  }
}

// A operand: rows r0..r0+15, columns 16*kk..16*kk+15 of the tile.
template <int D>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* tile, int r0, int kk) {
  int lane = threadIdx.x & 31, mi = lane >> 3;
  int row = r0 + ((mi & 1) << 3) + (lane & 7);
  ldmatrix_x4(a, tile + tile_offset<D>(row, 2 * kk + (mi >> 1)));
}
// B operands of X @ tile^T for the two n-tiles n0..n0+7 (b[0], b[1]) and n0+8..n0+15 (b[2],
// b[3]), contraction columns 16*kk..16*kk+15.
template <int D>
__device__ __forceinline__ void load_b(uint32_t (&b)[4], const bf16* tile, int n0, int kk) {
  int lane = threadIdx.x & 31, mi = lane >> 3;
  int row = n0 + ((mi >> 1) << 3) + (lane & 7);
  ldmatrix_x4(b, tile + tile_offset<D>(row, 2 * kk + (mi & 1)));
}
// B operands of X @ tile for contraction rows k0..k0+15 and the two n-tiles of columns
// 16*np..16*np+7 (b[0], b[1]) and 16*np+8..16*np+15 (b[2], b[3]).
template <int D>
__device__ __forceinline__ void load_b_trans(uint32_t (&b)[4], const bf16* tile, int k0, int np) {
  int lane = threadIdx.x & 31, mi = lane >> 3;
  int row = k0 + ((mi & 1) << 3) + (lane & 7);
  ldmatrix_x4_trans(b, tile + tile_offset<D>(row, 2 * np + (mi >> 1)));
}

// acc[16*kM x 8*kN] += tile_a[ra..ra+16*kM-1, :] @ tile_b[rb..rb+8*kN-1, :]^T over all D
// columns; acc[mt] holds rows ra+16*mt.., so every B fragment loaded feeds kM mma's.
// kUnrollK = false keeps the loop over the contraction dimension rolled, which saves registers
// where a kernel would otherwise spill.
template <int D, int kM, int kN, bool kUnrollK = true>
__device__ __forceinline__ void gemm_abt(float (&acc)[kM][kN][4], const bf16* tile_a, int ra,
                                         const bf16* tile_b, int rb) {
  static_assert(kN % 2 == 0, "n-tiles come in pairs");
#pragma unroll(kUnrollK ? D / 16 : 1)
  for (int kk = 0; kk < D / 16; kk++) {
    uint32_t a[kM][4];
#pragma unroll
    for (int mt = 0; mt < kM; mt++) load_a<D>(a[mt], tile_a, ra + 16 * mt, kk);
#pragma unroll
    for (int np = 0; np < kN / 2; np++) {
      uint32_t b[4];
      load_b<D>(b, tile_b, rb + 16 * np, kk);
#pragma unroll
      for (int mt = 0; mt < kM; mt++) {
        mma_bf16(acc[mt][2 * np], a[mt], b[0], b[1]);
        mma_bf16(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// acc[16*kM x D] += P[16*kM x 8*kK] @ tile[rb..rb+8*kK-1, :], P given as fp32 C fragments
// (rounded to bf16 here): the FlashAttention-2 register reuse described at the top.
template <int D, int kM, int kK>
__device__ __forceinline__ void gemm_pv(float (&acc)[kM][D / 8][4], const float (&p)[kM][kK][4],
                                        const bf16* tile, int rb) {
  static_assert(kK % 2 == 0, "k-steps are 16 wide");
#pragma unroll
  for (int kk = 0; kk < kK / 2; kk++) {
    uint32_t a[kM][4];
#pragma unroll
    for (int mt = 0; mt < kM; mt++) {
      a[mt][0] = pack_bf16(p[mt][2 * kk][0], p[mt][2 * kk][1]);
      a[mt][1] = pack_bf16(p[mt][2 * kk][2], p[mt][2 * kk][3]);
      a[mt][2] = pack_bf16(p[mt][2 * kk + 1][0], p[mt][2 * kk + 1][1]);
      a[mt][3] = pack_bf16(p[mt][2 * kk + 1][2], p[mt][2 * kk + 1][3]);
    }
#pragma unroll
    for (int np = 0; np < D / 16; np++) {
      uint32_t b[4];
      load_b_trans<D>(b, tile, rb + 16 * kk, np);
#pragma unroll
      for (int mt = 0; mt < kM; mt++) {
        mma_bf16(acc[mt][2 * np], a[mt], b[0], b[1]);
        mma_bf16(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// Position of element e (0..3) of C fragment n-tile `nt` inside a warp's 16-row tile.
__device__ __forceinline__ int frag_row(int e) {
  return ((threadIdx.x & 31) >> 2) + ((e >> 1) << 3);
}
__device__ __forceinline__ int frag_col(int nt, int e) {
  return nt * 8 + ((threadIdx.x & 3) << 1) + (e & 1);
}

}  // namespace attention_tiles
