// parallel/tensor_parallel.cu - tensor parallelism (Megatron-LM) with optional sequence
// parallelism: each of the tp ranks holds 1/tp of every large weight and does 1/tp of every
// large GEMM, and the ranks exchange activations instead of weights.
//
// The idea. A transformer MLP is Y = gelu(X A) B. Split A by columns, A = [A_1 .. A_t], and B by
// the matching rows: rank i computes gelu(X A_i) B_i on its own, with no communication in
// between (GELU is elementwise, so the split commutes with it), and Y = sum_i gelu(X A_i) B_i:
// one sum over the ranks per MLP. Attention splits the same way by heads: rank i owns the q, k, v
// rows of heads i*NH/t .., runs attention on them alone, and its slice of the output projection
// (a column block of Wo) gives its partial sum of the projection. (The weights are stored as
// llm.c does, W (out x in), y = x W^T: "A split by columns" is W_fc split by rows.)
//
//   column-parallel (output split):  qkv (3C x C: three row blocks), fc (4C x C: one row block)
//                                    and their biases, split alike; the head over the vocabulary
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
// So a block is four calls, whatever t is (model/gpt.cu, block_forward):
//   LN1, column_parallel_forward(qkv), attention on this rank's heads, row_parallel_forward(proj),
//   LN2, column_parallel_forward(fc + GELU), row_parallel_forward(fc proj)
// and its backward the same calls' backwards in reverse. How a linear multiplies is not this
// file's business: the model hands each call a LinearGemm (a function pointer pair and its
// context) that runs in the compute dtype (compute_dtype_gemm, below) or on FP8 operands with that
// layer's scales (model/fp8.h); this file decides what is multiplied and what crosses the group.
//
// Sequence parallelism. Between the g of one block and the f of the next, every rank holds the
// same activations and repeats the same LayerNorm and residual add on them. Split those tokens
// instead: rank i keeps its 1/t of the N = B*T token rows (the flat rows [i*N/t, (i+1)*N/t),
// whole sequence chunks when B = 1) for the LayerNorms and the residual stream. Then
//   f = all-gather of the token slices forward,   reduce-scatter of dX backward
//   g = reduce-scatter of the partial outputs,     all-gather of dY backward
// An all-reduce is a reduce-scatter plus an all-gather, so the bytes are the same as without
// SP, while the LayerNorm/residual activations shrink by t. The LayerNorm weights (and an MoE
// router) now see only N/t tokens per rank, so their gradients are partial sums: the placement
// marks them (tp_sequence_parallel_replica: "grad_partial_over_tp") and tp_sum_partial_grads adds
// them over tp once per step, when the parameter store has the step's gradients
// (parallel/param_store.cu, grads_wait). The column-parallel GEMMs' backward needs their gathered
// input again; it is re-gathered rather than kept (Megatron's choice too), so all of a layer's
// saved activations are divided by t. The head is the exception: its backward runs right after
// its forward, with the gathered input still there.
//
// Embedding and loss, vocabulary-parallel. wte (Vp x C, tied with the output layer) is split by
// rows: rank i owns tokens [i*Vp/t, (i+1)*Vp/t). The embedding looks up its own rows (zeros for
// the others' tokens), rank 0 adds wpe, and the partial embeddings are summed (g). The logits
// X wte_i^T (a column-parallel GEMM over the vocabulary) stay split by vocabulary: the
// cross-entropy reduces a few floats per token instead of gathering N x Vp logits. Each rank
// computes, per row, the max over its columns, the sum of exp relative to it and the target's
// logit if it owns the target; one all-gather of these 3 floats per row lets every rank merge
// them (global max M, sum = sum_i s_i exp(m_i - M)) in the same order, and the gradient
// softmax - onehot is then local. llm.c's padded vocabulary columns (>= V) sit on the last ranks
// and never enter the softmax. The tied wte gets both gradients on the rank that owns the rows:
// no communication for it.
//
// Who talks to whom: only the t ranks of one tp group (consecutive world ranks, parallel/mesh.h:
// tp is the innermost axis, so a group stays inside a node), always all of them at once.
//
// Bytes per layer and micro-batch (N = B*T tokens, C channels, b bytes per activation element,
// ring algorithms, payload as counted by parallel/comm.h):
//   without SP   forward 2 all-reduces of N*C*b, backward 2 all-reduces
//   with SP      forward 2 all-gathers + 2 reduce-scatters of N*C*b,
//                backward 4 all-gathers (dY twice, the re-gathered inputs twice) + 2 reduce-
//                scatters: the same wire bytes as the all-reduces, plus the two re-gathers
// plus, per micro-batch, the embedding's sum and the output layer's (one all-reduce each, or a
// reduce-scatter plus all-gathers under SP), the cross-entropy's all-gather of 3*N fp32 per
// rank, and under SP one all-reduce of the partial (LayerNorm) gradients per unit per step.
// Timeline of one block forward with SP (t = 2), compute and the collectives it waits on:
//
//   rank 0  |LN1|AG|qkv|attn|proj|RS|+b,x|LN2|AG|fc,gelu|fcproj|RS|+b,x|
//   rank 1  |LN1|AG|qkv|attn|proj|RS|+b,x|LN2|AG|fc,gelu|fcproj|RS|+b,x|
//            N/2     N tokens, 1/2 of heads    N/2     N tokens, 1/2 of 4C    N/2
//
// The collectives run on the compute stream, in order with the GEMMs around them (no host
// waits). With [parallel] tp_overlap (and SP) the four linears below hand over to their
// overlapped forms instead: the all-gathers and reduce-scatters in tp chunks on the
// communication stream, each chunk's GEMM rows beside the next chunk's transfer
// (parallel/tensor_parallel_overlap.cu, with its own timeline).
//
// The file, top to bottom: the compute-dtype GEMM; f and g; the column- and row-parallel linears;
// the vocabulary-parallel embedding, loss and logits row; where each split weight is placed; the
// once-per-step sum of the partial gradients.
#include "parallel/tensor_parallel.h"

