// kernels/op_spans.h - the trace span of every op of the seam (kernels/trace.h, "Ops"): its name,
// its shape arguments and the bytes it moves, one line per op, written once for both backends.
//
// Each op of kernels/cpu and kernels/cuda opens with OP_SPAN(its name); the line below expands,
// in terms of the op's own parameter names (those of kernels/ops_decls.h), to TRACE_OP. So the
// two backends record the same names, arguments and bytes, and a CPU trace can be read as a GPU
// trace is. Outside a traced step an OP_SPAN costs one branch; nothing here is evaluated.
//
// Bytes: every tensor the op reads once plus every tensor it writes once, at the size its shapes
// give (an output accumulated into, "+=", or updated in place counts twice: read and written;
// an embedding table only the rows the tokens touch; a tensor passed as nullptr nothing). For
// the GEMMs that is the operands and the result, never the GEMM's own re-reads: a lower bound of
// the memory traffic, which a roofline divides the FLOPs by.
//
// Not here (no span): the runtime of streams, events, allocation and the synchronous copies
// (the recorder itself records events: a span there would recurse), and queries.
#pragma once
#include "kernels/trace.h"

#define OP_SPAN(op) OP_SPAN_##op

// Sizes in bytes, as size_t so that products of int shapes do not overflow.
#define OPB_D ((size_t)dtype_size(dt))
#define OPB_F ((size_t)4)  // fp32, int32

// ---- Copies -------------------------------------------------------------------------------------
#define OP_SPAN_copy_to_device_async TRACE_OP("copy_to_device_async", s, 2 * bytes, {"size", bytes})
#define OP_SPAN_copy_to_host_async TRACE_OP("copy_to_host_async", s, 2 * bytes, {"size", bytes})
#define OP_SPAN_copy_on_device TRACE_OP("copy_on_device", s, 2 * bytes, {"size", bytes})
#define OP_SPAN_fill_zero TRACE_OP("fill_zero", s, bytes, {"size", bytes})
#define OP_SPAN_copy_columns                                                                    \
  TRACE_OP("copy_columns", s,                                                                  \
           (size_t)rows * width * (dtype_size(dst_dt) + dtype_size(src_dt)), {"rows", rows},   \
           {"width", width}, {"dst_cols", dst_cols}, {"src_cols", src_cols})
#define OP_SPAN_cast                                                                            \
  TRACE_OP("cast", s, n * (dtype_size(dst_dt) + dtype_size(src_dt)), {"n", n})

// ---- The GPT's layers ---------------------------------------------------------------------------
#define OP_SPAN_encoder_forward                                                                 \
  TRACE_OP("encoder_forward", s,                                                               \
           (size_t)B * T * (OPB_F + 2 * C * OPB_D) + (wpe ? (size_t)T * C * OPB_D : 0),         \
           {"B", B}, {"T", T}, {"C", C})
#define OP_SPAN_encoder_backward                                                                \
  TRACE_OP("encoder_backward", s,                                                              \
           (size_t)B * T * (OPB_F + C * OPB_D + 2 * C * OPB_F) +                                \
               (dwpe ? 2 * (size_t)T * C * OPB_F : 0),                                          \
           {"B", B}, {"T", T}, {"C", C})
#define OP_SPAN_add_bias_residual                                                               \
  TRACE_OP("add_bias_residual", s,                                                             \
           (size_t)N * C * OPB_D * (residual ? 3 : 2) + (bias ? C * OPB_D : 0), {"N", N},       \
           {"C", C})
#define OP_SPAN_layernorm_forward                                                               \
  TRACE_OP("layernorm_forward", s,                                                             \
           (size_t)N * (2 * C * OPB_D + 2 * OPB_F) + (size_t)C * OPB_D * (bias ? 2 : 1),        \
           {"N", N}, {"C", C})
#define OP_SPAN_layernorm_backward                                                              \
  TRACE_OP("layernorm_backward", s,                                                            \
           (size_t)N * (4 * C * OPB_D + 2 * OPB_F) + (size_t)C * (OPB_D + 2 * OPB_F) +          \
               (dbias ? 2 * (size_t)C * OPB_F : 0),                                             \
           {"N", N}, {"C", C})
#define OP_SPAN_rmsnorm_forward                                                                 \
  TRACE_OP("rmsnorm_forward", s, (size_t)N * (2 * C * OPB_D + OPB_F) + (size_t)C * OPB_D,      \
           {"N", N}, {"C", C})
#define OP_SPAN_rmsnorm_backward                                                                \
  TRACE_OP("rmsnorm_backward", s,                                                              \
           (size_t)N * (4 * C * OPB_D + OPB_F) + (size_t)C * (OPB_D + 2 * OPB_F), {"N", N},     \
           {"C", C})
