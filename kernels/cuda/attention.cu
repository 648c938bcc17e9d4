// kernels/cuda/attention.cu - ops::attention_forward / attention_backward on the GPU: picks a
// kernel for the shape and dtype and launches it. The kernels live in:
//   attention_flash_forward.cuh, attention_flash_backward.cuh  bf16 tensor cores, HS 64 and 128
//   attention_generic.cuh                                      any HS <= 128, fp32 or bf16, exact
// The flash kernels need bf16, HS in {64, 128} and 16-byte aligned rows; everything else (and
// every fp32 run, which must match the CPU backend to 1e-5) takes the generic kernels.
//
// Backward runs three kernels on the stream: Delta = rowsum(dO * O) into stream scratch, then the
// dQ pass and the dK/dV pass, each writing its own columns of dqkv (no atomics, deterministic).
//
// Implementation choice (StreamOptions::attention): this backend has no cuDNN SDPA path - cuDNN
// 9.19's native SDPA operation has no causal mask, and the causal composite graph it fuses is only
// practical through the cudnn_frontend headers, which are not installed - so Flash, Cudnn and Auto
// all resolve to the flash kernels and s->attention_resolved says so.
#include <cmath>
#include <cstdio>

#include "kernels/cuda/attention_flash_backward.cuh"
#include "kernels/cuda/attention_flash_forward.cuh"
#include "kernels/cuda/attention_generic.cuh"
#include "kernels/cuda/cuda_common.cuh"

namespace ops {
namespace {

using attention_tiles::bf16;

struct Shape {
  int B, T, NH, HS;
};

void check_shape(const Shape& sh) {
  CHECK(sh.B > 0 && sh.T > 0 && sh.NH > 0 && sh.HS > 0,
        "attention: bad shape B=%d T=%d NH=%d HS=%d", sh.B, sh.T, sh.NH, sh.HS);
  CHECK(sh.HS <= attention_generic::kMaxHS, "attention: head size %d > %d is not supported", sh.HS,
        attention_generic::kMaxHS);
  CHECK((long)sh.B * sh.NH <= 65535, "attention: B*NH = %ld exceeds the grid limit 65535",
        (long)sh.B * sh.NH);
}


// The flash kernels read 16-byte rows with cp.async and store bf16 pairs; row starts are multiples
// of HS elements, so aligned base pointers are enough.
bool flash_applies(const Shape& sh, DType dt, std::initializer_list<const void*> pointers) {
  if (dt != DType::BF16 || (sh.HS != 64 && sh.HS != 128)) return false;
  for (const void* p : pointers)
    if (!aligned16(p)) return false;
  return true;
}

// Kernels with more than 48 KB of dynamic shared memory must opt in, once per kernel (and device:
// one per process here). The function-local statics in the launchers below call this once.
template <typename Kernel>
bool allow_dynamic_smem(Kernel kernel, int bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  return true;
}

dim3 generic_grid(const Shape& sh) {
  return dim3((unsigned)ceil_div(sh.T, attention_generic::kRowsPerBlock), sh.B * sh.NH);
}
constexpr int kGenericThreads = 32 * attention_generic::kRowsPerBlock;

// --- forward -------------------------------------------------------------------------------------

template <int D>
void flash_forward(bf16* out, float* lse, const bf16* qkv, const Shape& sh, float scale,
                   cudaStream_t st) {
  using Cfg = attention_flash::ForwardConfig<D>;
  static const bool smem_ready =
      allow_dynamic_smem(attention_flash::flash_forward_kernel<D>, Cfg::kSmemBytes);
  (void)smem_ready;
  dim3 grid((unsigned)ceil_div(sh.T, Cfg::kBlockM), sh.B * sh.NH);
  attention_flash::flash_forward_kernel<D>
      <<<grid, Cfg::kThreads, Cfg::kSmemBytes, st>>>(out, lse, qkv, sh.T, sh.NH, scale);
  LAUNCH_CHECK();
}

void generic_forward(void* out, float* lse, const void* qkv, const Shape& sh, float scale, DType dt,
                     cudaStream_t st) {
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    attention_generic::generic_forward_kernel<T><<<generic_grid(sh), kGenericThreads, 0, st>>>(
        (T*)out, lse, (const T*)qkv, sh.T, sh.NH, sh.HS, scale);
  });
  LAUNCH_CHECK();
}

// --- backward ------------------------------------------------------------------------------------

