// model/kv_cache.cu - the key/value cache of sampling (model/kv_cache.h).
//
// Bytes: per block, capacity x 2 NKV_local HS elements (GPT-2 124M at 1024 positions in bf16:
// 12 x 1024 x 1536 x 2 = 37 MB); per new token, one row per block appended (a column copy out
// of the qkv rows) and the visible rows read once per query head.
#include "model/kv_cache.h"

#include <numeric>

#include "model/gpt_pipeline.h"

void kv_cache_create(KvCache& kv, const GPT& m, int capacity, ops::Stream s) {
  const GPTLayout& g = m.layout;
  CHECK(g.cp->size == 1, "the KV cache runs without context parallelism (cp = %d)", g.cp->size);
  kv.capacity = capacity;
  kv.pos = 0;
  kv.layer.assign(g.L, nullptr);
  const size_t row = 2 * (size_t)g.NKV_local * g.HS * dtype_size(m.dt);
  for (int l = 0; l < g.L; l++)
    if (g.block_unit[l] >= 0) kv.layer[l] = allocate_zeroed(kv.memory, capacity * row, s);
  std::vector<int> positions(capacity);
  std::iota(positions.begin(), positions.end(), 0);
  kv.positions = (int*)allocate(kv.memory, positions.size() * sizeof(int));
  ops::copy_to_device_async(kv.positions, positions.data(), positions.size() * sizeof(int), s);
  ops::stream_sync(s);
}

void kv_cache_destroy(KvCache& kv) {
  allocator_free(kv.memory);
  kv.layer.clear();
  kv.positions = nullptr;
}

int kv_cache_chunk(const GPT& m) { return m.layout.tp.tokens(m.B * m.T); }

TokenPositions kv_cache_positions(const KvCache& kv, int n) {
  TokenPositions p;
  p.B = 1, p.chunks = 1, p.len = n;
  p.first[0] = kv.pos;
  return p;
}

void kv_cache_attention(const GPT& m, int l, void* out, const void* qkv, int n, ops::Stream s) {
  const GPTLayout& g = m.layout;
  const KvCache& kv = *m.kv;
  const int Ckv = g.NKV_local * g.HS, width = g.qkv_local();
  const size_t e = dtype_size(m.dt);
  void* rows = (char*)kv.layer[l] + (size_t)kv.pos * 2 * Ckv * e;
  // [k heads | v heads] sit side by side in qkv after the q heads: one column copy
  ops::copy_columns(rows, 2 * Ckv, m.dt, (const char*)qkv + (size_t)g.NH_local * g.HS * e, width,
                    m.dt, n, 2 * Ckv, s);
  ops::attention_cached_forward(out, qkv, kv.layer[l], n, kv.pos, g.NH_local, g.NKV_local, g.HS,
                                m.dt, s);
}

void kv_cache_forward(GPT& m, ParamStore& store, const Pipeline& pl, KvCache& kv,
                      const int* tokens, int n, ops::Stream s) {
  const int most = kv_cache_chunk(m);
  CHECK(n >= 1 && n <= most && kv.pos + n <= kv.capacity,
        "KV cache: %d tokens at position %d (at most %d at once, %d positions)", n, kv.pos, most,
        kv.capacity);
  const bool sp = m.layout.tp.sp;
  m.layout.tp.sp = false;  // a token or a few: every tp rank holds them all
  m.kv = &kv;
  m.logits_row = n - 1;
  gpt_pipeline_forward(m, store, pl, {tokens, nullptr, 1, 1, n}, s);
  m.logits_row = -1;
  m.kv = nullptr;
  m.layout.tp.sp = sp;
  kv.pos += n;
}
