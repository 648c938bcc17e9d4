// kernels/cuda/reduce.cu - fp32 reductions (sum of squares for the gradient norm, plain sums), the
// step's scalars from every rank's part (sum_parts, grad_norm_and_clip: one thread, in double) and
// elementwise helpers (dst += src, dtype casts, and ring attention's strided column copy with a
// cast, copy_columns).
//
// Reductions are deterministic: two stages with a grid that depends only on n. Stage 1: each
// thread of G blocks accumulates a fixed set of elements (packs of 4 at indices tid, tid+stride,
// ... then the last n % 4 elements), the block reduces its threads with a fixed tree and writes
// one partial into the stream's scratch. Stage 2: a single block reduces the G partials with the
// same fixed tree and adds the total into *out. The element -> thread mapping is the same on the
// vector path (16-byte loads) and on the scalar path (unaligned x), so even the alignment of x
// does not change the bits of the result.
//
// Elementwise ops: grid-stride over packs of 8 elements (16-byte loads and stores), a scalar loop
// in the same kernel for the last n % 8 elements or for unaligned pointers. Casts narrow with
// round-to-nearest-even (__float2bfloat16_rn); a same-type cast is a device copy.
// copy_columns: a grid-stride loop over groups of 8 consecutive columns of one row (16-byte
// vector access when the width, both row strides and both pointers allow it), else over single
// elements; the same conversion as the cast.
// copy_columns has not yet run on a GPU; it runs on the CPU emulator (test/emu/README.md), where
// test/gpu/test_attention_block.cu compares it with the CPU backend's (tested bitwise by
// test/test_attention_block.py).
#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"

namespace ops {
namespace {

constexpr int kThreads = 256;
constexpr int kReduceMaxBlocks = 1024;  // stage-2 block size, so G <= 1024
constexpr int kElems = 8;               // elementwise ops: elements per thread and step


// Sum over the block with a fixed tree; the result is valid in thread 0.
__device__ float block_reduce_sum(float x) {
  __shared__ float warp_sums[32];
  x = warp_reduce_sum(x);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_sums[warp] = x;
  __syncthreads();
  const int warps = blockDim.x / 32;
  x = 0.0f;
  if (warp == 0) {
    x = lane < warps ? warp_sums[lane] : 0.0f;
    x = warp_reduce_sum(x);
  }
  return x;
}

// ---------------------------------------------------------------------------------------------
// Reductions
// ---------------------------------------------------------------------------------------------
template <bool kSquares>
__device__ __forceinline__ float term(float x) {
  return kSquares ? x * x : x;
}

template <bool kSquares, bool kVec>
__global__ void partial_sums_kernel(float* __restrict__ partials, const float* __restrict__ x,
                                    size_t n) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  const size_t packs = n / 4;
  float acc = 0.0f;
  for (size_t i = tid; i < packs; i += stride) {
    float4 q;
    if constexpr (kVec) {
      q = __ldcs(reinterpret_cast<const float4*>(x) + i);
    } else {
      q = make_float4(x[4 * i], x[4 * i + 1], x[4 * i + 2], x[4 * i + 3]);
    }
    acc += term<kSquares>(q.x);
    acc += term<kSquares>(q.y);
    acc += term<kSquares>(q.z);
    acc += term<kSquares>(q.w);
  }
  for (size_t i = packs * 4 + tid; i < n; i += stride) acc += term<kSquares>(x[i]);
  acc = block_reduce_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// One block of kReduceMaxBlocks threads: *out += scale * sum(partials[0..G)).
__global__ void final_sum_kernel(float* out, const float* __restrict__ partials, int G,
                                 float scale) {
  float x = threadIdx.x < G ? partials[threadIdx.x] : 0.0f;
  x = block_reduce_sum(x);
  if (threadIdx.x == 0) *out += scale * x;
}

template <bool kSquares>
void reduce_accumulate(float* out, const float* x, size_t n, float scale, Stream s) {
  if (n == 0) return;
  const int G = (int)std::min<size_t>(ceil_div(n, (size_t)kThreads * 4), kReduceMaxBlocks);
  float* partials = static_cast<float*>(stream_scratch(s, G * sizeof(float)));
  if (aligned16(x))
    partial_sums_kernel<kSquares, true><<<G, kThreads, 0, s->stream>>>(partials, x, n);
  else
    partial_sums_kernel<kSquares, false><<<G, kThreads, 0, s->stream>>>(partials, x, n);
  LAUNCH_CHECK();
  final_sum_kernel<<<1, kReduceMaxBlocks, 0, s->stream>>>(out, partials, G, scale);
  LAUNCH_CHECK();
}

// ---------------------------------------------------------------------------------------------
// Elementwise
// ---------------------------------------------------------------------------------------------

__global__ void add_inplace_kernel(float* __restrict__ dst, const float* __restrict__ src,
                                   size_t packs, size_t tail, size_t n) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  for (size_t i = tid; i < packs; i += stride) {
    float a[kElems], b[kElems];
    load_floats<kElems>(a, dst + i * kElems);
    load_floats<kElems>(b, src + i * kElems);
#pragma unroll
    for (int k = 0; k < kElems; k++) a[k] += b[k];
    store_floats<kElems>(dst + i * kElems, a);
  }
  for (size_t i = tail + tid; i < n; i += stride) dst[i] += src[i];
}

template <typename D, typename S>
__global__ void cast_kernel(D* __restrict__ dst, const S* __restrict__ src, size_t packs,
                            size_t tail, size_t n) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  for (size_t i = tid; i < packs; i += stride) {
    float f[kElems];
    load_floats<kElems>(f, src + i * kElems);
    store_floats<kElems>(dst + i * kElems, f);
  }
  for (size_t i = tail + tid; i < n; i += stride) dst[i] = from_float<D>(to_float(src[i]));
}

