// test/gpu/test_rmsnorm.cu - rmsnorm_forward / rmsnorm_backward (CUDA) against the CPU oracle.
//
// Shapes: the scalar path (C = 37; C = 36 in bf16, whose pack is 8), the vector path (C = 40,
// 768, 4096: Llama-3 8B's width), many rows per backward block (N = 3000), GPT-2 XL's width
// (C = 1600) and a wide odd row (C = 6001: more than 24 KiB of shared memory per backward warp).
// On the emulator (GPU_TEST_EMULATED) the large shapes have at most 512 rows. Inputs have a
// non-zero mean and a non-unit spread, as activations do, and row 0 is 100 times smaller so that
// eps (1e-5, and 1e-2 in one case) matters there. bf16 cases feed both backends the same
// bf16-rounded inputs; the oracle runs in fp32 (so bf16 outputs are compared at 1e-2, fp32
// rstd and weight gradients at 1e-5). The backward pass accumulates into randomly pre-filled
// dinp and dweight, takes the oracle's rstd on both sides, and is run twice from the same state
// to check that it is bitwise deterministic.
#include <algorithm>
#include <cstring>

#include "test/gpu/harness.h"

namespace {

struct Case {
  int N, C;
  float eps;
};

double tolerance(DType dt) { return dt == DType::F32 ? 1e-5 : 1e-2; }

std::string label(const char* op, const Case& k, DType dt, const char* what) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%s %s N=%d C=%d eps=%g %s", op, dtype_name(dt), k.N, k.C,
                k.eps, what);
  return buf;
}

// Activations: mean 0.5, standard deviation 2; row 0 scaled by 0.01.
std::vector<float> activations(TestContext& ctx, const Case& k, DType dt) {
  auto x = random_vector(ctx, (size_t)k.N * k.C, 2.0f);
  for (size_t i = 0; i < x.size(); i++) x[i] = (x[i] + 0.5f) * (i < (size_t)k.C ? 0.01f : 1.0f);
  return rounded(x, dt);
}

// Norm weights: 1 +- 0.1.
std::vector<float> norm_weight(TestContext& ctx, int C, DType dt) {
  auto w = random_vector(ctx, C, 0.1f);
  for (auto& v : w) v += 1.0f;
  return rounded(w, dt);
}

void expect_same(TestContext& ctx, const std::string& what, const std::vector<float>& a,
                 const std::vector<float>& b) {
  expect(ctx, a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0,
         what + " bitwise equal");
}

void check_forward(TestContext& ctx, const Case& k, DType dt) {
  const size_t N = k.N, C = k.C, es = dtype_size(dt);
  auto inp = activations(ctx, k, dt);
  auto weight = norm_weight(ctx, k.C, dt);
  void* d_inp = to_device(inp, dt);
  void* d_weight = to_device(weight, dt);
  void* d_out = ops::alloc(N * C * es);
  auto* d_rstd = static_cast<float*>(ops::alloc(N * 4));
  poison(d_out, N * C * es);
  poison(d_rstd, N * 4);

  ops::rmsnorm_forward(d_out, d_rstd, d_inp, d_weight, k.N, k.C, k.eps, dt, ctx.stream);
  std::vector<float> out(N * C), rstd(N);
  ref::rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), k.N, k.C, k.eps,
                       DType::F32, ctx.ref_stream);
  check_close(ctx, label("rmsnorm_forward", k, dt, "out"), to_host(d_out, N * C, dt).data(),
              out.data(), N * C, tolerance(dt));
  check_close(ctx, label("rmsnorm_forward", k, dt, "rstd"),
              to_host(d_rstd, N, DType::F32).data(), rstd.data(), N, 1e-5);
  for (void* p : {d_inp, d_weight, d_out, (void*)d_rstd}) ops::release(p);
}

void check_backward(TestContext& ctx, const Case& k, DType dt) {
  const size_t N = k.N, C = k.C;
  auto inp = activations(ctx, k, dt);
  auto weight = norm_weight(ctx, k.C, dt);
  auto dout = rounded(random_vector(ctx, N * C), dt);
  auto dinp0 = rounded(random_vector(ctx, N * C), dt);  // "+=": the residual stream's gradient
  auto dweight0 = random_vector(ctx, C);
  std::vector<float> out(N * C), rstd(N);  // rstd from the oracle, given to both backward passes
  ref::rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), k.N, k.C, k.eps,
                       DType::F32, ctx.ref_stream);

  void* d_inp = to_device(inp, dt);
  void* d_weight = to_device(weight, dt);
  void* d_dout = to_device(dout, dt);
  void* d_dinp = to_device(dinp0, dt);
  auto* d_dweight = static_cast<float*>(to_device(dweight0, DType::F32));
  auto* d_rstd = static_cast<float*>(to_device(rstd, DType::F32));
  auto run = [&] {
    ops::rmsnorm_backward(d_dinp, d_dweight, d_dout, d_inp, d_weight, d_rstd, k.N, k.C, dt,
                          ctx.stream);
  };
  run();
  auto got_dinp = to_host(d_dinp, N * C, dt);
  auto got_dweight = to_host(d_dweight, C, DType::F32);

  std::vector<float> dinp(dinp0), dweight(dweight0);
  ref::rmsnorm_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(),
                        rstd.data(), k.N, k.C, DType::F32, ctx.ref_stream);
  check_close(ctx, label("rmsnorm_backward", k, dt, "dinp"), got_dinp.data(), dinp.data(), N * C,
              tolerance(dt));
  check_close(ctx, label("rmsnorm_backward", k, dt, "dweight"), got_dweight.data(),
              dweight.data(), C, 1e-5);

  // Second run from the same state: bitwise the same.
  ops::copy_to_device(d_dweight, dweight0.data(), C * 4);
  ops::release(d_dinp);
  d_dinp = to_device(dinp0, dt);
  run();
  expect_same(ctx, label("rmsnorm_backward", k, dt, "dinp rerun"), got_dinp,
              to_host(d_dinp, N * C, dt));
  expect_same(ctx, label("rmsnorm_backward", k, dt, "dweight rerun"), got_dweight,
              to_host(d_dweight, C, DType::F32));
  for (void* p : {d_inp, d_weight, d_dout, d_dinp, (void*)d_dweight, (void*)d_rstd})
    ops::release(p);
}

const Case kCases[] = {
    {7, 37, 1e-5f},   {5, 36, 1e-5f},   {9, 40, 1e-2f},   {3000, 40, 1e-5f},
    {4096, 768, 1e-5f}, {2048, 4096, 1e-5f}, {64, 1600, 1e-6f}, {9, 6001, 1e-5f},
};

// On the emulator the model-sized shapes shrink to 512 rows (still many rows per block).
Case for_device(const TestContext& ctx, Case k) {
  if (ctx.emulated && k.N > 3000) k.N = 512;
  if (ctx.emulated && k.C >= 4096) k.N = std::min(k.N, 64);
  return k;
}

}  // namespace

GPU_TEST(rmsnorm_forward) {
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case& k : kCases) check_forward(ctx, for_device(ctx, k), dt);
}

GPU_TEST(rmsnorm_backward) {
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case& k : kCases) check_backward(ctx, for_device(ctx, k), dt);
}
