// test/gpu/test_classifier.cu - classifier_forward_backward (CUDA) against the CPU oracle.
//
// Shapes: V=37 inside Vp=40 (vector path with a scalar tail of the vocabulary), V=Vp=37 (the
// scalar path), V=1000 inside Vp=1024, and GPT-2's real vocabulary (V=50257, Vp=50304) for 256
// rows. About one target in six is -1 (ignored: loss 0, zero gradient row). The padded columns
// hold large logits (100 + noise): if they leaked into the softmax the losses would be off by
// ~100. One case uses logits of standard deviation 30 (the online softmax must rescale without
// overflow). Each case runs with dloss = 1/N (losses and in-place gradient, padded columns must
// come back as 0) and with dloss = 0 (losses only; the logits must be left bit for bit).
// bf16 cases feed both backends the same bf16-rounded logits; the oracle runs in fp32, so the
// losses are compared at 1e-5 in both dtypes and the bf16 gradient at 1e-2.
#include <cstring>

#include "test/gpu/harness.h"

namespace {

struct Case {
  int N, V, Vp;
  float scale;  // standard deviation of the logits
};

std::string label(const Case& k, DType dt, float dloss, const char* what) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "classifier %s N=%d V=%d Vp=%d sd=%g%s %s", dtype_name(dt),
                k.N, k.V, k.Vp, k.scale, dloss == 0.0f ? " dloss=0" : "", what);
  return buf;
}

std::vector<float> random_logits(TestContext& ctx, const Case& k, DType dt) {
  auto x = random_vector(ctx, (size_t)k.N * k.Vp, k.scale);
  for (int n = 0; n < k.N; n++)
    for (int c = k.V; c < k.Vp; c++) x[(size_t)n * k.Vp + c] += 100.0f;
  return rounded(x, dt);
}

std::vector<int> random_targets(TestContext& ctx, const Case& k) {
  std::uniform_int_distribution<int> any(0, k.V - 1), die(0, 5);
  std::vector<int> t(k.N);
  for (auto& x : t) x = die(ctx.rng) == 0 ? -1 : any(ctx.rng);
  t[0] = k.V - 1;  // the last real column, next to the padding
  return t;
}

void check_case(TestContext& ctx, const Case& k, DType dt, bool backward) {
  const size_t n = (size_t)k.N * k.Vp;
  const float dloss = backward ? 1.0f / k.N : 0.0f;
  auto logits = random_logits(ctx, k, dt);
  auto targets = random_targets(ctx, k);
  void* d_logits = to_device(logits, dt);
  int* d_targets = static_cast<int*>(ops::alloc(k.N * sizeof(int)));
  ops::copy_to_device(d_targets, targets.data(), k.N * sizeof(int));
  auto* d_losses = static_cast<float*>(ops::alloc(k.N * sizeof(float)));
  poison(d_losses, k.N * sizeof(float));

  ops::classifier_forward_backward(d_logits, d_losses, d_targets, dloss, k.N, k.V, k.Vp, dt,
                                   ctx.stream);
  std::vector<float> want_logits(logits), want_losses(k.N);
  ref::classifier_forward_backward(want_logits.data(), want_losses.data(), targets.data(), dloss,
                                   k.N, k.V, k.Vp, DType::F32, ctx.ref_stream);
  check_close(ctx, label(k, dt, dloss, "losses"), to_host(d_losses, k.N, DType::F32).data(),
              want_losses.data(), k.N, 1e-5);
  auto got_logits = to_host(d_logits, n, dt);
  if (backward) {
    check_close(ctx, label(k, dt, dloss, "dlogits"), got_logits.data(), want_logits.data(), n,
                dt == DType::F32 ? 1e-5 : 1e-2);
  } else {
    bool same = std::memcmp(got_logits.data(), logits.data(), n * 4) == 0;
    ctx.checks++;
    if (!same) ctx.failures++;
    std::printf("  %-48s %s\n", label(k, dt, dloss, "logits untouched").c_str(),
                same ? "ok" : "FAIL");
  }
  for (void* p : {d_logits, (void*)d_targets, (void*)d_losses}) ops::release(p);
}

const Case kCases[] = {
    {5, 37, 40, 2.0f},   {3, 37, 37, 2.0f},    {7, 1000, 1024, 30.0f},
    {33, 1000, 1024, 2.0f}, {256, 50257, 50304, 2.0f},
};

}  // namespace

GPU_TEST(classifier_forward_backward) {
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case& k : kCases) {
      check_case(ctx, k, dt, true);
      check_case(ctx, k, dt, false);
    }
}
