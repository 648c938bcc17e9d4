// test/emu/test_emu.cu - the emulator's own tests: small kernels, compiled through the emulator
// like kernels/cuda, each checking one thing the emulated tier must get right against a reference
// written here from the CUDA Programming Guide and the PTX ISA (not from the emulator's code):
//
//   indices      threadIdx/blockIdx/blockDim/gridDim of a 3-D grid of 3-D blocks
//   shuffles     __shfl_xor/down/up/_sync at widths 32 and 8, __reduce_max_sync
//   barrier      shared memory + __syncthreads: a block of 200 threads reverses its slice
//   ldmatrix, mma, cp.async, fp8: see test_emu_ptx.cu
//   launch       a refused launch (49 KiB of dynamic shared memory without the opt-in) sets
//                cudaErrorInvalidValue and runs nothing; with the opt-in it runs
//   copies       cudaMemcpy past the end of a cudaMalloc allocation fails
//
// and, in child processes that must die with the right message (--case NAME runs one):
//   race         a block reduction without its __syncthreads, under EMU_ORDER=forward,reverse
//   deadlock     half a warp at __syncwarp, the other half at __syncthreads
//   divergent    two different __syncthreads met by one block
//   early_exit   __syncthreads after some threads of the block returned
//   exited_lane  a full-mask shuffle after lane 31 returned
//   bounds       a launch of more threads than __launch_bounds__ allows
//   big_static   more than 48 KiB of static __shared__
//   shared_oob   one element past a __shared__ array (AddressSanitizer build only: must report)
//   misaligned   an int4 load from an address 4 bytes past 16-byte alignment (same build, with
//                -fsanitize=alignment: a GPU faults on it)
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "test/emu/test_emu.h"

int checks = 0, failures = 0;

