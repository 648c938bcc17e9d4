// kernels/cpu/attention_block.cpp - ring attention's block (the contract is in
// kernels/ops_decls.h): the T queries of a chunk, from packed qkv (B,T,(NH+2NKV)HS), against the T
// keys and values of another chunk, from packed kv (B,T,2 NKV HS) = [k heads | v heads], with a
// causal mask (the same chunk: key j visible to query i iff j <= i) or none (an earlier chunk),
// and with document ids (packed documents) only keys of the query's own document.
// Query head h uses kv head h / (NH/NKV) (grouped-query attention; NKV = NH for GPT-2).
//   forward:  out (B,T,C) and lse (B,NH,T) of this block alone; attention_merge folds them into
//             the running result.
//   backward: given the final out and lse of these queries over every block and dout, adds the
//             block's share to dq (B,T,C) and dkv (B,T,2 NKV HS), fp32: p = exp(s - final lse)
//             is exactly this block's part of the full softmax, and D = dout . out uses the final
//             out, so the shares summed over all blocks are the full gradient.
//
// Parallelism and arithmetic: the forward is one task per (batch, query head), the backward one
// per (batch, kv head) walking its query heads in order (their dk, dv summed in one array); the
// tasks run in parallel, each sequential (bitwise the same for any thread count, no atomics). A
// task gathers q out of qkv and k, v out of kv into contiguous fp32 arrays and runs the per-row
// forward or backward of attention_rows.h, exactly what causal self-attention (attention.cpp)
// runs; only the gathers, the mask and the final store (out rounded once to dt; dq, dk, dv added
// in fp32) differ.
#include "kernels/cpu/attention_rows.h"

namespace ops {
namespace cpu {
namespace {

// Column offsets of kv head g inside the packed kv rows [k heads | v heads].
struct KvColumns {
  int NKV, HS;
  size_t width() const { return 2 * (size_t)NKV * HS; }
  int k(int g) const { return g * HS; }
  int v(int g) const { return (NKV + g) * HS; }
};

// k, kt, v, and vt when wanted, of kv head g of sequence b out of kv.
template <typename Elem>
void gather_kv(HeadArrays& a, const Elem* kv, int b, int g, int T, const KvColumns& kc,
               bool transposed_v) {
  const Elem* kv_rows = kv + (size_t)b * T * kc.width();
  gather_head(a.k, a.kt, kv_rows, kc.width(), kc.k(g), T, kc.HS);
  gather_head(a.v, transposed_v ? a.vt : nullptr, kv_rows, kc.width(), kc.v(g), T, kc.HS);
}

// The mask of sequence b: the call's, with its document ids offset to row b.
RowMask row_mask(const RowMask& mask, int b, int T) {
  if (!mask.q_docs) return mask;
  return RowMask{mask.causal, mask.q_docs + (size_t)b * T, mask.k_docs + (size_t)b * T};
}

template <typename Elem>
void block_forward_head(Elem* out, float* lse, const Elem* qkv, const Elem* kv, int b, int h,
                        int T, const QkvColumns& cols, const RowMask& mask, HeadArrays& a) {
  const int HS = cols.HS, C = cols.NH * HS;
  gather_head(a.q, nullptr, qkv + (size_t)b * T * cols.width(), cols.width(), cols.q(h), T, HS);
  gather_kv(a, kv, b, h / cols.group(), T, KvColumns{cols.NKV, HS}, /*transposed_v=*/false);
  forward_rows(a, lse + ((size_t)b * cols.NH + h) * T, T, HS, row_mask(mask, b, T));
  scatter_head(out + (size_t)b * T * C, C, h * HS, a.out, T, HS);
}

// kv head g of sequence b: each of its query heads adds its dq, then their summed dk, dv are
// added to dkv.
template <typename Elem>
void block_backward_kv_head(float* dq, float* dkv, const Elem* dout, const Elem* out,
                            const float* lse, const Elem* qkv, const Elem* kv, int b, int g,
                            int T, const QkvColumns& cols, const RowMask& mask, HeadArrays& a) {
  const int HS = cols.HS, C = cols.NH * HS;
  const KvColumns kc{cols.NKV, HS};
  gather_kv(a, kv, b, g, T, kc, /*transposed_v=*/true);
  clear_kv_grads(a, T, HS);
  for (int h = g * cols.group(); h < (g + 1) * cols.group(); h++) {
    gather_head(a.q, nullptr, qkv + (size_t)b * T * cols.width(), cols.width(), cols.q(h), T, HS);
    gather_head(a.out, nullptr, out + (size_t)b * T * C, C, h * HS, T, HS);
    gather_head(a.dout, nullptr, dout + (size_t)b * T * C, C, h * HS, T, HS);
    backward_rows(a, lse + ((size_t)b * cols.NH + h) * T, T, HS, row_mask(mask, b, T));
    add_head(dq + (size_t)b * T * C, C, h * HS, a.dq, T, HS);
  }
  float* dkv_rows = dkv + (size_t)b * T * kc.width();
  add_head(dkv_rows, kc.width(), kc.k(g), a.dk, T, HS);
  add_head(dkv_rows, kc.width(), kc.v(g), a.dv, T, HS);
}

}  // namespace
}  // namespace cpu

void attention_block_forward(void* out, float* lse, const void* qkv, const void* kv, int B, int T,
                             int NH, int NKV, int HS, bool causal, DType dt, Stream s,
                             const int* q_docs, const int* k_docs) {
  OP_SPAN(attention_block_forward);
  if (is_dry(s)) return;
  const cpu::QkvColumns cols = cpu::qkv_columns(NH, NKV, HS, "attention block");
  const cpu::RowMask mask{causal, q_docs, k_docs};
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::for_each_head(B, NH, T, HS, s, [&](int b, int h, cpu::HeadArrays& arrays) {
      cpu::block_forward_head((S*)out, lse, (const S*)qkv, (const S*)kv, b, h, T, cols, mask,
                              arrays);
    });
  });
}

void attention_block_backward(float* dq, float* dkv, const void* dout, const void* out,
                              const float* lse, const void* qkv, const void* kv, int B, int T,
                              int NH, int NKV, int HS, bool causal, DType dt, Stream s,
                             const int* q_docs, const int* k_docs) {
  OP_SPAN(attention_block_backward);
  if (is_dry(s)) return;
  const cpu::QkvColumns cols = cpu::qkv_columns(NH, NKV, HS, "attention block");
  const cpu::RowMask mask{causal, q_docs, k_docs};
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::for_each_head(B, NKV, T, HS, s, [&](int b, int g, cpu::HeadArrays& arrays) {
      cpu::block_backward_kv_head(dq, dkv, (const S*)dout, (const S*)out, lse, (const S*)qkv,
                                  (const S*)kv, b, g, T, cols, mask, arrays);
    });
  });
}

}  // namespace ops
