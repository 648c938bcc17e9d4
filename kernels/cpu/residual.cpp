// kernels/cpu/residual.cpp - out = inp + bias + residual: the epilogue of a row-parallel GEMM,
// run after its partial sums were reduced across the tensor-parallel group.
//
// Rows in parallel; each element is summed in fp32 (inp + bias, then + residual, the order of
// the GEMM epilogue) and rounded once to the storage type.
#include "kernels/cpu/cpu_common.h"

namespace ops {
namespace cpu {
namespace {

template <typename T>
void add_bias_residual_typed(T* out, const T* inp, const T* bias, const T* residual, int N,
                             int C) {
#pragma omp parallel for schedule(static) if ((size_t)N * C > CPU_PARALLEL_MIN)
  for (int n = 0; n < N; n++) {
    const size_t row = (size_t)n * C;
    for (int c = 0; c < C; c++) {
      float x = load(inp, row + c);
      if (bias) x += load(bias, c);
      if (residual) x += load(residual, row + c);
      store(out, row + c, x);
    }
  }
}

}  // namespace
}  // namespace cpu

void add_bias_residual(void* out, const void* inp, const void* bias, const void* residual, int N,
                       int C, DType dt, Stream s) {
  OP_SPAN(add_bias_residual);
  if (is_dry(s)) return;
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::add_bias_residual_typed((S*)out, (const S*)inp, (const S*)bias, (const S*)residual, N,
                                 C);
  });
}

}  // namespace ops
