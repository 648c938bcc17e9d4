// test/emu/test_counts.cu - kernels of known traffic for the emulator's counter (EMU_COUNTS,
// test/emu/counts.cpp), run by test/emu/test_counts.py, which holds the JSON they leave to what
// each must move and compute:
//   copy_floats       N floats in, N out: 4N bytes read and 4N written, accessed the same
//   copy_float4s      the same through 16-byte vector loads and stores
//   pack_copy         the same through cuda_common.cuh's load_floats / store_floats (16-byte packs)
//   scale_in_place    x = 2x: the store after the load of the same address counts too (4N, 4N)
//   reread            every one of 4 blocks reads all N floats and writes one: 4N distinct bytes
//                     read, 4 x 4N accessed; 4 floats written, one 32-byte sector
//   atomic_adds       N int atomicAdds to 8 counters: a write each (GCC instruments an atomic as
//                     a store): 32 bytes written (one sector), 4N accessed, nothing read
//   cp_async_tile     32 threads, 16 bytes each by cp.async into shared memory: 512 bytes read
//   mma_tiles         2 warps x 3 mma.m16n8k16: 6 x 2 x 16 x 8 x 16 = 24576 tensor FLOPs
//   cublasLtMatmul    an fp32 GEMM m 16, n 8, k 32: 2MNK = 8192 FLOPs, A and B (3072 bytes) read,
//                     D (512) written
// The order check runs every launch twice (EMU_ORDER=forward,reverse): only the first run counts.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/cuda/attention_ptx.cuh"
#include "kernels/cuda/cuda_common.cuh"

namespace {

using namespace attention_tiles;
constexpr int N = 1000;  // 4000 bytes: 125 whole sectors

__global__ void copy_floats(float* out, const float* in, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i];
}

__global__ void copy_float4s(float4* out, const float4* in, int n4) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n4) out[i] = in[i];
}

__global__ void pack_copy(float* out, const float* in, int n8) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  float f[8];
  if (i >= n8) return;
  load_floats<8>(f, in + 8 * i);
  store_floats<8>(out + 8 * i, f);
}

__global__ void scale_in_place(float* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = 2.0f * x[i];
}

__global__ void reread(float* out, const float* in, int n) {
  if (threadIdx.x != 0) return;
  float sum = 0.0f;
  for (int i = 0; i < n; i++) sum += in[i];
  out[blockIdx.x] = sum;
}

__global__ void atomic_adds(int* counters, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) atomicAdd(&counters[i % 8], 1);
}

__global__ void cp_async_tile(float* out, const float* in) {
  __shared__ __align__(16) float tile[128];
  cp_async_16(&tile[threadIdx.x * 4], &in[threadIdx.x * 4], true);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  if (threadIdx.x == 0) out[0] = tile[127];
}

__global__ void mma_tiles(float* out) {
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const uint32_t a[4] = {0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u};  // bf16 ones
  for (int r = 0; r < 3; r++) mma_bf16(d, a, 0x3f803f80u, 0x3f803f80u);
  if (threadIdx.x == 0) out[blockIdx.x] = d[0];  // 3 x 16 = 48
}

float* device_floats(size_t n, float value) {
  void* p = nullptr;
  if (cudaMalloc(&p, n * sizeof(float)) != cudaSuccess) std::abort();
  std::vector<float> h(n, value);
  cudaMemcpy(p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  return static_cast<float*>(p);
}

void gemm() {
  const int m = 16, n = 8, k = 32;
  float* A = device_floats(m * k, 1.0f);
  float* B = device_floats(k * n, 1.0f);
  float* D = device_floats(m * n, 0.0f);
  cublasLtHandle_t lt;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, d;
  cublasLtCreate(&lt);
  cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  cublasLtMatrixLayoutCreate(&a, CUDA_R_32F, m, k, m);  // column-major, no transposes
  cublasLtMatrixLayoutCreate(&b, CUDA_R_32F, k, n, k);
  cublasLtMatrixLayoutCreate(&d, CUDA_R_32F, m, n, m);
  const float alpha = 1.0f, beta = 0.0f;
  if (cublasLtMatmul(lt, desc, &alpha, A, a, B, b, &beta, D, d, D, d, nullptr, nullptr, 0,
                     nullptr) != CUBLAS_STATUS_SUCCESS)
    std::abort();
  std::vector<float> h(m * n);
  cudaMemcpy(h.data(), D, h.size() * sizeof(float), cudaMemcpyDeviceToHost);
  if (h[0] != (float)k) std::abort();
  cublasLtMatrixLayoutDestroy(d);
  cublasLtMatrixLayoutDestroy(b);
  cublasLtMatrixLayoutDestroy(a);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(lt);
}

}  // namespace

int main() {
  float* in = device_floats(N, 1.0f);
  float* out = device_floats(N, 0.0f);
  copy_floats<<<(N + 127) / 128, 128>>>(out, in, N);
  copy_float4s<<<2, 128>>>(reinterpret_cast<float4*>(out), reinterpret_cast<const float4*>(in),
                           N / 4);
  pack_copy<<<1, 128>>>(out, in, N / 8);
  scale_in_place<<<(N + 127) / 128, 128>>>(out, N);
  reread<<<4, 32>>>(out, in, N);
  int* counters = reinterpret_cast<int*>(device_floats(8, 0.0f));
  cudaMemset(counters, 0, 8 * sizeof(int));
  atomic_adds<<<(N + 127) / 128, 128>>>(counters, N);
  cp_async_tile<<<1, 32>>>(out, in);
  mma_tiles<<<1, 64>>>(out);
  gemm();
  std::vector<float> h(2);
  cudaMemcpy(h.data(), out, 2 * sizeof(float), cudaMemcpyDeviceToHost);
  if (h[0] != 48.0f) {
    std::printf("mma_tiles: %g, want 48\n", h[0]);
    return 1;
  }
  std::printf("test_counts: kernels ran\n");
  return 0;
}