#include <algorithm>

// ---------------------------------------------------------------------------------------------
// The GEMM in the compute dtype
// ---------------------------------------------------------------------------------------------
static void matmul_forward_in_dtype(const LinearGemm& g, void* out, void* pre_gelu,
                                    const void* inp, const void* weight, const void* bias,
                                    const void* residual, int N, int K, int OC, ops::Stream s) {
  ops::matmul_forward(out, pre_gelu, inp, weight, bias, residual, N, K, OC, g.dt, s);
}

static void matmul_backward_in_dtype(const LinearGemm& g, void* dinp, float* dweight,
                                     float* dbias, const void* dout, const void* inp,
                                     const void* weight, const void* gelu_input, int N, int K,
                                     int OC, ops::Stream s, GradPart) {  // the pointers say it
  ops::matmul_backward(dinp, dweight, dbias, dout, inp, weight, gelu_input, N, K, OC, g.dt, s);
}

LinearGemm compute_dtype_gemm(DType dt) {
  LinearGemm g;
  g.forward = matmul_forward_in_dtype;
  g.backward = matmul_backward_in_dtype;
  g.dt = dt;
  return g;
}

// ---------------------------------------------------------------------------------------------
// f and g: the two collectives every linear layer is built from
// ---------------------------------------------------------------------------------------------
// Every token's activations, where a GEMM needs them all: f forward (before a column-parallel
// GEMM) and g backward (before a row-parallel GEMM's backward). With SP: all-gather the ranks'
// token slices (tokens(N) x C each) into `all` (N x C) and return it. Without: the tokens are all
// here already; return `mine`.
static const void* all_tokens(const TensorParallel& tp, void* all, const void* mine, int N, int C,
                              DType dt, ops::Stream s) {
  if (!tp.active() || !tp.sp) return mine;
  all_gather(*tp.group, mine, all, (size_t)tp.tokens(N) * C, dt, s);
  return all;
}

// The sum of the ranks' partial results (N x C each): g forward (after a row-parallel GEMM) and
// f backward (a column-parallel GEMM's input gradient). With SP: reduce-scatter into `mine`
// (tokens(N) x C) and return it. Without: all-reduce `partial` in place and return it.
static void* sum_partials(const TensorParallel& tp, void* partial, void* mine, int N, int C,
                          DType dt, ops::Stream s) {
  if (!tp.active()) return partial;
  if (!tp.sp) {
    all_reduce_sum(*tp.group, partial, (size_t)N * C, dt, s);
    return partial;
  }
  reduce_scatter_sum(*tp.group, partial, mine, (size_t)tp.tokens(N) * C, dt, s);
  return mine;
}

// ---------------------------------------------------------------------------------------------
// Column-parallel: f, then the GEMM on this rank's output rows
// ---------------------------------------------------------------------------------------------
const void* column_parallel_forward(const TensorParallel& tp, const LinearGemm& gemm,
                                    const TpBuffers& buf, void* out, void* pre_gelu,
                                    const void* inp_mine, const void* weight, const void* bias,
                                    int N, int K, int OC, ops::Stream s) {
  if (tp_overlapped(tp))
    return overlap_column_forward(tp, gemm, buf, out, pre_gelu, inp_mine, weight, bias, N, K, OC,
                                  s);
  const void* inp = all_tokens(tp, buf.gathered, inp_mine, N, K, gemm.dt, s);  // f forward
  gemm.forward(gemm, out, pre_gelu, inp, weight, bias, nullptr, N, K, OC, s);
  return inp;
}

