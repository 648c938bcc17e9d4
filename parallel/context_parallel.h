// parallel/context_parallel.h - context parallelism: each sequence split over the cp ranks
// (zigzag chunks), attention computed as a ring over them. The idea, the bytes and a diagram are
// at the top of parallel/context_parallel.cu; which blocks a rank computes at each ring step is
// parallel/context_parallel_plan.h. [parallel] cp_comm = "all-to-all" (Ulysses) or "hybrid"
// moves heads instead of (or before) K and V: parallel/context_parallel_a2a.cu.
//
// The model always attends through cp_attention_forward / backward: with one cp rank they are
// ops::attention_forward / backward over the whole sequence and the state holds nothing (no
// buffer, no event, no plan), so no caller branches on cp.
//
// Local token layout. With cp > 1 rank r holds chunks r and 2cp-1-r (T/(2cp) positions each) of
// every sequence of its micro-batch, chunk-major: chunk r of all B sequences, then chunk 2cp-1-r
// of all B sequences. Every op but attention and the embedding is per token and does not care;
// each chunk is a contiguous (B, Tc, ...) block for the attention kernels, and the embedding
// reads wpe at each chunk's global positions (TokenPositions, parallel/tensor_parallel.h).
#pragma once
#include "kernels/allocator.h"
#include "kernels/ops.h"
#include "parallel/comm.h"
#include "parallel/context_parallel_plan.h"
#include "parallel/tensor_parallel.h"

// The all-to-all's part (parallel/context_parallel_a2a.cu): the caller's heads and chunk before
// the split, and the buffers of the head-split layout.
struct CpHeads {
  int NH = 0, NKV = 0;     // this tp rank's query and kv heads, as the caller holds them
  int Tc = 0;              // the caller's chunk: T/(2 cp) positions
  bool kv_copied = false;  // fewer kv heads than ranks: each gets a copy of the one it uses
  // send, recv: the all-to-all's buffers (qkv's width, every peer's block); qkv, out, dout: the
  // head-split (whole-sequence, or ring-chunk) layout; dkv_sum, dkv_part: fp32 sums of a copied
  // kv head's gradient (kv_copied only); docs: the document ids in the head-split row order.
  void *send = nullptr, *recv = nullptr, *qkv = nullptr, *out = nullptr, *dout = nullptr;
  float *dkv_sum = nullptr, *dkv_part = nullptr;
  int* docs = nullptr;
};

struct ContextParallel {
  // The ring's group: this rank's cp group (the mesh's) under cp_comm = "ring"; one rank under
  // "all-to-all"; under "hybrid" the ranks at the same place of every all-to-all group.
  Comm* group = nullptr;
  Comm* a2a = nullptr;  // "all-to-all" / "hybrid": the all-to-all group (null: the ring alone)
  CpHeads heads;
  int size() const { return group->size; }
  int rank() const { return group->rank; }
  bool active() const { return size() > 1; }
  ContextParallelPlan plan;
  // largest micro-batch, chunk length, local query heads, local kv heads (grouped-query
  // attention: NKV < NH), head size; with an all-to-all, those of the head-split layout the ring
  // sees (heads / the group's size, chunk T/(2 * ring size))
  int B = 0, Tc = 0, NH = 0, NKV = 0, HS = 0;
  DType dt = DType::F32;
  ops::Stream ring = nullptr;         // the K, V transfers run here, overlapping compute
  ops::Event ready = nullptr, arrived = nullptr;
  // Buffers: K, V of two chunks (2,B,Tc,2Ckv) twice (the block in hand and the one arriving),
  // their fp32 gradients (the same, twice), a block's own output (B,Tc,C) and lse (B,NH,Tc), and
  // the fp32 dq of the local chunks (2,B,Tc,C). C = NH*HS (this tp rank's query heads), Ckv =
  // NKV*HS (its kv heads).
  void* kv[2] = {nullptr, nullptr};
  float* dkv[2] = {nullptr, nullptr};
  void* block_out = nullptr;
  float* block_lse = nullptr;
  float* dq = nullptr;
};

// The token positions of rank r's local tokens (B sequences of T positions).
TokenPositions cp_positions_of(int cp, int rank, int B, int T);
// Rank r's local tokens (B*T/cp, chunk-major) out of a micro-batch (B,T) on the host.
void cp_select_tokens(int* local, const int* full, int cp, int rank, int B, int T);
// The local index of global position t of sequence b, or -1 if another cp rank holds it.
int cp_local_index(int cp, int rank, int B, int T, int b, int t);

// B sequences of T positions (all cp ranks' together) over the group; the buffers and events
// come from `memory`, which owns them (a count-only allocator, the planner's, only counts them).
// With one rank nothing is taken. a2a: the all-to-all group of cp_comm "all-to-all" / "hybrid"
// (null or one rank: the ring alone over `group`).
void cp_create(ContextParallel& cp, Comm* group, int B, int T, int NH, int NKV, int HS, DType dt,
               Allocator& memory, ops::Stream ring, Comm* a2a = nullptr);

// Causal attention of B sequences of T_local positions on this rank (2*Tc under cp > 1: its two
// chunks): out (B*T_local,C) and lse for the queries of qkv (B*T_local,C+2Ckv), against the
// keys and values of every position before them. cp > 1: the ring over the group, out (2,B,Tc,C) and lse
// (2,B,NH,Tc) chunk-major. One rank: ops::attention_forward, out (B,T,C), lse (B,NH,T).
// docs (model/documents.h): the document ids of the full rows, chunk-major ((2cp, B, Tc), or
// (B,T) with one rank), for a block-causal mask; null: causal.
void cp_attention_forward(ContextParallel& cp, void* out, float* lse, const void* qkv, int B,
                          int T_local, ops::Stream s, const int* docs = nullptr);
// Its backward: dqkv, written, from dout and the forward's out and lse (the ring again, or
// ops::attention_backward with one rank).
void cp_attention_backward(ContextParallel& cp, void* dqkv, const void* dout, const void* qkv,
                           const void* out, const float* lse, int B, int T_local,
                           ops::Stream s, const int* docs = nullptr);

// The ring alone (parallel/context_parallel.cu), over cp.group with cp's heads and chunk: what
// cp_attention_forward / backward run without an all-to-all, and the all-to-all runs between its
// two exchanges (parallel/context_parallel_a2a.cu).
void cp_ring_attention_forward(ContextParallel& cp, void* out, float* lse, const void* qkv, int B,
                               int T_local, ops::Stream s, const int* docs);
void cp_ring_attention_backward(ContextParallel& cp, void* dqkv, const void* dout,
                                const void* qkv, const void* out, const float* lse, int B,
                                int T_local, ops::Stream s, const int* docs);
// The all-to-all around the ring (parallel/context_parallel_a2a.cu).
void cp_a2a_setup(ContextParallel& cp, Comm* a2a, int B, int T, int NH, int NKV, int HS,
                  DType dt, Allocator& memory);
void cp_a2a_attention_forward(ContextParallel& cp, void* out, float* lse, const void* qkv, int B,
                              int T_local, ops::Stream s, const int* docs);
void cp_a2a_attention_backward(ContextParallel& cp, void* dqkv, const void* dout,
                               const void* qkv, const void* out, const float* lse, int B,
                               int T_local, ops::Stream s, const int* docs);
