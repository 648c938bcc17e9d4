// parallel/context_parallel.cu - context parallelism: ring attention over zigzag chunks.
//
// The idea. Activation memory grows with the sequence length T; weights do not. Context
// parallelism cuts every sequence over cp ranks, so each holds T/cp tokens of every activation.
// Every op of a transformer is per token except attention, where each query needs the keys and
// values of every earlier position. So the K and V blocks travel around the cp ring: at step s
// rank r holds the K, V of rank r-s, computes its queries against them, and passes them on to
// r+1 while it receives the next ones from r-1. After cp steps every query has seen every key.
//
// The merge. Attention over keys split into blocks is recombined exactly with the log-sum-exp
// of each block: softmax(q K^T) V over all keys = sum_b w_b out_b with w_b = exp(lse_b - lse),
// lse = log sum_b exp(lse_b) (ops::attention_merge, in fp32). Each block returns its own output
// and lse (ops::attention_block_forward), and the running result absorbs it.
//
// Zigzag. With causal attention, a rank holding the last T/cp positions would do cp times the
// work of the first. So the sequence is cut into 2cp chunks and rank r holds chunks r and
// 2cp-1-r: one early, one late, the same triangle area for everyone. Which (query chunk, key
// chunk) blocks each rank computes at each step, and with which mask (the diagonal chunk
// causal, earlier chunks in full), is parallel/context_parallel_plan.cu. cp = 2, chunks 0-3:
//
//              key chunk 0   1     2     3
//   query 0          r0s0\   .     .     .         rN sM: rank N computes it at step M
//   query 1          r1s1    r1s0\ .     .         \    : causal (diagonal) block
//   query 2          r1s1    r1s0  r1s0\ .
//   query 3          r0s0    r0s1  r0s1  r0s0\     every rank: 1 causal pair + 1 full block
//
// The backward goes around the ring again with K and V, and the gradients dK, dV travel with
// them: each rank adds its blocks' contribution to the dK, dV of the chunks in hand (fp32) and
// passes them on; after the last step they take one more hop, home. dQ stays local. The final
// output and lse of the forward are all a block's backward needs (P = exp(S - lse)).
//
// Packed documents ([data] document_mask, model/documents.h). Every rank holds the document ids
// of the full rows (B*T ints, chunk-major: chunk g's B rows are one (B, Tc) block), numbered
// along the whole sequence, so a block's queries and keys find theirs by chunk index whatever
// rank the K, V came from; only K and V travel. Each block masks keys of other documents (and
// the kernels skip tiles that hold none of the queries' documents); a query whose document does
// not reach a block gets lse = -inf there, which the merge ignores, and its own diagonal block
// always holds it, so every row ends finite. The zigzag's balance is the causal one: with short
// documents the far-off blocks are mostly skipped and the ranks' work evens out further.
//
// Who talks to whom, bytes, per layer and micro-batch (B sequences, Ckv = NKV*HS = this tp
// rank's key (or value) channels, b bytes per element): rank r sends to r+1 and receives from r-1
// on the cp group.
//   forward:  cp-1 transfers of K, V of two chunks: 2 * 2 * (T/2cp) * Ckv * B * b = 2TCkvB/cp * b
//   backward: the same cp-1 K, V transfers, and cp transfers of dK, dV in fp32 (2TCkvB/cp * 4)
// against the T*T/cp attention FLOPs per rank each step hides. Only the kv heads travel: with
// grouped-query attention (NKV kv heads for NH query heads) Ckv = C * NKV/NH, so the ring's bytes
// shrink by NH/NKV against multi-head attention (Ckv = C, GPT-2).
//
//   compute  | blocks with KV(r)   | blocks with KV(r-1) | ... | blocks with KV(r-cp+1)
//   ring     |--send KV(r), recv KV(r-1)--|--send, recv--| ...
//
// In the forward the next K, V arrive on the `ring` stream while the blocks in hand compute; in
// the backward the K, V of the next step are posted before the blocks and the dK, dV after them.
// [parallel] cp_comm = "all-to-all" (Ulysses) moves heads instead of K and V, and "hybrid" runs
// this ring across groups that do: parallel/context_parallel_a2a.cu, which calls the ring below
// (cp_ring_attention_*) on its head-split layout; "ring", the default, is this file alone.
// The rest of the model sees nothing of this: its gradients are summed over dp x cp (the units'
// gradient axis, parallel/placement.h), since every cp rank saw other tokens of the same
// sequences, and the loss is their mean over every token of the global batch.
#include "parallel/context_parallel.h"

