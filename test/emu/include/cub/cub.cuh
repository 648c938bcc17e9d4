// test/emu/include/cub/cub.cuh - the cub stand-in of the emulated CUDA build: the part of CUB
// that kernels/cuda/encoder.cu uses, cub::DeviceRadixSort::SortPairs, on host memory (emulated
// device memory is host memory; the sort is queued on the stream like a kernel,
// test/emu/include/emu_streams.h). The real cub is header-only device code that needs nvcc, hence this header,
// which the emulated build finds first on its include path.
//
// Semantics kept from CUB's documentation:
// - The two-call protocol: with d_temp_storage == nullptr the call only writes the temporary
//   storage it needs into temp_storage_bytes and returns cudaSuccess; the second call sorts,
//   and fails with cudaErrorInvalidValue if given fewer bytes than the first call asked for.
//   The stand-in really works in that storage (the bit patterns of the keys and the order
//   being built), so storage that overlaps the inputs or outputs, or is too small, cannot
//   pass unnoticed: overlaps are refused with cudaErrorInvalidValue.
// - The sort is stable and orders the keys by bits [begin_bit, end_bit) of their "ordered" bit
//   pattern: for signed integers CUB flips the sign bit first, so that the unsigned patterns
//   order like the values (negatives first). Keys equal in those bits keep their input order;
//   the keys written out are the full input keys, reordered with their values.
// - 0 <= begin_bit <= end_bit <= 8 * sizeof(KeyT), else cudaErrorInvalidValue.
// Only integer keys (encoder.cu sorts int token ids): other key types fail to compile.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <type_traits>

#include "emu_streams.h"

namespace cub {
namespace emu_detail {

template <typename KeyT>
using Bits = typename std::make_unsigned<KeyT>::type;

// The key as CUB's radix passes see it: signed integers with the sign bit flipped.
template <typename KeyT>
Bits<KeyT> ordered_bits(KeyT key) {
  Bits<KeyT> bits = static_cast<Bits<KeyT>>(key);
  if (std::is_signed<KeyT>::value) bits ^= Bits<KeyT>(1) << (8 * sizeof(KeyT) - 1);
  return bits;
}

inline size_t round_up_256(size_t bytes) { return (bytes + 255) / 256 * 256; }

inline bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const char *pa = static_cast<const char*>(a), *pb = static_cast<const char*>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

inline cudaError_t refuse(const char* what) {
  std::fprintf(stderr, "cub stand-in: DeviceRadixSort::SortPairs: %s\n", what);
  return cudaErrorInvalidValue;
}

}  // namespace emu_detail

struct DeviceRadixSort {
  // The sort itself, in the temporary storage (queued on the stream by SortPairs).
  template <typename KeyT, typename ValueT>
  static bool sort_pairs(void* d_temp_storage, const KeyT* d_keys_in, KeyT* d_keys_out,
                         const ValueT* d_values_in, ValueT* d_values_out, size_t n, int begin_bit,
                         int end_bit) {
    using namespace emu_detail;
    using K = Bits<KeyT>;
    const size_t bits_bytes = round_up_256(n * sizeof(K));
    uintptr_t base = (reinterpret_cast<uintptr_t>(d_temp_storage) + 255) / 256 * 256;
    K* bits = reinterpret_cast<K*>(base);
    size_t* order = reinterpret_cast<size_t*>(base + bits_bytes);
    const int width = end_bit - begin_bit;
    const K mask = width >= (int)(8 * sizeof(K)) ? K(~K(0)) : K((K(1) << width) - 1);
    for (size_t i = 0; i < n; i++) {
      bits[i] = width == 0 ? K(0) : K((ordered_bits(d_keys_in[i]) >> begin_bit) & mask);
      order[i] = i;
    }
    std::stable_sort(order, order + n, [bits](size_t a, size_t b) { return bits[a] < bits[b]; });
    for (size_t i = 0; i < n; i++) {
      d_keys_out[i] = d_keys_in[order[i]];
      d_values_out[i] = d_values_in[order[i]];
    }
    return true;
  }

  template <typename KeyT, typename ValueT, typename NumItemsT>
  static cudaError_t SortPairs(void* d_temp_storage, size_t& temp_storage_bytes,
                               const KeyT* d_keys_in, KeyT* d_keys_out, const ValueT* d_values_in,
                               ValueT* d_values_out, NumItemsT num_items, int begin_bit = 0,
                               int end_bit = sizeof(KeyT) * 8, cudaStream_t stream = 0) {
    static_assert(std::is_integral<KeyT>::value && !std::is_same<KeyT, bool>::value,
                  "the cub stand-in sorts integer keys only (test/emu/LIBRARIES.md)");
    using namespace emu_detail;
    using K = Bits<KeyT>;
    const size_t n = num_items > 0 ? static_cast<size_t>(num_items) : 0;
    // Storage: the keys' ordered bits, then the order (indices), each 256-byte aligned after
    // aligning the base up, as CUB aliases its temporaries.
    const size_t bits_bytes = round_up_256(n * sizeof(K)), order_bytes = round_up_256(n * sizeof(size_t));
    const size_t needed = 255 + bits_bytes + order_bytes + 256;
    if (!d_temp_storage) {
      temp_storage_bytes = needed;
      return cudaSuccess;
    }
    if (temp_storage_bytes < needed) return refuse("temp_storage_bytes is smaller than asked for");
    if (begin_bit < 0 || begin_bit > end_bit || end_bit > (int)(8 * sizeof(KeyT)))
      return refuse("bit range outside 0 <= begin_bit <= end_bit <= 8 * sizeof(KeyT)");
    const size_t kb = n * sizeof(KeyT), vb = n * sizeof(ValueT);
    const void* regions[5] = {d_temp_storage, d_keys_in, d_keys_out, d_values_in, d_values_out};
    const size_t sizes[5] = {temp_storage_bytes, kb, kb, vb, vb};
    for (int i = 0; i < 5; i++)
      for (int j = i + 1; j < 5; j++)
        if (!(i == 1 && j == 3) && overlaps(regions[i], sizes[i], regions[j], sizes[j]))
          return refuse("the temporary storage, an output or an input overlaps another buffer");
    emu::submit(stream, "cub::DeviceRadixSort::SortPairs",
                [=] { return sort_pairs(d_temp_storage, d_keys_in, d_keys_out, d_values_in,
                                        d_values_out, n, begin_bit, end_bit); });
    return cudaSuccess;
  }
};

}  // namespace cub
