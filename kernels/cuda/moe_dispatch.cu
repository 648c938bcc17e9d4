// kernels/cuda/moe_dispatch.cu - moving the tokens of a mixture-of-experts layer, CUDA backend
// (contracts in kernels/ops_decls.h), with the dispatch plan's indices:
//   moe_permute:            out[i] = in[rows[i]]                       (the dispatch, a gather)
//   moe_unpermute_backward: din[n] = sum_j dout[position[n*top_k + j]]  (its backward)
//   moe_combine:            out[n] = sum_j gate[p] * expert_out[position[p]]
//   moe_combine_backward:   d_expert_out[position[p]] = gate[p] * dout[n],
//                           d_gate[p] = dot(dout[n], expert_out[position[p]])
//
// Parallelisation: one warp per output row (the dispatch row i, or the token n), 4 rows per
// block of 128 threads; the lanes stride over the row's columns in packs of W elements. W is a
// 16-byte pack (4 floats or 8 bf16) when C is a multiple of it and every pointer is 16-byte
// aligned (then every row starts aligned too), else 1: one kernel body templated on W serves
// both paths. The trick that makes every op a gather: a token's rows in the dispatch buffer are
// listed by position, so a token row reads its top_k rows instead of being scattered into, and
// each output element is one lane's fixed-order fp32 sum: no atomics, the same bits every run.
// The sums are the CPU backend's (kernels/cpu/moe_dispatch.cpp) in the same order: plain adds
// in j order, the combine's weighted sum as __fmaf_rn in j order (the CPU's fmaf), so both
// backends agree to the bit. Only d_gate's dot over C differs: per-lane fmaf partial sums, then
// a butterfly reduction (__shfl_xor) across the warp, deterministic but not the CPU's order.
#include <type_traits>

#include "kernels/cuda/cuda_common.cuh"

namespace ops {
namespace {

constexpr int kRowsPerBlock = 4;  // warps per block

inline int row_blocks(int rows) { return (int)ceil_div((size_t)rows, (size_t)kRowsPerBlock); }

template <typename T, int W>
__global__ void permute_kernel(T* __restrict__ out, const T* __restrict__ in,
                               const int* __restrict__ rows, int M, int C) {
  const int i = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (i >= M) return;
  const T* src = in + (size_t)rows[i] * C;
  T* dst = out + (size_t)i * C;
  for (int c = lane * W; c < C; c += 32 * W) {
    if constexpr (W == 1) dst[c] = src[c];
    else store128(dst + c, load128(src + c));
  }
}

template <typename T, int W>
__global__ void unpermute_backward_kernel(T* __restrict__ din, const T* __restrict__ dout,
                                          const int* __restrict__ position, int N, int top_k,
                                          int C) {
  const int n = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (n >= N) return;
  const int* pos = position + (size_t)n * top_k;
  for (int c = lane * W; c < C; c += 32 * W) {
    float acc[W];
#pragma unroll
    for (int k = 0; k < W; k++) acc[k] = 0.0f;
    for (int j = 0; j < top_k; j++) {
      if (pos[j] < 0) continue;  // a dropped pair
      float x[W];
      load_floats<W>(x, dout + (size_t)pos[j] * C + c);
#pragma unroll
      for (int k = 0; k < W; k++) acc[k] = __fadd_rn(acc[k], x[k]);
    }
    store_floats<W>(din + (size_t)n * C + c, acc);
  }
}

template <typename T, int W>
__global__ void combine_kernel(T* __restrict__ out, const T* __restrict__ expert_out,
                               const float* __restrict__ gate, const int* __restrict__ position,
                               int N, int top_k, int C) {
  const int n = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (n >= N) return;
  const size_t p0 = (size_t)n * top_k;
  for (int c = lane * W; c < C; c += 32 * W) {
    float acc[W];
#pragma unroll
    for (int k = 0; k < W; k++) acc[k] = 0.0f;
    for (int j = 0; j < top_k; j++) {
      if (position[p0 + j] < 0) continue;  // a dropped pair contributes nothing
      const float g = gate[p0 + j];
      float x[W];
      load_floats<W>(x, expert_out + (size_t)position[p0 + j] * C + c);
#pragma unroll
      for (int k = 0; k < W; k++) acc[k] = __fmaf_rn(g, x[k], acc[k]);
    }
    store_floats<W>(out + (size_t)n * C + c, acc);
  }
}

// One warp per token n; for each of its pairs p in slot order, the lanes write their columns of
// d_expert_out's row position[p] and sum their part of the dot, which the warp then reduces.
template <typename T, int W>
__global__ void combine_backward_kernel(T* __restrict__ d_expert_out, float* __restrict__ d_gate,
                                        const T* __restrict__ dout,
                                        const T* __restrict__ expert_out,
                                        const float* __restrict__ gate,
                                        const int* __restrict__ position, int N, int top_k,
                                        int C) {
  const int n = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (n >= N) return;
  const T* d = dout + (size_t)n * C;
  for (int j = 0; j < top_k; j++) {
    const size_t p = (size_t)n * top_k + j, row = (size_t)position[p] * C;
    if (position[p] < 0) {  // a dropped pair: no row, no gradient for its gate
      if (lane == 0) d_gate[p] = 0.0f;
      continue;
    }
    const float g = gate[p];
    float dot = 0.0f;
    for (int c = lane * W; c < C; c += 32 * W) {
      float dy[W], x[W], dx[W];
      load_floats<W>(dy, d + c);
      load_floats<W>(x, expert_out + row + c);
#pragma unroll
      for (int k = 0; k < W; k++) {
        dx[k] = __fmul_rn(g, dy[k]);
        dot = __fmaf_rn(dy[k], x[k], dot);
      }
      store_floats<W>(d_expert_out + row + c, dx);
    }
    dot = warp_reduce_sum(dot);
    if (lane == 0) d_gate[p] = dot;
  }
}

// Runs launch(tag, W) with the storage type of dt and the widest W the pointers and C allow.
template <typename Launch>
void dispatch_width(DType dt, int C, std::initializer_list<const void*> pointers,
                    Launch&& launch) {
  dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    constexpr int P = Pack128<S>::size;
    if (C % P == 0 && aligned16(pointers)) launch(tag, std::integral_constant<int, P>{});
    else launch(tag, std::integral_constant<int, 1>{});
  });
}

}  // namespace

