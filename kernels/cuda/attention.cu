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
// Grouped-query attention (NKV kv heads for NH query heads, qkv rows [q | k | v] with NH, NKV,
// NKV heads): every kernel reads kv head h / (NH/NKV) for query head h in place; the dK/dV passes
// run one block per kv head and sum its query heads inside the block. cuDNN's graph here is built
// for NKV = NH only: with GQA "auto" takes the hand-written kernels (noted in the log), and
// [kernels] attention = "cudnn" is refused when the config is read (config/config_checks.cu).
//
// Implementation choice (StreamOptions::attention, [kernels] attention in the config): "flash"
// runs the kernels above, "cudnn" cuDNN's fused flash attention (attention_cudnn.cu) wherever it
// can run, and "auto" times both at the stream's first forward and first backward call and keeps
// the faster for each direction (they are interchangeable: both produce the same lse). The choice
// and the timings are in attention_impl_name(s), which the trainer logs.
//
// Packed documents (docs, [data] document_mask): a block-causal mask, in both hand-written
// families. The generic kernels walk each query's own document only; the flash kernels skip the
// key/value tiles no query of a warp sees and compare document ids per element only in tiles
// that straddle a document boundary (attention_flash_documents.cuh). cuDNN is not used: the graph
// here is built over whole (B, T) rows with a causal mask, and cuDNN's other masks (padding,
// sliding window) do not restrict a query to its own document inside a row; that would take every
// document as its own ragged sequence (cuDNN's THD layout, its offsets and count changing with
// every micro-batch) or a (T, T) bias, neither built here. So "auto" takes the hand-written
// kernels and notes why, and [kernels] attention = "cudnn" with [data] document_mask is refused
// when the config is read (config/config_checks.cu).
#include <cmath>
#include <cstdio>

#include <cstring>
#include <string>

#include "kernels/cuda/attention_cudnn.cuh"
#include "kernels/cuda/attention_flash_backward.cuh"
#include "kernels/cuda/attention_flash_forward.cuh"
#include "kernels/cuda/attention_generic.cuh"
#include "kernels/cuda/cuda_common.cuh"

namespace ops {
namespace {

using attention_tiles::bf16;

struct Shape {
  int B, T, NH, NKV, HS;
  const int* docs = nullptr;  // packed documents' ids (B,T), or null: causal
  attention_generic::QkvLayout layout() const { return {NH, NKV, HS}; }
};

void check_shape(const Shape& sh) {
  CHECK(sh.B > 0 && sh.T > 0 && sh.NH > 0 && sh.NKV > 0 && sh.HS > 0 && sh.NH % sh.NKV == 0,
        "attention: bad shape B=%d T=%d NH=%d NKV=%d HS=%d (the kv heads must divide the query "
        "heads)", sh.B, sh.T, sh.NH, sh.NKV, sh.HS);
  CHECK(sh.HS <= attention_generic::kMaxHS, "attention: head size %d > %d is not supported", sh.HS,
        attention_generic::kMaxHS);
  CHECK((long)sh.B * sh.NH <= 65535, "attention: B*NH = %ld exceeds the grid limit 65535",
        (long)sh.B * sh.NH);
}


// The flash kernels read 16-byte rows with cp.async and store bf16 pairs; row starts are multiples
// of HS elements, so aligned base pointers are enough. They take packed documents' ids as well.
bool flash_applies(const Shape& sh, DType dt, std::initializer_list<const void*> pointers) {
  return dt == DType::BF16 && (sh.HS == 64 || sh.HS == 128) && aligned16(pointers);
}

// Kernels with more than 48 KB of dynamic shared memory must opt in, once per kernel (and device:
// one per process here). The function-local statics in the launchers below call this once.
template <typename Kernel>
bool allow_dynamic_smem(Kernel kernel, int bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  return true;
}

// One warp per row of each of `heads` heads (query heads, or kv heads for the dK/dV pass).
dim3 generic_grid(const Shape& sh, int heads) {
  return dim3((unsigned)ceil_div(sh.T, attention_generic::kRowsPerBlock), sh.B * heads);
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
      <<<grid, Cfg::kThreads, Cfg::kSmemBytes, st>>>(out, lse, qkv, sh.T, sh.NH, sh.NKV, scale,
                                                     sh.docs);
  LAUNCH_CHECK();
}

void generic_forward(void* out, float* lse, const void* qkv, const Shape& sh, float scale, DType dt,
                     cudaStream_t st) {
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    attention_generic::generic_forward_kernel<T>
        <<<generic_grid(sh, sh.NH), kGenericThreads, 0, st>>>((T*)out, lse, (const T*)qkv, sh.T,
                                                             sh.layout(), scale, sh.docs);
  });
  LAUNCH_CHECK();
}

