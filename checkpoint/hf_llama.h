// checkpoint/hf_llama.h - the first weights from a Hugging Face LlamaForCausalLM (or
// MixtralForCausalLM) directory
// ([init] from = "DIR": config.json + model.safetensors, or shards with
// model.safetensors.index.json; F32 or BF16 tensors).
//
// config.json was checked against [model] when the config was read (config/config_hf.cu). Here
// every tensor the model needs is checked before a single weight is written: present, of shape
// (rows, cols) as the config implies, F32 or BF16; a tensor the model has no place for is
// refused too. Then hf_llama_fill is a ParamFill (parallel/placement.h): each rank reads only the
// rows and columns of its own blocks, whatever the layout.
//
// Our logical tensors -> Hugging Face's (HS = d_model / n_head, NKV = n_kv_head, F = d_ff):
//   wte (Vp, C)                rows < V: model.embed_tokens.weight; padded rows V.. are zero
//   lm_head (Vp, C)            rows < V: lm_head.weight (untied only); padded rows zero
//   ln_f/weight                model.norm.weight
//   h.l/ln_1/weight            model.layers.l.input_layernorm.weight
//   h.l/ln_2/weight            model.layers.l.post_attention_layernorm.weight
//   h.l/attn/qkv/weight        three row sections: self_attn.q_proj (NH*HS rows),
//                              k_proj (NKV*HS), v_proj (NKV*HS)
//   h.l/attn/proj/weight       self_attn.o_proj
//   h.l/mlp/fc/weight          two row sections: mlp.gate_proj (F rows), mlp.up_proj (F rows)
//   h.l/mlp/proj/weight        mlp.down_proj
// A Mixtral (MixtralForCausalLM: every layer a sparse MoE block, E = n_experts experts of hidden
// D = d_expert, prefix model.layers.l.block_sparse_moe.) has instead of the two MLP tensors:
//   h.l/mlp/router/weight        (E, C)    gate.weight
//   h.l/mlp/experts/fc/weight    (E*2D, C) per expert e two row sections: experts.e.w1 (D rows,
//                                          the gate), experts.e.w3 (D rows, the up projection)
//   h.l/mlp/experts/proj/weight  (E*C, D)  per expert e: experts.e.w2 (C rows)
// RoPE needs no permutation: Hugging Face's q_proj and k_proj rows are already in the
// rotate_half order our kernels use.
#pragma once
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "config/config.h"
#include "parallel/placement.h"

// One row section of our tensor: our rows [first, first + rows) are rows 0.. of `hf_name`.
struct HfSection {
  int64_t first = 0, rows = 0;
  std::string hf_name;
};
// Where our tensor `name` (of a Llama with config m) comes from, section by section; rows not
// covered are zero (wte's and lm_head's padding). An empty list: no Hugging Face tensor.
std::vector<HfSection> hf_llama_sections(const std::string& name, const ModelConfig& m);

struct HfLlamaModel {
  std::string dir;
  SafetensorsSet files;
  ModelConfig model;
};
// Opens DIR's safetensors and checks every tensor; exits on all ranks naming the tensor and the
// file on any problem.
HfLlamaModel hf_llama_open(const std::string& dir, const ModelConfig& m);
void hf_llama_close(HfLlamaModel& f);
ParamFill hf_llama_fill(const HfLlamaModel& f);
