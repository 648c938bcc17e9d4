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
//
// The vocabulary-parallel form (classifier_shard_stats / _merge_stats / _shard_backward) runs on
// the same kind of logits cut into `parts` shards of Vs columns (Vp = parts * Vs): each step is
// compared with the oracle's same step (stats at 1e-5: the oracle sums exp in double, the kernel
// in fp32), and the merged losses and the reassembled gradient also with the unsharded
// classifier_forward_backward. Shapes: V=37 in 5 shards of 12 (fp32 vector path, bf16 scalar;
// shard 3 has one valid column, shard 4 is all padding), V=1001 in 5 shards of 256 (vector path
// with a scalar tail of valid columns in shard 3, shard 4 all padding), V=1000 in 5 shards of 251
// (scalar path, shard 4 all padding), V=1000 in 4 shards of 256 with sd 30, and GPT-2 in 4 shards
// of 12576 (V=50257 is not a multiple of anything). About one target in six is -1. An
// all-padding shard must give max = -inf and sum = 0 exactly, and the merge must skip it without
// a NaN (the losses are checked for finiteness).
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

namespace {

struct ShardCase {
  int N, V, Vs, parts;
  float scale;
  int Vp() const { return Vs * parts; }
};

std::string shard_label(const ShardCase& k, DType dt, const std::string& what) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "classifier shards %s N=%d V=%d %dx%d sd=%g %s", dtype_name(dt),
                k.N, k.V, k.parts, k.Vs, k.scale, what.c_str());
  return buf;
}

// Columns [r * Vs, (r + 1) * Vs) of the (N, Vp) logits, as a contiguous (N, Vs) block.
std::vector<float> shard_of(const std::vector<float>& full, const ShardCase& k, int r) {
  std::vector<float> x((size_t)k.N * k.Vs);
  for (int n = 0; n < k.N; n++)
    std::memcpy(&x[(size_t)n * k.Vs], &full[(size_t)n * k.Vp() + (size_t)r * k.Vs], k.Vs * 4);
  return x;
}

// Stats {max, sum, target logit} per row compared with the oracle's: where the oracle's max is
// -inf (a shard without a valid column) the kernel must give exactly {-inf, 0} too (else a
// failure); that max is then left out of the relative error, which covers the rest.
void check_stats(TestContext& ctx, const std::string& what, std::vector<float> got,
                 std::vector<float> want) {
  int empty_mismatch = 0;
  for (size_t i = 0; i < want.size(); i += 3) {
    if (!std::isinf(want[i])) continue;
    if (got[i] != want[i] || got[i + 1] != 0.0f) empty_mismatch++;
    got[i] = want[i] = 0.0f;
  }
  check_close(ctx, what, got.data(), want.data(), want.size(), 1e-5);
  if (empty_mismatch) {
    ctx.checks++;
    ctx.failures++;
    std::printf("  %-48s %d empty rows are not {-inf, 0} FAIL\n", what.c_str(), empty_mismatch);
  }
}

