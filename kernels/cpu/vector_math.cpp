// kernels/cpu/vector_math.cpp - the vectorised fp32 array loops of vector_math.h. Plain loops
// that GCC vectorises in each CPU_HOT clone; the lanes of max and the sums are explicit so that
// their combination order is fixed whatever the vector width.
#include "kernels/cpu/vector_math.h"

namespace ops {
namespace cpu {

namespace {
constexpr int kLanes = 16;
}

CPU_HOT void axpy(float* __restrict y, const float* __restrict x, float a, int n) {
  for (int i = 0; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}

// Four rows per pass keep y[i] in a register across four fmafs, nested in row order: the same
// roundings as four separate axpys, with a quarter of the loads and stores of y.
CPU_HOT void accumulate_rows(float* __restrict y, const float* __restrict a,
                             const float* __restrict X, size_t x_stride, int rows, int n) {
  int r = 0;
  for (; r + 4 <= rows; r += 4) {
    const float* x0 = X + r * x_stride;
    const float* x1 = x0 + x_stride;
    const float* x2 = x1 + x_stride;
    const float* x3 = x2 + x_stride;
    for (int i = 0; i < n; i++)
      y[i] = fmaf(a[r + 3], x3[i],
                  fmaf(a[r + 2], x2[i], fmaf(a[r + 1], x1[i], fmaf(a[r], x0[i], y[i]))));
  }
  for (; r < rows; r++) {
    const float* x = X + r * x_stride;
    for (int i = 0; i < n; i++) y[i] = fmaf(a[r], x[i], y[i]);
  }
}

CPU_HOT void add_outer(float* __restrict Y, const float* __restrict a, const float* __restrict x,
                       int rows, int n) {
  for (int r = 0; r < rows; r++) {
    float* y = Y + (size_t)r * n;
    for (int i = 0; i < n; i++) y[i] = fmaf(a[r], x[i], y[i]);
  }
}

CPU_HOT void exp_shifted(float* y, const float* x, float shift, int n) {
  for (int i = 0; i < n; i++) y[i] = exp_fast(x[i] - shift);
}

CPU_HOT void gelu_span(float* y, const float* x, int n) {
  for (int i = 0; i < n; i++) y[i] = gelu(x[i]);
}

CPU_HOT void gelu_backward_span(float* dx, const float* x, const float* dy, int n) {
  for (int i = 0; i < n; i++) dx[i] = dy[i] * gelu_grad(x[i]);
}

CPU_HOT float max_span(const float* x, size_t n) {
  float lanes[kLanes];
  for (int l = 0; l < kLanes; l++) lanes[l] = x[0];
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; l++) lanes[l] = x[i + l] > lanes[l] ? x[i + l] : lanes[l];
  for (; i < n; i++) lanes[0] = x[i] > lanes[0] ? x[i] : lanes[0];
  float m = lanes[0];
  for (int l = 1; l < kLanes; l++) m = lanes[l] > m ? lanes[l] : m;
  return m;
}

CPU_HOT double sum_span(const float* x, size_t n) {
  double lanes[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; l++) lanes[l] += x[i + l];
  for (; i < n; i++) lanes[i % kLanes] += x[i];
  double total = 0.0;
  for (int l = 0; l < kLanes; l++) total += lanes[l];
  return total;
}

CPU_HOT double sum_squares_span(const float* x, size_t n) {
  double lanes[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; l++) lanes[l] += (double)x[i + l] * x[i + l];
  for (; i < n; i++) lanes[i % kLanes] += (double)x[i] * x[i];
  double total = 0.0;
  for (int l = 0; l < kLanes; l++) total += lanes[l];
  return total;
}

}  // namespace cpu
}  // namespace ops
