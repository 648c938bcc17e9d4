// test/emu/test_cublaslt.cpp - drives the cuBLASLt stand-in (test/emu/lib/cublaslt*.cpp) the way
// kernels/cuda/matmul.cu does, and writes every input and output to files that
// test/emu/test_cublaslt.py checks against a numpy float64 formulation.
//
//   test_cublaslt OUT_DIR SEED     runs every case, writes OUT_DIR/manifest.json and the arrays,
//                                  runs the refusal checks and exits 1 if any failed
//
// The cases are matmul.cu's GEMMs (forward "TN" with BIAS, GELU_AUX, GELU_AUX_BIAS or a residual
// as C; dinp "NN" with DGELU; dweight "NT" accumulating into fp32 with BGRADB; the FP8 "TN"
// GEMMs with A/B scales, bf16 or accumulating fp32 output) at awkward sizes, plus what the
// stand-in implements beyond them: TF32, leading dimensions larger than the rows, row-major
// layouts, strided batches with bias and aux batch strides, alpha/beta, an FP8 output with
// D_SCALE and AMAX_D. Every output buffer is poisoned first (NaN, or 0xFF bytes) including the
// padding between columns, so the script also sees that nothing outside the matrices is written
// and that C is not read when beta == 0. Descriptors are set up in matmul.cu's order (LtGemm),
// with the pointers' actual alignments as the heuristic's minimum alignments.
//
// The refusal checks need no reference: each asks for something the stand-in must refuse (an
// unimplemented epilogue, E5M2 x E5M2, an FP8 "NN" GEMM, an aux ld that is not a multiple of 8,
// an attribute of the wrong size, a pointer less aligned than its algorithm assumed, D over A,
// BGRADB with alpha != 1 ...) and expects the documented status.
#include <cublasLt.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "test/emu/cublaslt_cases.h"

namespace {

int failures = 0;
void expect(bool ok, const std::string& what) {
  if (!ok) ++failures;
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
}

// ---------------------------------------------------------------------------------------------
// Refusals: each must fail with the named status
// ---------------------------------------------------------------------------------------------
struct Setup {  // a small valid bf16 GEMM, "TN", m = 16, n = 8, k = 16, to be spoiled
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  Setup(cudaDataType_t ab = CUDA_R_16BF, cudaDataType_t cd = CUDA_R_16BF,
        cublasOperation_t op_a = CUBLAS_OP_T, cublasOperation_t op_b = CUBLAS_OP_N,
        cudaDataType_t b_type = (cudaDataType_t)-1) {
    cublasLtCreate(&lt);
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    int32_t ta = op_a, tb = op_b;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
    const bool b_n = op_b == CUBLAS_OP_N;  // A is 16 x 16 either way; op(B) is 16 x 8
    cublasLtMatrixLayoutCreate(&a, ab, 16, 16, 16);
    cublasLtMatrixLayoutCreate(&b, b_type == (cudaDataType_t)-1 ? ab : b_type, b_n ? 16 : 8,
                               b_n ? 8 : 16, 16);
    cublasLtMatrixLayoutCreate(&c, cd, 16, 8, 16);
    cublasLtMatrixLayoutCreate(&d, cd, 16, 8, 16);
    cublasLtMatmulPreferenceCreate(&pref);
  }
  ~Setup() {
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(d);
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(lt);
  }
  cublasStatus_t heuristic(cublasLtMatmulHeuristicResult_t* r = nullptr) {
    cublasLtMatmulHeuristicResult_t local{};
    int returned = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, desc, a, b, c, d, pref, 1,
                                                       r ? r : &local, &returned);
    return st == CUBLAS_STATUS_SUCCESS && returned != 1 ? CUBLAS_STATUS_EXECUTION_FAILED : st;
  }
  template <typename V>
  cublasStatus_t set(cublasLtMatmulDescAttributes_t attr, V value) {
    return cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value));
  }
  cublasStatus_t matmul(const void* A, const void* B, void* D, float alpha = 1.0f,
                        const cublasLtMatmulHeuristicResult_t* r = nullptr) {
    const float beta = 0.0f;
    return cublasLtMatmul(lt, desc, &alpha, A, a, B, b, &beta, D, c, D, d, r ? &r->algo : nullptr,
                          nullptr, 0, nullptr);
  }
};

void refusals_of_attributes() {
  {
    Setup s;
    expect(s.set(CUBLASLT_MATMUL_DESC_EPILOGUE, (uint32_t)CUBLASLT_EPILOGUE_RELU) ==
               CUBLAS_STATUS_NOT_SUPPORTED, "refuses the RELU epilogue");
    expect(s.set(CUBLASLT_MATMUL_DESC_EPILOGUE, (uint32_t)CUBLASLT_EPILOGUE_BGRADA) ==
               CUBLAS_STATUS_NOT_SUPPORTED, "refuses BGRADA (the project does not use it)");
    expect(s.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, (int32_t)16) ==
               CUBLAS_STATUS_INVALID_VALUE, "refuses an int32 for the int64 aux ld");
    expect(s.set(CUBLASLT_MATMUL_DESC_TRANSA, (int32_t)CUBLAS_OP_C) ==
               CUBLAS_STATUS_NOT_SUPPORTED, "refuses op C");
    expect(s.set(CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE, (int64_t)0) ==
               CUBLAS_STATUS_NOT_SUPPORTED, "refuses an unimplemented attribute");
    int32_t order = CUBLASLT_ORDER_COL32;
    expect(cublasLtMatrixLayoutSetAttribute(s.a, CUBLASLT_MATRIX_LAYOUT_ORDER, &order,
                                            sizeof(order)) == CUBLAS_STATUS_NOT_SUPPORTED,
           "refuses the COL32 order");
  }
  {
    Setup s;  // DGELU with aux ld 20: not a multiple of 8
    s.set(CUBLASLT_MATMUL_DESC_EPILOGUE, (uint32_t)CUBLASLT_EPILOGUE_DGELU);
    s.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, (int64_t)20);
    expect(s.heuristic() == CUBLAS_STATUS_INVALID_VALUE, "refuses aux ld 20 (not a multiple of 8)");
    s.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, (int64_t)8);
    expect(s.heuristic() == CUBLAS_STATUS_INVALID_VALUE, "refuses aux ld 8 < m = 16");
  }
  {
    Setup s;
    s.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, (const float*)&failures);
    expect(s.heuristic() == CUBLAS_STATUS_INVALID_VALUE, "refuses an A scale on a bf16 GEMM");
  }
}

