// kernels/cuda/attention_flash_documents.cuh - the packed-document mask of the bf16 flash
// kernels (attention_flash_forward.cuh, attention_flash_backward.cuh): which tiles a warp must
// compute, which of those need the mask per element, and (in the emulated build only) a count of
// the tiles computed. Included by the flash kernels only.
//
// The mask ([data] document_mask, model/documents.h): with one sequence's document ids (ids[t],
// non-decreasing along the sequence) key j is visible to query i iff j <= i and ids[j] == ids[i]
// (block-causal). Because the ids never decrease, the first and last id of a range of rows bound
// every id inside it, so two comparisons decide a whole tile:
//   - some query of rows [q0, q1] sees some key of rows [k0, k1] (both clipped to T) iff
//     k0 <= q1 and ids[k1] >= ids[q0]: when the keys end before q0 the two ids must then be
//     equal (key k1 is visible to query q0); otherwise the row max(k0, q0) is in both ranges and
//     sees itself. A tile failing this holds only earlier documents' keys (or future keys) for
//     every query of the warp, and is skipped;
//   - the tile needs the mask per element only if ids[k0] != ids[q1]: when they agree, every
//     causally visible pair (k0 <= key <= query <= q1) lies inside one document, and the causal
//     mask alone is exact.
// So a warp's work is the keys of its own queries' documents, rounded out to whole tiles: it
// falls with the documents' lengths.
//
// Tile census: the emulated build (test/emu, GPT5D_EMULATED_CUDA) counts, per kernel, the
// (warp, tile) steps whose products a warp computes, so that test/gpu/test_attention.cu can see
// the skipping; a GPU build counts nothing (count_tile is empty and compiles away).
#pragma once
#include "kernels/cuda/document_rows.cuh"
#ifdef GPT5D_EMULATED_CUDA
#include <atomic>
#endif

namespace attention_flash {

// One sequence's document ids, or none (ids null: plain causal attention).
struct SequenceDocs {
  const int* ids;  // (T) ids of this sequence's tokens, or null
  int T;

  // The id of row t; rows past the end read the last id (a tile's rows past T are never stored).
  __device__ __forceinline__ int at(int t) const { return ids[min(t, T - 1)]; }

  // The first row of row t's document, and one past its last (kernels/cuda/document_rows.cuh).
  __device__ int first_row(int t) const { return document_first(ids, t); }
  __device__ int end_row(int t) const { return document_end(ids, t, T); }

  // Whether some query of rows [q0, q1] sees some key of rows [k0, k1] (the rule at the top).
  __device__ __forceinline__ bool sees(int q0, int q1, int k0, int k1) const {
    if (q0 >= T || k0 >= T) return false;
    return k0 <= min(q1, T - 1) && at(k1) >= ids[q0];
  }
  // Whether the causal mask alone is exact for queries [q0, q1] against keys from k0 on.
  __device__ __forceinline__ bool one_document(int q1, int k0) const { return at(k0) == at(q1); }
};

__device__ __forceinline__ SequenceDocs sequence_docs(const int* docs, int b, int T) {
  return {docs ? docs + (size_t)b * T : nullptr, T};
}

// --- tile census (emulated build only) -------------------------------------------------------

enum TileCensus { kForwardTiles, kDqTiles, kDkDvTiles, kTileCensusKinds };

#ifdef GPT5D_EMULATED_CUDA
inline std::atomic<long long> tile_census[kTileCensusKinds];
__device__ __forceinline__ void count_tile(TileCensus kind) {
  if ((threadIdx.x & 31) == 0) tile_census[kind].fetch_add(1, std::memory_order_relaxed);
}
#else
__device__ __forceinline__ void count_tile(TileCensus) {}
#endif

}  // namespace attention_flash
