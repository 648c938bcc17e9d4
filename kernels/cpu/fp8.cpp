// kernels/cpu/fp8.cpp - FP8 on the CPU, exactly as the GPU rounds it: amax, the scale update of
// the current and delayed recipes, the scaled cast (with its transposed copy), and the FP8 GEMM.
//
// Every FP8 value goes through kernels/fp8.h (round to nearest even, saturating), so the cast is
// bit-identical to the GPU's. The GEMM decodes both operands to fp32 (exact: every FP8 value is
// an fp32 value), runs the fp32 GEMM of kernels/cpu/gemm.h and applies the two dequantisation
// scales in the epilogue; the sums over k run in another order than on the tensor cores, so the
// GEMM matches the GPU within fp32 accumulation rounding, not bit for bit.
//
// Block-scaled recipes (fp8_cast_blocks, gemm_fp8_blocks): per block, the amax, the power-of-two
// scale of kernels/fp8.h and the cast, in the order of the logical matrix; the GEMM decodes each
// operand with its block's scale_inv (exact: a power of two) and sums in fp32.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/fp8.h"

namespace ops {
namespace cpu {
namespace {

template <typename T>
float amax_typed(const T* x, size_t n) {
  float m = 0.0f;
  for (size_t i = 0; i < n; i++) {
    const float a = std::fabs(load(x, i));
    if (a > m || std::isnan(a)) m = a;  // NaN propagates (a diverged tensor must show)
    if (std::isnan(m)) break;
  }
  return m;
}

// All n FP8 codes of `src` decoded to fp32 (a 256-entry table: one lookup per element).
std::vector<float> decode_fp8(const void* src, DType fmt, size_t n) {
  float table[256];
  for (int c = 0; c < 256; c++) table[c] = fp8_to_f32((uint8_t)c, fmt);
  std::vector<float> out(n);
  const uint8_t* p = (const uint8_t*)src;
#pragma omp parallel for schedule(static) if (n > CPU_PARALLEL_MIN)
  for (size_t i = 0; i < n; i++) out[i] = table[p[i]];
  return out;
}

// The logical matrix X (R x C) of fp8_cast_blocks: x, or x^T (x is rows x cols).
template <typename T>
struct LogicalMatrix {
  const T* x;
  int cols;  // of x
  bool transpose;
  float at(int i, int j) const {
    return transpose ? load(x, (size_t)j * cols + i) : load(x, (size_t)i * cols + j);
  }
};

// All R*K codes of a block-scaled operand decoded: code * scale_inv of its block.
std::vector<float> decode_fp8_blocks(const void* src, DType fmt, const float* scale_inv, int R,
                                     int K, int block_rows, int block_cols) {
  std::vector<float> out = decode_fp8(src, fmt, (size_t)R * K);
  const int grid_cols = (K + block_cols - 1) / block_cols;
#pragma omp parallel for schedule(static) if ((size_t)R * K > CPU_PARALLEL_MIN)
  for (int i = 0; i < R; i++)
    for (int j = 0; j < K; j++)
      out[(size_t)i * K + j] *= scale_inv[(size_t)(i / block_rows) * grid_cols + j / block_cols];
  return out;
}

}  // namespace
}  // namespace cpu

bool device_supports_fp8() { return true; }

void amax(float* out, const void* x, size_t n, DType dt, Stream s) {
  OP_SPAN(amax);
  if (is_dry(s)) return;
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    *out = cpu::amax_typed((const S*)x, n);
  });
}

void fp8_update_scale(float* scale, float* scale_inv, float* history, int history_len,
                      const float* amax, float fp8_max, int margin, Stream s) {
  OP_SPAN(fp8_update_scale);
  if (is_dry(s)) return;
  float a = *amax;
  if (history_len > 0) {
    float past = 0.0f;
    for (int i = 0; i < history_len; i++) past = std::fmax(past, history[i]);
    if (past > 0.0f) a = past;
    for (int i = history_len - 1; i > 0; i--) history[i] = history[i - 1];
    history[0] = *amax;
  }
  const float sc = std::isfinite(a) && a > 0.0f ? fp8_max / a / std::ldexp(1.0f, margin) : 1.0f;
  *scale = sc;
  *scale_inv = 1.0f / sc;
}

void fp8_cast(void* out, void* out_t, DType fp8, const void* x, DType dt, int rows, int cols,
              const float* scale, Stream s) {
  OP_SPAN(fp8_cast);
  if (is_dry(s)) return;
  CHECK(out || out_t, "fp8_cast: no output");
  const float sc = *scale;
  uint8_t* o = (uint8_t*)out;
  uint8_t* ot = (uint8_t*)out_t;
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    const S* in = (const S*)x;
#pragma omp parallel for schedule(static) if ((size_t)rows * cols > CPU_PARALLEL_MIN)
    for (int r = 0; r < rows; r++)
      for (int c = 0; c < cols; c++) {
        const uint8_t q = f32_to_fp8(cpu::load(in, (size_t)r * cols + c) * sc, fp8);
        if (o) o[(size_t)r * cols + c] = q;
        if (ot) ot[(size_t)c * rows + r] = q;
      }
  });
}

