// test/gpu/test_fp8.cu - the FP8 ops (CUDA) against the CPU oracle: amax, fp8_update_scale,
// fp8_cast, gemm_fp8, and bias_backward.
//
// fp8_cast must be bit-identical to kernels/fp8.h for both formats, fp32 and bf16 inputs, with
// and without the transposed copy. The inputs mix ordinary values, subnormals of the format,
// exact ties (the midpoint of two neighbouring FP8 values, which must round to the even code),
// and values beyond the largest finite one, infinities included (saturation); once with scale 1
// (so the ties stay ties) and once with a scale that is not a power of two. Shapes: 37 x 48,
// 48 x 37 and 1 x 16 (the scalar path, partial tiles), 136 x 200 (vector path, partial tiles)
// and 256 x 768. Outputs are poisoned first; with out_t both copies are checked.
// amax: exact (max is exact), n = 0 (must give 0), small and large n, unaligned x, fp32 and bf16;
// the largest |x| is negative in one case. fp8_update_scale: bit-identical to the CPU over a
// sequence of amaxes (with 0 and inf among them), current (history 0) and delayed (history 4 and
// 16) recipes, margin 0 and 1; scale, scale_inv and the rolled history are compared each step.
// gemm_fp8: the same FP8 codes and scales on both sides; fp32 accumulate vs the oracle at 1e-5
// (the sums run in another order); bf16 output vs the oracle's fp32 result at 4e-3 (one bf16
// rounding) and bitwise equal to the oracle's bf16 result in all but a handful of elements
// (rounding ties that the summation order can flip). E4M3 x E4M3 and E5M2 x E4M3, E4M3 x E5M2.
// bias_backward: fp32 and bf16, awkward and GPT shapes, accumulating into a random dbias, 1e-5.
// fp8_cast_blocks (rowwise, blockwise, mxfp8): codes and per-block scale_inv bit-identical to
// the CPU's, both formats, bf16 input, plain and transposed, blocks 1 x K, 1 x 128, 128 x 128,
// 1 x 32 over awkward shapes (partial edge blocks), margin 0 and 1, with the inputs of fp8_cast
// scaled per row by powers of ten (so blocks differ) and one all-zero block.
// gemm_fp8_blocks: the same codes and scales on both sides (the dequantise-and-bf16-GEMM path
// against the oracle's fp32 sums of the decoded operands): fp32 accumulate at 1e-5, bf16 out at
// 4e-3.
// The FP8 cases are skipped (and say so) on a GPU without FP8 (below sm_89).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/fp8.h"
#include "test/gpu/harness.h"

namespace {

// Host values stored as dt (fp32 or bf16 bits), what the CPU backend reads.
std::vector<uint8_t> host_bytes(const std::vector<float>& x, DType dt) {
  std::vector<uint8_t> bytes(x.size() * dtype_size(dt));
  if (dt == DType::F32) {
    std::memcpy(bytes.data(), x.data(), bytes.size());
  } else {
    for (size_t i = 0; i < x.size(); i++) {
      uint16_t h = f32_to_bf16(x[i]);
      std::memcpy(&bytes[2 * i], &h, 2);
    }
  }
  return bytes;
}

void* device_bytes(const void* host, size_t bytes) {
  void* dev = ops::alloc(bytes + 16);
  if (bytes) ops::copy_to_device(dev, host, bytes);
  return dev;
}
std::vector<uint8_t> host_of(const void* dev, size_t bytes) {
  std::vector<uint8_t> h(bytes);
  if (bytes) ops::copy_to_host(h.data(), dev, bytes);
  return h;
}
float* device_scalar(float v) { return (float*)device_bytes(&v, 4); }
float read_scalar(const float* d) {
  float x;
  ops::copy_to_host(&x, d, 4);
  return x;
}

size_t count_differences(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); i++) bad += a[i] != b[i];
  return bad;
}

