// kernels/cpu/gelu.cpp - elementwise tanh-GELU, forward and backward, in fp32 (the formulas are in
// cpu_common.h, shared with the fused epilogues of matmul.cpp). The array is cut into slices of
// kSlice elements, in parallel; a slice is widened to fp32, run through the vectorised loop of
// vector_math.h and stored (rounded once). Each element is read before it is written, so dinp
// may alias dout.
#include "kernels/cpu/vector_math.h"

namespace ops {
namespace cpu {
namespace {

constexpr size_t kSlice = 1024;

// Calls fn(y, x, dy, len) on fp32 copies of each slice of x (and dy) and stores y into out.
template <typename T, typename Fn>
void map_slices(T* out, const T* x, const T* dy, size_t n, Fn&& fn) {
  const size_t slices = ceil_div(n, kSlice);
#pragma omp parallel for schedule(static) if (n > CPU_PARALLEL_MIN / 8)
  for (size_t s = 0; s < slices; s++) {
    const size_t begin = s * kSlice;
    const int len = (int)std::min(kSlice, n - begin);
    float xs[kSlice], dys[kSlice], ys[kSlice];
    load_row(xs, x + begin, len);
    if (dy) load_row(dys, dy + begin, len);
    fn(ys, xs, dys, len);
    store_row(out + begin, ys, len);
  }
}

}  // namespace
}  // namespace cpu

void gelu_forward(void* out, const void* inp, size_t n, DType dt, Stream s) {
  OP_SPAN(gelu_forward);
  if (is_dry(s)) return;
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::map_slices(
        (S*)out, (const S*)inp, (const S*)nullptr, n,
        [](float* y, const float* x, const float*, int len) { cpu::gelu_span(y, x, len); });
  });
}

void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n, DType dt, Stream s) {
  OP_SPAN(gelu_backward);
  if (is_dry(s)) return;
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::map_slices((S*)dinp, (const S*)inp, (const S*)dout, n,
                    [](float* dx, const float* x, const float* dy, int len) {
                      cpu::gelu_backward_span(dx, x, dy, len);
                    });
  });
}

}  // namespace ops
