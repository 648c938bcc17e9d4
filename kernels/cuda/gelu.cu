// kernels/cuda/gelu.cu - GELU with the tanh approximation, forward and backward, elementwise.
//
//   gelu(x)  = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//   gelu'(x) = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
//
// Math in fp32, evaluated as x sigmoid(2u) = x / (1 + exp(-2u)) with the accurate expf (the same
// function; 1 + tanh(u) loses its digits for negative x: gelu and gelu_grad in cuda_common.cuh).
// Parallelisation: grid-stride over packs of 8 elements (two 16-byte loads per fp32 tensor, one
// per bf16 tensor); when n is not a multiple of 8 or a pointer is not 16-byte aligned the
// leftover elements (or all of them) go through a scalar loop in the same kernel.
// gelu_backward may run in place (dinp == dout): every element is read before it is written by
// the same thread, so the pointers are deliberately not __restrict__.
#include "kernels/cuda/cuda_common.cuh"

namespace ops {
namespace {

constexpr int kThreads = 256;
constexpr int kElems = 8;  // elements per thread and step on the vector path


template <typename T>
__global__ void gelu_forward_kernel(T* __restrict__ out, const T* __restrict__ inp, size_t packs,
                                    size_t tail, size_t n) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  for (size_t i = tid; i < packs; i += stride) {
    float x[kElems];
    load_floats<kElems>(x, inp + i * kElems);
#pragma unroll
    for (int k = 0; k < kElems; k++) x[k] = gelu(x[k]);
    store_floats<kElems>(out + i * kElems, x);
  }
  for (size_t i = tail + tid; i < n; i += stride) out[i] = from_float<T>(gelu(to_float(inp[i])));
}

template <typename T>
__global__ void gelu_backward_kernel(T* dinp, const T* __restrict__ inp, const T* dout,
                                     size_t packs, size_t tail, size_t n) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  for (size_t i = tid; i < packs; i += stride) {
    float x[kElems], d[kElems];
    load_floats<kElems>(x, inp + i * kElems);
    load_floats<kElems>(d, dout + i * kElems);
#pragma unroll
    for (int k = 0; k < kElems; k++) d[k] *= gelu_grad(x[k]);
    store_floats<kElems>(dinp + i * kElems, d);
  }
  for (size_t i = tail + tid; i < n; i += stride)
    dinp[i] = from_float<T>(to_float(dout[i]) * gelu_grad(to_float(inp[i])));
}

}  // namespace

void gelu_forward(void* out, const void* inp, size_t n, DType dt, Stream s) {
  OP_SPAN(gelu_forward);
  if (is_dry(s)) return;
  if (n == 0) return;
  dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    const ElementwiseSplit sp =
        elementwise_split(n, aligned16({out, inp}), kThreads, kElems);
    gelu_forward_kernel<S><<<sp.blocks, kThreads, 0, s->stream>>>(
        static_cast<S*>(out), static_cast<const S*>(inp), sp.packs, sp.tail, n);
    LAUNCH_CHECK();
  });
}

void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n, DType dt, Stream s) {
  OP_SPAN(gelu_backward);
  if (is_dry(s)) return;
  if (n == 0) return;
  dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    const ElementwiseSplit sp = elementwise_split(
        n, aligned16({dinp, inp, dout}), kThreads, kElems);
    gelu_backward_kernel<S><<<sp.blocks, kThreads, 0, s->stream>>>(
        static_cast<S*>(dinp), static_cast<const S*>(inp), static_cast<const S*>(dout), sp.packs,
        sp.tail, n);
    LAUNCH_CHECK();
  });
}

}  // namespace ops
