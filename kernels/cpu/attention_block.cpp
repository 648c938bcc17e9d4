// kernels/cpu/attention_block.cpp - ring attention's block (the contract is in
// kernels/ops_decls.h): the T queries of a chunk, from packed qkv (B,T,3C), against the T keys
// and values of another chunk, from packed kv (B,T,2C), with a causal mask (the same chunk: key j
// visible to query i iff j <= i) or none (an earlier chunk).
//   forward:  out (B,T,C) and lse (B,NH,T) of this block alone; attention_merge folds them into
//             the running result.
//   backward: given the final out and lse of these queries over every block and dout, adds the
//             block's share to dq (B,T,C) and dkv (B,T,2C), fp32: p = exp(s - final lse) is
//             exactly this block's part of the full softmax, and D = dout . out uses the final
//             out, so the shares summed over all blocks are the full gradient.
//
// Parallelism and arithmetic: one task per (batch, head), in parallel, each sequential (bitwise
// the same for any thread count, no atomics). A task gathers q out of qkv and k, v out of kv
// into contiguous fp32 arrays and runs the per-row forward or backward of attention_rows.h,
// exactly what causal self-attention (attention.cpp) runs; only the gathers, the mask and the
// final store (out rounded once to dt; dq, dk, dv added in fp32) differ.
#include "kernels/cpu/attention_rows.h"

namespace ops {
namespace cpu {
namespace {

// The head's q (from qkv) and k, kt, v, and vt when wanted (from kv) of sequence b.
template <typename Elem>
void gather_block(HeadArrays& a, const Elem* qkv, const Elem* kv, int b, int h, int T, int NH,
                  int HS, bool transposed_v) {
  const int C = NH * HS;
  const Elem* q_rows = qkv + (size_t)b * T * 3 * C;
  const Elem* kv_rows = kv + (size_t)b * T * 2 * C;
  gather_head(a.q, nullptr, q_rows, 3 * C, h * HS, T, HS);
  gather_head(a.k, a.kt, kv_rows, 2 * C, h * HS, T, HS);
  gather_head(a.v, transposed_v ? a.vt : nullptr, kv_rows, 2 * C, C + h * HS, T, HS);
}

template <typename Elem>
void block_forward_head(Elem* out, float* lse, const Elem* qkv, const Elem* kv, int b, int h,
                        int T, int NH, int HS, bool causal, HeadArrays& a) {
  const int C = NH * HS;
  gather_block(a, qkv, kv, b, h, T, NH, HS, /*transposed_v=*/false);
  forward_rows(a, lse + ((size_t)b * NH + h) * T, T, HS, causal);
  scatter_head(out + (size_t)b * T * C, C, h * HS, a.out, T, HS);
}

template <typename Elem>
void block_backward_head(float* dq, float* dkv, const Elem* dout, const Elem* out,
                         const float* lse, const Elem* qkv, const Elem* kv, int b, int h, int T,
                         int NH, int HS, bool causal, HeadArrays& a) {
  const int C = NH * HS;
  gather_block(a, qkv, kv, b, h, T, NH, HS, /*transposed_v=*/true);
  gather_head(a.out, nullptr, out + (size_t)b * T * C, C, h * HS, T, HS);
  gather_head(a.dout, nullptr, dout + (size_t)b * T * C, C, h * HS, T, HS);
  backward_rows(a, lse + ((size_t)b * NH + h) * T, T, HS, causal);
  float* dkv_rows = dkv + (size_t)b * T * 2 * C;
  add_head(dq + (size_t)b * T * C, C, h * HS, a.dq, T, HS);
  add_head(dkv_rows, 2 * C, h * HS, a.dk, T, HS);
  add_head(dkv_rows, 2 * C, C + h * HS, a.dv, T, HS);
}

}  // namespace
}  // namespace cpu

void attention_block_forward(void* out, float* lse, const void* qkv, const void* kv, int B, int T,
                             int NH, int HS, bool causal, DType dt, Stream s) {
  if (is_dry(s)) return;
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::for_each_head(B, NH, T, HS, s, [&](int b, int h, cpu::HeadArrays& arrays) {
      cpu::block_forward_head((S*)out, lse, (const S*)qkv, (const S*)kv, b, h, T, NH, HS, causal,
                              arrays);
    });
  });
}

void attention_block_backward(float* dq, float* dkv, const void* dout, const void* out,
                              const float* lse, const void* qkv, const void* kv, int B, int T,
                              int NH, int HS, bool causal, DType dt, Stream s) {
  if (is_dry(s)) return;
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::for_each_head(B, NH, T, HS, s, [&](int b, int h, cpu::HeadArrays& arrays) {
      cpu::block_backward_head(dq, dkv, (const S*)dout, (const S*)out, lse, (const S*)qkv,
                               (const S*)kv, b, h, T, NH, HS, causal, arrays);
    });
  });
}

}  // namespace ops