#define OPB_ROPE                                                                                \
  ((size_t)B * T * (2 * (NH + NKV) * HS * OPB_D + (positions ? OPB_F : 0)) +                    \
   (size_t)T * HS * OPB_F)
#define OP_SPAN_rope_forward                                                                    \
  TRACE_OP("rope_forward", s, OPB_ROPE, {"B", B}, {"T", T}, {"NH", NH}, {"NKV", NKV},          \
           {"HS", HS})
#define OP_SPAN_rope_backward                                                                   \
  TRACE_OP("rope_backward", s, OPB_ROPE, {"B", B}, {"T", T}, {"NH", NH}, {"NKV", NKV},         \
           {"HS", HS})
#define OP_SPAN_swiglu_forward                                                                  \
  TRACE_OP("swiglu_forward", s, (size_t)N * F * 3 * OPB_D, {"N", N}, {"F", F})
#define OP_SPAN_swiglu_backward                                                                 \
  TRACE_OP("swiglu_backward", s, (size_t)N * F * 5 * OPB_D, {"N", N}, {"F", F})
#define OP_SPAN_matmul_forward                                                                  \
  TRACE_OP("matmul_forward", s,                                                                \
           OPB_D * ((size_t)N * C + (size_t)OC * C + (bias ? OC : 0) +                          \
                    (size_t)N * OC * (1 + (residual ? 1 : 0) + (pre_gelu ? 1 : 0))),            \
           {"N", N}, {"C", C}, {"OC", OC})
#define OP_SPAN_matmul_backward                                                                 \
  TRACE_OP("matmul_backward", s,                                                               \
           (size_t)N * OC * OPB_D +                                                             \
               (dinp ? OPB_D * ((size_t)N * C * (gelu_input ? 2 : 1) + (size_t)OC * C) : 0) +   \
               (dweight ? (size_t)N * C * OPB_D + 2 * (size_t)OC * C * OPB_F : 0) +             \
               (dbias ? 2 * (size_t)OC * OPB_F : 0),                                            \
           {"N", N}, {"C", C}, {"OC", OC})
// The grouped GEMMs: N = the groups' rows together, every group's weights.
inline size_t op_group_rows(const int* rows, int groups) {
  size_t n = 0;
  for (int g = 0; g < groups; g++) n += rows[g];
  return n;
}
#define OP_SPAN_grouped_matmul_forward                                                          \
  TRACE_OP("grouped_matmul_forward", s,                                                        \
           OPB_D * (op_group_rows(rows, groups) * ((size_t)C + (size_t)OC * (pre_gelu ? 2 : 1)) + \
                    (size_t)groups * OC * C + (bias ? (size_t)groups * OC : 0)),               \
           {"N", (long long)op_group_rows(rows, groups)}, {"groups", groups}, {"C", C}, {"OC", OC})
#define OP_SPAN_grouped_matmul_backward                                                         \
  TRACE_OP("grouped_matmul_backward", s,                                                       \
           op_group_rows(rows, groups) * OC * OPB_D +                                          \
               (dinp ? OPB_D * (op_group_rows(rows, groups) * C * (gelu_input ? 2 : 1) +       \
                                (size_t)groups * OC * C)                                       \
                     : 0) +                                                                    \
               (dweight ? op_group_rows(rows, groups) * C * OPB_D +                            \
                              2 * (size_t)groups * OC * C * OPB_F                              \
                        : 0) +                                                                 \
               (dbias ? 2 * (size_t)groups * OC * OPB_F : 0),                                  \
           {"N", (long long)op_group_rows(rows, groups)}, {"groups", groups}, {"C", C}, {"OC", OC})
#define OP_SPAN_bias_backward                                                                   \
  TRACE_OP("bias_backward", s, (size_t)N * OC * OPB_D + 2 * (size_t)OC * OPB_F, {"N", N},      \
           {"OC", OC})
#define OP_SPAN_gelu_forward TRACE_OP("gelu_forward", s, 2 * n * OPB_D, {"n", n})
#define OP_SPAN_gelu_backward TRACE_OP("gelu_backward", s, 3 * n * OPB_D, {"n", n})
#define OP_SPAN_classifier_forward_backward                                                     \
  TRACE_OP("classifier_forward_backward", s,                                                   \
           (size_t)N * ((size_t)Vp * OPB_D * (dloss != 0 ? 2 : 1) + 2 * OPB_F), {"N", N},       \
           {"V", V}, {"Vp", Vp})
