// test/emu/lib/cublaslt_problem.cpp - what one cublasLtMatmul call asks for, read from its
// descriptors, and the checks cuBLASLt documents for it (cublasLt.h): shapes that agree, leading
// dimensions no smaller than a column (row) and aux leading dimensions that are multiples of 8,
// the data/compute/scale type combinations the stand-in implements, the FP8 rules of sm_90 ("TN"
// only, lda and ldb multiples of 16, no E5M2 x E5M2), scale pointers only where cuBLASLt accepts
// them (INVALID_VALUE elsewhere, as documented). Then the pointers of the call: present, aligned
// to their element and to what the algorithm assumed, and not overlapping an output.
#include <algorithm>
#include <string>

#include "test/emu/lib/cublaslt_state.h"

namespace cublaslt_standin {
namespace {

bool is_fp8(cudaDataType_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }
bool uses_bias(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
         e == CUBLASLT_EPILOGUE_BGRADB;
}
bool uses_aux(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
         e == CUBLASLT_EPILOGUE_DGELU;
}
std::string dims(uint64_t r, uint64_t c) { return std::to_string(r) + "x" + std::to_string(c); }

cublasStatus_t fail(cublasStatus_t st, std::string* why, const std::string& what) {
  *why = what;
  return st;
}

cublasStatus_t check_layout(const Layout& l, char name, std::string* why) {
  if (type_size(l.type) == 0)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, why,
                std::string("matrix ") + name + " of type " + type_name(l.type));
  const uint64_t minimum = std::max<uint64_t>(1, l.order == CUBLASLT_ORDER_COL ? l.rows : l.cols);
  if (l.ld < 0 || (uint64_t)l.ld < minimum || l.batch_count < 1)
    return fail(CUBLAS_STATUS_INVALID_VALUE, why,
                std::string("matrix ") + name + " " + dims(l.rows, l.cols) + " with ld " +
                    std::to_string(l.ld) + " and batch count " + std::to_string(l.batch_count));
  return CUBLAS_STATUS_SUCCESS;
}

// m, n, k from D and op(A); op(A) m x k, op(B) k x n and C m x n must agree.
cublasStatus_t check_shapes(Problem* p, std::string* why) {
  const MatmulDesc& d = *p->desc;
  const bool a_n = d.trans_a == CUBLAS_OP_N, b_n = d.trans_b == CUBLAS_OP_N;
  p->m = (int64_t)p->d->rows, p->n = (int64_t)p->d->cols;
  p->k = (int64_t)(a_n ? p->a->cols : p->a->rows);
  const uint64_t a_m = a_n ? p->a->rows : p->a->cols;
  const uint64_t b_k = b_n ? p->b->rows : p->b->cols, b_n_ = b_n ? p->b->cols : p->b->rows;
  if (a_m != (uint64_t)p->m || b_k != (uint64_t)p->k || b_n_ != (uint64_t)p->n ||
      p->c->rows != p->d->rows || p->c->cols != p->d->cols)
    return fail(CUBLAS_STATUS_INVALID_VALUE, why,
                "shapes disagree: op(A) " + dims(a_m, p->k) + ", op(B) " + dims(b_k, b_n_) +
                    ", C " + dims(p->c->rows, p->c->cols) + ", D " + dims(p->m, p->n));
  p->batches = p->d->batch_count;
  if (p->a->batch_count != p->batches || p->b->batch_count != p->batches ||
      p->c->batch_count != p->batches)
    return fail(CUBLAS_STATUS_INVALID_VALUE, why, "the batch counts of A, B, C and D differ");
  return CUBLAS_STATUS_SUCCESS;
}

// The type combinations implemented (compute 32F, scale 32F throughout):
//   fp32 x fp32 -> fp32 (compute 32F or 32F_FAST_TF32), bf16 x bf16 -> bf16 or fp32 (C = D),
//   FP8 x FP8 -> bf16 or fp32 (C = D) or FP8 (C bf16), TN only, no epilogue.
cublasStatus_t check_types(const Problem& p, std::string* why) {
  const MatmulDesc& d = *p.desc;
  const cudaDataType_t ta = p.a->type, tb = p.b->type, tc = p.c->type, td = p.d->type;
  const std::string combo = std::string(type_name(ta)) + " x " + type_name(tb) + " -> C " +
                            type_name(tc) + ", D " + type_name(td) + " with compute type " +
                            std::to_string((int)d.compute);
  if (d.scale_type != CUDA_R_32F)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, why, "scale type other than CUDA_R_32F");
  bool ok = false;
  if (ta == CUDA_R_32F && tb == CUDA_R_32F)
    ok = tc == CUDA_R_32F && td == CUDA_R_32F &&
         (d.compute == CUBLAS_COMPUTE_32F || d.compute == CUBLAS_COMPUTE_32F_FAST_TF32);
  else if (ta == CUDA_R_16BF && tb == CUDA_R_16BF)
    ok = d.compute == CUBLAS_COMPUTE_32F && tc == td && (td == CUDA_R_16BF || td == CUDA_R_32F);
  else if (is_fp8(ta) && is_fp8(tb) && !(ta == CUDA_R_8F_E5M2 && tb == CUDA_R_8F_E5M2))
    ok = d.compute == CUBLAS_COMPUTE_32F &&
         (is_fp8(td) ? tc == CUDA_R_16BF : tc == td && (td == CUDA_R_16BF || td == CUDA_R_32F));
  if (!ok) return fail(CUBLAS_STATUS_NOT_SUPPORTED, why, "type combination " + combo);
  if (!is_fp8(ta)) return CUBLAS_STATUS_SUCCESS;
  if (d.trans_a != CUBLAS_OP_T || d.trans_b != CUBLAS_OP_N)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, why, "FP8 GEMMs are TN only (sm_90): " + combo);
  if (p.a->ld % 16 != 0 || p.b->ld % 16 != 0)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, why, "FP8 GEMMs need lda and ldb multiples of 16");
  if (d.epilogue != CUBLASLT_EPILOGUE_DEFAULT)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, why, "an epilogue with FP8 inputs");
  return CUBLAS_STATUS_SUCCESS;
}

