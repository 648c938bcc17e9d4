// parallel/tensor_parallel.h - tensor parallelism (Megatron) and sequence parallelism: the column-
// and row-parallel linear layers (forward and backward, with Megatron's f and g around their
// GEMMs), the vocabulary-parallel embedding and cross-entropy, where each split weight is placed,
// and the once-per-step sum of the sequence-parallel partial gradients. The idea, the bytes and a
// timeline are at the top of parallel/tensor_parallel.cu.
//
// Every function here degenerates to the plain one-rank computation when tp.size == 1 (the same
// kernels on the same buffers, no copy, no collective), so the model calls them unconditionally.
//
// Shapes: N = the micro-batch's tokens, K = a linear layer's inputs, OC its outputs on this rank
// (the split dimension of a column-parallel layer) or in all (a row-parallel one, whose K is
// split). "Mine" is this rank's tokens(N) x C token slice of the residual stream (all N without
// sequence parallelism); "all" is every token.
#pragma once
#include <string>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/ops.h"
#include "parallel/comm.h"
#include "parallel/placement.h"

struct TpOverlap;

// This rank's tensor-parallel group (the mesh's, parallel/mesh.h) and whether sequence
// parallelism is on.
struct TensorParallel {
  Comm* group = nullptr;
  bool sp = false;       // sequence parallel: LayerNorms and residuals on N/tp tokens per rank
  bool overlap = false;  // [parallel] tp_overlap: asked for (it needs sp and tp > 1)
  // Its stream and events, made by tp_overlap_create where it applies (null: the collectives
  // run whole on the compute stream).
  TpOverlap* chunks = nullptr;
  int size() const { return group->size; }
  int rank() const { return group->rank; }
  bool active() const { return size() > 1; }
  // Tokens this rank holds outside the tensor-parallel regions (LayerNorms, residual stream).
  int tokens(int N) const { return sp && active() ? N / size() : N; }
};

// ---------------------------------------------------------------------------------------------
// The GEMM a linear layer runs, as a value. The model decides how a layer multiplies (in the
// compute dtype, or on FP8 operands with that layer's scales, model/fp8.h); the parallel linears
// below decide what is multiplied and what crosses the group around it. A plain struct of two
// function pointers and their context rather than std::function: nothing is allocated per call,
// the state it carries is visible (context, site, dt), and a caller builds one in one line.
// ---------------------------------------------------------------------------------------------
// Which part of a linear layer's backward to run. A zero-bubble pipeline schedule splits every
// backward in two (parallel/pipeline_schedule.h): the input gradient (on the critical path), and
// later the weight and bias gradients, from the output gradient and the input kept until then.
enum class GradPart { Both, Input, Weight };

struct LinearGemm;
// out (N,OC) = inp (N,K) weight^T + bias + residual; with pre_gelu != null, out = GELU(that) and
// pre_gelu keeps the input of the GELU (ops::matmul_forward's contract, kernels/ops_decls.h).
typedef void (*GemmForward)(const LinearGemm& g, void* out, void* pre_gelu, const void* inp,
                            const void* weight, const void* bias, const void* residual, int N,
                            int K, int OC, ops::Stream s);
// dinp (N,K) = dout weight, written; dweight (OC,K) += dout^T inp and dbias (OC) += column sums
// of dout, fp32; each may be null (dinp alone, then dweight and dbias alone: the split backward,
// inp resp. weight then unread); gelu_input != null: dinp is multiplied by GELU'(gelu_input)
// (ops::matmul_backward's contract). `part` says which of them the caller wants, so that a GEMM
// with collectives of its own (FP8's amax agreement) runs the same ones when the planner's dry
// step hands it no buffers.
typedef void (*GemmBackward)(const LinearGemm& g, void* dinp, float* dweight, float* dbias,
                             const void* dout, const void* inp, const void* weight,
                             const void* gelu_input, int N, int K, int OC, ops::Stream s,
                             GradPart part);
struct LinearGemm {
  GemmForward forward = nullptr;
  GemmBackward backward = nullptr;
  void* context = nullptr;  // the caller's state (the FP8 context), passed back untouched
  int site = 0;             // which linear layer of the model (FP8 keeps scales per layer)
  DType dt = DType::F32;    // the activations' and weights' dtype (also what the collectives move)
};
// ops::matmul_forward / matmul_backward in dtype dt.
LinearGemm compute_dtype_gemm(DType dt);

