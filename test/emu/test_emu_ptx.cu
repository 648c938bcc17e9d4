// test/emu/test_emu_ptx.cu - the emulator's self-tests of the PTX it models and of the FP8
// conversions (see test_emu.cu for the rest), each against a reference written here from the
// PTX ISA and CUDA's documentation, not from the emulator's code:
//
//   ldmatrix     x1/x2/x4, plain and .trans, rows at scattered addresses: every lane's registers
//   mma          A (16x16) and B (16x8) loaded with ldmatrix as the flash kernels do, D = A B + C
//                against a float64 product (bf16 products are exact; measured worst error 6e-8
//                of the sum of |terms|, tolerance 1e-6)
//   cp.async     the destination keeps its old bytes until the wait that completes the group;
//                src_size 0 zero-fills; wait_group 1 leaves the newest group pending
//   fp8          __nv_cvt_float_to_fp8 (CUDA's header, as the emulated fp8.cu uses it) against
//                kernels/fp8.h (the CPU backend's) on every bf16 bit pattern and 2^20 random fp32
//                patterns, both formats, bitwise; plus reference values of both formats
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "kernels/fp8.h"
#include "test/emu/test_emu.h"

// --- ldmatrix -----------------------------------------------------------------------------------
// 64 rows of 8 16-bit elements in shared memory; matrix i's row r is pool row perm[8 i + r]. Lane
// l < 8 num gives the address of row l % 8 of matrix l / 8; the others give none (null).
__global__ void ldmatrix_kernel(uint32_t* out, const int* perm, int num, int trans) {
  __shared__ __align__(16) uint16_t pool[64][8];
  const int lane = threadIdx.x;
  for (int i = lane; i < 64 * 8; i += 32) pool[i / 8][i % 8] = (uint16_t)(1000 + i);
  __syncwarp();
  const void* row = lane < 8 * num ? (const void*)pool[perm[lane]] : nullptr;
  uint32_t r[4] = {0, 0, 0, 0};
  emu::ldmatrix(r, num, trans != 0, row, "ldmatrix (test)", __FILE__, __LINE__);
  for (int i = 0; i < 4; i++) out[lane * 4 + i] = r[i];
}

void test_ldmatrix() {
  std::vector<int> perm(64);
  for (int i = 0; i < 64; i++) perm[i] = (i * 37 + 11) % 64;  // rows scattered through the pool
  int* d_perm = device<int>(64);
  uint32_t* d_out = device<uint32_t>(128);
  upload(d_perm, perm);
  for (int num : {1, 2, 4})
    for (int trans : {0, 1}) {
      ldmatrix_kernel<<<1, 32>>>(d_out, d_perm, num, trans);
      std::vector<uint32_t> out = host(d_out, 128);
      // PTX ISA, ldmatrix: lane l holds row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of each
      // matrix (.trans: of the transpose), the lower column in the low 16 bits.
      auto element = [&](int m, int row, int col) {
        return (uint32_t)(1000 + perm[8 * m + row] * 8 + col);
      };
      int bad = 0;
      for (int l = 0; l < 32; l++)
        for (int m = 0; m < num; m++) {
          const int g = l / 4, c = 2 * (l % 4);
          const uint32_t lo = trans ? element(m, c, g) : element(m, g, c);
          const uint32_t hi = trans ? element(m, c + 1, g) : element(m, g, c + 1);
          bad += out[l * 4 + m] != (lo | hi << 16);
        }
      check(bad == 0, "ldmatrix .x" + std::to_string(num) + (trans ? ".trans" : "") +
                          ", rows at scattered addresses");
    }
  cudaFree(d_perm);
  cudaFree(d_out);
}

