// kernels/cuda/matmul.cu - the linear layers' GEMMs (ops::matmul_forward, ops::matmul_backward)
// through cuBLASLt, with bias, GELU, residual and bias-gradient fused into the GEMM's epilogue
// where cuBLASLt allows it, and small hand-written kernels where it does not.
//
// Row-major to column-major. Our tensors are row-major; cuBLASLt's matrices are column-major.
// A row-major X (R rows, K columns) is, byte for byte, the column-major X^T (K x R, ld K). So a
// row-major product P = X.Y is computed as the column-major P^T = Y^T.X^T, and the three GEMMs
// become (m, n, k are cuBLASLt's: D is m x n, the sum runs over k):
//
//   forward  y (N,OC) = inp (N,C) . W^T        y^T = W . inp^T
//            A = W   (C x OC, ld C), op T  ->  OC x C
//            B = inp (C x N,  ld C), op N  ->   C x N       D = y   (OC x N, ld OC)   "TN"
//            m = OC, n = N, k = C.  Bias (length OC) is per row of D: CUBLASLT_EPILOGUE_BIAS.
//   dinp     dinp (N,C) = dout (N,OC) . W      dinp^T = W^T . dout^T
//            A = W    (C x OC, ld C),  op N
//            B = dout (OC x N, ld OC), op N                 D = dinp (C x N, ld C)    "NN"
//            m = C, n = N, k = OC.
//   dweight  dweight (OC,C) += dout^T . inp    dweight^T += inp^T . dout
//            A = inp  (C x N,  ld C),  op N
//            B = dout (OC x N, ld OC), op T  ->  N x OC     C = D = dweight (C x OC, ld C)  "NT"
//            m = C, n = OC, k = N, beta = 1. dbias = the sum over k of op(B), the columns of D:
//            exactly what CUBLASLT_EPILOGUE_BGRADB computes.
//
// Precision. dt == F32: fp32 everywhere, CUBLAS_COMPUTE_32F (true fp32 products, as the "fp32"
// debug mode needs), CUBLAS_COMPUTE_32F_FAST_TF32 only when the stream allows TF32.
// dt == BF16: bf16 A and B, fp32 accumulation; the forward and dinp write bf16; the dweight GEMM
// reads bf16 and has fp32 C/D with beta = 1, so it accumulates into the fp32 gradient directly.
//
// Epilogues. Forward: BIAS, GELU_AUX(_BIAS) (aux = pre_gelu), the residual as the C matrix with
// beta = 1 (C != D). dinp: DGELU (aux = gelu_input). dweight: BGRADB into a scratch vector, which
// a tiny kernel then adds to dbias (the epilogue writes, dbias must accumulate). We fuse only when
// (1) the leading dimensions involved are multiples of 8 (cuBLASLt requires it of the GELU aux ld;
// we ask it of every epilogue) and the bias/aux pointers are 16-byte aligned, (2) for GELU and
// DGELU, only in bf16: cuBLASLt's GELU is not documented to be exact to 1e-5, and the fp32 debug
// mode must match the CPU backend to 1e-5, so fp32 uses our tanhf kernel, and (3) the heuristic
// finds an algorithm. Otherwise: plain GEMM, then an in-place elementwise kernel (bias + GELU, or
// dgelu; 16-byte loads when aligned), and for dbias a deterministic column-sum kernel. Awkward
// shapes (C = 37) take these paths; GPT shapes take the fused ones. In bf16 the unfused path
// rounds the GEMM's result to bf16 before the bias/GELU (one extra rounding, no scratch memory).
//
// Algorithm choice. cublasLtMatmulAlgoGetHeuristic runs once per GEMM signature (shape, leading
// dims, types, compute type, epilogue, pointer alignments, workspace size, device) and stream;
// its answer, including "none", is kept with the signature's descriptor and matrix layouts in
// the stream's cache (StreamImpl::gemm_signatures, freed with the stream), so a call builds no
// descriptor: it finds its signature and sets the pointer attributes (bias, aux, scales). Pointer
// alignments are passed to the heuristic (cuBLASLt otherwise assumes 256 bytes, and our weights
// sit at arbitrary offsets inside one parameter buffer). Split-K is restricted to fp32 partials
// reduced in a fixed order, so results are deterministic and bf16 outputs are rounded once.
//
// FP8 (ops::gemm_fp8, its own section below). Both operands FP8 and K-contiguous, which is the
// "TN" form cuBLASLt demands of FP8 on sm_89/sm_90 ("A must be transposed and B
// non-transposed"). CUBLAS_COMPUTE_32F with scale type fp32; the per-tensor dequantisation
// scales (scale_inv, on the device, so no host sync) go in as CUBLASLT_MATMUL_DESC_A/B_SCALE_
// POINTER, which cuBLASLt applies to the product (D = scale_a scale_b (A.B) [+ beta C]). D is
// bf16 (C bf16, beta 0) or, with accumulate, fp32 with C = D and beta = 1, a combination the
// cuBLASLt FP8 type table lists (C and D CUDA_R_32F); should the heuristic still find nothing
// for it, the product goes into fp32 scratch and add_inplace adds it. CUBLASLT_MATMUL_DESC_
// FAST_ACCUM is left at its default (0, off) for every FP8 GEMM: the fast mode is documented
// only as a flag, without a bound on its error, and the backward GEMMs must not use it. M, N
// and K must be multiples of 16 (FP8 tensor-core kernels want 16-byte-aligned leading dims;
// the trainer refuses other shapes). No epilogue: bias, GELU and bias gradient stay separate
// kernels in the FP8 path (ops::bias_backward, kernels/cuda/bias_grad.cu).
//
// FLOPs per call: forward 2*N*C*OC; backward 4*N*C*OC (2*N*C*OC without dinp).
#include <algorithm>
#include <array>
#include <cstdio>
#include <initializer_list>
#include <map>
#include <memory>

