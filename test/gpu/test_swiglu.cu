// test/gpu/test_swiglu.cu - swiglu_forward / swiglu_backward (CUDA) against the CPU oracle.
//
// Rows of inp (N, 2F) are [gate | up]. Shapes: F = 1, 37 (the scalar path), 40, 200 (the fp32
// vector path; bf16 packs 8, so 40 and 200 are vector there too), 36 (vector in fp32, scalar in
// bf16), Llama-3 8B's per-rank hidden size under tp = 8 (F = 1792), and the buffers one element
// past an aligned address (the scalar path for unaligned pointers). Gates have standard
// deviation 3 (both tails of the sigmoid) and two saturated values, +-95, where exp(-x)
// overflows or underflows. Outputs are poisoned first; compared at 1e-5 (fp32) and 1e-2 (bf16,
// both backends given the same bf16 inputs).
#include "test/gpu/harness.h"

namespace {

struct Case {
  int N, F;
  size_t offset;  // elements past an aligned address
};

double tolerance(DType dt) { return dt == DType::F32 ? 1e-5 : 1e-2; }

std::string label(const char* op, const Case& k, DType dt, const char* what) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%s %s N=%d F=%d%s %s", op, dtype_name(dt), k.N, k.F,
                k.offset ? " unaligned" : "", what);
  return buf;
}

// A device buffer of n elements of dt starting `offset` elements into its allocation (filled
// with `host` when given, poisoned otherwise); the allocation goes to *base.
void* buffer_at(const std::vector<float>* host, size_t n, size_t offset, DType dt, void** base) {
  std::vector<float> padded(offset + n, 0.0f);
  if (host) std::copy(host->begin(), host->end(), padded.begin() + offset);
  *base = to_device(padded, dt);
  void* p = static_cast<char*>(*base) + offset * dtype_size(dt);
  if (!host) poison(p, n * dtype_size(dt));
  return p;
}

void check_swiglu(TestContext& ctx, const Case& k, DType dt) {
  const size_t N = k.N, F = k.F;
  auto inp = random_vector(ctx, N * 2 * F, 3.0f);
  inp[0] = 95.0f;
  if (N * F > 1) inp[(N - 1) * 2 * F + F - 1] = -95.0f;  // the last row's last gate
  inp = rounded(inp, dt);
  auto dout = rounded(random_vector(ctx, N * F), dt);
  void *inp_base, *out_base, *dout_base, *dinp_base;
  void* d_inp = buffer_at(&inp, N * 2 * F, k.offset, dt, &inp_base);
  void* d_dout = buffer_at(&dout, N * F, k.offset, dt, &dout_base);
  void* d_out = buffer_at(nullptr, N * F, k.offset, dt, &out_base);
  void* d_dinp = buffer_at(nullptr, N * 2 * F, k.offset, dt, &dinp_base);

  ops::swiglu_forward(d_out, d_inp, k.N, k.F, dt, ctx.stream);
  std::vector<float> out(N * F), dinp(N * 2 * F);
  ref::swiglu_forward(out.data(), inp.data(), k.N, k.F, DType::F32, ctx.ref_stream);
  check_close(ctx, label("swiglu_forward", k, dt, "out"), to_host(d_out, N * F, dt).data(),
              out.data(), N * F, tolerance(dt));

  ops::swiglu_backward(d_dinp, d_dout, d_inp, k.N, k.F, dt, ctx.stream);
  ref::swiglu_backward(dinp.data(), dout.data(), inp.data(), k.N, k.F, DType::F32,
                       ctx.ref_stream);
  check_close(ctx, label("swiglu_backward", k, dt, "dinp"), to_host(d_dinp, N * 2 * F, dt).data(),
              dinp.data(), N * 2 * F, tolerance(dt));
  for (void* p : {inp_base, out_base, dout_base, dinp_base}) ops::release(p);
}

const Case kCases[] = {
    {1, 1, 0}, {3, 37, 0}, {14, 37, 0}, {5, 36, 0}, {9, 40, 0},
    {33, 200, 0}, {3, 37, 1}, {7, 40, 1}, {4096, 1792, 0},
};

}  // namespace

GPU_TEST(swiglu) {  // on the emulator the model-sized case has 64 rows
  for (DType dt : {DType::F32, DType::BF16})
    for (Case k : kCases) {
      if (ctx.emulated && k.N > 1000) k.N = 64;
      check_swiglu(ctx, k, dt);
    }
}
