// test/emu/lib/cublaslt.cpp - the cuBLASLt stand-in of the emulated CUDA build: the functions
// cublasLt.h declares that kernels/cuda/matmul.cu and runtime.cu call, defined over host memory
// (emulated device memory is host memory; a GEMM is queued on its stream like a kernel,
// test/emu/include/emu_streams.h). This file is the API: handles, the three descriptor kinds
// and their attributes, the heuristic query and the checks of cublasLtMatmul. The arithmetic is in
// cublaslt_matmul.cpp.
//
// The subset (test/emu/LIBRARIES.md has the full table): column- or row-major layouts with any
// leading dimension, strided batches; ops N and T; fp32 GEMMs (compute 32F or 32F_FAST_TF32),
// bf16 x bf16 -> bf16 or fp32, FP8 x FP8 (not E5M2 x E5M2, "TN" only, as on sm_90) -> bf16, fp32
// or FP8 with A/B/D scale pointers and AMAX_D; epilogues DEFAULT, BIAS, GELU_AUX, GELU_AUX_BIAS,
// DGELU and BGRADB with their bias/aux pointers, aux leading dimension and batch strides. Every
// other attribute, value or combination is refused when it is set or when the problem is
// described, with the status cuBLASLt documents (INVALID_VALUE for an inconsistent problem,
// NOT_SUPPORTED for what has no algorithm) and a line on stderr saying what was asked: nothing is
// silently ignored.
//
// The heuristic returns one algorithm, which needs min(4 KiB, the preference's workspace limit)
// of workspace and overwrites it in every cublasLtMatmul, and remembers the alignments it was
// asked to assume: the minimum alignments of the
// preference for A, B, C and D (256 bytes by default, as in cuBLASLt) and the actual alignment of
// the bias and aux pointers in the descriptor (cuBLASLt documents that the heuristic reads their
// values for that). cublasLtMatmul refuses pointers less aligned than the algorithm assumed, which
// on a GPU would be a misaligned access or a wrong result.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>

#include "test/emu/include/emu_counts.h"
#include "test/emu/include/emu_streams.h"
#include "test/emu/lib/cublaslt_state.h"

using namespace cublaslt_standin;

struct cublasLtContext {
  uint32_t magic;
};

namespace {

constexpr uint32_t kHandleMagic = 0x4c544843, kLayoutMagic = 0x4c54434c;
constexpr uint32_t kDescMagic = 0x4c544d44, kPrefMagic = 0x4c545052;

template <typename T, typename H>
T* unwrap(H handle, uint32_t magic) {
  T* p = reinterpret_cast<T*>(handle);
  return p && p->magic == magic ? p : nullptr;
}
Layout* layout_of(cublasLtMatrixLayout_t l) { return unwrap<Layout>(l, kLayoutMagic); }
MatmulDesc* desc_of(cublasLtMatmulDesc_t d) { return unwrap<MatmulDesc>(d, kDescMagic); }
Preference* pref_of(cublasLtMatmulPreference_t p) { return unwrap<Preference>(p, kPrefMagic); }

// Copies an attribute's value after checking its size, as cuBLASLt does.
template <typename T>
cublasStatus_t take(T* field, const void* buf, size_t size, const char* function, int attr) {
  if (!buf || size != sizeof(T))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, function,
                  "attribute " + std::to_string(attr) + " given " + std::to_string(size) +
                      " bytes, it takes " + std::to_string(sizeof(T)));
  std::memcpy(field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

bool is_fp8(cudaDataType_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Shared helpers (declared in cublaslt_state.h)
// ---------------------------------------------------------------------------------------------
namespace cublaslt_standin {

size_t type_size(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16BF: return 2;
    case CUDA_R_8F_E4M3:
    case CUDA_R_8F_E5M2: return 1;
    default: return 0;
  }
}

const char* type_name(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F: return "CUDA_R_32F";
    case CUDA_R_16BF: return "CUDA_R_16BF";
    case CUDA_R_16F: return "CUDA_R_16F";
    case CUDA_R_8F_E4M3: return "CUDA_R_8F_E4M3";
    case CUDA_R_8F_E5M2: return "CUDA_R_8F_E5M2";
    default: return "another data type";
  }
}

uint32_t alignment_of(const void* p) {
  uintptr_t address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

int64_t element_offset(const Layout& l, int64_t i, int64_t j, int64_t batch) {
  const int64_t within = l.order == CUBLASLT_ORDER_COL ? i + j * l.ld : i * l.ld + j;
  return batch * l.batch_stride + within;
}

cublasStatus_t refuse(cublasStatus_t status, const char* function, const std::string& what) {
  std::fprintf(stderr, "cuBLASLt stand-in: %s: %s (status %d)\n", function, what.c_str(),
               (int)status);
  return status;
}

}  // namespace cublaslt_standin

// ---------------------------------------------------------------------------------------------
// Handle
// ---------------------------------------------------------------------------------------------
cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasLtContext{kHandleMagic};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (!handle || handle->magic != kHandleMagic) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->magic = 0;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasLtGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_(not produced by the stand-in)";
  }
}
const char* cublasLtGetStatusString(cublasStatus_t status) { return cublasLtGetStatusName(status); }

