// config/config.h - the run configuration: one plain struct per TOML section, filled from a config
// file plus command-line overrides (`--train.lr=3e-4`) and validated before any work starts.
//
// Every error names the key and where it came from (file:line:col, or the override text) and
// exits non-zero; see config/config.cu (and its parts config/config_schema.cu, config_checks.cu).
// Adding a key means: a field here, a line in the schema in config/config_schema.cu, a line in
// docs/CONFIG.md.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

struct ModelConfig {      // [model]  (required unless [init] from gives the shape)
  int n_layer = 0;
  int n_head = 0;
  int d_model = 0;
  int seq_len = 0;        // T: the length of the sequences trained on
  int max_seq_len = 0;    // rows of the position table wpe, >= seq_len (0 here = seq_len)
  int vocab_size = 0;     // padded internally to a multiple of 128 (padded_vocab())
  // Mixture of experts (model/moe.cu): block l is an MoE block when n_experts > 0 and
  // (l + 1) % moe_every == 0; its MLP becomes n_experts expert MLPs of hidden size d_expert,
  // of which each token uses top_k.
  int n_experts = 0;      // 0 = dense
  int top_k = 2;
  int moe_every = 1;
  int d_expert = 0;       // 0 = 4 * d_model
  // Shared experts (DeepSeek): n_shared_experts dense MLPs of hidden size d_expert that every
  // token of an MoE block runs, summed with the routed output; held as one MLP of hidden size
  // n_shared_experts * d_expert, split over tp like a dense MLP (model/moe.cu).
  int n_shared_experts = 0;
  // The router's scores: "softmax" over the E experts, or "sigmoid" of each logit (the gates are
  // then the chosen scores normalised over the top_k).
  std::string router_score = "softmax";
  // The architecture. "gpt2": LayerNorm, learned positions (wpe), GELU MLP, biases, tied head.
  // "llama" (Hugging Face LlamaForCausalLM's conventions): RMSNorm, rotary positions, SwiGLU MLP,
  // grouped-query attention, no biases, untied head by default.
  std::string arch = "gpt2";
  int n_kv_head = 0;          // key/value heads (GQA); 0 = n_head. Must divide n_head.
  int d_ff = 0;               // MLP hidden size; 0 = the arch's rule (ffn_hidden())
  double rope_theta = 500000.0;  // llama: inv_freq[j] = rope_theta^(-2j/head_dim)
  double norm_eps = 1e-5;     // llama: RMSNorm's epsilon (GPT-2's LayerNorm uses 1e-5 always)
  bool tie_embeddings = true; // head weight = wte; the default is false for llama (resolved
                              // when the config is read)
  bool is_llama() const { return arch == "llama"; }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int head_dim() const { return n_head > 0 ? d_model / n_head : 0; }
  // GPT-2: 4 d_model. Llama (Meta's rule): 8/3 d_model rounded up to a multiple of 256.
  int ffn_hidden() const {
    if (d_ff > 0) return d_ff;
    return is_llama() ? (8 * d_model / 3 + 255) / 256 * 256 : 4 * d_model;
  }
  int padded_vocab() const { return (vocab_size + 127) / 128 * 128; }
  bool is_moe(int layer) const { return n_experts > 0 && (layer + 1) % moe_every == 0; }
  int expert_hidden() const { return d_expert > 0 ? d_expert : 4 * d_model; }
  int shared_hidden() const { return n_experts > 0 ? n_shared_experts * expert_hidden() : 0; }
};

struct InitConfig {       // [init]
  std::string from;       // llm.c model .bin (fp32 v3 or bf16 v5), or a Hugging Face Llama
                          // directory (config.json + safetensors); "" = random init
};

struct DataConfig {       // [data]
  std::vector<std::string> train;  // globs of token shards, one per dataset (required; a
                                   // string in TOML is one glob; data/data_mix.h)
  std::vector<double> weights;     // one per dataset, > 0 (several datasets: required)
  std::string val;        // glob of token shards ("" = no validation)
  bool shuffle = false;   // false: llm.c's unshuffled order
  std::string tokenizer;  // llm.c gpt2_tokenizer.bin for samples ("" = look beside the shards)
  bool allow_changed = false;  // resume on other train files than the checkpoint's (mapped)
  bool document_mask = false;  // attention block-causal over documents (model/documents.h)
  int eot_token = 50256;       // the token that starts each document (GPT-2's end-of-text)
  bool document_positions = true;  // with document_mask: positions restart at each document
};

