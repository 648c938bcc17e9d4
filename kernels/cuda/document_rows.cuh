// kernels/cuda/document_rows.cuh - where a row's packed document begins and ends, from one
// sequence's document ids ([data] document_mask, model/documents.h: ids never decrease along a
// sequence, so a binary search finds a document's edges). Shared by the generic and ring-block
// attention kernels (attention_generic.cuh) and the flash kernels' tile skipping
// (attention_flash_documents.cuh).
#pragma once

// The first row of row t's document in one sequence's ids (0 without ids).
__device__ __forceinline__ int document_first(const int* docs, int t) {
  if (!docs) return 0;
  const int doc = docs[t];
  int lo = 0, hi = t;  // the answer is in [lo, hi]
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (docs[mid] < doc) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}
// One past the last row of row t's document (seq_len without ids).
__device__ __forceinline__ int document_end(const int* docs, int t, int seq_len) {
  if (!docs) return seq_len;
  const int doc = docs[t];
  int lo = t + 1, hi = seq_len;  // the answer is in [lo, hi]
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (docs[mid] <= doc) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}
