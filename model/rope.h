// model/rope.h - Llama's rotary position tables, made on the host: what ops::rope_forward and
// rope_backward (kernels/ops_decls.h) read. Hugging Face's LlamaRotaryEmbedding without
// rope_scaling: for position p < maxT and j < HS/2,
//   inv_freq[j] = theta^(-2j/HS),  angle = p * inv_freq[j],  cos = cos(angle), sin = sin(angle)
// computed in double and rounded once to fp32, so that both backends rotate with the same bits
// and a float64 reference differs from them by that one rounding only.
#pragma once
#include <vector>

// cos and sin, (maxT, HS/2) row-major each.
void rope_tables(std::vector<float>& cos_table, std::vector<float>& sin_table, int maxT, int HS,
                 double theta);