// ---------------------------------------------------------------------------------------------
// fp8_cast
// ---------------------------------------------------------------------------------------------
// n values for format `fmt`: a quarter ordinary (sd = max / 8), a quarter subnormal or near it,
// a quarter exact ties between neighbouring codes, the rest beyond the largest finite value
// (a few infinities). Signs random.
std::vector<float> fp8_inputs(TestContext& ctx, size_t n, DType fmt) {
  const Fp8Format f = fp8_format(fmt);
  const float smallest_normal = std::ldexp(1.0f, 1 - f.bias);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::uniform_int_distribution<int> code(0, fmt == DType::E4M3 ? 0x7D : 0x7A);
  auto x = random_vector(ctx, n, f.max_finite / 8);
  for (size_t i = 0; i < n; i++) {
    const float sign = unit(ctx.rng) < 0.5f ? -1.0f : 1.0f;
    switch (i % 4) {
      case 0: break;
      case 1: x[i] = sign * unit(ctx.rng) * 2.0f * smallest_normal; break;
      case 2: {  // the midpoint of codes c and c + 1: exact in fp32 (and in bf16)
        const uint8_t c = (uint8_t)code(ctx.rng);
        x[i] = sign * 0.5f * (fp8_to_f32(c, fmt) + fp8_to_f32((uint8_t)(c + 1), fmt));
        break;
      }
      default:
        x[i] = i % 64 == 3 ? sign * INFINITY : sign * f.max_finite * (1.0f + 3.0f * unit(ctx.rng));
    }
  }
  return x;
}

void check_cast(TestContext& ctx, int rows, int cols, DType fmt, DType dt, bool transpose,
                float scale) {
  const size_t n = (size_t)rows * cols;
  auto x = rounded(fp8_inputs(ctx, n, fmt), dt);
  auto xb = host_bytes(x, dt);
  std::vector<uint8_t> want(n), want_t(n);
  ref::fp8_cast(want.data(), transpose ? want_t.data() : nullptr, fmt, xb.data(), dt, rows, cols,
                &scale, ctx.ref_stream);
  void* d_x = device_bytes(xb.data(), xb.size());
  void* d_out = ops::alloc(n + 16);
  void* d_out_t = ops::alloc(n + 16);
  float* d_scale = device_scalar(scale);
  poison(d_out, n);
  poison(d_out_t, n);
  ops::fp8_cast(d_out, transpose ? d_out_t : nullptr, fmt, d_x, dt, rows, cols, d_scale,
                ctx.stream);
  char name[128];
  std::snprintf(name, sizeof(name), "fp8_cast %s->%s %dx%d scale %g", dtype_name(dt),
                dtype_name(fmt), rows, cols, scale);
  size_t bad = count_differences(host_of(d_out, n), want);
  expect(ctx, bad == 0, std::string(name) + " (" + std::to_string(bad) + " differ)");
  if (transpose) {
    bad = count_differences(host_of(d_out_t, n), want_t);
    expect(ctx, bad == 0, std::string(name) + " transposed (" + std::to_string(bad) + " differ)");
  }
  for (void* p : {d_x, d_out, d_out_t, (void*)d_scale}) ops::release(p);
}

GPU_TEST(fp8_cast_bitwise) {
  if (!ops::device_supports_fp8()) {
    std::printf("  skipped: no FP8 on this GPU\n");
    return;
  }
  const int shapes[][2] = {{37, 48}, {48, 37}, {1, 16}, {136, 200}, {256, 768}};
  for (DType fmt : {DType::E4M3, DType::E5M2})
    for (DType dt : {DType::F32, DType::BF16})
      for (auto& sh : shapes) {
        check_cast(ctx, sh[0], sh[1], fmt, dt, true, 1.0f);
        check_cast(ctx, sh[0], sh[1], fmt, dt, false, 1.0f);
        check_cast(ctx, sh[0], sh[1], fmt, dt, true, 0.7312f);
      }
}