#include "kernels/cuda/cuda_common.cuh"

namespace ops {
namespace {

// ---------------------------------------------------------------------------------------------
// Hand-written epilogues: GELU, dGELU, bias add (elementwise, in place)
// ---------------------------------------------------------------------------------------------

constexpr int kElemsPerThread = 8;  // one 16-byte access of bf16, two of fp32
constexpr int kElementwiseThreads = 256;

// Loads kElemsPerThread consecutive elements p[i0..] as floats. kVec: 16-byte loads (the caller
// checked alignment and n % kElemsPerThread == 0); otherwise one by one, zeros past n.
template <bool kVec, typename T>
__device__ __forceinline__ void load_floats(float (&x)[kElemsPerThread], const T* p, size_t i0,
                                            size_t n) {
  if constexpr (kVec) {
    constexpr int S = Pack128<T>::size;
#pragma unroll
    for (int k = 0; k < kElemsPerThread; k += S) {
      Pack128<T> v = load128(p + i0 + k);
#pragma unroll
      for (int j = 0; j < S; j++) x[k + j] = to_float(v[j]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kElemsPerThread; j++) x[j] = i0 + j < n ? to_float(p[i0 + j]) : 0.0f;
  }
}
template <bool kVec, typename T>
__device__ __forceinline__ void store_floats(T* p, const float (&x)[kElemsPerThread], size_t i0,
                                             size_t n) {
  if constexpr (kVec) {
    constexpr int S = Pack128<T>::size;
#pragma unroll
    for (int k = 0; k < kElemsPerThread; k += S) {
      Pack128<T> v;
#pragma unroll
      for (int j = 0; j < S; j++) v[j] = from_float<T>(x[k + j]);
      store128(p + i0 + k, v);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kElemsPerThread; j++)
      if (i0 + j < n) p[i0 + j] = from_float<T>(x[j]);
  }
}

// The forward's unfused epilogue, after the GEMM wrote y (with the residual, if any) into
// pre_gelu (GELU) or out: y += bias[column]; then pre_gelu = y, out = gelu(y), or out = y.
template <typename T, bool kVec>
__global__ void bias_gelu_inplace_kernel(T* out, T* pre_gelu, const T* bias, size_t n, int OC) {
  size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * kElemsPerThread;
  if (i0 >= n) return;
  float y[kElemsPerThread];
  load_floats<kVec>(y, pre_gelu ? pre_gelu : out, i0, n);
  if (bias) {
    int col = (int)(i0 % (size_t)OC);
#pragma unroll
    for (int j = 0; j < kElemsPerThread; j++) {
      y[j] += to_float(bias[col]);
      col = col + 1 == OC ? 0 : col + 1;
    }
  }
  if (pre_gelu) {
    store_floats<kVec>(pre_gelu, y, i0, n);
#pragma unroll
    for (int j = 0; j < kElemsPerThread; j++) y[j] = gelu(y[j]);
  }
  store_floats<kVec>(out, y, i0, n);
}

// The backward's unfused GELU: dinp *= gelu'(gelu_input).
template <typename T, bool kVec>
__global__ void dgelu_inplace_kernel(T* dinp, const T* gelu_input, size_t n) {
  size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * kElemsPerThread;
  if (i0 >= n) return;
  float g[kElemsPerThread], x[kElemsPerThread];
  load_floats<kVec>(g, dinp, i0, n);
  load_floats<kVec>(x, gelu_input, i0, n);
#pragma unroll
  for (int j = 0; j < kElemsPerThread; j++) g[j] *= gelu_grad(x[j]);
  store_floats<kVec>(dinp, g, i0, n);
}

unsigned elementwise_blocks(size_t n) {
  return (unsigned)ceil_div(n, (size_t)kElementwiseThreads * kElemsPerThread);
}

void launch_bias_gelu(void* out, void* pre_gelu, const void* bias, int N, int OC, DType dt,
                      Stream s) {
  size_t n = (size_t)N * OC;
  bool vec = n % kElemsPerThread == 0 && aligned16(out) && aligned16(pre_gelu);
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    auto kernel = vec ? bias_gelu_inplace_kernel<T, true> : bias_gelu_inplace_kernel<T, false>;
    kernel<<<elementwise_blocks(n), kElementwiseThreads, 0, s->stream>>>(
        (T*)out, (T*)pre_gelu, (const T*)bias, n, OC);
  });
  LAUNCH_CHECK();
}

void launch_dgelu(void* dinp, const void* gelu_input, size_t n, DType dt, Stream s) {
  bool vec = n % kElemsPerThread == 0 && aligned16(dinp) && aligned16(gelu_input);
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    auto kernel = vec ? dgelu_inplace_kernel<T, true> : dgelu_inplace_kernel<T, false>;
    kernel<<<elementwise_blocks(n), kElementwiseThreads, 0, s->stream>>>((T*)dinp,
                                                                          (const T*)gelu_input, n);
  });
  LAUNCH_CHECK();
}

