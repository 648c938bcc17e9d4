// kernels/cuda/grad_compression.cu - the kernels of the compressed gradient reductions
// (parallel/grad_compression.cu): int8 block quantisation with its error, the dequantised sum of
// several ranks' records, and top-k selection with its scatter-add. The contract, and the
// roundings both backends share bit for bit, are in kernels/ops_decls.h.
//
// int8: one thread block of kQuantBlock = 256 threads per quantisation block, one value per
// thread: the block's absmax by a warp-shuffle tree (max is exact in any order), then each thread
// its code and error. Every division, product and difference is an explicitly rounded intrinsic
// (__fdiv_rn, __fmul_rn, __fsub_rn): nvcc would otherwise contract x - q*scale into an FMA and
// could approximate the divisions. The sums over records run grid-stride, one value per thread,
// the records in order.
//
// top-k: the threshold, then an ordered compaction.
//   1. Radix select of the k-th largest magnitude key (the float's bits without the sign, an
//      unsigned integer ordered like |x|): four passes over the key's bytes, most significant
//      first; each histograms the byte of the keys that match the prefix found so far (shared
//      histogram per block, then global atomics), and one thread walks the 256 bins from the
//      top to the bin holding the k-th key, narrowing the prefix and the rank left. After the
//      fourth pass the prefix is the threshold key T and the rank left is how many keys equal to
//      T are selected (need).
//   2. Compaction in index order over tiles of kTopkTile values (256 threads x 16 consecutive
//      values): each tile counts its keys above T and equal to T; one thread turns the counts
//      into exclusive offsets; each tile then scans its threads' counts in shared memory, and a
//      value goes to record position (keys above T before it) + min(keys equal to T before it,
//      need) when it is above T, or equal to T with fewer than `need` equal keys before it. So
//      the record lists indices in increasing order and ties go to the lower index: exactly the
//      CPU backend's loop.
// The scatter-add runs one launch per record, in record order; indices within a record are
// distinct, so no two threads of a launch touch one value.
// These kernels have NEVER RUN ON A GPU (written and compiled without one; the CPU backend's are
// tested bitwise against numpy by test/test_grad_compression.py, and test/gpu/
// test_grad_compression.cu compares the two).
#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"

namespace ops {
namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = (int)(kTopkTile / kThreads);  // 16 consecutive values per thread
static_assert(kQuantBlock == kThreads, "one thread per value of a quantisation block");

// ---------------------------------------------------------------------------------------------
// int8
// ---------------------------------------------------------------------------------------------
__device__ float block_max_broadcast(float x) {
  __shared__ float warp_max[32];
  x = warp_reduce_max(x);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_max[warp] = x;
  __syncthreads();
  x = lane < (int)(blockDim.x / 32) ? warp_max[lane] : 0.0f;
  return warp_reduce_max(x);  // every warp reduces the same partials: all threads hold the max
}

// x and err may be one buffer: each thread reads its value before the barrier and writes only it.
__global__ void int8_quantize_kernel(uint8_t* packed, float* err, const float* x, size_t chunk_n,
                                     size_t blocks_per_chunk, size_t record_bytes,
                                     bool accumulate) {
  const size_t c = blockIdx.x / blocks_per_chunk, b = blockIdx.x % blocks_per_chunk;
  const size_t first = b * kQuantBlock;
  const size_t len = min((size_t)kQuantBlock, chunk_n - first), at = c * chunk_n + first;
  const size_t i = threadIdx.x;
  const float v = i < len ? x[at + i] : 0.0f;
  const float scale = __fdiv_rn(block_max_broadcast(fabsf(v)), 127.0f);
  uint8_t* record = packed + c * record_bytes;
  if (i == 0) reinterpret_cast<float*>(record + ((chunk_n + 3) / 4) * 4)[b] = scale;
  if (b == 0 && i < ((chunk_n + 3) / 4) * 4 - chunk_n)  // the padding after the codes: zero
    reinterpret_cast<int8_t*>(record)[chunk_n + i] = 0;
  if (i >= len) return;
  float code = scale > 0.0f ? rintf(__fdiv_rn(v, scale)) : 0.0f;
  code = fminf(127.0f, fmaxf(-127.0f, code));
  const float e = __fsub_rn(v, __fmul_rn(code, scale));
  reinterpret_cast<int8_t*>(record)[first + i] = (int8_t)code;
  err[at + i] = accumulate ? __fadd_rn(err[at + i], e) : e;
}

__device__ __forceinline__ float dequantized(const uint8_t* record, size_t chunk_n, size_t i) {
  const float scale = reinterpret_cast<const float*>(record + ((chunk_n + 3) / 4) * 4)[i / kQuantBlock];
  return __fmul_rn((float)reinterpret_cast<const int8_t*>(record)[i], scale);
}

__global__ void int8_dequantize_sum_kernel(float* out, const uint8_t* packed, size_t chunk_n,
                                           int records, size_t record_bytes) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < chunk_n; i += stride) {
    float acc = 0.0f;
    for (int r = 0; r < records; r++)
      acc = __fadd_rn(acc, dequantized(packed + r * record_bytes, chunk_n, i));
    out[i] = acc;
  }
}

