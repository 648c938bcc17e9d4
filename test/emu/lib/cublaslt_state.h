// test/emu/lib/cublaslt_state.h - what the cuBLASLt stand-in keeps behind its opaque handles, and
// the problem one cublasLtMatmul call describes once its descriptors are read. Shared by
// cublaslt.cpp (the API: descriptors, attributes, the heuristic, the checks) and
// cublaslt_matmul.cpp (the arithmetic). See test/emu/LIBRARIES.md for the subset implemented.
#pragma once
#include <cublasLt.h>

#include <cstdint>
#include <string>

namespace cublaslt_standin {

// A matrix layout: CUBLASLT_MATRIX_LAYOUT_* as set by the caller.
struct Layout {
  uint32_t magic;
  cudaDataType_t type;
  int32_t order;  // CUBLASLT_ORDER_COL or CUBLASLT_ORDER_ROW
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch_count;
  int64_t batch_stride;  // elements between consecutive matrices of a batch
};

// A matmul descriptor: every CUBLASLT_MATMUL_DESC_* attribute the stand-in implements.
struct MatmulDesc {
  uint32_t magic;
  cublasComputeType_t compute;
  cudaDataType_t scale_type;
  int32_t pointer_mode;
  int32_t trans_a, trans_b;
  uint32_t epilogue;
  const void* bias;
  int32_t bias_type;  // -1: the default (the type of D)
  int64_t bias_batch_stride;
  const void* aux;
  int64_t aux_ld;
  int64_t aux_batch_stride;
  int32_t aux_type;  // -1: the default (the type of D)
  const float* a_scale;
  const float* b_scale;
  const float* d_scale;
  float* amax_d;
  int8_t fast_accum;
};

// A preference: the workspace limit and the minimum alignments the algorithm may assume.
struct Preference {
  uint32_t magic;
  uint64_t max_workspace;
  uint32_t reduction_mask;
  uint32_t min_align[4];  // A, B, C, D in bytes; cuBLASLt's default is 256
};

// One GEMM with every pointer and number it needs, after validation:
//   D[b] = epilogue(alpha * sa * sb * op(A[b]) op(B[b]) + beta * C[b] (+ bias)), column or row
// major per layout, with the aux matrix and bias vector of the epilogue.
struct Problem {
  const MatmulDesc* desc;
  const Layout *a, *b, *c, *d;
  int64_t m, n, k, batches;
  cudaDataType_t bias_type, aux_type;
};

// The byte size of one element of a type the stand-in handles (0 for any other type).
size_t type_size(cudaDataType_t t);
// The name of a data type, for messages ("CUDA_R_16BF").
const char* type_name(cudaDataType_t t);
// Offset in elements of element (i, j) of matrix `batch` of a layout.
int64_t element_offset(const Layout& l, int64_t i, int64_t j, int64_t batch);

// The algorithm's words (cublasLtMatmulAlgo_t::data): a magic number, the alignments in bytes
// the heuristic was asked to assume for A, B, C, D, the bias and the aux matrix, and the
// workspace it needs: as much of the allowed workspace as kWorkspaceUse, which cublasLtMatmul
// then overwrites (so a workspace shared with live data, or smaller than promised, shows).
constexpr uint64_t kAlgoMagic = 0x656d752d6c742d31ull;  // "emu-lt-1"
enum AlgoWord { kWordMagic = 0, kWordAlignA = 1, kWordAlignBias = 5, kWordAlignAux = 6,
                kWordWorkspace = 7 };
constexpr uint64_t kWorkspaceUse = 4096;

// The largest power of two up to 256 dividing the address (what cuBLASLt calls its alignment).
uint32_t alignment_of(const void* p);

// Checks the descriptors of one call and fills `p`; CUBLAS_STATUS_SUCCESS, or the status cuBLASLt
// documents for the problem (INVALID_VALUE for inconsistent shapes, NOT_SUPPORTED for what the
// stand-in, or cuBLASLt on sm_90, does not do) with `why` saying what was asked.
cublasStatus_t describe_problem(const MatmulDesc* desc, const Layout* a, const Layout* b,
                                const Layout* c, const Layout* d, Problem* p, std::string* why);

// Checks the pointers of one cublasLtMatmul call against its problem and the algorithm the
// heuristic returned (nullptr: none given): present where needed, aligned as assumed, and not
// overlapping where a GPU would race (an output over an input, two outputs over each other).
cublasStatus_t check_pointers(const Problem& p, const cublasLtMatmulAlgo_t* algo, float alpha,
                              float beta, const void* A, const void* B, const void* C,
                              const void* D, std::string* why);

// Computes the GEMM of `p` on host memory (cublaslt_matmul.cpp). The pointers were checked.
void run_matmul(const Problem& p, float alpha, const void* A, const void* B, float beta,
                const void* C, void* D);

// Prints "cuBLASLt stand-in: <function>: <what>" on stderr and returns status.
cublasStatus_t refuse(cublasStatus_t status, const char* function, const std::string& what);

}  // namespace cublaslt_standin