// --- mma ----------------------------------------------------------------------------------------
// D = A B + C for A 16x16 (row-major in shared memory), B 16x8 given both ways the flash kernels
// hold it: as Bt (8x16, B's transpose row-major: K in Q K^T) read by plain ldmatrix, and as B
// row-major (V in P V) read by ldmatrix.trans. C and D go through the documented C fragment.
__global__ void mma_kernel(float* d_plain, float* d_trans, const uint16_t* a, const uint16_t* b,
                           const uint16_t* bt, const float* c) {
  __shared__ __align__(16) uint16_t sA[16][16];
  __shared__ __align__(16) uint16_t sB[16][8];
  __shared__ __align__(16) uint16_t sBt[8][16];
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  for (int i = lane; i < 256; i += 32) sA[i / 16][i % 16] = a[i];
  for (int i = lane; i < 128; i += 32) {
    sB[i / 8][i % 8] = b[i];
    sBt[i / 16][i % 16] = bt[i];
  }
  __syncwarp();
  uint32_t ra[4], rb[4], rbt[4];
  // A: matrices (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15), (8-15, 8-15).
  emu::ldmatrix(ra, 4, false, &sA[lane % 8 + 8 * (lane / 8 % 2)][8 * (lane / 16)], "ldmatrix",
                __FILE__, __LINE__);
  emu::ldmatrix(rbt, 2, false, lane < 16 ? &sBt[lane % 8][8 * (lane / 8)] : nullptr, "ldmatrix",
                __FILE__, __LINE__);
  emu::ldmatrix(rb, 2, true, lane < 16 ? &sB[lane][0] : nullptr, "ldmatrix.trans", __FILE__,
                __LINE__);
  const float cf[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t],
                       c[(g + 8) * 8 + 2 * t + 1]};
  float dp[4], dt[4];
  emu::mma_m16n8k16_bf16_f32(dp, ra, rbt[0], rbt[1], cf, __FILE__, __LINE__);
  emu::mma_m16n8k16_bf16_f32(dt, ra, rb[0], rb[1], cf, __FILE__, __LINE__);
  const int idx[4] = {g * 8 + 2 * t, g * 8 + 2 * t + 1, (g + 8) * 8 + 2 * t,
                      (g + 8) * 8 + 2 * t + 1};
  for (int e = 0; e < 4; e++) {
    d_plain[idx[e]] = dp[e];
    d_trans[idx[e]] = dt[e];
  }
}

void test_mma() {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> a(256), b(128), bt(128);
  std::vector<float> c(128);
  for (auto& x : a) x = f32_to_bf16(normal(rng));
  for (int k = 0; k < 16; k++)
    for (int n = 0; n < 8; n++) {
      b[k * 8 + n] = f32_to_bf16(normal(rng));
      bt[n * 16 + k] = b[k * 8 + n];
    }
  for (auto& x : c) x = normal(rng);
  uint16_t* d_a = device<uint16_t>(256);
  uint16_t* d_b = device<uint16_t>(128);
  uint16_t* d_bt = device<uint16_t>(128);
  float* d_c = device<float>(128);
  float* d_plain = device<float>(128);
  float* d_trans = device<float>(128);
  upload(d_a, a);
  upload(d_b, b);
  upload(d_bt, bt);
  upload(d_c, c);
  mma_kernel<<<1, 32>>>(d_plain, d_trans, d_a, d_b, d_bt, d_c);
  std::vector<float> plain = host(d_plain, 128), trans = host(d_trans, 128);
  double worst_plain = 0, worst_trans = 0;
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 8; j++) {
      double want = c[i * 8 + j], scale = std::fabs(want);
      for (int k = 0; k < 16; k++) {
        const double p = (double)bf16_to_f32(a[i * 16 + k]) * bf16_to_f32(b[k * 8 + j]);
        want += p;
        scale += std::fabs(p);
      }
      worst_plain = std::max(worst_plain, std::fabs(plain[i * 8 + j] - want) / scale);
      worst_trans = std::max(worst_trans, std::fabs(trans[i * 8 + j] - want) / scale);
    }
  std::printf("  (worst |D - float64| / sum|terms|: %.2e with Bt, %.2e with B.trans)\n",
              worst_plain, worst_trans);
  check(worst_plain < 1e-6, "mma m16n8k16 bf16: A, Bt by ldmatrix, D = A B + C vs float64");
  check(worst_trans < 1e-6, "mma m16n8k16 bf16: A, B by ldmatrix.trans, D = A B + C vs float64");
  for (void* p : {(void*)d_a, (void*)d_b, (void*)d_bt, (void*)d_c, (void*)d_plain, (void*)d_trans})
    cudaFree(p);
}

// --- cp.async -----------------------------------------------------------------------------------
// Each of 32 threads: a 16-byte copy (threads 24.. zero-fill: src_size 0) in group 0, a 4-byte
// copy in group 1; it records its destination before any wait, after wait_group 1 and after
// wait_group 0. Only the thread's own copies are observed, so no barrier is involved.
__global__ void cp_async_kernel(float* seen, const float* src16, const float* src4) {
  __shared__ __align__(16) float dst16[32 * 4];
  __shared__ float dst4[32];
  const int t = threadIdx.x;
  for (int k = 0; k < 4; k++) dst16[4 * t + k] = -1.0f;
  dst4[t] = -1.0f;
  emu::cp_async(&dst16[4 * t], src16 + 4 * t, 16, t < 24 ? 16 : 0, "cp.async.cg", __FILE__,
                __LINE__);
  emu::cp_async_commit();
  emu::cp_async(&dst4[t], src4 + t, 4, 4, "cp.async.ca", __FILE__, __LINE__);
  emu::cp_async_commit();
  float* s = seen + 15 * t;
  for (int k = 0; k < 4; k++) s[k] = dst16[4 * t + k];
  s[4] = dst4[t];
  emu::cp_async_wait(1);
  for (int k = 0; k < 4; k++) s[5 + k] = dst16[4 * t + k];
  s[9] = dst4[t];
  emu::cp_async_wait(0);
  for (int k = 0; k < 4; k++) s[10 + k] = dst16[4 * t + k];
  s[14] = dst4[t];
}

