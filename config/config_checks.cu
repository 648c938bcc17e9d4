// config/config_checks.cu - what makes a config valid, once it is read (config/config_schema.h):
// the [model] shape from an [init] from model file, each value alone and against the others,
// and this job's files. Every problem names the values involved and where each
// came from; all problems of a phase are reported together.
#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>

#include "kernels/common.h"
#include "config/config_schema.h"
#include "config/device_peaks.h"

namespace config_detail {

// ---------------------------------------------------------------------------------------------
// [init] from: the model shape from an llm.c model file.

struct ModelFileShape {
  int version = 0, maxT = 0, V = 0, L = 0, NH = 0, C = 0, Vp = 0;
};

// Reads and checks the header; returns "" or what is wrong with the file.
static std::string read_model_header(const std::string& path, ModelFileShape* shape) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return strf("cannot open the file: %s", std::strerror(errno));
  int32_t h[256] = {0};
  size_t got = std::fread(h, sizeof(int32_t), 256, f);
  std::fseek(f, 0, SEEK_END);
  long bytes = std::ftell(f);
  std::fclose(f);
  if (got != 256) return strf("not an llm.c model file: %ld bytes, shorter than the header", bytes);
  if (h[0] != 20240326) return strf("not an llm.c model file: magic %d, expected 20240326", h[0]);
  if (h[1] != 3 && h[1] != 5)
    return strf("llm.c model file version %d, expected 3 (fp32) or 5 (bf16)", h[1]);
  *shape = ModelFileShape{h[1], h[2], h[3], h[4], h[5], h[6], h[7]};
  const ModelFileShape& s = *shape;
  if (s.maxT <= 0 || s.V <= 0 || s.L <= 0 || s.NH <= 0 || s.C <= 0 ||
      s.Vp != (s.V + 127) / 128 * 128)
    return strf("malformed header: maxT=%d V=%d L=%d NH=%d C=%d Vp=%d (sizes must be positive, "
                "Vp = V rounded up to a multiple of 128)", s.maxT, s.V, s.L, s.NH, s.C, s.Vp);
  // llm.c's parameter count: wte, wpe, L blocks, ln_f; in 128 bits, since a damaged header's
  // sizes overflow 64 (and then no file has the size they imply).
  const __int128 C = s.C;
  const __int128 params = s.Vp * C + s.maxT * C + s.L * (12 * C * C + 13 * C) + 2 * C;
  const __int128 expected = 1024 + params * (s.version == 3 ? 4 : 2);
  if ((__int128)bytes != expected)
    return strf("the file has %ld bytes, but its header (L=%d NH=%d C=%d maxT=%d Vp=%d, "
                "version %d) needs %.0Lf", bytes, s.L, s.NH, s.C, s.maxT, s.Vp, s.version,
                (long double)expected);
  return "";
}

// Fills missing [model] keys from the model file and checks that given ones agree with it. The
// file's maxT is the model's max_seq_len (its wpe rows); seq_len, the length trained at, may be
// anything up to it and defaults to it. Without a file, max_seq_len defaults to seq_len.
// `check_files` false: a model file is opened only when a key is missing.
void resolve_model_shape(Config& cfg, Origins& origins, bool check_files, Problems& problems) {
  const char* names[] = {"n_layer", "n_head", "d_model", "max_seq_len", "vocab_size"};
  int* fields[] = {&cfg.model.n_layer, &cfg.model.n_head, &cfg.model.d_model,
                   &cfg.model.max_seq_len, &cfg.model.vocab_size};
  auto given = [&](const char* name) { return origins.count(std::string("model.") + name) > 0; };
  bool all_given = given("seq_len");
  for (const char* name : {"n_layer", "n_head", "d_model", "seq_len", "vocab_size"}) {
    all_given &= given(name);
    if (!given(name) && cfg.init.from.empty())
      problems.add(strf("missing required key [model] %s in %s (required unless [init] from "
                        "names an llm.c model file)", name, cfg.path.c_str()));
  }
  if (cfg.init.from.empty()) {
    if (!given("max_seq_len")) cfg.model.max_seq_len = cfg.model.seq_len;
    return;
  }
  if (is_hf_directory(cfg.init.from)) {  // a Hugging Face directory: config/config_hf.cu
    resolve_hf_model(cfg, origins, problems);
    return;
  }
  if (all_given && given("max_seq_len") && !check_files) return;
  ModelFileShape s;
  std::string err = read_model_header(cfg.init.from, &s);
  if (!err.empty()) {
    problems.add(mention(cfg, origins, "init.from") + ": " + err);
    return;
  }
  int file[] = {s.L, s.NH, s.C, s.maxT, s.V};
  std::string file_shape, config_shape;
  bool agree = true;
  for (int i = 0; i < 5; i++) {
    std::string id = std::string("model.") + names[i];
    file_shape += strf(" %s=%d", names[i], file[i]);
    if (origins.count(id)) {
      config_shape += strf(" %s=%d (%s)", names[i], *fields[i], origins[id].c_str());
      agree &= *fields[i] == file[i];
    } else {
      *fields[i] = file[i];
      origins[id] = "read from " + cfg.init.from;
    }
  }
  if (!agree)
    problems.add(strf("[model] disagrees with the model file %s: the file has%s; the config "
                      "has%s", mention(cfg, origins, "init.from").c_str(), file_shape.c_str(),
                      config_shape.c_str()));
  if (!given("seq_len")) {
    cfg.model.seq_len = s.maxT;
    origins["model.seq_len"] = "read from " + cfg.init.from;
  }
}