// dX = dout W_i, summed over the ranks (f backward), and dW_i, db_i += from dout and every
// token's input. A zero-bubble schedule runs the two halves apart (GradPart Input, then Weight,
// parallel/pipeline_schedule.h): a half leaves the other's pointers null, the path is the same.
const void* column_parallel_backward(const TensorParallel& tp, const LinearGemm& gemm,
                                     const TpBuffers& buf, float* dweight, float* dbias,
                                     const void* dout, const void* inp_mine, bool gathered_kept,
                                     const void* weight, int N, int K, int OC, ops::Stream s,
                                     GradPart part) {
  const bool input_grad = part != GradPart::Weight, weight_grad = part != GradPart::Input;
  if (tp_overlapped(tp) && input_grad)
    return overlap_column_backward(tp, gemm, buf, dweight, dbias, dout, inp_mine, gathered_kept,
                                   weight, N, K, OC, s, part);
  // The weight gradient needs the input over all tokens: under SP gather it again, unless the
  // forward's gather is still in buf.gathered.
  const void* inp = nullptr;
  if (weight_grad)
    inp = tp.active() && tp.sp && gathered_kept
              ? buf.gathered
              : all_tokens(tp, buf.gathered, inp_mine, N, K, gemm.dt, s);
  else
    dweight = nullptr, dbias = nullptr;
  gemm.backward(gemm, input_grad ? buf.dinp_all : nullptr, dweight, dbias, dout, inp,
                input_grad ? weight : nullptr, nullptr, N, K, OC, s, part);
  if (!input_grad) return nullptr;
  return sum_partials(tp, buf.dinp_all, buf.dinp, N, K, gemm.dt, s);  // f backward
}

const void* column_parallel_gather(const TensorParallel& tp, const TpBuffers& buf,
                                   const void* inp_mine, int N, int K, DType dt, ops::Stream s) {
  return all_tokens(tp, buf.gathered, inp_mine, N, K, dt, s);
}

const void* column_parallel_sum_input_grad(const TensorParallel& tp, const TpBuffers& buf, int N,
                                           int K, DType dt, ops::Stream s) {
  return sum_partials(tp, buf.dinp_all, buf.dinp, N, K, dt, s);
}

// ---------------------------------------------------------------------------------------------
// Row-parallel: the GEMM on this rank's input columns, then g
// ---------------------------------------------------------------------------------------------
void row_parallel_forward(const TensorParallel& tp, const LinearGemm& gemm, const TpBuffers& buf,
                          void* out, const void* inp, const void* weight, const void* bias,
                          const void* residual, int N, int K, int OC, ops::Stream s) {
  if (tp_overlapped(tp))
    return overlap_row_forward(tp, gemm, buf, out, inp, weight, bias, residual, N, K, OC, s);
  if (!tp.active()) {  // nothing to sum: the epilogue adds bias and residual
    gemm.forward(gemm, out, nullptr, inp, weight, bias, residual, N, K, OC, s);
    return;
  }
  gemm.forward(gemm, buf.partial, nullptr, inp, weight, nullptr, nullptr, N, K, OC, s);
  const void* sum = sum_partials(tp, buf.partial, out, N, OC, gemm.dt, s);  // g forward
  ops::add_bias_residual(out, sum, bias, residual, tp.tokens(N), OC, gemm.dt, s);
}

void row_parallel_backward(const TensorParallel& tp, const LinearGemm& gemm, const TpBuffers& buf,
                           void* dinp, float* dweight, float* dbias, const void* dout_mine,
                           const void* inp, const void* weight, const void* gelu_input, int N,
                           int K, int OC, ops::Stream s, GradPart part) {
  if (tp_overlapped(tp) && part != GradPart::Weight)
    return overlap_row_backward(tp, gemm, buf, dinp, dweight, dbias, dout_mine, inp, weight,
                                gelu_input, N, K, OC, s, part);
  const void* dout = all_tokens(tp, buf.gathered, dout_mine, N, OC, gemm.dt, s);  // g backward
  if (part == GradPart::Input) dweight = nullptr, dbias = nullptr, inp = nullptr;
  if (part == GradPart::Weight) dinp = nullptr, weight = nullptr, gelu_input = nullptr;
  gemm.backward(gemm, dinp, dweight, dbias, dout, inp, weight, gelu_input, N, K, OC, s, part);
}

// ---------------------------------------------------------------------------------------------
// Vocabulary-parallel embedding and cross-entropy
// ---------------------------------------------------------------------------------------------
// Chunk k of the tokens: its first token, and the wpe row of its first position (the encoder
// reads position t of a chunk as row t of the table it is given).
static size_t chunk_token(const TokenPositions& pos, int k) { return (size_t)k * pos.B * pos.len; }