// ---------------------------------------------------------------------------------------------
// cuBLASLt: one GEMM, its descriptors and its cached algorithm
// ---------------------------------------------------------------------------------------------
// D (m x n) = op(A) (m x k) . op(B) (k x n) [+ beta C], then the epilogue; column-major.
struct Gemm {
  cublasOperation_t op_a = CUBLAS_OP_N, op_b = CUBLAS_OP_N;
  int m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int lda = 0;
  const void* b = nullptr;
  int ldb = 0;
  const void* c = nullptr;  // nullptr: no C (beta must be 0); cuBLASLt is given D in its place
  int ldc = 0;
  void* d = nullptr;
  int ldd = 0;
  float beta = 0.0f;
  cudaDataType_t a_type = CUDA_R_32F, b_type = CUDA_R_32F, cd_type = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;  // BIAS: the bias (length m, type cd_type); BGRADB: its output (n)
  const void* aux = nullptr;   // GELU_AUX: pre-activation written; DGELU: pre-activation read
  int64_t aux_ld = 0;
  // FP8 only: device pointers to the dequantisation scales cuBLASLt multiplies A and B by
  // (fp32, the compute type); nullptr: 1.
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
};

cudaDataType_t cuda_type(DType dt) {
  switch (dt) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::E4M3: return CUDA_R_8F_E4M3;
    case DType::E5M2: return CUDA_R_8F_E5M2;
    case DType::I8:
    case DType::I32: break;  // never a GEMM operand here
  }
  FATAL("cuBLASLt: no CUDA type for dtype %d", (int)dt);
}
cublasComputeType_t compute_type(DType dt, Stream s) {
  return dt == DType::F32 && s->options.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                   : CUBLAS_COMPUTE_32F;
}

