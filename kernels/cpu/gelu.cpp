// kernels/cpu/gelu.cpp - elementwise tanh-GELU, forward and backward, in fp32 (cpu_common.h holds
// the formulas, shared with the fused epilogues of matmul.cpp). Elements in parallel; each
// element is read before it is written, so dinp may alias dout.
#include "kernels/cpu/cpu_common.h"

namespace ops {
namespace cpu {
namespace {

template <typename T>
void gelu_forward_typed(T* out, const T* inp, size_t n) {
#pragma omp parallel for schedule(static) if (n > CPU_PARALLEL_MIN / 8)
  for (size_t i = 0; i < n; i++) store(out, i, gelu(load(inp, i)));
}

template <typename T>
void gelu_backward_typed(T* dinp, const T* inp, const T* dout, size_t n) {
#pragma omp parallel for schedule(static) if (n > CPU_PARALLEL_MIN / 8)
  for (size_t i = 0; i < n; i++) store(dinp, i, load(dout, i) * gelu_grad(load(inp, i)));
}

}  // namespace
}  // namespace cpu

void gelu_forward(void* out, const void* inp, size_t n, DType dt, Stream s) {
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::gelu_forward_typed((S*)out, (const S*)inp, n);
  });
}

void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n, DType dt, Stream s) {
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::gelu_backward_typed((S*)dinp, (const S*)inp, (const S*)dout, n);
  });
}

}  // namespace ops
