// kernels/cuda/attention_generic.cuh - causal attention without tensor cores, for any head size
// up to 128, any T, fp32 or bf16 storage: the exact path (fp32 runs must match the CPU backend to
// 1e-5, so no TF32 or bf16 arithmetic) and the fallback for shapes the flash kernels do not take.
// Included by attention.cu only.
//
// Grouped-query attention: qkv rows are [q: NH heads | k: NKV heads | v: NKV heads] (QkvLayout);
// query head h reads kv head h / (NH/NKV) in place. The dK/dV kernel runs per kv head and walks
// the kv head's NH/NKV query heads in order inside the warp, so their sum needs no atomics and is
// deterministic.
//
// Parallelisation: one warp per row (a query row, or a key row for dK/dV), 4 rows per block.
// Lane l holds head dimensions l, l+32, l+64, l+96; a dot product is a per-lane partial sum and
// a butterfly warp reduction (all lanes end with the same bits). The warp walks the other side of
// the causal triangle one row at a time: forward with the online softmax (running max and sum,
// expf), backward recomputing P = exp(s - lse) from the saved log-sum-exp. All math in fp32.
// Also here: the backward preprocessing Delta = rowsum(dO * O), shared with the flash path.
//
// Packed documents (docs, (B,T) document ids, non-decreasing along a sequence; null: plain
// causal): a query sees only the earlier keys of its own document, one contiguous run, so each
// warp walks just that run - from its document's first row (a binary search) to itself, or for
// dK/dV from itself to its document's last row - and the work falls with the documents' lengths.
// The keys it walks, and their order, are the causal ones restricted to the run: with docs null
// the loops are exactly the causal loops.
#pragma once
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/document_rows.cuh"

namespace attention_generic {

constexpr int kRowsPerBlock = 4;  // warps per block, one row each
constexpr int kMaxHS = 128;
constexpr int kPerLane = kMaxHS / 32;

// x[i] = row[lane + 32 i] as fp32 (0 past HS).
template <typename T>
__device__ __forceinline__ void load_row(float (&x)[kPerLane], const T* row, int HS) {
  int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < kPerLane; i++) {
    int d = lane + 32 * i;
    x[i] = d < HS ? to_float(row[d]) : 0.f;
  }
}
template <typename T>
__device__ __forceinline__ void store_row(T* row, const float (&x)[kPerLane], float mult, int HS) {
  int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < kPerLane; i++) {
    int d = lane + 32 * i;
    if (d < HS) row[d] = from_float<T>(x[i] * mult);
  }
}
__device__ __forceinline__ float dot(const float (&x)[kPerLane], const float (&y)[kPerLane]) {
  float partial = 0.f;
#pragma unroll
  for (int i = 0; i < kPerLane; i++) partial += x[i] * y[i];
  return warp_reduce_sum(partial);
}

// Row index of this warp, and (batch, head) of the block. grid (ceil(T / 4), B * heads), heads
// being query heads (NH) or, for the dK/dV kernel, kv heads (NKV).
struct RowCoords {
  int row, b, h, bh;
};
__device__ __forceinline__ RowCoords row_coords(int heads) {
  RowCoords c;
  c.row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  c.bh = blockIdx.y;
  c.b = c.bh / heads;
  c.h = c.bh % heads;
  return c;
}

// Sequence b's ids (null stays null).
__device__ __forceinline__ const int* sequence_docs(const int* docs, int b, int seq_len) {
  return docs ? docs + (size_t)b * seq_len : nullptr;
}

// Where the heads lie in a packed qkv row (B,T,(NH+2NKV)HS) = [q heads | k heads | v heads].
struct QkvLayout {
  int NH, NKV, HS;
  __host__ __device__ size_t ld() const { return (size_t)(NH + 2 * NKV) * HS; }
  __host__ __device__ int group() const { return NH / NKV; }  // query heads per kv head
  __host__ __device__ int q(int h) const { return h * HS; }
  __host__ __device__ int k(int g) const { return (NH + g) * HS; }
  __host__ __device__ int v(int g) const { return (NH + NKV + g) * HS; }
};

// grid (ceil(T / 4), B * NH).
template <typename T>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    generic_forward_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ qkv,
                           int seq_len, QkvLayout lay, float scale, const int* __restrict__ docs) {
  RowCoords c = row_coords(lay.NH);
  if (c.row >= seq_len) return;  // whole warp: no collective follows for it
  const int first = document_first(sequence_docs(docs, c.b, seq_len), c.row);
  const int HS = lay.HS, C = lay.NH * HS, g = c.h / lay.group();
  const size_t ld = lay.ld();
  const T* rows = qkv + (size_t)c.b * seq_len * ld;
  const T* k_base = rows + lay.k(g);
  const T* v_base = rows + lay.v(g);
  float q[kPerLane], acc[kPerLane] = {};
  load_row(q, rows + c.row * ld + lay.q(c.h), HS);
  float m = -INFINITY, l = 0.f;
  for (int j = first; j <= c.row; j++) {
    float k[kPerLane], v[kPerLane];
    load_row(k, k_base + j * ld, HS);
    float s = dot(q, k) * scale;
    float m_new = fmaxf(m, s);
    float correction = expf(m - m_new);  // 0 for the first key
    float p = expf(s - m_new);
    l = l * correction + p;
    load_row(v, v_base + j * ld, HS);
#pragma unroll
    for (int i = 0; i < kPerLane; i++) acc[i] = acc[i] * correction + p * v[i];
    m = m_new;
  }
  store_row(out + ((size_t)c.b * seq_len + c.row) * C + c.h * HS, acc, 1.f / l, HS);
  if ((threadIdx.x & 31) == 0) lse[(size_t)c.bh * seq_len + c.row] = m + logf(l);
}

