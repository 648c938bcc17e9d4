// test/emu/cublaslt_cases.h - the GEMM cases of test/emu/test_cublaslt.cpp: their table, the
// buffers (random inputs, poisoned outputs), the cuBLASLt calls in kernels/cuda/matmul.cu's order
// and the files test/emu/test_cublaslt.py reads. Included once, by test_cublaslt.cpp.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

enum class CMode { None, Separate, InPlace };  // None: C = D is passed with beta = 0 (matmul.cu)

struct Spec {
  const char* name;
  cublasOperation_t op_a, op_b;
  int64_t m, n, k;
  cudaDataType_t a_type, b_type, c_type, d_type;
  cublasComputeType_t compute;
  uint32_t epilogue;
  float alpha, beta;
  CMode c_mode;
  int64_t pad = 0;                // every leading dimension is this much larger than needed
  int32_t order = CUBLASLT_ORDER_COL;
  int32_t batch = 1;
  int64_t batch_gap = 0;          // elements between one matrix's span and the next
  int64_t aux_ld = 0;
  bool scales = false, d_scale = false, amax = false;
};

constexpr cudaDataType_t F32 = CUDA_R_32F, BF16 = CUDA_R_16BF, E4M3 = CUDA_R_8F_E4M3,
                         E5M2 = CUDA_R_8F_E5M2;
constexpr cublasOperation_t N = CUBLAS_OP_N, T = CUBLAS_OP_T;
constexpr cublasComputeType_t C32 = CUBLAS_COMPUTE_32F, TF32 = CUBLAS_COMPUTE_32F_FAST_TF32;

Spec spec(const char* name, cublasOperation_t op_a, cublasOperation_t op_b, int64_t m, int64_t n,
          int64_t k, cudaDataType_t ab, cudaDataType_t cd, uint32_t epilogue = 1,
          CMode c_mode = CMode::None, float beta = 0.0f) {
  return Spec{name, op_a, op_b, m, n, k, ab, ab, cd, cd, C32, epilogue, 1.0f, beta, c_mode};
}

// matmul.cu's GEMMs (m, n, k as there: forward m = OC, n = N, k = C; dinp m = C, n = N, k = OC;
// dweight m = C, n = OC, k = N) at awkward sizes where matmul.cu allows them, then the rest of
// what the stand-in implements.
std::vector<Spec> all_specs() {
  std::vector<Spec> s;
  s.push_back(spec("forward f32", T, N, 19, 15, 37, F32, F32));
  s.push_back(spec("forward f32 tf32", T, N, 19, 15, 200, F32, F32));
  s.back().compute = TF32;
  s.push_back(spec("forward bf16 bias", T, N, 24, 13, 37, BF16, BF16, CUBLASLT_EPILOGUE_BIAS));
  s.push_back(spec("forward bf16 gelu_aux_bias", T, N, 40, 13, 37, BF16, BF16,
                   CUBLASLT_EPILOGUE_GELU_AUX_BIAS));
  s.push_back(spec("forward bf16 gelu_aux", T, N, 21, 11, 29, BF16, BF16,
                   CUBLASLT_EPILOGUE_GELU_AUX));
  s.back().aux_ld = 24;
  s.push_back(spec("forward bf16 residual bias", T, N, 24, 13, 37, BF16, BF16,
                   CUBLASLT_EPILOGUE_BIAS, CMode::Separate, 1.0f));
  s.push_back(spec("forward f32 residual in place", T, N, 19, 15, 37, F32, F32, 1,
                   CMode::InPlace, 1.0f));
  s.push_back(spec("dinp bf16 dgelu", N, N, 32, 13, 27, BF16, BF16, CUBLASLT_EPILOGUE_DGELU));
  s.push_back(spec("dinp f32", N, N, 37, 15, 19, F32, F32));
  // fp32 epilogues (matmul.cu keeps its own kernels in fp32): only fp32 outputs are precise
  // enough to tell the tanh GELU from the erf one.
  s.push_back(spec("forward f32 gelu_aux_bias", T, N, 21, 9, 23, F32, F32,
                   CUBLASLT_EPILOGUE_GELU_AUX_BIAS));
  s.back().aux_ld = 32;
  s.push_back(spec("dinp f32 dgelu", N, N, 16, 9, 23, F32, F32, CUBLASLT_EPILOGUE_DGELU));
  s.push_back(spec("dweight bf16 bgradb", N, T, 24, 16, 29, BF16, F32, CUBLASLT_EPILOGUE_BGRADB,
                   CMode::InPlace, 1.0f));
  s.back().c_type = s.back().d_type = F32;
  s.push_back(spec("dweight f32", N, T, 37, 19, 15, F32, F32, 1, CMode::InPlace, 1.0f));
  s.push_back(spec("fp8 e4m3 x e4m3 -> bf16", T, N, 48, 32, 64, E4M3, BF16));
  s.back().scales = true;
  s.push_back(spec("fp8 e5m2 x e4m3 -> f32 accumulate", T, N, 32, 48, 80, E5M2, F32, 1,
                   CMode::InPlace, 1.0f));
  s.back().b_type = E4M3, s.back().scales = true;
  s.push_back(spec("fp8 e4m3 x e5m2 -> e4m3, d_scale, amax", T, N, 32, 16, 48, E4M3, E4M3, 1,
                   CMode::Separate, 0.5f));
  s.back().b_type = E5M2, s.back().c_type = BF16;
  s.back().scales = s.back().d_scale = s.back().amax = true;
  s.push_back(spec("batched bf16 gelu_aux_bias padded", N, N, 21, 11, 19, BF16, BF16,
                   CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CMode::Separate, 0.5f));
  s.back().alpha = 0.75f, s.back().pad = 3, s.back().batch = 3, s.back().batch_gap = 5;
  s.back().aux_ld = 24;
  s.push_back(spec("row-major f32 batched alpha beta", T, T, 13, 17, 11, F32, F32, 1,
                   CMode::Separate, -0.25f));
  s.back().alpha = 1.5f, s.back().pad = 2, s.back().order = CUBLASLT_ORDER_ROW;
  s.back().batch = 2, s.back().batch_gap = 7;
  return s;
}

