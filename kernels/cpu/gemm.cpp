// kernels/cpu/gemm.cpp - packing and the register-tile kernel of the CPU matrix product (see
// gemm.h for the scheme).
//
// Trick: gemm_tile keeps a kTileRows x kTileCols block of sums in registers (16 AVX-512 or, with
// spills, AVX2 registers) and, for each k, broadcasts kTileRows values of A against one row of
// the B panel. fmaf is explicit, so the compiler emits vfmadd in the AVX2/AVX-512 clones and the
// rounding is the same in every clone.
#include "kernels/cpu/gemm.h"

#include <cstring>

namespace ops {
namespace cpu {
namespace {

// Both packers walk the source along its unit-stride dimension when it has one, so that a
// transposed operand (dout^T in the weight gradient) is read row by row, not with a stride.
template <typename T>
void pack_rows_typed(float* out, const T* data, size_t rs, size_t cs, int M, int k0, int depth) {
  const int num_blocks = (int)ceil_div(M, kTileRows);
#pragma omp parallel for schedule(static) if ((size_t)M * depth > CPU_PARALLEL_MIN)
  for (int blk = 0; blk < num_blocks; blk++) {
    float* dst = out + (size_t)blk * depth * kTileRows;
    const int rows = std::min(kTileRows, M - blk * kTileRows);
    const T* src = data + (size_t)blk * kTileRows * rs + (size_t)k0 * cs;
    if (cs == 1) {  // rows are contiguous
      for (int i = 0; i < rows; i++)
        for (int k = 0; k < depth; k++) dst[k * kTileRows + i] = load(src + i * rs, k);
    } else {
      for (int k = 0; k < depth; k++)
        for (int i = 0; i < rows; i++) dst[k * kTileRows + i] = load(src + k * cs, i * rs);
    }
    for (int k = 0; k < depth; k++)
      for (int i = rows; i < kTileRows; i++) dst[k * kTileRows + i] = 0.0f;
  }
}

template <typename T>
void pack_cols_typed(float* out, const T* data, size_t rs, size_t cs, int N, int k0, int depth) {
  const int num_panels = (int)ceil_div(N, kTileCols);
#pragma omp parallel for schedule(static) if ((size_t)N * depth > CPU_PARALLEL_MIN)
  for (int p = 0; p < num_panels; p++) {
    float* dst = out + (size_t)p * depth * kTileCols;
    const int cols = std::min(kTileCols, N - p * kTileCols);
    const T* src = data + (size_t)p * kTileCols * cs + (size_t)k0 * rs;
    if (cs == 1) {  // rows of B are contiguous
      for (int k = 0; k < depth; k++)
        for (int j = 0; j < cols; j++) dst[k * kTileCols + j] = load(src + k * rs, j);
    } else {
      for (int j = 0; j < cols; j++)
        for (int k = 0; k < depth; k++) dst[k * kTileCols + j] = load(src + j * cs, k * rs);
    }
    for (int k = 0; k < depth; k++)
      for (int j = cols; j < kTileCols; j++) dst[k * kTileCols + j] = 0.0f;
  }
}

}  // namespace

void pack_rows(float* out, const MatrixRef& a, int M, int k0, int depth) {
  dispatch_dtype(a.dt, [&](auto tag) {
    using T = decltype(tag);
    pack_rows_typed(out, (const T*)a.data, a.row_stride, a.col_stride, M, k0, depth);
  });
}

void pack_cols(float* out, const MatrixRef& b, int N, int k0, int depth) {
  dispatch_dtype(b.dt, [&](auto tag) {
    using T = decltype(tag);
    pack_cols_typed(out, (const T*)b.data, b.row_stride, b.col_stride, N, k0, depth);
  });
}

CPU_HOT void gemm_tile(const float* block, const float* panel, int depth, float* sums,
                       bool accumulate) {
  float acc[kTileRows][kTileCols];
  if (accumulate)
    std::memcpy(acc, sums, sizeof(acc));
  else
    std::memset(acc, 0, sizeof(acc));
  for (int k = 0; k < depth; k++) {
    const float* a = block + (size_t)k * kTileRows;
    const float* b = panel + (size_t)k * kTileCols;
    for (int i = 0; i < kTileRows; i++)
      for (int j = 0; j < kTileCols; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
  }
  std::memcpy(sums, acc, sizeof(acc));
}

}  // namespace cpu
}  // namespace ops