// ---------------------------------------------------------------------------------------------
// [parallel] zero and fsdp.

// [model] tie_embeddings defaults by architecture: GPT-2 ties, Llama does not.
void resolve_architecture(Config& cfg, Origins& origins) {
  if (origins.count("model.tie_embeddings")) return;
  cfg.model.tie_embeddings = !cfg.model.is_llama();
  origins["model.tie_embeddings"] = "default for arch = " + cfg.model.arch;
}

void resolve_sharding(Config& cfg, Origins& origins, Problems& problems) {
  ParallelConfig& p = cfg.parallel;
  const bool zero_given = origins.count("parallel.zero") > 0;
  const bool fsdp_given = origins.count("parallel.fsdp") > 0;
  if (zero_given && fsdp_given && p.fsdp != (p.zero == 3)) {
    problems.add(mention(cfg, origins, "parallel.fsdp") + " and " +
                 mention(cfg, origins, "parallel.zero") + " disagree: fsdp = true is zero = 3 "
                 "(FSDP is ZeRO-3); set one of the two");
    return;
  }
  if (fsdp_given && !zero_given) {
    p.zero = p.fsdp ? 3 : 0;
    origins["parallel.zero"] = "from " + mention(cfg, origins, "parallel.fsdp");
  } else if (zero_given && !fsdp_given) {
    p.fsdp = p.zero == 3;
    origins["parallel.fsdp"] = "from " + mention(cfg, origins, "parallel.zero");
  }
}

// ---------------------------------------------------------------------------------------------
// Value checks.

// Optimizer offload moves the sharded optimizer state off the device: it needs a ZeRO stage, and
// "nvme" a directory.
static void check_offload(Checker& c) {
  const Config& cfg = c.cfg;
  const std::string& offload = cfg.train.optimizer_offload;
  c.require(cfg.parallel.zero >= 0 && cfg.parallel.zero <= 3, "parallel.zero",
            "must be 0 (DDP), 1 (optimizer state sharded), 2 (and gradients) or 3 (and weights: "
            "FSDP)");
  if (offload != "none" && cfg.parallel.zero < 1)
    c.problems.add(mention(cfg, c.origins, "train.optimizer_offload") + " needs a ZeRO stage: " +
                   mention(cfg, c.origins, "parallel.zero") + " keeps the optimizer on the "
                   "device; set zero = 1, 2 or 3");
  if (offload == "nvme" && cfg.train.offload_dir.empty())
    c.problems.add(mention(cfg, c.origins, "train.optimizer_offload") + " needs [train] "
                   "offload_dir, the directory its files go to");
}

// Compressed gradient reductions (parallel/grad_compression.cu) replace DDP's all-reduce and
// ZeRO-1/2's reduce-scatter; FSDP's sharded gradient path is not compressed.
static void check_grad_compression(Checker& c) {
  const Config& cfg = c.cfg;
  if (cfg.parallel.grad_compression == "none") return;
  if (cfg.parallel.zero == 3)
    c.problems.add(mention(cfg, c.origins, "parallel.grad_compression") + " is not supported "
                   "with FSDP (" + mention(cfg, c.origins, "parallel.zero") + "): use zero = 0, "
                   "1 or 2, or grad_compression = \"none\"");
  if (cfg.parallel.reduce_dtype != "fp32")
    c.problems.add(mention(cfg, c.origins, "parallel.grad_compression") + " and " +
                   mention(cfg, c.origins, "parallel.reduce_dtype") + ": compressed reductions "
                   "send their own codes; set reduce_dtype = \"fp32\" or grad_compression = "
                   "\"none\"");
  if (cfg.parallel.grad_compression == "topk")
    c.require(cfg.parallel.topk_ratio > 0 && cfg.parallel.topk_ratio <= 1, "parallel.topk_ratio",
              "must be in (0, 1]: the fraction of each gradient bucket a rank sends");
}