// Scale and amax pointers exist for FP8 GEMMs only (D_SCALE: FP8 D only); cublasLt.h says a
// scale set for an unsupported combination makes cublasLtMatmul return INVALID_VALUE.
cublasStatus_t check_scales(const Problem& p, std::string* why) {
  const MatmulDesc& d = *p.desc;
  const bool fp8_in = is_fp8(p.a->type);
  if ((d.a_scale || d.b_scale || d.amax_d) && !fp8_in)
    return fail(CUBLAS_STATUS_INVALID_VALUE, why, "A/B scale or AMAX_D pointer on a non-FP8 GEMM");
  if (d.d_scale && !is_fp8(p.d->type))
    return fail(CUBLAS_STATUS_INVALID_VALUE, why, "D_SCALE pointer with a D that is not FP8");
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t check_epilogue(Problem* p, std::string* why) {
  const MatmulDesc& d = *p->desc;
  const cudaDataType_t td = p->d->type;
  p->bias_type = d.bias_type == -1 ? td : (cudaDataType_t)d.bias_type;
  p->aux_type = d.aux_type == -1 ? td : (cudaDataType_t)d.aux_type;
  if (d.epilogue == CUBLASLT_EPILOGUE_DEFAULT) return CUBLAS_STATUS_SUCCESS;
  if (p->d->order != CUBLASLT_ORDER_COL)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, why, "an epilogue with a row-major D");
  if (uses_bias(d.epilogue) && p->bias_type != td)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, why,
                std::string("bias type ") + type_name(p->bias_type) + " with D " + type_name(td));
  if (!uses_aux(d.epilogue)) return CUBLAS_STATUS_SUCCESS;
  if (p->aux_type != td)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, why,
                std::string("aux type ") + type_name(p->aux_type) + " with D " + type_name(td));
  if (d.aux_ld < p->m || d.aux_ld % 8 != 0 || d.aux_batch_stride % 8 != 0)
    return fail(CUBLAS_STATUS_INVALID_VALUE, why,
                "aux ld " + std::to_string(d.aux_ld) + " and batch stride " +
                    std::to_string(d.aux_batch_stride) + " (multiples of 8, ld >= m = " +
                    std::to_string(p->m) + ")");
  return CUBLAS_STATUS_SUCCESS;
}