void gemm_fp8(void* out, DType out_dt, bool accumulate, const void* a, DType a_fp8,
              const void* b, DType b_fp8, int M, int N, int K, const float* a_scale_inv,
              const float* b_scale_inv, Stream s) {
  OP_SPAN(gemm_fp8);
  if (is_dry(s)) return;
  CHECK(out_dt == DType::F32 || (out_dt == DType::BF16 && !accumulate),
        "gemm_fp8: output %s%s", dtype_name(out_dt), accumulate ? " with accumulate" : "");
  const std::vector<float> A = cpu::decode_fp8(a, a_fp8, (size_t)M * K);
  const std::vector<float> B = cpu::decode_fp8(b, b_fp8, (size_t)N * K);
  const cpu::MatrixRef am{A.data(), DType::F32, (size_t)K, 1};
  const cpu::MatrixRef bm{B.data(), DType::F32, 1, (size_t)K};  // B^T: (K, N) view
  const float sa = *a_scale_inv, sb = *b_scale_inv;
  cpu::gemm(s, am, bm, M, N, K, [&](int row, int col0, const float* sums, int ncols) {
    for (int j = 0; j < ncols; j++) {
      const float y = sums[j] * sa * sb;
      const size_t at = (size_t)row * N + col0 + j;
      if (out_dt == DType::F32) ((float*)out)[at] = accumulate ? ((float*)out)[at] + y : y;
      else ((uint16_t*)out)[at] = f32_to_bf16(y);
    }
  });
}

void fp8_cast_blocks(void* out, float* scale_inv, DType fp8, const void* x, DType dt, int rows,
                     int cols, bool transpose, int block_rows, int block_cols, bool e8m0,
                     int margin, Stream s) {
  OP_SPAN(fp8_cast_blocks);
  if (is_dry(s)) return;
  check_fp8_cast_blocks(fp8, rows, cols, block_rows, block_cols);
  const int R = transpose ? cols : rows, C = transpose ? rows : cols;
  const int grid_rows = (R + block_rows - 1) / block_rows;
  const int grid_cols = (C + block_cols - 1) / block_cols;
  const Fp8Format f = fp8_format(fp8);
  uint8_t* o = (uint8_t*)out;
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    const cpu::LogicalMatrix<S> X{(const S*)x, cols, transpose};
#pragma omp parallel for schedule(static) if ((size_t)rows * cols > CPU_PARALLEL_MIN)
    for (int b = 0; b < grid_rows * grid_cols; b++) {
      const int i0 = b / grid_cols * block_rows, j0 = b % grid_cols * block_cols;
      const int i1 = std::min(i0 + block_rows, R), j1 = std::min(j0 + block_cols, C);
      float m = 0.0f;
      for (int i = i0; i < i1; i++)
        for (int j = j0; j < j1; j++) {
          const float a = std::fabs(X.at(i, j));
          if (a > m || std::isnan(a)) m = a;
          if (std::isnan(m)) break;
        }
      const float inv = fp8_block_scale_inv(m, f.max_finite, f.emax, e8m0, margin);
      const float sc = 1.0f / inv;  // exact: a power of two
      scale_inv[b] = inv;
      for (int i = i0; i < i1; i++)
        for (int j = j0; j < j1; j++) o[(size_t)i * C + j] = f32_to_fp8(X.at(i, j) * sc, fp8);
    }
  });
}

void gemm_fp8_blocks(void* out, DType out_dt, bool accumulate, const void* a, DType a_fp8,
                     const float* a_scale_inv, int a_block_rows, int a_block_cols, const void* b,
                     DType b_fp8, const float* b_scale_inv, int b_block_rows, int b_block_cols,
                     int M, int N, int K, void* workspace, Stream s) {
  OP_SPAN(gemm_fp8_blocks);
  if (is_dry(s)) return;
  (void)workspace;
  CHECK(out_dt == DType::F32 || (out_dt == DType::BF16 && !accumulate),
        "gemm_fp8_blocks: output %s%s", dtype_name(out_dt), accumulate ? " with accumulate" : "");
  const std::vector<float> A =
      cpu::decode_fp8_blocks(a, a_fp8, a_scale_inv, M, K, a_block_rows, a_block_cols);
  const std::vector<float> B =
      cpu::decode_fp8_blocks(b, b_fp8, b_scale_inv, N, K, b_block_rows, b_block_cols);
  const cpu::MatrixRef am{A.data(), DType::F32, (size_t)K, 1};
  const cpu::MatrixRef bm{B.data(), DType::F32, 1, (size_t)K};  // B^T: (K, N) view
  cpu::gemm(s, am, bm, M, N, K, [&](int row, int col0, const float* sums, int ncols) {
    for (int j = 0; j < ncols; j++) {
      const size_t at = (size_t)row * N + col0 + j;
      if (out_dt == DType::F32) ((float*)out)[at] = accumulate ? ((float*)out)[at] + sums[j] : sums[j];
      else ((uint16_t*)out)[at] = f32_to_bf16(sums[j]);
    }
  });
}

}  // namespace ops
