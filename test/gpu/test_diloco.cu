// test/gpu/test_diloco.cu - DiLoCo's outer step (kernels/cuda/diloco.cu) against the CPU backend,
// bit for bit: both round every product and sum once, in the order of kernels/ops_decls.h, so
// any difference is a bug (a contracted FMA, a wrong operand), not rounding.
//
// diloco_outer_delta and diloco_outer_step on awkward lengths (1, 7, 1000, 4099 and 65537 off the
// emulator), values spread over 2^-20 .. 2^6, outer lr and momentum drawn at random (mu = 0 and
// lr = 1 included: the step then copies the average), 1 to 3 islands; every output (delta,
// synchronised weights, momentum, weights) poisoned before the call and compared whole.
#include <cstring>

#include "test/gpu/harness.h"

namespace {

std::vector<float> spread_values(TestContext& ctx, size_t n) {
  std::vector<float> x = random_vector(ctx, n);
  std::uniform_int_distribution<int> expo(-20, 6);
  for (float& v : x) v = std::ldexp(v, expo(ctx.rng));
  return x;
}

bool bitwise(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// A device copy of `host` in a buffer of its own (ops::release it).
float* device_copy(const std::vector<float>& host) {
  return static_cast<float*>(to_device(host, DType::F32));
}

void check_delta(TestContext& ctx, size_t n) {
  const std::vector<float> sync = spread_values(ctx, n), w = spread_values(ctx, n);
  std::vector<float> want(n);
  ref::diloco_outer_delta(want.data(), sync.data(), w.data(), n, ctx.ref_stream);
  float *d_sync = device_copy(sync), *d_w = device_copy(w);
  auto* d_delta = static_cast<float*>(ops::alloc(n * 4));
  poison(d_delta, n * 4);
  ops::diloco_outer_delta(d_delta, d_sync, d_w, n, ctx.stream);
  expect(ctx, bitwise(to_host(d_delta, n, DType::F32), want),
         "diloco_outer_delta n = " + std::to_string(n) + ": bitwise");
  ops::release(d_sync), ops::release(d_w), ops::release(d_delta);
}

void check_step(TestContext& ctx, size_t n, int islands, float lr, float mu) {
  std::vector<float> sync = spread_values(ctx, n), m = spread_values(ctx, n),
                     delta = spread_values(ctx, n), w(n);
  float *d_sync = device_copy(sync), *d_m = device_copy(m), *d_delta = device_copy(delta);
  auto* d_w = static_cast<float*>(ops::alloc(n * 4));
  poison(d_w, n * 4);
  const float inv = 1.0f / (float)islands;
  ref::diloco_outer_step(sync.data(), m.data(), w.data(), delta.data(), n, inv, lr, mu,
                         ctx.ref_stream);
  ops::diloco_outer_step(d_sync, d_m, d_w, d_delta, n, inv, lr, mu, ctx.stream);
  const bool same = bitwise(to_host(d_sync, n, DType::F32), sync) &&
                    bitwise(to_host(d_m, n, DType::F32), m) &&
                    bitwise(to_host(d_w, n, DType::F32), w) && bitwise(w, sync);
  char what[160];
  std::snprintf(what, sizeof(what), "diloco_outer_step n = %zu, K = %d, lr %.3g, mu %.3g: sync, "
                "momentum and weights bitwise", n, islands, lr, mu);
  expect(ctx, same, what);
  ops::release(d_sync), ops::release(d_m), ops::release(d_delta), ops::release(d_w);
}

}  // namespace

GPU_TEST(diloco_outer_step) {
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (size_t n : {(size_t)1, (size_t)7, (size_t)1000, (size_t)4099, (size_t)65537}) {
    if (ctx.emulated && n > 4099) continue;  // the emulator runs each thread as a fiber
    check_delta(ctx, n);
    check_step(ctx, n, 1, 1.0f, 0.0f);
    for (int islands : {2, 3}) check_step(ctx, n, islands, 0.1f + unit(ctx.rng), 0.99f * unit(ctx.rng));
  }
}
