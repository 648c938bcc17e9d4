// config/size_limits.cu - the bounds of config/size_limits.h: the sizes' rules (check_sizes,
// part of the config's value checks) and the memory a shape needs at least
// (memory_bound_problem, at start-up).
#include "config/size_limits.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "config/config_schema.h"

using config_detail::strf;

namespace {

// The parameter count by what makes it large: the vocabulary's (wte, an untied head), the
// positions' (wpe), the blocks'.
struct ParameterTerms {
  long double vocab = 0, positions = 0, blocks = 0;
  long double total() const { return vocab + positions + blocks; }
};

ParameterTerms parameter_terms(const ModelConfig& m) {
  ParameterTerms t;
  const long double C = m.d_model, L = m.n_layer;
  const long double Vp = std::ceil((long double)m.vocab_size / 128) * 128;
  const long double F = m.d_ff > 0 ? (long double)m.d_ff
                        : m.is_llama() ? std::ceil(8 * C / 3 / 256) * 256 : 4 * C;
  t.vocab = Vp * C * (m.tie_embeddings ? 1 : 2);
  if (!m.is_llama()) t.positions = (long double)m.max_seq_len * C;
  const long double head = m.n_head > 0 ? C / m.n_head : 0;
  const long double attention = C * C * 2 + 2 * C * head * m.kv_heads();  // q, o; k, v
  const long double dense_mlp = (m.is_llama() ? 3 : 2) * C * F;
  const long double expert_mlp = (long double)m.n_experts * 2 * C * m.expert_hidden() +
                                 (long double)(m.is_llama() ? 3 : 2) * C * m.shared_hidden();
  const long double moe_blocks = m.n_experts > 0 && m.moe_every > 0 ? std::floor(L / m.moe_every)
                                                                    : 0;
  t.blocks = L * attention + (L - moe_blocks) * dense_mlp + moe_blocks * expert_mlp;
  return t;
}

std::string gib(long double bytes) {
  char s[64];
  std::snprintf(s, sizeof(s), "%.0Lf bytes (%.3Lg GiB)", bytes, bytes / (1024.0L * 1024 * 1024));
  return s;
}

// The keys that make the shape large: its largest term's.
std::string large_keys(const ModelConfig& m) {
  const ParameterTerms t = parameter_terms(m);
  char s[200];
  if (t.vocab >= t.positions && t.vocab >= t.blocks)
    std::snprintf(s, sizeof(s), "[model] vocab_size = %d x d_model = %d", m.vocab_size,
                  m.d_model);
  else if (t.positions >= t.blocks)
    std::snprintf(s, sizeof(s), "[model] max_seq_len = %d x d_model = %d", m.max_seq_len,
                  m.d_model);
  else
    std::snprintf(s, sizeof(s), "[model] n_layer = %d x d_model = %d%s", m.n_layer, m.d_model,
                  m.n_experts > 0 ? " (and the experts)" : "");
  return s;
}

}  // namespace

long double model_parameters(const ModelConfig& m) { return parameter_terms(m).total(); }

size_t host_available_memory() {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    if (line.compare(0, 13, "MemAvailable:") != 0) continue;
    std::istringstream fields(line.substr(13));
    unsigned long long kib = 0;
    fields >> kib;
    return (size_t)kib * 1024;
  }
  return 0;
}

std::string memory_bound_problem(const Config& cfg, size_t device_free, size_t host_free,
                                 bool device_is_host) {
  const ModelConfig& m = cfg.model;
  const ParallelConfig& p = cfg.parallel;
  const long double P = model_parameters(m);
  const long double split = (long double)std::max(1, p.tp) * std::max(1, p.pp) *
                            std::max(1, p.cp) * std::max(1, p.ep);
  const long double dp = std::max(1, p.dp);
  const long double weight_bytes = cfg.precision.compute == "fp32" ? 4 : 2;
  const long double working = P / split * weight_bytes / (p.zero == 3 ? dp : 1);
  const long double optimizer = P / split * 12 / (p.zero >= 1 ? dp : 1);
  const long double activations = (long double)cfg.train.micro_batch * m.seq_len * m.d_model *
                                   m.n_layer * weight_bytes / split;
  const std::string offload = cfg.train.optimizer_offload;
  // A Llama's rotary tables (model/rope.cu): cos and sin of max_seq_len x head_dim/2, on the
  // host and again on the device.
  const long double rope = m.is_llama() ? (long double)m.max_seq_len * m.head_dim() * 4 : 0;
  long double device = working + activations + rope + (offload == "none" ? optimizer : 0);
  long double host = rope + (offload == "cpu" ? optimizer : 0);
  if (device_is_host) device += host, host = 0;
  std::string keys = large_keys(m);
  if (rope > working + optimizer)
    keys = strf("[model] max_seq_len = %d (the rotary tables: max_seq_len x head_dim floats)",
                m.max_seq_len);
  char params[64];
  std::snprintf(params, sizeof(params), "%.4Lg parameters", P);
  if (device_free > 0 && device > (long double)device_free)
    return keys + " make a model of " + params + ": each rank needs at least " + gib(device) +
           (device_is_host ? " of host memory" : " of device memory") + " (the weights, " +
           (offload == "none" ? "the fp32 master and Adam moments, " : "") +
           "one activation per layer and token, split over every parallel degree), but " +
           (device_is_host ? "the host has " : "the device has ") + gib(device_free) + " free";
  if (host_free > 0 && host > (long double)host_free)
    return keys + " make a model of " + params + ": " + (offload == "cpu" ? "with [train] "
           "optimizer_offload = \"cpu\" " : "") +
           "each rank needs at least " + gib(host) + " of host memory (the fp32 master and "
           "Adam moments" + (rope > 0 ? std::string(", the rotary tables") : "") + "), but the "
           "host has " + gib(host_free) + " available";
  return "";
}

namespace config_detail {

void check_sizes(Checker& c) {
  const Config& cfg = c.cfg;
  const ModelConfig& m = cfg.model;
  c.require(m.vocab_size <= kMaxVocabSize, "model.vocab_size",
            strf("must be <= %d: the vocabulary padded to a multiple of 128 must be an int",
                 kMaxVocabSize));
  const long double P = model_parameters(m);
  if (P >= 9007199254740992.0L)  // 2^53
    c.problems.add(large_keys(m) + strf(" make a model of %.4Lg parameters, more than 2^53 (its "
                                        "byte counts would overflow 64 bits)", P));
  c.require(cfg.log.sample_tokens <= kMaxSampleTokens, "log.sample_tokens",
            strf("must be <= %d (a sample is a glance at the model, not a corpus)",
                 kMaxSampleTokens));
  c.require(cfg.log.val_batches <= kMaxValBatches, "log.val_batches",
            strf("must be <= %d (an evaluation that long would stop training for days)",
                 kMaxValBatches));
}

}  // namespace config_detail