namespace {

// --- indices ------------------------------------------------------------------------------------
__global__ void indices_kernel(unsigned* out) {
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned per_block = blockDim.x * blockDim.y * blockDim.z;
  unsigned* o = out + 4 * (block * per_block + thread);
  o[0] = threadIdx.x | threadIdx.y << 8 | threadIdx.z << 16;
  o[1] = blockIdx.x | blockIdx.y << 8 | blockIdx.z << 16;
  o[2] = blockDim.x | blockDim.y << 8 | blockDim.z << 16;
  o[3] = gridDim.x | gridDim.y << 8 | gridDim.z << 16;
}

void test_indices() {
  const dim3 grid(3, 2, 2), block(5, 3, 2);
  const size_t n = 12 * 30;
  unsigned* d = device<unsigned>(4 * n);
  indices_kernel<<<grid, block>>>(d);
  std::vector<unsigned> h = host(d, 4 * n);
  size_t bad = 0;
  for (unsigned bz = 0; bz < 2; bz++)
    for (unsigned by = 0; by < 2; by++)
      for (unsigned bx = 0; bx < 3; bx++)
        for (unsigned tz = 0; tz < 2; tz++)
          for (unsigned ty = 0; ty < 3; ty++)
            for (unsigned tx = 0; tx < 5; tx++) {
              const size_t i = ((bx + 3 * (by + 2 * bz)) * 30 + tx + 5 * (ty + 3 * tz)) * 4;
              bad += h[i] != (tx | ty << 8 | tz << 16) || h[i + 1] != (bx | by << 8 | bz << 16) ||
                     h[i + 2] != (5u | 3u << 8 | 2u << 16) || h[i + 3] != (3u | 2u << 8 | 2u << 16);
            }
  check(bad == 0, "threadIdx, blockIdx, blockDim, gridDim of a (3,2,2) x (5,3,2) launch");
  cudaFree(d);
}

// --- shuffles -----------------------------------------------------------------------------------
__global__ void shuffle_kernel(int* out, const int* in, unsigned* maxes, const unsigned* values) {
  const int lane = threadIdx.x % 32, t = threadIdx.x;
  const int v = in[t];
  int* o = out + 8 * t;
  o[0] = __shfl_xor_sync(0xffffffffu, v, 5);
  o[1] = __shfl_xor_sync(0xffffffffu, v, 12, 8);
  o[2] = __shfl_down_sync(0xffffffffu, v, 3);
  o[3] = __shfl_down_sync(0xffffffffu, v, 3, 8);
  o[4] = __shfl_up_sync(0xffffffffu, v, 2);
  o[5] = __shfl_up_sync(0xffffffffu, v, 2, 8);
  o[6] = __shfl_sync(0xffffffffu, v, 7);
  o[7] = lane < 16 ? __shfl_xor_sync(0x0000ffffu, v, 1) : __shfl_xor_sync(0xffff0000u, v, 2);
  maxes[t] = __reduce_max_sync(0xffffffffu, values[t]);
}

// The Programming Guide's definitions, per lane of a warp whose values are v[0..31].
int expected_shuffle(const int* v, int lane, int which) {
  const int seg8 = lane & ~7;
  switch (which) {
    case 0: return v[lane ^ 5];
    case 1: return (lane ^ 12) >= seg8 + 8 ? v[lane] : v[lane ^ 12];
    case 2: return lane + 3 < 32 ? v[lane + 3] : v[lane];
    case 3: return lane + 3 < seg8 + 8 ? v[lane + 3] : v[lane];
    case 4: return lane - 2 >= 0 ? v[lane - 2] : v[lane];
    case 5: return lane - 2 >= seg8 ? v[lane - 2] : v[lane];
    case 6: return v[7];
    default: return lane < 16 ? v[lane ^ 1] : v[lane ^ 2];
  }
}

void test_shuffles() {
  std::mt19937 rng(7);
  const int n = 64;
  std::vector<int> in(n);
  std::vector<unsigned> values(n);
  for (int i = 0; i < n; i++) {
    in[i] = (int)(rng() % 100000);
    values[i] = rng();
  }
  int* d_in = device<int>(n);
  int* d_out = device<int>(8 * n);
  unsigned* d_values = device<unsigned>(n);
  unsigned* d_maxes = device<unsigned>(n);
  upload(d_in, in);
  upload(d_values, values);
  shuffle_kernel<<<1, n>>>(d_out, d_in, d_maxes, d_values);
  std::vector<int> out = host(d_out, 8 * n);
  std::vector<unsigned> maxes = host(d_maxes, n);
  const char* names[8] = {"xor 5", "xor 12 width 8", "down 3", "down 3 width 8", "up 2",
                          "up 2 width 8", "idx 7", "xor with half-warp masks"};
  for (int which = 0; which < 8; which++) {
    int bad = 0;
    for (int t = 0; t < n; t++)
      bad += out[8 * t + which] != expected_shuffle(&in[t / 32 * 32], t % 32, which);
    check(bad == 0, std::string("__shfl_*_sync ") + names[which]);
  }
  int bad = 0;
  for (int t = 0; t < n; t++) {
    unsigned m = 0;
    for (int l = 0; l < 32; l++) m = std::max(m, values[t / 32 * 32 + l]);
    bad += maxes[t] != m;
  }
  check(bad == 0, "__reduce_max_sync (unsigned)");
  for (void* p : {(void*)d_in, (void*)d_out, (void*)d_values, (void*)d_maxes}) cudaFree(p);
}

// --- barrier and shared memory ------------------------------------------------------------------
constexpr int kReverseThreads = 200;
__global__ void reverse_kernel(float* out, const float* in) {
  __shared__ float tile[kReverseThreads];
  const int base = blockIdx.x * kReverseThreads, t = threadIdx.x;
  tile[t] = in[base + t];
  __syncthreads();
  out[base + t] = tile[kReverseThreads - 1 - t];
}

void test_barrier() {
  const int blocks = 3, n = blocks * kReverseThreads;
  std::vector<float> in(n);
  for (int i = 0; i < n; i++) in[i] = (float)i * 0.5f;
  float* d_in = device<float>(n);
  float* d_out = device<float>(n);
  upload(d_in, in);
  reverse_kernel<<<blocks, kReverseThreads>>>(d_out, d_in);
  std::vector<float> out = host(d_out, n);
  int bad = 0;
  for (int b = 0; b < blocks; b++)
    for (int t = 0; t < kReverseThreads; t++)
      bad += out[b * kReverseThreads + t] != in[b * kReverseThreads + kReverseThreads - 1 - t];
  check(bad == 0, "__shared__ + __syncthreads: 3 blocks of 200 threads reverse their slices");
  cudaFree(d_in);
  cudaFree(d_out);
}

// --- launch configuration and copies ------------------------------------------------------------
__global__ void dynamic_smem_kernel(float* out, int n) {
  extern __shared__ float buf[];
  buf[n - 1] = 3.0f;
  __syncthreads();
  if (threadIdx.x == 0) *out = buf[n - 1];
}

void test_launch_checks() {
  float* d = device<float>(1);
  const float poison = -7.0f;
  const int n = 49 * 1024 / 4;
  upload(d, std::vector<float>{poison});
  dynamic_smem_kernel<<<1, 32, n * 4>>>(d, n);
  check(cudaGetLastError() == cudaErrorInvalidValue && host(d, 1)[0] == poison,
        "49 KiB of dynamic shared memory without the opt-in: refused, nothing ran");
  check(cudaGetLastError() == cudaSuccess, "cudaGetLastError clears the error");
  cudaFuncSetAttribute(dynamic_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, n * 4);
  dynamic_smem_kernel<<<1, 32, n * 4>>>(d, n);
  check(cudaGetLastError() == cudaSuccess && host(d, 1)[0] == 3.0f,
        "with cudaFuncAttributeMaxDynamicSharedMemorySize: runs");
  dynamic_smem_kernel<<<1, 1025>>>(d, 1);
  check(cudaGetLastError() == cudaErrorInvalidConfiguration, "1025 threads per block: refused");
  std::vector<float> h(4);
  check(cudaMemcpy(d, h.data(), 8, cudaMemcpyHostToDevice) == cudaErrorInvalidValue,
        "cudaMemcpy of 8 bytes into a 4-byte allocation: cudaErrorInvalidValue");
  cudaGetLastError();
  cudaFree(d);
}

// --- cases that must fail, run in a child process -----------------------------------------------
__global__ void racy_sum_kernel(float* out, const float* in) {
  __shared__ float partial[8];
  float x = in[threadIdx.x];
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = x;
  // (the __syncthreads that belongs here is missing)
  if (threadIdx.x == 0) {
    float s = 0.0f;
    for (int w = 0; w < 8; w++) s += partial[w];
    *out = s;
  }
}
__global__ void deadlock_kernel() {
  if (threadIdx.x < 16) __syncwarp();
  else __syncthreads();
}
__global__ void divergent_barrier_kernel() {
  if (threadIdx.x < 32) __syncthreads();
  else __syncthreads();
}
__global__ void early_exit_kernel(float* out) {
  if (threadIdx.x >= 40) return;
  __syncthreads();
  out[threadIdx.x] = 1.0f;
}
__global__ void exited_lane_kernel(float* out) {
  if (threadIdx.x == 31) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}
__global__ void __launch_bounds__(64) bounded_kernel(float* out) { out[threadIdx.x] = 1.0f; }
__global__ void big_static_kernel(float* out) {
  __shared__ float big[13000];  // 52 KB
  big[threadIdx.x] = 1.0f;
  out[0] = big[0];
}
__global__ void shared_oob_kernel(float* out) {
  __shared__ float a[37];
  a[threadIdx.x] = 1.0f;
  __syncthreads();
  out[threadIdx.x] = a[threadIdx.x + 1];  // thread 36 reads a[37]
}

__global__ void misaligned_kernel(float* out, const float* in) {
  // A 16-byte load 4 bytes past an aligned address: a GPU faults ("misaligned address").
  const int4 v = *reinterpret_cast<const int4*>(in + 1);
  out[threadIdx.x] = (float)v.x;
}

int run_case(const std::string& name) {
  float* d = device<float>(257);
  std::vector<float> ones(257, 1.0f);
  upload(d, ones);
  if (name == "race") racy_sum_kernel<<<1, 256>>>(d, d + 1);
  else if (name == "deadlock") deadlock_kernel<<<1, 32>>>();
  else if (name == "divergent") divergent_barrier_kernel<<<1, 64>>>();
  else if (name == "early_exit") early_exit_kernel<<<1, 64>>>(d);
  else if (name == "exited_lane") exited_lane_kernel<<<1, 32>>>(d);
  else if (name == "bounds") bounded_kernel<<<1, 128>>>(d);
  else if (name == "big_static") big_static_kernel<<<1, 32>>>(d);
  else if (name == "shared_oob") shared_oob_kernel<<<1, 37>>>(d);
  else if (name == "misaligned") misaligned_kernel<<<1, 32>>>(d, d + 64);
  else return 2;
  std::printf("case %s ran to the end (%s)\n", name.c_str(),
              cudaGetErrorString(cudaGetLastError()));
  return 0;
}

// Runs this program with --case NAME in a child (env prepended), which must fail and print `want`.
void expect_child_failure(const char* self, const std::string& name, const std::string& env,
                          const std::string& want, const std::string& what) {
  const std::string cmd = env + " " + self + " --case " + name + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t got;
  while (p && (got = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, got);
  const int status = p ? pclose(p) : -1;
  const bool ok = status != 0 && out.find(want) != std::string::npos;
  check(ok, what);
  if (!ok) std::printf("    child status %d, output:\n%s\n", status, out.c_str());
}

}  // namespace

void check(bool ok, const std::string& what) {
  checks++;
  if (!ok) failures++;
  std::printf("  %-64s %s\n", what.c_str(), ok ? "ok" : "FAIL");
}

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--case") == 0) return run_case(argv[2]);
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  self[len > 0 ? len : 0] = 0;
  std::printf("emulator self-tests\n");
  test_indices();
  test_shuffles();
  test_barrier();
  test_ldmatrix();
  test_mma();
  test_cp_async();
  test_fp8();
  test_launch_checks();
  test_graphs();
  const std::string single = "EMU_ORDER=forward";
  expect_child_failure(self, "race", "EMU_ORDER=forward,reverse", "order check failed",
                       "a block reduction missing its __syncthreads fails the order check");
  expect_child_failure(self, "deadlock", single, "deadlock",
                       "half a warp at __syncwarp, half at __syncthreads: deadlock reported");
  expect_child_failure(self, "divergent", single, "different __syncthreads",
                       "two different __syncthreads in one block: reported");
  expect_child_failure(self, "early_exit", single, "exited before a __syncthreads",
                       "threads 40-63 returned, the others wait at __syncthreads: reported");
  expect_child_failure(self, "exited_lane", single, "exited",
                       "a full-mask shuffle after lane 31 returned: reported");
  expect_child_failure(self, "bounds", single, "__launch_bounds__(64)",
                       "128 threads for __launch_bounds__(64): reported");
  expect_child_failure(self, "big_static", single, "48 KiB",
                       "52 KB of static __shared__: reported");
#if defined(__SANITIZE_ADDRESS__)
  expect_child_failure(self, "shared_oob", single, "AddressSanitizer",
                       "one float past a __shared__ array: AddressSanitizer reports it");
  expect_child_failure(self, "misaligned", single, "misaligned address",
                       "a 16-byte load from a 4-byte aligned address: reported");
#endif
  std::printf("%d checks, %d failures\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
