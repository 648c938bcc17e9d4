// kernels/cuda/encoder.cu - token + position embedding, forward and backward.
//
// Forward: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]. One thread per 16-byte pack of a row
// (4 floats or 8 bf16), grid-stride; rows whose width C is not a multiple of the pack (or
// pointers not 16-byte aligned) take the same kernel with a pack of one element.
//
// Vocabulary-parallel form (tensor parallelism): wte holds only the rows [first, first + rows)
// of the table. A token outside them reads zeros in the forward and is skipped by the backward
// (its run of the sorted order is simply not written); wpe / dwpe == nullptr leave the positions
// out. The defaults (first 0, rows kAllVocabRows) make every token local.
//
// With per-token positions (packed documents: positions[n] restarts at each document) the
// forward reads wpe[positions[n]] and the backward adds dout[n] to that row, by the dwte method.
// Backward, deterministic and without float atomics:
//   dwpe[t,:] += sum_b dout[b,t,:]   one thread per (t, pack of channels), summing b = 0..B-1 in
//                                    order, then one read-modify-write of dwpe.
//   dwte[v,:] += sum_{n: tokens[n]=v} dout[n,:]
//     1. sort the positions n by token (CUB radix sort: stable, so equal tokens keep increasing n;
//        keys, values and CUB's temporary storage live in the stream's scratch buffer);
//     2. each run of equal tokens in the sorted order belongs to exactly one block, so each row of
//        dwte has a single writer. The block splits its threads into `lanes` x (packs of the row):
//        lane l sums the run's rows l, l+lanes, ... in order (4 rows per step, loads issued before
//        the adds, to keep several loads in flight on long runs of frequent tokens), then lane 0
//        adds the lanes' sums in lane order and does the read-modify-write of dwte.
//   The summation order depends only on the tokens, B, T, C and the dtype, never on timing or on
//   the grid size, so two calls give bitwise equal results. The row of dwte is token - first.
#include <cub/cub.cuh>

#include "kernels/cuda/cuda_common.cuh"

namespace ops {
namespace {

constexpr int kThreads = 256;          // forward and dwpe kernels
constexpr int kWteThreads = 512;       // dwte kernel: one block per run of equal tokens
constexpr int kWteRowsPerStep = 4;     // rows a lane loads before adding them
constexpr int kWteMaxBlocks = 1024;    // blocks loop over the sorted positions

// fp32 accumulator[0..W) += f (plain loads: W consecutive floats, no alignment assumed).
template <int W>
__device__ __forceinline__ void add_to_fp32(float* acc, const float (&f)[W]) {
#pragma unroll
  for (int k = 0; k < W; k++) acc[k] += f[k];
}


int grid_for(size_t work, int threads, size_t max_blocks = 1 << 16) {
  size_t blocks = ceil_div(work, (size_t)threads);
  return (int)(blocks < 1 ? 1 : (blocks > max_blocks ? max_blocks : blocks));
}

// ---------------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------------
// The rows [first, first + rows) of the vocabulary that this wte holds.
struct VocabRange {
  int first, rows;
  int size;  // every token is below it (checked in a GPT5D_DEBUG_CHECKS build)
  __device__ __forceinline__ bool holds(int token) const {
#ifdef GPT5D_DEBUG_CHECKS
    if (token < 0 || token >= size) {
      printf("encoder: token %d is outside the vocabulary [0, %d)\n", token, size);
      __trap();
    }
#endif
    return token >= first && token - first < rows;
  }
};

template <typename T, int W>
__global__ void encoder_forward_kernel(T* __restrict__ out, const int* __restrict__ tokens,
                                       const T* __restrict__ wte, const T* __restrict__ wpe,
                                       const int* __restrict__ positions, int N, int seq_len,
                                       int C, VocabRange vocab) {
  const size_t packs_per_row = C / W;
  const size_t total = (size_t)N * packs_per_row;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t n = i / packs_per_row;
    int c = (int)(i % packs_per_row) * W;
    int t = positions ? positions[n] : (int)(n % seq_len);
    const int token = tokens[n];
    float a[W] = {};
    if (vocab.holds(token)) load_floats<W>(a, wte + (size_t)(token - vocab.first) * C + c);
    if (wpe) {
      float b[W];
      load_floats<W>(b, wpe + (size_t)t * C + c);
#pragma unroll
      for (int k = 0; k < W; k++) a[k] += b[k];
    }
    store_floats<W>(out + n * C + c, a);
  }
}

// ---------------------------------------------------------------------------------------------
// Backward: dwpe
// ---------------------------------------------------------------------------------------------
template <typename T, int W>
__global__ void encoder_backward_wpe_kernel(float* __restrict__ dwpe, const T* __restrict__ dout,
                                            int B, int seq_len, int C) {
  const int packs_per_row = C / W;
  const size_t total = (size_t)seq_len * packs_per_row;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    int t = (int)(i / packs_per_row);
    int c = (int)(i % packs_per_row) * W;
    float sum[W] = {};
    for (int b = 0; b < B; b++) {
      float d[W];
      load_floats<W>(d, dout + ((size_t)b * seq_len + t) * C + c);
      add_to_fp32<W>(sum, d);
    }
    add_to_fp32<W>(dwpe + (size_t)t * C + c, sum);
  }
}

