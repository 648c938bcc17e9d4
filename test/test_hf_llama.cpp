// test/test_hf_llama.cpp - the Hugging Face Llama reader (checkpoint/hf_llama.cu) without the
// model: what every tensor-parallel rank's blocks read, written out for test/test_llama_hf.py
// to compare with the tensors it wrote.
//
//   test_hf_llama DIR L NH NKV C F V TIED TP CHUNK OUT.safetensors
//
// For each tp rank r < TP it places our Llama tensors as the design fixes them (qkv rows
// [q_r; k_r; v_r] in three unequal sections, fc rows [gate_r; up_r], the two output projections
// split by columns, wte and lm_head by vocabulary rows, norms replicated; at TP 1 qkv and fc are
// one row range, so that blocks cross the q/k/v and gate/up borders), fills each local
// buffer through hf_llama_fill in pieces of CHUNK elements (so that blocks start and end inside
// rows and sections), and writes it to OUT as "r<rank>/<name>" (local rows x local cols, F32)
// with checkpoint/safetensors.cu's writer. Errors of hf_llama_open exit non-zero with its message.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "checkpoint/hf_llama.h"
#include "kernels/common.h"

// qkv: rank r holds the r-th 1/tp of each of the three sections (which differ in size with GQA).
// At tp 1 one row range of all rows, so that blocks cross from q to k to v.
static TensorPlacement qkv_placement(const std::string& name, const ModelConfig& m, int r, int tp) {
  const int64_t q = (int64_t)m.n_head * m.head_dim(), kv = (int64_t)m.kv_heads() * m.head_dim();
  TensorPlacement t = replicated(name, q + 2 * kv, m.d_model);
  if (tp == 1) return t;
  t.row_ranges = {{r * q / tp, q / tp}, {q + r * kv / tp, kv / tp}, {q + kv + r * kv / tp, kv / tp}};
  t.tp_split = true;
  return t;
}

static std::vector<TensorPlacement> rank_tensors(const ModelConfig& m, int r, int tp) {
  const int64_t C = m.d_model, F = m.ffn_hidden(), Vp = m.padded_vocab();
  std::vector<TensorPlacement> out = {split_rows("wte", Vp, C, 1, r, tp),
                                      replicated("ln_f/weight", C, 1)};
  if (!m.tie_embeddings) out.push_back(split_rows("lm_head", Vp, C, 1, r, tp));
  for (int l = 0; l < m.n_layer; l++) {
    const std::string h = "h." + std::to_string(l) + "/";
    out.push_back(replicated(h + "ln_1/weight", C, 1));
    out.push_back(replicated(h + "ln_2/weight", C, 1));
    out.push_back(qkv_placement(h + "attn/qkv/weight", m, r, tp));
    out.push_back(split_cols(h + "attn/proj/weight", C, (int64_t)m.n_head * m.head_dim(), r, tp));
    out.push_back(tp == 1 ? replicated(h + "mlp/fc/weight", 2 * F, C)  // gate|up in one range
                          : split_rows(h + "mlp/fc/weight", 2 * F, C, 2, r, tp));
    out.push_back(split_cols(h + "mlp/proj/weight", C, F, r, tp));
  }
  return out;
}

int main(int argc, char** argv) {
  if (argc != 12) {
    std::fprintf(stderr, "usage: %s DIR L NH NKV C F V TIED TP CHUNK OUT\n", argv[0]);
    return 2;
  }
  ModelConfig m;
  m.arch = "llama";
  m.n_layer = std::atoi(argv[2]), m.n_head = std::atoi(argv[3]), m.n_kv_head = std::atoi(argv[4]);
  m.d_model = std::atoi(argv[5]), m.d_ff = std::atoi(argv[6]), m.vocab_size = std::atoi(argv[7]);
  m.tie_embeddings = std::atoi(argv[8]) != 0;
  const int tp = std::atoi(argv[9]);
  const size_t chunk = (size_t)std::atol(argv[10]);
  HfLlamaModel f = hf_llama_open(argv[1], m);
  const ParamFill fill = hf_llama_fill(f);
  std::vector<SafetensorsOut> out;
  for (int r = 0; r < tp; r++) {
    for (const TensorPlacement& t : rank_tensors(m, r, tp)) {
      SafetensorsOut o{"r" + std::to_string(r) + "/" + t.name, "F32",
                       {t.local_rows(), t.local_cols}, std::vector<float>(t.local_numel(), -7.0f)};
      for (size_t first = 0; first < t.local_numel(); first += chunk)
        for (const Block& b : global_blocks(t, first, std::min(chunk, t.local_numel() - first)))
          fill(t, b, o.values.data() + b.local);
      out.push_back(std::move(o));
    }
  }
  hf_llama_close(f);
  const std::string err = safetensors_write(argv[11], out);
  CHECK(err.empty(), "%s", err.c_str());
  return 0;
}
