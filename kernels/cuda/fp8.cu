// kernels/cuda/fp8.cu - the FP8 recipe's small kernels: amax (max |x|), the scale update of the
// current and delayed recipes, and the scaled cast to FP8 with its optional transposed copy.
// The FP8 GEMM itself is in kernels/cuda/matmul.cu.
//
// amax. One kernel after a 4-byte memset of *out to 0 (so n == 0 gives 0 and launches nothing).
// Grid-stride over 16-byte packs (scalar for the tail or a misaligned x); each thread keeps the
// bit pattern of its largest |x| as an unsigned int. |x| has its sign bit clear, and for
// non-negative IEEE floats the unsigned order of the bits is the order of the values, with every
// NaN (exponent all ones, mantissa != 0) above +inf: so an integer max is a float max in which
// NaN wins, i.e. NaN propagates as the CPU's does. The warp reduces with __reduce_max_sync, the
// block through shared memory, and one atomicMax per block on *out's bits. (A NaN result may
// carry another payload than the CPU's; it is a NaN all the same.) The result is exact and
// independent of the order: max is associative.
//
// fp8_update_scale. One thread, the CPU's arithmetic step for step in fp32 (fmaxf over the
// history, fp8_max / a / 2^margin with 2^margin from ldexpf, 1 / scale); without --use_fast_math
// '/' is IEEE division, so the scale is bit-identical to the CPU's.
//
// fp8_cast. 64 x 64 tiles, 256 threads per block. Phase 1: each thread takes 8 consecutive
// elements of a tile row (one or two 16-byte loads on the vector path), scales, converts with
// the hardware's cvt.rn.satfinite (round to nearest even, saturating: exactly kernels/fp8.h),
// writes the 8 codes to `out` (when given) as one 8-byte store (a warp writes four 64-byte row
// segments) and to a shared tile. Phase 2 (only with out_t): each thread gathers 8 consecutive tile rows of one
// tile column from shared memory and writes them as one 8-byte store into out_t's row, so the
// transposed writes are coalesced too. The shared tile's rows are padded to 72 bytes; the
// column gather still has 2-way bank conflicts, cheap next to the global traffic.
// Checked on the host against CUDA's own software emulation of this conversion (the path
// __nv_cvt_float_to_fp8 takes outside device code): identical to kernels/fp8.h for every non-NaN
// fp32 input sampled (2^32 / 97 bit patterns, infinities, subnormals and ties included), both
// formats. NaN differs: the CPU gives 0x7F | sign, CUDA the canonical NaN 0x7F without the sign,
// so a negative NaN casts to 0xFF on the CPU and 0x7F here. Training never casts NaN (a NaN amax
// stops it first), and the tests do not either. (Not yet run on a GPU.)
//
// fp8_cast_blocks (rowwise, blockwise, mxfp8). One thread block per scale block: its threads
// stride over the block's elements once for the amax (max of |x| bits, as amax above: NaN wins),
// one thread turns it into the power-of-two scale (kernels/fp8.h fp8_block_scale_inv, the same
// function the CPU calls), then they stride again to cast. With transpose the reads walk x's
// columns: uncoalesced. Simple and exact, not tuned (a 1 x 32 block uses one warp).
//
// gemm_fp8_blocks: the dequantise-in-the-loop path. Each operand is decoded into bf16 in the
// caller's workspace (code * scale_inv: exact, the scales being powers of two), then the bf16
// GEMM of kernels/cuda/matmul.cu runs (fp32 accumulation, as cuBLASLt's FP8 GEMM). Slower than a
// native scaled FP8 GEMM: two extra passes writing 2 bytes per element and a bf16 GEMM at half
// the FP8 tensor-core rate. The native path is cuBLASLt's scale modes (cublasLt.h of CUDA 13,
// CUBLASLT_MATMUL_DESC_A/B_SCALE_MODE): OUTER_VEC_32F (one fp32 per row of A and of B:
// rowwise), VEC128_32F and BLK128x128_32F (1 x 128 and 128 x 128 fp32 scales: blockwise;
// cuBLAS 12.9 or later, Hopper sm_90), VEC32_UE8M0 (MXFP8; Blackwell sm_100 only, with scales
// in cuBLASLt's own swizzled tile layout). Not used yet: not run on such hardware here.
#include <cuda_fp8.h>

