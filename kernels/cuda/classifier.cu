// kernels/cuda/classifier.cu - softmax cross-entropy over the vocabulary, fused with its backward,
// one row of logits (N, Vp) at a time and in place.
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
    if (dloss != 0.0f) {
      float zeros[W] = {};
      for (int c = threadIdx.x * W; c < Vp; c += blockDim.x * W) store_floats<W>(x + c, zeros);
    }
    return;
  }
  const float target_logit = to_float(x[target]);  // read before the barrier in block_merge

  float m = -INFINITY, s = 0.0f;
  const int vec_end = V / W * W;
  for (int c = threadIdx.x * W; c < vec_end; c += blockDim.x * W) {
    float f[W];
    load_floats<W>(f, x + c);
    online_add<W>(m, s, f);
  }
  for (int c = vec_end + threadIdx.x; c < V; c += blockDim.x) {
    float f[1] = {to_float(x[c])};
    online_add<1>(m, s, f);
  }
  block_merge(m, s);
  const float lse = m + logf(s);
  if (threadIdx.x == 0) losses[row] = lse - target_logit;
  if (dloss == 0.0f) return;

  for (int c = threadIdx.x * W; c < Vp; c += blockDim.x * W) {
    float f[W];
    load_floats<W>(f, x + c);
#pragma unroll
    for (int k = 0; k < W; k++) {
      const int col = c + k;
      const float p = expf(f[k] - lse);
      f[k] = col < V ? (p - (col == target ? 1.0f : 0.0f)) * dloss : 0.0f;
    }
    store_floats<W>(x + c, f);
  }
}

}  // namespace

void classifier_forward_backward(void* logits, float* losses, const int* targets, float dloss,
                                 int N, int V, int Vp, DType dt, Stream s) {
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
