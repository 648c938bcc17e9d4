// kernels/cuda/rope.cu - rotary position embeddings (Hugging Face's rotate_half form), forward and
// backward, in place on the q and k heads of a packed qkv (B, T, (NH + 2 NKV) HS); the contract
// is in kernels/ops_decls.h.
//
// For each token (b, t) at position p = positions[b * row_stride + t] (or t), each of its NH q heads and NKV k
// heads (contiguous at the row's start; v follows and is never touched) and each j < HS/2:
//   x[j] = x1 c - x2 s,  x[j + HS/2] = x2 c + x1 s,   x1 = x[j], x2 = x[j + HS/2]
// with c, s from the host-made fp32 tables (maxT, HS/2) at row p. The backward is the same
// rotation with -s (its transpose), so one kernel serves both.
//
// Parallelisation: a grid-stride loop over (token, head, group of W columns j): a thread loads W
// elements of the head's first half and the W matching ones of its second half, W cos and W sin,
// and writes both halves back; every element is read and written by one thread only, so the
// update in place needs no synchronisation. Vector path: W is one 16-byte pack of the storage
// type (4 fp32, 8 bf16; the tables are read as 16-byte float packs too) when HS/2 is a multiple
// of it and the pointers are 16-byte aligned; otherwise W = 1.
#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"

namespace ops {
namespace {

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 65536;

template <typename T, int W>
__global__ void rope_kernel(T* qkv, const float* __restrict__ cos_table,
                            const float* __restrict__ sin_table, const int* __restrict__ positions,
                            int row_stride, int T_, int heads, int row_size, int half, float sign,
                            size_t total) {
  const int groups = half / W;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += stride) {
    const int j = (int)(i % groups) * W;
    const size_t head = i / groups;  // over (token, head)
    const size_t token = head / heads;
    const int t = (int)(token % T_);
    const size_t p =
        positions ? (size_t)positions[(token / T_) * row_stride + t] : (size_t)t;
    T* x = qkv + token * row_size + (head % heads) * (size_t)(2 * half) + j;
    float x1[W], x2[W], c[W], s[W];
    load_floats<W>(x1, x);
    load_floats<W>(x2, x + half);
    load_floats<W>(c, cos_table + p * half + j);
    load_floats<W>(s, sin_table + p * half + j);
#pragma unroll
    for (int k = 0; k < W; k++) {
      const float sk = sign * s[k];
      const float a = x1[k] * c[k] - x2[k] * sk;
      const float b = x2[k] * c[k] + x1[k] * sk;
      x1[k] = a;
      x2[k] = b;
    }
    store_floats<W>(x, x1);
    store_floats<W>(x + half, x2);
  }
}

void rope(void* qkv, const float* cos_table, const float* sin_table, const int* positions,
          int row_stride, int B, int T, int NH, int NKV, int HS, DType dt, float sign, Stream s) {
  CHECK(HS % 2 == 0, "rope: head size %d is odd", HS);
  const int half = HS / 2, heads = NH + NKV, row_size = (NH + 2 * NKV) * HS;
  if ((size_t)B * T * heads * half == 0) return;
  dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    constexpr int P = Pack128<S>::size;
    const bool vec = half % P == 0 && aligned16({qkv, cos_table, sin_table});
    const int W = vec ? P : 1;
    const size_t total = (size_t)B * T * heads * (half / W);
    const int blocks = (int)std::min(ceil_div(total, kThreads), kMaxBlocks);
    auto launch = [&](auto kernel) {
      kernel<<<blocks, kThreads, 0, s->stream>>>(static_cast<S*>(qkv), cos_table, sin_table,
                                                  positions, row_stride, T, heads, row_size,
                                                  half, sign, total);
    };
    if (vec) launch(rope_kernel<S, P>);
    else launch(rope_kernel<S, 1>);
    LAUNCH_CHECK();
  });
}

}  // namespace

void rope_forward(void* qkv, const float* cos_table, const float* sin_table, const int* positions,
                  int B, int T, int NH, int NKV, int HS, DType dt, Stream s,
                  int positions_row_stride) {
  OP_SPAN(rope_forward);
  if (is_dry(s)) return;
  rope(qkv, cos_table, sin_table, positions, positions_row_stride, B, T, NH, NKV, HS, dt, 1.0f, s);
}

void rope_backward(void* dqkv, const float* cos_table, const float* sin_table,
                   const int* positions, int B, int T, int NH, int NKV, int HS, DType dt,
                   Stream s, int positions_row_stride) {
  OP_SPAN(rope_backward);
  if (is_dry(s)) return;
  rope(dqkv, cos_table, sin_table, positions, positions_row_stride, B, T, NH, NKV, HS, dt, -1.0f, s);
}

}  // namespace ops