#include <vector>

#include "kernels/common.h"

// ---------------------------------------------------------------------------------------------
// Tokens
// ---------------------------------------------------------------------------------------------
TokenPositions cp_positions_of(int cp, int rank, int B, int T) {
  TokenPositions p;
  p.B = B;
  if (cp == 1) {
    p.len = T;
    return p;
  }
  p.chunks = 2;
  p.len = T / (2 * cp);
  cp_local_chunks(cp, rank, &p.first[0], &p.first[1]);
  p.first[0] *= p.len;
  p.first[1] *= p.len;
  return p;
}

void cp_select_tokens(int* local, const int* full, int cp, int rank, int B, int T) {
  const TokenPositions p = cp_positions_of(cp, rank, B, T);
  for (int k = 0; k < p.chunks; k++)
    for (int b = 0; b < B; b++)
      for (int t = 0; t < p.len; t++)
        local[((size_t)k * B + b) * p.len + t] = full[(size_t)b * T + p.first[k] + t];
}

int cp_local_index(int cp, int rank, int B, int T, int b, int t) {
  const TokenPositions p = cp_positions_of(cp, rank, B, T);
  for (int k = 0; k < p.chunks; k++)
    if (t >= p.first[k] && t < p.first[k] + p.len)
      return (k * B + b) * p.len + (t - p.first[k]);
  return -1;
}

// ---------------------------------------------------------------------------------------------
// Buffers
// ---------------------------------------------------------------------------------------------
void cp_create(ContextParallel& cp, Comm* group, int B, int T, int NH, int NKV, int HS, DType dt,
               Allocator& memory, ops::Stream ring, Comm* a2a) {
  cp.group = group;
  cp.B = B, cp.Tc = T / (2 * cp.size()), cp.NH = NH, cp.NKV = NKV, cp.HS = HS, cp.dt = dt;
  if (a2a && a2a->size > 1) {  // the ring sees the head-split layout (its heads, its chunk)
    cp_a2a_setup(cp, a2a, B, T, NH, NKV, HS, dt, memory);
    NH = cp.NH, NKV = cp.NKV;
  }
  cp.ring = ring;
  if (!cp.active()) return;  // one rank: attention is the plain kernel, nothing to hold
  cp.plan = cp_plan_build(cp.size(), T);
  cp.ready = allocate_event(memory);
  cp.arrived = allocate_event(memory);
  const size_t rows = (size_t)B * cp.Tc, C = (size_t)NH * HS, Ckv = (size_t)NKV * HS;
  const size_t e = dtype_size(dt);
  for (int i = 0; i < 2; i++) {
    cp.kv[i] = allocate(memory, 2 * rows * 2 * Ckv * e);
    cp.dkv[i] = (float*)allocate(memory, 2 * rows * 2 * Ckv * sizeof(float));
  }
  cp.block_out = allocate(memory, rows * C * e);
  cp.block_lse = (float*)allocate(memory, rows * NH * sizeof(float));
  cp.dq = (float*)allocate(memory, 2 * rows * C * sizeof(float));
}

