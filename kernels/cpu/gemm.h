// kernels/cpu/gemm.h - the dense matrix product behind every linear layer of the CPU backend:
// out(M, N) = A(M, K) @ B(K, N), fp32 accumulation, handed to an epilogue tile row by tile row.
//
// How it runs:
// - k is cut into chunks of kDepthChunk. For each chunk both operands are packed into fp32 in
//   the stream's scratch (bf16 is widened exactly): A into blocks of kTileRows rows, B into panels
//   of kTileCols columns, both k-major and zero-padded at the edges. Packing is also where
//   transposes happen: an operand is any strided view. Packed slices this small stay in cache.
// - A tile of kTileRows x kTileCols outputs is computed by gemm_tile, whose inner loop is a
//   broadcast-multiply-add over kTileCols contiguous floats (vectorised, explicit fmaf). Between
//   chunks a tile's running sums wait in an fp32 buffer; with a single chunk they never leave the
//   registers. Either way every output is the sum over k in increasing order from 0, so the
//   result is bitwise the same whatever the thread count, the tiling or the instruction set.
// - Tiles are independent: OpenMP splits the (panel, block) grid statically. The outer loop runs
//   over the larger operand, so that the inner loop sweeps the smaller one, which stays in L2.
// - The epilogue (bias, residual, GELU, rounding to bf16, "+=" into fp32) sees the fp32 sums,
//   so every stored value is rounded exactly once, as with cuBLASLt's fused epilogues.
#pragma once
#include <algorithm>

#include "kernels/cpu/cpu_common.h"

namespace ops {
namespace cpu {

constexpr int kTileRows = 8;
constexpr int kTileCols = 32;
constexpr int kTileSize = kTileRows * kTileCols;
constexpr int kDepthChunk = 256;  // k per pass over the tiles

// A matrix read in place: element (i, j) is data[i * row_stride + j * col_stride], stored as dt.
// A transpose is the same data with the strides swapped.
struct MatrixRef {
  const void* data;
  DType dt;
  size_t row_stride, col_stride;
};

// Columns [k0, k0 + depth) of A (M, K) into out as ceil(M / kTileRows) blocks, each
// depth x kTileRows (k-major), rows >= M zero.
void pack_rows(float* out, const MatrixRef& a, int M, int k0, int depth);
// Rows [k0, k0 + depth) of B (K, N) into out as ceil(N / kTileCols) panels, each
// depth x kTileCols (k-major), columns >= N zero.
void pack_cols(float* out, const MatrixRef& b, int N, int k0, int depth);
// sums (kTileRows x kTileCols, row-major) = block^T @ panel, summed over k = 0 .. depth-1 in
// order, starting from 0 or, with `accumulate`, from the values already in sums.
void gemm_tile(const float* block, const float* panel, int depth, float* sums, bool accumulate);

// Computes A @ B and calls epilogue(row, col0, sums, ncols) once per output row of each tile:
// sums[j] is out(row, col0 + j) for j < ncols. Calls for different tiles run in parallel, so the
// epilogue must only touch the outputs it is given.
template <typename Epilogue>
void gemm(Stream s, const MatrixRef& a, const MatrixRef& b, int M, int N, int K,
          Epilogue&& epilogue) {
  if (M <= 0 || N <= 0) return;
  const int num_blocks = (int)ceil_div(M, kTileRows);
  const int num_panels = (int)ceil_div(N, kTileCols);
  const int max_depth = std::min(K, kDepthChunk);
  const size_t blocks_size = (size_t)num_blocks * kTileRows * max_depth;
  const size_t panels_size = (size_t)num_panels * kTileCols * max_depth;
  const size_t running_size = K > kDepthChunk ? (size_t)num_blocks * num_panels * kTileSize : 0;
  Scratch scratch(s, blocks_size + panels_size + running_size);
  float* const blocks = scratch.data();
  float* const panels = blocks + blocks_size;
  float* const running = running_size ? panels + panels_size : nullptr;
  const bool blocks_outer = N < M;
  for (int k0 = 0; k0 == 0 || k0 < K; k0 += kDepthChunk) {
    const int depth = std::min(kDepthChunk, K - k0);
    const bool last_chunk = k0 + depth >= K;
    pack_rows(blocks, a, M, k0, depth);
    pack_cols(panels, b, N, k0, depth);
#pragma omp parallel for schedule(static) if ((double)M * N * depth > 1e5)
    for (int tile = 0; tile < num_blocks * num_panels; tile++) {
      const int blk = blocks_outer ? tile / num_panels : tile % num_blocks;
      const int p = blocks_outer ? tile % num_panels : tile / num_blocks;
      alignas(64) float local[kTileSize];
      float* sums = running ? running + ((size_t)p * num_blocks + blk) * kTileSize : local;
      gemm_tile(blocks + (size_t)blk * depth * kTileRows, panels + (size_t)p * depth * kTileCols,
                depth, sums, k0 > 0);
      if (!last_chunk) continue;
      const int col0 = p * kTileCols;
      const int ncols = std::min(kTileCols, N - col0);
      const int nrows = std::min(kTileRows, M - blk * kTileRows);
      for (int i = 0; i < nrows; i++)
        epilogue(blk * kTileRows + i, col0, sums + i * kTileCols, ncols);
    }
  }
}

}  // namespace cpu
}  // namespace ops