// ---------------------------------------------------------------------------------------------
// Buffers
// ---------------------------------------------------------------------------------------------
size_t elem_size(cudaDataType_t t) { return t == F32 ? 4 : t == BF16 ? 2 : 1; }

// One matrix (or vector) with its layout and a 256-byte aligned buffer spanning its batch.
struct Matrix {
  std::string name;
  cudaDataType_t type = F32;
  int64_t rows = 0, cols = 0, ld = 0, stride = 0;
  int32_t order = CUBLASLT_ORDER_COL, batch = 1;
  size_t bytes = 0;
  std::shared_ptr<uint8_t> data;
  std::vector<uint8_t> before;  // the buffer as it was before the call
  void* ptr() const { return data.get(); }
};

Matrix make_matrix(const std::string& name, cudaDataType_t type, int64_t rows, int64_t cols,
                   int64_t ld, int32_t order, int32_t batch, int64_t gap) {
  Matrix x;
  x.name = name, x.type = type, x.rows = rows, x.cols = cols, x.ld = ld, x.order = order;
  x.batch = batch;
  const int64_t span = order == CUBLASLT_ORDER_COL ? ld * cols : ld * rows;
  x.stride = batch > 1 ? span + gap : 0;
  x.bytes = (size_t)((batch - 1) * x.stride + span) * elem_size(type);
  const size_t allocated = (x.bytes + 255) / 256 * 256 + 256;
  x.data.reset(static_cast<uint8_t*>(std::aligned_alloc(256, allocated)), std::free);
  std::memset(x.data.get(), 0xFF, allocated);  // poison: NaN in every type used here
  return x;
}

// Random values in the matrix part of the buffer (the padding stays poisoned).
void fill_random(Matrix& x, std::mt19937_64& rng, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int32_t b = 0; b < x.batch; b++)
    for (int64_t i = 0; i < x.rows; i++)
      for (int64_t j = 0; j < x.cols; j++) {
        const int64_t at = b * x.stride + (x.order == CUBLASLT_ORDER_COL ? i + j * x.ld
                                                                          : i * x.ld + j);
        uint8_t* p = x.data.get() + at * elem_size(x.type);
        if (x.type == F32) {
          const float v = normal(rng);
          std::memcpy(p, &v, 4);
        } else if (x.type == BF16) {
          const __nv_bfloat16 v = __float2bfloat16_rn(normal(rng));
          std::memcpy(p, &v, 2);
        } else {  // any finite FP8 value (E4M3: not 0x7F/0xFF; E5M2: exponent not all ones)
          int v;
          do v = byte(rng);
          while (x.type == E4M3 ? (v & 0x7F) == 0x7F : (v & 0x7C) == 0x7C);
          *p = (uint8_t)v;
        }
      }
}

// ---------------------------------------------------------------------------------------------
// One case: buffers, the cuBLASLt calls, the files
// ---------------------------------------------------------------------------------------------
struct Case {
  Spec s;
  Matrix a, b, c, d, aux, bias, scales;  // scales: a, b, d scale and amax (4 floats)
};

