// kernels/cuda/bias_grad.cu - the bias gradient: dbias[c] += sum_n dout[n, c], fp32 sums,
// deterministic. It backs matmul_backward when cuBLASLt cannot fuse the bias gradient (BGRADB)
// into the weight-gradient GEMM, and the FP8 linear layers (model/fp8.cu), whose GEMM has no
// epilogue.
//
// Pass 1: a grid of (column slabs) x (row chunks). A block is 8 warps; lane l of every warp owns
// one 16-byte pack of columns (8 bf16 or 4 fp32), so a warp reads 512 contiguous bytes of a row;
// warp w takes rows w, w+8, ... of the chunk. The 8 warps' sums meet in shared memory in a fixed
// order and the chunk's sums go to partial[chunk][c]. Pass 2: one thread per column adds its
// chunks, in order, to dbias. Chunks are sized from the shape and the SM count only, so the
// summation order, hence the result, is the same on every call.
#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"

namespace ops {
namespace {

constexpr int kBiasWarps = 8;
constexpr int kBiasMinRowsPerChunk = 4 * kBiasWarps;

template <typename T, bool kVec>
__global__ void __launch_bounds__(32 * kBiasWarps)
    bias_grad_partial_kernel(float* partial, const T* dout, int N, int OC, int rows_per_chunk) {
  constexpr int P = Pack128<T>::size;
  __shared__ float sums[kBiasWarps][32 * P];  // [warp][i * 32 + lane]: column lane * P + i
  const int lane = threadIdx.x, warp = threadIdx.y;
  const int col0 = (blockIdx.x * 32 + lane) * P;
  const int row_end = min(N, (int)blockIdx.y * rows_per_chunk + rows_per_chunk);
  float acc[P] = {};
  if (col0 < OC) {
    for (int row = blockIdx.y * rows_per_chunk + warp; row < row_end; row += kBiasWarps) {
      const T* p = dout + (size_t)row * OC + col0;
      if constexpr (kVec) {
        Pack128<T> v = load128cs(p);
#pragma unroll
        for (int i = 0; i < P; i++) acc[i] += to_float(v[i]);
      } else {
#pragma unroll
        for (int i = 0; i < P; i++)
          if (col0 + i < OC) acc[i] += to_float(p[i]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < P; i++) sums[warp][i * 32 + lane] = acc[i];
  __syncthreads();
  for (int j = warp * 32 + lane; j < 32 * P; j += 32 * kBiasWarps) {
    int col = blockIdx.x * 32 * P + (j % 32) * P + j / 32;
    if (col >= OC) continue;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kBiasWarps; w++) sum += sums[w][j];
    partial[(size_t)blockIdx.y * OC + col] = sum;
  }
}

__global__ void bias_grad_finish_kernel(float* dbias, const float* partial, int chunks, int OC) {
  int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= OC) return;
  float sum = 0.0f;
  for (int c = 0; c < chunks; c++) sum += partial[(size_t)c * OC + col];
  dbias[col] += sum;
}

struct BiasReduction {
  int chunks;          // row chunks = blocks along y = rows of `partial`
  int rows_per_chunk;
  int column_blocks;
};

// About four blocks per SM, each chunk at least kBiasMinRowsPerChunk rows.
BiasReduction plan_bias_reduction(int N, int OC, DType dt) {
  int device = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  int cols_per_block = 32 * (int)(16 / dtype_size(dt));
  BiasReduction r;
  r.column_blocks = (int)ceil_div(OC, cols_per_block);
  int wanted = (int)ceil_div(4 * sms, r.column_blocks);
  int most = (int)ceil_div(N, kBiasMinRowsPerChunk);
  r.chunks = std::max(1, std::min(wanted, most));
  r.rows_per_chunk = (int)ceil_div(N, r.chunks);
  r.chunks = (int)ceil_div(N, r.rows_per_chunk);  // no empty chunk
  return r;
}

void launch_bias_grad_finish(float* dbias, const float* partial, int chunks, int OC, Stream s) {
  bias_grad_finish_kernel<<<(unsigned)ceil_div(OC, 256), 256, 0, s->stream>>>(dbias, partial,
                                                                              chunks, OC);
  LAUNCH_CHECK();
}

void launch_bias_grad(float* dbias, float* partial, const BiasReduction& r, const void* dout,
                      int N, int OC, DType dt, Stream s) {
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    bool vec = OC % Pack128<T>::size == 0 && aligned16(dout);
    auto kernel = vec ? bias_grad_partial_kernel<T, true> : bias_grad_partial_kernel<T, false>;
    dim3 grid(r.column_blocks, r.chunks), block(32, kBiasWarps);
    kernel<<<grid, block, 0, s->stream>>>(partial, (const T*)dout, N, OC, r.rows_per_chunk);
  });
  LAUNCH_CHECK();
  launch_bias_grad_finish(dbias, partial, r.chunks, OC, s);
}

}  // namespace

void bias_backward(float* dbias, const void* dout, int N, int OC, DType dt, Stream s) {
  OP_SPAN(bias_backward);
  if (is_dry(s)) return;
  CHECK(N >= 0 && OC >= 0, "bias_backward: bad shape N=%d OC=%d", N, OC);
  if (N == 0 || OC == 0) return;
  BiasReduction reduction = plan_bias_reduction(N, OC, dt);
  float* partial = (float*)stream_scratch(s, (size_t)reduction.chunks * OC * sizeof(float));
  launch_bias_grad(dbias, partial, reduction, dout, N, OC, dt, s);
}

}  // namespace ops
