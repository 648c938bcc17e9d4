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
// dims, types, compute type, epilogue, pointer alignments, workspace size, device); its answer,
// including "none", is kept in a function-local cache (a map behind a mutex, for the process's
// life). Descriptors are created per call: host-only work of a few microseconds. Pointer
// alignments are passed to the heuristic (cuBLASLt otherwise assumes 256 bytes, and our weights
// sit at arbitrary offsets inside one parameter buffer). Split-K is restricted to fp32 partials
// reduced in a fixed order, so results are deterministic and bf16 outputs are rounded once.
//
// FLOPs per call: forward 2*N*C*OC; backward 4*N*C*OC (2*N*C*OC without dinp).
#include <algorithm>
#include <array>
#include <cstdio>
#include <initializer_list>
#include <map>
#include <mutex>

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
// Bias-gradient reduction: dbias[c] += sum_n dout[n, c], fp32, deterministic.
// Pass 1: a grid of (column slabs) x (row chunks). A block is 8 warps; lane l of every warp owns
// one 16-byte pack of columns (8 bf16 or 4 fp32), so a warp reads 512 contiguous bytes of a row;
// warp w takes rows w, w+8, ... of the chunk. The 8 warps' sums meet in shared memory in a fixed
// order and the chunk's sums go to partial[chunk][c]. Pass 2: one thread per column adds its
// chunks, in order, to dbias. Chunks are sized from the shape and the SM count only, so the
// summation order, hence the result, is the same on every call.
// ---------------------------------------------------------------------------------------------
constexpr int kBiasWarps = 8;
constexpr int kBiasMinRowsPerChunk = 4 * kBiasWarps;

template <typename T, bool kVec>
__global__ void __launch_bounds__(32 * kBiasWarps)
    bias_grad_partial_kernel(float* partial, const T* dout, int N, int OC, int rows_per_chunk) {
  constexpr int P = Pack128<T>::size;
  __shared__ float sums[kBiasWarps][32 * P];  // [warp][i * 32 + lane]: column lane * P + i
  const int lane = threadIdx.x, warp = threadIdx.y;
  const int col0 = (blockIdx.x * 32 + lane) * P;
  const int row_end = min(N, (int)blockIdx.y * rows_per_chunk + rows_per_chunk);
  float acc[P] = {};
  if (col0 < OC) {
    for (int row = blockIdx.y * rows_per_chunk + warp; row < row_end; row += kBiasWarps) {
      const T* p = dout + (size_t)row * OC + col0;
      if constexpr (kVec) {
        Pack128<T> v = load128cs(p);
#pragma unroll
        for (int i = 0; i < P; i++) acc[i] += to_float(v[i]);
      } else {
#pragma unroll
        for (int i = 0; i < P; i++)
          if (col0 + i < OC) acc[i] += to_float(p[i]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < P; i++) sums[warp][i * 32 + lane] = acc[i];
  __syncthreads();
  for (int j = warp * 32 + lane; j < 32 * P; j += 32 * kBiasWarps) {
    int col = blockIdx.x * 32 * P + (j % 32) * P + j / 32;
    if (col >= OC) continue;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kBiasWarps; w++) sum += sums[w][j];
    partial[(size_t)blockIdx.y * OC + col] = sum;
  }
}

__global__ void bias_grad_finish_kernel(float* dbias, const float* partial, int chunks, int OC) {
  int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= OC) return;
  float sum = 0.0f;
  for (int c = 0; c < chunks; c++) sum += partial[(size_t)c * OC + col];
  dbias[col] += sum;
}

struct BiasReduction {
  int chunks;          // row chunks = blocks along y = rows of `partial`
  int rows_per_chunk;
  int column_blocks;
};

// About four blocks per SM, each chunk at least kBiasMinRowsPerChunk rows.
BiasReduction plan_bias_reduction(int N, int OC, DType dt) {
  int device = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  int cols_per_block = 32 * (int)(16 / dtype_size(dt));
  BiasReduction r;
  r.column_blocks = (int)ceil_div(OC, cols_per_block);
  int wanted = (int)ceil_div(4 * sms, r.column_blocks);
  int most = (int)ceil_div(N, kBiasMinRowsPerChunk);
  r.chunks = std::max(1, std::min(wanted, most));
  r.rows_per_chunk = (int)ceil_div(N, r.chunks);
  r.chunks = (int)ceil_div(N, r.rows_per_chunk);  // no empty chunk
  return r;
}

void launch_bias_grad_finish(float* dbias, const float* partial, int chunks, int OC, Stream s) {
  bias_grad_finish_kernel<<<(unsigned)ceil_div(OC, 256), 256, 0, s->stream>>>(dbias, partial,
                                                                              chunks, OC);
  LAUNCH_CHECK();
}

void launch_bias_grad(float* dbias, float* partial, const BiasReduction& r, const void* dout,
                      int N, int OC, DType dt, Stream s) {
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    bool vec = OC % Pack128<T>::size == 0 && aligned16(dout);
    auto kernel = vec ? bias_grad_partial_kernel<T, true> : bias_grad_partial_kernel<T, false>;
    dim3 grid(r.column_blocks, r.chunks), block(32, kBiasWarps);
    kernel<<<grid, block, 0, s->stream>>>(partial, (const T*)dout, N, OC, r.rows_per_chunk);
  });
  LAUNCH_CHECK();
  launch_bias_grad_finish(dbias, partial, r.chunks, OC, s);
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
  cudaDataType_t ab_type = CUDA_R_32F, cd_type = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;  // BIAS: the bias (length m, type cd_type); BGRADB: its output (n)
  const void* aux = nullptr;   // GELU_AUX: pre-activation written; DGELU: pre-activation read
  int64_t aux_ld = 0;
};

