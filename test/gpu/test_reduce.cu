// test/gpu/test_reduce.cu - sum_squares_accumulate, sum_accumulate, add_inplace and cast (CUDA)
// against the CPU oracle.
//
// Reductions: n from 1 to 10^7 + 3 (one block, many blocks, the 1024-block cap with many
// elements per thread), accumulating into a random *out (the "+=" contract), compared with a
// float64 sum and with the CPU backend (a scaled sum's error relative to at least the typical
// size of a random sum, since the result itself can cancel to nearly 0). Each is run again
// from the same state (bitwise equal), and on a copy of x that starts one float past an aligned
// address: the scalar path must give the very same bits as the vector path.
// add_inplace: odd and realistic sizes, aligned and unaligned. On the emulator
// (GPU_TEST_EMULATED) the largest sizes shrink (see largest()).
// cast: fp32 -> bf16 must round to nearest even exactly like common.h's f32_to_bf16, so the input
// includes exact ties (a bf16 value plus half a bf16 ulp) that round down and up; bf16 -> fp32
// and the same-type copies must be exact.
// sum_parts and grad_norm_and_clip (the step's loss, norm and clipping factor from the ranks'
// parts): bitwise the CPU backend's, with clipping off, clipping (factor < 1), not clipping
// (factor 1), and a NaN and an infinite part (factor 1 and 0).
#include <cmath>
#include <cstring>

#include "test/gpu/harness.h"

namespace {

// Host values as dt on the device, `offset` elements into a fresh allocation (see base).
void* to_device_at(const std::vector<float>& host, size_t offset, DType dt, void** base) {
  std::vector<float> padded(offset, 0.0f);
  padded.insert(padded.end(), host.begin(), host.end());
  *base = to_device(padded, dt);
  return static_cast<char*>(*base) + offset * dtype_size(dt);
}

float read_scalar(const float* d) {
  float x;
  ops::copy_to_host(&x, d, 4);
  return x;
}

// One reduction op (sum of squares or scaled sum) on n random values.
void check_reduction(TestContext& ctx, size_t n, bool squares) {
  const float scale = squares ? 1.0f : 0.37f;
  auto x = random_vector(ctx, n);
  const float out0 = random_vector(ctx, 1)[0] * 10.0f;
  auto run = [&](const float* d_x, float* d_out) {
    ops::copy_to_device(d_out, &out0, 4);
    if (squares) ops::sum_squares_accumulate(d_out, d_x, n, ctx.stream);
    else ops::sum_accumulate(d_out, d_x, n, scale, ctx.stream);
    return read_scalar(d_out);
  };
  void *aligned_base, *unaligned_base;
  auto* d_x = static_cast<float*>(to_device_at(x, 0, DType::F32, &aligned_base));
  auto* d_x1 = static_cast<float*>(to_device_at(x, 1, DType::F32, &unaligned_base));
  auto* d_out = static_cast<float*>(ops::alloc(4));
  const float got = run(d_x, d_out);

  double exact = 0.0;  // float64 oracle
  for (float v : x) exact += squares ? (double)v * v : (double)v;
  const float want_exact = (float)(out0 + scale * exact);
  float want_ref = out0;
  if (squares) ref::sum_squares_accumulate(&want_ref, x.data(), n, ctx.ref_stream);
  else ref::sum_accumulate(&want_ref, x.data(), n, scale, ctx.ref_stream);
  char name[96];
  std::snprintf(name, sizeof(name), "%s n=%zu", squares ? "sum_squares_accumulate" : "sum_accumulate",
                n);
  // A sum of zero-mean values can cancel to nearly 0, where a relative error means nothing: its
  // error is taken relative to at least the typical size of such a sum, |scale| sqrt(sum x^2)
  // (a dropped element still shows: 1 / sqrt(10^7) is 3e-4). Sums of squares cannot cancel.
  double sum_sq = 0.0;
  for (float v : x) sum_sq += (double)v * v;
  const double floor = squares ? 0.0 : std::fabs(scale) * std::sqrt(sum_sq);
  check_close_floor(ctx, std::string(name) + " vs float64", &got, &want_exact, 1, 1e-5, floor);
  check_close_floor(ctx, std::string(name) + " vs CPU backend", &got, &want_ref, 1, 1e-5, floor);
  expect(ctx, same_bits(run(d_x, d_out), got), std::string(name) + " rerun bitwise");
  expect(ctx, same_bits(run(d_x1, d_out), got), std::string(name) + " unaligned x bitwise");
  for (void* p : {aligned_base, unaligned_base, (void*)d_out}) ops::release(p);
}

void check_add_inplace(TestContext& ctx, size_t n, size_t offset) {
  auto dst = random_vector(ctx, n);
  auto src = random_vector(ctx, n);
  void *dst_base, *src_base;
  auto* d_dst = static_cast<float*>(to_device_at(dst, offset, DType::F32, &dst_base));
  auto* d_src = static_cast<float*>(to_device_at(src, offset, DType::F32, &src_base));
  ops::add_inplace(d_dst, d_src, n, ctx.stream);
  ref::add_inplace(dst.data(), src.data(), n, ctx.ref_stream);
  char name[96];
  std::snprintf(name, sizeof(name), "add_inplace n=%zu%s", n, offset ? " unaligned" : "");
  check_close(ctx, name, to_host(d_dst, n, DType::F32).data(), dst.data(), n, 1e-7);
  for (void* p : {dst_base, src_base}) ops::release(p);
}

// Random values, with exact round-to-nearest-even ties at every third index.
std::vector<float> values_with_ties(TestContext& ctx, size_t n) {
  auto x = random_vector(ctx, n, 5.0f);
  for (size_t i = 0; i < n; i += 3) {
    uint32_t u;
    float b = round_bf16(x[i]);
    std::memcpy(&u, &b, 4);
    u += 0x8000u;  // half a bf16 ulp: the exact midpoint between two bf16 values
    std::memcpy(&x[i], &u, 4);
  }
  return x;
}

void check_cast(TestContext& ctx, size_t n, size_t offset, DType dst_dt, DType src_dt) {
  auto x = values_with_ties(ctx, n);
  if (src_dt == DType::BF16) x = rounded(x, DType::BF16);
  void *src_base, *dst_base;
  void* d_src = to_device_at(x, offset, src_dt, &src_base);
  void* d_dst = to_device_at(std::vector<float>(n, 0.0f), offset, dst_dt, &dst_base);
  poison(d_dst, n * dtype_size(dst_dt));
  ops::cast(d_dst, dst_dt, d_src, src_dt, n, ctx.stream);
  auto got = to_host(d_dst, n, dst_dt);
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    float want = dst_dt == DType::BF16 ? round_bf16(x[i]) : x[i];
    if (!same_bits(got[i], want)) bad++;
  }
  char name[128];
  std::snprintf(name, sizeof(name), "cast %s->%s n=%zu%s (%zu differ)", dtype_name(src_dt),
                dtype_name(dst_dt), n, offset ? " unaligned" : "", bad);
  expect(ctx, bad == 0, name);
  for (void* p : {src_base, dst_base}) ops::release(p);
}

