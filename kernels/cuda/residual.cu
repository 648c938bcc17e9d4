// kernels/cuda/residual.cu - out = inp + bias + residual over (N, C): the epilogue of a
// row-parallel GEMM, run once its partial sums have been reduced across the tensor-parallel group.
//
// Each element is summed in fp32 in the epilogue's order ((inp + bias) + residual) and rounded
// once to the storage type. bias (C) and residual (N, C) may each be nullptr.
// Parallelisation: grid-stride over packs of W consecutive elements of one row. W is a 16-byte
// pack (4 floats or 8 bf16) when C is a multiple of it and every pointer is 16-byte aligned, so a
// pack never straddles two rows and the bias pack is an aligned slice of bias; otherwise the same
// kernel runs with W = 1. out may be inp (in place): every element is read before the same thread
// writes it, so those two pointers are deliberately not __restrict__.
#include "kernels/cuda/cuda_common.cuh"

namespace ops {
namespace {

constexpr int kThreads = 256;

template <typename T, int W>
__global__ void add_bias_residual_kernel(T* out, const T* inp, const T* __restrict__ bias,
                                         const T* __restrict__ residual, size_t packs, int C) {
  const int packs_per_row = C / W;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < packs;
       i += (size_t)gridDim.x * blockDim.x) {
    const size_t at = i * W;                     // first element of the pack
    const int c = (int)(i % packs_per_row) * W;  // its column
    float x[W];
    load_floats<W>(x, inp + at);
    if (bias) {
      float b[W];
      load_floats<W>(b, bias + c);
#pragma unroll
      for (int k = 0; k < W; k++) x[k] += b[k];
    }
    if (residual) {
      float r[W];
      load_floats<W>(r, residual + at);
#pragma unroll
      for (int k = 0; k < W; k++) x[k] += r[k];
    }
    store_floats<W>(out + at, x);
  }
}

template <typename T, int W>
void launch(T* out, const T* inp, const T* bias, const T* residual, int N, int C, Stream s) {
  const size_t packs = (size_t)N * (C / W);
  const size_t blocks = ceil_div(packs, (size_t)kThreads);
  const int grid = (int)(blocks > 65536 ? 65536 : blocks);
  add_bias_residual_kernel<T, W><<<grid, kThreads, 0, s->stream>>>(out, inp, bias, residual,
                                                                   packs, C);
  LAUNCH_CHECK();
}

}  // namespace

void add_bias_residual(void* out, const void* inp, const void* bias, const void* residual, int N,
                       int C, DType dt, Stream s) {
  OP_SPAN(add_bias_residual);
  if (is_dry(s)) return;
  if (N <= 0 || C <= 0) return;
  dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    constexpr int P = Pack128<S>::size;
    auto* o = static_cast<S*>(out);
    auto* x = static_cast<const S*>(inp);
    auto* b = static_cast<const S*>(bias);
    auto* r = static_cast<const S*>(residual);
    if (C % P == 0 && aligned16({out, inp, bias, residual})) launch<S, P>(o, x, b, r, N, C, s);
    else launch<S, 1>(o, x, b, r, N, C, s);
  });
}

}  // namespace ops
