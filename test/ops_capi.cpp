// test/ops_capi.cpp - a C interface to the CPU backend for Python's ctypes (test/test_ops.py).
//
// Each op_<name> forwards to ops::<name> with the same arguments, except that the dtype is an int
// (0 = fp32, 1 = bf16, 2 = e4m3, 3 = e5m2) and the stream is implicit: one stream, created on first use (a
// function-local static) and never destroyed. Tensors are raw host pointers (numpy buffers).
// One exception to "ops only": op_expert_dispatch_plan, the MoE dispatch plan, so that the
// dispatch ops are tested with the real plan.
// op_set_num_threads sets the OpenMP thread count, so that the test can check that results are
// bitwise the same on 1 and 2 threads.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "kernels/ops.h"
#include "parallel/expert_dispatch_plan.h"

namespace {
ops::Stream test_stream() {
  static ops::Stream stream = ops::stream_create(StreamOptions{});
  return stream;
}
DType dtype_of(int dt) {
  switch (dt) {
    case 0: return DType::F32;
    case 1: return DType::BF16;
    case 2: return DType::E4M3;
    case 3: return DType::E5M2;
  }
  FATAL("ops_capi: unknown dtype code %d", dt);
}
}  // namespace

extern "C" {

void op_set_num_threads(int n) { omp_set_num_threads(n); }
int op_get_max_threads() { return omp_get_max_threads(); }
const char* op_backend_name() { return ops::backend_name(); }

void* op_alloc(size_t bytes) { return ops::alloc(bytes); }
void op_release(void* p) { ops::release(p); }
size_t op_memory_in_use() { return ops::memory_in_use(); }
size_t op_memory_peak() { return ops::memory_peak(); }

void op_encoder_forward(void* out, const int* tokens, const void* wte, const void* wpe, int B,
                        int T, int C, int dt) {
  ops::encoder_forward(out, tokens, wte, wpe, B, T, C, dtype_of(dt), test_stream());
}
// With the vocabulary bound every token must be below (the kernel's own check).
void op_encoder_forward_vocab(void* out, const int* tokens, const void* wte, const void* wpe,
                              int B, int T, int C, int dt, int vocab_size) {
  ops::encoder_forward(out, tokens, wte, wpe, B, T, C, dtype_of(dt), test_stream(), 0,
                       kAllVocabRows, vocab_size);
}
void op_encoder_backward(float* dwte, float* dwpe, const void* dout, const int* tokens, int B,
                         int T, int C, int dt) {
  ops::encoder_backward(dwte, dwpe, dout, tokens, B, T, C, dtype_of(dt), test_stream());
}

void op_layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* weight,
                          const void* bias, int N, int C, int dt) {
  ops::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, dtype_of(dt), test_stream());
}
void op_layernorm_backward(void* dinp, float* dweight, float* dbias, const void* dout,
                           const void* inp, const void* weight, const float* mean,
                           const float* rstd, int N, int C, int dt) {
  ops::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, dtype_of(dt),
                          test_stream());
}

void op_rmsnorm_forward(void* out, float* rstd, const void* inp, const void* weight, int N, int C,
                        float eps, int dt) {
  ops::rmsnorm_forward(out, rstd, inp, weight, N, C, eps, dtype_of(dt), test_stream());
}
void op_rmsnorm_backward(void* dinp, float* dweight, const void* dout, const void* inp,
                         const void* weight, const float* rstd, int N, int C, int dt) {
  ops::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C, dtype_of(dt), test_stream());
}
void op_rope_forward(void* qkv, const float* cos_table, const float* sin_table,
                     const int* positions, int B, int T, int NH, int NKV, int HS, int dt) {
  ops::rope_forward(qkv, cos_table, sin_table, positions, B, T, NH, NKV, HS, dtype_of(dt),
                    test_stream());
}
void op_rope_backward(void* dqkv, const float* cos_table, const float* sin_table,
                      const int* positions, int B, int T, int NH, int NKV, int HS, int dt) {
  ops::rope_backward(dqkv, cos_table, sin_table, positions, B, T, NH, NKV, HS, dtype_of(dt),
                     test_stream());
}
void op_swiglu_forward(void* out, const void* inp, int N, int F, int dt) {
  ops::swiglu_forward(out, inp, N, F, dtype_of(dt), test_stream());
}
void op_swiglu_backward(void* dinp, const void* dout, const void* inp, int N, int F, int dt) {
  ops::swiglu_backward(dinp, dout, inp, N, F, dtype_of(dt), test_stream());
}

