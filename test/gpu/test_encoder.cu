// test/gpu/test_encoder.cu - encoder_forward / encoder_backward (CUDA) against the CPU oracle.
//
// Shapes cover the scalar path (C = 37, and C = 36 in bf16 where a pack is 8 elements), the
// vector path with many lanes per run (C = 40), and GPT-2 124M's real size (B=4, T=1024, C=768,
// Vp=50304; on the emulator, GPU_TEST_EMULATED, B=2, T=64). Tokens are skewed (a quarter of the
// positions use 4 frequent tokens) so that the backward pass sees long runs of equal tokens; one
// case uses a single token everywhere.
// bf16 cases feed both backends the same bf16-rounded inputs; the oracle runs in fp32.
// The backward accumulates into randomly pre-filled dwte/dwpe (the "+=" contract) and is run
// twice from the same state to check that it is bitwise deterministic.
// Vocabulary-parallel cases give wte only the rows [first, first + rows) of a Vp-row vocabulary
// while the tokens are drawn from all of it (so some fall inside, some outside the range: the
// outside ones must read zeros and receive no gradient), some of them without wpe / dwpe.
#include <cstring>

#include "test/gpu/harness.h"

namespace {

struct Case {
  int B, T, C, Vp;
  bool one_token;  // every position holds the same token: one run of B*T rows
  int first = 0;   // vocabulary-parallel: wte holds rows [first, first + rows); rows 0 = all
  int rows = 0;
  bool no_wpe = false;  // wpe (forward) and dwpe (backward) are nullptr