void check_shards(TestContext& ctx, const ShardCase& k, DType dt) {
  const int N = k.N, Vs = k.Vs, parts = k.parts;
  const size_t shard_n = (size_t)N * Vs, stats_n = (size_t)N * 3;
  const float dloss = 1.0f / N;
  const Case full_case{N, k.V, k.Vp(), k.scale};
  auto logits = random_logits(ctx, full_case, dt);
  auto targets = random_targets(ctx, full_case);
  int* d_targets = static_cast<int*>(ops::alloc(N * sizeof(int)));
  ops::copy_to_device(d_targets, targets.data(), N * sizeof(int));
  auto* d_parts = static_cast<float*>(ops::alloc(parts * stats_n * 4));
  auto* d_stats = static_cast<float*>(ops::alloc(stats_n * 4));
  auto* d_losses = static_cast<float*>(ops::alloc(N * 4));
  poison(d_parts, parts * stats_n * 4);
  poison(d_stats, stats_n * 4);
  poison(d_losses, N * 4);

  // 1. Per-shard stats, into the slices of parts_stats (what the all-gather would assemble).
  std::vector<std::vector<float>> shards(parts);
  std::vector<void*> d_shards(parts);
  std::vector<float> want_parts(parts * stats_n);
  for (int r = 0; r < parts; r++) {
    shards[r] = shard_of(logits, k, r);
    d_shards[r] = to_device(shards[r], dt);
    ops::classifier_shard_stats(d_parts + r * stats_n, d_shards[r], d_targets, N, Vs, r * Vs, k.V,
                                dt, ctx.stream);
    ref::classifier_shard_stats(&want_parts[r * stats_n], shards[r].data(), targets.data(), N, Vs,
                                r * Vs, k.V, DType::F32, ctx.ref_stream);
  }
  check_stats(ctx, shard_label(k, dt, "shard stats"), to_host(d_parts, parts * stats_n, DType::F32),
              want_parts);

  // 2. Merge (each backend its own parts), then the losses against the unsharded classifier.
  ops::classifier_merge_stats(d_stats, d_losses, d_parts, d_targets, parts, N, ctx.stream);
  std::vector<float> want_stats(stats_n), want_losses(N);
  ref::classifier_merge_stats(want_stats.data(), want_losses.data(), want_parts.data(),
                              targets.data(), parts, N, ctx.ref_stream);
  check_stats(ctx, shard_label(k, dt, "merged stats"), to_host(d_stats, stats_n, DType::F32),
              want_stats);
  auto got_losses = to_host(d_losses, N, DType::F32);
  check_close(ctx, shard_label(k, dt, "losses"), got_losses.data(), want_losses.data(), N, 1e-5);
  std::vector<float> full_grad(logits), full_losses(N);
  ref::classifier_forward_backward(full_grad.data(), full_losses.data(), targets.data(), dloss, N,
                                   k.V, k.Vp(), DType::F32, ctx.ref_stream);
  check_close(ctx, shard_label(k, dt, "losses vs unsharded"), got_losses.data(),
              full_losses.data(), N, 1e-5);

  // 3. The gradient of each shard from the merged stats, then reassembled.
  const double grad_tol = dt == DType::F32 ? 1e-5 : 1e-2;
  std::vector<float> got_grad(logits.size());
  for (int r = 0; r < parts; r++) {
    ops::classifier_shard_backward(d_shards[r], d_stats, d_targets, dloss, N, Vs, r * Vs, k.V, dt,
                                   ctx.stream);
    ref::classifier_shard_backward(shards[r].data(), want_stats.data(), targets.data(), dloss, N,
                                   Vs, r * Vs, k.V, DType::F32, ctx.ref_stream);
    auto got = to_host(d_shards[r], shard_n, dt);
    check_close(ctx, shard_label(k, dt, "dlogits shard " + std::to_string(r)), got.data(),
                shards[r].data(), shard_n, grad_tol);
    for (int n = 0; n < N; n++)
      std::memcpy(&got_grad[(size_t)n * k.Vp() + (size_t)r * Vs], &got[(size_t)n * Vs], Vs * 4);
  }
  check_close(ctx, shard_label(k, dt, "dlogits vs unsharded"), got_grad.data(), full_grad.data(),
              got_grad.size(), grad_tol);
  for (void* p : d_shards) ops::release(p);
  for (void* p : {(void*)d_targets, (void*)d_parts, (void*)d_stats, (void*)d_losses})
    ops::release(p);
}

const ShardCase kShardCases[] = {
    {5, 37, 12, 5, 2.0f},     {7, 1001, 256, 5, 2.0f},      {9, 1000, 251, 5, 2.0f},
    {7, 1000, 256, 4, 30.0f}, {256, 50257, 12576, 4, 2.0f},
};

}  // namespace

GPU_TEST(classifier_shards) {
  for (DType dt : {DType::F32, DType::BF16})
    for (const ShardCase& k : kShardCases) check_shards(ctx, k, dt);
}
