// test/gpu/test_layernorm.cu - layernorm_forward / layernorm_backward (CUDA) against the CPU
// oracle.
//
// Shapes: scalar paths (C = 37; C = 36 in bf16), the vector path (C = 40, 768), GPT-2 124M's
// real size (N = 4*1024, C = 768), GPT-2 XL's width (C = 1600: more than 48 KiB of shared
// memory per backward block) and a wide odd row (C = 6001). On the emulator (GPU_TEST_EMULATED)
// the 124M shape has 512 rows. Inputs have a non-zero mean and a
// non-unit spread, as activations do. bf16 cases feed both backends the same bf16-rounded
// inputs; the oracle runs in fp32 (so bf16 outputs are compared at 1e-2, fp32 statistics and
// parameter gradients at 1e-5). The backward pass accumulates into randomly pre-filled dinp,
// dweight and dbias, takes the oracle's mean/rstd on both sides, and is run twice from the same
// state to check that it is bitwise deterministic.
#include <cstring>

#include "test/gpu/harness.h"

namespace {

struct Case {
  int N, C;
};

double tolerance(DType dt) { return dt == DType::F32 ? 1e-5 : 1e-2; }

std::string label(const char* op, const Case& k, DType dt, const char* what) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%s %s N=%d C=%d %s", op, dtype_name(dt), k.N, k.C, what);
  return buf;
}

// Activations: mean 0.5, standard deviation 2.
std::vector<float> activations(TestContext& ctx, size_t n, DType dt) {
  auto x = random_vector(ctx, n, 2.0f);
  for (auto& v : x) v += 0.5f;
  return rounded(x, dt);
}

std::vector<float> around(TestContext& ctx, size_t n, float center, float spread, DType dt) {
  auto x = random_vector(ctx, n, spread);
  for (auto& v : x) v += center;
  return rounded(x, dt);
}

void check_bitwise(TestContext& ctx, const std::string& what, const std::vector<float>& a,
                   const std::vector<float>& b) {
  bool same = a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
  ctx.checks++;
  if (!same) ctx.failures++;
  std::printf("  %-48s %s\n", what.c_str(), same ? "bitwise equal ok" : "differ FAIL");
}

void check_forward(TestContext& ctx, const Case& k, DType dt) {
  const size_t N = k.N, C = k.C, es = dtype_size(dt);
  auto inp = activations(ctx, N * C, dt);
  auto weight = around(ctx, C, 1.0f, 0.1f, dt);
  auto bias = around(ctx, C, 0.0f, 0.1f, dt);
  void* d_inp = to_device(inp, dt);
  void* d_weight = to_device(weight, dt);
  void* d_bias = to_device(bias, dt);
  void* d_out = ops::alloc(N * C * es);
  auto* d_mean = static_cast<float*>(ops::alloc(N * 4));
  auto* d_rstd = static_cast<float*>(ops::alloc(N * 4));
  poison(d_out, N * C * es);
  poison(d_mean, N * 4);
  poison(d_rstd, N * 4);

  ops::layernorm_forward(d_out, d_mean, d_rstd, d_inp, d_weight, d_bias, k.N, k.C, dt,
                         ctx.stream);
  std::vector<float> out(N * C), mean(N), rstd(N);
  ref::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(),
                         bias.data(), k.N, k.C, DType::F32, ctx.ref_stream);
  check_close(ctx, label("layernorm_forward", k, dt, "out"), to_host(d_out, N * C, dt).data(),
              out.data(), N * C, tolerance(dt));
  check_close(ctx, label("layernorm_forward", k, dt, "mean"),
              to_host(d_mean, N, DType::F32).data(), mean.data(), N, 1e-5);
  check_close(ctx, label("layernorm_forward", k, dt, "rstd"),
              to_host(d_rstd, N, DType::F32).data(), rstd.data(), N, 1e-5);
  for (void* p : {d_inp, d_weight, d_bias, d_out, (void*)d_mean, (void*)d_rstd}) ops::release(p);
}