// ---------------------------------------------------------------------------------------------
// Matrix layouts
// ---------------------------------------------------------------------------------------------
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* out, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (!out) return CUBLAS_STATUS_INVALID_VALUE;
  Layout* l = new Layout{kLayoutMagic, type, CUBLASLT_ORDER_COL, rows, cols, ld, 1, 0};
  *out = reinterpret_cast<cublasLtMatrixLayout_t>(l);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t handle) {
  Layout* l = layout_of(handle);
  if (!l) return CUBLAS_STATUS_INVALID_VALUE;
  l->magic = 0;
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t handle,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t size) {
  const char* fn = "cublasLtMatrixLayoutSetAttribute";
  Layout* l = layout_of(handle);
  if (!l) return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "not a layout");
  int64_t zero = 0;
  uint32_t type = 0;
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE:
      st = take(&type, buf, size, fn, attr);
      l->type = (cudaDataType_t)type;
      return st;
    case CUBLASLT_MATRIX_LAYOUT_ORDER:
      if ((st = take(&l->order, buf, size, fn, attr)) != CUBLAS_STATUS_SUCCESS) return st;
      if (l->order == CUBLASLT_ORDER_COL || l->order == CUBLASLT_ORDER_ROW) return st;
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "order " + std::to_string(l->order) +
                                                         " (only COL and ROW are implemented)");
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return take(&l->rows, buf, size, fn, attr);
    case CUBLASLT_MATRIX_LAYOUT_COLS: return take(&l->cols, buf, size, fn, attr);
    case CUBLASLT_MATRIX_LAYOUT_LD: return take(&l->ld, buf, size, fn, attr);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return take(&l->batch_count, buf, size, fn, attr);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
      return take(&l->batch_stride, buf, size, fn, attr);
    case CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET:
      if ((st = take(&zero, buf, size, fn, attr)) != CUBLAS_STATUS_SUCCESS || zero == 0) return st;
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "planar complex layouts");
    default:
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                    "layout attribute " + std::to_string(attr) + " is not implemented");
  }
}

// ---------------------------------------------------------------------------------------------
// Matmul descriptors
// ---------------------------------------------------------------------------------------------
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* out, cublasComputeType_t compute,
                                        cudaDataType_t scale_type) {
  if (!out) return CUBLAS_STATUS_INVALID_VALUE;
  MatmulDesc* d = new MatmulDesc{};
  d->magic = kDescMagic;
  d->compute = compute;
  d->scale_type = scale_type;
  d->pointer_mode = CUBLASLT_POINTER_MODE_HOST;
  d->trans_a = d->trans_b = CUBLAS_OP_N;
  d->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  d->bias_type = d->aux_type = -1;
  *out = reinterpret_cast<cublasLtMatmulDesc_t>(d);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t handle) {
  MatmulDesc* d = desc_of(handle);
  if (!d) return CUBLAS_STATUS_INVALID_VALUE;
  d->magic = 0;
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}

