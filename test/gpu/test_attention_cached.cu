// test/gpu/test_attention_cached.cu - the KV-cache attention step on the GPU
// (kernels/cuda/attention_cached.cu) against the CPU oracle (ref::, kernels/cpu/
// attention_cached.cpp, whose rows are causal self-attention's arithmetic; test/test_sample.py
// checks it end to end against sampling that recomputes the window).
//
// Shapes: one new token (decode) at the first position and later ones, a prefill of several
// tokens at 0 and after cached ones, multi-head and grouped-query (2 and 4 query heads per kv
// head), head sizes 16, 20 (odd per-lane split), 64 and 128, fp32 and bf16. The oracle runs in
// fp32 on the inputs as the GPU sees them (rounded to bf16 for bf16 runs). Tolerances (relative
// L2 error of out): fp32 1e-5 (different summation orders and exp), bf16 1e-2 (one rounding of
// out to bf16 on either side).
#include "test/gpu/harness.h"

namespace {

struct CachedShape {
  int n, pos, NH, NKV, HS;
};

void check_cached(TestContext& ctx, const CachedShape& sh, DType dt) {
  const size_t width = (size_t)(sh.NH + 2 * sh.NKV) * sh.HS, rows = sh.pos + sh.n;
  const size_t cache_width = 2 * (size_t)sh.NKV * sh.HS, C = (size_t)sh.NH * sh.HS;
  const std::vector<float> qkv = rounded(random_vector(ctx, sh.n * width, 1.5f), dt);
  const std::vector<float> cache = rounded(random_vector(ctx, rows * cache_width, 1.5f), dt);
  std::vector<float> want(sh.n * C, 0.f);
  ref::attention_cached_forward(want.data(), qkv.data(), cache.data(), sh.n, sh.pos, sh.NH,
                                sh.NKV, sh.HS, DType::F32, ctx.ref_stream);
  want = rounded(want, dt);
  void* d_qkv = to_device(qkv, dt);
  void* d_cache = to_device(cache, dt);
  void* d_out = ops::alloc(sh.n * C * dtype_size(dt));
  poison(d_out, sh.n * C * dtype_size(dt));
  ops::attention_cached_forward(d_out, d_qkv, d_cache, sh.n, sh.pos, sh.NH, sh.NKV, sh.HS, dt,
                                ctx.stream);
  ops::stream_sync(ctx.stream);
  const std::vector<float> got = to_host(d_out, sh.n * C, dt);
  char tag[160];
  std::snprintf(tag, sizeof(tag), "cached n=%d pos=%d NH=%d NKV=%d HS=%d %s out", sh.n, sh.pos,
                sh.NH, sh.NKV, sh.HS, dtype_name(dt));
  check_close(ctx, tag, got.data(), want.data(), got.size(), dt == DType::F32 ? 1e-5 : 1e-2);
  for (void* p : {d_qkv, d_cache, d_out}) ops::release(p);
}

}  // namespace

GPU_TEST(attention_cached_forward_shapes) {
  const CachedShape shapes[] = {{1, 0, 4, 4, 16}, {1, 37, 4, 2, 64}, {6, 0, 8, 2, 128},
                                {3, 11, 2, 1, 20}, {1, 70, 4, 1, 64}};
  for (const CachedShape& sh : shapes)
    for (DType dt : {DType::F32, DType::BF16}) check_cached(ctx, sh, dt);
}