// HSDP (parallel/hsdp.cu): any ZeRO stage, tp, pp, cp, experts. (R | dp is a layout rule:
// config/layout_rules.cu.) The side roads that reduce the dp group their own way are refused.
static void check_hsdp(Checker& c) {
  const Config& cfg = c.cfg;
  const ParallelConfig& p = cfg.parallel;
  if (p.dp_replicate <= 1) return;
  const std::string key = mention(cfg, c.origins, "parallel.dp_replicate");
  if (p.grad_compression != "none")
    c.problems.add(key + " is not supported with " +
                   mention(cfg, c.origins, "parallel.grad_compression") + ": compressed "
                   "reductions run over the whole dp group (set one of them back)");
  if (p.diloco_islands > 0)
    c.problems.add(key + " is not supported with " +
                   mention(cfg, c.origins, "parallel.diloco_islands") + ": the islands cut the "
                   "dp group their own way (set one of them back)");
  if (cfg.log.grad_noise_scale)
    c.problems.add(key + " is not supported with " +
                   mention(cfg, c.origins, "log.grad_noise_scale") + ": its small-batch norm "
                   "is measured over the whole dp group");
}

// Gradient buckets (parallel/grad_buckets.cu) and FSDP's prefetch depth (parallel/fsdp.cu).
// Compressed reductions keep an error-feedback residual per unit, so they are not bucketed.
static void check_buckets_and_prefetch(Checker& c) {
  const Config& cfg = c.cfg;
  const ParallelConfig& p = cfg.parallel;
  c.require(p.bucket_mb >= 0, "parallel.bucket_mb",
            "must be >= 0 (MiB of fp32 gradients per bucket; 0 = one bucket per unit)");
  if (p.bucket_mb > 0 && p.grad_compression != "none")
    c.problems.add(mention(cfg, c.origins, "parallel.bucket_mb") + " is not supported with " +
                   mention(cfg, c.origins, "parallel.grad_compression") + ": compressed "
                   "reductions keep their error feedback per unit (set bucket_mb = 0 or "
                   "grad_compression = \"none\")");
  c.require(p.fsdp_prefetch >= 1, "parallel.fsdp_prefetch",
            "must be >= 1 (the units gathered ahead of the one computing)");
  if (p.fsdp_prefetch > 1 && p.zero != 3)
    c.problems.add(mention(cfg, c.origins, "parallel.fsdp_prefetch") + " needs FSDP: " +
                   mention(cfg, c.origins, "parallel.zero") + " keeps whole weights, there is "
                   "nothing to gather ahead (set zero = 3, or fsdp_prefetch = 1)");
}

// [parallel] tp_overlap (parallel/tensor_parallel_overlap.cu) cuts sequence parallelism's
// all-gathers and reduce-scatters into tp chunks: it needs tp > 1 and sp. FP8 linears scale each
// GEMM call by its own input's amax (agreed over the group), so a GEMM cut into chunks would scale
// differently: refused with FP8.
static void check_tp_overlap(Checker& c) {
  const Config& cfg = c.cfg;
  const ParallelConfig& p = cfg.parallel;
  if (!p.tp_overlap) return;
  const std::string key = mention(cfg, c.origins, "parallel.tp_overlap");
  if (p.tp <= 1)
    c.problems.add(key + " overlaps tensor parallelism's collectives with its GEMMs, but " +
                   mention(cfg, c.origins, "parallel.tp") + " has none: set tp > 1 or "
                   "tp_overlap = false");
  if (!p.sp)
    c.problems.add(key + " cuts sequence parallelism's all-gathers and reduce-scatters into "
                   "chunks, but " + mention(cfg, c.origins, "parallel.sp") + ": set sp = true "
                   "or tp_overlap = false");
  if (cfg.precision.compute == "fp8")
    c.problems.add(key + " is not supported with " +
                   mention(cfg, c.origins, "precision.compute") + ": an FP8 GEMM scales by its "
                   "whole input's amax, which a GEMM cut into chunks would not see (set "
                   "tp_overlap = false or compute = \"bf16\")");
}

