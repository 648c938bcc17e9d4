// parallel/tensor_parallel.cu - tensor parallelism (Megatron-LM) with optional sequence
// parallelism: each of the tp ranks holds 1/tp of every large weight and does 1/tp of every
// large GEMM, and the ranks exchange activations instead of weights.
//
// The idea. A transformer MLP is Y = gelu(X A) B. Split A by columns, A = [A_1 .. A_t], and B by
// the matching rows: rank i computes gelu(X A_i) B_i on its own, with no communication in
// between (GELU is elementwise, so the split commutes with it), and Y = sum_i gelu(X A_i) B_i:
// one sum over the ranks per MLP. Attention splits the same way by heads: rank i owns the q, k, v
// rows of heads i*NH/t .., runs attention on them alone, and its slice of the output projection
// (a column block of Wo) gives its partial sum of the projection.
//
//   column-parallel (output split):  qkv (3C x C: three row blocks), fc (4C x C: one row block)
//                                    and their biases, split alike
//   row-parallel (input split):      attn proj (C x C), fc proj (C x 4C): a column block each;
//                                    the bias is added once, after the sum, then the residual
//
// Two conjugate operators make the gradients right (Megatron's f and g):
//   f, before a column-parallel GEMM:  forward identity (every rank needs all of X),
//                                      backward all-reduce (each rank's dX is a partial sum)
//   g, after a row-parallel GEMM:      forward all-reduce (sum the partial outputs),
//                                      backward identity (every rank needs all of dY)
//
//     x ──LN──f──[X A_i + a_i]──gelu──[· B_i]──g──(+b, +x)──>      (rank i of t)
//
// Sequence parallelism. Between the g of one block and the f of the next, every rank holds the
// same activations and repeats the same LayerNorm and residual add on them. Split those tokens
// instead: rank i keeps its 1/t of the N = B*T token rows (the flat rows [i*N/t, (i+1)*N/t),
// whole sequence chunks when B = 1) for the LayerNorms and the residual stream. Then
//   f = all-gather of the token slices forward,   reduce-scatter of dX backward
//   g = reduce-scatter of the partial outputs,     all-gather of dY backward
// An all-reduce is a reduce-scatter plus an all-gather, so the bytes are the same as without
// SP, while the LayerNorm/residual activations shrink by t. The LayerNorm weights now see only
// N/t tokens per rank, so their gradients are partial sums: the store adds them over tp once per
// step (parallel/placement.h, "grad_partial_over_tp"). The column-parallel GEMMs' backward needs
// their gathered input again; it is re-gathered rather than kept (Megatron's choice too), so all
// of a layer's saved activations are divided by t.
//
// Embedding and loss, vocabulary-parallel. wte (Vp x C, tied with the output layer) is split by
// rows: rank i owns tokens [i*Vp/t, (i+1)*Vp/t). The embedding looks up its own rows (zeros for
// the others' tokens), rank 0 adds wpe, and the partial embeddings are summed (g). The logits
// X wte_i^T stay split by vocabulary: the cross-entropy reduces a few floats per token instead
// of gathering N x Vp logits. Each rank computes, per row, the max over its columns, the sum of
// exp relative to it and the target's logit if it owns the target; one all-gather of these
// 3 floats per row lets every rank merge them (global max M, sum = sum_i s_i exp(m_i - M)) in the
// same order, and the gradient softmax - onehot is then local. llm.c's padded vocabulary columns
// (>= V) sit on the last ranks and never enter the softmax. The tied wte gets both gradients on
// the rank that owns the rows: no communication for it.
//
// Bytes per layer and micro-batch (N = B*T tokens, C channels, b bytes per activation element,
// ring algorithms, payload as counted by parallel/comm.h):
//   without SP   forward 2 all-reduces of N*C*b, backward 2 all-reduces
//   with SP      forward 2 all-gathers + 2 reduce-scatters of N*C*b,
//                backward 4 all-gathers (dY twice, the re-gathered inputs twice) + 2 reduce-
//                scatters: the same wire bytes as the all-reduces, plus the two re-gathers
// plus, per micro-batch, the embedding's sum and the output layer's (one all-reduce each, or a
// reduce-scatter plus all-gathers under SP), the cross-entropy's all-gather of 3*N fp32 per
// rank, and under SP one all-reduce of the LayerNorm-weight gradients per unit per step.
// Timeline of one block forward with SP (t = 2), compute and the collectives it waits on:
//
//   rank 0  |LN1|AG|qkv|attn|proj|RS|+b,x|LN2|AG|fc,gelu|fcproj|RS|+b,x|
//   rank 1  |LN1|AG|qkv|attn|proj|RS|+b,x|LN2|AG|fc,gelu|fcproj|RS|+b,x|
//            N/2     N tokens, 1/2 of heads    N/2     N tokens, 1/2 of 4C    N/2
//
// The collectives run on the compute stream, in order with the GEMMs around them (no host
// waits); overlapping them with the GEMMs is left for later.
#include "parallel/tensor_parallel.h"

