// training/metrics.h - what a run reports: the per-step line, the JSONL metrics file, the
// end-of-run summary, and the FLOP accounting behind MFU (docs/PERF.md works the formulas out for
// GPT-2 124M and Llama-3 8B).
//
// Model FLOPs per token, for every architecture, from the layout:
//     causal = 6 N + 6 L T d      (causal attention counted at half: llm.c, Megatron-LM)
//     full   = 6 N + 12 L T d     (attention counted in full: PaLM, torchtitan)
// N: the parameters a token's matmuls use, 2 FLOPs each forward and 4 backward. It is the
// layout's active parameter count (a mixture of experts: the dense parameters, the routers and
// top_k of the E experts of each MoE block; Llama: GQA's smaller k/v rows, SwiGLU's three
// matrices), with the head counted once as the output matmul (Vp padded rows, as llm.c does),
// minus an untied model's input embedding (a lookup, no FLOPs). Norms, biases and GPT-2's wpe
// stay in N (llm.c's count; they are < 1% of it). L T d: per layer and token, QK^T and AV over
// T keys cost 2 T d FLOPs each forward (d = n_head * head_dim = d_model), times 3 for the
// backward; causal masking skips half of them. For GPT-2 `causal` is llm.c's 6N + 6LCT exactly.
// Packed documents ([data] document_mask): attention runs within each document only, so, as
// Megatron-LM counts packed sequences, its FLOPs are those of the documents: a row's L T d terms
// become L d (sum over its documents of len^2) / T, i.e. the attention terms are scaled by the
// step's fraction sum len^2 / (rows T^2) (step_throughput's attention_fraction, measured on the
// reporting rank's rows; 1 without documents).
// HFU counts what runs: `hardware` = causal plus the forward that "block" recompute runs again
// (2 N_blocks + 2 L T d; "gelu" recompute adds no matmul FLOPs).
// MFU = achieved model FLOP/s over the dense peak of all devices in the run (config/
// device_peaks.h: the BF16 peak, the FP8 one for fp8 runs; fp32 runs use the BF16 peak).
#pragma once
#include <vector>

#include "training/noise_scale.h"
#include "model/fp8.h"
#include <cstdio>
#include <string>

#include "model/gpt.h"
#include "model/moe.h"
#include "parallel/comm.h"
#include "parallel/offload.h"

struct FlopsPerToken {
  double causal = 0;    // 6 N + 6 L T d
  double full = 0;      // 6 N + 12 L T d
  double hardware = 0;  // causal + recompute's second forward
  double matmul_parameters = 0;  // N
  double attention = 0;           // 6 L T d: causal's attention part (full has twice it)
  double hardware_attention = 0;  // hardware's attention part (recompute's forward adds a third)
};
FlopsPerToken flops_per_token(const GPTLayout& g, Recompute r);
// `,"comm":{axis:{collective:{"calls":n,"bytes":n}...}...}`: the counters of the axes used, as
// a step record of the metrics file (and the planner's JSON) holds them.
void print_comm_json(FILE* f, const CommStats& st);
// `,"offload":{"to_host_bytes":n,"to_device_bytes":n,"disk_read_bytes":n,"disk_write_bytes":n}`
void print_offload_json(FILE* f, const OffloadStats& st);
// The dense peak TFLOP/s of one device at the run's precision ([precision] compute): the
// override when > 0, else the device's row of config/device_peaks.h by its driver name. 0 when
// unknown (the CPU, an unlisted GPU): MFU is then reported as null. `source` says which.
double run_peak_tflops(const std::string& device_name, const std::string& compute,
                       double override_tflops, std::string* source);

struct StepReport {
  int step = 0, steps = 0;
  double loss = 0, lr = 0, grad_norm = 0, ms = 0, tokens_per_s = 0;
  double mfu = -1, mfu_full = -1, hfu = -1;  // fractions (causal, full, hardware); < 0 = unknown
  double model_tflops_per_gpu = 0, hardware_tflops_per_gpu = 0;  // achieved, causal convention
  size_t mem_bytes = 0, mem_peak_bytes = 0;  // device memory in use now, and at most so far
  bool offload = false;               // optimizer offload: the next two are reported
  size_t host_bytes = 0;              // pinned host memory of the offloaded optimizer
  OffloadStats offload_stats;         // the step's offload traffic and host optimizer time
  double elapsed_s = -1, eta_s = -1;  // wall time since the first step began, and the estimate
                                      // of the time left at the mean pace so far; < 0 = unknown
  double ckpt_wait_ms = -1;           // the wait for an asynchronous checkpoint's copy (< 0: none)
  double waited_ms = 0;               // of ms, the time spent waiting for other ranks in MPI
  std::string note;                   // appended to the step line ("attention flash")
  double attention_fraction = -1;     // [data] document_mask: the step's sum len^2 / (rows T^2)
                                      // the attention FLOPs were scaled by (-1: no documents)
  std::vector<int64_t> data_rows;     // [data] train of several datasets: the step's global
                                      // rows drawn from each (JSONL only; data/data_mix.h)
  std::vector<Fp8Snapshot> fp8;       // FP8 runs: amax and scale of a few tensors
  bool moe = false;                   // an MoE model: moe_report holds its step statistics
  MoeReport moe_report;
  bool noise = false;                 // [log] grad_noise_scale: noise_scale holds its estimates
  NoiseScale noise_scale;
};

