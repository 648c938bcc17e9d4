// parallel/context_parallel_a2a.cu - context parallelism by heads: the all-to-all of DeepSpeed
// Ulysses ([parallel] cp_comm = "all-to-all"), and the hybrid of an all-to-all inside groups of
// cp_a2a ranks with the ring across them (cp_comm = "hybrid", Megatron's a2a+p2p).
//
// The idea. Attention is independent per head: head h's output needs head h's queries, keys and
// values of every position, and nothing of any other head. Under context parallelism each of the
// cp ranks holds T/cp positions of every sequence with all heads. Instead of passing keys and
// values around (the ring, parallel/context_parallel.cu), one all-to-all re-cuts the same
// numbers the other way: rank j sends every peer i the columns of peer i's heads for its own
// positions and receives, from every peer, the columns of its own heads for the peer's
// positions. Afterwards rank j holds n_head/cp heads over the whole sequence, runs the ordinary
// causal attention on them (the one-rank kernel, unchanged), and a second all-to-all moves the
// output back: [T/cp positions, all heads] -> [T positions, n_head/cp heads] -> back.
//
//   qkv on rank j: (B, T/cp, [q heads | k heads | v heads])        send block i: heads of rank i
//        |  all-to-all over the cp ranks: block i of rank j goes to rank i
//        v
//   (B, T, [q | k | v] of rank j's heads)  ->  attention_forward (causal, whole sequence)
//        |  out (B, T, n_head/cp heads): block i (rank i's positions) back to rank i
//        v
//   out on rank j: (B, T/cp, all heads)                            -> the projection GEMM
//
// True token order. The zigzag layout (rank r holds chunks r and 2cp-1-r of 2cp chunks,
// chunk-major) stays as it is: the received block of peer i holds chunks i and 2cp-1-i, and each
// is copied to its place in the whole sequence (B rows of T/(2cp) positions, strided), so the
// attention sees positions 0..T-1 in order and its causal mask, RoPE (applied before, at each
// token's global position) and the document ids (the full rows, reordered the same way) are
// those of one rank. The output goes back through the same places. The log-sum-exp stays in the
// head-split layout: only this rank's backward reads it, and it has the caller's size
// (B x n_head/cp x T = B x n_head x T/cp floats).
//
// Grouped-query attention. Query head h uses kv head h / (n_head/n_kv_head). With n_kv_head
// divisible by the group (a ranks), rank j gets kv heads [j n_kv/a, (j+1) n_kv/a): exactly the
// ones its n_head/a query heads use. With fewer kv heads than ranks (a divisible by n_kv_head)
// rank j's query heads all use one kv head, j n_kv/a (rounded down), and it receives a copy of
// it: a/n_kv ranks hold the same kv head. In the backward each sends its partial dK, dV of that
// head home and the holder sums them in fp32 in peer order before rounding once. Other
// combinations are refused when the config is read (config/layout_rules.cu).
//
// The backward. dqkv needs the head-split qkv, out, dout and lse. Nothing head-split is kept
// between the passes except lse (pipelined micro-batches and recompute would need one copy per
// micro-batch and layer): the backward moves qkv, out and dout to the heads again, runs
// attention_backward on the whole sequence and moves dqkv back. A copied kv head's gradient
// comes back from each of its holders and is summed (above).
//
// Hybrid (cp_comm = "hybrid", cp = a x R). The cp ranks form R groups of a = cp_a2a consecutive
// ranks (mesh axis cp-a2a); group g holds zigzag chunks ga..ga+a-1 (= ring chunk g of 2R) and
// their mirrors (= ring chunk 2R-1-g). The all-to-all inside the group turns them into the two
// ring chunks with n_head/a heads, in order, which is exactly the ring's zigzag layout at
// degree R: the ring (parallel/context_parallel.cu, unchanged) then runs over the R ranks at the
// same place of every group (axis cp-ring), passing K, V of n_kv/a heads (or the one copied kv
// head), and the output goes back through the same all-to-all. "all-to-all" is a = cp, R = 1
// (the ring of one is the plain kernel); "ring" is a = 1.
//
// Who talks to whom. The all-to-all: every rank of a group with every other (a-1 peers); under
// hybrid the ring: rank g of the ring with g-1 and g+1. Bytes per layer and micro-batch that each
// rank hands the all-to-all (its send buffer; the comm accounting counts the same), with
// N = B T/cp of its tokens, C = n_head/tp HS its query channels, K = the kv channels it sends =
// n_kv/tp HS when the kv heads divide by a, else a HS (each peer one copied head), b bytes per
// element (the dtype: 2 in bf16):
//   forward:  qkv  N (C + 2K) b            out  N C b
//   backward: qkv  N (C + 2K) b, out N C b, dout N C b, dqkv N (C + 2K) b
//   per layer: 3 N (C + 2K) b + 3 N C b; (a-1)/a of it leaves the rank (its own block stays).
// Against the ring's 2 T K_ring B b (cp-1)/cp forward and as much again backward plus the fp32
// dK, dV (parallel/context_parallel.cu), with K_ring = n_kv/tp HS: the ring grows with cp - 1
// transfers, the all-to-all's wire bytes shrink as (a-1)/a N with N = BT/cp; with few kv heads
// (Llama-3: 8 for 32 query heads) the ring moves little and the all-to-all wins only at large
// cp (docs/SCALING.md has the planner's numbers). Under hybrid add the ring at degree R with K/a
// kv channels (or one copied head) on cp-ring: parallel/context_parallel_plan.h's cp_bytes.
//
// Memory (held for the run, from the model's allocator, so the planner counts it): the
// all-to-all's send and receive buffers and the head-split qkv, N (C + 2K) elements each (a
// blocks of N (C + 2K)/a); the head-split out and dout, N C each; the document ids of the full
// rows (B T ints); with copied kv heads the fp32 sums of their gradients, N 2 n_kv/tp HS floats,
// and one part.
//
// Timeline of one layer on one rank (forward; the backward is the same with three all-to-alls
// in and one out around attention_backward). The all-to-alls run on the compute stream: the
// attention needs all of its input before it starts, and the projection all of its output.
//
//   compute | pack qkv |            | unpack | attention, whole sequence |     | unpack out | proj
//   a2a     |          |--qkv a2a-->|        |                           |pack |--out a2a-->|
//   (hybrid: the attention is the ring over cp-ring, its K, V transfers overlapping its blocks)
#include <climits>
#include <vector>