void moe_permute(void* out, const void* in, const int* rows, int M, int C, DType dt, Stream s) {
  OP_SPAN(moe_permute);
  if (is_dry(s)) return;
  if (M <= 0 || C <= 0) return;
  dispatch_width(dt, C, {out, in}, [&](auto tag, auto w) {
    using S = decltype(tag);
    constexpr int W = decltype(w)::value;
    permute_kernel<S, W><<<row_blocks(M), 32 * kRowsPerBlock, 0, s->stream>>>(
        (S*)out, (const S*)in, rows, M, C);
  });
  LAUNCH_CHECK();
}

void moe_unpermute_backward(void* din, const void* dout, const int* position, int N, int top_k,
                            int C, DType dt, Stream s) {
  OP_SPAN(moe_unpermute_backward);
  if (is_dry(s)) return;
  if (N <= 0 || C <= 0) return;
  dispatch_width(dt, C, {din, dout}, [&](auto tag, auto w) {
    using S = decltype(tag);
    constexpr int W = decltype(w)::value;
    unpermute_backward_kernel<S, W><<<row_blocks(N), 32 * kRowsPerBlock, 0, s->stream>>>(
        (S*)din, (const S*)dout, position, N, top_k, C);
  });
  LAUNCH_CHECK();
}

void moe_combine(void* out, const void* expert_out, const float* gate, const int* position, int N,
                 int top_k, int C, DType dt, Stream s) {
  OP_SPAN(moe_combine);
  if (is_dry(s)) return;
  if (N <= 0 || C <= 0) return;
  dispatch_width(dt, C, {out, expert_out}, [&](auto tag, auto w) {
    using S = decltype(tag);
    constexpr int W = decltype(w)::value;
    combine_kernel<S, W><<<row_blocks(N), 32 * kRowsPerBlock, 0, s->stream>>>(
        (S*)out, (const S*)expert_out, gate, position, N, top_k, C);
  });
  LAUNCH_CHECK();
}

// C == 0 still launches: every d_gate is then an empty sum, 0.
void moe_combine_backward(void* d_expert_out, float* d_gate, const void* dout,
                          const void* expert_out, const float* gate, const int* position, int N,
                          int top_k, int C, DType dt, Stream s) {
  OP_SPAN(moe_combine_backward);
  if (is_dry(s)) return;
  if (N <= 0) return;
  dispatch_width(dt, C, {d_expert_out, dout, expert_out}, [&](auto tag, auto w) {
    using S = decltype(tag);
    constexpr int W = decltype(w)::value;
    combine_backward_kernel<S, W><<<row_blocks(N), 32 * kRowsPerBlock, 0, s->stream>>>(
        (S*)d_expert_out, d_gate, (const S*)dout, (const S*)expert_out, gate, position, N, top_k,
        C);
  });
  LAUNCH_CHECK();
}

}  // namespace ops
