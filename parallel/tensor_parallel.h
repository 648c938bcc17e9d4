// parallel/tensor_parallel.h - tensor parallelism (Megatron) and sequence parallelism: the
// collectives around the split GEMMs, the vocabulary-parallel embedding and cross-entropy.
// The idea, the bytes and a diagram are at the top of parallel/tensor_parallel.cu; which block
// of each weight a rank holds is in gpt_layout (model/gpt.cu) through parallel/placement.h.
//
// Every function here degenerates to the plain one-rank computation when tp.size == 1 (no copy,
// no collective), so the model calls them unconditionally.
#pragma once
#include "kernels/ops.h"
#include "parallel/comm.h"

// This rank's tensor-parallel group (the mesh's, parallel/mesh.h) and whether sequence
// parallelism is on.
struct TensorParallel {
  Comm* group = nullptr;
  bool sp = false;       // sequence parallel: LayerNorms and residuals on N/tp tokens per rank
  int size() const { return group->size; }
  int rank() const { return group->rank; }
  bool active() const { return size() > 1; }
  // Tokens this rank holds outside the tensor-parallel regions (LayerNorms, residual stream).
  int tokens(int N) const { return sp && active() ? N / size() : N; }
};

// Make every token available before a column-parallel GEMM (Megatron's f, forward), or before
// the backward of a row-parallel GEMM (g, backward). With sequence parallelism: all-gather the
// ranks' token slices (tokens(N) x C each) into `all` (N x C) and return it. Without: the tokens
// are all here already; return `mine`.
const void* tp_all_tokens(const TensorParallel& tp, void* all, const void* mine, int N, int C,
                          DType dt, ops::Stream s);

// Sum the partial results of the ranks (N x C each): after a row-parallel GEMM (g, forward), or
// for the input gradient of a column-parallel GEMM (f, backward). With sequence parallelism:
// reduce-scatter into `mine` (tokens(N) x C) and return it. Without: all-reduce `partial` in
// place and return it.
void* tp_sum_partials(const TensorParallel& tp, void* partial, void* mine, int N, int C,
                      DType dt, ops::Stream s);

// The end of a row-parallel linear layer (tp > 1): its GEMM wrote this rank's partial product
// (N x C) into `partial`; out (tokens(N) x C) = their sum over the ranks + bias + residual, the
// bias and the residual added once, after the sum. (With one rank the GEMM's epilogue adds both
// and this is not called.)
void tp_row_parallel_finish(const TensorParallel& tp, void* out, void* partial, const void* bias,
                            const void* residual, int N, int C, DType dt, ops::Stream s);

// Where a rank's N tokens sit in their sequences: for each of B sequences, `chunks` runs of
// `len` consecutive positions, laid out chunk-major (chunk 0 of every sequence, then chunk 1),
// chunk k starting at position first[k]. Without context parallelism: one chunk of T from 0;
// with it, the two zigzag chunks of parallel/context_parallel.cu.
struct TokenPositions {
  int B = 0, chunks = 1, len = 0;
  int first[2] = {0, 0};
  int tokens() const { return B * chunks * len; }
};

// The vocabulary-parallel embedding: wte holds rows [vocab_first, vocab_first + vocab_rows).
// Forward: out (tokens(N) x C) = wte[tokens] + wpe[position]; each rank looks up its own rows
// (zeros for the others' tokens), tp rank 0 adds the positions, and the partial embeddings are
// summed (tp_sum_partials). `partial` is N x C scratch.
void tp_embedding_forward(const TensorParallel& tp, void* out, void* partial, const int* tokens,
                          const void* wte, const void* wpe, const TokenPositions& pos, int C,
                          int vocab_first, int vocab_rows, DType dt, ops::Stream s);
// Backward: dout_mine (tokens(N) x C) is gathered to every token (into `all`, N x C); each rank
// adds into its own wte rows, and every rank computes the whole of dwpe (the same on all).
void tp_embedding_backward(const TensorParallel& tp, float* dwte, float* dwpe, void* all,
                           const void* dout_mine, const int* tokens, const TokenPositions& pos,
                           int C, int vocab_first, int vocab_rows, DType dt, ops::Stream s);

// The vocabulary-parallel cross-entropy over logits (N x Vs), columns [col0, col0 + Vs) of the
// (N x Vp) logits, V of them real. losses (N) come out the same on every rank; with dloss != 0
// the logits are overwritten by their gradient (kernels/ops_decls.h, classifier_*). stats (N x 3)
// and parts (tp x N x 3) are fp32 scratch (unused with one rank).
void tp_cross_entropy(const TensorParallel& tp, void* logits, float* losses, float* stats,
                      float* parts, const int* targets, float dloss, int N, int V, int Vs,
                      int col0, DType dt, ops::Stream s);