// ---------------------------------------------------------------------------------------------
// Backward: dwte from the positions sorted by token
// ---------------------------------------------------------------------------------------------
__global__ void iota_kernel(int* out, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = i;
}

// Sums the rows of one pack of channels (c .. c+W) over the run [start, end of run) that lane
// `lane` of `lanes` owns: rows start+lane, start+lane+lanes, ... in increasing order.
template <typename T, int W>
__device__ void sum_run_rows(float (&sum)[W], const T* dout, const int* sorted_tokens,
                             const int* sorted_rows, int N, int C, int token, int start,
                             int lane, int lanes, int c) {
  for (int r = start + lane;; r += kWteRowsPerStep * lanes) {
    float d[kWteRowsPerStep][W];
    bool in_run[kWteRowsPerStep];
#pragma unroll
    for (int u = 0; u < kWteRowsPerStep; u++) {  // issue every load of the step first
      int ru = r + u * lanes;
      in_run[u] = ru < N && sorted_tokens[ru] == token;  // a run is contiguous once sorted
      if (in_run[u]) load_floats<W>(d[u], dout + (size_t)sorted_rows[ru] * C + c);
    }
#pragma unroll
    for (int u = 0; u < kWteRowsPerStep; u++)
      if (in_run[u]) add_to_fp32<W>(sum, d[u]);
    if (!in_run[kWteRowsPerStep - 1]) return;
  }
}

// One block per run of equal tokens; blocks loop over the sorted positions and skip those that
// do not start a run, and the runs of tokens outside this wte's rows. Threads: lane = tid / packs_here, pack = tid % packs_here; the channel
// loop `base` is block-uniform so that every thread reaches the __syncthreads.
template <typename T, int W>
__global__ void __launch_bounds__(kWteThreads)
    encoder_backward_wte_kernel(float* __restrict__ dwte, const T* __restrict__ dout,
                                const int* __restrict__ sorted_tokens,
                                const int* __restrict__ sorted_rows, int N, int C,
                                VocabRange vocab) {
  __shared__ float lane_sums[kWteThreads * W];
  const int packs_per_row = C / W;
  const int packs_here = packs_per_row < kWteThreads ? packs_per_row : kWteThreads;
  const int lanes = kWteThreads / packs_here;
  const int lane = threadIdx.x / packs_here;
  const bool has_lane = lane < lanes;
  for (int start = blockIdx.x; start < N; start += gridDim.x) {
    const int token = sorted_tokens[start];
    if (start > 0 && sorted_tokens[start - 1] == token) continue;  // block-uniform
    if (!vocab.holds(token)) continue;                              // block-uniform
    float* dwte_row = dwte + (size_t)(token - vocab.first) * C;
    for (int base = 0; base < packs_per_row; base += packs_here) {
      const int pack = base + threadIdx.x % packs_here;
      const bool active = has_lane && pack < packs_per_row;
      float sum[W] = {};
      if (active)
        sum_run_rows<T, W>(sum, dout, sorted_tokens, sorted_rows, N, C, token, start, lane, lanes,
                           pack * W);
      if (has_lane)
#pragma unroll
        for (int k = 0; k < W; k++) lane_sums[threadIdx.x * W + k] = sum[k];
      __syncthreads();
      if (lane == 0 && active) {
        for (int l = 1; l < lanes; l++)
#pragma unroll
          for (int k = 0; k < W; k++) sum[k] += lane_sums[(l * packs_here + threadIdx.x) * W + k];
        add_to_fp32<W>(dwte_row + pack * W, sum);
      }
      __syncthreads();  // lane_sums is reused by the next pack group or run
    }
  }
}

// The scratch layout for the sort: sorted keys, the positions before and after sorting, and
// CUB's temporary storage, each 256-byte aligned.
struct SortScratch {
  int* sorted_tokens;
  int* rows;
  int* sorted_rows;
  void* cub_temp;
  size_t cub_temp_bytes;
};
SortScratch sort_scratch(Stream s, int N) {
  SortScratch sc{};
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sc.cub_temp_bytes, (const int*)nullptr,
                                             (int*)nullptr, (const int*)nullptr, (int*)nullptr, N,
                                             0, 32, s->stream));
  const size_t ints = round_up((size_t)N * sizeof(int), 256);
  char* base = static_cast<char*>(stream_scratch(s, 3 * ints + sc.cub_temp_bytes));
  sc.sorted_tokens = reinterpret_cast<int*>(base);
  sc.rows = reinterpret_cast<int*>(base + ints);
  sc.sorted_rows = reinterpret_cast<int*>(base + 2 * ints);
  sc.cub_temp = base + 3 * ints;
  return sc;
}