#include "kernels/common.h"
#include "parallel/context_parallel.h"

namespace {

// A column range of a token's row.
struct Columns {
  int first, width;
};

// Where the B rows of a zigzag chunk land in the head-split layout: sequence b's positions start
// at token first + b * stride.
struct Place {
  size_t first, stride;
};

int group_size(const ContextParallel& cp) { return cp.a2a->size; }

// The cp rank of member i of this rank's all-to-all group (groups are consecutive cp ranks).
int cp_rank_of(const ContextParallel& cp, int i) { return cp.rank() * group_size(cp) + i; }

// The place of zigzag chunk g (of the 2cp chunks of heads.Tc positions) in the head-split layout:
// the whole sequence (B, T) when the ring is one rank; else this ring rank's two ring chunks,
// chunk-major (2, B, a Tc), with g's sub-chunk at its offset in its ring chunk.
Place place_of(const ContextParallel& cp, int g, int B) {
  const int a = group_size(cp);
  const size_t Tc = cp.heads.Tc;
  if (!cp.active()) return {(size_t)g * Tc, 2 * a * Tc};
  int first, second;
  cp_local_chunks(cp.size(), cp.rank(), &first, &second);
  const int local = g / a == first ? 0 : 1;
  return {(size_t)local * B * a * Tc + (size_t)(g % a) * Tc, a * Tc};
}

// The same for the document ids, which the ring wants as the full rows of every ring chunk
// ((2R, B, a Tc), by global ring chunk), or (B, T) with a ring of one.
Place docs_place_of(const ContextParallel& cp, int g, int B) {
  const int a = group_size(cp);
  const size_t Tc = cp.heads.Tc;
  if (!cp.active()) return {(size_t)g * Tc, 2 * a * Tc};
  return {(size_t)(g / a) * B * a * Tc + (size_t)(g % a) * Tc, a * Tc};
}

int as_int(size_t n) {
  CHECK(n <= (size_t)INT_MAX, "context parallel all-to-all: a copy of %zu elements per row", n);
  return (int)n;
}

// The kv head rank i's query heads start at (kv_copied: the one they all use).
int first_kv_head(const ContextParallel& cp, int i) {
  return cp.heads.kv_copied ? i * cp.heads.NKV / group_size(cp) : i * cp.NKV;
}

// Rank i's columns of the packed qkv [q | k | v] (this tp rank's heads).
std::vector<Columns> qkv_columns(const ContextParallel& cp, int i) {
  const int HS = cp.HS, kv = first_kv_head(cp, i);
  return {{i * cp.NH * HS, cp.NH * HS},
          {(cp.heads.NH + kv) * HS, cp.NKV * HS},
          {(cp.heads.NH + cp.heads.NKV + kv) * HS, cp.NKV * HS}};
}

// Rank i's columns of an attention output or its gradient (query heads only).
std::vector<Columns> out_columns(const ContextParallel& cp, int i) {
  return {{i * cp.NH * cp.HS, cp.NH * cp.HS}};
}

// Token layout (2B Tc rows of src_width, this rank's positions, all heads) -> head-split layout
// (the whole sequence or the ring chunks, `width` columns of this rank's heads), over the group.
// The exchange buffer (block i: peer i's two chunks, each B rows of Tc positions) to and from the
// whole sequence in token order (place_of): into_heads copies buffer -> heads (after the
// all-to-all), else heads -> buffer (packing peer i's positions into send block i).
void move_chunks(ContextParallel& cp, char* heads, char* buffer, int width, int B, bool into_heads,
                 ops::Stream s) {
  const int a = group_size(cp);
  const size_t e = dtype_size(cp.dt), Tc = cp.heads.Tc, rows = 2 * (size_t)B * Tc;
  for (int i = 0; i < a; i++) {
    int chunks[2];
    cp_local_chunks(cp.size() * a, cp_rank_of(cp, i), &chunks[0], &chunks[1]);
    for (int k = 0; k < 2; k++) {
      const Place p = place_of(cp, chunks[k], B);
      char* in_heads = heads + p.first * width * e;
      char* in_buffer = buffer + (i * rows + k * B * Tc) * width * e;
      const int heads_ld = as_int(p.stride * width), buffer_ld = as_int(Tc * width);
      if (into_heads)
        ops::copy_columns(in_heads, heads_ld, cp.dt, in_buffer, buffer_ld, cp.dt, B, buffer_ld, s);
      else
        ops::copy_columns(in_buffer, buffer_ld, cp.dt, in_heads, heads_ld, cp.dt, B, buffer_ld, s);
    }
  }
}

void to_heads(ContextParallel& cp, void* heads, const void* tokens, int src_width,
              std::vector<Columns> (*columns)(const ContextParallel&, int), int width, int B,
              ops::Stream s) {
  const int a = group_size(cp);
  const size_t e = dtype_size(cp.dt), Tc = cp.heads.Tc, rows = 2 * (size_t)B * Tc;
  char* send = (char*)cp.heads.send;
  for (int i = 0; i < a; i++) {  // block i: peer i's heads of every local token
    int at = 0;
    for (const Columns& col : columns(cp, i)) {
      ops::copy_columns(send + (i * rows * width + at) * e, width, cp.dt,
                        (const char*)tokens + col.first * e, src_width, cp.dt, as_int(rows),
                        col.width, s);
      at += col.width;
    }
  }
  all_to_all(*cp.a2a, cp.heads.send, cp.heads.recv, rows * width, cp.dt, s);
  move_chunks(cp, (char*)heads, (char*)cp.heads.recv, width, B, true, s);
}

// Head-split layout (`width` columns) -> token layout (dst_width columns): every peer's block of
// this rank's positions, its columns copied to their place. A copied kv head (kv_copied; only
// dqkv has kv columns) comes from several peers: their parts are summed in fp32, in peer order.
void to_tokens(ContextParallel& cp, void* tokens, int dst_width, const void* heads,
               std::vector<Columns> (*columns)(const ContextParallel&, int), int width, int B,
               ops::Stream s) {
  const int a = group_size(cp);
  const size_t e = dtype_size(cp.dt), rows = 2 * (size_t)B * cp.heads.Tc;
  move_chunks(cp, (char*)heads, (char*)cp.heads.send, width, B, false, s);
  all_to_all(*cp.a2a, cp.heads.send, cp.heads.recv, rows * width, cp.dt, s);
  const bool summed = cp.heads.kv_copied && columns == qkv_columns;
  const size_t kv_rows = rows * 2 * cp.HS;  // one kv head's [k | v] of every local token
  if (summed) ops::fill_zero(cp.heads.dkv_sum, cp.heads.NKV * kv_rows * sizeof(float), s);
  for (int i = 0; i < a; i++) {
    const char* block = (const char*)cp.heads.recv + i * rows * width * e;
    const std::vector<Columns> cols = columns(cp, i);
    ops::copy_columns((char*)tokens + cols[0].first * e, dst_width, cp.dt, block, width, cp.dt,
                      as_int(rows), cols[0].width, s);
    int at = cols[0].width;
    for (size_t c = 1; c < cols.size() && !summed; c++) {
      ops::copy_columns((char*)tokens + cols[c].first * e, dst_width, cp.dt, block + at * e,
                        width, cp.dt, as_int(rows), cols[c].width, s);
      at += cols[c].width;
    }
    if (!summed) continue;
    ops::copy_columns(cp.heads.dkv_part, 2 * cp.HS, DType::F32, block + at * e, width, cp.dt,
                      as_int(rows), 2 * cp.HS, s);
    ops::add_inplace(cp.heads.dkv_sum + first_kv_head(cp, i) * kv_rows, cp.heads.dkv_part,
                     kv_rows, s);
  }
  for (int g = 0; summed && g < cp.heads.NKV; g++)
    for (int part = 0; part < 2; part++)  // dK of kv head g, then dV
      ops::copy_columns((char*)tokens + (cp.heads.NH + part * cp.heads.NKV + g) * cp.HS * e,
                        dst_width, cp.dt, cp.heads.dkv_sum + g * kv_rows + part * cp.HS,
                        2 * cp.HS, DType::F32, as_int(rows), cp.HS, s);
}

// The document ids of the full rows ((2cp, B, Tc), chunk-major) in the order the head-split
// attention reads them (null: none).
const int* ring_docs(ContextParallel& cp, const int* docs, int B, ops::Stream s) {
  if (!docs) return nullptr;
  const int chunks = 2 * cp.size() * group_size(cp);
  const size_t Tc = cp.heads.Tc;
  for (int g = 0; g < chunks; g++) {
    const Place p = docs_place_of(cp, g, B);
    for (int b = 0; b < B; b++)
      ops::copy_on_device(cp.heads.docs + p.first + b * p.stride,
                          docs + ((size_t)g * B + b) * Tc, Tc * sizeof(int), s);
  }
  return cp.heads.docs;
}

void check_shape(const ContextParallel& cp, int B, int T_local) {
  CHECK(B <= cp.B && T_local == 2 * cp.heads.Tc,
        "context parallel all-to-all: micro-batch %d x %d positions, but the buffers hold %d x %d",
        B, T_local, cp.B, 2 * cp.heads.Tc);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The state: the ring's heads and chunk become the head-split ones, and the buffers
// ---------------------------------------------------------------------------------------------
void cp_a2a_setup(ContextParallel& cp, Comm* a2a, int B, int T, int NH, int NKV, int HS,
                  DType dt, Allocator& memory) {
  const int a = a2a->size;
  CHECK(NH % a == 0 && (NKV % a == 0 || a % NKV == 0),
        "context parallel all-to-all over %d ranks: %d query heads and %d kv heads do not split",
        a, NH, NKV);
  cp.a2a = a2a;
  cp.heads.NH = NH, cp.heads.NKV = NKV, cp.heads.Tc = T / (2 * cp.size() * a);
  cp.heads.kv_copied = NKV % a != 0;
  cp.NH = NH / a, cp.NKV = cp.heads.kv_copied ? 1 : NKV / a;
  const size_t e = dtype_size(dt), rows = 2 * (size_t)B * cp.heads.Tc;  // this rank's tokens
  const size_t width = (size_t)(cp.NH + 2 * cp.NKV) * HS, C = (size_t)NH * HS;
  cp.heads.send = allocate(memory, a * rows * width * e);  // a blocks (the largest: qkv's)
  cp.heads.recv = allocate(memory, a * rows * width * e);  // (also the head-split dqkv)
  cp.heads.qkv = allocate(memory, a * rows * width * e);
  cp.heads.out = allocate(memory, rows * C * e);
  cp.heads.dout = allocate(memory, rows * C * e);
  if (cp.heads.kv_copied) {
    cp.heads.dkv_sum = (float*)allocate(memory, NKV * rows * 2 * HS * sizeof(float));
    cp.heads.dkv_part = (float*)allocate(memory, rows * 2 * HS * sizeof(float));
  }
  cp.heads.docs = (int*)allocate(memory, (size_t)B * T * sizeof(int));  // the full rows
}

// ---------------------------------------------------------------------------------------------
// Forward and backward
// ---------------------------------------------------------------------------------------------
void cp_a2a_attention_forward(ContextParallel& cp, void* out, float* lse, const void* qkv, int B,
                              int T_local, ops::Stream s, const int* docs) {
  check_shape(cp, B, T_local);
  const int a = group_size(cp), HS = cp.HS;
  const int qkv_width = (cp.heads.NH + 2 * cp.heads.NKV) * HS;
  const int width = (cp.NH + 2 * cp.NKV) * HS;
  to_heads(cp, cp.heads.qkv, qkv, qkv_width, qkv_columns, width, B, s);
  cp_ring_attention_forward(cp, cp.heads.out, lse, cp.heads.qkv, B, a * T_local, s,
                            ring_docs(cp, docs, B, s));
  to_tokens(cp, out, cp.heads.NH * HS, cp.heads.out, out_columns, cp.NH * HS, B, s);
}

void cp_a2a_attention_backward(ContextParallel& cp, void* dqkv, const void* dout,
                               const void* qkv, const void* out, const float* lse, int B,
                               int T_local, ops::Stream s, const int* docs) {
  check_shape(cp, B, T_local);
  const int a = group_size(cp), HS = cp.HS, C = cp.heads.NH * HS, Cl = cp.NH * HS;
  const int qkv_width = (cp.heads.NH + 2 * cp.heads.NKV) * HS;
  const int width = (cp.NH + 2 * cp.NKV) * HS;
  to_heads(cp, cp.heads.qkv, qkv, qkv_width, qkv_columns, width, B, s);
  to_heads(cp, cp.heads.out, out, C, out_columns, Cl, B, s);
  to_heads(cp, cp.heads.dout, dout, C, out_columns, Cl, B, s);
  // The head-split dqkv is written into recv: to_tokens packs it into send before the
  // all-to-all overwrites recv.
  void* dqkv_heads = cp.heads.recv;
  cp_ring_attention_backward(cp, dqkv_heads, cp.heads.dout, cp.heads.qkv, cp.heads.out, lse, B,
                             a * T_local, s, ring_docs(cp, docs, B, s));
  to_tokens(cp, dqkv, qkv_width, dqkv_heads, qkv_columns, width, B, s);
}
