// checkpoint/hf_llama.cu - Hugging Face Llama and Mixtral weights as a ParamFill
// (checkpoint/hf_llama.h).
//
// Each of our tensors is a stack of row sections, each section all the rows of one Hugging Face
// tensor (qkv: q, k, v; fc: gate, up; a Mixtral's experts: w1, w3 per expert for fc, w2 per
// expert for proj; the rest: one). A block of our tensor is read as runs of
// rows inside one section: whole rows in one pread, a column range a pread per row. Rows past
// the last section (the padded vocabulary) are zero.
#include "checkpoint/hf_llama.h"

#include <algorithm>

#include "kernels/common.h"

namespace {

// Our logical tensors of a Llama: name, columns, and whether it is a vector (an RMSNorm weight,
// 1-D in Hugging Face's files).
struct OurTensor {
  std::string name;
  int64_t cols;
  bool vector;
};

std::vector<OurTensor> our_tensors(const ModelConfig& m) {
  const int64_t C = m.d_model, F = m.ffn_hidden(), NH = m.n_head, HS = m.head_dim();
  std::vector<OurTensor> out = {{"wte", C, false}, {"ln_f/weight", 1, true}};
  if (!m.tie_embeddings) out.push_back({"lm_head", C, false});
  for (int l = 0; l < m.n_layer; l++) {
    const std::string h = "h." + std::to_string(l) + "/";
    out.push_back({h + "ln_1/weight", 1, true});
    out.push_back({h + "ln_2/weight", 1, true});
    out.push_back({h + "attn/qkv/weight", C, false});
    out.push_back({h + "attn/proj/weight", NH * HS, false});
    if (m.is_moe(l)) {  // a Mixtral's sparse MoE block
      out.push_back({h + "mlp/router/weight", C, false});
      out.push_back({h + "mlp/experts/fc/weight", C, false});
      out.push_back({h + "mlp/experts/proj/weight", m.expert_hidden(), false});
      continue;
    }
    out.push_back({h + "mlp/fc/weight", C, false});
    out.push_back({h + "mlp/proj/weight", F, false});
  }
  return out;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); i++) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// Every Hugging Face tensor the model needs, checked; "" or the first problem.
std::string check_tensors(const SafetensorsSet& set, const ModelConfig& m) {
  std::vector<std::string> used;
  for (const OurTensor& t : our_tensors(m)) {
    for (const HfSection& s : hf_llama_sections(t.name, m)) {
      used.push_back(s.hf_name);
      auto it = set.tensors.find(s.hf_name);
      if (it == set.tensors.end())
        return "tensor " + s.hf_name + " is missing (needed for our " + t.name + ")";
      const SafetensorsTensor& st = it->second;
      const std::string file = set.files[st.file].path;
      const std::vector<int64_t> want = t.vector ? std::vector<int64_t>{s.rows}
                                                 : std::vector<int64_t>{s.rows, t.cols};
      if (st.shape != want)
        return "tensor " + s.hf_name + " in " + file + " has shape " + shape_text(st.shape) +
               ", but the config implies " + shape_text(want);
      if (st.dtype != "F32" && st.dtype != "BF16")
        return "tensor " + s.hf_name + " in " + file + " has dtype " + st.dtype +
               ": only F32 and BF16 are read";
    }
  }
  for (const auto& [name, st] : set.tensors) {
    const bool known = std::find(used.begin(), used.end(), name) != used.end();
    const bool ignored = name.size() > 20 && name.compare(name.size() - 20, 20,
                                                          "rotary_emb.inv_freq") == 0;
    const bool tied_head = name == "lm_head.weight" && m.tie_embeddings;  // a stored tied copy
    if (!known && !ignored && !tied_head)
      return "tensor " + name + " in " + set.files[st.file].path + " has no place in a Llama "
             "with this config (an architecture or config.json that does not match?)";
  }
  return "";
}

// A Mixtral's experts, stacked: expert e's fc rows [2eD, 2eD + D) are its w1 (gate), the next D
// its w3 (up); its proj rows [eC, eC + C) are its w2 (down).
std::vector<HfSection> mixtral_expert_sections(const std::string& kind, const std::string& p,
                                               const ModelConfig& m) {
  const int64_t C = m.d_model, D = m.expert_hidden();
  std::vector<HfSection> out;
  for (int64_t e = 0; e < m.n_experts; e++) {
    const std::string x = p + std::to_string(e) + ".";
    if (kind == "mlp/experts/fc/weight") {
      out.push_back({2 * e * D, D, x + "w1.weight"});
      out.push_back({2 * e * D + D, D, x + "w3.weight"});
    } else if (kind == "mlp/experts/proj/weight")
      out.push_back({e * C, C, x + "w2.weight"});
  }
  return out;
}

}  // namespace

