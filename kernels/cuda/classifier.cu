// kernels/cuda/classifier.cu - softmax cross-entropy over the vocabulary, fused with its backward,
// one row of logits (N, Vp) at a time and in place; and the same split over vocabulary shards
// (per-shard statistics, their merge, the gradient from the merged statistics).
//
// One block per row. Pass 1 reads the first V columns once and keeps an online softmax per
// thread: a running maximum m and the sum s of exp(x - m), rescaled whenever the maximum grows
// (once per 16-byte pack at most). The block merges the (m, s) pairs, giving the log-sum-exp
// lse = m + log(s) and the loss lse - logit[target]. Pass 2 (only when dloss != 0) reads the row
// again - usually from L2, a row is at most a few hundred KiB - and overwrites it with
// (exp(x - lse) - onehot) * dloss, and with 0 in the padded columns [V, Vp). Probabilities are
// never stored. A row whose target is < 0 gets loss 0 and, when dloss != 0, a zero gradient.
//
// Targets must be < V (a target in the padding would read a padded logit).
//
// The vocabulary-parallel form (tensor parallelism) splits the same computation in three, over a
// shard of columns [col0, col0 + Vs) of which the first `valid` = clamp(V - col0, 0, Vs) are real:
//   classifier_shard_stats     one block per row, the same online softmax over the valid columns
//                              as pass 1 above: {max m, sum of exp(x - m), target logit or 0}. A
//                              shard with no valid column gives {-inf, 0, 0} (the merge of two
//                              empty states keeps m = -inf, s = 0, no NaN).
//   classifier_merge_stats     one thread per row, the parts in shard order: M = max of the
//                              maxima, sum = sum of s_r exp(m_r - M) over the parts with s_r > 0
//                              (so an empty shard's -inf never meets exp), in double (a handful
//                              of terms, and the CPU oracle's formula), target logit = sum of the
//                              parts'. Same order on every rank, so identical losses everywhere.
//   classifier_shard_backward  one block per row, like pass 2 above with the merged stats:
//                              (exp(x - M) / sum - onehot) * dloss on valid columns, 0 on padding
//                              and on rows whose target is < 0.
//
// The (m, s) merge is written with explicitly rounded operations so that it is commutative (no
// FMA contraction): every lane of a butterfly reduction then holds the same bits.
#include <cmath>

#include "kernels/cuda/cuda_common.cuh"

namespace ops {
namespace {

constexpr int kThreads = 512;



// (m, s) <- the softmax state of the union of (m, s) and (m2, s2).
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;  // both empty
  s = __fadd_rn(__fmul_rn(s, expf(m - mx)), __fmul_rn(s2, expf(m2 - mx)));
  m = mx;
}

// Adds W values to a thread's online softmax state.
template <int W>
__device__ __forceinline__ void online_add(float& m, float& s, const float (&f)[W]) {
  float pack_max = f[0];
#pragma unroll
  for (int k = 1; k < W; k++) pack_max = fmaxf(pack_max, f[k]);
  if (pack_max > m) {
    s *= expf(m - pack_max);  // m = -inf, s = 0 on the first pack: 0 * 0
    m = pack_max;
  }
#pragma unroll
  for (int k = 0; k < W; k++) s += expf(f[k] - m);
}

// Every thread ends with the block's (m, s). Called once per block (the shared arrays are not
// reused afterwards).
__device__ void block_merge(float& m, float& s) {
  __shared__ float warp_m[32], warp_s[32];
  for (int o = 16; o > 0; o >>= 1)
    merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    warp_m[warp] = m;
    warp_s[warp] = s;
  }
  __syncthreads();
  const int warps = blockDim.x / 32;
  m = lane < warps ? warp_m[lane] : -INFINITY;
  s = lane < warps ? warp_s[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1)
    merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
}

// The block's softmax state (max m, sum s of exp(x - m)) over x[0, n), in every thread.
template <typename T, int W>
__device__ void row_softmax_state(const T* x, int n, float& m, float& s) {
  m = -INFINITY;
  s = 0.0f;
  const int vec_end = n / W * W;
  for (int c = threadIdx.x * W; c < vec_end; c += blockDim.x * W) {
    float f[W];
    load_floats<W>(f, x + c);
    online_add<W>(m, s, f);
  }
  for (int c = vec_end + threadIdx.x; c < n; c += blockDim.x) {
    float f[1] = {to_float(x[c])};
    online_add<1>(m, s, f);
  }
  block_merge(m, s);
}