#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/fp8.h"

namespace ops {
namespace {

constexpr int kThreads = 256;
constexpr int kAmaxMaxBlocks = 1024;
constexpr int kTile = 64;         // fp8_cast tile: kTile x kTile elements
constexpr int kGroup = 8;         // consecutive elements per thread in fp8_cast
constexpr int kTilePitch = kTile + 8;  // shared tile row, bytes (8-byte aligned rows)

// ---------------------------------------------------------------------------------------------
// amax
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ unsigned abs_bits(float x) { return __float_as_uint(x) & 0x7FFFFFFFu; }

template <typename T, bool kVec>
__global__ void amax_kernel(unsigned* out, const T* __restrict__ x, size_t n) {
  constexpr int P = Pack128<T>::size;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  size_t tail = 0;  // [0, tail): 16-byte packs; [tail, n): one by one
  unsigned m = 0;
  if constexpr (kVec) {
    tail = n / P * P;
    for (size_t i = tid; i < n / P; i += stride) {
      Pack128<T> v = load128cs(x + i * P);
#pragma unroll
      for (int k = 0; k < P; k++) m = max(m, abs_bits(to_float(v[k])));
    }
  }
  for (size_t i = tail + tid; i < n; i += stride) m = max(m, abs_bits(to_float(x[i])));
  __shared__ unsigned warp_max[kThreads / 32];
  m = __reduce_max_sync(0xffffffffu, m);
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x < 32) {
    m = threadIdx.x < kThreads / 32 ? warp_max[threadIdx.x] : 0u;
    m = __reduce_max_sync(0xffffffffu, m);
    if (threadIdx.x == 0) atomicMax(out, m);
  }
}

// ---------------------------------------------------------------------------------------------
// Scale update (one thread)
// ---------------------------------------------------------------------------------------------
__global__ void update_scale_kernel(float* scale, float* scale_inv, float* history,
                                    int history_len, const float* amax, float fp8_max,
                                    int margin) {
  const float now = *amax;
  float a = now;
  if (history_len > 0) {
    float past = 0.0f;
    for (int i = 0; i < history_len; i++) past = fmaxf(past, history[i]);
    if (past > 0.0f) a = past;
    for (int i = history_len - 1; i > 0; i--) history[i] = history[i - 1];
    history[0] = now;
  }
  const float sc = isfinite(a) && a > 0.0f ? fp8_max / a / ldexpf(1.0f, margin) : 1.0f;
  *scale = sc;
  *scale_inv = 1.0f / sc;
}

// ---------------------------------------------------------------------------------------------
// Cast (+ transpose)
// ---------------------------------------------------------------------------------------------
template <__nv_fp8_interpretation_t kFormat>
__device__ __forceinline__ uint8_t to_fp8(float v) {
  return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, kFormat);
}

// Tile rows of kTile elements in groups of kGroup: kTile / kGroup groups per row, so a block
// covers kThreads / (kTile / kGroup) rows per pass.
constexpr int kGroupsPerRow = kTile / kGroup;
constexpr int kRowsPerPass = kThreads / kGroupsPerRow;