void op_matmul_forward(void* out, void* pre_gelu, const void* inp, const void* weight,
                       const void* bias, const void* residual, int N, int C, int OC, int dt) {
  ops::matmul_forward(out, pre_gelu, inp, weight, bias, residual, N, C, OC, dtype_of(dt),
                      test_stream());
}
void op_matmul_backward(void* dinp, float* dweight, float* dbias, const void* dout, const void* inp,
                        const void* weight, const void* gelu_input, int N, int C, int OC, int dt) {
  ops::matmul_backward(dinp, dweight, dbias, dout, inp, weight, gelu_input, N, C, OC, dtype_of(dt),
                       test_stream());
}

void op_gelu_forward(void* out, const void* inp, size_t n, int dt) {
  ops::gelu_forward(out, inp, n, dtype_of(dt), test_stream());
}
void op_gelu_backward(void* dinp, const void* inp, const void* dout, size_t n, int dt) {
  ops::gelu_backward(dinp, inp, dout, n, dtype_of(dt), test_stream());
}

void op_attention_forward(void* out, float* lse, const void* qkv, int B, int T, int NH, int NKV,
                          int HS, int dt) {
  ops::attention_forward(out, lse, qkv, B, T, NH, NKV, HS, dtype_of(dt), test_stream());
}
void op_attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                           const float* lse, int B, int T, int NH, int NKV, int HS, int dt) {
  ops::attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HS, dtype_of(dt),
                          test_stream());
}
void op_attention_merge(void* out, float* lse, const void* out_b, const float* lse_b, int B,
                        int T, int NH, int HS, int dt) {
  ops::attention_merge(out, lse, out_b, lse_b, B, T, NH, HS, dtype_of(dt), test_stream());
}
void op_attention_block_forward(void* out, float* lse, const void* qkv, const void* kv, int B,
                                int T, int NH, int NKV, int HS, int causal, int dt) {
  ops::attention_block_forward(out, lse, qkv, kv, B, T, NH, NKV, HS, causal != 0, dtype_of(dt),
                               test_stream());
}
void op_attention_block_backward(float* dq, float* dkv, const void* dout, const void* out,
                                 const float* lse, const void* qkv, const void* kv, int B, int T,
                                 int NH, int NKV, int HS, int causal, int dt) {
  ops::attention_block_backward(dq, dkv, dout, out, lse, qkv, kv, B, T, NH, NKV, HS, causal != 0,
                                dtype_of(dt), test_stream());
}

void op_classifier_forward_backward(void* logits, float* losses, const int* targets, float dloss,
                                    int N, int V, int Vp, int dt) {
  ops::classifier_forward_backward(logits, losses, targets, dloss, N, V, Vp, dtype_of(dt),
                                   test_stream());
}

void op_moe_router_forward(const float* logits, int N, int E, int top_k, int* expert, float* gate,
                           float* probs, float* lse) {
  ops::moe_router_forward(logits, N, E, top_k, expert, gate, probs, lse, test_stream());
}
void op_moe_router_backward(float* dlogits, const float* probs, const int* expert,
                            const float* gate, const float* dgate, const float* dprobs_aux,
                            const float* lse, float z_coef, int N, int E, int top_k) {
  ops::moe_router_backward(dlogits, probs, expert, gate, dgate, dprobs_aux, lse, z_coef, N, E,
                           top_k, test_stream());
}

void op_moe_permute(void* out, const void* in, const int* rows, int M, int C, int dt) {
  ops::moe_permute(out, in, rows, M, C, dtype_of(dt), test_stream());
}
void op_moe_unpermute_backward(void* din, const void* dout, const int* position, int N, int top_k,
                               int C, int dt) {
  ops::moe_unpermute_backward(din, dout, position, N, top_k, C, dtype_of(dt), test_stream());
}
void op_moe_combine(void* out, const void* expert_out, const float* gate, const int* position,
                    int N, int top_k, int C, int dt) {
  ops::moe_combine(out, expert_out, gate, position, N, top_k, C, dtype_of(dt), test_stream());
}
void op_moe_combine_backward(void* d_expert_out, float* d_gate, const void* dout,
                             const void* expert_out, const float* gate, const int* position,
                             int N, int top_k, int C, int dt) {
  ops::moe_combine_backward(d_expert_out, d_gate, dout, expert_out, gate, position, N, top_k, C,
                            dtype_of(dt), test_stream());
}
// The dispatch plan itself (parallel/expert_dispatch_plan.h, host code linked into this library
// for the tests): its order and position (N*top_k each), expert_counts (E) and rank_send_counts
// (ep) for expert (N, top_k).
void op_expert_dispatch_plan(const int* expert, int N, int top_k, int E, int ep, int* order,
                             int* position, int* expert_counts, int* rank_send_counts) {
  const ExpertDispatchPlan p = expert_dispatch_plan_build(expert, N, top_k, E, ep);
  std::copy(p.order.begin(), p.order.end(), order);
  std::copy(p.position.begin(), p.position.end(), position);
  std::copy(p.expert_counts.begin(), p.expert_counts.end(), expert_counts);
  std::copy(p.rank_send_counts.begin(), p.rank_send_counts.end(), rank_send_counts);
}