struct TrainConfig {      // [train]
  int micro_batch = 4;    // sequences per rank per micro-step
  int grad_accum = 1;     // micro-steps per optimizer step
  int steps = 0;          // optimizer steps (required)
  float lr = 3e-4f;
  int warmup_steps = 0;
  std::string lr_schedule = "cosine";  // "cosine" | "constant"
  float min_lr = 0.0f;
  float weight_decay = 0.0f;           // applied to 2-D weights only
  float grad_clip = 1.0f;              // max global grad norm, 0 = off
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  uint64_t seed = 1337;
  std::string recompute = "none";      // "none" | "gelu" | "block"
  float moe_aux_loss = 0.01f;          // load-balancing loss coefficient (MoE)
  float moe_z_loss = 0.0f;             // router z-loss coefficient (MoE)
  // Load balancing (model/moe.cu): "aux_loss" (the moe_aux_loss term only), or "bias"
  // (DeepSeek-V3's auxiliary-loss-free balancing: a per-expert bias added to the scores for the
  // choice only, moved by moe_bias_rate x sign(mean load - load) after every step).
  std::string moe_balance = "aux_loss";
  float moe_bias_rate = 0.001f;
  // Capacity: each expert takes at most ceil(factor x tokens x top_k / E) (token, slot) pairs of
  // a micro-batch, in token order then slot order; the rest are dropped. 0 = dropless.
  float moe_capacity_factor = 0.0f;
  float skip_spikes = 0.0f;            // skip an update whose loss is this many running std
                                       // devs above the running mean (0 = never; health.h)
  int max_skips = 5;                   // ... and stop after this many in a row
  // Where the fp32 master weights and Adam moments live ([parallel] zero >= 1): "none" on the
  // device, "cpu" in pinned host memory, "nvme" in one file per rank under offload_dir; AdamW
  // then runs on the host (parallel/offload.cu).
  std::string optimizer_offload = "none";  // "none" | "cpu" | "nvme"
  std::string offload_dir;                 // nvme: an existing, writable directory
};

struct ParallelConfig {   // [parallel]
  int dp = 1, tp = 1, pp = 1, cp = 1, ep = 1;
  // How attention talks across cp (parallel/context_parallel_a2a.cu): "ring" passes K and V
  // around the cp ranks; "all-to-all" (Ulysses) moves heads so each rank attends over the whole
  // sequence with n_head/cp of them; "hybrid" runs the all-to-all inside groups of cp_a2a
  // consecutive cp ranks and the ring across the groups. cp_a2a: hybrid only (0: unset).
  std::string cp_comm = "ring";  // "ring" | "all-to-all" | "hybrid"
  int cp_a2a = 0;
  bool sp = true;         // sequence parallel (meaningful when tp > 1)
  // Tensor parallelism with sequence parallelism, its all-gathers and reduce-scatters cut into
  // tp chunks on the communication stream, each chunk's GEMM rows starting when its piece
  // arrives (parallel/tensor_parallel_overlap.cu). Needs tp > 1 and sp.
  bool tp_overlap = false;
  // "1f1b" | "gpipe" | "interleaved" | "zb-h1" | "zb-v" | "file:PATH" (pp > 1)
  std::string pp_schedule = "1f1b";
  int pp_virtual = 1;     // model chunks per pipeline rank ("interleaved": >= 2; "zb-v": 2)
  std::vector<int> pp_layers;  // blocks of each of the pp*pp_virtual stages, in model order
                               // (empty: equal, or chosen by pp_balance)
  std::string pp_balance = "equal";  // "equal" | "auto": the split that minimises the slowest
                                     // stage's estimated time (parallel/pipeline_balance.cu)
  // ZeRO stage (parallel/zero.cu has the ladder): 0 DDP, 1 optimizer state sharded, 2 gradients
  // too, 3 weights too (FSDP). fsdp = true is zero = 3; the reader makes the two agree.
  int zero = 0;
  bool fsdp = false;
  // Compressed data-parallel gradient reductions with error feedback (parallel/
  // grad_compression.cu), zero = 0, 1 or 2: "int8" (block-scaled codes) or "topk" (the
  // topk_ratio largest values of each bucket per rank).
  std::string grad_compression = "none";  // "none" | "int8" | "topk"
  // HSDP (parallel/hsdp.cu): dp = dp_replicate x S; the ZeRO stages shard over S consecutive dp
  // ranks and the dp_replicate replicas all-reduce the gradient shards. 1: shard over all of dp.
  int dp_replicate = 1;
  // The dtype the data-parallel gradient reductions travel and sum in (parallel/reduce_dtype.cu):
  // "fp32" | "bf16" (half the bytes, each partial sum rounded to bf16).
  std::string reduce_dtype = "fp32";
  // Gradient buckets (parallel/grad_buckets.cu): consecutive units whose fp32 gradients fit in
  // bucket_mb MiB travel in one reduction. 0: one bucket per unit.
  double bucket_mb = 0;
  // FSDP (parallel/fsdp.cu): how many units ahead of the one computing are gathered (>= 1).
  int fsdp_prefetch = 1;
  double topk_ratio = 0.01;
  // DiLoCo (parallel/diloco.cu): the dp ranks form diloco_islands islands of consecutive dp
  // ranks that train alone and meet every diloco_every steps for an outer Nesterov SGD step.
  // 0 = off; 1 runs the outer step on one island (with outer lr 1 and momentum 0: plain DDP).
  int diloco_islands = 0;
  int diloco_every = 50;
  double diloco_outer_lr = 0.7;
  double diloco_outer_momentum = 0.9;
  // The outer all-reduce over the islands: "none" (fp32) or "int8" (grad_compression's int8
  // scheme, with error feedback of the outer delta: parallel/diloco.h).
  std::string diloco_compression = "none";  // "none" | "int8"
  std::string backend;    // "nccl" | "mpi"; "" = nccl for ./train, mpi for ./train_cpu
  double timeout_s = 600; // a wait for other ranks longer than this ends the job (0 = never)
};