#define OP_SPAN_classifier_shard_stats                                                          \
  TRACE_OP("classifier_shard_stats", s, (size_t)N * ((size_t)Vs * OPB_D + 4 * OPB_F),          \
           {"N", N}, {"Vs", Vs}, {"col0", col0}, {"V", V})
#define OP_SPAN_classifier_merge_stats                                                          \
  TRACE_OP("classifier_merge_stats", s, (size_t)N * OPB_F * (3 * (size_t)parts + 5),           \
           {"parts", parts}, {"N", N})
#define OP_SPAN_classifier_shard_backward                                                       \
  TRACE_OP("classifier_shard_backward", s, (size_t)N * (2 * (size_t)Vs * OPB_D + 4 * OPB_F),   \
           {"N", N}, {"Vs", Vs}, {"col0", col0}, {"V", V})

// ---- Attention (qkv packed (B,T,(NH+2NKV)HS), out (B,T,NH HS), lse (B,NH,T)) --------------------
#define OPB_Q ((size_t)B * T * NH * HS * OPB_D)
#define OPB_KV ((size_t)B * T * 2 * NKV * HS)
#define OPB_LSE ((size_t)B * NH * T * OPB_F)
#define OP_SPAN_attention_forward                                                               \
  TRACE_OP("attention_forward", s, 2 * OPB_Q + OPB_KV * OPB_D + OPB_LSE, {"B", B}, {"T", T},   \
           {"NH", NH}, {"NKV", NKV}, {"HS", HS})
#define OP_SPAN_attention_backward                                                              \
  TRACE_OP("attention_backward", s, 4 * OPB_Q + 2 * OPB_KV * OPB_D + OPB_LSE, {"B", B},        \
           {"T", T}, {"NH", NH}, {"NKV", NKV}, {"HS", HS})
#define OP_SPAN_attention_merge                                                                 \
  TRACE_OP("attention_merge", s, 3 * OPB_Q + 3 * OPB_LSE, {"B", B}, {"T", T}, {"NH", NH},      \
           {"HS", HS})
#define OP_SPAN_attention_block_forward                                                         \
  TRACE_OP("attention_block_forward", s, 2 * OPB_Q + OPB_KV * OPB_D + OPB_LSE, {"B", B},       \
           {"T", T}, {"NH", NH}, {"NKV", NKV}, {"HS", HS}, {"causal", causal})
#define OP_SPAN_attention_block_backward                                                        \
  TRACE_OP("attention_block_backward", s,                                                      \
           3 * OPB_Q + OPB_KV * OPB_D + OPB_LSE + 2 * (OPB_Q / OPB_D + OPB_KV) * OPB_F,         \
           {"B", B}, {"T", T}, {"NH", NH}, {"NKV", NKV}, {"HS", HS}, {"causal", causal})
#define OP_SPAN_attention_cached_forward                                                        \
  TRACE_OP("attention_cached_forward", s,                                                      \
           ((size_t)n * ((NH + 2 * NKV) + NH) * HS + (size_t)(pos + n) * 2 * NKV * HS) * OPB_D, \
           {"n", n}, {"pos", pos}, {"NH", NH}, {"NKV", NKV}, {"HS", HS})

// ---- Mixture of experts (router fp32; E experts, top_k slots a token) ---------------------------
#define OP_SPAN_moe_router_forward                                                              \
  TRACE_OP("moe_router_forward", s, (size_t)N * OPB_F * (2 * (size_t)E + 2 * top_k + 1),       \
           {"N", N}, {"E", E}, {"top_k", top_k})
#define OP_SPAN_moe_router_backward                                                             \
  TRACE_OP("moe_router_backward", s,                                                           \
           (size_t)N * OPB_F * ((dprobs_aux ? 3 : 2) * (size_t)E + 3 * top_k + 1), {"N", N},    \
           {"E", E}, {"top_k", top_k})
#define OP_SPAN_moe_permute                                                                     \
  TRACE_OP("moe_permute", s, (size_t)M * (2 * C * OPB_D + OPB_F), {"M", M}, {"C", C})
#define OP_SPAN_moe_unpermute_backward                                                          \
  TRACE_OP("moe_unpermute_backward", s,                                                        \
           (size_t)N * (C * OPB_D * (1 + top_k) + top_k * OPB_F), {"N", N}, {"top_k", top_k},   \
           {"C", C})
#define OP_SPAN_moe_combine                                                                     \
  TRACE_OP("moe_combine", s, (size_t)N * (C * OPB_D * (1 + top_k) + 2 * top_k * OPB_F),        \
           {"N", N}, {"top_k", top_k}, {"C", C})