// DiLoCo islands (parallel/diloco.cu): K islands of dp/K consecutive dp ranks, with any ZeRO stage,
// tp, pp, cp, ep and experts inside. (K | dp and ep | dp/K * cp are layout rules:
// config/layout_rules.cu.)
static void check_diloco(Checker& c) {
  const Config& cfg = c.cfg;
  const ParallelConfig& p = cfg.parallel;
  auto key = [&](const char* id) { return mention(cfg, c.origins, id); };
  c.require(p.diloco_islands >= 0, "parallel.diloco_islands", "must be >= 0 (0 = off)");
  if (p.diloco_islands <= 0) return;
  c.require(p.diloco_every >= 1, "parallel.diloco_every", "must be >= 1 (inner steps per outer step)");
  c.require(p.diloco_outer_lr > 0, "parallel.diloco_outer_lr", "must be > 0");
  c.require(p.diloco_outer_momentum >= 0 && p.diloco_outer_momentum < 1,
            "parallel.diloco_outer_momentum", "must be in [0, 1)");
  const std::string k = key("parallel.diloco_islands");
  // cp, ep and experts live inside the islands: the dp x cp and ep-dp groups are the island's
  // (parallel/mesh.h) and the expert groups may not straddle two (ep | dp/K * cp, a layout rule).
  // The noise scale's big batch is the island's (check_noise_scale).
}

// The gradient noise scale (training/noise_scale.h) reads one dp rank's whole first micro-batch
// gradient before it is reduced (parallel/small_batch_norm.cu): any ZeRO stage, tp, cp, pp with
// the 1f1b schedule, experts without ep, DiLoCo islands; and it needs two batch sizes (inside an
// island).
static void check_noise_scale(Checker& c) {
  const Config& cfg = c.cfg;
  if (!cfg.log.grad_noise_scale) return;
  const ParallelConfig& p = cfg.parallel;
  const std::string key = mention(cfg, c.origins, "log.grad_noise_scale");
  if (p.ep > 1 && cfg.model.n_experts > 0)
    c.problems.add(key + " is not supported with " + mention(cfg, c.origins, "parallel.ep") +
                   " > 1: a rank's expert gradient mixes the tokens of the ep group's dp ranks "
                   "before any reduction, so no part of it is one dp rank's small batch (use "
                   "ep = 1: experts on every dp rank)");
  if (p.pp > 1 && p.pp_schedule != "1f1b")
    c.problems.add(key + " with " + mention(cfg, c.origins, "parallel.pp") + " needs "
                   "[parallel] pp_schedule = \"1f1b\" (got " +
                   mention(cfg, c.origins, "parallel.pp_schedule") + "): every stage must "
                   "measure its first micro-batch's gradient before another micro-batch adds "
                   "to it, and the last stage's head adds in its forward");
  const int dp_island = std::max(1, p.dp) / std::max(1, p.diloco_islands);
  if (dp_island * std::max(1, cfg.train.grad_accum) < 2)
    c.problems.add(key + " needs two batch sizes: " + mention(cfg, c.origins, "parallel.dp") +
                   (p.diloco_islands > 1 ? " / diloco_islands" : "") + " or " +
                   mention(cfg, c.origins, "train.grad_accum") + " must be >= 2");
}