cudaDataType_t cuda_type(DType dt) { return dt == DType::F32 ? CUDA_R_32F : CUDA_R_16BF; }
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

typedef std::array<int64_t, 24> AlgoKey;
struct CachedAlgo {
  bool found = false;
  cublasLtMatmulAlgo_t algo = {};
};

AlgoKey algo_key(const Gemm& g, size_t workspace_bytes) {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  const void* c = g.c ? g.c : g.d;
  return AlgoKey{device, g.op_a, g.op_b, g.m, g.n, g.k, g.lda, g.ldb, g.c ? g.ldc : g.ldd, g.ldd,
                 g.ab_type, g.cd_type, g.compute, g.epilogue, g.aux_ld, alignment_of(g.a),
                 alignment_of(g.b), alignment_of(c), alignment_of(g.d), alignment_of(g.bias),
                 alignment_of(g.aux), (int64_t)workspace_bytes, g.c != nullptr, 0};
}

class LtGemm {
 public:
  LtGemm(const Gemm& g, Stream s) : g_(g), s_(s) {
    CHECK(s && s->lt, "matmul: the stream has no cuBLASLt handle");
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, g.compute, CUDA_R_32F));
    set(CUBLASLT_MATMUL_DESC_TRANSA, (int32_t)g.op_a);
    set(CUBLASLT_MATMUL_DESC_TRANSB, (int32_t)g.op_b);
    set(CUBLASLT_MATMUL_DESC_EPILOGUE, (uint32_t)g.epilogue);
    // Bias and aux types are left at their defaults, the type of D: bf16 bias and pre-activation
    // in the bf16 forward, an fp32 bias gradient next to the fp32 dweight.
    if (g.bias) set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
    if (g.aux) {
      set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
      set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.aux_ld);
    }
    bool a_n = g.op_a == CUBLAS_OP_N, b_n = g.op_b == CUBLAS_OP_N;
    CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&a_, g.ab_type, a_n ? g.m : g.k, a_n ? g.k : g.m, g.lda));
    CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&b_, g.ab_type, b_n ? g.k : g.n, b_n ? g.n : g.k, g.ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c_, g.cd_type, g.m, g.n, g.c ? g.ldc : g.ldd));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d_, g.cd_type, g.m, g.n, g.ldd));
    found_ = find_algorithm();
  }
  ~LtGemm() {
    cublasLtMatrixLayoutDestroy(d_);
    cublasLtMatrixLayoutDestroy(c_);
    cublasLtMatrixLayoutDestroy(b_);
    cublasLtMatrixLayoutDestroy(a_);
    cublasLtMatmulDescDestroy(desc_);
  }
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  bool available() const { return found_; }
  void run() const {
    float alpha = 1.0f, beta = g_.beta;
    const void* c = g_.c ? g_.c : g_.d;
    CUBLAS_CHECK(cublasLtMatmul(s_->lt, desc_, &alpha, g_.a, a_, g_.b, b_, &beta, c, c_, g_.d,
                                d_, &algo_, s_->workspace, s_->workspace_bytes, s_->stream));
  }

 private:
  template <typename V>
  void set(cublasLtMatmulDescAttributes_t attribute, const V& value) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, attribute, &value, sizeof(value)));
  }

  // The heuristic's first choice for this GEMM's signature, asked once per process.
  bool find_algorithm() {
    static std::mutex mutex;                      // guards `cache`
    static std::map<AlgoKey, CachedAlgo> cache;   // every signature seen, with its answer
    AlgoKey key = algo_key(g_, s_->workspace_bytes);
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it == cache.end()) it = cache.emplace(key, ask_heuristic()).first;
    algo_ = it->second.algo;
    return it->second.found;
  }

  CachedAlgo ask_heuristic() const {
    cublasLtMatmulPreference_t preference;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    uint64_t workspace = s_->workspace_bytes;
    uint32_t align_a = alignment_of(g_.a), align_b = alignment_of(g_.b);
    uint32_t align_c = alignment_of(g_.c ? g_.c : g_.d), align_d = alignment_of(g_.d);
    auto prefer = [&](cublasLtMatmulPreferenceAttributes_t attribute, const auto& value) {
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value,
                                                        sizeof(value)));
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
    cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(s_->lt, desc_, a_, b_, c_, d_,
                                                           preference, 1, &result, &returned);
    cublasLtMatmulPreferenceDestroy(preference);
    CachedAlgo answer;
    answer.found = status == CUBLAS_STATUS_SUCCESS && returned > 0 &&
                   result.state == CUBLAS_STATUS_SUCCESS;
    answer.algo = result.algo;
    if (!answer.found && g_.epilogue != CUBLASLT_EPILOGUE_DEFAULT)
      std::fprintf(stderr,
                   "matmul: cuBLASLt has no algorithm for epilogue %d (m=%d n=%d k=%d, status %d);"
                   " using the hand-written epilogue\n",
                   (int)g_.epilogue, g_.m, g_.n, g_.k, (int)status);
    return answer;
  }

  Gemm g_;
  Stream s_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr, d_ = nullptr;
  cublasLtMatmulAlgo_t algo_ = {};
  bool found_ = false;
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
  g.ab_type = g.cd_type = cuda_type(dt);
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
  g.ab_type = g.cd_type = cuda_type(dt);
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
  g.ab_type = cuda_type(dt);
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
  // Scratch for the partial sums: chunks x OC floats, at least the OC the epilogue writes.
  BiasReduction reduction = plan_bias_reduction(N, OC, dt);
  float* partial = (float*)stream_scratch(s, (size_t)reduction.chunks * OC * sizeof(float));
  if (fits_epilogue({C, OC}, {partial})) {
    Gemm fused = g;
    fused.epilogue = CUBLASLT_EPILOGUE_BGRADB;
    fused.bias = partial;
    LtGemm gemm(fused, s);
    if (gemm.available()) {
      gemm.run();
      launch_bias_grad_finish(dbias, partial, 1, OC, s);
      return;
    }
  }
  run_gemm(g, s);
  launch_bias_grad(dbias, partial, reduction, dout, N, OC, dt, s);
}

void check_shape(const char* op, int N, int C, int OC) {
  CHECK(N > 0 && C > 0 && OC > 0, "%s: bad shape N=%d C=%d OC=%d", op, N, C, OC);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The ops
// ---------------------------------------------------------------------------------------------
void matmul_forward(void* out, void* pre_gelu, const void* inp, const void* weight,
                    const void* bias, const void* residual, int N, int C, int OC, DType dt,
                    Stream s) {
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
  check_shape("matmul_backward", N, C, OC);
  if (dinp) input_gradient(dinp, dout, weight, gelu_input, N, C, OC, dt, s);
  weight_and_bias_gradient(dweight, dbias, dout, inp, N, C, OC, dt, s);
}

}  // namespace ops
