// kernels/cpu/rope.cpp - rotary position embeddings (Hugging Face's rotate_half form), forward and
// backward, in place on the q and k heads of a packed qkv (B, T, (NH + 2 NKV) HS); the contract
// is in kernels/ops_decls.h.
//
// A head's two halves are rotated pairwise: (x[j], x[j + HS/2]) by the angle of column j at the
// token's position p, with cos/sin read from the host-made tables (maxT, HS/2). The backward is
// the same rotation by -angle (the transpose), so one routine does both with the sign of sin.
// Tokens (b, t) in parallel; each output is computed in fp32 from the two inputs (read before
// either is written) and rounded once. v is never touched.
#include "kernels/cpu/cpu_common.h"

namespace ops {
namespace cpu {
namespace {

// Rotates the NH + NKV heads of one token's row by the angles of position p; sign = +1 forward,
// -1 backward.
template <typename T>
void rotate_row(T* row, const float* cos_p, const float* sin_p, int heads, int HS, float sign) {
  const int half = HS / 2;
  for (int h = 0; h < heads; h++) {
    T* x = row + (size_t)h * HS;
    for (int j = 0; j < half; j++) {
      const float x1 = load(x, j), x2 = load(x, j + half);
      const float c = cos_p[j], s = sign * sin_p[j];
      store(x, j, x1 * c - x2 * s);
      store(x, j + half, x2 * c + x1 * s);
    }
  }
}

template <typename T>
void rope_typed(T* qkv, const float* cos_table, const float* sin_table, const int* positions,
                int row_stride, int B, int T_, int NH, int NKV, int HS, float sign) {
  const size_t row_size = (size_t)(NH + 2 * NKV) * HS;
  const int half = HS / 2;
#pragma omp parallel for schedule(static) if ((size_t)B * T_ * row_size > CPU_PARALLEL_MIN)
  for (int bt = 0; bt < B * T_; bt++) {
    const int t = bt % T_;
    const size_t p =
        positions ? (size_t)positions[(size_t)(bt / T_) * row_stride + t] : (size_t)t;
    // q heads then k heads are contiguous: NH + NKV heads from the row's start.
    rotate_row(qkv + bt * row_size, cos_table + p * half, sin_table + p * half, NH + NKV, HS,
               sign);
  }
}

void rope(void* qkv, const float* cos_table, const float* sin_table, const int* positions,
          int row_stride, int B, int T, int NH, int NKV, int HS, DType dt, float sign) {
  if (HS % 2 != 0) FATAL("rope: head size %d is odd", HS);
  dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    rope_typed((S*)qkv, cos_table, sin_table, positions, row_stride, B, T, NH, NKV, HS, sign);
  });
}

}  // namespace
}  // namespace cpu

void rope_forward(void* qkv, const float* cos_table, const float* sin_table, const int* positions,
                  int B, int T, int NH, int NKV, int HS, DType dt, Stream s,
                  int positions_row_stride) {
  OP_SPAN(rope_forward);
  if (is_dry(s)) return;
  cpu::rope(qkv, cos_table, sin_table, positions, positions_row_stride, B, T, NH, NKV, HS, dt, 1.0f);
}

void rope_backward(void* dqkv, const float* cos_table, const float* sin_table,
                   const int* positions, int B, int T, int NH, int NKV, int HS, DType dt,
                   Stream s, int positions_row_stride) {
  OP_SPAN(rope_backward);
  if (is_dry(s)) return;
  cpu::rope(dqkv, cos_table, sin_table, positions, positions_row_stride, B, T, NH, NKV, HS, dt, -1.0f);
}

}  // namespace ops