struct PrecisionConfig {  // [precision]
  std::string compute = "fp32";  // "fp32" | "bf16" | "fp8" (block GEMMs in FP8, the rest bf16)
  // "tensorwise" (current scaling) | "delayed" | "rowwise" | "blockwise" | "mxfp8" (model/fp8.h)
  std::string fp8_recipe = "tensorwise";
  int fp8_amax_history = 16;  // delayed: casts of amax history per tensor
  int fp8_margin = 0;         // scales divided by 2^margin (not mxfp8: its scale rule is fixed)
};

struct KernelsConfig {    // [kernels]
  std::string attention = "auto";  // "auto" | "flash" | "cudnn"
  // "off" | "step": the step's forward and backward captured as a CUDA graph once and replayed
  // (training/cuda_graph.h); layouts whose step waits on the host run eagerly, saying why.
  std::string cuda_graph = "off";
};

struct CheckpointConfig { // [checkpoint]
  std::string dir;        // "" = never save
  int every = 0;          // save every this many steps (0 = only after the last step)
  int keep = 3;           // newest checkpoints kept
  std::string resume;     // "" | "latest" | a checkpoint path
  bool overwrite = false; // a run that does not resume may replace the checkpoints in dir
  bool async = false;     // written by a background thread from a host copy (async_save.h)
  int lock_wait_s = 10;   // how long a job waits for another job's lock (checkpoint/dir_lock.h)
};

struct EvalConfig {       // [eval] multiple-choice evaluation (training/eval.h)
  std::string file;       // an llm.c eval file (HellaSwag's format, data/eval_file.h); "" = none
  int every = 0;          // every this many steps and after the last; 0 = never
  int examples = 0;       // score the first this many examples (0 = all)
};