// FP8 GEMMs need every matrix dimension to be a multiple of 16 (cuBLASLt's FP8 rule on Hopper):
// the channels per tensor-parallel rank d_model/tp (then also 3 and 4 times it) and the tokens
// of a micro-batch, micro_batch * seq_len (the depth of the weight-gradient GEMM).
static void check_fp8_shapes(Checker& c) {
  const Config& cfg = c.cfg;
  if (cfg.precision.compute != "fp8") return;
  const int tp = std::max(1, cfg.parallel.tp);
  if (cfg.model.d_model > 0 && (cfg.model.d_model % tp != 0 || (cfg.model.d_model / tp) % 16))
    c.problems.add(mention(cfg, c.origins, "precision.compute") + " needs d_model/tp to be a "
                   "multiple of 16 (FP8 GEMM dimensions), got " +
                   mention(cfg, c.origins, "model.d_model") + " / " +
                   mention(cfg, c.origins, "parallel.tp"));
  const ModelConfig& m = cfg.model;
  const int kv_width = m.kv_heads() * m.head_dim();  // llama: the k and v sections of qkv
  if (m.is_llama() && m.n_head > 0 &&
      (m.ffn_hidden() % tp != 0 || (m.ffn_hidden() / tp) % 16 || kv_width % tp != 0 ||
       (kv_width / tp) % 16))
    c.problems.add(mention(cfg, c.origins, "precision.compute") + strf(" needs d_ff/tp and "
                   "n_kv_head*head_dim/tp to be multiples of 16 (FP8 GEMM dimensions), got d_ff "
                   "= %d, n_kv_head*head_dim = %d, tp = %d", m.ffn_hidden(), kv_width, tp));
  const long tokens = (long)cfg.train.micro_batch * cfg.model.seq_len;
  if (tokens > 0 && tokens % 16 != 0)
    c.problems.add(mention(cfg, c.origins, "precision.compute") + " needs micro_batch * seq_len "
                   "to be a multiple of 16 (the depth of the FP8 weight-gradient GEMM), got " +
                   mention(cfg, c.origins, "train.micro_batch") + " * " +
                   mention(cfg, c.origins, "model.seq_len"));
}

// Mixture of experts: the [model] keys and what they need of the rest of the config.
static void check_experts(Checker& c) {
  const Config& cfg = c.cfg;
  const ModelConfig& m = cfg.model;
  auto key = [&](const char* id) { return mention(cfg, c.origins, id); };
  c.require(m.n_experts >= 0, "model.n_experts", "must be >= 0 (0 = a dense model)");
  c.require(m.d_expert >= 0, "model.d_expert", "must be >= 0 (0 = 4 * d_model)");
  c.require(m.n_shared_experts >= 0, "model.n_shared_experts", "must be >= 0");
  c.require(cfg.train.moe_capacity_factor >= 0, "train.moe_capacity_factor",
            "must be >= 0 (0 = dropless)");
  if (m.n_experts <= 0) {
    if (cfg.parallel.ep > 1)
      c.problems.add(key("parallel.ep") + " needs experts to shard: set [model] n_experts "
                     "(a multiple of ep), or ep = 1 for a dense model");
    if (cfg.train.moe_balance == "bias")
      c.problems.add(key("train.moe_balance") + " balances experts, but " +
                     key("model.n_experts") + " is a dense model");
    if (m.n_shared_experts > 0)
      c.problems.add(key("model.n_shared_experts") + " needs an MoE model, but " +
                     key("model.n_experts") + " is a dense model");
    return;
  }
  c.require(m.top_k >= 1 && m.top_k <= m.n_experts, "model.top_k",
            strf("must be between 1 and [model] n_experts = %d", m.n_experts));
  if (cfg.train.moe_balance == "bias" && cfg.parallel.diloco_islands > 0)
    c.problems.add(key("train.moe_balance") + " agrees the biases over the whole job, but " +
                   key("parallel.diloco_islands") + " trains islands apart");
  const int shared = m.shared_hidden(), tp = std::max(1, cfg.parallel.tp);
  if (shared > 0 && shared % tp != 0)
    c.problems.add(key("model.n_shared_experts") + " x d_expert = " + std::to_string(shared) +
                   " (the shared MLP's hidden size) is not a multiple of " + key("parallel.tp"));
  c.require(m.moe_every >= 1 && m.moe_every <= std::max(1, m.n_layer), "model.moe_every",
            strf("must be between 1 and [model] n_layer = %d (block l is an MoE block when "
                 "(l + 1) %% moe_every == 0)", m.n_layer));
  if (cfg.parallel.ep > 0 && m.n_experts % cfg.parallel.ep != 0)
    c.problems.add(key("model.n_experts") + " is not a multiple of " + key("parallel.ep") +
                   " (each expert-parallel rank holds n_experts/ep experts)");
  if (!cfg.init.from.empty() && !is_hf_directory(cfg.init.from))  // a Mixtral directory is read
    c.problems.add(key("init.from") + " names an llm.c model, which is dense; it cannot start "
                   "a model with " + key("model.n_experts"));
}