// Scratch of the model's, in the compute dtype; null where unused (tp = 1, or no SP for gathered).
struct TpBuffers {
  void* gathered = nullptr;  // (N,C) SP: every token's activations (f forward, g backward)
  void* partial = nullptr;   // (N,C) tp > 1: a row-parallel GEMM's partial product, before g
  void* dinp_all = nullptr;  // (N,C) a column-parallel GEMM's input gradient before f backward
                             // sums it (tp = 1: the same buffer as dinp)
  void* dinp = nullptr;      // (tokens(N),C) that gradient, summed: this rank's tokens
};

// ---------------------------------------------------------------------------------------------
// The linear layers
// ---------------------------------------------------------------------------------------------
// Column-parallel (qkv, fc; the head over the vocabulary): out (N,OC) = f(inp) W_i^T + b_i, W_i
// this rank's rows of the weight (its heads, hidden columns or vocabulary rows), pre_gelu as in
// GemmForward. f forward: SP all-gathers the token slices into buf.gathered; without SP it is the
// identity. Returns the input over all tokens (in buf.gathered under SP: valid until the next
// gather).
const void* column_parallel_forward(const TensorParallel& tp, const LinearGemm& gemm,
                                    const TpBuffers& buf, void* out, void* pre_gelu,
                                    const void* inp_mine, const void* weight, const void* bias,
                                    int N, int K, int OC, ops::Stream s);
// Its backward: dweight, dbias += from dout (N,OC) and the input over all tokens, then dX =
// dout W_i, a partial sum over the ranks, and f backward sums it (SP: reduce-scatter into
// buf.dinp; without SP: all-reduce in place in buf.dinp_all). Returns d(inp_mine).
// gathered_kept: the forward's gathered input is still in buf.gathered (the head: its backward
// follows its forward directly); else it is gathered again from inp_mine (activations stay
// divided by tp). A flag, not a pointer: the planner's dry step has no buffers to test.
// part Input: dX only (weight read, inp_mine not: no gather); part Weight: dweight and dbias only
// (inp_mine gathered, weight not read; returns nullptr).
const void* column_parallel_backward(const TensorParallel& tp, const LinearGemm& gemm,
                                     const TpBuffers& buf, float* dweight, float* dbias,
                                     const void* dout, const void* inp_mine, bool gathered_kept,
                                     const void* weight, int N, int K, int OC, ops::Stream s,
                                     GradPart part = GradPart::Both);
// A column-parallel linear taken apart, for a caller that runs its GEMMs over chunks of the
// tokens itself (the head, model/gpt_head.cu): f forward alone (every token's input: under SP
// gathered into buf.gathered, else inp_mine itself), and f backward alone (the sum over the ranks
// of the input gradient's partial sums the caller left in buf.dinp_all, N x K; returns d(inp_mine)).
const void* column_parallel_gather(const TensorParallel& tp, const TpBuffers& buf,
                                   const void* inp_mine, int N, int K, DType dt, ops::Stream s);
const void* column_parallel_sum_input_grad(const TensorParallel& tp, const TpBuffers& buf, int N,
                                           int K, DType dt, ops::Stream s);
// Row-parallel (attention projection, fc projection): out (tokens(N),OC) = g(inp W_i^T) + bias +
// residual, inp (N,K) this rank's K columns (its heads or hidden columns), W_i the matching
// columns of the weight. g forward sums the partial products over the ranks (SP: reduce-scatter
// to this rank's tokens; without SP: all-reduce); bias and residual are added once, after it.
// With one rank the GEMM's epilogue adds both.
void row_parallel_forward(const TensorParallel& tp, const LinearGemm& gemm, const TpBuffers& buf,
                          void* out, const void* inp, const void* weight, const void* bias,
                          const void* residual, int N, int K, int OC, ops::Stream s);
// Its backward: g backward makes dout_mine (tokens(N),OC) every token's (SP: all-gather into
// buf.gathered; without SP: the identity), then dinp (N,K) = dY W_i (times GELU'(gelu_input) if
// not null), dweight, dbias += from dY. dbias is complete on every rank: dY covers all tokens.
// part Input: dinp only; part Weight: dweight and dbias only (dY gathered again under SP).
void row_parallel_backward(const TensorParallel& tp, const LinearGemm& gemm, const TpBuffers& buf,
                           void* dinp, float* dweight, float* dbias, const void* dout_mine,
                           const void* inp, const void* weight, const void* gelu_input, int N,
                           int K, int OC, ops::Stream s, GradPart part = GradPart::Both);

