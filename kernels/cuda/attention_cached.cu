// kernels/cuda/attention_cached.cu - attention of a few new queries against a KV cache on the
// GPU, the step of sampling with a cache (model/kv_cache.h; the contract is in
// kernels/ops_decls.h).
//
// The idea: a sampler keeps every earlier position's keys and values, so each new token costs
// one pass over the cache instead of a forward over the whole window. The n new tokens' k and v
// are already appended to the cache (rows pos .. pos+n-1, [k heads | v heads]); query i
// (position pos+i) attends to cache rows 0 .. pos+i.
//
// Kernel: one warp per (new query, query head), decode-sized work (a handful of queries), so no
// tiles: lane l holds the head dimensions l, l+32, ... of q and of the running output. The warp
// walks the visible keys in order: each score is a warp-shuffle sum of the lanes' products,
// then the online softmax (running max m and sum l, the output rescaled when m grows), and
// out = acc / l at the end. fp32 math on fp32 or bf16 storage; HS up to 256. Bytes read: the
// visible cache rows of the kv head, once per query head (reads of a GQA group's shared kv rows
// hit the cache lines the group's other warps load).
//
// Checked against the CPU backend (kernels/cpu/attention_cached.cpp) by
// test/gpu/test_attention_cached.cu on the CPU emulator (test/emu/README.md).
#include <cmath>

#include "kernels/cuda/cuda_common.cuh"

namespace ops {
namespace {

constexpr int kWarp = 32;
constexpr int kMaxPerLane = 8;  // HS <= 256

template <typename Elem>
__global__ void cached_attention_kernel(Elem* out, const Elem* qkv, const Elem* cache, int pos,
                                        int NH, int NKV, int HS, float scale) {
  const int i = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
  const int g = h / (NH / NKV);
  const size_t qkv_width = (size_t)(NH + 2 * NKV) * HS, cache_width = 2 * (size_t)NKV * HS;
  const Elem* q = qkv + (size_t)i * qkv_width + (size_t)h * HS;
  float qv[kMaxPerLane], acc[kMaxPerLane];
  for (int k = 0; k < kMaxPerLane; k++) {
    const int d = lane + k * kWarp;
    qv[k] = d < HS ? to_float(q[d]) : 0.0f;
    acc[k] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int j = 0; j <= pos + i; j++) {
    const Elem* key = cache + (size_t)j * cache_width + (size_t)g * HS;
    const Elem* value = cache + (size_t)j * cache_width + (size_t)(NKV + g) * HS;
    float dot = 0.0f;
    for (int k = 0; k < kMaxPerLane; k++) {
      const int d = lane + k * kWarp;
      if (d < HS) dot += qv[k] * to_float(key[d]);
    }
    for (int off = kWarp / 2; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    const float s = dot * scale, m_new = fmaxf(m, s);
    const float correction = expf(m - m_new), p = expf(s - m_new);
    l = l * correction + p;
    for (int k = 0; k < kMaxPerLane; k++) {
      const int d = lane + k * kWarp;
      if (d < HS) acc[k] = acc[k] * correction + p * to_float(value[d]);
    }
    m = m_new;
  }
  Elem* o = out + (size_t)i * NH * HS + (size_t)h * HS;
  for (int k = 0; k < kMaxPerLane; k++) {
    const int d = lane + k * kWarp;
    if (d < HS) o[d] = from_float<Elem>(acc[k] / l);
  }
}

}  // namespace

void attention_cached_forward(void* out, const void* qkv, const void* cache, int n, int pos,
                              int NH, int NKV, int HS, DType dt, Stream s) {
  OP_SPAN(attention_cached_forward);
  if (is_dry(s)) return;
  CHECK(n >= 1 && pos >= 0, "cached attention: %d new tokens at position %d", n, pos);
  CHECK(NH > 0 && NKV > 0 && NH % NKV == 0 && HS > 0 && HS <= kWarp * kMaxPerLane,
        "cached attention: %d kv heads, %d query heads, head size %d (at most %d)", NKV, NH, HS,
        kWarp * kMaxPerLane);
  const float scale = 1.0f / std::sqrt((float)HS);
  dispatch_dtype(dt, [&](auto tag) {
    using Elem = decltype(tag);
    cached_attention_kernel<Elem><<<dim3(n, NH), kWarp, 0, s->stream>>>(
        (Elem*)out, (const Elem*)qkv, (const Elem*)cache, pos, NH, NKV, HS, scale);
  });
  LAUNCH_CHECK();
}

}  // namespace ops