// x[0, width) becomes the softmax gradient in place: (exp(x - shift) * scale - [c == target])
// * dloss for c < valid, 0 for the padding columns after them.
template <typename T, int W>
__device__ void write_softmax_gradient(T* x, int width, int valid, float shift, float scale,
                                       int target, float dloss) {
  for (int c = threadIdx.x * W; c < width; c += blockDim.x * W) {
    float f[W];
    load_floats<W>(f, x + c);
#pragma unroll
    for (int k = 0; k < W; k++) {
      const int col = c + k;
      const float p = expf(f[k] - shift) * scale;
      f[k] = col < valid ? (p - (col == target ? 1.0f : 0.0f)) * dloss : 0.0f;
    }
    store_floats<W>(x + c, f);
  }
}

template <typename T, int W>
__device__ void write_zeros(T* x, int width) {
  float zeros[W] = {};
  for (int c = threadIdx.x * W; c < width; c += blockDim.x * W) store_floats<W>(x + c, zeros);
}

// W = 16-byte pack (requires Vp % W == 0 and an aligned row start) or 1.
template <typename T, int W>
__global__ void __launch_bounds__(kThreads)
    classifier_kernel(T* logits, float* __restrict__ losses, const int* __restrict__ targets,
                      float dloss, int V, int Vp) {
  const int row = blockIdx.x;
  T* x = logits + (size_t)row * Vp;
  const int target = targets[row];
  if (target < 0) {  // ignored position
    if (threadIdx.x == 0) losses[row] = 0.0f;
    if (dloss != 0.0f) write_zeros<T, W>(x, Vp);
    return;
  }
  const float target_logit = to_float(x[target]);  // read before the barrier in block_merge

  float m, s;
  row_softmax_state<T, W>(x, V, m, s);
  const float lse = m + logf(s);
  if (threadIdx.x == 0) losses[row] = lse - target_logit;
  if (dloss == 0.0f) return;
  write_softmax_gradient<T, W>(x, Vp, V, lse, 1.0f, target, dloss);
}

// The number of columns of the shard [col0, col0 + Vs) below V.
int shard_valid_columns(int Vs, int col0, int V) {
  const int valid = V - col0;
  return valid < 0 ? 0 : valid > Vs ? Vs : valid;
}

// Per row of a shard (N, Vs): stats = {max over the first `valid` columns, sum of exp(x - max),
// the target's logit if its column col0 + t lies among them else 0}. W as in classifier_kernel
// (requires Vs % W == 0 and an aligned row start).
template <typename T, int W>
__global__ void __launch_bounds__(kThreads)
    shard_stats_kernel(float* __restrict__ stats, const T* __restrict__ logits,
                       const int* __restrict__ targets, int Vs, int col0, int valid) {
  const int row = blockIdx.x;
  const T* x = logits + (size_t)row * Vs;
  float m, s;
  row_softmax_state<T, W>(x, valid, m, s);
  if (threadIdx.x != 0) return;
  const int t = targets[row] - col0;  // the target's column within this shard
  float* st = stats + 3 * (size_t)row;
  st[0] = m;
  st[1] = s;
  st[2] = t >= 0 && t < valid ? to_float(x[t]) : 0.0f;
}

// One thread per row; parts_stats is (parts, N, 3), merged in part order.
__global__ void merge_stats_kernel(float* __restrict__ stats, float* __restrict__ losses,
                                   const float* __restrict__ parts_stats,
                                   const int* __restrict__ targets, int parts, int N) {
  for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < N; n += gridDim.x * blockDim.x) {
    float max = -INFINITY, target_logit = 0.0f;
    for (int r = 0; r < parts; r++) max = fmaxf(max, parts_stats[((size_t)r * N + n) * 3]);
    double sum = 0.0;
    for (int r = 0; r < parts; r++) {
      const float* p = parts_stats + ((size_t)r * N + n) * 3;
      if (p[1] > 0.0f) sum += (double)p[1] * exp((double)p[0] - (double)max);
      target_logit += p[2];
    }
    float* st = stats + 3 * (size_t)n;
    st[0] = max;
    st[1] = (float)sum;
    st[2] = target_logit;
    losses[n] = targets[n] < 0 ? 0.0f : max + (float)log(sum) - target_logit;
  }
}