// The largest reduction: 10^7 + 3 elements, many per thread of the 1024-block cap; on the
// emulator 2^21 + 3 (the cap, two packs per thread and a tail).
size_t largest(const TestContext& ctx) { return ctx.emulated ? (1u << 21) + 3 : 10000003; }

}  // namespace

GPU_TEST(sum_squares_accumulate) {
  for (size_t n : {size_t(1), size_t(5), size_t(1023), size_t(4096 + 17), size_t(1 << 20),
                   largest(ctx)})
    check_reduction(ctx, n, true);
}

GPU_TEST(sum_accumulate) {
  for (size_t n : {size_t(1), size_t(7), size_t(100000), largest(ctx)})
    check_reduction(ctx, n, false);
}

GPU_TEST(add_inplace) {
  for (size_t n : {size_t(1), size_t(13), size_t(1000003), size_t(4 * 1024 * 768)})
    if (!(ctx.emulated && n > 2000000)) check_add_inplace(ctx, n, 0);
  check_add_inplace(ctx, 1001, 1);
}

GPU_TEST(cast) {
  const DType f32 = DType::F32, bf16 = DType::BF16;
  for (size_t n : {size_t(1), size_t(13), size_t(1000003)})
    for (size_t offset : {size_t(0), size_t(1)}) {
      check_cast(ctx, n, offset, bf16, f32);
      check_cast(ctx, n, offset, f32, bf16);
      check_cast(ctx, n, offset, f32, f32);
      check_cast(ctx, n, offset, bf16, bf16);
    }
}

// The step's scalars: the CUDA one-thread sums against the CPU backend's, bit for bit.
GPU_TEST(step_scalars) {
  const std::vector<std::vector<float>> cases = {
      {2.25f}, {0.5f, 0.75f, 1e-3f, 7.0f}, {1e-9f, 3.0f}, {NAN, 1.0f}, {INFINITY, 1.0f}};
  for (size_t c = 0; c < cases.size(); c++)
    for (float clip : {0.0f, 1.0f, 100.0f}) {
      const std::vector<float>& parts = cases[c];
      const int n = (int)parts.size();
      void* d_parts = to_device(parts, DType::F32);
      double* d_out = static_cast<double*>(ops::alloc(2 * sizeof(double)));
      float* d_factor = static_cast<float*>(ops::alloc(sizeof(float)));
      ops::sum_parts(d_out, static_cast<float*>(d_parts), n, 3.0, ctx.stream);
      ops::grad_norm_and_clip(d_out + 1, d_factor, static_cast<float*>(d_parts), n, clip,
                              ctx.stream);
      ops::stream_sync(ctx.stream);
      double got[2], want[2];
      float got_factor, want_factor;
      ops::copy_to_host(got, d_out, sizeof(got));
      ops::copy_to_host(&got_factor, d_factor, sizeof(float));
      ref::sum_parts(&want[0], parts.data(), n, 3.0, ctx.ref_stream);
      ref::grad_norm_and_clip(&want[1], &want_factor, parts.data(), n, clip, ctx.ref_stream);
      char name[96];
      std::snprintf(name, sizeof(name), "step scalars case %zu clip %g: bitwise = CPU", c, clip);
      auto same = [](double a, double b) {  // a GPU's NaN is canonical: NaN-ness only there
        return std::memcmp(&a, &b, sizeof(a)) == 0 || (std::isnan(a) && std::isnan(b));
      };
      expect(ctx, same(got[0], want[0]) && same(got[1], want[1]) &&
                      std::memcmp(&got_factor, &want_factor, sizeof(float)) == 0, name);
      for (void* p : {d_parts, (void*)d_out, (void*)d_factor}) ops::release(p);
    }
}