#define OP_SPAN_moe_combine_backward                                                            \
  TRACE_OP("moe_combine_backward", s,                                                          \
           (size_t)N * (C * OPB_D * (1 + 2 * top_k) + 3 * top_k * OPB_F), {"N", N},             \
           {"top_k", top_k}, {"C", C})

// ---- FP8 (operands 1 byte) ----------------------------------------------------------------------
#define OP_SPAN_amax TRACE_OP("amax", s, n * OPB_D + OPB_F, {"n", n})
#define OP_SPAN_fp8_update_scale                                                                \
  TRACE_OP("fp8_update_scale", s, OPB_F * (3 + 2 * (size_t)history_len),                        \
           {"history_len", history_len})
#define OP_SPAN_fp8_cast                                                                        \
  TRACE_OP("fp8_cast", s,                                                                      \
           (size_t)rows * cols * (OPB_D + (out ? 1 : 0) + (out_t ? 1 : 0)) + OPB_F,             \
           {"rows", rows}, {"cols", cols})
#define OP_SPAN_gemm_fp8                                                                        \
  TRACE_OP("gemm_fp8", s,                                                                      \
           (size_t)K * (M + N) + (size_t)M * N * dtype_size(out_dt) * (accumulate ? 2 : 1) +    \
               2 * OPB_F,                                                                       \
           {"M", M}, {"N", N}, {"K", K})
#define OP_SPAN_fp8_cast_blocks                                                                 \
  TRACE_OP("fp8_cast_blocks", s, (size_t)rows * cols * (2 * OPB_D + 1), {"rows", rows},         \
           {"cols", cols})
#define OP_SPAN_gemm_fp8_blocks                                                                 \
  TRACE_OP("gemm_fp8_blocks", s,                                                               \
           (size_t)K * (M + N) + (size_t)M * N * dtype_size(out_dt) * (accumulate ? 2 : 1),     \
           {"M", M}, {"N", N}, {"K", K})

// ---- Optimizer and reductions (fp32) ------------------------------------------------------------
#define OP_SPAN_adamw_update                                                                    \
  TRACE_OP("adamw_update", s, n * (7 * OPB_F + (param_out ? dtype_size(param_dt) : 0)),        \
           {"n", n})
#define OP_SPAN_sum_squares_accumulate                                                          \
  TRACE_OP("sum_squares_accumulate", s, (n + 2) * OPB_F, {"n", n})
#define OP_SPAN_sum_accumulate TRACE_OP("sum_accumulate", s, (n + 2) * OPB_F, {"n", n})
#define OP_SPAN_sum_parts TRACE_OP("sum_parts", s, (size_t)n * OPB_F + 8, {"n", n})
#define OP_SPAN_grad_norm_and_clip \
  TRACE_OP("grad_norm_and_clip", s, (size_t)n * OPB_F + 12, {"n", n})
#define OP_SPAN_add_inplace TRACE_OP("add_inplace", s, 3 * n * OPB_F, {"n", n})
#define OP_SPAN_diloco_outer_delta TRACE_OP("diloco_outer_delta", s, 3 * n * OPB_F, {"n", n})
#define OP_SPAN_diloco_outer_step TRACE_OP("diloco_outer_step", s, 6 * n * OPB_F, {"n", n})

// ---- Compressed gradient reductions -------------------------------------------------------------
#define OP_SPAN_int8_quantize                                                                   \
  TRACE_OP("int8_quantize", s,                                                                 \
           chunks * (int8_record_bytes(chunk_n) + chunk_n * OPB_F * (accumulate_err ? 3 : 2)),  \
           {"chunk_n", chunk_n}, {"chunks", chunks})
#define OP_SPAN_int8_dequantize_sum                                                             \
  TRACE_OP("int8_dequantize_sum", s, chunk_n * OPB_F + records * int8_record_bytes(chunk_n),   \
           {"chunk_n", chunk_n}, {"records", records})
#define OP_SPAN_int8_dequantize                                                                 \
  TRACE_OP("int8_dequantize", s, n * OPB_F + records * int8_record_bytes(chunk_n), {"n", n},   \
           {"chunk_n", chunk_n}, {"records", records})
#define OP_SPAN_topk_select                                                                     \
  TRACE_OP("topk_select", s, (n + 3 * k) * OPB_F, {"n", n}, {"k", k})
#define OP_SPAN_topk_scatter_add                                                                \
  TRACE_OP("topk_scatter_add", s, (2 * out_n + 2 * k * (size_t)records_n) * OPB_F,             \
           {"out_n", out_n}, {"k", k}, {"records", records_n})