// What cuBLASLt calls a buffer's alignment: the largest power of two, up to 256, dividing it.
uint32_t alignment_of(const void* p) {
  uintptr_t address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

typedef std::array<int64_t, 26> AlgoKey;

AlgoKey algo_key(const Gemm& g, size_t workspace_bytes) {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  const void* c = g.c ? g.c : g.d;
  return AlgoKey{device, g.op_a, g.op_b, g.m, g.n, g.k, g.lda, g.ldb, g.c ? g.ldc : g.ldd, g.ldd,
                 g.a_type, g.b_type, g.cd_type, g.compute, g.epilogue, g.aux_ld,
                 alignment_of(g.a), alignment_of(g.b), alignment_of(c), alignment_of(g.d),
                 alignment_of(g.bias), alignment_of(g.aux), (int64_t)workspace_bytes,
                 g.c != nullptr, g.a_scale != nullptr || g.b_scale != nullptr, 0};
}

// The cuBLASLt objects of one GEMM signature (an AlgoKey): the matmul descriptor, the four matrix
// layouts and the heuristic's algorithm (or its "none"). Built at a signature's first call on a
// stream and kept until the stream is destroyed; a call sets only the descriptor's pointer
// attributes (bias, aux, FP8 scales) again.
struct LtSignature {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo = {};
  bool found = false;

  LtSignature(const Gemm& g, Stream s);
  ~LtSignature() {
    cublasLtMatrixLayoutDestroy(d);
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatmulDescDestroy(desc);
  }
  LtSignature(const LtSignature&) = delete;
  LtSignature& operator=(const LtSignature&) = delete;

  template <typename V>
  void set(cublasLtMatmulDescAttributes_t attribute, const V& value) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)));
  }
  void set_pointers(const Gemm& g) {
    // Bias and aux types are left at their defaults, the type of D: bf16 bias and pre-activation
    // in the bf16 forward, an fp32 bias gradient next to the fp32 dweight.
    if (g.bias) set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
    if (g.aux) set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
    if (g.a_scale) set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, g.a_scale);
    if (g.b_scale) set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, g.b_scale);
  }
  void ask_heuristic(const Gemm& g, Stream s);
};

// A stream's signatures (StreamImpl::gemm_signatures).
using SignatureCache = std::map<AlgoKey, std::unique_ptr<LtSignature>>;

LtSignature::LtSignature(const Gemm& g, Stream s) {
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, g.compute, CUDA_R_32F));
  set(CUBLASLT_MATMUL_DESC_TRANSA, (int32_t)g.op_a);
  set(CUBLASLT_MATMUL_DESC_TRANSB, (int32_t)g.op_b);
  set(CUBLASLT_MATMUL_DESC_EPILOGUE, (uint32_t)g.epilogue);
  if (g.aux) set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.aux_ld);
  set_pointers(g);  // the heuristic may look at which pointers are set
  bool a_n = g.op_a == CUBLAS_OP_N, b_n = g.op_b == CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a, g.a_type, a_n ? g.m : g.k, a_n ? g.k : g.m, g.lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b, g.b_type, b_n ? g.k : g.n, b_n ? g.n : g.k, g.ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c, g.cd_type, g.m, g.n, g.c ? g.ldc : g.ldd));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d, g.cd_type, g.m, g.n, g.ldd));
  ask_heuristic(g, s);
}

// The heuristic's first choice for this signature.
void LtSignature::ask_heuristic(const Gemm& g, Stream s) {
  cublasLtMatmulPreference_t preference;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  uint64_t workspace = s->workspace_bytes;
  uint32_t align_a = alignment_of(g.a), align_b = alignment_of(g.b);
  uint32_t align_c = alignment_of(g.c ? g.c : g.d), align_d = alignment_of(g.d);
  auto prefer = [&](cublasLtMatmulPreferenceAttributes_t attribute, const auto& value) {
    CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value, sizeof(value)));
  };
  // Split-K only with fp32 partial sums in the workspace, reduced in a fixed order: INPLACE and
  // OUTPUT_TYPE would sum the parts in bf16 for bf16 outputs (and INPLACE orders them at run time).
  uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;  // unsplit algorithms always pass
  prefer(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace);
  prefer(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, reductions);
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a);
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b);
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c);
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d);
  cublasLtMatmulHeuristicResult_t result = {};
  int returned = 0;
  cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(s->lt, desc, a, b, c, d, preference, 1,
                                                         &result, &returned);
  cublasLtMatmulPreferenceDestroy(preference);
  found = status == CUBLAS_STATUS_SUCCESS && returned > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  algo = result.algo;
  if (!found && g.epilogue != CUBLASLT_EPILOGUE_DEFAULT)
    std::fprintf(stderr,
                 "matmul: cuBLASLt has no algorithm for epilogue %d (m=%d n=%d k=%d, status %d);"
                 " using the hand-written epilogue\n",
                 (int)g.epilogue, g.m, g.n, g.k, (int)status);
}