__global__ void int8_dequantize_kernel(float* out, size_t total, const uint8_t* packed,
                                       size_t chunk_n, size_t record_bytes) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < total; j += stride)
    out[j] = dequantized(packed + (j / chunk_n) * record_bytes, chunk_n, j % chunk_n);
}

int grid_for(size_t n) { return (int)std::max<size_t>(1, std::min<size_t>(ceil_div(n, kThreads), 65536)); }

// ---------------------------------------------------------------------------------------------
// top-k: the scratch is uint32 words [0, 256) histogram, then prefix, mask, need, and per tile
// the counts above and equal and their offsets.
// ---------------------------------------------------------------------------------------------
struct TopkScratch {
  uint32_t *hist, *prefix, *mask, *need, *above, *equal, *above_off, *equal_off;
};
TopkScratch topk_scratch(void* scratch, size_t tiles) {
  uint32_t* w = static_cast<uint32_t*>(scratch);
  return {w, w + 256, w + 257, w + 258, w + 264, w + 264 + tiles, w + 264 + 2 * tiles,
          w + 264 + 3 * tiles};
}

__device__ __forceinline__ uint32_t magnitude_key(float x) { return __float_as_uint(x) & 0x7fffffffu; }

__global__ void topk_init_kernel(TopkScratch t, uint32_t k) {
  for (int i = threadIdx.x; i < 256; i += blockDim.x) t.hist[i] = 0;
  if (threadIdx.x == 0) *t.prefix = 0, *t.mask = 0, *t.need = k;
}

__global__ void topk_histogram_kernel(TopkScratch t, const float* x, size_t n, int shift) {
  __shared__ uint32_t hist[256];
  hist[threadIdx.x] = 0;
  __syncthreads();
  const uint32_t prefix = *t.prefix, mask = *t.mask;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint32_t key = magnitude_key(x[i]);
    if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
  }
  __syncthreads();
  if (hist[threadIdx.x]) atomicAdd(&t.hist[threadIdx.x], hist[threadIdx.x]);
}

// One thread: the bin that holds the need-th largest key among those matching the prefix.
__global__ void topk_pick_kernel(TopkScratch t, int shift) {
  uint32_t need = *t.need, bin = 0;
  for (int b = 255; b >= 0; b--) {
    if (t.hist[b] >= need) { bin = (uint32_t)b; break; }
    need -= t.hist[b];
  }
  for (int b = 0; b < 256; b++) t.hist[b] = 0;
  *t.need = need;
  *t.prefix |= bin << shift;
  *t.mask |= 255u << shift;
}

// The keys above and equal to the threshold among one thread's kPerThread values.
__device__ void count_mine(const float* x, size_t n, size_t begin, uint32_t threshold,
                           uint32_t* above, uint32_t* equal) {
  *above = *equal = 0;
  for (int e = 0; e < kPerThread && begin + e < n; e++) {
    const uint32_t key = magnitude_key(x[begin + e]);
    *above += key > threshold;
    *equal += key == threshold;
  }
}

__global__ void topk_count_kernel(TopkScratch t, const float* x, size_t n) {
  __shared__ uint32_t sums[2];
  if (threadIdx.x == 0) sums[0] = sums[1] = 0;
  __syncthreads();
  uint32_t above, equal;
  count_mine(x, n, blockIdx.x * kTopkTile + (size_t)threadIdx.x * kPerThread, *t.prefix, &above,
             &equal);
  atomicAdd(&sums[0], above);  // integer sums: any order gives the same counts
  atomicAdd(&sums[1], equal);
  __syncthreads();
  if (threadIdx.x == 0) t.above[blockIdx.x] = sums[0], t.equal[blockIdx.x] = sums[1];
}

__global__ void topk_offsets_kernel(TopkScratch t, size_t tiles) {
  uint32_t above = 0, equal = 0;
  for (size_t i = 0; i < tiles; i++) {
    t.above_off[i] = above, t.equal_off[i] = equal;
    above += t.above[i], equal += t.equal[i];
  }
}

// Exclusive prefix sum of one value per thread over the block (Hillis-Steele in shared memory).
__device__ uint32_t block_exclusive_scan(uint32_t v) {
  __shared__ uint32_t s[kThreads];
  s[threadIdx.x] = v;
  __syncthreads();
  for (int o = 1; o < kThreads; o <<= 1) {
    const uint32_t add = threadIdx.x >= (unsigned)o ? s[threadIdx.x - o] : 0u;
    __syncthreads();
    s[threadIdx.x] += add;
    __syncthreads();
  }
  const uint32_t inclusive = s[threadIdx.x];
  __syncthreads();  // s is reused by the next call
  return inclusive - v;
}

