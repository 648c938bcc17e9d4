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
#include <cuda_fp8.h>

#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"

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

}  // namespace ops