  int wte_rows() const { return rows ? rows : Vp; }
  int vocab_rows() const { return rows ? rows : kAllVocabRows; }  // the op's argument
};

double tolerance(DType dt) { return dt == DType::F32 ? 1e-5 : 1e-2; }

std::string label(const char* op, const Case& k, DType dt, const char* what) {
  char buf[160];
  char range[64] = "";
  if (k.rows) std::snprintf(range, sizeof(range), " vocab [%d,%d)", k.first, k.first + k.rows);
  std::snprintf(buf, sizeof(buf), "%s %s B=%d T=%d C=%d%s%s%s %s", op, dtype_name(dt), k.B, k.T,
                k.C, k.one_token ? " one-token" : "", range, k.no_wpe ? " no-wpe" : "", what);
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
  auto wte = rounded(random_vector(ctx, k.wte_rows() * C), dt);
  auto wpe = rounded(random_vector(ctx, k.T * C), dt);
  auto tokens = random_tokens(ctx, k);
  void* d_wte = to_device(wte, dt);
  void* d_wpe = to_device(wpe, dt);
  const float* h_wpe = k.no_wpe ? nullptr : wpe.data();
  int* d_tokens = tokens_to_device(tokens);
  void* d_out = ops::alloc(N * C * dtype_size(dt));
  poison(d_out, N * C * dtype_size(dt));

  ops::encoder_forward(d_out, d_tokens, d_wte, k.no_wpe ? nullptr : d_wpe, k.B, k.T, k.C, dt,
                       ctx.stream, k.first, k.vocab_rows());
  std::vector<float> want(N * C);
  ref::encoder_forward(want.data(), tokens.data(), wte.data(), h_wpe, k.B, k.T, k.C, DType::F32,
                       ctx.ref_stream, k.first, k.vocab_rows());
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
  const size_t wte_n = k.wte_rows() * C, wpe_n = k.T * C;
  auto dout = rounded(random_vector(ctx, N * C), dt);
  auto dwte0 = random_vector(ctx, wte_n);  // "+=": accumulate onto random values
  auto dwpe0 = random_vector(ctx, wpe_n);
  auto tokens = random_tokens(ctx, k);
  void* d_dout = to_device(dout, dt);
  int* d_tokens = tokens_to_device(tokens);
  auto* d_dwte = static_cast<float*>(to_device(dwte0, DType::F32));
  auto* d_dwpe = static_cast<float*>(to_device(dwpe0, DType::F32));
  // Without dwpe the device buffer must come back untouched: it is passed as nullptr.
  float* dwpe_arg = k.no_wpe ? nullptr : d_dwpe;

  ops::encoder_backward(d_dwte, dwpe_arg, d_dout, d_tokens, k.B, k.T, k.C, dt, ctx.stream,
                        k.first, k.vocab_rows());
  auto got_dwte = to_host(d_dwte, wte_n, DType::F32);
  auto got_dwpe = to_host(d_dwpe, wpe_n, DType::F32);
  std::vector<float> want_dwte(dwte0), want_dwpe(dwpe0);
  ref::encoder_backward(want_dwte.data(), k.no_wpe ? nullptr : want_dwpe.data(), dout.data(),
                        tokens.data(), k.B, k.T, k.C, DType::F32, ctx.ref_stream, k.first,
                        k.vocab_rows());
  // fp32 accumulations of identical inputs: only the summation order differs, in both dtypes.
  check_close(ctx, label("encoder_backward", k, dt, "dwte"), got_dwte.data(), want_dwte.data(),
              wte_n, 1e-5);
  check_close(ctx, label("encoder_backward", k, dt, "dwpe"), got_dwpe.data(), want_dwpe.data(),
              wpe_n, 1e-5);

  // Second run from the same state: bitwise the same.
  ops::copy_to_device(d_dwte, dwte0.data(), wte_n * 4);
  ops::copy_to_device(d_dwpe, dwpe0.data(), wpe_n * 4);
  ops::encoder_backward(d_dwte, dwpe_arg, d_dout, d_tokens, k.B, k.T, k.C, dt, ctx.stream,
                        k.first, k.vocab_rows());
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

// Vocabulary-parallel shards: tokens from all Vp rows, wte holding only [first, first + rows).
// The frequent tokens (7 * {0,1,2,3} mod Vp) fall inside some ranges and outside others.
const Case kRangeCases[] = {
    {2, 5, 37, 11, false, 0, 6, true},        // scalar path, no wpe, first shard
    {3, 17, 37, 101, false, 40, 30, false},   // scalar path, middle shard, with wpe
    {3, 7, 36, 19, false, 12, 7, true},       // fp32 vector, bf16 scalar, last shard
    {4, 65, 96, 128, true, 64, 64, false},    // one token everywhere: all in or all out
    {2, 33, 40, 300, false, 100, 100, true},  // vector path, many lanes per run, no wpe
    {4, 1024, 768, 50304, false, 25152, 12576, true},  // GPT-2 124M, shard 2 of 4, tp rank > 0
    {4, 1024, 768, 50304, false, 0, 12576, false},     // GPT-2 124M, shard 0 of 4, tp rank 0
};

// On the emulator GPT-2 124M's 4 x 1024 positions shrink to 2 x 64 (same C, same vocabulary).
// Emulated: GPT-2's cases with 2 x 64 tokens and a 16th of the vocabulary (and of its shards):
// the same paths, a 16th of the table to fill, copy and compare (the wte alone was 38.6M values).
Case for_device(const TestContext& ctx, Case k) {
  if (ctx.emulated && k.B * k.T > 4096 - 1) {
    k.B = 2;
    k.T = 64;
    k.Vp /= 16, k.first /= 16, k.rows /= 16;
  }
  return k;
}

}  // namespace

GPU_TEST(encoder_forward) {
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case& k : kCases) check_forward(ctx, for_device(ctx, k), dt);
}

GPU_TEST(encoder_backward) {
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case& k : kCases) check_backward(ctx, for_device(ctx, k), dt);
}

GPU_TEST(encoder_vocab_range) {
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case& k : kRangeCases) {
      check_forward(ctx, for_device(ctx, k), dt);
      check_backward(ctx, for_device(ctx, k), dt);
    }
}