// --- backward ------------------------------------------------------------------------------------

void backward_delta(float* delta, const void* dout, const void* out, const Shape& sh, DType dt,
                    cudaStream_t st) {
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    attention_generic::backward_delta_kernel<T>
        <<<generic_grid(sh, sh.NH), kGenericThreads, 0, st>>>(delta, (const T*)dout,
                                                             (const T*)out, sh.T, sh.NH, sh.HS);
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
      dqkv, dout, qkv, lse, delta, sh.T, sh.NH, sh.NKV, scale, sh.docs);
  LAUNCH_CHECK();
  dim3 dkdv_grid((unsigned)ceil_div(sh.T, Cfg::kKeysPerBlock), sh.B * sh.NKV);  // per kv head
  attention_flash::flash_backward_dkdv_kernel<D>
      <<<dkdv_grid, Cfg::kThreads, Cfg::kDkDvSmemBytes, st>>>(dqkv, dout, qkv, lse, delta, sh.T,
                                                              sh.NH, sh.NKV, scale, sh.docs);
  LAUNCH_CHECK();
}

void generic_backward(void* dqkv, const void* dout, const void* qkv, const float* lse,
                      const float* delta, const Shape& sh, float scale, DType dt, cudaStream_t st) {
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    attention_generic::generic_backward_dq_kernel<T>
        <<<generic_grid(sh, sh.NH), kGenericThreads, 0, st>>>(
            (T*)dqkv, (const T*)dout, (const T*)qkv, lse, delta, sh.T, sh.layout(), scale,
            sh.docs);
    attention_generic::generic_backward_dkdv_kernel<T>
        <<<generic_grid(sh, sh.NKV), kGenericThreads, 0, st>>>(
            (T*)dqkv, (const T*)dout, (const T*)qkv, lse, delta, sh.T, sh.layout(), scale,
            sh.docs);
  });
  LAUNCH_CHECK();
}

// --- choosing between the hand-written kernels and cuDNN ---------------------------------------

// Runs fn a few times on the stream and returns its average milliseconds (after one warm-up).
template <typename Fn>
float time_ms(Stream s, Fn&& fn) {
  const int reps = 3;
  fn();
  Event start = event_create(), end = event_create();
  event_record(start, s);
  for (int i = 0; i < reps; i++) fn();
  event_record(end, s);
  float ms = event_elapsed_ms(start, end) / reps;
  event_destroy(start);
  event_destroy(end);
  return ms;
}

const char* impl_name(AttentionImpl impl) {
  return impl == AttentionImpl::Cudnn ? "cudnn" : "flash";
}

// Appends one direction's decision to the stream's note, which attention_impl_name() returns.
void note_choice(Stream s, const char* direction, AttentionImpl impl, const std::string& detail) {
  size_t used = std::strlen(s->attention_note);
  std::snprintf(s->attention_note + used, sizeof(s->attention_note) - used, "%s%s %s%s%s",
                used ? ", " : "", direction, impl_name(impl), detail.empty() ? "" : " ",
                detail.c_str());
}

// Decides, at the stream's first call in one direction, which implementation that direction
// uses from then on. `run_cudnn` runs the cuDNN path (false: cuDNN cannot run this shape, `why`
// says why) and `run_flash` the hand-written kernels, both on the caller's real buffers: the
// caller then runs the winner once more, so timing costs a few extra calls and no memory.
//   flash: the hand-written kernels, always.
//   cudnn: cuDNN where it applies; else (fp32, odd head sizes, no engine) flash, with a warning.
//   auto:  whichever of the two was faster on this first call's shape.
template <typename RunCudnn, typename RunFlash>
AttentionImpl choose(Stream s, AttentionImpl* decided, const char* direction, bool cudnn_applies,
                     const char* not_applicable, RunCudnn&& run_cudnn, RunFlash&& run_flash) {
  if (*decided != AttentionImpl::Auto) return *decided;
  const AttentionImpl wanted = s->options.attention;
  AttentionImpl impl = AttentionImpl::Flash;
  std::string detail, why = not_applicable;
  if (wanted != AttentionImpl::Flash && cudnn_applies && run_cudnn(&why)) {
    impl = AttentionImpl::Cudnn;
    if (wanted == AttentionImpl::Auto) {
      float cudnn_ms = time_ms(s, [&] { run_cudnn(nullptr); });
      float flash_ms = time_ms(s, run_flash);
      impl = cudnn_ms < flash_ms ? AttentionImpl::Cudnn : AttentionImpl::Flash;
      char line[96];
      std::snprintf(line, sizeof(line), "(auto: cudnn %.3f ms, flash %.3f ms)", cudnn_ms,
                    flash_ms);
      detail = line;
    }
  } else if (wanted == AttentionImpl::Cudnn) {
    std::fprintf(stderr, "warning: attention = cudnn requested, but cuDNN cannot run the %s here "
                         "(%s); using the hand-written kernels\n", direction, why.c_str());
    detail = "(cudnn unavailable)";
  } else if (wanted == AttentionImpl::Auto) {
    std::fprintf(stderr, "note: attention = auto: cuDNN cannot run the %s here (%s)\n", direction,
                 why.c_str());
    detail = "(auto: cudnn unavailable)";
  }
  *decided = impl;
  note_choice(s, direction, impl, detail);
  return impl;
}