// The bytes [first, last) one matrix of a batch spans (empty when it has no element).
struct Span {
  const char* first = nullptr;
  const char* last = nullptr;
  bool overlaps(const Span& o) const {
    return first < last && o.first < o.last && first < o.last && o.first < last;
  }
};
Span span_of(const void* base, int64_t rows, int64_t cols, int64_t ld, bool col_major,
             int64_t batches, int64_t batch_stride, size_t elem) {
  Span s;
  if (!base || rows == 0 || cols == 0) return s;
  const int64_t last = col_major ? (rows - 1) + (cols - 1) * ld : (rows - 1) * ld + (cols - 1);
  const int64_t lo = std::min<int64_t>(0, (batches - 1) * batch_stride);
  const int64_t hi = std::max<int64_t>(0, (batches - 1) * batch_stride) + last + 1;
  s.first = static_cast<const char*>(base) + lo * (int64_t)elem;
  s.last = static_cast<const char*>(base) + hi * (int64_t)elem;
  return s;
}
Span span_of(const void* base, const Layout& l) {
  return span_of(base, (int64_t)l.rows, (int64_t)l.cols, l.ld, l.order == CUBLASLT_ORDER_COL,
                 l.batch_count, l.batch_stride, type_size(l.type));
}

cublasStatus_t check_alignment(const char* name, const void* ptr, uint64_t assumed, size_t elem,
                               std::string* why) {
  const uint32_t actual = alignment_of(ptr);
  if (!ptr || (actual >= assumed && actual >= elem)) return CUBLAS_STATUS_SUCCESS;
  return fail(CUBLAS_STATUS_INVALID_VALUE, why,
              std::string(name) + " is " + std::to_string(actual) +
                  "-byte aligned; the algorithm assumed " + std::to_string(assumed) +
                  " (element size " + std::to_string(elem) + ")");
}