std::vector<HfSection> hf_llama_sections(const std::string& name, const ModelConfig& m) {
  const int64_t C = m.d_model, V = m.vocab_size, F = m.ffn_hidden();
  const int64_t q_rows = (int64_t)m.n_head * m.head_dim(), kv_rows = (int64_t)m.kv_heads() * m.head_dim();
  if (name == "wte") return {{0, V, "model.embed_tokens.weight"}};
  if (name == "lm_head") return {{0, V, "lm_head.weight"}};
  if (name == "ln_f/weight") return {{0, C, "model.norm.weight"}};
  if (name.rfind("h.", 0) != 0) return {};
  const size_t slash = name.find('/');
  const std::string p = "model.layers." + name.substr(2, slash - 2) + ".";
  const std::string kind = name.substr(slash + 1);
  if (kind == "ln_1/weight") return {{0, C, p + "input_layernorm.weight"}};
  if (kind == "ln_2/weight") return {{0, C, p + "post_attention_layernorm.weight"}};
  if (kind == "attn/qkv/weight")
    return {{0, q_rows, p + "self_attn.q_proj.weight"},
            {q_rows, kv_rows, p + "self_attn.k_proj.weight"},
            {q_rows + kv_rows, kv_rows, p + "self_attn.v_proj.weight"}};
  if (kind == "attn/proj/weight") return {{0, C, p + "self_attn.o_proj.weight"}};
  if (kind == "mlp/fc/weight")
    return {{0, F, p + "mlp.gate_proj.weight"}, {F, F, p + "mlp.up_proj.weight"}};
  if (kind == "mlp/proj/weight") return {{0, C, p + "mlp.down_proj.weight"}};
  if (kind == "mlp/router/weight") return {{0, m.n_experts, p + "block_sparse_moe.gate.weight"}};
  return mixtral_expert_sections(kind, p + "block_sparse_moe.experts.", m);
}

HfLlamaModel hf_llama_open(const std::string& dir, const ModelConfig& m) {
  HfLlamaModel f;
  f.dir = dir;
  f.model = m;
  std::string err = safetensors_open_dir(dir, &f.files);
  if (err.empty()) err = check_tensors(f.files, m);
  CHECK_ALL(err.empty(), "[init] from = \"%s\" (a Hugging Face directory): %s", dir.c_str(),
            err.c_str());
  return f;
}

void hf_llama_close(HfLlamaModel& f) { safetensors_close(f.files); }

// Rows [row, row + rows) x columns [col, col + cols) of our tensor t, all inside section s (or,
// with s null, in the zero padding), to dst (rows x cols, row-major).
static void read_run(const HfLlamaModel& f, const TensorPlacement& t, const HfSection* s,
                     int64_t row, int64_t rows, int64_t col, int64_t cols, float* dst) {
  if (!s) {
    std::fill(dst, dst + rows * cols, 0.0f);
    return;
  }
  const bool whole_rows = cols == t.cols;
  const int64_t reads = whole_rows ? 1 : rows;
  const size_t count = whole_rows ? (size_t)(rows * cols) : (size_t)cols;
  for (int64_t i = 0; i < reads; i++) {
    const size_t first = (size_t)((row - s->first + i) * t.cols + col);
    const std::string err = safetensors_read(f.files, s->hf_name, first, count, dst + i * count);
    CHECK(err.empty(), "[init] from = \"%s\": %s", f.dir.c_str(), err.c_str());
  }
}

ParamFill hf_llama_fill(const HfLlamaModel& f) {
  return [f](const TensorPlacement& t, const Block& b, float* dst) {
    const std::vector<HfSection> sections = hf_llama_sections(t.name, f.model);
    if (sections.empty()) BUG("tensor %s has no Hugging Face source", t.name.c_str());
    for (int64_t i = 0; i < b.rows;) {
      const int64_t row = b.row + i;
      const HfSection* s = nullptr;
      int64_t end = t.rows;  // the run ends at the section's end (or the next section's start)
      for (const HfSection& sec : sections) {
        if (row >= sec.first && row < sec.first + sec.rows) s = &sec, end = sec.first + sec.rows;
        else if (sec.first > row) end = std::min(end, sec.first);
      }
      const int64_t rows = std::min(b.rows - i, end - row);
      read_run(f, t, s, row, rows, b.col, b.cols, dst + i * b.cols);
      i += rows;
    }
  };
}
