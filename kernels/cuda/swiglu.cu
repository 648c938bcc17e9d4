// kernels/cuda/swiglu.cu - SwiGLU (Llama's MLP nonlinearity), forward and backward; the contract
// is in kernels/ops_decls.h. Each row of inp (N, 2F) is [gate (F) | up (F)]:
//   out = silu(gate) * up,  silu(x) = x sig(x),  sig(x) = 1 / (1 + exp(-x))
//   d gate = dout * up * sig(gate) (1 + gate (1 - sig(gate))),  d up = dout * silu(gate)
// fp32 math with the accurate expf; its argument is capped at 88 as on the CPU (exp_fast), so
// sig stays a finite, positive number for any input.
//
// Parallelisation: a grid-stride loop over groups of W consecutive columns f of one row: a thread
// reads W gates and the W matching ups (and W douts), and writes W outputs (or W d gates and W
// d ups). Vector path: W is one 16-byte pack (4 fp32, 8 bf16) when F is a multiple of it and the
// pointers are 16-byte aligned (then every group is aligned); otherwise W = 1.
#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"

namespace ops {
namespace {

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 65536;

__device__ __forceinline__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(fminf(-x, 88.0f)));
}

template <typename T, int W>
__global__ void swiglu_forward_kernel(T* __restrict__ out, const T* __restrict__ inp, int F,
                                      size_t total) {
  const int groups = F / W;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += stride) {
    const size_t n = i / groups;
    const int f = (int)(i % groups) * W;
    const T* gate = inp + n * 2 * F + f;
    float g[W], u[W];
    load_floats<W>(g, gate);
    load_floats<W>(u, gate + F);
#pragma unroll
    for (int k = 0; k < W; k++) g[k] = g[k] * sigmoid(g[k]) * u[k];
    store_floats<W>(out + n * F + f, g);
  }
}

template <typename T, int W>
__global__ void swiglu_backward_kernel(T* __restrict__ dinp, const T* __restrict__ dout,
                                       const T* __restrict__ inp, int F, size_t total) {
  const int groups = F / W;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += stride) {
    const size_t n = i / groups;
    const int f = (int)(i % groups) * W;
    const T* gate = inp + n * 2 * F + f;
    float g[W], u[W], d[W];
    load_floats<W>(g, gate);
    load_floats<W>(u, gate + F);
    load_floats<W>(d, dout + n * F + f);
#pragma unroll
    for (int k = 0; k < W; k++) {
      const float sg = sigmoid(g[k]);
      const float silu = g[k] * sg;
      const float dgate = d[k] * u[k] * (sg * (1.0f + g[k] * (1.0f - sg)));
      u[k] = d[k] * silu;
      g[k] = dgate;
    }
    store_floats<W>(dinp + n * 2 * F + f, g);
    store_floats<W>(dinp + n * 2 * F + F + f, u);
  }
}

// Blocks for `total` groups of work.
int grid_for(size_t total) { return (int)std::min(ceil_div(total, kThreads), kMaxBlocks); }

}  // namespace

void swiglu_forward(void* out, const void* inp, int N, int F, DType dt, Stream s) {
  OP_SPAN(swiglu_forward);
  if (is_dry(s)) return;
  if (N == 0 || F == 0) return;
  dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    constexpr int P = Pack128<S>::size;
    const bool vec = F % P == 0 && aligned16({out, inp});
    auto* o = static_cast<S*>(out);
    auto* x = static_cast<const S*>(inp);
    if (vec) {
      const size_t total = (size_t)N * (F / P);
      swiglu_forward_kernel<S, P><<<grid_for(total), kThreads, 0, s->stream>>>(o, x, F, total);
    } else {
      const size_t total = (size_t)N * F;
      swiglu_forward_kernel<S, 1><<<grid_for(total), kThreads, 0, s->stream>>>(o, x, F, total);
    }
    LAUNCH_CHECK();
  });
}

void swiglu_backward(void* dinp, const void* dout, const void* inp, int N, int F, DType dt,
                     Stream s) {
  OP_SPAN(swiglu_backward);
  if (is_dry(s)) return;
  if (N == 0 || F == 0) return;
  dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    constexpr int P = Pack128<S>::size;
    const bool vec = F % P == 0 && aligned16({dinp, dout, inp});
    auto* di = static_cast<S*>(dinp);
    auto* d = static_cast<const S*>(dout);
    auto* x = static_cast<const S*>(inp);
    const int W = vec ? P : 1;
    const size_t total = (size_t)N * (F / W);
    if (vec)
      swiglu_backward_kernel<S, P><<<grid_for(total), kThreads, 0, s->stream>>>(di, d, x, F, total);
    else
      swiglu_backward_kernel<S, 1><<<grid_for(total), kThreads, 0, s->stream>>>(di, d, x, F, total);
    LAUNCH_CHECK();
  });
}

}  // namespace ops