struct MetricsLog {
  FILE* jsonl = nullptr;  // only on rank 0
  std::string path;
};
// Every write is flushed and checked: a failed one (a full disk) stops the job with a message
// naming the file, instead of losing the metrics silently.
// resumed_step > 0 (a run resuming a checkpoint of that step): first the records past it of the
// run being continued are dropped from the file (those a run wrote after its last checkpoint
// before it died; the resumed run writes them again), so the file holds every step once. The
// run being continued is the last one whose run record says it started at or before
// resumed_step + 1; later runs' records go too, earlier runs are left alone.
void metrics_open(MetricsLog& log, const std::string& path, bool is_rank0, int resumed_step = 0);
void metrics_close(MetricsLog& log);
// The first record of a run: sizes that do not change from step to step.
struct RunInfo {
  int first_step = 1;          // the first step this run trains (resumed step + 1)
  size_t parameters = 0;       // N
  size_t state_bytes = 0;      // this rank's weights + gradients + optimizer state
  size_t activation_bytes = 0; // this rank's activations and backward scratch
  size_t host_bytes = 0;       // optimizer offload: pinned host memory, and the file's bytes
  size_t disk_bytes = 0;
  int world_size = 1;
  FlopsPerToken flops;
  double peak_tflops = 0;      // 0 = unknown
  std::string peak_source;     // the device row or "[log] peak_tflops"
  bool documents = false;      // [data] document_mask: attention counted per document (above)
};
void metrics_run(MetricsLog& log, const RunInfo& info);
// Prints the step line (rank 0) and appends the JSON object, with this step's communication.
// The line: step k/n | loss | lr | norm | ms | tok/s | MFU (HFU), causal convention | mem (device) | with offload:
// host memory and the host optimizer's time | elapsed, time left.
void metrics_step(MetricsLog& log, const StepReport& r, const CommStats& comm, bool print_line);
void metrics_val(MetricsLog& log, int step, double val_loss);
// [eval]'s accuracy: correct of examples.
void metrics_eval(MetricsLog& log, int step, int correct, int examples);
// The last record of a run that trained to its end: every rank's device memory peak, from the
// backend's allocator (ops::memory_peak: every ops::alloc, whoever asked for it), in world rank
// order: {"end":{"mem_peak_bytes":[...]}}. test/test_plan.py compares it with the plan's peak of
// each rank, test/test_gpu_train.py (./train_emu) with the plan's peak plus its GPU terms.
void metrics_end(MetricsLog& log, const std::vector<size_t>& mem_peak_bytes);

// The run's throughput over its steps, the first left out when there are more (it warms up).
struct RunSummary {
  int steps = 0;                    // after the first
  double tokens = 0, seconds = 0;   // their totals
  double first_tokens = 0, first_seconds = 0;
  bool have_first = false;
  void add(double step_tokens, double step_seconds);
};
// Prints the end-of-run summary (rank 0) and writes it as a {"summary": {...}} record: tokens/s,
// model FLOPs per token in both conventions and the hardware count, TFLOP/s per GPU, MFU in both
// conventions and HFU (null without a peak).
void metrics_summary(MetricsLog& log, const RunSummary& s, const RunInfo& info, bool print);

// A step's throughput, from the tokens of its global batch and its time (r.ms): tokens/s, the
// model and hardware TFLOP/s per GPU (info.flops over info.world_size devices) and, with a known
// peak, MFU in both conventions and HFU. attention_fraction: the share of the attention FLOPs
// that packed documents leave (sum len^2 / (rows T^2), above; 1 without documents).
void step_throughput(StepReport& r, const RunInfo& info, double tokens,
                     double attention_fraction = 1.0);
// FP8 runs: the amax and scale of rank 0's first block's linear layers and of its last linear
// layer, for the metrics; empty without FP8.
std::vector<Fp8Snapshot> fp8_step_snapshot(const GPT& model, const GPTLayout& layout);
struct ParamStore;
// The parameter store's sizes in the run record (state on the device; optimizer offload's pinned
// host memory and file), and its offload traffic in a step's report.
void store_run_info(RunInfo& info, const ParamStore& store);
void store_step_report(StepReport& r, const ParamStore& store);
// The banner's lines on FLOPs per token and on how MFU is computed (rank 0 prints them).
void print_flops_banner(const RunInfo& info);
