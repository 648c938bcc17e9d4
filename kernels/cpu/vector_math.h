// kernels/cpu/vector_math.h - vectorised loops over contiguous fp32 arrays, shared by the CPU
// kernels: axpy and its row-vector/outer-product forms, exp, GELU and its derivative, max, sums
// in double.
//
// Each is a CPU_HOT function (cpu_common.h): compiled for AVX-512, AVX2+FMA and baseline x86-64,
// with the same rounding in all three, and called on one slice of data by a thread (the OpenMP
// loops live in the callers). Sums and maxima use interleaved lanes combined in a fixed order,
// so that vectorising them changes no rounding.
#pragma once
#include "kernels/cpu/cpu_common.h"

namespace ops {
namespace cpu {

// y[i] += a * x[i], one rounding per element (fmaf).
void axpy(float* __restrict y, const float* __restrict x, float a, int n);
// y[i] += sum_r a[r] * X[r][i] for i < n, r = 0 .. rows-1 in order (row r at X + r * x_stride):
// a row vector times a matrix, as a sequence of axpys.
void accumulate_rows(float* __restrict y, const float* __restrict a, const float* __restrict X,
                     size_t x_stride, int rows, int n);
// Y[r][i] += a[r] * x[i] for r < rows, i < n (row r at Y + r * n): an outer-product update.
void add_outer(float* __restrict Y, const float* __restrict a, const float* __restrict x, int rows,
               int n);
// y[i] = exp(x[i] - shift) (exp_fast). y may be x.
void exp_shifted(float* y, const float* x, float shift, int n);
// y[i] = gelu(x[i]). y may be x.
void gelu_span(float* y, const float* x, int n);
// dx[i] = dy[i] * gelu'(x[i]). dx may be dy.
void gelu_backward_span(float* dx, const float* x, const float* dy, int n);
// max_i x[i] (n >= 1).
float max_span(const float* x, size_t n);
// sum_i x[i] and sum_i x[i]^2, accumulated in double.
double sum_span(const float* x, size_t n);
double sum_squares_span(const float* x, size_t n);

}  // namespace cpu
}  // namespace ops