void check_backward(TestContext& ctx, const Case& k, DType dt) {
  const size_t N = k.N, C = k.C;
  auto inp = activations(ctx, N * C, dt);
  auto weight = around(ctx, C, 1.0f, 0.1f, dt);
  auto bias = around(ctx, C, 0.0f, 0.1f, dt);
  auto dout = rounded(random_vector(ctx, N * C), dt);
  auto dinp0 = rounded(random_vector(ctx, N * C), dt);  // "+=": the residual stream's gradient
  auto dweight0 = random_vector(ctx, C);
  auto dbias0 = random_vector(ctx, C);
  // Statistics from the oracle's forward, given to both backward passes.
  std::vector<float> out(N * C), mean(N), rstd(N);
  ref::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(),
                         bias.data(), k.N, k.C, DType::F32, ctx.ref_stream);

  void* d_inp = to_device(inp, dt);
  void* d_weight = to_device(weight, dt);
  void* d_dout = to_device(dout, dt);
  void* d_dinp = to_device(dinp0, dt);
  auto* d_dweight = static_cast<float*>(to_device(dweight0, DType::F32));
  auto* d_dbias = static_cast<float*>(to_device(dbias0, DType::F32));
  auto* d_mean = static_cast<float*>(to_device(mean, DType::F32));
  auto* d_rstd = static_cast<float*>(to_device(rstd, DType::F32));
  auto run = [&] {
    ops::layernorm_backward(d_dinp, d_dweight, d_dbias, d_dout, d_inp, d_weight, d_mean, d_rstd,
                            k.N, k.C, dt, ctx.stream);
  };
  run();
  auto got_dinp = to_host(d_dinp, N * C, dt);
  auto got_dweight = to_host(d_dweight, C, DType::F32);
  auto got_dbias = to_host(d_dbias, C, DType::F32);

  std::vector<float> dinp(dinp0), dweight(dweight0), dbias(dbias0);
  ref::layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                          weight.data(), mean.data(), rstd.data(), k.N, k.C, DType::F32,
                          ctx.ref_stream);
  check_close(ctx, label("layernorm_backward", k, dt, "dinp"), got_dinp.data(), dinp.data(),
              N * C, tolerance(dt));
  check_close(ctx, label("layernorm_backward", k, dt, "dweight"), got_dweight.data(),
              dweight.data(), C, 1e-5);
  check_close(ctx, label("layernorm_backward", k, dt, "dbias"), got_dbias.data(), dbias.data(),
              C, 1e-5);

  // Second run from the same state: bitwise the same.
  ops::copy_to_device(d_dweight, dweight0.data(), C * 4);
  ops::copy_to_device(d_dbias, dbias0.data(), C * 4);
  ops::release(d_dinp);
  d_dinp = to_device(dinp0, dt);
  run();
  check_bitwise(ctx, label("layernorm_backward", k, dt, "dinp rerun"), got_dinp,
                to_host(d_dinp, N * C, dt));
  check_bitwise(ctx, label("layernorm_backward", k, dt, "dweight rerun"), got_dweight,
                to_host(d_dweight, C, DType::F32));
  check_bitwise(ctx, label("layernorm_backward", k, dt, "dbias rerun"), got_dbias,
                to_host(d_dbias, C, DType::F32));
  for (void* p : {d_inp, d_weight, d_dout, d_dinp, (void*)d_dweight, (void*)d_dbias,
                  (void*)d_mean, (void*)d_rstd})
    ops::release(p);
}

const Case kCases[] = {
    {7, 37},     {5, 36},  {9, 40},  {3000, 40}, {4 * 1024, 768},
    {64, 1600},  {9, 6001},
};

// On the emulator, GPT-2 124M's rows shrink to 512 (same width, still many rows per block).
Case for_device(const TestContext& ctx, Case k) {
  if (ctx.emulated && k.N > 3000) k.N = 512;
  return k;
}

}  // namespace

GPU_TEST(layernorm_forward) {
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case& k : kCases) check_forward(ctx, for_device(ctx, k), dt);
}

GPU_TEST(layernorm_backward) {
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case& k : kCases) check_backward(ctx, for_device(ctx, k), dt);
}