void refusals_of_problems() {
  {
    Setup s(CUDA_R_8F_E5M2, CUDA_R_16BF);
    expect(s.heuristic() == CUBLAS_STATUS_NOT_SUPPORTED, "refuses E5M2 x E5M2");
  }
  {
    Setup s(CUDA_R_8F_E4M3, CUDA_R_16BF, CUBLAS_OP_N, CUBLAS_OP_N);
    expect(s.heuristic() == CUBLAS_STATUS_NOT_SUPPORTED, "refuses an FP8 NN GEMM (sm_90: TN)");
  }
  {
    Setup s(CUDA_R_8F_E4M3, CUDA_R_16BF);
    s.set(CUBLASLT_MATMUL_DESC_EPILOGUE, (uint32_t)CUBLASLT_EPILOGUE_BIAS);
    expect(s.heuristic() == CUBLAS_STATUS_NOT_SUPPORTED, "refuses an epilogue on FP8 inputs");
  }
  {
    Setup s(CUDA_R_16BF, CUDA_R_16BF, CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_32F);
    expect(s.heuristic() == CUBLAS_STATUS_NOT_SUPPORTED, "refuses bf16 x fp32");
  }
  {
    Setup s;
    cublasLtMatrixLayoutDestroy(s.d);
    cublasLtMatrixLayoutCreate(&s.d, CUDA_R_16BF, 16, 9, 16);
    expect(s.heuristic() == CUBLAS_STATUS_INVALID_VALUE, "refuses C 16x8 with D 16x9");
  }
}

void refusals_of_pointers() {
  alignas(256) static uint16_t buf[4096];
  {
    Setup s;  // the heuristic assumed 256-byte alignment (the default); A is only 2-byte aligned
    cublasLtMatmulHeuristicResult_t r{};
    expect(s.heuristic(&r) == CUBLAS_STATUS_SUCCESS, "a valid bf16 GEMM has an algorithm");
    expect(s.matmul(buf + 1, buf + 512, buf + 1024, 1.0f, &r) == CUBLAS_STATUS_INVALID_VALUE,
           "refuses A less aligned than its algorithm assumed");
    expect(s.matmul(buf, buf + 512, buf + 1024, 1.0f, &r) == CUBLAS_STATUS_SUCCESS,
           "runs the same call with aligned pointers");
    expect(s.matmul(buf, buf + 512, buf + 128, 1.0f, &r) == CUBLAS_STATUS_INVALID_VALUE,
           "refuses D overlapping A");
    expect(r.workspaceSize == 0, "needs no workspace when the preference allows none");
    const uint64_t allowed = 1000;
    cublasLtMatmulPreferenceSetAttribute(s.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                         &allowed, sizeof(allowed));
    expect(s.heuristic(&r) == CUBLAS_STATUS_SUCCESS && r.workspaceSize > 0 &&
               r.workspaceSize <= allowed, "needs a workspace within the preference's limit");
    expect(s.matmul(buf, buf + 512, buf + 1024, 1.0f, &r) == CUBLAS_STATUS_INVALID_VALUE,
           "refuses a call without the workspace its algorithm needs");
  }
  {
    Setup s;  // a GELU aux output over D
    s.set(CUBLASLT_MATMUL_DESC_EPILOGUE, (uint32_t)CUBLASLT_EPILOGUE_GELU_AUX);
    s.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, (void*)(buf + 1024));
    s.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, (int64_t)16);
    expect(s.matmul(buf, buf + 512, buf + 1024) == CUBLAS_STATUS_INVALID_VALUE,
           "refuses a GELU aux output on top of D");
  }
  {
    Setup s(CUDA_R_16BF, CUDA_R_32F, CUBLAS_OP_N, CUBLAS_OP_T);
    s.set(CUBLASLT_MATMUL_DESC_EPILOGUE, (uint32_t)CUBLASLT_EPILOGUE_BGRADB);
    s.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, (void*)(buf + 3072));
    expect(s.matmul(buf, buf + 512, buf + 1024, 2.0f) == CUBLAS_STATUS_NOT_SUPPORTED,
           "refuses BGRADB with alpha = 2");
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: test_cublaslt OUT_DIR SEED\n");
    return 2;
  }
  const std::string dir = argv[1];
  std::mt19937_64 rng(std::strtoull(argv[2], nullptr, 10));
  const int case_failures = run_all_cases(dir, rng);
  expect(case_failures == 0, "every case ran with CUBLAS_STATUS_SUCCESS");
  refusals_of_attributes();
  refusals_of_problems();
  refusals_of_pointers();
  std::printf("test_cublaslt: %d failures (the numbers are checked by test_cublaslt.py)\n",
              failures);
  return failures == 0 ? 0 : 1;
}