// ---------------------------------------------------------------------------------------------
// The ring
// ---------------------------------------------------------------------------------------------
namespace {

// Chunk `local` (0 or 1) of a chunk-major (2,B,Tc,width) buffer.
template <typename T>
T* chunk(T* base, int local, int B, const ContextParallel& cp, int width, size_t elem) {
  return (T*)((char*)base + (size_t)local * B * cp.Tc * width * elem);
}

// The document ids (B,Tc) of global chunk g out of the full rows' (2cp,B,Tc) (null: none).
const int* chunk_docs(const int* docs, int g, int B, const ContextParallel& cp) {
  return docs ? docs + (size_t)g * B * cp.Tc : nullptr;
}

// Which of the two chunks of `holder` (in its local order) global chunk `g` is.
int local_of(const ContextParallel& cp, int holder, int g) {
  int first, second;
  cp_local_chunks(cp.size(), holder, &first, &second);
  return g == first ? 0 : 1;
}

// The ring stream sends `out` to rank r+1 and receives `in` from r-1 once everything queued on
// s so far is done; s waits for the arrival before anything it queues next.
void exchange(ContextParallel& cp, const std::vector<P2POp>& ops_list, DType dt, ops::Stream s) {
  ops::event_record(cp.ready, s);
  ops::stream_wait_event(cp.ring, cp.ready);
  p2p_batch(*cp.group, ops_list.data(), (int)ops_list.size(), dt, cp.ring);
  ops::event_record(cp.arrived, cp.ring);
}

std::vector<P2POp> pass_on(const ContextParallel& cp, void* out, void* in, size_t count) {
  const int next = (cp.rank() + 1) % cp.size(), prev = (cp.rank() + cp.size() - 1) % cp.size();
  return {{true, out, count, next}, {false, in, count, prev}};
}

// K and V of both local chunks, out of the packed qkv [q | k | v] (columns C..C+2Ckv of every
// token).
void local_kv(ContextParallel& cp, void* kv, const void* qkv, int B, ops::Stream s) {
  const int C = cp.NH * cp.HS, Ckv = cp.NKV * cp.HS;
  const size_t e = dtype_size(cp.dt);
  ops::copy_columns(kv, 2 * Ckv, cp.dt, (const char*)qkv + C * e, C + 2 * Ckv, cp.dt,
                    2 * B * cp.Tc, 2 * Ckv, s);
}

}  // namespace

// The micro-batch's shape, checked against the ring's buffers: B sequences of T local positions
// (two chunks of Tc).
static void check_shape(const ContextParallel& cp, int B, int T) {
  CHECK(B <= cp.B && T == 2 * cp.Tc,
        "ring attention: micro-batch %d x %d positions, but the buffers hold %d x %d", B, T, cp.B,
        2 * cp.Tc);
}

void cp_attention_forward(ContextParallel& cp, void* out, float* lse, const void* qkv, int B,
                          int T_local, ops::Stream s, const int* docs) {
  if (cp.a2a) return cp_a2a_attention_forward(cp, out, lse, qkv, B, T_local, s, docs);
  cp_ring_attention_forward(cp, out, lse, qkv, B, T_local, s, docs);
}

void cp_attention_backward(ContextParallel& cp, void* dqkv, const void* dout, const void* qkv,
                           const void* out, const float* lse, int B, int T_local,
                           ops::Stream s, const int* docs) {
  if (cp.a2a)
    return cp_a2a_attention_backward(cp, dqkv, dout, qkv, out, lse, B, T_local, s, docs);
  cp_ring_attention_backward(cp, dqkv, dout, qkv, out, lse, B, T_local, s, docs);
}

void cp_ring_attention_forward(ContextParallel& cp, void* out, float* lse, const void* qkv,
                               int B, int T_local, ops::Stream s, const int* docs) {
  if (!cp.active()) {  // every position is here: causal attention over the whole sequence
    ops::attention_forward(out, lse, qkv, B, T_local, cp.NH, cp.NKV, cp.HS, cp.dt, s, docs);
    return;
  }
  check_shape(cp, B, T_local);
  const int C = cp.NH * cp.HS, Ckv = cp.NKV * cp.HS, T = cp.Tc;
  const size_t e = dtype_size(cp.dt), kv_count = 2 * (size_t)B * T * 2 * Ckv;
  local_kv(cp, cp.kv[0], qkv, B, s);
  bool written[2] = {false, false};  // the first block of a query chunk writes, later ones merge
  for (int step = 0; step < cp.size(); step++) {
    void* held = cp.kv[step % 2];
    if (step + 1 < cp.size())  // the next K, V travel while these blocks compute
      exchange(cp, pass_on(cp, held, cp.kv[(step + 1) % 2], kv_count), cp.dt, s);
    const CpStep& st = cp.plan.ranks[cp.rank()][step];
    for (const CpBlock& blk : st.blocks) {
      const int qi = local_of(cp, cp.rank(), blk.q_chunk);
      const int ki = local_of(cp, st.kv_rank, blk.kv_chunk);
      void* o = chunk(out, qi, B, cp, C, e);
      float* l = chunk(lse, qi, B, cp, cp.NH, sizeof(float));
      const void* q = chunk(qkv, qi, B, cp, C + 2 * Ckv, e);
      const void* kv = chunk((const void*)held, ki, B, cp, 2 * Ckv, e);
      const bool causal = blk.mask == CpMask::Causal;
      const int* q_docs = chunk_docs(docs, blk.q_chunk, B, cp);
      const int* k_docs = chunk_docs(docs, blk.kv_chunk, B, cp);
      if (!written[qi]) {
        ops::attention_block_forward(o, l, q, kv, B, T, cp.NH, cp.NKV, cp.HS, causal, cp.dt, s,
                                     q_docs, k_docs);
        written[qi] = true;
        continue;
      }
      ops::attention_block_forward(cp.block_out, cp.block_lse, q, kv, B, T, cp.NH, cp.NKV, cp.HS,
                                   causal, cp.dt, s, q_docs, k_docs);
      ops::attention_merge(o, l, cp.block_out, cp.block_lse, B, T, cp.NH, cp.HS, cp.dt, s);
    }
    if (step + 1 < cp.size()) ops::stream_wait_event(s, cp.arrived);
  }
}