void test_cp_async() {
  std::vector<float> src16(128), src4(32);
  for (int i = 0; i < 128; i++) src16[i] = 1.0f + i;
  for (int i = 0; i < 32; i++) src4[i] = 500.0f + i;
  float* d16 = device<float>(128);
  float* d4 = device<float>(32);
  float* d_seen = device<float>(32 * 15);
  upload(d16, src16);
  upload(d4, src4);
  cp_async_kernel<<<1, 32>>>(d_seen, d16, d4);
  std::vector<float> seen = host(d_seen, 32 * 15);
  int early = 0, first = 0, all = 0;
  for (int t = 0; t < 32; t++) {
    const float* s = &seen[15 * t];
    for (int k = 0; k < 5; k++) early += s[k] != -1.0f;
    for (int k = 0; k < 4; k++) first += s[5 + k] != (t < 24 ? src16[4 * t + k] : 0.0f);
    first += s[9] != -1.0f;
    for (int k = 0; k < 4; k++) all += s[10 + k] != (t < 24 ? src16[4 * t + k] : 0.0f);
    all += s[14] != src4[t];
  }
  check(early == 0, "cp.async: destinations unchanged before any wait_group");
  check(first == 0, "cp.async.wait_group 1: the older group landed (zero-filled past src_size), "
                    "the newer not");
  check(all == 0, "cp.async.wait_group 0: both groups landed");
  for (void* p : {(void*)d16, (void*)d4, (void*)d_seen}) cudaFree(p);
}

// --- fp8 ----------------------------------------------------------------------------------------
__global__ void fp8_kernel(uint8_t* e4m3, uint8_t* e5m2, const float* x, size_t n) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride) {
    e4m3[i] = (uint8_t)__nv_cvt_float_to_fp8(x[i], __NV_SATFINITE, __NV_E4M3);
    e5m2[i] = (uint8_t)__nv_cvt_float_to_fp8(x[i], __NV_SATFINITE, __NV_E5M2);
  }
}

void test_fp8() {
  // Every bf16 bit pattern (every sign, exponent and the top mantissa bits, ties included), then
  // 2^20 random fp32 patterns, then the reference values.
  std::vector<float> x;
  for (uint32_t h = 0; h < 65536; h++) {
    const uint32_t u = h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    x.push_back(f);
  }
  std::mt19937 rng(13);
  for (int i = 0; i < (1 << 20); i++) {
    const uint32_t u = rng();
    float f;
    std::memcpy(&f, &u, 4);
    x.push_back(f);
  }
  const float refs[] = {0.3952f, 464.0f, 500.0f, 1e-3f, 61440.0f};
  for (float r : refs) x.push_back(r);
  const size_t n = x.size();
  float* d_x = device<float>(n);
  uint8_t* d4 = device<uint8_t>(n);
  uint8_t* d5 = device<uint8_t>(n);
  upload(d_x, x);
  fp8_kernel<<<512, 256>>>(d4, d5, d_x, n);
  std::vector<uint8_t> e4 = host(d4, n), e5 = host(d5, n);
  size_t bad4 = 0, bad5 = 0, nan_bad = 0;
  for (size_t i = 0; i < n; i++) {
    if (std::isnan(x[i])) {  // CUDA gives the canonical NaN 0x7F, the CPU keeps the sign
      nan_bad += !std::isnan(fp8_to_f32(e4[i], DType::E4M3)) ||
                 !std::isnan(fp8_to_f32(e5[i], DType::E5M2));
      continue;
    }
    bad4 += e4[i] != f32_to_fp8(x[i], DType::E4M3);
    bad5 += e5[i] != f32_to_fp8(x[i], DType::E5M2);
  }
  const size_t r = n - 5;
  check(bad4 == 0, "fp8 e4m3 satfinite: CUDA's conversion == kernels/fp8.h on " +
                       std::to_string(n) + " inputs (" + std::to_string(bad4) + " differ)");
  check(bad5 == 0, "fp8 e5m2 satfinite: CUDA's conversion == kernels/fp8.h (" +
                       std::to_string(bad5) + " differ)");
  check(nan_bad == 0, "fp8: NaN stays NaN in both formats");
  check(e4[r] == 0x2d && e4[r + 1] == 0x7e && e4[r + 2] == 0x7e && e4[r + 3] == 0x01,
        "fp8 e4m3: 0.3952 -> 0x2d, 464 -> 0x7e (tie to even), 500 -> 0x7e, 1e-3 -> 0x01");
  check(e5[r + 4] == 0x7b, "fp8 e5m2: 61440 -> 0x7b (saturated)");
  for (void* p : {(void*)d_x, (void*)d4, (void*)d5}) cudaFree(p);
}