// ---------------------------------------------------------------------------------------------
// amax
// ---------------------------------------------------------------------------------------------
void check_amax(TestContext& ctx, size_t n, size_t offset, DType dt, bool negative_max) {
  auto x = rounded(random_vector(ctx, n, 3.0f), dt);
  if (negative_max && n > 0) x[n / 2] = -100.0f;
  std::vector<float> padded(offset, 0.0f);
  padded.insert(padded.end(), x.begin(), x.end());
  auto xb = host_bytes(padded, dt);
  void* base = device_bytes(xb.data(), xb.size());
  const void* d_x = (const char*)base + offset * dtype_size(dt);
  float* d_out = device_scalar(NAN);
  ops::amax(d_out, d_x, n, dt, ctx.stream);
  float want = -1.0f;
  ref::amax(&want, xb.data() + offset * dtype_size(dt), n, dt, ctx.ref_stream);
  const float got = read_scalar(d_out);
  char name[128];
  std::snprintf(name, sizeof(name), "amax %s n=%zu%s%s = %g", dtype_name(dt), n,
                offset ? " unaligned" : "", negative_max ? " (negative max)" : "", got);
  expect(ctx, same_bits(got, want), name);
  for (void* p : {base, (void*)d_out}) ops::release(p);
}

GPU_TEST(fp8_amax) {
  for (DType dt : {DType::F32, DType::BF16}) {
    check_amax(ctx, 0, 0, dt, false);
    for (size_t n : {(size_t)1, (size_t)37, (size_t)4096, (size_t)1000003}) {
      check_amax(ctx, n, 0, dt, false);
      check_amax(ctx, n, 1, dt, true);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// fp8_update_scale
// ---------------------------------------------------------------------------------------------
void check_update_scale(TestContext& ctx, int history_len, int margin, float fp8_max) {
  const float amaxes[] = {0.0f, 3.5f, 0.02f, 1e-30f, 7000.0f, INFINITY, 0.5f, 0.0f,
                          12.25f, 1e30f, 0.75f, 3.0f, 2.0f, 1.0f, 0.125f, 9.0f,
                          4.0f, 0.0625f, 5.5f, 6.0f, 1.5f};
  std::vector<float> history(std::max(history_len, 1), 0.0f);
  float* d_history = (float*)device_bytes(history.data(), history.size() * 4);
  float* d_scale = device_scalar(NAN);
  float* d_scale_inv = device_scalar(NAN);
  float* d_amax = device_scalar(0.0f);
  int bad = 0;
  for (float a : amaxes) {
    ops::copy_to_device(d_amax, &a, 4);
    ops::fp8_update_scale(d_scale, d_scale_inv, d_history, history_len, d_amax, fp8_max, margin,
                          ctx.stream);
    float scale = 0, scale_inv = 0;
    ref::fp8_update_scale(&scale, &scale_inv, history.data(), history_len, &a, fp8_max, margin,
                          ctx.ref_stream);
    bad += !same_bits(read_scalar(d_scale), scale);
    bad += !same_bits(read_scalar(d_scale_inv), scale_inv);
    std::vector<float> got(history.size());
    ops::copy_to_host(got.data(), d_history, got.size() * 4);
    for (int i = 0; i < history_len; i++) bad += !same_bits(got[i], history[i]);
  }
  char name[128];
  std::snprintf(name, sizeof(name), "fp8_update_scale history %d margin %d max %g (%d differ)",
                history_len, margin, fp8_max, bad);
  expect(ctx, bad == 0, name);
  for (void* p : {d_history, d_scale, d_scale_inv, d_amax}) ops::release(p);
}

GPU_TEST(fp8_update_scale_bitwise) {
  for (int history_len : {0, 4, 16})
    for (int margin : {0, 1}) {
      check_update_scale(ctx, history_len, margin, 448.0f);
      check_update_scale(ctx, history_len, margin, 57344.0f);
    }
}

// ---------------------------------------------------------------------------------------------
// gemm_fp8
// ---------------------------------------------------------------------------------------------
std::vector<uint8_t> random_fp8(TestContext& ctx, size_t n, DType fmt) {
  auto x = random_vector(ctx, n, fp8_format(fmt).max_finite / 16);
  std::vector<uint8_t> codes(n);
  for (size_t i = 0; i < n; i++) codes[i] = f32_to_fp8(x[i], fmt);
  return codes;
}

void check_gemm(TestContext& ctx, int M, int N, int K, DType a_fmt, DType b_fmt) {
  auto a = random_fp8(ctx, (size_t)M * K, a_fmt);
  auto b = random_fp8(ctx, (size_t)N * K, b_fmt);
  const float sa = 0.0137f, sb = 2.5f / (float)K;
  void* d_a = device_bytes(a.data(), a.size());
  void* d_b = device_bytes(b.data(), b.size());
  float* d_sa = device_scalar(sa);
  float* d_sb = device_scalar(sb);
  const size_t n = (size_t)M * N;
  char name[128];
  std::snprintf(name, sizeof(name), "gemm_fp8 %s x %s %dx%dx%d", dtype_name(a_fmt),
                dtype_name(b_fmt), M, N, K);

  // fp32, accumulating into random values.
  auto out0 = random_vector(ctx, n);
  std::vector<float> want(out0);
  ref::gemm_fp8(want.data(), DType::F32, true, a.data(), a_fmt, b.data(), b_fmt, M, N, K, &sa,
                &sb, ctx.ref_stream);
  void* d_out = to_device(out0, DType::F32);
  ops::gemm_fp8(d_out, DType::F32, true, d_a, a_fmt, d_b, b_fmt, M, N, K, d_sa, d_sb,
                ctx.stream);
  check_close(ctx, std::string(name) + " fp32 accumulate", to_host(d_out, n, DType::F32).data(),
              want.data(), n, 1e-5);

  // bf16 output: against the oracle's unrounded fp32 product and its bf16 result.
  std::vector<float> exact(n);
  ref::gemm_fp8(exact.data(), DType::F32, false, a.data(), a_fmt, b.data(), b_fmt, M, N, K, &sa,
                &sb, ctx.ref_stream);
  std::vector<uint16_t> want_bf16(n);
  ref::gemm_fp8(want_bf16.data(), DType::BF16, false, a.data(), a_fmt, b.data(), b_fmt, M, N, K,
                &sa, &sb, ctx.ref_stream);
  void* d_out16 = ops::alloc(n * 2 + 16);
  poison(d_out16, n * 2);
  ops::gemm_fp8(d_out16, DType::BF16, false, d_a, a_fmt, d_b, b_fmt, M, N, K, d_sa, d_sb,
                ctx.stream);
  auto got16 = to_host(d_out16, n, DType::BF16);
  check_close(ctx, std::string(name) + " bf16 vs fp32", got16.data(), exact.data(), n, 4e-3);
  size_t differ = 0;
  for (size_t i = 0; i < n; i++) differ += f32_to_bf16(got16[i]) != want_bf16[i];
  expect(ctx, differ <= n / 1000 + 2,
         std::string(name) + " bf16 bitwise (" + std::to_string(differ) + " differ)");
  for (void* p : {d_a, d_b, (void*)d_sa, (void*)d_sb, d_out, d_out16}) ops::release(p);
}

GPU_TEST(fp8_gemm) {
  if (!ops::device_supports_fp8()) {
    std::printf("  skipped: no FP8 on this GPU\n");
    return;
  }
  check_gemm(ctx, 32, 48, 64, DType::E4M3, DType::E4M3);
  check_gemm(ctx, 128, 768, 256, DType::E4M3, DType::E4M3);
  check_gemm(ctx, 128, 768, 256, DType::E5M2, DType::E4M3);
  check_gemm(ctx, 64, 256, 768, DType::E4M3, DType::E5M2);
}

// ---------------------------------------------------------------------------------------------
// Block-scaled cast and GEMM
// ---------------------------------------------------------------------------------------------
size_t block_count(int R, int C, int br, int bc) {
  return (size_t)((R + br - 1) / br) * ((C + bc - 1) / bc);
}

void check_cast_blocks(TestContext& ctx, int rows, int cols, DType fmt, bool transpose, int br,
                       int bc, bool e8m0, int margin) {
  const size_t n = (size_t)rows * cols;
  auto x = fp8_inputs(ctx, n, fmt);
  for (size_t i = 0; i < n; i++) {
    x[i] = std::isfinite(x[i]) ? x[i] * std::pow(10.0f, (float)((i / cols) % 7) - 3.0f) : x[i];
    if (i / cols == 1) x[i] = 0.0f;  // an all-zero row
  }
  x = rounded(x, DType::BF16);
  auto xb = host_bytes(x, DType::BF16);
  const int R = transpose ? cols : rows, C = transpose ? rows : cols;
  const size_t nb = block_count(R, C, br, bc);
  std::vector<uint8_t> want(n);
  std::vector<float> want_scale(nb);
  ref::fp8_cast_blocks(want.data(), want_scale.data(), fmt, xb.data(), DType::BF16, rows, cols,
                       transpose, br, bc, e8m0, margin, ctx.ref_stream);
  void* d_x = device_bytes(xb.data(), xb.size());
  void* d_out = ops::alloc(n + 16);
  void* d_scale = ops::alloc(nb * 4 + 16);
  poison(d_out, n);
  poison(d_scale, nb * 4);
  ops::fp8_cast_blocks(d_out, (float*)d_scale, fmt, d_x, DType::BF16, rows, cols, transpose, br,
                       bc, e8m0, margin, ctx.stream);
  char name[160];
  std::snprintf(name, sizeof(name), "fp8_cast_blocks %s %dx%d%s blocks %dx%d%s margin %d",
                dtype_name(fmt), rows, cols, transpose ? " transposed" : "", br, bc,
                e8m0 ? " e8m0" : "", margin);
  size_t bad = count_differences(host_of(d_out, n), want);
  std::vector<uint8_t> want_scale_bytes(nb * 4);
  std::memcpy(want_scale_bytes.data(), want_scale.data(), nb * 4);
  const size_t bad_scales = count_differences(host_of(d_scale, nb * 4), want_scale_bytes);
  expect(ctx, bad == 0 && bad_scales == 0, std::string(name) + " (" + std::to_string(bad) +
         " codes, " + std::to_string(bad_scales) + " scale bytes differ)");
  for (void* p : {d_x, d_out, d_scale}) ops::release(p);
}

GPU_TEST(fp8_cast_blocks_bitwise) {
  if (!ops::device_supports_fp8()) {
    std::printf("  skipped: no FP8 on this GPU\n");
    return;
  }
  for (DType fmt : {DType::E4M3, DType::E5M2})
    for (bool transpose : {false, true}) {
      const int rows = 37, cols = 200, K = transpose ? rows : cols;
      check_cast_blocks(ctx, rows, cols, fmt, transpose, 1, K, false, 0);     // rowwise
      check_cast_blocks(ctx, rows, cols, fmt, transpose, 1, 128, false, 1);   // blockwise act
      check_cast_blocks(ctx, 136, 260, fmt, transpose, 128, 128, false, 0);   // blockwise weight
      check_cast_blocks(ctx, rows, cols, fmt, transpose, 1, 32, true, 0);     // mxfp8
    }
}

void check_gemm_blocks(TestContext& ctx, int M, int N, int K, DType a_fmt, DType b_fmt, int br,
                       int bc, bool accumulate) {
  auto a = random_fp8(ctx, (size_t)M * K, a_fmt);
  auto b = random_fp8(ctx, (size_t)N * K, b_fmt);
  std::vector<float> sa(block_count(M, K, 1, bc)), sb(block_count(N, K, br, bc));
  for (size_t i = 0; i < sa.size(); i++) sa[i] = std::ldexp(1.0f, (int)(i % 5) - 6);
  for (size_t i = 0; i < sb.size(); i++) sb[i] = std::ldexp(1.0f, (int)(i % 3) - 4);
  void* d_a = device_bytes(a.data(), a.size());
  void* d_b = device_bytes(b.data(), b.size());
  void* d_sa = device_bytes(sa.data(), sa.size() * 4);
  void* d_sb = device_bytes(sb.data(), sb.size() * 4);
  void* d_ws = ops::alloc((size_t)(M + N) * K * 2 + 16);
  const size_t n = (size_t)M * N;
  const DType out_dt = accumulate ? DType::F32 : DType::BF16;
  auto out0 = random_vector(ctx, n);
  std::vector<float> want(accumulate ? out0 : std::vector<float>(n));
  ref::gemm_fp8_blocks(want.data(), DType::F32, accumulate, a.data(), a_fmt, sa.data(), 1, bc,
                       b.data(), b_fmt, sb.data(), br, bc, M, N, K, nullptr, ctx.ref_stream);
  void* d_out = accumulate ? to_device(out0, DType::F32) : ops::alloc(n * 2 + 16);
  ops::gemm_fp8_blocks(d_out, out_dt, accumulate, d_a, a_fmt, (const float*)d_sa, 1, bc, d_b,
                       b_fmt, (const float*)d_sb, br, bc, M, N, K, d_ws, ctx.stream);
  char name[128];
  std::snprintf(name, sizeof(name), "gemm_fp8_blocks %s x %s %dx%dx%d blocks %dx%d %s",
                dtype_name(a_fmt), dtype_name(b_fmt), M, N, K, br, bc, dtype_name(out_dt));
  check_close(ctx, name, to_host(d_out, n, out_dt).data(), want.data(), n,
              accumulate ? 1e-5 : 4e-3);
  for (void* p : {d_a, d_b, d_sa, d_sb, d_ws, d_out}) ops::release(p);
}

GPU_TEST(fp8_gemm_blocks) {
  if (!ops::device_supports_fp8()) {
    std::printf("  skipped: no FP8 on this GPU\n");
    return;
  }
  check_gemm_blocks(ctx, 48, 40, 200, DType::E4M3, DType::E4M3, 128, 128, false);
  check_gemm_blocks(ctx, 48, 40, 200, DType::E5M2, DType::E4M3, 1, 32, true);
  check_gemm_blocks(ctx, 33, 64, 96, DType::E5M2, DType::E4M3, 1, 96, false);
}

// ---------------------------------------------------------------------------------------------
// bias_backward
// ---------------------------------------------------------------------------------------------
void check_bias_backward(TestContext& ctx, int N, int OC, DType dt) {
  auto dout = rounded(random_vector(ctx, (size_t)N * OC), dt);
  auto dbias = random_vector(ctx, OC);
  auto doutb = host_bytes(dout, dt);
  void* d_dout = device_bytes(doutb.data(), doutb.size());
  void* d_dbias = to_device(dbias, DType::F32);
  ops::bias_backward((float*)d_dbias, d_dout, N, OC, dt, ctx.stream);
  ref::bias_backward(dbias.data(), doutb.data(), N, OC, dt, ctx.ref_stream);
  char name[128];
  std::snprintf(name, sizeof(name), "bias_backward %s N=%d OC=%d", dtype_name(dt), N, OC);
  check_close(ctx, name, to_host(d_dbias, OC, DType::F32).data(), dbias.data(), OC, 1e-5);
  for (void* p : {d_dout, d_dbias}) ops::release(p);
}

GPU_TEST(fp8_bias_backward) {  // on the emulator the MLP's 4096 rows shrink to 512
  const int shapes[][2] = {{5, 3}, {37, 48}, {48, 37}, {1024, 768}, {4096, 3072}};
  for (DType dt : {DType::F32, DType::BF16})
    for (auto& sh : shapes)
      check_bias_backward(ctx, ctx.emulated && sh[0] > 1024 ? 512 : sh[0], sh[1], dt);
}

}  // namespace