// One call of a GEMM: its signature's cached objects, the call's pointers set on them.
class LtGemm {
 public:
  LtGemm(const Gemm& g, Stream s) : g_(g), s_(s) {
    CHECK(s && s->lt, "matmul: the stream has no cuBLASLt handle");
    if (!s->gemm_signatures) s->gemm_signatures = new SignatureCache;
    SignatureCache& cache = *static_cast<SignatureCache*>(s->gemm_signatures);
    std::unique_ptr<LtSignature>& entry = cache[algo_key(g, s->workspace_bytes)];
    if (!entry) entry = std::make_unique<LtSignature>(g, s);
    signature_ = entry.get();
    if (signature_->found) signature_->set_pointers(g);
  }

  bool available() const { return signature_->found; }
  void run() const {
    const LtSignature& sig = *signature_;
    float alpha = 1.0f, beta = g_.beta;
    const void* c = g_.c ? g_.c : g_.d;
    CUBLAS_CHECK(cublasLtMatmul(s_->lt, sig.desc, &alpha, g_.a, sig.a, g_.b, sig.b, &beta, c,
                                sig.c, g_.d, sig.d, &sig.algo, s_->workspace,
                                s_->workspace_bytes, s_->stream));
  }

 private:
  Gemm g_;
  Stream s_;
  LtSignature* signature_ = nullptr;
};

// A GEMM without epilogue: cuBLASLt always has one; not finding it is a bug worth stopping for.
void run_gemm(const Gemm& g, Stream s) {
  LtGemm gemm(g, s);
  CHECK(gemm.available(),
        "matmul: cuBLASLt found no algorithm for m=%d n=%d k=%d (ops %d%d, lds %d %d %d)", g.m,
        g.n, g.k, (int)g.op_a, (int)g.op_b, g.lda, g.ldb, g.ldd);
  gemm.run();
}

// Whether we hand an epilogue to cuBLASLt (see the file comment): dimensions that are leading
// dimensions or vector lengths multiples of 8, bias/aux pointers 16-byte aligned.
bool fits_epilogue(std::initializer_list<int> dims, std::initializer_list<const void*> vectors) {
  for (int d : dims)
    if (d % 8 != 0) return false;
  for (const void* p : vectors)
    if (!aligned16(p)) return false;
  return true;
}

// The three GEMMs of the file comment, without epilogue.
Gemm forward_gemm(void* out, const void* inp, const void* weight, int N, int C, int OC, DType dt,
                  Stream s) {
  Gemm g;
  g.op_a = CUBLAS_OP_T, g.op_b = CUBLAS_OP_N;
  g.m = OC, g.n = N, g.k = C;
  g.a = weight, g.lda = C;
  g.b = inp, g.ldb = C;
  g.d = out, g.ldd = OC;
  g.a_type = g.b_type = g.cd_type = cuda_type(dt);
  g.compute = compute_type(dt, s);
  return g;
}
Gemm input_grad_gemm(void* dinp, const void* dout, const void* weight, int N, int C, int OC,
                     DType dt, Stream s) {
  Gemm g;
  g.op_a = CUBLAS_OP_N, g.op_b = CUBLAS_OP_N;
  g.m = C, g.n = N, g.k = OC;
  g.a = weight, g.lda = C;
  g.b = dout, g.ldb = OC;
  g.d = dinp, g.ldd = C;
  g.a_type = g.b_type = g.cd_type = cuda_type(dt);
  g.compute = compute_type(dt, s);
  return g;
}
Gemm weight_grad_gemm(float* dweight, const void* dout, const void* inp, int N, int C, int OC,
                      DType dt, Stream s) {
  Gemm g;
  g.op_a = CUBLAS_OP_N, g.op_b = CUBLAS_OP_T;
  g.m = C, g.n = OC, g.k = N;
  g.a = inp, g.lda = C;
  g.b = dout, g.ldb = OC;
  g.c = dweight, g.ldc = C;
  g.d = dweight, g.ldd = C;
  g.beta = 1.0f;  // accumulate
  g.a_type = g.b_type = cuda_type(dt);
  g.cd_type = CUDA_R_32F;
  g.compute = compute_type(dt, s);
  return g;
}

