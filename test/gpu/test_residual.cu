// test/gpu/test_residual.cu - add_bias_residual (CUDA) against the CPU oracle.
//
// Shapes: C = 37 and C = 1 (scalar path only), C = 36 (fp32 vector path, bf16 scalar: a bf16
// pack is 8 elements), C = 40 and GPT-2 124M's width (4*1024 x 768, vector path), and C = 40
// with every pointer one element past an aligned address (scalar path for unaligned pointers).
// Each shape runs with bias and residual, with only one of them, and with neither (out = inp),
// both out of place and in place (out == inp, which the contract allows). N = 0 must launch
// nothing and leave out alone. bf16 cases feed both backends the same bf16-rounded inputs; the
// oracle runs in fp32, so the bf16 result (rounded once) is compared at 1e-2, fp32 at 1e-5.
// On the emulator (GPU_TEST_EMULATED) the GPT-2 shape keeps its width with 256 rows.
#include <cstring>

#include "test/gpu/harness.h"

namespace {

struct Case {
  int N, C;
  size_t offset;  // elements past the start of each allocation: 1 makes every pointer unaligned
};

double tolerance(DType dt) { return dt == DType::F32 ? 1e-5 : 1e-2; }

std::string label(const Case& k, DType dt, bool bias, bool residual, bool in_place) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "add_bias_residual %s N=%d C=%d%s%s%s%s out", dtype_name(dt),
                k.N, k.C, k.offset ? " unaligned" : "", bias ? " +bias" : "",
                residual ? " +residual" : "", in_place ? " in place" : "");
  return buf;
}

// Device copy of host values (as dt) starting `offset` elements into a fresh allocation; the
// allocation itself goes to `bases` for release.
void* to_device_at(const std::vector<float>& host, size_t offset, DType dt,
                   std::vector<void*>& bases) {
  std::vector<float> padded(offset, 0.0f);
  padded.insert(padded.end(), host.begin(), host.end());
  bases.push_back(to_device(padded, dt));
  return static_cast<char*>(bases.back()) + offset * dtype_size(dt);
}

void check_case(TestContext& ctx, const Case& k, DType dt, bool with_bias, bool with_residual,
                bool in_place) {
  const size_t n = (size_t)k.N * k.C;
  auto inp = rounded(random_vector(ctx, n), dt);
  auto bias = rounded(random_vector(ctx, k.C), dt);
  auto residual = rounded(random_vector(ctx, n), dt);
  std::vector<void*> bases;
  void* d_inp = to_device_at(inp, k.offset, dt, bases);
  void* d_bias = with_bias ? to_device_at(bias, k.offset, dt, bases) : nullptr;
  void* d_residual = with_residual ? to_device_at(residual, k.offset, dt, bases) : nullptr;
  void* d_out = d_inp;
  if (!in_place) {
    d_out = to_device_at(inp, k.offset, dt, bases);
    poison(d_out, n * dtype_size(dt));
  }

  ops::add_bias_residual(d_out, d_inp, d_bias, d_residual, k.N, k.C, dt, ctx.stream);
  std::vector<float> want(n);
  ref::add_bias_residual(want.data(), inp.data(), with_bias ? bias.data() : nullptr,
                         with_residual ? residual.data() : nullptr, k.N, k.C, DType::F32,
                         ctx.ref_stream);
  check_close(ctx, label(k, dt, with_bias, with_residual, in_place),
              to_host(d_out, n, dt).data(), want.data(), n, tolerance(dt));
  for (void* p : bases) ops::release(p);
}

// N = 0: no launch, and the (poisoned) output is left as it was.
void check_empty(TestContext& ctx, DType dt) {
  const size_t bytes = 16 * dtype_size(dt);
  void* d_out = ops::alloc(bytes);
  poison(d_out, bytes);
  ops::add_bias_residual(d_out, d_out, nullptr, nullptr, 0, 16, dt, ctx.stream);
  ops::stream_sync(ctx.stream);
  std::vector<unsigned char> got(bytes), ff(bytes, 0xFF);
  ops::copy_to_host(got.data(), d_out, bytes);
  const bool same = std::memcmp(got.data(), ff.data(), bytes) == 0;
  ctx.checks++;
  if (!same) ctx.failures++;
  std::printf("  %-48s %s\n", (std::string("add_bias_residual ") + dtype_name(dt) + " N=0").c_str(),
              same ? "untouched ok" : "written FAIL");
  ops::release(d_out);
}

const Case kCases[] = {
    {5, 37, 0}, {3, 1, 0}, {7, 36, 0}, {9, 40, 0}, {4 * 1024, 768, 0}, {9, 40, 1},
};

}  // namespace

GPU_TEST(add_bias_residual) {
  for (DType dt : {DType::F32, DType::BF16}) {
    for (Case k : kCases) {
      if (ctx.emulated && k.N > 256) k.N = 256;  // GPT-2's width, fewer rows
      for (int mask = 0; mask < 4; mask++)  // bias, residual: each present or not
        for (bool in_place : {false, true})
          check_case(ctx, k, dt, mask & 1, mask & 2, in_place);
    }
    check_empty(ctx, dt);
  }
}