void backward_delta(float* delta, const void* dout, const void* out, const Shape& sh, DType dt,
                    cudaStream_t st) {
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    attention_generic::backward_delta_kernel<T><<<generic_grid(sh), kGenericThreads, 0, st>>>(
        delta, (const T*)dout, (const T*)out, sh.T, sh.NH, sh.HS);
  });
  LAUNCH_CHECK();
}

template <int D>
void flash_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse,
                    const float* delta, const Shape& sh, float scale, cudaStream_t st) {
  using Cfg = attention_flash::BackwardConfig<D>;
  static const bool smem_ready =
      allow_dynamic_smem(attention_flash::flash_backward_dq_kernel<D>, Cfg::kDqSmemBytes) &&
      allow_dynamic_smem(attention_flash::flash_backward_dkdv_kernel<D>, Cfg::kDkDvSmemBytes);
  (void)smem_ready;
  dim3 dq_grid((unsigned)ceil_div(sh.T, Cfg::kQueriesPerBlock), sh.B * sh.NH);
  attention_flash::flash_backward_dq_kernel<D><<<dq_grid, Cfg::kThreads, Cfg::kDqSmemBytes, st>>>(
      dqkv, dout, qkv, lse, delta, sh.T, sh.NH, scale);
  LAUNCH_CHECK();
  dim3 dkdv_grid((unsigned)ceil_div(sh.T, Cfg::kKeysPerBlock), sh.B * sh.NH);
  attention_flash::flash_backward_dkdv_kernel<D>
      <<<dkdv_grid, Cfg::kThreads, Cfg::kDkDvSmemBytes, st>>>(dqkv, dout, qkv, lse, delta, sh.T,
                                                              sh.NH, scale);
  LAUNCH_CHECK();
}

void generic_backward(void* dqkv, const void* dout, const void* qkv, const float* lse,
                      const float* delta, const Shape& sh, float scale, DType dt, cudaStream_t st) {
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    attention_generic::generic_backward_dq_kernel<T><<<generic_grid(sh), kGenericThreads, 0, st>>>(
        (T*)dqkv, (const T*)dout, (const T*)qkv, lse, delta, sh.T, sh.NH, sh.HS, scale);
    attention_generic::generic_backward_dkdv_kernel<T>
        <<<generic_grid(sh), kGenericThreads, 0, st>>>((T*)dqkv, (const T*)dout, (const T*)qkv, lse,
                                                       delta, sh.T, sh.NH, sh.HS, scale);
  });
  LAUNCH_CHECK();
}

// What StreamOptions::attention resolves to (see the top of the file), recorded on the stream
// for attention_impl_name() at the first attention call on it.
void resolve_impl(Stream s) {
  if (s->attention_resolved != AttentionImpl::Auto) return;
  if (s->options.attention == AttentionImpl::Cudnn)
    std::fprintf(stderr,
                 "warning: attention = cudnn requested, but this build has no cuDNN SDPA "
                 "path; using the flash kernels\n");
  s->attention_resolved = AttentionImpl::Flash;
}

}  // namespace

void attention_forward(void* out, float* lse, const void* qkv, int B, int T, int NH, int HS,
                       DType dt, Stream s) {
  Shape sh{B, T, NH, HS};
  check_shape(sh);
  resolve_impl(s);
  const float scale = 1.0f / std::sqrt((float)HS);
  cudaStream_t st = s->stream;
  if (flash_applies(sh, dt, {out, qkv})) {
    if (HS == 64)
      flash_forward<64>((bf16*)out, lse, (const bf16*)qkv, sh, scale, st);
    else
      flash_forward<128>((bf16*)out, lse, (const bf16*)qkv, sh, scale, st);
  } else {
    generic_forward(out, lse, qkv, sh, scale, dt, st);
  }
}

void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                        const float* lse, int B, int T, int NH, int HS, DType dt, Stream s) {
  Shape sh{B, T, NH, HS};
  check_shape(sh);
  resolve_impl(s);
  const float scale = 1.0f / std::sqrt((float)HS);
  cudaStream_t st = s->stream;
  float* delta = (float*)stream_scratch(s, (size_t)B * NH * T * sizeof(float));
  backward_delta(delta, dout, out, sh, dt, st);
  if (flash_applies(sh, dt, {dqkv, dout, qkv})) {
    if (HS == 64)
      flash_backward<64>((bf16*)dqkv, (const bf16*)dout, (const bf16*)qkv, lse, delta, sh, scale,
                         st);
    else
      flash_backward<128>((bf16*)dqkv, (const bf16*)dout, (const bf16*)qkv, lse, delta, sh, scale,
                          st);
  } else {
    generic_backward(dqkv, dout, qkv, lse, delta, sh, scale, dt, st);
  }
}

}  // namespace ops