// [kernels] attention = "cudnn" runs cuDNN's SDPA graph, which this trainer builds for as many
// key/value heads as query heads and with a plain causal mask: grouped-query attention and packed
// documents' block-causal mask take the hand-written kernels ("auto" chooses them by itself and
// says why, kernels/cuda/attention.cu).
static void check_attention_kernels(Checker& c) {
  const Config& cfg = c.cfg;
  if (cfg.kernels.attention != "cudnn") return;
  if (cfg.model.n_head > 0 && cfg.model.kv_heads() != cfg.model.n_head)
    c.problems.add(mention(cfg, c.origins, "kernels.attention") + ": cuDNN's attention here "
                   "does not run grouped-query attention (" +
                   mention(cfg, c.origins, "model.n_kv_head") + " < n_head); use \"flash\" or "
                   "\"auto\"");
  if (cfg.data.document_mask)
    c.problems.add(mention(cfg, c.origins, "kernels.attention") + ": cuDNN's attention here "
                   "has no block-causal document mask, which " +
                   mention(cfg, c.origins, "data.document_mask") + " asks for; use \"flash\" "
                   "or \"auto\" (the flash kernels apply it)");
}

// [data] document_mask's end-of-text token must be a token of the vocabulary.
static void check_documents(Checker& c) {
  const Config& cfg = c.cfg;
  if (!cfg.data.document_mask || cfg.model.vocab_size <= 0) return;
  if (cfg.data.eot_token < 0 || cfg.data.eot_token >= cfg.model.vocab_size)
    c.problems.add(mention(cfg, c.origins, "data.eot_token") + strf(" is outside the vocabulary "
                   "[0, %d) of ", cfg.model.vocab_size) + mention(cfg, c.origins,
                   "model.vocab_size") + ": with [data] document_mask each document starts at "
                   "this token, so it must be a token id the data can hold");
}

// [data] train and weights: one positive weight per dataset (data/data_mix.h).
static void check_mix(Checker& c) {
  const DataConfig& d = c.cfg.data;
  const std::string train = mention(c.cfg, c.origins, "data.train");
  for (const std::string& glob : d.train)
    if (glob.empty()) c.problems.add(train + ": an empty glob");
  if (d.train.size() > 1 && d.weights.size() != d.train.size())
    c.problems.add(mention(c.cfg, c.origins, "data.weights") +
                   strf(" has %zu weight%s for the %zu datasets of ", d.weights.size(),
                        d.weights.size() == 1 ? "" : "s", d.train.size()) + train +
                   ": give one weight per dataset, e.g. weights = [0.7, 0.3]");
  else if (d.train.size() == 1 && d.weights.size() > 1)
    c.problems.add(mention(c.cfg, c.origins, "data.weights") +
                   strf(" has %zu weights for the one dataset of ", d.weights.size()) + train);
  for (double w : d.weights)
    if (!(w > 0)) {
      c.problems.add(mention(c.cfg, c.origins, "data.weights") +
                     strf(": every weight must be > 0 (got %g): a dataset's share of the rows is "
                          "its weight / the sum of the weights", w));
      break;
    }
}

// The architecture's keys ([model] arch and the llama-only ones).
static void check_architecture(Checker& c) {
  const Config& cfg = c.cfg;
  const ModelConfig& m = cfg.model;
  auto key = [&](const char* id) { return mention(cfg, c.origins, id); };
  c.require(m.n_kv_head >= 0, "model.n_kv_head", "must be >= 0 (0 = n_head)");
  c.require(m.d_ff >= 0, "model.d_ff", "must be >= 0 (0 = the architecture's default)");
  c.require(m.rope_theta > 0, "model.rope_theta", "must be > 0");
  c.require(m.norm_eps > 0, "model.norm_eps", "must be > 0");
  if (m.n_head > 0 && m.n_kv_head > 0 && m.n_head % m.n_kv_head != 0)
    c.problems.add(key("model.n_kv_head") + " does not divide " + key("model.n_head") +
                   " (each key/value head serves n_head / n_kv_head query heads)");
  if (m.is_llama() && m.n_head > 0 && m.d_model % m.n_head == 0 && m.head_dim() % 2 != 0)
    c.problems.add(key("model.d_model") + " / " + key("model.n_head") + strf(" = head size %d, "
                   "odd: rotary embeddings rotate the two halves of each head", m.head_dim()));
  if (m.is_llama()) {
    if (!cfg.init.from.empty() && !is_hf_directory(cfg.init.from))
      c.problems.add(key("init.from") + " is a file, read as an llm.c model (GPT-2), but " +
                     key("model.arch") + ": a Llama starts from a Hugging Face directory "
                     "(config.json + model.safetensors), a checkpoint or random init");
    return;
  }
  const ModelConfig defaults;
  if (m.rope_theta != defaults.rope_theta)
    c.problems.add(key("model.rope_theta") + ": GPT-2 has no rotary positions (arch = \"llama\")");
  if (m.norm_eps != defaults.norm_eps)
    c.problems.add(key("model.norm_eps") + ": GPT-2's LayerNorm epsilon is fixed at 1e-5");
  if (m.n_kv_head > 0 && m.n_kv_head != m.n_head)
    c.problems.add(key("model.n_kv_head") + ": grouped-query attention needs arch = \"llama\"");
  if (!m.tie_embeddings)
    c.problems.add(key("model.tie_embeddings") + ": GPT-2's head is the embedding (tied)");
}