// kVec: rows and cols multiples of kGroup, x 16-byte aligned, out/out_t 8-byte aligned; then
// every group lies wholly inside the matrix or wholly outside, and loads/stores are vectors.
template <typename T, __nv_fp8_interpretation_t kFormat, bool kVec>
__global__ void __launch_bounds__(kThreads)
    cast_fp8_kernel(uint8_t* __restrict__ out, uint8_t* __restrict__ out_t,
                    const T* __restrict__ x, int rows, int cols, const float* scale) {
  __shared__ __align__(16) uint8_t tile[kTile][kTilePitch];
  const float sc = *scale;
  const int row0 = blockIdx.y * kTile, col0 = blockIdx.x * kTile;
  const int g = threadIdx.x % kGroupsPerRow, r_in = threadIdx.x / kGroupsPerRow;
  for (int r = r_in; r < kTile; r += kRowsPerPass) {  // phase 1: rows of the tile
    const int row = row0 + r, col = col0 + g * kGroup;
    alignas(8) uint8_t q[kGroup] = {};
    if (kVec && row < rows && col < cols) {
      float f[kGroup];
      load_floats<kGroup>(f, x + (size_t)row * cols + col);
#pragma unroll
      for (int j = 0; j < kGroup; j++) q[j] = to_fp8<kFormat>(f[j] * sc);
      if (out)
        *reinterpret_cast<uint2*>(out + (size_t)row * cols + col) = *reinterpret_cast<uint2*>(q);
    } else if (!kVec) {
#pragma unroll
      for (int j = 0; j < kGroup; j++) {
        const bool inside = row < rows && col + j < cols;
        q[j] = inside ? to_fp8<kFormat>(to_float(x[(size_t)row * cols + col + j]) * sc) : 0;
        if (inside && out) out[(size_t)row * cols + col + j] = q[j];
      }
    }
    *reinterpret_cast<uint2*>(&tile[r][g * kGroup]) = *reinterpret_cast<uint2*>(q);
  }
  if (!out_t) return;  // uniform over the block
  __syncthreads();
  for (int c = r_in; c < kTile; c += kRowsPerPass) {  // phase 2: rows of out_t's tile
    const int trow = col0 + c, tcol = row0 + g * kGroup;  // out_t is cols x rows
    alignas(8) uint8_t q[kGroup];
#pragma unroll
    for (int j = 0; j < kGroup; j++) q[j] = tile[g * kGroup + j][c];
    if (kVec) {
      if (trow < cols && tcol < rows)
        *reinterpret_cast<uint2*>(out_t + (size_t)trow * rows + tcol) =
            *reinterpret_cast<uint2*>(q);
    } else {
#pragma unroll
      for (int j = 0; j < kGroup; j++)
        if (trow < cols && tcol + j < rows) out_t[(size_t)trow * rows + tcol + j] = q[j];
    }
  }
}

bool aligned8(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 7) == 0; }

template <typename T, __nv_fp8_interpretation_t kFormat>
void launch_cast(void* out, void* out_t, const void* x, int rows, int cols, const float* scale,
                 Stream s) {
  const bool vec = rows % kGroup == 0 && cols % kGroup == 0 && aligned16(x) && aligned8(out) &&
                   (!out_t || aligned8(out_t));  // aligned8(nullptr): true
  auto kernel = vec ? cast_fp8_kernel<T, kFormat, true> : cast_fp8_kernel<T, kFormat, false>;
  const dim3 grid((unsigned)ceil_div(cols, kTile), (unsigned)ceil_div(rows, kTile));
  kernel<<<grid, kThreads, 0, s->stream>>>((uint8_t*)out, (uint8_t*)out_t, (const T*)x, rows,
                                           cols, scale);
  LAUNCH_CHECK();
}

// ---------------------------------------------------------------------------------------------
// Block-scaled cast and the dequantise-in-the-loop GEMM
// ---------------------------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ float logical_at(const T* x, int cols, bool transpose, int i, int j) {
  return to_float(transpose ? x[(size_t)j * cols + i] : x[(size_t)i * cols + j]);
}

template <typename T, __nv_fp8_interpretation_t kFormat>
__global__ void cast_blocks_kernel(uint8_t* __restrict__ out, float* __restrict__ scale_inv,
                                   const T* __restrict__ x, int cols, bool transpose, int R,
                                   int C, int block_rows, int block_cols, int grid_cols,
                                   float fp8_max, int emax, bool e8m0, int margin) {
  const int b = blockIdx.x;
  const int i0 = b / grid_cols * block_rows, j0 = b % grid_cols * block_cols;
  const int h = min(block_rows, R - i0), w = min(block_cols, C - j0);
  const int n = h * w;
  unsigned m = 0;
  for (int e = threadIdx.x; e < n; e += blockDim.x)
    m = max(m, abs_bits(logical_at(x, cols, transpose, i0 + e / w, j0 + e % w)));
  __shared__ unsigned warp_max[kThreads / 32];
  __shared__ float block_scale;
  m = __reduce_max_sync(0xffffffffu, m);
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int k = 1; k < (int)blockDim.x / 32; k++) m = max(m, warp_max[k]);
    const float inv = fp8_block_scale_inv(__uint_as_float(m), fp8_max, emax, e8m0, margin);
    scale_inv[b] = inv;
    block_scale = 1.0f / inv;  // exact: a power of two
  }
  __syncthreads();
  const float sc = block_scale;
  for (int e = threadIdx.x; e < n; e += blockDim.x) {
    const int i = i0 + e / w, j = j0 + e % w;
    out[(size_t)i * C + j] = to_fp8<kFormat>(logical_at(x, cols, transpose, i, j) * sc);
  }
}