void cp_ring_attention_backward(ContextParallel& cp, void* dqkv, const void* dout,
                                const void* qkv, const void* out, const float* lse, int B,
                                int T_local, ops::Stream s, const int* docs) {
  if (!cp.active()) {
    ops::attention_backward(dqkv, dout, qkv, out, lse, B, T_local, cp.NH, cp.NKV, cp.HS, cp.dt,
                            s, docs);
    return;
  }
  check_shape(cp, B, T_local);
  const int C = cp.NH * cp.HS, Ckv = cp.NKV * cp.HS, T = cp.Tc;
  const size_t e = dtype_size(cp.dt), kv_count = 2 * (size_t)B * T * 2 * Ckv;
  const size_t rows = 2 * (size_t)B * T;
  ops::fill_zero(cp.dq, rows * C * sizeof(float), s);
  ops::fill_zero(cp.dkv[0], rows * 2 * Ckv * sizeof(float), s);
  local_kv(cp, cp.kv[0], qkv, B, s);
  for (int step = 0; step < cp.size(); step++) {
    const int cur = step % 2, next = (step + 1) % 2;
    const bool more = step + 1 < cp.size();
    if (more) exchange(cp, pass_on(cp, cp.kv[cur], cp.kv[next], kv_count), cp.dt, s);
    const CpStep& st = cp.plan.ranks[cp.rank()][step];
    for (const CpBlock& blk : st.blocks) {
      const int qi = local_of(cp, cp.rank(), blk.q_chunk);
      const int ki = local_of(cp, st.kv_rank, blk.kv_chunk);
      ops::attention_block_backward(
          chunk(cp.dq, qi, B, cp, C, sizeof(float)),
          chunk(cp.dkv[cur], ki, B, cp, 2 * Ckv, sizeof(float)), chunk(dout, qi, B, cp, C, e),
          chunk(out, qi, B, cp, C, e), chunk(lse, qi, B, cp, cp.NH, sizeof(float)),
          chunk(qkv, qi, B, cp, C + 2 * Ckv, e),
          chunk((const void*)cp.kv[cur], ki, B, cp, 2 * Ckv, e), B, T, cp.NH, cp.NKV, cp.HS,
          blk.mask == CpMask::Causal, cp.dt, s, chunk_docs(docs, blk.q_chunk, B, cp),
          chunk_docs(docs, blk.kv_chunk, B, cp));
    }
    if (more) ops::stream_wait_event(s, cp.arrived);
    // dK, dV of the chunks in hand, this rank's blocks added, go on (the last hop: home)
    exchange(cp, pass_on(cp, cp.dkv[cur], cp.dkv[next], kv_count), DType::F32, s);
    ops::stream_wait_event(s, cp.arrived);
  }
  // After cp hops the dK, dV of this rank's own chunks are back, in dkv[cp % 2].
  ops::copy_columns(dqkv, C + 2 * Ckv, cp.dt, cp.dq, C, DType::F32, (int)rows, C, s);
  ops::copy_columns((char*)dqkv + C * e, C + 2 * Ckv, cp.dt, cp.dkv[cp.size() % 2], 2 * Ckv,
                    DType::F32, (int)rows, 2 * Ckv, s);
}