void check_values(Checker& c) {
  const Config& cfg = c.cfg;
  for (const char* id : {"model.n_layer", "model.n_head", "model.d_model", "model.seq_len",
                         "model.max_seq_len", "model.vocab_size", "train.micro_batch",
                         "train.grad_accum", "train.steps", "parallel.dp", "parallel.tp",
                         "parallel.pp", "parallel.cp", "parallel.ep", "log.every",
                         "log.val_batches", "log.sample_tokens", "precision.fp8_amax_history",
                         "parallel.pp_virtual", "plan.gpus_per_node"})
    c.require(c.int_value(id) > 0, id, "must be positive");
  for (const char* id : {"train.warmup_steps", "checkpoint.every", "checkpoint.lock_wait_s", "log.val_every",
                         "log.sample_every", "precision.fp8_margin", "log.straggler_every",
                         "log.sample_top_k", "eval.every", "eval.examples"})
    c.require(c.int_value(id) >= 0, id, "must be >= 0");
  for (const char* id : {"train.lr", "train.min_lr", "train.weight_decay", "train.grad_clip",
                         "log.peak_tflops", "plan.peak_tflops", "train.moe_aux_loss", "train.moe_z_loss", "train.moe_bias_rate",
                         "parallel.timeout_s", "train.skip_spikes",
                         "log.sample_temperature"})
    c.require(c.float_value(id) >= 0, id, "must be >= 0");
  c.require(cfg.train.max_skips >= 1, "train.max_skips", "must be >= 1");
  c.require(cfg.eval.every == 0 || !cfg.eval.file.empty(), "eval.every",
            "needs [eval] file (the examples to score)");
  c.require(cfg.log.straggler_factor > 1, "log.straggler_factor", "must be > 1");
  const std::vector<int>& traced = cfg.log.trace_steps;
  c.require(traced.size() == 2 && traced[0] >= 1 && traced[1] >= traced[0], "log.trace_steps",
            "must be [first, last] with 1 <= first <= last");
  c.require(device_peak_by_name(cfg.plan.device) != nullptr, "plan.device",
            "must be one of " + device_peak_names());
  for (const char* id : {"plan.matmul_efficiency", "plan.hbm_gbs",
                         "plan.intra_node_gbs", "plan.inter_node_gbs", "plan.memory_gib",
                         "plan.pcie_gbs", "plan.nvme_gbs"})
    c.require(c.float_value(id) > 0, id, "must be > 0");
  for (const char* id : {"train.beta1", "train.beta2"})
    c.require(c.float_value(id) >= 0 && c.float_value(id) < 1, id, "must be in [0, 1)");
  c.require(cfg.train.eps > 0, "train.eps", "must be > 0");
  c.require(cfg.checkpoint.keep >= 1, "checkpoint.keep", "must be >= 1");
  // A weight matrix is told from a vector (LayerNorm gains, biases: no weight decay) by having
  // more than one column (model/gpt_layout.cu), and d_model is the columns of wte and qkv.
  if (cfg.model.d_model == 1)
    c.require(false, "model.d_model", "must be >= 2: with d_model = 1 the embedding and the "
              "attention matrices have one column and would be taken for vectors");
  if (cfg.model.n_head > 0 && cfg.model.d_model % cfg.model.n_head != 0)
    c.problems.add(mention(cfg, c.origins, "model.n_head") + " does not divide " +
                   mention(cfg, c.origins, "model.d_model"));
  if (cfg.model.seq_len > 0 && cfg.model.seq_len > cfg.model.max_seq_len)
    c.problems.add(mention(cfg, c.origins, "model.seq_len") + " exceeds " +
                   mention(cfg, c.origins, "model.max_seq_len") + ": a run uses the first "
                   "seq_len rows of the position table (wpe), which has max_seq_len rows, so "
                   "seq_len must be <= max_seq_len (for random init, raise [model] max_seq_len)");
  // Token positions are 32-bit ints in the kernels and the pipeline: a rank's tokens of a step
  // (micro_batch x seq_len of each of grad_accum micro-batches) must fit one.
  const double step_tokens =
      (double)cfg.train.micro_batch * cfg.model.seq_len * std::max(1, cfg.train.grad_accum);
  if (step_tokens > INT_MAX)
    c.problems.add(mention(cfg, c.origins, "train.micro_batch") + " x " +
                   mention(cfg, c.origins, "model.seq_len") + " x " +
                   mention(cfg, c.origins, "train.grad_accum") + strf(" = %.0f tokens of a step on "
                   "a rank, more than 2^31 - 1: token positions are 32-bit ints", step_tokens));
  if (cfg.train.min_lr > cfg.train.lr)
    c.problems.add(mention(cfg, c.origins, "train.min_lr") + " is greater than " +
                   mention(cfg, c.origins, "train.lr"));
  if (cfg.log.val_every > 0 && cfg.data.val.empty())
    c.problems.add(mention(cfg, c.origins, "log.val_every") + " needs [data] val (validation "
                   "shards), which is not set");
  if (cfg.checkpoint.resume == "latest" && cfg.checkpoint.dir.empty())
    c.problems.add(mention(cfg, c.origins, "checkpoint.resume") + " needs [checkpoint] dir");
  check_sizes(c);
  check_architecture(c);
  check_attention_kernels(c);
  check_documents(c);
  check_mix(c);
  check_fp8_shapes(c);
  check_experts(c);
  check_offload(c);
  check_grad_compression(c);
  check_noise_scale(c);
  check_diloco(c);
  check_hsdp(c);
  check_buckets_and_prefetch(c);
  check_tp_overlap(c);
}