void hand_written_forward(void* out, float* lse, const void* qkv, const Shape& sh, DType dt,
                          float scale, cudaStream_t st) {
  if (flash_applies(sh, dt, {out, qkv})) {
    if (sh.HS == 64)
      flash_forward<64>((bf16*)out, lse, (const bf16*)qkv, sh, scale, st);
    else
      flash_forward<128>((bf16*)out, lse, (const bf16*)qkv, sh, scale, st);
  } else {
    generic_forward(out, lse, qkv, sh, scale, dt, st);
  }
}

void hand_written_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                           const float* lse, const Shape& sh, DType dt, float scale, Stream s) {
  cudaStream_t st = s->stream;
  float* delta = (float*)stream_scratch(s, (size_t)sh.B * sh.NH * sh.T * sizeof(float));
  backward_delta(delta, dout, out, sh, dt, st);
  if (flash_applies(sh, dt, {dqkv, dout, qkv})) {
    if (sh.HS == 64)
      flash_backward<64>((bf16*)dqkv, (const bf16*)dout, (const bf16*)qkv, lse, delta, sh, scale,
                         st);
    else
      flash_backward<128>((bf16*)dqkv, (const bf16*)dout, (const bf16*)qkv, lse, delta, sh, scale,
                          st);
  } else {
    generic_backward(dqkv, dout, qkv, lse, delta, sh, scale, dt, st);
  }
}

// Why cuDNN cannot take a call (for the log), given whether its dtype, head size and pointers suit.
const char* cudnn_refusal(const Shape& sh) {
  if (sh.docs)
    return "packed documents: the cuDNN graph here has no block-causal document mask; the "
           "hand-written kernels apply it";
  return sh.NKV != sh.NH ? "grouped-query attention: the cuDNN graph is built for NKV = NH"
                         : "not bf16 with a head size that is a multiple of 8 up to 128";
}

}  // namespace

void attention_forward(void* out, float* lse, const void* qkv, int B, int T, int NH, int NKV,
                       int HS, DType dt, Stream s, const int* docs) {
  OP_SPAN(attention_forward);
  if (is_dry(s)) return;
  Shape sh{B, T, NH, NKV, HS, docs};
  check_shape(sh);
  const float scale = 1.0f / std::sqrt((float)HS);
  auto run_flash = [&] { hand_written_forward(out, lse, qkv, sh, dt, scale, s->stream); };
  auto run_cudnn = [&](std::string* why) {
    return cudnn_sdpa::forward(s, out, lse, qkv, B, T, NH, HS, why);
  };
  const bool cudnn_applies = !docs && NKV == NH && cudnn_sdpa::applies(HS, dt, {out, qkv});
  AttentionImpl impl = choose(s, &s->attention_forward_impl, "forward", cudnn_applies,
                              cudnn_refusal(sh), run_cudnn, run_flash);
  // A later shape cuDNN cannot run (or a dtype it does not take) falls back per call.
  if (impl == AttentionImpl::Cudnn && cudnn_applies && run_cudnn(nullptr)) return;
  run_flash();
}

void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                        const float* lse, int B, int T, int NH, int NKV, int HS, DType dt,
                        Stream s, const int* docs) {
  OP_SPAN(attention_backward);
  if (is_dry(s)) return;
  Shape sh{B, T, NH, NKV, HS, docs};
  check_shape(sh);
  const float scale = 1.0f / std::sqrt((float)HS);
  auto run_flash = [&] { hand_written_backward(dqkv, dout, qkv, out, lse, sh, dt, scale, s); };
  auto run_cudnn = [&](std::string* why) {
    return cudnn_sdpa::backward(s, dqkv, dout, qkv, out, lse, B, T, NH, HS, why);
  };
  const bool cudnn_applies =
      !docs && NKV == NH && cudnn_sdpa::applies(HS, dt, {dqkv, dout, qkv, out});
  AttentionImpl impl = choose(s, &s->attention_backward_impl, "backward", cudnn_applies,
                              cudnn_refusal(sh), run_cudnn, run_flash);
  if (impl == AttentionImpl::Cudnn && cudnn_applies && run_cudnn(nullptr)) return;
  run_flash();
}

}  // namespace ops
