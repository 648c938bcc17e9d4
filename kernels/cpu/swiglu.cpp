// kernels/cpu/swiglu.cpp - SwiGLU (Llama's MLP nonlinearity), forward and backward; the contract
// is in kernels/ops_decls.h. Each row of inp (N, 2F) is [gate (F) | up (F)]:
//   out = silu(gate) * up,  silu(x) = x * sig(x),  sig(x) = 1 / (1 + exp(-x))
//   d gate = dout * up * sig(gate) (1 + gate (1 - sig(gate))),  d up = dout * silu(gate)
// Rows in parallel; a row is widened to fp32, run through a vectorised loop (exp_fast of
// cpu_common.h, so the loop vectorises) and stored, each value rounded once.
#include <vector>

#include "kernels/cpu/cpu_common.h"

namespace ops {
namespace cpu {
namespace {

inline float sigmoid(float x) { return 1.0f / (1.0f + exp_fast(-x)); }

CPU_HOT void swiglu_span(float* __restrict out, const float* __restrict gate,
                         const float* __restrict up, int n) {
  for (int i = 0; i < n; i++) out[i] = gate[i] * sigmoid(gate[i]) * up[i];
}

CPU_HOT void swiglu_backward_span(float* __restrict dgate, float* __restrict dup,
                                  const float* __restrict dout, const float* __restrict gate,
                                  const float* __restrict up, int n) {
  for (int i = 0; i < n; i++) {
    const float sg = sigmoid(gate[i]);
    const float silu = gate[i] * sg;
    dgate[i] = dout[i] * up[i] * (sg * (1.0f + gate[i] * (1.0f - sg)));
    dup[i] = dout[i] * silu;
  }
}

template <typename T>
void swiglu_forward_typed(T* out, const T* inp, int N, int F) {
#pragma omp parallel if ((size_t)N * F > CPU_PARALLEL_MIN / 4)
  {
    std::vector<float> in(2 * (size_t)F), y(F);
#pragma omp for schedule(static)
    for (int n = 0; n < N; n++) {
      load_row(in.data(), inp + (size_t)n * 2 * F, 2 * (size_t)F);
      swiglu_span(y.data(), in.data(), in.data() + F, F);
      store_row(out + (size_t)n * F, y.data(), F);
    }
  }
}

template <typename T>
void swiglu_backward_typed(T* dinp, const T* dout, const T* inp, int N, int F) {
#pragma omp parallel if ((size_t)N * F > CPU_PARALLEL_MIN / 4)
  {
    std::vector<float> in(2 * (size_t)F), d(F), din(2 * (size_t)F);
#pragma omp for schedule(static)
    for (int n = 0; n < N; n++) {
      load_row(in.data(), inp + (size_t)n * 2 * F, 2 * (size_t)F);
      load_row(d.data(), dout + (size_t)n * F, F);
      swiglu_backward_span(din.data(), din.data() + F, d.data(), in.data(), in.data() + F, F);
      store_row(dinp + (size_t)n * 2 * F, din.data(), 2 * (size_t)F);
    }
  }
}

}  // namespace
}  // namespace cpu

void swiglu_forward(void* out, const void* inp, int N, int F, DType dt, Stream s) {
  OP_SPAN(swiglu_forward);
  if (is_dry(s)) return;
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::swiglu_forward_typed((S*)out, (const S*)inp, N, F);
  });
}

void swiglu_backward(void* dinp, const void* dout, const void* inp, int N, int F, DType dt,
                     Stream s) {
  OP_SPAN(swiglu_backward);
  if (is_dry(s)) return;
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::swiglu_backward_typed((S*)dinp, (const S*)dout, (const S*)inp, N, F);
  });
}

}  // namespace ops