// "" when `dir` is a directory this process can create files in, else what is wrong. Tries it:
// permission bits say nothing to root, and a read-only mount says nothing in them. The probe
// file is removed at once; nothing is written anywhere else.
static std::string offload_dir_problem(const std::string& dir) {
  struct stat st;
  if (stat(dir.c_str(), &st) != 0)
    return strf("no such directory (%s): optimizer offload does not create it", std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) return "not a directory";
  const std::string probe = strf("%s/.offload_probe_%d", dir.c_str(), (int)getpid());
  const int fd = open(probe.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0600);
  if (fd < 0) return strf("not writable: cannot create a file in it (%s)", std::strerror(errno));
  close(fd);
  unlink(probe.c_str());
  return "";
}

// The checks that need this machine (files).
void check_files(Checker& c) {
  const Config& cfg = c.cfg;
  auto matches = [](const std::string& pattern) {
    glob_t g;
    const int rc = glob(pattern.c_str(), 0, nullptr, &g);
    const size_t n = rc == 0 ? g.gl_pathc : 0;
    if (rc == 0) globfree(&g);
    return n;
  };
  for (const std::string& pattern : cfg.data.train)
    c.require(pattern.empty() || matches(pattern) > 0, "data.train",
              cfg.data.train.size() == 1 ? std::string("the pattern matches no file")
                                         : "the pattern \"" + pattern + "\" matches no file");
  if (!cfg.data.val.empty())
    c.require(matches(cfg.data.val) > 0, "data.val", "the pattern matches no file");
  if (cfg.train.optimizer_offload == "nvme" && !cfg.train.offload_dir.empty()) {
    const std::string problem = offload_dir_problem(cfg.train.offload_dir);
    if (!problem.empty()) c.require(false, "train.offload_dir", problem);
  }
  struct stat st;
  const std::string& tokenizer = cfg.data.tokenizer;
  if (!tokenizer.empty())
    c.require(stat(tokenizer.c_str(), &st) == 0 && S_ISREG(st.st_mode), "data.tokenizer",
              "no such file (\"\" = look for tokenizer.bin beside the train shards)");
  const std::string& resume = cfg.checkpoint.resume;
  if (!resume.empty() && resume != "latest")
    c.require(stat(resume.c_str(), &st) == 0, "checkpoint.resume",
              "no such checkpoint (expected \"\", \"latest\" or an existing path)");
}

}  // namespace config_detail