// out (bf16) = code * scale_inv of its block, for q (R x K); with transpose out is K x R.
template <__nv_fp8_interpretation_t kFormat>
__global__ void dequantize_blocks_kernel(__nv_bfloat16* __restrict__ out,
                                         const uint8_t* __restrict__ q,
                                         const float* __restrict__ scale_inv, int R, int K,
                                         int block_rows, int block_cols, bool transpose) {
  const int grid_cols = (K + block_cols - 1) / block_cols;
  const size_t n = (size_t)R * K, stride = (size_t)gridDim.x * blockDim.x;
  for (size_t at = blockIdx.x * (size_t)blockDim.x + threadIdx.x; at < n; at += stride) {
    const int i = (int)(at / K), j = (int)(at % K);
    __half_raw raw = __nv_cvt_fp8_to_halfraw(q[at], kFormat);
    const float v = __half2float(__half(raw)) *
                    scale_inv[(size_t)(i / block_rows) * grid_cols + j / block_cols];
    out[transpose ? (size_t)j * R + i : at] = __float2bfloat16_rn(v);
  }
}

void launch_dequantize(void* out, const void* q, DType fp8, const float* scale_inv, int R, int K,
                       int block_rows, int block_cols, bool transpose, Stream s) {
  const size_t n = (size_t)R * K;
  const int blocks = (int)std::min(ceil_div(n, (size_t)kThreads), (size_t)65535);
  auto kernel = fp8 == DType::E4M3 ? dequantize_blocks_kernel<__NV_E4M3>
                                   : dequantize_blocks_kernel<__NV_E5M2>;
  kernel<<<blocks, kThreads, 0, s->stream>>>((__nv_bfloat16*)out, (const uint8_t*)q, scale_inv,
                                             R, K, block_rows, block_cols, transpose);
  LAUNCH_CHECK();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The ops
// ---------------------------------------------------------------------------------------------
bool device_supports_fp8() {
  int device = 0, major = 0, minor = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor >= 89;
}

void amax(float* out, const void* x, size_t n, DType dt, Stream s) {
  OP_SPAN(amax);
  if (is_dry(s)) return;
  CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(float), s->stream));  // +0.0f: the n == 0 answer
  if (n == 0) return;
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    const bool vec = aligned16(x);
    const size_t work = vec ? std::max(n / Pack128<T>::size, n % Pack128<T>::size) : n;
    const int blocks = (int)std::min(ceil_div(work, (size_t)kThreads), (size_t)kAmaxMaxBlocks);
    auto kernel = vec ? amax_kernel<T, true> : amax_kernel<T, false>;
    kernel<<<blocks, kThreads, 0, s->stream>>>((unsigned*)out, (const T*)x, n);
  });
  LAUNCH_CHECK();
}

void fp8_update_scale(float* scale, float* scale_inv, float* history, int history_len,
                      const float* amax, float fp8_max, int margin, Stream s) {
  OP_SPAN(fp8_update_scale);
  if (is_dry(s)) return;
  CHECK(history_len >= 0 && (history_len == 0 || history), "fp8_update_scale: history %d",
        history_len);
  update_scale_kernel<<<1, 1, 0, s->stream>>>(scale, scale_inv, history, history_len, amax,
                                              fp8_max, margin);
  LAUNCH_CHECK();
}