namespace {

// The value of an attribute that must be one of a few values.
template <typename T>
cublasStatus_t take_one_of(T* field, const void* buf, size_t size, int attr,
                           std::initializer_list<T> allowed, const char* what) {
  const char* fn = "cublasLtMatmulDescSetAttribute";
  T value{};
  cublasStatus_t st = take(&value, buf, size, fn, attr);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  for (T a : allowed)
    if (value == a) {
      *field = value;
      return st;
    }
  return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                std::string(what) + " " + std::to_string((long long)value) + " is not implemented");
}

cublasStatus_t set_epilogue(MatmulDesc* d, const void* buf, size_t size, int attr) {
  return take_one_of<uint32_t>(
      &d->epilogue, buf, size, attr,
      {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_GELU_AUX,
       CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUBLASLT_EPILOGUE_DGELU, CUBLASLT_EPILOGUE_BGRADB},
      "epilogue (DEFAULT, BIAS, GELU_AUX, GELU_AUX_BIAS, DGELU and BGRADB are)");
}

}  // namespace

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t handle,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
  const char* fn = "cublasLtMatmulDescSetAttribute";
  MatmulDesc* d = desc_of(handle);
  if (!d) return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "not a matmul descriptor");
  int32_t fixed = 0;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return take(&d->compute, buf, size, fn, attr);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return take(&d->scale_type, buf, size, fn, attr);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
      return take_one_of<int32_t>(&d->pointer_mode, buf, size, attr,
                                  {CUBLASLT_POINTER_MODE_HOST, CUBLASLT_POINTER_MODE_DEVICE},
                                  "pointer mode (HOST and DEVICE are)");
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return take_one_of<int32_t>(&d->trans_a, buf, size, attr, {CUBLAS_OP_N, CUBLAS_OP_T},
                                  "TRANSA (N and T are)");
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return take_one_of<int32_t>(&d->trans_b, buf, size, attr, {CUBLAS_OP_N, CUBLAS_OP_T},
                                  "TRANSB (N and T are)");
    case CUBLASLT_MATMUL_DESC_TRANSC:
      return take_one_of<int32_t>(&fixed, buf, size, attr, {CUBLAS_OP_N}, "TRANSC (N is)");
    case CUBLASLT_MATMUL_DESC_FILL_MODE:
      return take_one_of<int32_t>(&fixed, buf, size, attr, {CUBLAS_FILL_MODE_FULL},
                                  "fill mode (FULL is)");
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return set_epilogue(d, buf, size, attr);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return take(&d->bias, buf, size, fn, attr);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return take(&d->bias_type, buf, size, fn, attr);
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE:
      return take(&d->bias_batch_stride, buf, size, fn, attr);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return take(&d->aux, buf, size, fn, attr);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return take(&d->aux_ld, buf, size, fn, attr);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE:
      return take(&d->aux_batch_stride, buf, size, fn, attr);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE:
      return take(&d->aux_type, buf, size, fn, attr);
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: return take(&d->a_scale, buf, size, fn, attr);
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: return take(&d->b_scale, buf, size, fn, attr);
    case CUBLASLT_MATMUL_DESC_D_SCALE_POINTER: return take(&d->d_scale, buf, size, fn, attr);
    case CUBLASLT_MATMUL_DESC_AMAX_D_POINTER: return take(&d->amax_d, buf, size, fn, attr);
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM:
      return take_one_of<int8_t>(&d->fast_accum, buf, size, attr, {0, 1}, "fast accumulation");
    default:
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                    "matmul attribute " + std::to_string(attr) + " is not implemented");
  }
}