struct LogConfig {        // [log]
  int every = 1;          // print a step line every this many steps
  std::string metrics;    // JSONL path ("" = none)
  int val_every = 0;      // 0 = never
  int val_batches = 10;
  int sample_every = 0;   // 0 = never
  int sample_tokens = 64;
  double sample_temperature = 1.0;  // 0 = greedy (the most likely token)
  int sample_top_k = 0;             // sample among the k most likely tokens (0 = all)
  bool sample_kv_cache = true;      // prefill once, then one token at a time (model/kv_cache.h)
  double peak_tflops = 0; // override of the device's dense peak for MFU (0 = detect)
  bool pipeline_timeline = false;  // pp > 1: print the last step as an ASCII timeline per rank
  bool check_tied = false;  // pp > 1: after every step, compare the two wte copies bit for bit
  bool check_replicas = false;  // tp > 1: after every step, compare the tp ranks' replicated
                                // weights bit for bit
  int straggler_every = 100;      // report the slowest and fastest rank every this many steps
  float straggler_factor = 1.25f; // name a rank whose step is this many times the median's
  bool grad_noise_scale = false;  // the gradient noise scale B_simple (training/noise_scale.h)
  std::string trace;              // "" = none; DIR: per-rank Chrome traces (kernels/trace.h)
  std::vector<int> trace_steps = {2, 2};  // [first, last] step traced, inclusive
};

struct PlanConfig {       // [plan]: the device model of ./train --plan (H100 SXM defaults)
  std::string device = "H100 SXM";  // a row of config/device_peaks.h: the peak by precision
  double peak_tflops = 0;        // dense peak per GPU, TFLOP/s; 0 = the device's at the precision
  double matmul_efficiency = 0.6;  // the fraction of the peak the model's FLOPs run at
  double hbm_gbs = 3350;         // memory bandwidth per GPU, GB/s
  double intra_node_gbs = 450;   // per GPU, each direction, inside a node (NVLink)
  double inter_node_gbs = 50;    // per GPU, each direction, between nodes (400 Gb/s)
  int gpus_per_node = 8;
  double memory_gib = 80;        // per GPU
  double pcie_gbs = 50;          // per GPU, each direction, host <-> device (optimizer offload)
  double nvme_gbs = 6;           // per GPU, file reads and writes (optimizer offload to nvme)
};

struct Config {
  ModelConfig model;
  InitConfig init;
  DataConfig data;
  TrainConfig train;
  ParallelConfig parallel;
  PrecisionConfig precision;
  KernelsConfig kernels;
  CheckpointConfig checkpoint;
  LogConfig log;
  EvalConfig eval;
  PlanConfig plan;
  std::string path;       // the config file
  std::string toml_text;  // the resolved config as TOML (printed at start, saved in checkpoints)
};

// Parses argv = [config.toml, --section.key=value ...]. `world_size` is the number of ranks (the
// product of the parallel degrees must equal it); `default_backend` is "nccl" or "mpi".
// On any error prints a message naming the key and its location and exits non-zero.
// `more`: the checks of the layers above (the pipeline's, which read and simulate a user's
// schedule file: parallel/pipeline_schedule.h, pipeline_config_problems), "" or one problem per
// line, reported with the config's own.
using LayoutCheck = std::function<std::string(const Config& cfg)>;
Config load_config(int argc, char** argv, int world_size, const char* default_backend,
                   const LayoutCheck& more = {});
// Parses a config from TOML text (the file name is used in messages only). Used by load_config
// and to read the config stored in a checkpoint.
Config parse_config_text(const std::string& text, const std::string& source_name,
                         int world_size, const char* default_backend);

// The rules that tie [parallel] to the model, the pipeline schedule and the job
// (config/layout_rules.cu): "" when the layout is valid, else one line per broken rule, each
// naming the degrees and the rule. world_size 0: the product of the degrees is not checked (the
// planner plans the layout the config names). load_config applies them; the planner's search
// asks which layouts of n GPUs pass. `name` says how a message names a key ("parallel.tp" ->
// "[parallel] tp = 2" by default; the config reader adds where each value came from).
using KeyNamer = std::function<std::string(const char* id)>;
std::string layout_problems(const Config& cfg, int world_size, const KeyNamer& name = {});
// The size of the all-to-all groups inside cp that [parallel] cp_comm asks for: 1 for "ring"
// (no all-to-all), cp for "all-to-all", cp_a2a for "hybrid" (parallel/context_parallel_a2a.cu).
int cp_a2a_degree(const ParallelConfig& p);
// The pipeline schedule's own rules (kind, pp ranks, m micro-batches, v chunks per rank, n_layer
// layers; n_layer 0: not checked): "" or the broken ones, one per line.
std::string pipeline_rules(const std::string& kind, int p, int m, int v, int n_layer);