void fp8_cast(void* out, void* out_t, DType fp8, const void* x, DType dt, int rows, int cols,
              const float* scale, Stream s) {
  OP_SPAN(fp8_cast);
  if (is_dry(s)) return;
  CHECK(rows >= 0 && cols >= 0, "fp8_cast: bad shape %d x %d", rows, cols);
  CHECK(out || out_t, "fp8_cast: no output");
  CHECK(fp8 == DType::E4M3 || fp8 == DType::E5M2, "fp8_cast: %s is not FP8", dtype_name(fp8));
  CHECK((size_t)ceil_div(rows, kTile) <= 65535, "fp8_cast: %d rows", rows);
  if (rows == 0 || cols == 0) return;
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    if (fp8 == DType::E4M3) launch_cast<T, __NV_E4M3>(out, out_t, x, rows, cols, scale, s);
    else launch_cast<T, __NV_E5M2>(out, out_t, x, rows, cols, scale, s);
  });
}

void fp8_cast_blocks(void* out, float* scale_inv, DType fp8, const void* x, DType dt, int rows,
                     int cols, bool transpose, int block_rows, int block_cols, bool e8m0,
                     int margin, Stream s) {
  OP_SPAN(fp8_cast_blocks);
  if (is_dry(s)) return;
  check_fp8_cast_blocks(fp8, rows, cols, block_rows, block_cols);
  const int R = transpose ? cols : rows, C = transpose ? rows : cols;
  if (R == 0 || C == 0) return;
  const int grid_rows = (int)ceil_div(R, block_rows), grid_cols = (int)ceil_div(C, block_cols);
  const size_t blocks = (size_t)grid_rows * grid_cols;
  CHECK(blocks <= 0x7FFFFFFF, "fp8_cast_blocks: %zu blocks", blocks);
  const size_t per_block = (size_t)std::min(block_rows, R) * std::min(block_cols, C);
  const int threads = (int)std::min((size_t)kThreads, round_up(per_block, (size_t)32));
  const Fp8Format f = fp8_format(fp8);
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    auto kernel = fp8 == DType::E4M3 ? cast_blocks_kernel<T, __NV_E4M3>
                                     : cast_blocks_kernel<T, __NV_E5M2>;
    kernel<<<(unsigned)blocks, threads, 0, s->stream>>>(
        (uint8_t*)out, scale_inv, (const T*)x, cols, transpose, R, C, block_rows, block_cols,
        grid_cols, f.max_finite, f.emax, e8m0, margin);
  });
  LAUNCH_CHECK();
}

void gemm_fp8_blocks(void* out, DType out_dt, bool accumulate, const void* a, DType a_fp8,
                     const float* a_scale_inv, int a_block_rows, int a_block_cols, const void* b,
                     DType b_fp8, const float* b_scale_inv, int b_block_rows, int b_block_cols,
                     int M, int N, int K, void* workspace, Stream s) {
  OP_SPAN(gemm_fp8_blocks);
  if (is_dry(s)) return;
  CHECK(out_dt == DType::F32 || (out_dt == DType::BF16 && !accumulate),
        "gemm_fp8_blocks: output %s%s", dtype_name(out_dt), accumulate ? " with accumulate" : "");
  CHECK(M > 0 && N > 0 && K > 0 && workspace, "gemm_fp8_blocks: M=%d N=%d K=%d workspace %p", M,
        N, K, workspace);
  void* a16 = workspace;
  void* b16 = (char*)workspace + (size_t)M * K * 2;
  // With accumulate, the bf16 weight-gradient GEMM (dweight += dout^T inp) takes its operands
  // K-major the other way round: dequantise them transposed, A^T (K x M) and B^T (K x N).
  launch_dequantize(a16, a, a_fp8, a_scale_inv, M, K, a_block_rows, a_block_cols, accumulate, s);
  launch_dequantize(b16, b, b_fp8, b_scale_inv, N, K, b_block_rows, b_block_cols, accumulate, s);
  if (accumulate)  // out (M x N) += (A^T)^T (K x M)^T . B^T (K x N)
    matmul_backward(nullptr, (float*)out, nullptr, a16, b16, nullptr, nullptr, K, N, M,
                    DType::BF16, s);
  else  // out (M x N) = A (M x K) . B (N x K)^T
    matmul_forward(out, nullptr, a16, b16, nullptr, nullptr, M, K, N, DType::BF16, s);
}

}  // namespace ops