// rows x width elements: dst[r * dst_cols + j] = src[r * src_cols + j], converted; W columns
// per step (kElems on the vector path, else 1), groups_per_row = width / W.
template <int W, typename D, typename S>
__global__ void copy_columns_kernel(D* __restrict__ dst, size_t dst_cols,
                                    const S* __restrict__ src, size_t src_cols,
                                    size_t groups_per_row, size_t groups) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < groups; i += stride) {
    const size_t r = i / groups_per_row, j = (i % groups_per_row) * W;
    float f[W];
    load_floats<W>(f, src + r * src_cols + j);
    store_floats<W>(dst + r * dst_cols + j, f);
  }
}

// The step's scalars (ops_decls.h: sum_parts, grad_norm_and_clip): one thread adds the n parts
// in index order in double, as the CPU backend does; a double add, divide and sqrt round
// correctly (IEEE) on the device as on the host, so both backends agree to the bit.
__device__ double sum_in_order(const float* parts, int n) {
  double total = 0.0;
  for (int i = 0; i < n; i++) total += (double)parts[i];
  return total;
}

__global__ void sum_parts_kernel(double* out, const float* parts, int n, double divisor) {
  *out = sum_in_order(parts, n) / divisor;
}

__global__ void grad_norm_and_clip_kernel(double* norm, float* factor, const float* parts, int n,
                                          float grad_clip) {
  const double total = sqrt(sum_in_order(parts, n));
  *norm = total;
  const double coef = grad_clip > 0 ? grad_clip / (total + 1e-6) : 1.0;
  *factor = coef < 1.0 ? (float)coef : 1.0f;
}

}  // namespace

void sum_parts(double* out, const float* parts, int n, double divisor, Stream s) {
  OP_SPAN(sum_parts);
  if (is_dry(s)) return;
  sum_parts_kernel<<<1, 1, 0, s->stream>>>(out, parts, n, divisor);
  LAUNCH_CHECK();
}

void grad_norm_and_clip(double* norm, float* factor, const float* parts, int n, float grad_clip,
                        Stream s) {
  OP_SPAN(grad_norm_and_clip);
  if (is_dry(s)) return;
  grad_norm_and_clip_kernel<<<1, 1, 0, s->stream>>>(norm, factor, parts, n, grad_clip);
  LAUNCH_CHECK();
}

void sum_squares_accumulate(float* out, const float* x, size_t n, Stream s) {
  OP_SPAN(sum_squares_accumulate);
  if (is_dry(s)) return;
  reduce_accumulate<true>(out, x, n, 1.0f, s);
}

void sum_accumulate(float* out, const float* x, size_t n, float scale, Stream s) {
  OP_SPAN(sum_accumulate);
  if (is_dry(s)) return;
  reduce_accumulate<false>(out, x, n, scale, s);
}

void add_inplace(float* dst, const float* src, size_t n, Stream s) {
  OP_SPAN(add_inplace);
  if (is_dry(s)) return;
  if (n == 0) return;
  const ElementwiseSplit sp =
      elementwise_split(n, aligned16(dst) && aligned16(src), kThreads, kElems);
  add_inplace_kernel<<<sp.blocks, kThreads, 0, s->stream>>>(dst, src, sp.packs, sp.tail, n);
  LAUNCH_CHECK();
}

void cast(void* dst, DType dst_dt, const void* src, DType src_dt, size_t n, Stream s) {
  OP_SPAN(cast);
  if (is_dry(s)) return;
  if (n == 0) return;
  if (dst_dt == src_dt) {
    copy_on_device(dst, src, n * dtype_size(dst_dt), s);
    return;
  }
  const ElementwiseSplit sp =
      elementwise_split(n, aligned16(dst) && aligned16(src), kThreads, kElems);
  dispatch_dtype(dst_dt, [&](auto dst_tag) {
    dispatch_dtype(src_dt, [&](auto src_tag) {
      using D = decltype(dst_tag);
      using S = decltype(src_tag);
      cast_kernel<D, S><<<sp.blocks, kThreads, 0, s->stream>>>(
          static_cast<D*>(dst), static_cast<const S*>(src), sp.packs, sp.tail, n);
      LAUNCH_CHECK();
    });
  });
}

void copy_columns(void* dst, int dst_cols, DType dst_dt, const void* src, int src_cols,
                  DType src_dt, int rows, int width, Stream s) {
  OP_SPAN(copy_columns);
  if (is_dry(s)) return;
  if (rows <= 0 || width <= 0) return;
  // Groups of kElems columns start 16-byte aligned in every row when these hold (a float group
  // is two 16-byte packs, a bf16 group one).
  const bool vec = width % kElems == 0 && dst_cols % kElems == 0 && src_cols % kElems == 0 &&
                   aligned16({dst, src});
  const size_t per_row = vec ? width / kElems : width, groups = (size_t)rows * per_row;
  const int blocks = (int)std::min<size_t>(ceil_div(groups, kThreads), 65536);
  dispatch_dtype(dst_dt, [&](auto dst_tag) {
    dispatch_dtype(src_dt, [&](auto src_tag) {
      using D = decltype(dst_tag);
      using S = decltype(src_tag);
      if (vec)
        copy_columns_kernel<kElems, D, S><<<blocks, kThreads, 0, s->stream>>>(
            static_cast<D*>(dst), dst_cols, static_cast<const S*>(src), src_cols, per_row, groups);
      else
        copy_columns_kernel<1, D, S><<<blocks, kThreads, 0, s->stream>>>(
            static_cast<D*>(dst), dst_cols, static_cast<const S*>(src), src_cols, per_row, groups);
      LAUNCH_CHECK();
    });
  });
}

}  // namespace ops