void tp_embedding_forward(const TensorParallel& tp, void* out, void* partial, const int* tokens,
                          const void* wte, const void* wpe, const TokenPositions& pos, int C,
                          int vocab_first, int vocab_rows, int V, DType dt, ops::Stream s) {
  // without SP (or tp) the sum lands in place, in out
  void* all = tp.active() && tp.sp ? partial : out;
  const size_t e = dtype_size(dt);
  if (!tp.active()) vocab_first = 0, vocab_rows = kAllVocabRows;
  for (int k = 0; k < pos.chunks; k++) {
    const size_t first_row = pos.per_token ? 0 : (size_t)pos.first[k];  // per token: own rows
    const void* wpe_k =  // (no wpe: Llama's positions are rotary, in the attention)
        tp.rank() == 0 && wpe ? (const char*)wpe + first_row * C * e : nullptr;
    ops::encoder_forward((char*)all + chunk_token(pos, k) * C * e, tokens + chunk_token(pos, k),
                         wte, wpe_k, pos.B, pos.len, C, dt, s, vocab_first, vocab_rows, V,
                         pos.per_token ? pos.per_token + chunk_token(pos, k) : nullptr);
  }
  sum_partials(tp, all, out, pos.tokens(), C, dt, s);  // g forward
}

void tp_embedding_backward(const TensorParallel& tp, float* dwte, float* dwpe, void* all,
                           const void* dout_mine, const int* tokens, const TokenPositions& pos,
                           int C, int vocab_first, int vocab_rows, int V, DType dt,
                           ops::Stream s) {
  const void* dout = all_tokens(tp, all, dout_mine, pos.tokens(), C, dt, s);  // g backward
  const size_t e = dtype_size(dt);
  if (!tp.active()) vocab_first = 0, vocab_rows = kAllVocabRows;
  for (int k = 0; k < pos.chunks; k++) {
    const size_t first_row = pos.per_token ? 0 : (size_t)pos.first[k];  // per token: own rows
    ops::encoder_backward(dwte, dwpe ? dwpe + first_row * C : nullptr,
                          (const char*)dout + chunk_token(pos, k) * C * e,
                          tokens + chunk_token(pos, k), pos.B, pos.len, C, dt, s, vocab_first,
                          vocab_rows, V,
                          pos.per_token ? pos.per_token + chunk_token(pos, k) : nullptr);
  }
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

const void* tp_vocabulary_row(const TensorParallel& tp, void* all, const void* mine, int Vs,
                              DType dt, ops::Stream s) {
  if (!tp.active()) return mine;
  all_gather(*tp.group, mine, all, (size_t)Vs, dt, s);
  return all;
}

// ---------------------------------------------------------------------------------------------
// Placement of the split weights
// ---------------------------------------------------------------------------------------------
TensorPlacement tp_column_parallel(const std::string& name, int64_t rows, int64_t cols,
                                   int parts, const TensorParallel& tp) {
  return split_rows(name, rows, cols, parts, tp.rank(), tp.size());
}

TensorPlacement tp_column_parallel_sections(const std::string& name,
                                            const std::vector<int64_t>& sections, int64_t cols,
                                            const TensorParallel& tp) {
  return split_row_sections(name, sections, cols, tp.rank(), tp.size());
}

TensorPlacement tp_row_parallel_weight(const std::string& name, int64_t rows, int64_t cols,
                                       const TensorParallel& tp) {
  return split_cols(name, rows, cols, tp.rank(), tp.size());
}

TensorPlacement tp_row_parallel_bias(const std::string& name, int64_t rows,
                                     const TensorParallel& tp) {
  return replicated(name, rows, 1);
}

TensorPlacement tp_vocabulary_parallel(const std::string& name, int64_t Vp, int64_t C,
                                       const TensorParallel& tp) {
  return split_rows(name, Vp, C, 1, tp.rank(), tp.size());
}

TensorPlacement tp_sequence_parallel_replica(const std::string& name, int64_t rows, int64_t cols,
                                             const TensorParallel& tp) {
  TensorPlacement t = replicated(name, rows, cols);
  t.grad_partial_over_tp = tp.sp && tp.active();
  return t;
}

// ---------------------------------------------------------------------------------------------
// The partial gradients of sequence parallelism
// ---------------------------------------------------------------------------------------------
void tp_sum_partial_grads(Comm& tp, float* grad, FlatRange shard, size_t partial_begin,
                          size_t numel, ops::Stream s) {
  const FlatRange part{std::max(shard.first, partial_begin), std::min(shard.end, numel)};
  if (part.size() > 0)
    all_reduce_sum(tp, grad + (part.first - shard.first), part.size(), DType::F32, s);
}
