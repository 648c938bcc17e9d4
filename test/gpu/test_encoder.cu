// test/gpu/test_encoder.cu - encoder_forward / encoder_backward (CUDA) against the CPU oracle.
//
// Shapes cover the scalar path (C = 37, and C = 36 in bf16 where a pack is 8 elements), the
// vector path with many lanes per run (C = 40), and GPT-2 124M's real size (B=4, T=1024, C=768,
// Vp=50304). Tokens are skewed (a quarter of the positions use 4 frequent tokens) so that the
// backward pass sees long runs of equal tokens; one case uses a single token everywhere.
// bf16 cases feed both backends the same bf16-rounded inputs; the oracle runs in fp32.
// The backward accumulates into randomly pre-filled dwte/dwpe (the "+=" contract) and is run
// twice from the same state to check that it is bitwise deterministic.
#include <cstring>

#include "test/gpu/harness.h"

namespace {

struct Case {
  int B, T, C, Vp;
  bool one_token;  // every position holds the same token: one run of B*T rows
};

double tolerance(DType dt) { return dt == DType::F32 ? 1e-5 : 1e-2; }

std::string label(const char* op, const Case& k, DType dt, const char* what) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%s %s B=%d T=%d C=%d%s %s", op, dtype_name(dt), k.B, k.T, k.C,
                k.one_token ? " one-token" : "", what);
  return buf;
}

std::vector<int> random_tokens(TestContext& ctx, const Case& k) {
  std::uniform_int_distribution<int> any(0, k.Vp - 1), frequent(0, 3), coin(0, 3);
  const int fixed = any(ctx.rng);
  std::vector<int> tokens((size_t)k.B * k.T);
  for (auto& t : tokens) {
    if (k.one_token) t = fixed;
    else t = coin(ctx.rng) == 0 ? 7 * frequent(ctx.rng) % k.Vp : any(ctx.rng);
  }
  return tokens;
}

int* tokens_to_device(const std::vector<int>& tokens) {
  int* d = static_cast<int*>(ops::alloc(tokens.size() * sizeof(int)));
  ops::copy_to_device(d, tokens.data(), tokens.size() * sizeof(int));
  return d;
}

void check_forward(TestContext& ctx, const Case& k, DType dt) {
  const size_t N = (size_t)k.B * k.T, C = k.C;
  auto wte = rounded(random_vector(ctx, k.Vp * C), dt);
  auto wpe = rounded(random_vector(ctx, k.T * C), dt);
  auto tokens = random_tokens(ctx, k);
  void* d_wte = to_device(wte, dt);
  void* d_wpe = to_device(wpe, dt);
  int* d_tokens = tokens_to_device(tokens);
  void* d_out = ops::alloc(N * C * dtype_size(dt));
  poison(d_out, N * C * dtype_size(dt));

  ops::encoder_forward(d_out, d_tokens, d_wte, d_wpe, k.B, k.T, k.C, dt, ctx.stream);
  std::vector<float> want(N * C);
  ref::encoder_forward(want.data(), tokens.data(), wte.data(), wpe.data(), k.B, k.T, k.C,
                       DType::F32, ctx.ref_stream);
  check_close(ctx, label("encoder_forward", k, dt, "out"), to_host(d_out, N * C, dt).data(),
              want.data(), N * C, tolerance(dt));
  for (void* p : {d_wte, d_wpe, d_out, (void*)d_tokens}) ops::release(p);
}

// Records a failure unless the two host vectors hold the same bits.
void check_bitwise(TestContext& ctx, const std::string& what, const std::vector<float>& a,
                   const std::vector<float>& b) {
  bool same = a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
  ctx.checks++;
  if (!same) ctx.failures++;
  std::printf("  %-48s %s\n", what.c_str(), same ? "bitwise equal ok" : "differ FAIL");
}

void check_backward(TestContext& ctx, const Case& k, DType dt) {
  const size_t N = (size_t)k.B * k.T, C = k.C;
  const size_t wte_n = k.Vp * C, wpe_n = k.T * C;
  auto dout = rounded(random_vector(ctx, N * C), dt);
  auto dwte0 = random_vector(ctx, wte_n);  // "+=": accumulate onto random values
  auto dwpe0 = random_vector(ctx, wpe_n);
  auto tokens = random_tokens(ctx, k);
  void* d_dout = to_device(dout, dt);
  int* d_tokens = tokens_to_device(tokens);
  auto* d_dwte = static_cast<float*>(to_device(dwte0, DType::F32));
  auto* d_dwpe = static_cast<float*>(to_device(dwpe0, DType::F32));

  ops::encoder_backward(d_dwte, d_dwpe, d_dout, d_tokens, k.B, k.T, k.C, dt, ctx.stream);
  auto got_dwte = to_host(d_dwte, wte_n, DType::F32);
  auto got_dwpe = to_host(d_dwpe, wpe_n, DType::F32);
  std::vector<float> want_dwte(dwte0), want_dwpe(dwpe0);
  ref::encoder_backward(want_dwte.data(), want_dwpe.data(), dout.data(), tokens.data(), k.B, k.T,
                        k.C, DType::F32, ctx.ref_stream);
  // fp32 accumulations of identical inputs: only the summation order differs, in both dtypes.
  check_close(ctx, label("encoder_backward", k, dt, "dwte"), got_dwte.data(), want_dwte.data(),
              wte_n, 1e-5);
  check_close(ctx, label("encoder_backward", k, dt, "dwpe"), got_dwpe.data(), want_dwpe.data(),
              wpe_n, 1e-5);

  // Second run from the same state: bitwise the same.
  ops::copy_to_device(d_dwte, dwte0.data(), wte_n * 4);
  ops::copy_to_device(d_dwpe, dwpe0.data(), wpe_n * 4);
  ops::encoder_backward(d_dwte, d_dwpe, d_dout, d_tokens, k.B, k.T, k.C, dt, ctx.stream);
  check_bitwise(ctx, label("encoder_backward", k, dt, "dwte rerun"), got_dwte,
                to_host(d_dwte, wte_n, DType::F32));
  check_bitwise(ctx, label("encoder_backward", k, dt, "dwpe rerun"), got_dwpe,
                to_host(d_dwpe, wpe_n, DType::F32));
  for (void* p : {d_dout, (void*)d_tokens, (void*)d_dwte, (void*)d_dwpe}) ops::release(p);
}

const Case kCases[] = {
    {2, 5, 37, 11, false},       // scalar path, odd everything
    {3, 7, 36, 19, false},       // fp32: vector (36 % 4 == 0); bf16: scalar (36 % 8 != 0)
    {2, 33, 40, 3, false},       // vector path, few packs per row: many lanes per run
    {4, 65, 96, 128, true},      // one run of 260 rows: several steps of every lane
    {4, 1024, 768, 50304, false},  // GPT-2 124M
};

}  // namespace

GPU_TEST(encoder_forward) {
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case& k : kCases) check_forward(ctx, k, dt);
}

GPU_TEST(encoder_backward) {
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case& k : kCases) check_backward(ctx, k, dt);
}