// delta[b, h, t] = sum_d dout[b, t, h*HS + d] * out[b, t, h*HS + d]. grid (ceil(T / 4), B * NH).
template <typename T>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    backward_delta_kernel(float* __restrict__ delta, const T* __restrict__ dout,
                          const T* __restrict__ out, int seq_len, int NH, int HS) {
  RowCoords c = row_coords(NH);
  if (c.row >= seq_len) return;
  const size_t offset = ((size_t)c.b * seq_len + c.row) * NH * HS + c.h * HS;
  float x[kPerLane], y[kPerLane];
  load_row(x, dout + offset, HS);
  load_row(y, out + offset, HS);
  float d = dot(x, y);
  if ((threadIdx.x & 31) == 0) delta[(size_t)c.bh * seq_len + c.row] = d;
}

// dQ rows: dq_i = scale * sum_{j <= i} p_ij (dout_i . v_j - delta_i) k_j. grid (ceil(T/4), B*NH).
template <typename T>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    generic_backward_dq_kernel(T* __restrict__ dqkv, const T* __restrict__ dout,
                               const T* __restrict__ qkv, const float* __restrict__ lse,
                               const float* __restrict__ delta, int seq_len, QkvLayout lay,
                               float scale, const int* __restrict__ docs) {
  RowCoords c = row_coords(lay.NH);
  const int i = c.row;
  if (i >= seq_len) return;
  const int first = document_first(sequence_docs(docs, c.b, seq_len), i);
  const int HS = lay.HS, C = lay.NH * HS, kv_head = c.h / lay.group();
  const size_t ld = lay.ld();
  const T* rows = qkv + (size_t)c.b * seq_len * ld;
  float q[kPerLane], g[kPerLane], dq[kPerLane] = {};
  load_row(q, rows + i * ld + lay.q(c.h), HS);
  load_row(g, dout + ((size_t)c.b * seq_len + i) * C + c.h * HS, HS);
  const float row_lse = lse[(size_t)c.bh * seq_len + i];
  const float row_delta = delta[(size_t)c.bh * seq_len + i];
  for (int j = first; j <= i; j++) {
    float k[kPerLane], v[kPerLane];
    load_row(k, rows + j * ld + lay.k(kv_head), HS);
    load_row(v, rows + j * ld + lay.v(kv_head), HS);
    float p = expf(dot(q, k) * scale - row_lse);
    float ds = p * (dot(g, v) - row_delta);
#pragma unroll
    for (int e = 0; e < kPerLane; e++) dq[e] += ds * k[e];
  }
  store_row(dqkv + ((size_t)c.b * seq_len + i) * ld + lay.q(c.h), dq, scale, HS);
}

// dK, dV rows of kv head g: dv_j = sum_h sum_{i >= j} p_ij dout_i;
// dk_j = scale * sum_h sum_{i >= j} ds_ij q_i, h over the kv head's query heads, in order.
// grid (ceil(T / 4), B * NKV).
template <typename T>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    generic_backward_dkdv_kernel(T* __restrict__ dqkv, const T* __restrict__ dout,
                                 const T* __restrict__ qkv, const float* __restrict__ lse,
                                 const float* __restrict__ delta, int seq_len, QkvLayout lay,
                                 float scale, const int* __restrict__ docs) {
  RowCoords c = row_coords(lay.NKV);
  const int j = c.row, kv_head = c.h;
  if (j >= seq_len) return;
  const int end = document_end(sequence_docs(docs, c.b, seq_len), j, seq_len);
  const int HS = lay.HS, C = lay.NH * HS;
  const size_t ld = lay.ld();
  const T* rows = qkv + (size_t)c.b * seq_len * ld;
  float k[kPerLane], v[kPerLane], dk[kPerLane] = {}, dv[kPerLane] = {};
  load_row(k, rows + j * ld + lay.k(kv_head), HS);
  load_row(v, rows + j * ld + lay.v(kv_head), HS);
  for (int h = kv_head * lay.group(); h < (kv_head + 1) * lay.group(); h++) {
    const T* dout_base = dout + (size_t)c.b * seq_len * C + h * HS;
    const size_t stats = ((size_t)c.b * lay.NH + h) * seq_len;  // lse, delta of query head h
    for (int i = j; i < end; i++) {
      float q[kPerLane], g[kPerLane];
      load_row(q, rows + i * ld + lay.q(h), HS);
      load_row(g, dout_base + (size_t)i * C, HS);
      float p = expf(dot(q, k) * scale - lse[stats + i]);
      float ds = p * (dot(g, v) - delta[stats + i]);
#pragma unroll
      for (int e = 0; e < kPerLane; e++) {
        dv[e] += p * g[e];
        dk[e] += ds * q[e];
      }
    }
  }
  T* row = dqkv + ((size_t)c.b * seq_len + j) * ld;
  store_row(row + lay.k(kv_head), dk, scale, HS);
  store_row(row + lay.v(kv_head), dv, 1.f, HS);
}

}  // namespace attention_generic