// ---------------------------------------------------------------------------------------------
// Vocabulary-parallel embedding and loss
// ---------------------------------------------------------------------------------------------
// Where a rank's N tokens sit in their sequences: for each of B sequences, `chunks` runs of
// `len` consecutive positions, laid out chunk-major (chunk 0 of every sequence, then chunk 1),
// chunk k starting at position first[k]. Without context parallelism: one chunk of T from 0;
// with it, the two zigzag chunks of parallel/context_parallel.cu. per_token, when set (a device
// array of the N tokens in that layout), gives each token's own position instead: packed
// documents whose positions restart at each document (model/documents.h).
struct TokenPositions {
  int B = 0, chunks = 1, len = 0;
  int first[2] = {0, 0};
  const int* per_token = nullptr;
  int tokens() const { return B * chunks * len; }
};

// The vocabulary-parallel embedding: wte holds rows [vocab_first, vocab_first + vocab_rows).
// Forward: out (tokens(N) x C) = wte[tokens] + wpe[position] (no wpe, null: Llama, whose
// positions are rotary); each rank looks up its own rows
// (zeros for the others' tokens), tp rank 0 adds the positions, and the partial embeddings are
// summed (g forward). `partial` is N x C scratch. V: the vocabulary, which every token is below.
void tp_embedding_forward(const TensorParallel& tp, void* out, void* partial, const int* tokens,
                          const void* wte, const void* wpe, const TokenPositions& pos, int C,
                          int vocab_first, int vocab_rows, int V, DType dt, ops::Stream s);
// Backward: dout_mine (tokens(N) x C) is gathered to every token (into `all`, N x C); each rank
// adds into its own wte rows, and every rank computes the whole of dwpe (the same on all; null:
// none).
void tp_embedding_backward(const TensorParallel& tp, float* dwte, float* dwpe, void* all,
                           const void* dout_mine, const int* tokens, const TokenPositions& pos,
                           int C, int vocab_first, int vocab_rows, int V, DType dt,
                           ops::Stream s);

// The vocabulary-parallel cross-entropy over logits (N x Vs), columns [col0, col0 + Vs) of the
// (N x Vp) logits, V of them real. losses (N) come out the same on every rank; with dloss != 0
// the logits are overwritten by their gradient (kernels/ops_decls.h, classifier_*). stats (N x 3)
// and parts (tp x N x 3) are fp32 scratch (unused with one rank).
void tp_cross_entropy(const TensorParallel& tp, void* logits, float* losses, float* stats,
                      float* parts, const int* targets, float dloss, int N, int V, int Vs,
                      int col0, DType dt, ops::Stream s);

// One row of logits over the whole vocabulary: this rank's Vs columns `mine`, and every rank's
// in rank order gathered into `all` (tp x Vs; with one rank `mine` itself). Returns where they are.
const void* tp_vocabulary_row(const TensorParallel& tp, void* all, const void* mine, int Vs,
                              DType dt, ops::Stream s);

// ---------------------------------------------------------------------------------------------
// [parallel] tp_overlap (parallel/tensor_parallel_overlap.cu): sequence parallelism's all-gathers
// and reduce-scatters in tp chunks on a communication stream, each chunk's GEMM rows beside the
// next chunk's transfer. The GEMMs are cut by rows and the chunks' partial sums added in rank
// order, so the results equal those without it up to the reductions' own rounding order (bitwise
// at tp = 2; the file's header says where else).
// ---------------------------------------------------------------------------------------------
struct TpOverlap {
  ops::Stream ring = nullptr;        // the transfers: the model's communication stream
  ops::Event ready = nullptr;        // compute stream: everything queued before an all-gather
  std::vector<ops::Event> gathered;  // tp - 1: all-gather step j's chunk is here (ring stream)
  std::vector<ops::Event> computed;  // tp - 1: reduce-scatter piece j's rows are written (compute)
  std::vector<ops::Event> reduced;   // tp - 1: reduce-scatter step j's piece is here (ring)
};
// Makes tp.chunks when tp.overlap, tp > 1 and sp (events from `memory`; ring: the stream the
// transfers run on); otherwise leaves it null. tp_overlap_destroy frees the struct (the events
// go with `memory`).
void tp_overlap_create(TensorParallel& tp, Allocator& memory, ops::Stream ring);
void tp_overlap_destroy(TensorParallel& tp);
// Whether the linears below run overlapped (tp.chunks is set and sp is on: the KV-cache sampler
// turns sp off for its few tokens).
bool tp_overlapped(const TensorParallel& tp);
// The overlapped forms of the four parallel linears (same contracts as the plain ones below,
// which call them when tp_overlapped; column backward and row backward only for GradPart::Both
// and ::Input: the weight half alone has nothing to overlap).
const void* overlap_column_forward(const TensorParallel& tp, const LinearGemm& gemm,
                                   const TpBuffers& buf, void* out, void* pre_gelu,
                                   const void* inp_mine, const void* weight, const void* bias,
                                   int N, int K, int OC, ops::Stream s);