Case make_case(const Spec& s, std::mt19937_64& rng) {
  Case cs{s, {}, {}, {}, {}, {}, {}, {}};
  const bool col = s.order == CUBLASLT_ORDER_COL;
  auto matrix = [&](const char* name, cudaDataType_t t, int64_t r, int64_t c) {
    return make_matrix(name, t, r, c, (col ? r : c) + s.pad, s.order, s.batch, s.batch_gap);
  };
  cs.a = s.op_a == N ? matrix("A", s.a_type, s.m, s.k) : matrix("A", s.a_type, s.k, s.m);
  cs.b = s.op_b == N ? matrix("B", s.b_type, s.k, s.n) : matrix("B", s.b_type, s.n, s.k);
  cs.d = matrix("D", s.d_type, s.m, s.n);
  cs.c = s.c_mode == CMode::Separate ? matrix("C", s.c_type, s.m, s.n) : cs.d;
  fill_random(cs.a, rng);
  fill_random(cs.b, rng);
  if (s.c_mode != CMode::None) fill_random(s.c_mode == CMode::InPlace ? cs.d : cs.c, rng);
  const bool aux = s.epilogue == CUBLASLT_EPILOGUE_GELU_AUX ||
                   s.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
                   s.epilogue == CUBLASLT_EPILOGUE_DGELU;
  if (aux) {
    const int64_t ld = s.aux_ld ? s.aux_ld : s.m;
    cs.aux = make_matrix("aux", s.d_type, s.m, s.n, ld, CUBLASLT_ORDER_COL, s.batch, 8);
    if (s.epilogue == CUBLASLT_EPILOGUE_DGELU) fill_random(cs.aux, rng, 2.0f);
  }
  if (s.epilogue == CUBLASLT_EPILOGUE_BIAS || s.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
    cs.bias = make_matrix("bias", s.d_type, s.m, 1, s.m, CUBLASLT_ORDER_COL, s.batch, 0);
    fill_random(cs.bias, rng);
  } else if (s.epilogue == CUBLASLT_EPILOGUE_BGRADB) {
    cs.bias = make_matrix("bias", s.d_type, s.n, 1, s.n, CUBLASLT_ORDER_COL, s.batch, 0);
  }
  cs.scales = make_matrix("scales", F32, 4, 1, 4, CUBLASLT_ORDER_COL, 1, 0);
  const float scales[4] = {0.03125f, 1.75f, 0.375f, -1.0f};  // a, b, d scale; amax poisoned
  std::memcpy(cs.scales.ptr(), scales, sizeof(scales));
  for (Matrix* x : {&cs.a, &cs.b, &cs.c, &cs.d, &cs.aux, &cs.bias, &cs.scales})
    if (x->data) x->before.assign(x->data.get(), x->data.get() + x->bytes);
  return cs;
}

uint32_t alignment_of(const void* p) {
  uintptr_t address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

cublasLtMatrixLayout_t layout(const Matrix& x) {
  cublasLtMatrixLayout_t l = nullptr;
  cublasLtMatrixLayoutCreate(&l, x.type, x.rows, x.cols, x.ld);
  cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ORDER, &x.order, sizeof(x.order));
  cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &x.batch, sizeof(x.batch));
  cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &x.stride,
                                   sizeof(x.stride));
  return l;
}

template <typename V>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const V& v) {
  cublasLtMatmulDescSetAttribute(desc, attr, &v, sizeof(v));
}

// The descriptor as matmul.cu's LtGemm builds it, plus the batch strides and the D scale/amax.
cublasLtMatmulDesc_t describe(const Case& cs) {
  const Spec& s = cs.s;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatmulDescCreate(&desc, s.compute, CUDA_R_32F);
  set(desc, CUBLASLT_MATMUL_DESC_TRANSA, (int32_t)s.op_a);
  set(desc, CUBLASLT_MATMUL_DESC_TRANSB, (int32_t)s.op_b);
  set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, s.epilogue);
  const float* scales = static_cast<const float*>(cs.scales.ptr());
  if (cs.bias.data) set(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, (const void*)cs.bias.ptr());
  if (cs.aux.data) {
    set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, (const void*)cs.aux.ptr());
    set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, cs.aux.ld);
    set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, cs.aux.stride);
  }
  if (cs.bias.data) set(desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, cs.bias.stride);
  if (s.scales) set(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, scales);
  if (s.scales) set(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, scales + 1);
  if (s.d_scale) set(desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, scales + 2);
  if (s.amax) set(desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, (float*)scales + 3);
  return desc;
}

