// kernels/cuda/attention_flash_backward.cuh - causal flash attention backward for bf16 on tensor
// cores (FlashAttention-2 without atomics), head sizes 64 and 128, with an optional packed-document
// (block-causal) mask. Included by attention.cu only.
//
// With P = exp(scale * Q K^T - lse) recomputed from the saved lse (the (T,T) matrix is never
// stored), dP = dO V^T, Delta = rowsum(dO * O) (attention.cu computes it first) and
// dS = P * (dP - Delta):
//   dV = P^T dO,   dK = scale * dS^T Q,   dQ = scale * dS K.
// Two kernels, each owning what it writes, so nothing is accumulated across blocks and the result
// is deterministic:
//   flash_backward_dkdv_kernel: one block per (kKeysPerBlock keys, batch * kv head), each warp
//     owning 16 keys. For each of the kv head's NH/NKV query heads in turn (grouped-query
//     attention; one head when NKV = NH) it walks the query tiles from the diagonal to the end
//     (queries before the first key see none of them), so dK, dV of a kv head are summed over
//     its query heads in registers, without atomics; it double-buffers Q, dO, lse and Delta with
//     cp.async across the (head, tile) sequence, and
//     computes the transposed products directly: S^T = K Q^T, dP^T = V dO^T, so that P^T and
//     dS^T sit in registers as the A operands of dV += P^T dO and dK += dS^T Q.
//   flash_backward_dq_kernel: one block per (kQueriesPerBlock queries, batch * query head), each
//     warp owning 16 queries; walks the key tiles (of the head's kv head) up to the diagonal:
//     S = Q K^T, dP = dO V^T,
//     dQ += dS K. It recomputes S and dP (7 tile products instead of 5 in total), the price of
//     determinism.
// Packed documents (docs: (B,T) document ids, non-decreasing along a sequence; null: causal):
// P is zero where the ids of key and query differ, and both kernels walk only what their rows'
// documents can see (the rules are in attention_flash_documents.cuh). The dQ kernel starts at the
// key tile holding the first row of its first query's document; the dK/dV kernel stops after the
// query tile holding the last row of its last key's document (later queries belong to later
// documents). Inside the walk a warp skips a tile none of its rows sees and compares ids per
// element only where the tile's first key and last query lie in different documents. Without docs
// the walks and the masks are the causal kernels', bit for bit.
#pragma once
#include "kernels/cuda/attention_flash_forward.cuh"