// ---------------------------------------------------------------------------------------------
// Preferences
// ---------------------------------------------------------------------------------------------
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* out) {
  if (!out) return CUBLAS_STATUS_INVALID_VALUE;
  Preference* p = new Preference{kPrefMagic, 0, CUBLASLT_REDUCTION_SCHEME_MASK, {256, 256, 256, 256}};
  *out = reinterpret_cast<cublasLtMatmulPreference_t>(p);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t handle) {
  Preference* p = pref_of(handle);
  if (!p) return CUBLAS_STATUS_INVALID_VALUE;
  p->magic = 0;
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t handle,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
  const char* fn = "cublasLtMatmulPreferenceSetAttribute";
  Preference* p = pref_of(handle);
  if (!p) return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "not a preference");
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return take(&p->max_workspace, buf, size, fn, attr);
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
      return take(&p->reduction_mask, buf, size, fn, attr);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return take(&p->min_align[0], buf, size, fn, attr);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return take(&p->min_align[1], buf, size, fn, attr);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return take(&p->min_align[2], buf, size, fn, attr);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return take(&p->min_align[3], buf, size, fn, attr);
    default:
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                    "preference attribute " + std::to_string(attr) + " is not implemented");
  }
}

// ---------------------------------------------------------------------------------------------
// The heuristic: one algorithm, no workspace, the alignments it may assume
// ---------------------------------------------------------------------------------------------
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
    cublasLtMatmulPreference_t preference, int requested, cublasLtMatmulHeuristicResult_t* results,
    int* returned) {
  const char* fn = "cublasLtMatmulAlgoGetHeuristic";
  if (returned) *returned = 0;
  if (!handle || handle->magic != kHandleMagic) return CUBLAS_STATUS_NOT_INITIALIZED;
  const Preference* pref = pref_of(preference);
  if (!pref || requested < 1 || !results || !returned)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "bad preference, count or result pointers");
  Problem p;
  std::string why;
  cublasStatus_t st = describe_problem(desc_of(desc), layout_of(a), layout_of(b), layout_of(c),
                                       layout_of(d), &p, &why);
  if (st != CUBLAS_STATUS_SUCCESS) return refuse(st, fn, why);
  const bool fp8 = is_fp8(p.a->type);
  for (int i = 0; i < 4; i++)
    if (fp8 && pref->min_align[i] < 16)
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                    "FP8 GEMMs need 16-byte aligned matrices; the preference allows " +
                        std::to_string(pref->min_align[i]) + " for matrix " + "ABCD"[i]);
  cublasLtMatmulHeuristicResult_t r{};
  r.algo.data[kWordMagic] = kAlgoMagic;
  for (int i = 0; i < 4; i++) r.algo.data[kWordAlignA + i] = pref->min_align[i];
  r.algo.data[kWordAlignBias] = p.desc->bias ? alignment_of(p.desc->bias) : 256;
  r.algo.data[kWordAlignAux] = p.desc->aux ? alignment_of(p.desc->aux) : 256;
  r.workspaceSize = std::min(pref->max_workspace, kWorkspaceUse);  // within the limit asked for
  r.algo.data[kWordWorkspace] = r.workspaceSize;
  r.state = CUBLAS_STATUS_SUCCESS;
  r.wavesCount = 1.0f;
  results[0] = r;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// The GEMM