// The heuristic with matmul.cu's preferences, then the GEMM. Returns the status of the first
// call that failed.
cublasStatus_t run_case(cublasLtHandle_t lt, Case& cs, void* workspace, uint64_t workspace_bytes) {
  cublasLtMatmulDesc_t desc = describe(cs);
  cublasLtMatrixLayout_t la = layout(cs.a), lb = layout(cs.b), lc = layout(cs.c), ld = layout(cs.d);
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulPreferenceCreate(&pref);
  const uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  const uint32_t align[4] = {alignment_of(cs.a.ptr()), alignment_of(cs.b.ptr()),
                             alignment_of(cs.c.ptr()), alignment_of(cs.d.ptr())};
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                       &workspace_bytes, sizeof(workspace_bytes));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                       &reductions, sizeof(reductions));
  const cublasLtMatmulPreferenceAttributes_t align_attrs[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; i++)
    cublasLtMatmulPreferenceSetAttribute(pref, align_attrs[i], &align[i], sizeof(align[i]));
  cublasLtMatmulHeuristicResult_t r{};
  int returned = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, ld, pref, 1, &r, &returned);
  if (st == CUBLAS_STATUS_SUCCESS && returned == 1)
    st = cublasLtMatmul(lt, desc, &cs.s.alpha, cs.a.ptr(), la, cs.b.ptr(), lb, &cs.s.beta,
                        cs.c.ptr(), lc, cs.d.ptr(), ld, &r.algo, workspace, workspace_bytes,
                        nullptr);
  cublasLtMatmulPreferenceDestroy(pref);
  for (cublasLtMatrixLayout_t l : {la, lb, lc, ld}) cublasLtMatrixLayoutDestroy(l);
  cublasLtMatmulDescDestroy(desc);
  return st;
}

// The case's arrays (before and after the call) as raw files, and its entry in the manifest.
std::string write_case(const std::string& dir, int index, const Case& cs) {
  const Spec& s = cs.s;
  char head[512];
  std::snprintf(head, sizeof(head),
                "{\"name\": \"%s\", \"op_a\": %d, \"op_b\": %d, \"m\": %lld, \"n\": %lld, "
                "\"k\": %lld, \"compute\": %d, \"epilogue\": %u, \"alpha\": %.9g, \"beta\": %.9g, "
                "\"c_mode\": %d, \"scales\": %d, \"d_scale\": %d, \"amax\": %d, \"arrays\": {",
                s.name, (int)s.op_a, (int)s.op_b, (long long)s.m, (long long)s.n, (long long)s.k,
                (int)s.compute, s.epilogue, s.alpha, s.beta, (int)s.c_mode, s.scales, s.d_scale,
                s.amax);
  std::string entry = head;
  bool first = true;
  for (const Matrix* x : {&cs.a, &cs.b, &cs.c, &cs.d, &cs.aux, &cs.bias, &cs.scales}) {
    if (!x->data || (x == &cs.c && s.c_mode != CMode::Separate)) continue;
    const std::string file = "case" + std::to_string(index) + "_" + x->name;
    FILE* f = std::fopen((dir + "/" + file + ".before").c_str(), "wb");
    std::fwrite(x->before.data(), 1, x->bytes, f);
    std::fclose(f);
    f = std::fopen((dir + "/" + file + ".after").c_str(), "wb");
    std::fwrite(x->data.get(), 1, x->bytes, f);
    std::fclose(f);
    char item[320];
    std::snprintf(item, sizeof(item),
                  "%s\"%s\": {\"file\": \"%s\", \"type\": %d, \"rows\": %lld, \"cols\": %lld, "
                  "\"ld\": %lld, \"order\": %d, \"batch\": %d, \"stride\": %lld}",
                  first ? "" : ", ", x->name.c_str(), file.c_str(), (int)x->type,
                  (long long)x->rows, (long long)x->cols, (long long)x->ld, x->order, x->batch,
                  (long long)x->stride);
    entry += item;
    first = false;
  }
  return entry + "}}";
}

// Runs every case; returns how many did not run with CUBLAS_STATUS_SUCCESS.
int run_all_cases(const std::string& dir, std::mt19937_64& rng) {
  cublasLtHandle_t lt = nullptr;
  cublasLtCreate(&lt);
  const uint64_t workspace_bytes = 1 << 20;
  std::vector<uint8_t> workspace(workspace_bytes);
  std::string manifest = "[\n";
  int failed = 0, index = 0;
  for (const Spec& s : all_specs()) {
    Case cs = make_case(s, rng);
    const cublasStatus_t st = run_case(lt, cs, workspace.data(), workspace_bytes);
    if (st != CUBLAS_STATUS_SUCCESS) {
      std::printf("FAIL case %s: status %d\n", s.name, (int)st);
      ++failed;
    }
    manifest += (index ? ",\n" : "") + write_case(dir, index, cs);
    ++index;
  }
  FILE* f = std::fopen((dir + "/manifest.json").c_str(), "w");
  std::fprintf(f, "%s\n]\n", manifest.c_str());
  std::fclose(f);
  cublasLtDestroy(lt);
  return failed;
}

}  // namespace