void input_gradient(void* dinp, const void* dout, const void* weight, const void* gelu_input,
                    int N, int C, int OC, DType dt, Stream s) {
  Gemm g = input_grad_gemm(dinp, dout, weight, N, C, OC, dt, s);
  if (!gelu_input) {
    run_gemm(g, s);
    return;
  }
  if (dt == DType::BF16 && fits_epilogue({C}, {gelu_input})) {
    Gemm fused = g;
    fused.epilogue = CUBLASLT_EPILOGUE_DGELU;
    fused.aux = gelu_input;
    fused.aux_ld = C;
    LtGemm gemm(fused, s);
    if (gemm.available()) {
      gemm.run();
      return;
    }
  }
  run_gemm(g, s);
  launch_dgelu(dinp, gelu_input, (size_t)N * C, dt, s);
}

void weight_and_bias_gradient(float* dweight, float* dbias, const void* dout, const void* inp,
                              int N, int C, int OC, DType dt, Stream s) {
  Gemm g = weight_grad_gemm(dweight, dout, inp, N, C, OC, dt, s);
  if (!dbias) {
    run_gemm(g, s);
    return;
  }
  // BGRADB writes the bias gradient (it does not accumulate): into scratch, then added.
  float* partial = (float*)stream_scratch(s, (size_t)OC * sizeof(float));
  if (fits_epilogue({C, OC}, {partial})) {
    Gemm fused = g;
    fused.epilogue = CUBLASLT_EPILOGUE_BGRADB;
    fused.bias = partial;
    LtGemm gemm(fused, s);
    if (gemm.available()) {
      gemm.run();
      add_inplace(dbias, partial, OC, s);
      return;
    }
  }
  run_gemm(g, s);
  bias_backward(dbias, dout, N, OC, dt, s);  // the deterministic reduction (bias_grad.cu)
}

// ---------------------------------------------------------------------------------------------
// FP8 GEMM (ops::gemm_fp8; see "FP8" in the file comment)
// ---------------------------------------------------------------------------------------------
// Row-major out (M, N) = a (M, K) . b (N, K)^T is, byte for byte, the column-major
// out^T (N x M, ld N) = b . a^T with b stored as the column-major K x N (ld K) and a as the
// column-major K x M (ld K): cuBLASLt's A = b with op T (N x K), B = a with op N (K x M),
// m = N, n = M, k = K. That is the "TN" form FP8 requires; note that A's scale is b's and B's
// scale is a's.
Gemm fp8_gemm(void* out, DType out_dt, const void* a, DType a_fp8, const void* b, DType b_fp8,
              int M, int N, int K, const float* a_scale_inv, const float* b_scale_inv) {
  Gemm g;
  g.op_a = CUBLAS_OP_T, g.op_b = CUBLAS_OP_N;
  g.m = N, g.n = M, g.k = K;
  g.a = b, g.lda = K, g.a_type = cuda_type(b_fp8), g.a_scale = b_scale_inv;
  g.b = a, g.ldb = K, g.b_type = cuda_type(a_fp8), g.b_scale = a_scale_inv;
  g.d = out, g.ldd = N, g.cd_type = cuda_type(out_dt);
  g.compute = CUBLAS_COMPUTE_32F;  // fp32 accumulation; FAST_ACCUM left at its default, off
  return g;
}

void check_fp8_gemm(const void* out, DType out_dt, bool accumulate, const void* a, DType a_fp8,
                    const void* b, DType b_fp8, int M, int N, int K) {
  auto is_fp8 = [](DType t) { return t == DType::E4M3 || t == DType::E5M2; };
  CHECK(is_fp8(a_fp8) && is_fp8(b_fp8) && !(a_fp8 == DType::E5M2 && b_fp8 == DType::E5M2),
        "gemm_fp8: operands %s x %s (E4M3 x E4M3, E4M3 x E5M2 or E5M2 x E4M3)",
        dtype_name(a_fp8), dtype_name(b_fp8));
  CHECK(out_dt == DType::F32 || (out_dt == DType::BF16 && !accumulate),
        "gemm_fp8: output %s%s", dtype_name(out_dt), accumulate ? " with accumulate" : "");
  CHECK(M > 0 && N > 0 && K > 0 && M % 16 == 0 && N % 16 == 0 && K % 16 == 0,
        "gemm_fp8: M=%d N=%d K=%d must be positive multiples of 16", M, N, K);
  CHECK(aligned16({out, a, b}), "gemm_fp8: operands must be 16-byte aligned");
}