namespace attention_flash {

template <int D>
struct BackwardConfig {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  // dK/dV kernel: keys per block (16 per warp), queries per iteration.
  static constexpr int kKeysPerBlock = 16 * kWarps;
  static constexpr int kQueriesPerStep = D == 64 ? 64 : 32;
  static constexpr bool kUnrollDkDv = D == 64;  // D = 128 would spill with the loop unrolled
  // K, V tiles; two buffers of Q and dO; two buffers of lse and Delta.
  static constexpr int kDkDvSmemBytes =
      (2 * kKeysPerBlock + 4 * kQueriesPerStep) * D * 2 + 4 * kQueriesPerStep * 4;
  // dQ kernel: queries per block (16 per warp), keys per iteration.
  static constexpr int kQueriesPerBlock = 16 * kWarps;
  static constexpr int kKeysPerStep = D == 64 ? 64 : 32;
  // Q, dO tiles; two buffers of K and V.
  static constexpr int kDqSmemBytes = (2 * kQueriesPerBlock + 4 * kKeysPerStep) * D * 2;
};

// grid (ceil(T / kKeysPerBlock), B * NKV), block kThreads, dynamic smem kDkDvSmemBytes.
// dqkv: writes the dK and dV columns; delta (B, NH, T) = rowsum(dO * O); docs: (B,T) or null.
template <int D>
__global__ void __launch_bounds__(BackwardConfig<D>::kThreads)
    flash_backward_dkdv_kernel(bf16* __restrict__ dqkv, const bf16* __restrict__ dout,
                               const bf16* __restrict__ qkv, const float* __restrict__ lse,
                               const float* __restrict__ delta, int T, int NH, int NKV,
                               float scale, const int* __restrict__ docs) {
  using Cfg = BackwardConfig<D>;
  using namespace attention_tiles;
  constexpr int kKeys = Cfg::kKeysPerBlock, kQueries = Cfg::kQueriesPerStep;
  constexpr int kThreads = Cfg::kThreads, kN = kQueries / 8, kDTiles = D / 8;
  extern __shared__ __align__(128) unsigned char attention_smem[];
  bf16* sK = reinterpret_cast<bf16*>(attention_smem);
  bf16* sV = sK + kKeys * D;
  bf16* sQ = sV + kKeys * D;                                       // two buffers of kQueries * D
  bf16* sdO = sQ + 2 * kQueries * D;                               // two buffers of kQueries * D
  float* sLse = reinterpret_cast<float*>(sdO + 2 * kQueries * D);  // two buffers of kQueries
  float* sDelta = sLse + 2 * kQueries;                             // two buffers of kQueries

  const int b = blockIdx.y / NKV, kv_head = blockIdx.y % NKV, group = NH / NKV;
  const int C = NH * D;
  const size_t ld = (size_t)(NH + 2 * NKV) * D;
  const bf16* rows = qkv + (size_t)b * T * ld;
  const int key0 = blockIdx.x * kKeys;
  const int m_first = key0 / kQueries;  // earlier query tiles see none of these keys
  const SequenceDocs seq = sequence_docs(docs, b, T);
  // Later query tiles see none either: past T, or (documents) past the last key's document.
  const int m_end = ((seq.ids ? seq.end_row(min(key0 + kKeys, T) - 1) : T) + kQueries - 1) /
                    kQueries;
  const int h_end = (kv_head + 1) * group;  // query heads kv_head * group .. h_end - 1

  load_tile_async<kKeys, D, kThreads>(sK, rows + (NH + kv_head) * D, ld, key0, T);
  load_tile_async<kKeys, D, kThreads>(sV, rows + (NH + NKV + kv_head) * D, ld, key0, T);
  // The steps walk (query head h, query tile m) head-major: m from m_first to m_end - 1 for
  // each h; the next step's tile is loaded while this one computes.
  auto load_query_tile = [&](int h, int m, int buf) {
    const size_t bh = (size_t)b * NH + h;
    load_tile_async<kQueries, D, kThreads>(sQ + buf * kQueries * D, rows + h * D, ld,
                                           m * kQueries, T);
    load_tile_async<kQueries, D, kThreads>(sdO + buf * kQueries * D,
                                           dout + (size_t)b * T * C + h * D, C, m * kQueries, T);
    load_rows_async<kQueries>(sLse + buf * kQueries, lse + bh * T, m * kQueries, T);
    load_rows_async<kQueries>(sDelta + buf * kQueries, delta + bh * T, m * kQueries, T);
  };
  load_query_tile(kv_head * group, m_first, 0);
  cp_async_commit();

  const int warp = threadIdx.x >> 5;
  const int warp_key0 = key0 + 16 * warp;  // first key of this warp
  const float scale_log2 = scale * kLog2e;
  float dk[1][kDTiles][4] = {}, dv[1][kDTiles][4] = {};
  int key_doc[2] = {};  // the document ids of the keys this thread holds (with docs)
  if (seq.ids)
#pragma unroll
    for (int r = 0; r < 2; r++) key_doc[r] = seq.at(warp_key0 + frag_row(2 * r));

  int buf = 0;
  for (int h = kv_head * group, m = m_first; h < h_end; buf ^= 1) {  // h, m advance at the end
    const bool head_done = m + 1 == m_end;
    const int next_h = head_done ? h + 1 : h, next_m = head_done ? m_first : m + 1;
    if (next_h < h_end) {
      load_query_tile(next_h, next_m, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int q0 = m * kQueries;
    // Causal: otherwise no query of the tile sees these keys. Documents: some query sees a key.
    const bool computes = seq.ids ? seq.sees(q0, q0 + kQueries - 1, warp_key0, warp_key0 + 15)
                                  : warp_key0 <= q0 + kQueries - 1;
    if (computes) {
      count_tile(kDkDvTiles);
      const bool mixed = seq.ids && !seq.one_document(q0 + kQueries - 1, warp_key0);
      const bf16* tQ = sQ + buf * kQueries * D;
      const bf16* tdO = sdO + buf * kQueries * D;
      const float* tLse = sLse + buf * kQueries;
      const float* tDelta = sDelta + buf * kQueries;
      // P^T = exp(scale * K Q^T - lse), zero where the key is in the query's future, the query
      // is past the end, or (mixed) the two lie in different documents.
      float p[1][kN][4] = {};
      gemm_abt<D, 1, kN, Cfg::kUnrollDkDv>(p, sK, 16 * warp, tQ, 0);
#pragma unroll
      for (int nt = 0; nt < kN; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          int key = warp_key0 + frag_row(e), qi = frag_col(nt, e), query = q0 + qi;
          bool visible = key <= query && query < T;
          if (mixed) visible = visible && seq.at(query) == key_doc[e >> 1];
          p[0][nt][e] = visible ? exp2f(fmaf(p[0][nt][e], scale_log2, -tLse[qi] * kLog2e)) : 0.f;
        }
      // dP^T = V dO^T, then dS^T = P^T * (dP^T - Delta).
      float ds[1][kN][4] = {};
      gemm_abt<D, 1, kN, Cfg::kUnrollDkDv>(ds, sV, 16 * warp, tdO, 0);
#pragma unroll
      for (int nt = 0; nt < kN; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
          ds[0][nt][e] = p[0][nt][e] * (ds[0][nt][e] - tDelta[frag_col(nt, e)]);
      gemm_pv<D, 1, kN>(dv, p, tdO, 0);  // dV += P^T dO
      gemm_pv<D, 1, kN>(dk, ds, tQ, 0);  // dK += dS^T Q
    }
    __syncthreads();
    h = next_h;
    m = next_m;
  }

  // Epilogue: rows key < T of dK (times scale) and dV.
  bf16* dk_dst = dqkv + (size_t)b * T * ld + (NH + kv_head) * D;
  bf16* dv_dst = dk_dst + NKV * D;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int key = warp_key0 + frag_row(2 * r);
    if (key >= T) continue;
#pragma unroll
    for (int dt = 0; dt < kDTiles; dt++) {
      const int col = frag_col(dt, 2 * r);
      *reinterpret_cast<__nv_bfloat162*>(dk_dst + (size_t)key * ld + col) =
          __floats2bfloat162_rn(dk[0][dt][2 * r] * scale, dk[0][dt][2 * r + 1] * scale);
      *reinterpret_cast<__nv_bfloat162*>(dv_dst + (size_t)key * ld + col) =
          __floats2bfloat162_rn(dv[0][dt][2 * r], dv[0][dt][2 * r + 1]);
    }
  }
}

// grid (ceil(T / kQueriesPerBlock), B * NH), block kThreads, dynamic smem kDqSmemBytes.
// dqkv: writes the dQ columns. docs: (B,T) or null.
template <int D>
__global__ void __launch_bounds__(BackwardConfig<D>::kThreads)
    flash_backward_dq_kernel(bf16* __restrict__ dqkv, const bf16* __restrict__ dout,
                             const bf16* __restrict__ qkv, const float* __restrict__ lse,
                             const float* __restrict__ delta, int T, int NH, int NKV,
                             float scale, const int* __restrict__ docs) {
  using Cfg = BackwardConfig<D>;
  using namespace attention_tiles;
  constexpr int kQueries = Cfg::kQueriesPerBlock, kKeys = Cfg::kKeysPerStep;
  constexpr int kThreads = Cfg::kThreads, kN = kKeys / 8, kDTiles = D / 8;
  extern __shared__ __align__(128) unsigned char attention_smem[];
  bf16* sQ = reinterpret_cast<bf16*>(attention_smem);
  bf16* sdO = sQ + kQueries * D;
  bf16* sK = sdO + kQueries * D;  // two buffers of kKeys * D
  bf16* sV = sK + 2 * kKeys * D;  // two buffers of kKeys * D

  const int m_block = gridDim.x - 1 - blockIdx.x;  // heaviest first
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH, kv_head = h / (NH / NKV);
  const int C = NH * D;
  const size_t ld = (size_t)(NH + 2 * NKV) * D;
  const bf16* q_src = qkv + (size_t)b * T * ld + h * D;
  const bf16* k_src = qkv + (size_t)b * T * ld + (NH + kv_head) * D;
  const bf16* v_src = k_src + NKV * D;
  const int q0 = m_block * kQueries;
  const int n_tiles = min((T + kKeys - 1) / kKeys, (q0 + kQueries + kKeys - 1) / kKeys);
  const SequenceDocs seq = sequence_docs(docs, b, T);
  const int n_first = seq.ids ? seq.first_row(q0) / kKeys : 0;  // earlier tiles: masked

  load_tile_async<kQueries, D, kThreads>(sQ, q_src, ld, q0, T);
  load_tile_async<kQueries, D, kThreads>(sdO, dout + (size_t)b * T * C + h * D, C, q0, T);
  load_tile_async<kKeys, D, kThreads>(sK, k_src, ld, n_first * kKeys, T);
  load_tile_async<kKeys, D, kThreads>(sV, v_src, ld, n_first * kKeys, T);
  cp_async_commit();

  const int warp = threadIdx.x >> 5;
  const int warp_row0 = q0 + 16 * warp;
  int row_doc[2] = {};  // the document ids of the rows this thread holds (with docs)
  if (seq.ids)
#pragma unroll
    for (int r = 0; r < 2; r++) row_doc[r] = seq.at(warp_row0 + frag_row(2 * r));
  const float scale_log2 = scale * kLog2e;
  // lse (in log2 units) and Delta of the two rows this thread holds; 0 past the end.
  float row_lse2[2], row_delta[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    int row = warp_row0 + frag_row(2 * r);
    row_lse2[r] = row < T ? lse[(size_t)bh * T + row] * kLog2e : 0.f;
    row_delta[r] = row < T ? delta[(size_t)bh * T + row] : 0.f;
  }
  float dq[1][kDTiles][4] = {};

  for (int n = n_first; n < n_tiles; n++) {
    const int buf = (n - n_first) & 1;
    if (n + 1 < n_tiles) {
      load_tile_async<kKeys, D, kThreads>(sK + (buf ^ 1) * kKeys * D, k_src, ld, (n + 1) * kKeys,
                                          T);
      load_tile_async<kKeys, D, kThreads>(sV + (buf ^ 1) * kKeys * D, v_src, ld, (n + 1) * kKeys,
                                          T);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int n0 = n * kKeys;
    const bool computes = seq.ids ? seq.sees(warp_row0, warp_row0 + 15, n0, n0 + kKeys - 1)
                                  : n0 <= warp_row0 + 15;
    if (computes) {
      count_tile(kDqTiles);
      const bool mixed = seq.ids && !seq.one_document(warp_row0 + 15, n0);
      const bf16* tK = sK + buf * kKeys * D;
      const bf16* tV = sV + buf * kKeys * D;
      float p[1][kN][4] = {};
      gemm_abt<D, 1, kN>(p, sQ, 16 * warp, tK, 0);
#pragma unroll
      for (int nt = 0; nt < kN; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          int key = n0 + frag_col(nt, e), row = warp_row0 + frag_row(e);
          bool visible = key <= row && row < T;
          if (mixed) visible = visible && seq.at(key) == row_doc[e >> 1];
          p[0][nt][e] = visible ? exp2f(fmaf(p[0][nt][e], scale_log2, -row_lse2[e >> 1])) : 0.f;
        }
      float ds[1][kN][4] = {};
      gemm_abt<D, 1, kN>(ds, sdO, 16 * warp, tV, 0);  // dP = dO V^T
#pragma unroll
      for (int nt = 0; nt < kN; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) ds[0][nt][e] = p[0][nt][e] * (ds[0][nt][e] - row_delta[e >> 1]);
      gemm_pv<D, 1, kN>(dq, ds, tK, 0);  // dQ += dS K
    }
    __syncthreads();
  }

  bf16* dq_dst = dqkv + (size_t)b * T * ld + h * D;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int row = warp_row0 + frag_row(2 * r);
    if (row >= T) continue;
#pragma unroll
    for (int dt = 0; dt < kDTiles; dt++)
      *reinterpret_cast<__nv_bfloat162*>(dq_dst + (size_t)row * ld + frag_col(dt, 2 * r)) =
          __floats2bfloat162_rn(dq[0][dt][2 * r] * scale, dq[0][dt][2 * r + 1] * scale);
  }
}

}  // namespace attention_flash