// The shard's logits (N, Vs) become (exp(x - M) / sum - onehot) * dloss on the valid columns and
// 0 elsewhere, from the merged stats {M, sum, .}. W as in shard_stats_kernel.
template <typename T, int W>
__global__ void __launch_bounds__(kThreads)
    shard_backward_kernel(T* logits, const float* __restrict__ stats,
                          const int* __restrict__ targets, float dloss, int Vs, int col0,
                          int valid) {
  const int row = blockIdx.x;
  T* x = logits + (size_t)row * Vs;
  const int target = targets[row];
  if (target < 0) {  // ignored position: zero gradient
    write_zeros<T, W>(x, Vs);
    return;
  }
  const float max = stats[3 * (size_t)row];
  const float inv_sum = 1.0f / stats[3 * (size_t)row + 1];
  // the target's column within this shard (outside [0, valid) when another shard owns it)
  write_softmax_gradient<T, W>(x, Vs, valid, max, inv_sum, target - col0, dloss);
}

}  // namespace

void classifier_shard_stats(float* stats, const void* logits, const int* targets, int N, int Vs,
                            int col0, int V, DType dt, Stream s) {
  OP_SPAN(classifier_shard_stats);
  if (is_dry(s)) return;
  if (N == 0) return;
  CHECK(V > 0 && Vs >= 0 && col0 >= 0, "classifier shard: V=%d Vs=%d col0=%d", V, Vs, col0);
  const int valid = shard_valid_columns(Vs, col0, V);
  dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    constexpr int P = Pack128<S>::size;
    auto* x = static_cast<const S*>(logits);
    if (Vs % P == 0 && aligned16(logits))
      shard_stats_kernel<S, P><<<N, kThreads, 0, s->stream>>>(stats, x, targets, Vs, col0, valid);
    else
      shard_stats_kernel<S, 1><<<N, kThreads, 0, s->stream>>>(stats, x, targets, Vs, col0, valid);
    LAUNCH_CHECK();
  });
}

void classifier_merge_stats(float* stats, float* losses, const float* parts_stats,
                            const int* targets, int parts, int N, Stream s) {
  OP_SPAN(classifier_merge_stats);
  if (is_dry(s)) return;
  if (N == 0) return;
  CHECK(parts > 0, "classifier merge: %d parts", parts);
  constexpr int threads = 256;
  const int blocks = (int)ceil_div((size_t)N, (size_t)threads);
  merge_stats_kernel<<<blocks, threads, 0, s->stream>>>(stats, losses, parts_stats, targets,
                                                        parts, N);
  LAUNCH_CHECK();
}

void classifier_shard_backward(void* logits, const float* stats, const int* targets, float dloss,
                               int N, int Vs, int col0, int V, DType dt, Stream s) {
  OP_SPAN(classifier_shard_backward);
  if (is_dry(s)) return;
  if (N == 0 || Vs == 0) return;
  CHECK(V > 0 && Vs > 0 && col0 >= 0, "classifier shard: V=%d Vs=%d col0=%d", V, Vs, col0);
  const int valid = shard_valid_columns(Vs, col0, V);
  dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    constexpr int P = Pack128<S>::size;
    auto* x = static_cast<S*>(logits);
    if (Vs % P == 0 && aligned16(logits))
      shard_backward_kernel<S, P><<<N, kThreads, 0, s->stream>>>(x, stats, targets, dloss, Vs,
                                                                 col0, valid);
    else
      shard_backward_kernel<S, 1><<<N, kThreads, 0, s->stream>>>(x, stats, targets, dloss, Vs,
                                                                 col0, valid);
    LAUNCH_CHECK();
  });
}

void classifier_forward_backward(void* logits, float* losses, const int* targets, float dloss,
                                 int N, int V, int Vp, DType dt, Stream s) {
  OP_SPAN(classifier_forward_backward);
  if (is_dry(s)) return;
  if (N == 0) return;
  CHECK(V > 0 && V <= Vp, "classifier: need 0 < V <= Vp, got V=%d Vp=%d", V, Vp);
  dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    constexpr int P = Pack128<S>::size;
    auto* x = static_cast<S*>(logits);
    if (Vp % P == 0 && aligned16(logits))
      classifier_kernel<S, P><<<N, kThreads, 0, s->stream>>>(x, losses, targets, dloss, V, Vp);
    else
      classifier_kernel<S, 1><<<N, kThreads, 0, s->stream>>>(x, losses, targets, dloss, V, Vp);
    LAUNCH_CHECK();
  });
}

}  // namespace ops