// table[keys[n] - first,:] += dout[n,:] over the N rows, deterministically: the rows sorted by
// key, one block per run of equal keys (dwte by token; dwpe by position inside a document).
template <typename T, int W>
void add_rows_by_key(float* table, const T* dout, const int* keys, int N, int C,
                     VocabRange vocab, Stream s) {
  SortScratch sc = sort_scratch(s, N);
  iota_kernel<<<grid_for(N, kThreads), kThreads, 0, s->stream>>>(sc.rows, N);
  LAUNCH_CHECK();
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sc.cub_temp, sc.cub_temp_bytes, keys,
                                             sc.sorted_tokens, sc.rows, sc.sorted_rows, N, 0, 32,
                                             s->stream));
  const int blocks = N < kWteMaxBlocks ? N : kWteMaxBlocks;
  encoder_backward_wte_kernel<T, W><<<blocks, kWteThreads, 0, s->stream>>>(
      table, dout, sc.sorted_tokens, sc.sorted_rows, N, C, vocab);
  LAUNCH_CHECK();
}

template <typename T, int W>
void encoder_backward_typed(float* dwte, float* dwpe, const T* dout, const int* tokens,
                            const int* positions, int B, int seq_len, int C, VocabRange vocab,
                            Stream s) {
  const int N = B * seq_len;
  if (dwpe && positions) {  // positions inside documents: rows of dwpe hit by many tokens
    add_rows_by_key<T, W>(dwpe, dout, positions, N, C, VocabRange{0, kAllVocabRows, kAllVocabRows},
                          s);
  } else if (dwpe) {
    const size_t wpe_work = (size_t)seq_len * (C / W);
    encoder_backward_wpe_kernel<T, W><<<grid_for(wpe_work, kThreads), kThreads, 0, s->stream>>>(
        dwpe, dout, B, seq_len, C);
    LAUNCH_CHECK();
  }
  add_rows_by_key<T, W>(dwte, dout, tokens, N, C, vocab, s);
}

}  // namespace

void encoder_forward(void* out, const int* tokens, const void* wte, const void* wpe, int B, int T,
                     int C, DType dt, Stream s, int vocab_first, int vocab_rows, int vocab_size,
                     const int* positions) {
  OP_SPAN(encoder_forward);
  if (is_dry(s)) return;
  const int N = B * T;
  if (N == 0 || C == 0) return;
  const VocabRange vocab{vocab_first, vocab_rows, vocab_size};
  dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    constexpr int P = Pack128<S>::size;
    const bool vec = C % P == 0 && aligned16({out, wte, wpe});
    auto* o = static_cast<S*>(out);
    auto* e = static_cast<const S*>(wte);
    auto* p = static_cast<const S*>(wpe);
    if (vec) {
      size_t work = (size_t)N * (C / P);
      encoder_forward_kernel<S, P><<<grid_for(work, kThreads), kThreads, 0, s->stream>>>(
          o, tokens, e, p, positions, N, T, C, vocab);
    } else {
      size_t work = (size_t)N * C;
      encoder_forward_kernel<S, 1><<<grid_for(work, kThreads), kThreads, 0, s->stream>>>(
          o, tokens, e, p, positions, N, T, C, vocab);
    }
    LAUNCH_CHECK();
  });
}

void encoder_backward(float* dwte, float* dwpe, const void* dout, const int* tokens, int B, int T,
                      int C, DType dt, Stream s, int vocab_first, int vocab_rows,
                      int vocab_size, const int* positions) {
  OP_SPAN(encoder_backward);
  if (is_dry(s)) return;
  if (B * T == 0 || C == 0) return;
  const VocabRange vocab{vocab_first, vocab_rows, vocab_size};
  dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    constexpr int P = Pack128<S>::size;
    // The vector path reads 16-byte packs of dout and W consecutive floats of dwte/dwpe.
    const bool vec = C % P == 0 && aligned16(dout);
    auto* d = static_cast<const S*>(dout);
    if (vec) encoder_backward_typed<S, P>(dwte, dwpe, d, tokens, positions, B, T, C, vocab, s);
    else encoder_backward_typed<S, 1>(dwte, dwpe, d, tokens, positions, B, T, C, vocab, s);
  });
}

}  // namespace ops