// Outputs (D, and the aux matrix or bias gradient an epilogue writes) must not overlap inputs
// or each other: on a GPU such a call races. C == D with the same layout is the one aliasing
// cuBLASLt allows (in-place accumulation).
cublasStatus_t check_overlaps(const Problem& p, const void* A, const void* B, const void* C,
                              const void* D, std::string* why) {
  const MatmulDesc& d = *p.desc;
  const Span a = span_of(A, *p.a), b = span_of(B, *p.b), dd = span_of(D, *p.d);
  const bool reads_c = C && C != D;
  const Span c = reads_c ? span_of(C, *p.c) : Span{};
  const bool aux_out = d.epilogue == CUBLASLT_EPILOGUE_GELU_AUX ||
                       d.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool bias_out = d.epilogue == CUBLASLT_EPILOGUE_BGRADB;
  const Span aux = span_of(d.aux, p.m, p.n, d.aux_ld, true, p.batches, d.aux_batch_stride,
                           type_size(p.aux_type));
  const Span bias = span_of(d.bias, p.n, 1, p.n, true, p.batches, d.bias_batch_stride,
                            type_size(p.bias_type));
  if (dd.overlaps(a) || dd.overlaps(b) || dd.overlaps(c))
    return fail(CUBLAS_STATUS_INVALID_VALUE, why, "D overlaps A, B or C");
  if (C == D && C && (p.c->ld != p.d->ld || p.c->order != p.d->order || p.c->type != p.d->type ||
                      p.c->batch_stride != p.d->batch_stride))
    return fail(CUBLAS_STATUS_INVALID_VALUE, why, "C == D (in place) with different layouts");
  for (const Span* in : {&a, &b, &c, &dd}) {
    if (aux_out && aux.overlaps(*in))
      return fail(CUBLAS_STATUS_INVALID_VALUE, why, "the GELU aux output overlaps A, B, C or D");
    if (bias_out && bias.overlaps(*in))
      return fail(CUBLAS_STATUS_INVALID_VALUE, why, "the bias gradient overlaps A, B, C or D");
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

cublasStatus_t describe_problem(const MatmulDesc* desc, const Layout* a, const Layout* b,
                                const Layout* c, const Layout* d, Problem* p, std::string* why) {
  if (!desc || !a || !b || !c || !d)
    return fail(CUBLAS_STATUS_INVALID_VALUE, why, "a descriptor or layout is missing or invalid");
  *p = Problem{desc, a, b, c, d, 0, 0, 0, 0, d->type, d->type};
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  const std::pair<const Layout*, char> layouts[] = {{a, 'A'}, {b, 'B'}, {c, 'C'}, {d, 'D'}};
  for (const auto& [l, name] : layouts)
    if ((st = check_layout(*l, name, why)) != CUBLAS_STATUS_SUCCESS) return st;
  if ((st = check_shapes(p, why)) != CUBLAS_STATUS_SUCCESS) return st;
  if ((st = check_types(*p, why)) != CUBLAS_STATUS_SUCCESS) return st;
  if ((st = check_scales(*p, why)) != CUBLAS_STATUS_SUCCESS) return st;
  return check_epilogue(p, why);
}

cublasStatus_t check_pointers(const Problem& p, const cublasLtMatmulAlgo_t* algo, float alpha,
                              float beta, const void* A, const void* B, const void* C,
                              const void* D, std::string* why) {
  const MatmulDesc& d = *p.desc;
  const bool empty = p.m == 0 || p.n == 0;
  if (!empty && (!D || (p.k > 0 && (!A || !B)) || (beta != 0.0f && !C)))
    return fail(CUBLAS_STATUS_INVALID_VALUE, why, "a null A, B, C (with beta != 0) or D");
  if (!empty && uses_bias(d.epilogue) && !d.bias)
    return fail(CUBLAS_STATUS_INVALID_VALUE, why, "the epilogue needs a bias pointer");
  if (!empty && uses_aux(d.epilogue) && !d.aux)
    return fail(CUBLAS_STATUS_INVALID_VALUE, why, "the epilogue needs an aux pointer");
  if (d.epilogue == CUBLASLT_EPILOGUE_BGRADB && alpha != 1.0f)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, why,
                "BGRADB with alpha != 1 (whether alpha scales the bias gradient is undocumented)");
  uint64_t assumed[7] = {256, 256, 256, 256, 256, 256, 256};  // no algorithm: cuBLASLt's default
  if (algo) {
    if (algo->data[kWordMagic] != kAlgoMagic)
      return fail(CUBLAS_STATUS_INVALID_VALUE, why, "the algorithm is not one the heuristic gave");
    for (int i = 0; i < 6; i++) assumed[i] = algo->data[kWordAlignA + i];
  }
  const void* pointers[6] = {A, B, C == nullptr ? D : C, D, d.bias, d.aux};
  const size_t elems[6] = {type_size(p.a->type), type_size(p.b->type), type_size(p.c->type),
                           type_size(p.d->type), type_size(p.bias_type), type_size(p.aux_type)};
  const char* names[6] = {"A", "B", "C", "D", "the bias", "the aux matrix"};
  for (int i = 0; i < 6; i++) {
    const bool used = i < 4 || (i == 4 ? uses_bias(d.epilogue) : uses_aux(d.epilogue));
    cublasStatus_t st = used ? check_alignment(names[i], pointers[i], assumed[i], elems[i], why)
                             : CUBLAS_STATUS_SUCCESS;
    if (st != CUBLAS_STATUS_SUCCESS) return st;
  }
  return check_overlaps(p, A, B, beta != 0.0f ? C : nullptr, D, why);
}

}  // namespace cublaslt_standin
