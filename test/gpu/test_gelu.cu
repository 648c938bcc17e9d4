// test/gpu/test_gelu.cu - gelu_forward / gelu_backward (CUDA) against the CPU oracle.
//
// Sizes: 1, 7 and 37 elements (scalar tail only), 1,000,003 (vector path plus a tail), GPT-2
// 124M's MLP activation (4*1024 x 3072), and 37 / 1001 elements starting one element past an
// aligned address (the scalar path for unaligned pointers). Inputs span the interesting range of
// GELU (standard deviation 3: both tails and the curved middle). The backward runs both out of
// place and in place (dinp == dout, which the contract allows). bf16 cases feed both backends
// the same bf16-rounded inputs; the oracle runs in fp32.
#include "test/gpu/harness.h"

namespace {

struct Case {
  size_t n;
  size_t offset;  // elements past the start of the allocation: 1 makes every pointer unaligned
};

double tolerance(DType dt) { return dt == DType::F32 ? 1e-5 : 1e-2; }

std::string label(const char* op, const Case& k, DType dt, const char* what) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%s %s n=%zu%s %s", op, dtype_name(dt), k.n,
                k.offset ? " unaligned" : "", what);
  return buf;
}

// Device copy of host values (as dt) starting `offset` elements into a fresh allocation; the
// allocation itself is returned in `base` for release.
void* to_device_at(const std::vector<float>& host, size_t offset, DType dt, void** base) {
  std::vector<float> padded(offset, 0.0f);
  padded.insert(padded.end(), host.begin(), host.end());
  *base = to_device(padded, dt);
  return static_cast<char*>(*base) + offset * dtype_size(dt);
}

void check_gelu(TestContext& ctx, const Case& k, DType dt) {
  const size_t n = k.n, es = dtype_size(dt);
  auto inp = rounded(random_vector(ctx, n, 3.0f), dt);
  auto dout = rounded(random_vector(ctx, n), dt);
  void *inp_base, *out_base, *dout_base, *dinp_base;
  void* d_inp = to_device_at(inp, k.offset, dt, &inp_base);
  void* d_out = to_device_at(inp, k.offset, dt, &out_base);  // overwritten after the poison
  void* d_dout = to_device_at(dout, k.offset, dt, &dout_base);
  void* d_dinp = to_device_at(dout, k.offset, dt, &dinp_base);

  poison(d_out, n * es);
  ops::gelu_forward(d_out, d_inp, n, dt, ctx.stream);
  std::vector<float> out(n);
  ref::gelu_forward(out.data(), inp.data(), n, DType::F32, ctx.ref_stream);
  check_close(ctx, label("gelu_forward", k, dt, "out"), to_host(d_out, n, dt).data(), out.data(),
              n, tolerance(dt));

  std::vector<float> dinp(n);
  ref::gelu_backward(dinp.data(), inp.data(), dout.data(), n, DType::F32, ctx.ref_stream);
  poison(d_dinp, n * es);
  ops::gelu_backward(d_dinp, d_inp, d_dout, n, dt, ctx.stream);
  check_close(ctx, label("gelu_backward", k, dt, "dinp"), to_host(d_dinp, n, dt).data(),
              dinp.data(), n, tolerance(dt));
  ops::gelu_backward(d_dout, d_inp, d_dout, n, dt, ctx.stream);  // in place
  check_close(ctx, label("gelu_backward", k, dt, "dinp in place"), to_host(d_dout, n, dt).data(),
              dinp.data(), n, tolerance(dt));
  for (void* p : {inp_base, out_base, dout_base, dinp_base}) ops::release(p);
}

const Case kCases[] = {
    {1, 0}, {7, 0}, {37, 0}, {1000003, 0}, {4 * 1024 * 3072, 0}, {37, 1}, {1001, 1},
};

}  // namespace

GPU_TEST(gelu) {  // on the emulator without GPT-2's activation (1,000,003 has both paths)
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case& k : kCases)
      if (!(ctx.emulated && k.n > 2000000)) check_gelu(ctx, k, dt);
}