// ---------------------------------------------------------------------------------------------
namespace {

// What one call computes and moves by cuBLASLt's documented semantics (EMU_COUNTS,
// test/emu/counts.cpp), named by its shape (m x n x k of D = op(A) op(B)): 2 M N K FLOPs per matrix of the batch; A, B and D once each, C when
// beta != 0, the bias vector (read by BIAS and GELU_AUX_BIAS, written by BGRADB: one element
// per row of D, or per column of op(B) for BGRADB), the GELU aux matrix (written by GELU_AUX*,
// read by DGELU).
emu::LibraryCall gemm_counts(const Problem& p, float beta) {
  const MatmulDesc& d = *p.desc;
  const double batches = (double)p.batches, m = (double)p.m, n = (double)p.n, k = (double)p.k;
  double read = batches * (m * k * type_size(p.a->type) + k * n * type_size(p.b->type));
  double written = batches * m * n * type_size(p.d->type);
  if (beta != 0.0f && p.c) read += batches * m * n * type_size(p.c->type);
  const uint32_t e = d.epilogue;
  if (e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS)
    read += batches * m * type_size(p.bias_type);
  if (e == CUBLASLT_EPILOGUE_BGRADB) written += batches * n * type_size(p.bias_type);
  if (e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS)
    written += batches * m * n * type_size(p.aux_type);
  if (e == CUBLASLT_EPILOGUE_DGELU) read += batches * m * n * type_size(p.aux_type);
  std::string name = "cublasLtMatmul " + std::to_string(p.m) + "x" + std::to_string(p.n) + "x" +
                     std::to_string(p.k);
  if (p.batches > 1) name += "x" + std::to_string(p.batches);
  return {name, 2.0 * batches * m * n * k, read, written, 0.0};
}

}  // namespace

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                              const void* alpha, const void* A, cublasLtMatrixLayout_t a,
                              const void* B, cublasLtMatrixLayout_t b, const void* beta,
                              const void* C, cublasLtMatrixLayout_t c, void* D,
                              cublasLtMatrixLayout_t d, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const char* fn = "cublasLtMatmul";
  if (!handle || handle->magic != kHandleMagic) return CUBLAS_STATUS_NOT_INITIALIZED;
  Problem p;
  std::string why;
  cublasStatus_t st = describe_problem(desc_of(desc), layout_of(a), layout_of(b), layout_of(c),
                                       layout_of(d), &p, &why);
  if (st != CUBLAS_STATUS_SUCCESS) return refuse(st, fn, why);
  if (!alpha || !beta) return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "alpha or beta is null");
  if (workspace_bytes > 0 && !workspace)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "a workspace size without a workspace");
  const uint64_t needed = algo && algo->data[kWordMagic] == kAlgoMagic ? algo->data[kWordWorkspace] : 0;
  if (workspace_bytes < needed)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, fn,
                  "workspace of " + std::to_string(workspace_bytes) + " bytes; the algorithm needs " +
                      std::to_string(needed));
  const float alpha_value = *static_cast<const float*>(alpha);
  const float beta_value = *static_cast<const float*>(beta);
  st = check_pointers(p, algo, alpha_value, beta_value, A, B, C, D, &why);
  if (st != CUBLAS_STATUS_SUCCESS) return refuse(st, fn, why);
  // Queued on the stream with copies of the descriptors (the caller may change or destroy them
  // once the call returns, as cuBLASLt allows) and the scale factors read now (host pointers).
  struct Call {
    MatmulDesc desc;
    Layout a, b, c, d;
    Problem p;
  };
  auto call = std::make_shared<Call>();
  call->desc = *p.desc;
  call->p = p;
  call->p.desc = &call->desc;
  const Layout* const given[4] = {p.a, p.b, p.c, p.d};
  Layout* const copies[4] = {&call->a, &call->b, &call->c, &call->d};
  const Layout** const slots[4] = {&call->p.a, &call->p.b, &call->p.c, &call->p.d};
  for (int i = 0; i < 4; i++)
    if (given[i]) {
      *copies[i] = *given[i];
      *slots[i] = copies[i];
    }
  emu::submit(stream, fn, [call, workspace, needed, alpha_value, A, B, beta_value, C, D] {
    emu::note_library_call(gemm_counts(call->p, beta_value));  // EMU_COUNTS
    std::memset(workspace, 0xA5, needed);  // what a kernel using its workspace would do
    run_matmul(call->p, alpha_value, A, B, beta_value, C, D);
    return true;
  });
  return CUBLAS_STATUS_SUCCESS;
}