__global__ void topk_write_kernel(TopkScratch t, int32_t* record, float* x, size_t n, size_t k) {
  const uint32_t threshold = *t.prefix, need = *t.need;
  const size_t begin = blockIdx.x * kTopkTile + (size_t)threadIdx.x * kPerThread;
  uint32_t above, equal;
  count_mine(x, n, begin, threshold, &above, &equal);
  above = t.above_off[blockIdx.x] + block_exclusive_scan(above);
  equal = t.equal_off[blockIdx.x] + block_exclusive_scan(equal);
  float* values = reinterpret_cast<float*>(record + k);
  for (int e = 0; e < kPerThread && begin + e < n; e++) {
    const size_t i = begin + e;
    const uint32_t key = magnitude_key(x[i]);
    const bool take = key > threshold || (key == threshold && equal < need);
    if (take) {
      const size_t at = above + min(equal, need);
      record[at] = (int32_t)i;
      values[at] = x[i];
      x[i] = 0.0f;
    }
    above += key > threshold;
    equal += key == threshold;
  }
}

__global__ void topk_scatter_add_kernel(float* out, size_t first, size_t out_n,
                                        const int32_t* record, size_t k) {
  const float* values = reinterpret_cast<const float*>(record + k);
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < k; j += stride) {
    const size_t i = (size_t)record[j];
    if (i >= first && i < first + out_n) out[i - first] = __fadd_rn(out[i - first], values[j]);
  }
}

}  // namespace

void int8_quantize(void* packed, float* err, const float* x, size_t chunk_n, int chunks,
                   bool accumulate_err, Stream s) {
  OP_SPAN(int8_quantize);
  if (is_dry(s)) return;
  if (chunk_n == 0 || chunks == 0) return;
  const size_t blocks = ceil_div(chunk_n, kQuantBlock);
  CHECK(blocks * chunks < (1ull << 31), "int8_quantize: %zu blocks", blocks * chunks);
  int8_quantize_kernel<<<(unsigned)(blocks * chunks), kThreads, 0, s->stream>>>(
      static_cast<uint8_t*>(packed), err, x, chunk_n, blocks, int8_record_bytes(chunk_n),
      accumulate_err);
  LAUNCH_CHECK();
}

void int8_dequantize_sum(float* out, const void* packed, size_t chunk_n, int records, Stream s) {
  OP_SPAN(int8_dequantize_sum);
  if (is_dry(s)) return;
  if (chunk_n == 0) return;
  int8_dequantize_sum_kernel<<<grid_for(chunk_n), kThreads, 0, s->stream>>>(
      out, static_cast<const uint8_t*>(packed), chunk_n, records, int8_record_bytes(chunk_n));
  LAUNCH_CHECK();
}

void int8_dequantize(float* out, size_t n, const void* packed, size_t chunk_n, int records,
                     Stream s) {
  OP_SPAN(int8_dequantize);
  if (is_dry(s)) return;
  const size_t total = std::min(n, chunk_n * records);
  if (total == 0) return;
  int8_dequantize_kernel<<<grid_for(total), kThreads, 0, s->stream>>>(
      out, total, static_cast<const uint8_t*>(packed), chunk_n, int8_record_bytes(chunk_n));
  LAUNCH_CHECK();
}

void topk_select(int32_t* record, float* x, size_t n, size_t k, void* scratch, Stream s) {
  OP_SPAN(topk_select);
  if (is_dry(s)) return;
  CHECK(k <= n && n <= (size_t)INT32_MAX, "topk_select: k = %zu of n = %zu", k, n);
  if (k == 0) return;
  const size_t tiles = ceil_div(n, kTopkTile);
  const TopkScratch t = topk_scratch(scratch, tiles);
  cudaStream_t st = s->stream;
  topk_init_kernel<<<1, kThreads, 0, st>>>(t, (uint32_t)k);
  LAUNCH_CHECK();
  for (int shift = 24; shift >= 0; shift -= 8) {
    topk_histogram_kernel<<<grid_for(n), kThreads, 0, st>>>(t, x, n, shift);
    LAUNCH_CHECK();
    topk_pick_kernel<<<1, 1, 0, st>>>(t, shift);
    LAUNCH_CHECK();
  }
  topk_count_kernel<<<(unsigned)tiles, kThreads, 0, st>>>(t, x, n);
  LAUNCH_CHECK();
  topk_offsets_kernel<<<1, 1, 0, st>>>(t, tiles);
  LAUNCH_CHECK();
  topk_write_kernel<<<(unsigned)tiles, kThreads, 0, st>>>(t, record, x, n, k);
  LAUNCH_CHECK();
}

void topk_scatter_add(float* out, size_t first, size_t out_n, const int32_t* records, size_t k,
                      int records_n, Stream s) {
  OP_SPAN(topk_scatter_add);
  if (is_dry(s)) return;
  if (k == 0) return;
  for (int r = 0; r < records_n; r++) {
    topk_scatter_add_kernel<<<grid_for(k), kThreads, 0, s->stream>>>(
        out, first, out_n, records + (size_t)r * 2 * k, k);
    LAUNCH_CHECK();
  }
}

}  // namespace ops