void check_shape(const char* op, int N, int C, int OC) {
  CHECK(N > 0 && C > 0 && OC > 0, "%s: bad shape N=%d C=%d OC=%d", op, N, C, OC);
}

}  // namespace

void release_gemm_signatures(StreamImpl* s) {
  delete static_cast<SignatureCache*>(s->gemm_signatures);
  s->gemm_signatures = nullptr;
}

// ---------------------------------------------------------------------------------------------
// The ops
// ---------------------------------------------------------------------------------------------
void matmul_forward(void* out, void* pre_gelu, const void* inp, const void* weight,
                    const void* bias, const void* residual, int N, int C, int OC, DType dt,
                    Stream s) {
  OP_SPAN(matmul_forward);
  if (is_dry(s)) return;
  check_shape("matmul_forward", N, C, OC);
  CHECK(!(pre_gelu && residual), "matmul_forward: a residual cannot follow the GELU");
  Gemm g = forward_gemm(pre_gelu ? pre_gelu : out, inp, weight, N, C, OC, dt, s);
  if (residual) {  // D = A.B + 1 * residual; residual may be out itself (in place)
    g.c = residual;
    g.ldc = OC;
    g.beta = 1.0f;
  }
  if (!bias && !pre_gelu) {
    run_gemm(g, s);
    return;
  }
  bool fuse = (dt == DType::BF16 || !pre_gelu) && fits_epilogue({OC}, {bias, pre_gelu});
  if (fuse) {
    Gemm fused = g;
    fused.d = out;
    if (pre_gelu) {
      fused.epilogue = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
      fused.aux = pre_gelu;
      fused.aux_ld = OC;
    } else {
      fused.epilogue = CUBLASLT_EPILOGUE_BIAS;
    }
    fused.bias = bias;
    LtGemm gemm(fused, s);
    if (gemm.available()) {
      gemm.run();
      return;
    }
  }
  run_gemm(g, s);  // y (+ residual) into pre_gelu or out; bias and GELU follow
  launch_bias_gelu(out, pre_gelu, bias, N, OC, dt, s);
}

void matmul_backward(void* dinp, float* dweight, float* dbias, const void* dout, const void* inp,
                     const void* weight, const void* gelu_input, int N, int C, int OC, DType dt,
                     Stream s) {
  OP_SPAN(matmul_backward);
  if (is_dry(s)) return;
  check_shape("matmul_backward", N, C, OC);
  if (dinp) input_gradient(dinp, dout, weight, gelu_input, N, C, OC, dt, s);
  if (dweight) weight_and_bias_gradient(dweight, dbias, dout, inp, N, C, OC, dt, s);
  else if (dbias) bias_backward(dbias, dout, N, OC, dt, s);  // the deterministic column sums
}

void gemm_fp8(void* out, DType out_dt, bool accumulate, const void* a, DType a_fp8,
              const void* b, DType b_fp8, int M, int N, int K, const float* a_scale_inv,
              const float* b_scale_inv, Stream s) {
  OP_SPAN(gemm_fp8);
  if (is_dry(s)) return;
  check_fp8_gemm(out, out_dt, accumulate, a, a_fp8, b, b_fp8, M, N, K);
  Gemm g = fp8_gemm(out, out_dt, a, a_fp8, b, b_fp8, M, N, K, a_scale_inv, b_scale_inv);
  if (!accumulate) {
    run_gemm(g, s);
    return;
  }
  Gemm fused = g;  // D = A.B + 1 * C with C = D = out, fp32
  fused.c = out, fused.ldc = N, fused.beta = 1.0f;
  LtGemm gemm(fused, s);
  if (gemm.available()) {
    gemm.run();
    return;
  }
  // No FP8 algorithm with an fp32 C: the product into fp32 scratch, then out += scratch.
  const size_t n = (size_t)M * N;
  g.d = stream_scratch(s, n * sizeof(float));
  run_gemm(g, s);
  add_inplace((float*)out, (const float*)g.d, n, s);
}

}  // namespace ops