void op_adamw_update(float* master, void* param_out, const float* grad, float* m, float* v,
                     size_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                     float grad_scale, int t, int param_dt) {
  AdamWStep step{lr, beta1, beta2, eps, weight_decay, grad_scale, t};
  ops::adamw_update(master, param_out, grad, m, v, n, step, dtype_of(param_dt), test_stream());
}
void op_sum_squares_accumulate(float* out, const float* x, size_t n) {
  ops::sum_squares_accumulate(out, x, n, test_stream());
}
void op_sum_accumulate(float* out, const float* x, size_t n, float scale) {
  ops::sum_accumulate(out, x, n, scale, test_stream());
}
void op_add_inplace(float* dst, const float* src, size_t n) {
  ops::add_inplace(dst, src, n, test_stream());
}
void op_int8_quantize(void* packed, float* err, const float* x, size_t chunk_n, int chunks,
                      int accumulate_err) {
  ops::int8_quantize(packed, err, x, chunk_n, chunks, accumulate_err != 0, test_stream());
}
void op_int8_dequantize_sum(float* out, const void* packed, size_t chunk_n, int records) {
  ops::int8_dequantize_sum(out, packed, chunk_n, records, test_stream());
}
void op_int8_dequantize(float* out, size_t n, const void* packed, size_t chunk_n, int records) {
  ops::int8_dequantize(out, n, packed, chunk_n, records, test_stream());
}
size_t op_int8_record_bytes(size_t chunk_n) { return int8_record_bytes(chunk_n); }
void op_topk_select(int32_t* record, float* x, size_t n, size_t k) {
  std::vector<char> scratch(topk_scratch_bytes(n));
  ops::topk_select(record, x, n, k, scratch.data(), test_stream());
}
void op_topk_scatter_add(float* out, size_t first, size_t out_n, const int32_t* records, size_t k,
                         int records_n) {
  ops::topk_scatter_add(out, first, out_n, records, k, records_n, test_stream());
}
void op_cast(void* dst, int dst_dt, const void* src, int src_dt, size_t n) {
  ops::cast(dst, dtype_of(dst_dt), src, dtype_of(src_dt), n, test_stream());
}
void op_copy_columns(void* dst, int dst_cols, int dst_dt, const void* src, int src_cols,
                     int src_dt, int rows, int width) {
  ops::copy_columns(dst, dst_cols, dtype_of(dst_dt), src, src_cols, dtype_of(src_dt), rows, width,
                    test_stream());
}

void op_amax(float* out, const void* x, size_t n, int dt) {
  ops::amax(out, x, n, dtype_of(dt), test_stream());
}
void op_fp8_update_scale(float* scale, float* scale_inv, float* history, int history_len,
                         const float* amax, float fp8_max, int margin) {
  ops::fp8_update_scale(scale, scale_inv, history, history_len, amax, fp8_max, margin,
                        test_stream());
}
void op_fp8_cast(void* out, void* out_t, int fp8, const void* x, int dt, int rows, int cols,
                 const float* scale) {
  ops::fp8_cast(out, out_t, dtype_of(fp8), x, dtype_of(dt), rows, cols, scale, test_stream());
}
void op_gemm_fp8(void* out, int out_dt, int accumulate, const void* a, int a_fp8, const void* b,
                 int b_fp8, int M, int N, int K, const float* a_scale_inv,
                 const float* b_scale_inv) {
  ops::gemm_fp8(out, dtype_of(out_dt), accumulate != 0, a, dtype_of(a_fp8), b, dtype_of(b_fp8),
                M, N, K, a_scale_inv, b_scale_inv, test_stream());
}
void op_bias_backward(float* dbias, const void* dout, int N, int OC, int dt) {
  ops::bias_backward(dbias, dout, N, OC, dtype_of(dt), test_stream());
}

}  // extern "C"