const void* overlap_column_backward(const TensorParallel& tp, const LinearGemm& gemm,
                                    const TpBuffers& buf, float* dweight, float* dbias,
                                    const void* dout, const void* inp_mine, bool gathered_kept,
                                    const void* weight, int N, int K, int OC, ops::Stream s,
                                    GradPart part);
void overlap_row_forward(const TensorParallel& tp, const LinearGemm& gemm, const TpBuffers& buf,
                         void* out, const void* inp, const void* weight, const void* bias,
                         const void* residual, int N, int K, int OC, ops::Stream s);
void overlap_row_backward(const TensorParallel& tp, const LinearGemm& gemm, const TpBuffers& buf,
                          void* dinp, float* dweight, float* dbias, const void* dout_mine,
                          const void* inp, const void* weight, const void* gelu_input, int N,
                          int K, int OC, ops::Stream s, GradPart part);

// ---------------------------------------------------------------------------------------------
// Where the split weights live (parallel/placement.h), rank tp.rank() of tp.size()
// ---------------------------------------------------------------------------------------------
// A column-parallel weight (rows = outputs, cols = inputs) or bias (cols = 1): the rows form
// `parts` equal consecutive parts (qkv: 3, for q, k, v) and this rank holds the r-th 1/tp of each.
TensorPlacement tp_column_parallel(const std::string& name, int64_t rows, int64_t cols,
                                   int parts, const TensorParallel& tp);
// The same with unequal sections (Llama's qkv with grouped-query attention: NH*HS rows of q, then
// NKV*HS of k and of v): this rank holds the r-th 1/tp of each section, [q_r; k_r; v_r].
TensorPlacement tp_column_parallel_sections(const std::string& name,
                                            const std::vector<int64_t>& sections, int64_t cols,
                                            const TensorParallel& tp);
// A row-parallel weight (rows = outputs, cols = inputs): this rank's 1/tp of the columns.
TensorPlacement tp_row_parallel_weight(const std::string& name, int64_t rows, int64_t cols,
                                       const TensorParallel& tp);
// A row-parallel bias (rows outputs): replicated, added after the sum. Its gradient is summed
// over dY of all tokens (gathered under SP), so it is complete on every rank.
TensorPlacement tp_row_parallel_bias(const std::string& name, int64_t rows,
                                     const TensorParallel& tp);
// The vocabulary-parallel embedding (Vp rows, C columns): this rank's 1/tp of the rows.
TensorPlacement tp_vocabulary_parallel(const std::string& name, int64_t Vp, int64_t C,
                                       const TensorParallel& tp);
// A tensor used on the residual stream's tokens (LayerNorms; the MoE router): replicated; under
// SP each rank sees only its tokens, so its gradient is a partial sum over tp
// (grad_partial_over_tp, summed by tp_sum_partial_grads).
TensorPlacement tp_sequence_parallel_replica(const std::string& name, int64_t rows, int64_t cols,
                                             const TensorParallel& tp);

// The sum of the partial gradients over tp (sequence parallelism), for one unit: `grad` is this
// rank's shard [shard.first, shard.end) of the unit's flat fp32 gradient, whose elements
// [partial_begin, numel) are partial over tp (parallel/placement.h). One all-reduce of their part
// of the shard on s, nothing if the shard holds none. The parameter store calls it once per step,
// after the unit's gradients are complete over its own group.
void tp_sum_partial_grads(Comm& tp, float* grad, FlatRange shard, size_t partial_begin,
                          size_t numel, ops::Stream s);