const void* tp_all_tokens(const TensorParallel& tp, void* all, const void* mine, int N, int C,
                          DType dt, ops::Stream s) {
  if (!tp.active() || !tp.sp) return mine;
  all_gather(*tp.group, mine, all, (size_t)tp.tokens(N) * C, dt, s);
  return all;
}

void* tp_sum_partials(const TensorParallel& tp, void* partial, void* mine, int N, int C,
                      DType dt, ops::Stream s) {
  if (!tp.active()) return partial;
  if (!tp.sp) {
    all_reduce_sum(*tp.group, partial, (size_t)N * C, dt, s);
    return partial;
  }
  reduce_scatter_sum(*tp.group, partial, mine, (size_t)tp.tokens(N) * C, dt, s);
  return mine;
}

void tp_row_parallel_finish(const TensorParallel& tp, void* out, void* partial, const void* bias,
                            const void* residual, int N, int C, DType dt, ops::Stream s) {
  const void* sum = tp_sum_partials(tp, partial, out, N, C, dt, s);
  ops::add_bias_residual(out, sum, bias, residual, tp.tokens(N), C, dt, s);
}

// Chunk k of the tokens: its first token, and the wpe row of its first position (the encoder
// reads position t of a chunk as row t of the table it is given).
static size_t chunk_token(const TokenPositions& pos, int k) { return (size_t)k * pos.B * pos.len; }

void tp_embedding_forward(const TensorParallel& tp, void* out, void* partial, const int* tokens,
                          const void* wte, const void* wpe, const TokenPositions& pos, int C,
                          int vocab_first, int vocab_rows, DType dt, ops::Stream s) {
  // without SP (or tp) the sum lands in place, in out
  void* all = tp.active() && tp.sp ? partial : out;
  const size_t e = dtype_size(dt);
  if (!tp.active()) vocab_first = 0, vocab_rows = kAllVocabRows;
  for (int k = 0; k < pos.chunks; k++) {
    const void* wpe_k = tp.rank() == 0 ? (const char*)wpe + (size_t)pos.first[k] * C * e : nullptr;
    ops::encoder_forward((char*)all + chunk_token(pos, k) * C * e, tokens + chunk_token(pos, k),
                         wte, wpe_k, pos.B, pos.len, C, dt, s, vocab_first, vocab_rows);
  }
  if (tp.active()) tp_sum_partials(tp, all, out, pos.tokens(), C, dt, s);
}

void tp_embedding_backward(const TensorParallel& tp, float* dwte, float* dwpe, void* all,
                           const void* dout_mine, const int* tokens, const TokenPositions& pos,
                           int C, int vocab_first, int vocab_rows, DType dt, ops::Stream s) {
  const void* dout = tp_all_tokens(tp, all, dout_mine, pos.tokens(), C, dt, s);
  const size_t e = dtype_size(dt);
  if (!tp.active()) vocab_first = 0, vocab_rows = kAllVocabRows;
  for (int k = 0; k < pos.chunks; k++)
    ops::encoder_backward(dwte, dwpe + (size_t)pos.first[k] * C,
                          (const char*)dout + chunk_token(pos, k) * C * e,
                          tokens + chunk_token(pos, k), pos.B, pos.len, C, dt, s, vocab_first,
                          vocab_rows);
}

void tp_cross_entropy(const TensorParallel& tp, void* logits, float* losses, float* stats,
                      float* parts, const int* targets, float dloss, int N, int V, int Vs,
                      int col0, DType dt, ops::Stream s) {
  if (!tp.active()) {
    ops::classifier_forward_backward(logits, losses, targets, dloss, N, V, Vs, dt, s);
    return;
  }
  ops::classifier_shard_stats(stats, logits, targets, N, Vs, col0, V, dt, s);
  all_gather(*tp.group, stats, parts, (size_t)N * 3, DType::F32, s);
  ops::classifier_merge_stats(stats, losses, parts, targets, tp.size(), N, s);
  if (dloss != 0.0f)
    ops::classifier_shard_backward(logits, stats, targets, dloss, N, Vs, col0, V, dt, s);
}
