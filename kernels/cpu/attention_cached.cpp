// kernels/cpu/attention_cached.cpp - attention of a few new queries against a KV cache, the
// step of sampling with a cache (model/kv_cache.h; the contract is in kernels/ops_decls.h).
//
// The idea: a sampler that keeps every earlier position's keys and values need not run the
// whole window again for each new token. The n new tokens (n = the prompt when prefilling, 1
// per step after) bring their packed qkv rows; their k and v are already appended to the cache
// at positions pos .. pos+n-1, so query i (position pos+i) attends to cache rows 0 .. pos+i.
//
// Arithmetic: one task per query head, in parallel, each sequential. The task gathers its q
// rows and its kv head's cached k, v into the same fp32 arrays causal self-attention uses and
// runs the same per-row forward (attention_rows.h: forward_row), so a row's output is bitwise
// what attention_forward computes for that position over the same keys and values.
#include "kernels/cpu/attention_rows.h"

namespace ops {
namespace cpu {
namespace {

template <typename Elem>
void cached_head(Elem* out, const Elem* qkv, const Elem* cache, int n, int pos, int h,
                 const QkvColumns& cols, HeadArrays& a) {
  const int HS = cols.HS, keys = pos + n, g = h / cols.group();
  const size_t cache_width = 2 * (size_t)cols.NKV * HS;
  gather_head(a.q, nullptr, qkv, cols.width(), cols.q(h), n, HS);
  gather_head(a.k, a.kt, cache, cache_width, g * HS, keys, HS);
  gather_head(a.v, nullptr, cache, cache_width, (cols.NKV + g) * HS, keys, HS);
  const float scale = 1.0f / std::sqrt((float)HS);
  for (int i = 0; i < n; i++) forward_row(a, i, KeyRange{0, pos + i + 1}, keys, HS, scale);
  scatter_head(out, (size_t)cols.NH * HS, h * HS, a.out, n, HS);
}

}  // namespace
}  // namespace cpu

void attention_cached_forward(void* out, const void* qkv, const void* cache, int n, int pos,
                              int NH, int NKV, int HS, DType dt, Stream s) {
  OP_SPAN(attention_cached_forward);
  if (is_dry(s)) return;
  CHECK(n >= 1 && pos >= 0, "cached attention: %d new tokens at position %d", n, pos);
  const cpu::QkvColumns cols = cpu::qkv_columns(NH, NKV, HS, "cached attention");
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::for_each_head(1, NH, pos + n, HS, s, [&](int, int h, cpu::HeadArrays& arrays) {
      cpu::cached_head((S*)out, (const S*)qkv, (const S*)cache, n, pos, h, cols, arrays);
    });
  });
}

}  // namespace ops
