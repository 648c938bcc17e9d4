// train.cu - the training loop.
//
//   mpirun -np N ./train config.toml [--section.key=value ...] [--check-config]
//
// One optimizer step = grad_accum micro-batches of forward + backward on this rank's slice of the
// global batch, run through the pipeline stages in the schedule's order (one stage: F0 B0 F1
// B1 ...), gradients reduced across the data-parallel group (DDP or a ZeRO stage, inside the
// ParamStore), then the global gradient norm, clipping, AdamW (on the device, or on the host
// under optimizer offload), and the logs. The host never waits for a step's results: the norm
// and the clipping factor stay on the device, and the loss and the norm come back only when a
// log line, a checkpoint or an evaluation needs them (training/step_readback.h). Everything device-
// or layout-specific lives below: kernels/ (the backend), parallel/ (the mesh and who holds
// which weights), model/ (GPT-2 itself), data/ and checkpoint/. The options that ride along -
// compressed reductions, optimizer offload, DiLoCo islands, the noise scale - keep their state
// and their banner lines in their own files; the step's throughput, MFU and FP8 snapshot are
// training/metrics.cu's arithmetic.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_llama.h"
#include "data/data_mix.h"
#include "data/dataloader.h"
#include "data/tokenizer.h"
#include "config/config.h"
#include "config/size_limits.h"
#include "kernels/trace.h"
#include "training/eval.h"
#include "training/cuda_graph.h"
#include "training/evaluate.h"
#include "training/sample.h"
#include "training/health.h"
#include "model/fp8.h"
#include "model/documents.h"
#include "model/gpt.h"
#include "model/gpt_pipeline.h"
#include "model/init.h"
#include "training/metrics.h"
#include "training/optimizer.h"
#include "training/plan.h"
#include "training/preemption.h"
#include "training/step_readback.h"
#include "parallel/diloco.h"
#include "parallel/host_threads.h"
#include "parallel/mesh.h"
#include "parallel/context_parallel.h"
#include "parallel/param_store.h"
#include "parallel/pipeline.h"
#include "parallel/pipeline_balance.h"

struct Run {
  Config cfg;
  Mesh mesh;
  DeviceInfo device;
  ops::Stream compute = nullptr, comm = nullptr;
  GPTLayout layout;
  GPT model;
  ParamStore store;
  Pipeline pipeline;
  std::vector<int> tokens, targets;  // the step's micro-batches, grad_accum x B x T/cp each
  std::vector<int> batch_tokens, batch_targets;  // one micro-batch as read (B x T)
  // [data] document_mask: the step's document ids (grad_accum x B x T) and this rank's
  // positions inside the documents (grad_accum x B x T/cp), model/documents.h
  std::vector<int> docs, doc_positions;
  double attention_fraction = 1.0;  // this step's sum len^2 / (rows T^2) (training/metrics.h)
  DataMix train_data;  // [data] train: one dataset or several mixed (data/data_mix.h)
  DataLoader val_data;
  std::vector<ChoiceExample> eval_set;  // [eval] file's examples (data/eval_file.h)
  AsyncSave async_save;  // [checkpoint] async: the save in flight (checkpoint/async_save.h)
  LossTrend loss_trend;  // [train] skip_spikes (training/health.h)
  StepReadback readback;  // the steps whose loss and norm are still on the device
  StepGraph graph;        // [kernels] cuda_graph: the step's forward and backward as a CUDA graph
  std::string graph_line;  // what the log says of it
  StragglerWatch stragglers;
  Tokenizer tokenizer;
  MetricsLog metrics;
  CommStats comm_total{};
  RunInfo info;          // the run record: sizes, FLOPs per token, the peak (training/metrics.h)
  RunSummary summary;    // the steps' throughput, for the end-of-run summary
  int resumed_step = 0;  // steps done before this run (0 = fresh start; checkpoint/)
  NoiseScale noise;      // [log] grad_noise_scale
  Diloco diloco;         // [parallel] diloco_islands (parallel/diloco.h)
  bool rank0 = false;
};

static const char kUsage[] =
    "usage: %s config.toml [--section.key=value ...] [--check-config | --sample]\n"
    "       %s config.toml [--section.key=value ...] --plan [--plan-json FILE]\n"
    "       %s config.toml [--section.key=value ...] --plan-search N\n"
    "  --section.key=value  override a key of the config (docs/CONFIG.md)\n"
    "  --check-config       print the resolved config after checking it and the data shards\n"
    "  --sample             print a sample ([log] sample_*) from the model as set up (a resumed\n"
    "                       checkpoint, [init] from) instead of training\n"
    "  --plan               plan the config's layout: memory and communication per rank, step\n"
    "                       time (one process, no GPU; training/plan.h)\n"
    "  --plan-json FILE     the plan as JSON\n"
    "  --plan-search N      every layout of N GPUs, fastest estimated step first\n"
    "  --help, -h           this text\n"
    "Run under mpirun (or srun) for several ranks.\n";

static bool has_flag(int argc, char** argv, const char* flag) {
  for (int i = 1; i < argc; i++)
    if (std::strcmp(argv[i], flag) == 0) return true;
  return false;
}

static std::string tokenizer_path(const Config& cfg, const DataMix& train) {
  if (!cfg.data.tokenizer.empty()) return cfg.data.tokenizer;
  const std::string& first = train.sources[0].files.front();  // beside the first dataset's
  size_t slash = first.rfind('/');
  return (slash == std::string::npos ? std::string(".") : first.substr(0, slash)) +
         "/tokenizer.bin";
}

// The data shards as a run would open them (header, size, enough rows for one batch of every
// rank), for --check-config; the token ids are checked as they are read (data/dataloader.h).
static void check_data(const Config& cfg) {
  const int B = cfg.train.micro_batch, T = cfg.model.seq_len, dp = cfg.parallel.dp;
  DataMix train;
  DataLoader val;
  data_mix_init(train, cfg.data.train, cfg.data.weights, "[data] train", B, T, 0, dp,
                cfg.data.shuffle, cfg.train.seed, cfg.model.vocab_size);
  if (!cfg.data.val.empty())
    dataloader_init(val, cfg.data.val, "[data] val", B, T, 0, dp, false, 0, cfg.model.vocab_size);
  if (!cfg.eval.file.empty())
    eval_file_read(cfg.eval.file, "[eval] file", cfg.model.vocab_size, T, cfg.eval.examples);
}

// Everything a step needs: device, mesh, weights, activations, data, logs.
static void setup_data_and_logs(Run& r);

static void setup(Run& r, int world_rank, int local_rank) {
  const Config& cfg = r.cfg;
  r.device = ops::device_init(local_rank);
  CommBackend backend = cfg.parallel.backend == "nccl" ? CommBackend::NCCL : CommBackend::MPI;
  r.mesh.watch.timeout_s = cfg.parallel.timeout_s;
  mesh_init(r.mesh, mesh_shape(cfg), world_rank, local_rank, backend);
  const std::string too_large = memory_bound_problem(  // before the model is laid out
      cfg, r.device.free_memory, host_available_memory(), ops::device_memory_is_host());
  CHECK(too_large.empty(), "%s", too_large.c_str());
  const std::string no_room = plan_memory_problem(  // the planner's figures: the step run dry
      plan_layout(cfg, PlanScope::Stages), r.device.free_memory, host_available_memory(),
      ops::device_memory_is_host());
  CHECK(no_room.empty(), "%s", no_room.c_str());
  const DType dt = compute_dtype(cfg.precision);
  const bool fp8 = cfg.precision.compute == "fp8";
  CHECK_ALL(!fp8 || ops::device_supports_fp8(),
            "[precision] compute = \"fp8\" needs FP8 tensor cores (compute capability 8.9 or "
            "newer: Ada, Hopper, Blackwell); %s has none. Use \"bf16\"", r.device.name);
  StreamOptions so;
  so.allow_tf32 = dt != DType::F32;
  so.attention = cfg.kernels.attention == "flash"   ? AttentionImpl::Flash
                 : cfg.kernels.attention == "cudnn" ? AttentionImpl::Cudnn
                                                    : AttentionImpl::Auto;
  r.compute = ops::stream_create(so);
  r.comm = ops::stream_create(so);

  r.layout = gpt_layout(cfg.model, r.mesh);
  pipeline_init(r.pipeline, cfg.parallel.pp_schedule, cfg.train.grad_accum,
                cfg.parallel.pp_virtual, &r.mesh[Axis::PP]);
  const ShardingMode mode = store_options(r.store, cfg);
  CommsByAxis comms = diloco_store_comms(r.mesh, cfg);  // an island's gradient norm is its own
  r.store.world_rank = r.mesh.world_rank;  // the offload file's name: unique in the job
  if (cfg.init.from.empty()) {
    param_store_init(r.store, r.layout.units, mode, dt, comms, r.compute, r.comm,
                     random_init_fill(cfg.train.seed));
  } else if (cfg.model.is_llama()) {  // a Hugging Face directory (config/config_hf.cu)
    HfLlamaModel f = hf_llama_open(cfg.init.from, cfg.model);
    param_store_init(r.store, r.layout.units, mode, dt, comms, r.compute, r.comm,
                     hf_llama_fill(f));
    hf_llama_close(f);
  } else {
    LlmcModelFile f = llmc_open(cfg.init.from, r.layout);
    param_store_init(r.store, r.layout.units, mode, dt, comms, r.compute, r.comm,
                     llmc_fill(f, r.layout));
    llmc_close(f);
  }
  if (diloco_enabled(cfg)) diloco_init(r.diloco, cfg, r.store, r.mesh[Axis::Island]);
  r.model.split_backward = r.pipeline.schedule.split;
  r.model.grad_buffers = r.pipeline.grads;
  gpt_create_from_config(r.model, r.layout, cfg, &r.mesh[Axis::Stage], r.pipeline.slots,
                         r.compute, r.comm);
  step_readback_init(r.readback, r.model.memory, r.mesh.shape.world(), r.compute);
  r.graph_line = step_graph_init(r.graph, cfg, ops::backend_name(), r.compute, r.comm);
  r.pipeline.untimed = r.graph.on;  // a graph's events mark nothing the host can read
  setup_data_and_logs(r);
}

// The data (this rank's slice of the batch), a resumed checkpoint, the metrics file.
static void setup_data_and_logs(Run& r) {
  const Config& cfg = r.cfg;
  const int B = cfg.train.micro_batch, T = cfg.model.seq_len;
  r.tokens.resize((size_t)cfg.train.grad_accum * B * T / r.mesh.shape.cp);
  r.targets.resize(r.tokens.size());
  r.batch_tokens.resize((size_t)B * T);
  r.batch_targets.resize((size_t)B * T);
  // Each data-parallel rank reads its slice of the batch (by its dp coordinate: with DiLoCo
  // islands the dp group is only the island's).
  const int dp_rank = mesh_coords(r.mesh.shape, r.mesh.world_rank).dp;
  const int V = cfg.model.vocab_size;  // every token read is checked against it
  data_mix_init(r.train_data, cfg.data.train, cfg.data.weights, "[data] train", B, T, dp_rank,
                r.mesh.shape.dp, cfg.data.shuffle, cfg.train.seed, V);
  if (!cfg.data.val.empty())
    dataloader_init(r.val_data, cfg.data.val, "[data] val", B, T, dp_rank, r.mesh.shape.dp, false, 0, V);
  if (!cfg.eval.file.empty())  // every record checked before any work
    r.eval_set = eval_file_read(cfg.eval.file, "[eval] file", V, T, cfg.eval.examples);
  const std::string tokenizer = tokenizer_path(cfg, r.train_data);
  if (!tokenizer_load(r.tokenizer, tokenizer) && cfg.log.sample_every > 0 && r.rank0)
    std::printf("note     no tokenizer at %s ([data] tokenizer): samples print token ids\n",
                tokenizer.c_str());
  std::vector<float> moe_bias;
  r.resumed_step = checkpoint_resume(r.cfg, r.layout, r.store, r.train_data, &r.loss_trend,
                                     &moe_bias, r.mesh);
  if (r.model.moe) moe_bias_restore(r.model, moe_bias, r.compute);
  metrics_open(r.metrics, cfg.log.metrics, r.rank0, r.resumed_step);
  RunInfo& info = r.info;
  info.first_step = r.resumed_step + 1;
  info.parameters = r.layout.parameters;
  store_run_info(info, r.store);
  info.activation_bytes = r.model.memory.bytes;
  info.world_size = r.mesh.shape.world();
  info.flops = flops_per_token(r.layout, r.model.recompute);
  info.documents = cfg.data.document_mask;
  info.peak_tflops = run_peak_tflops(r.device.name, cfg.precision.compute, cfg.log.peak_tflops,
                                     &info.peak_source);
  metrics_run(r.metrics, info);
}

static void print_banner(const Run& r) {
  if (!r.rank0) return;
  const Config& c = r.cfg;
  const MeshShape& mesh = r.mesh.shape;
  std::printf("device   %s (%s backend), %d rank(s), collectives over %s\n", r.device.name,
              ops::backend_name(), mesh.world(), c.parallel.backend.c_str());
  const HostThreads& threads = host_threads();  // rank 0's; each rank chose its own
  std::printf("threads  %d OpenMP thread%s on rank 0: %s\n", threads.threads,
              threads.threads == 1 ? "" : "s", threads.why.c_str());
  char maxT[48] = "";  // a run may train at fewer positions than the model has
  if (r.layout.maxT != r.layout.T)
    std::snprintf(maxT, sizeof(maxT), " (of max_seq_len %d)", r.layout.maxT);
  char arch[96] = "GPT-2";  // Llama: its kv heads, MLP width and head
  if (r.layout.llama)
    std::snprintf(arch, sizeof(arch), "Llama (kv heads %d, d_ff %d, %s head)", r.layout.NKV,
                  r.layout.F, r.layout.tied ? "tied" : "untied");
  std::printf("model    %s L=%d H=%d C=%d T=%d%s V=%d (padded %d): %zu parameters, %s\n", arch,
              r.layout.L, r.layout.NH, r.layout.C, r.layout.T, maxT, r.layout.V, r.layout.Vp,
              r.layout.parameters, c.precision.compute.c_str());
  std::printf("layout   dp=%d %s, tp=%d%s, micro-batch %d x grad-accum %d = %d tokens per step\n",
              mesh.dp, sharding_mode_name(r.store.mode), mesh.tp,
              mesh.tp > 1 ? (c.parallel.sp ? " with sequence parallel" : " without SP") : "",
              c.train.micro_batch, c.train.grad_accum,
              c.train.micro_batch * c.train.grad_accum * mesh.dp * c.model.seq_len);
  if (r.layout.E > 0)
    std::printf("experts  %d experts of hidden %d, top-%d, in %d of %d blocks, ep=%d (%d experts "
                "per rank): %zu parameters active per token\n", r.layout.E, r.layout.d_expert,
                r.layout.top_k, (int)std::count(r.layout.moe.begin(), r.layout.moe.end(), true),
                r.layout.L, mesh.ep, r.layout.E / mesh.ep, r.layout.active_parameters);
  if (r.layout.E > 0 && (c.model.n_shared_experts > 0 || c.model.router_score != "softmax" ||
                         c.train.moe_balance != "aux_loss" || c.train.moe_capacity_factor > 0))
    std::printf("experts  %d shared, %s scores, balance %s, capacity factor %g (0: dropless)\n",
                c.model.n_shared_experts, c.model.router_score.c_str(),
                c.train.moe_balance.c_str(), c.train.moe_capacity_factor);
  if (mesh.cp > 1)
    std::printf("context  cp=%d: each rank holds 2 zigzag chunks of %d positions of every "
                "sequence; attention is a ring over the cp group\n", mesh.cp,
                c.model.seq_len / (2 * mesh.cp));
  if (mesh.pp > 1) {
    const PipelineSchedule& s = r.pipeline.schedule;
    std::printf("pipeline pp=%d \"%s\" x %d chunk(s) per rank, %d micro-batches%s: bubble %.3f "
                "by the schedule's formula at equal costs\n", mesh.pp,
                c.parallel.pp_schedule.c_str(), c.parallel.pp_virtual, c.train.grad_accum,
                s.split ? ", backwards split into B and W" : "",
                pipeline_schedule_bubble(s.kind, s.p, s.m, s.v));
    const std::string how = c.parallel.pp_layers.empty()
                                ? "pp_balance = \"" + c.parallel.pp_balance + "\""
                                : std::string("pp_layers as given");
    std::printf("stages   %s (%s, [plan]'s device model)\n",
                pipeline_stage_summary(pipeline_part_costs(c), mesh.pp_layers).c_str(),
                how.c_str());
  }
  std::printf("memory   weights+grads+optimizer %.1f MiB on rank 0, activations %.1f MiB\n",
              r.store.state_memory.bytes / 1048576.0, r.model.memory.bytes / 1048576.0);
  std::printf("%s%s", grad_compression_banner(r.store).c_str(), offload_banner(r.store).c_str());
  std::printf("%s", r.graph_line.c_str());
  print_flops_banner(r.info);
  std::fflush(stdout);
}

// The step's grad_accum micro-batches of this rank's slice of the global batch, as every stage
// reads them (the data stays in step); under cp each rank keeps its zigzag chunks of every
// sequence.
static void read_step_batch(Run& r) {
  const int B = r.cfg.train.micro_batch, T = r.cfg.model.seq_len;
  const int cp = r.mesh.shape.cp;
  const size_t n = (size_t)B * (T / cp);
  const int cp_rank = r.mesh[Axis::CP].rank;
  double squares = 0;  // sum over the step's documents of len^2
  for (int micro = 0; micro < r.cfg.train.grad_accum; micro++) {
    if (cp == 1) {  // the micro-batch as read
      data_mix_next(r.train_data, &r.tokens[micro * n], &r.targets[micro * n]);
    } else {
      data_mix_next(r.train_data, r.batch_tokens.data(), r.batch_targets.data());
      cp_select_tokens(&r.tokens[micro * n], r.batch_tokens.data(), cp, cp_rank, B, T);
      cp_select_tokens(&r.targets[micro * n], r.batch_targets.data(), cp, cp_rank, B, T);
    }
    if (!r.cfg.data.document_mask) continue;
    const int* full = cp == 1 ? &r.tokens[micro * n] : r.batch_tokens.data();
    const DocumentBatch d = document_batch(full, B, T, r.cfg.data.eot_token, cp, cp_rank);
    for (int len : document_lengths(full, B, T, r.cfg.data.eot_token))
      squares += (double)len * len;
    r.attention_fraction = squares / ((double)(micro + 1) * B * T * T);
    r.docs.resize((size_t)r.cfg.train.grad_accum * B * T);
    r.doc_positions.resize(r.tokens.size());
    std::copy(d.ids.begin(), d.ids.end(), r.docs.begin() + micro * (size_t)B * T);
    std::copy(d.positions.begin(), d.positions.end(), r.doc_positions.begin() + micro * n);
  }
}

// What the logs report of a step besides its loss and norm: throughput and MFU, memory,
// offload traffic, FP8 scales, MoE statistics (training/metrics.h).
static void report_step_costs(Run& r, StepReport& rep, double ms) {
  const Config& c = r.cfg;
  rep.ms = ms;
  step_throughput(rep, r.info,
                  (double)c.train.micro_batch * c.model.seq_len * c.train.grad_accum *
                      r.mesh.shape.dp,
                  r.attention_fraction);
  rep.attention_fraction = c.data.document_mask ? r.attention_fraction : -1;
  rep.mem_bytes = ops::memory_in_use();
  rep.mem_peak_bytes = ops::memory_peak();
  store_step_report(rep, r.store);
  rep.fp8 = fp8_step_snapshot(r.model, r.layout);
}

// One optimizer step: the data, forward and backward of every micro-batch (the gradients
// reduced inside the ParamStore), the gradient norm, the update, and the report for the logs,
// which waits in r.readback for its loss and norm (read when due: training/step_readback.h).
static void train_step(Run& r, int step) {
  const Config& c = r.cfg;
  const int B = c.train.micro_batch, T = c.model.seq_len, accum = c.train.grad_accum;
  const auto t0 = std::chrono::steady_clock::now();
  const double waited0 = r.mesh.watch.waited_s;
  const DataMixState batch_start = data_mix_state(r.train_data);
  comm_stats_reset(r.mesh.stats);
  store_stats_reset(r.store);
  {
    trace::Span span(trace::Lane::Host, "data", "data", nullptr);
    read_step_batch(r);
  }
  // The loss is the mean over the global batch, so each token's gradient is scaled by
  // 1/(tokens in the global batch); the dp x cp reduction then sums the ranks' contributions.
  // The mean over the batch of the group that reduces it (an island's, with DiLoCo).
  const float dloss = 1.0f / ((float)B * T * accum * (r.mesh.shape.dp / r.mesh.shape.islands));
  const MicroBatches mb = step_graph_inputs(  // at fixed device addresses for a graph
      r.graph, {r.tokens.data(), r.targets.data(), accum, B, T / r.mesh.shape.cp,
                c.data.document_mask ? r.docs.data() : nullptr,
                c.data.document_mask ? r.doc_positions.data() : nullptr});
  step_graph_run(r.graph, [&] {  // eager, or captured and launched, or replayed
    gpt_train_step(r.model, r.store, r.pipeline, mb, dloss, 1.0f / ((float)B * T * accum),
                   r.compute);
  }, r.mesh.stats);
  r.readback.pending.emplace_back();
  PendingStep& pending = r.readback.pending.back();
  StepReport& rep = pending.rep;
  rep.step = step;
  for (size_t k = 0; r.train_data.sources.size() > 1 && k < r.train_data.sources.size(); k++)
    rep.data_rows.push_back(r.train_data.rows_of[k] - batch_start.rows_of[k]);
  rep.steps = c.train.steps;
  {  // the norm and the clipping factor, on the device
    trace::Span span(trace::Lane::Compute, "optimizer", "grad norm", r.compute);
    grad_norm(r.store, c.train.grad_clip);
  }
  if (r.store.small_batch.on)  // [log] grad_noise_scale estimates from the norm every step
    rep.grad_norm = grad_norm_read(r.store);
  rep.noise = noise_scale_step(r.noise, r.store, rep.grad_norm, B, accum, r.mesh[Axis::DP].size);
  rep.noise_scale = r.noise;
  rep.lr = learning_rate(c.train, step);
  {  // the loss to every rank, on the device: a control gather the comm accounting leaves out
    trace::Span span(trace::Lane::Comm, "control", "loss", r.compute);
    step_readback_queue(r.readback, r.model, r.mesh[Axis::World], r.mesh.shape.dp, r.store.norm,
                        r.compute);
  }
  SpikeVerdict spike;
  if (c.train.skip_spikes > 0) {  // the update depends on this step's loss: the host waits
    step_readback_read_newest(r.readback);
    spike = loss_spike_check(r.loss_trend, c.train, step, rep.loss,
                             data_mix_span(r.train_data, batch_start), r.rank0);
    pending.judged = true;
    pending.skipped = spike.skip;
  }
  if (!spike.skip) {  // Adam counts the updates applied (training/health.h)
    trace::Span span(trace::Lane::Compute, "optimizer", "optimizer", r.compute);
    optimizer_step(r.store, r.layout, c.train, step - (int)r.loss_trend.skipped, (float)rep.lr);
  } else {
    rep.note = "update skipped: loss spike";
  }
  diloco_after_step(r.diloco, r.store, step);  // every diloco_every steps (parallel/diloco.h)
  if (r.model.moe) {  // the token counts (host values: they size the all-to-all)
    rep.moe = true;
    rep.moe_report = moe_step_report(r.model, r.mesh[Axis::World], r.mesh.shape.islands);
    if (!spike.skip) moe_bias_update(r.model, rep.moe_report, r.compute);  // moe_balance "bias"
  }
  rep.waited_ms = 1e3 * (r.mesh.watch.waited_s - waited0);
  report_step_costs(r, rep,
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
}

// The token samples start from: the tokenizer's end-of-text, else the last id.
static int sample_eot(const Run& r) {
  const bool own_eot = r.tokenizer.loaded && r.tokenizer.eot < r.layout.V;
  return own_eot ? r.tokenizer.eot : r.layout.V - 1;
}

// --sample: a sample from the model as set up (a resumed checkpoint, [init] from), no training.
static void sample_only(Run& r) {
  const Config& c = r.cfg;
  const SampleSettings st = sample_settings(c, c.train.seed + r.resumed_step);
  const std::string text = sample_text(r.model, r.store, r.pipeline, r.mesh[Axis::PP],
                                       r.tokenizer, sample_eot(r), st, r.compute);
  if (r.rank0)
    std::printf("sample   %d tokens after step %d (%s, temperature %g, top_k %d):\n%s\n---\n",
                st.tokens, r.resumed_step, st.kv_cache ? "KV cache" : "recompute",
                st.temperature, st.top_k, text.c_str());
  std::fflush(stdout);
}

// Whether validation, evaluation or a sample runs after `step` (evaluate, below).
static bool evaluation_due(const Config& c, int step) {
  const bool last = step == c.train.steps;
  auto due = [&](int every) { return every > 0 && (step % every == 0 || last); };
  return due(c.log.val_every) || due(c.eval.every) || due(c.log.sample_every);
}

// Validation and samples, every so many steps (and after the last).
static void evaluate(Run& r, int step) {
  const Config& c = r.cfg;
  const bool last = step == c.train.steps;
  if (c.log.val_every > 0 && (step % c.log.val_every == 0 || last)) {
    double v = validation_loss(r.model, r.store, r.pipeline, r.val_data, c.log.val_batches,
                               r.mesh[Axis::World], r.mesh.shape.dp, r.compute);
    if (r.rank0) std::printf("step %5d | val loss %.6f\n", step, v);
    metrics_val(r.metrics, step, v);
  }
  if (c.eval.every > 0 && (step % c.eval.every == 0 || last)) {
    const int dp_rank = mesh_coords(r.mesh.shape, r.mesh.world_rank).dp;
    const EvalResult e = eval_multiple_choice(r.model, r.store, r.pipeline, r.eval_set,
                                              r.mesh[Axis::World], r.mesh.shape.dp, dp_rank,
                                              sample_eot(r), r.compute);
    if (r.rank0)
      std::printf("step %5d | eval acc %.4f (%d of %d, %s)\n", step, e.accuracy(), e.correct,
                  e.examples, c.eval.file.c_str());
    metrics_eval(r.metrics, step, e.correct, e.examples);
  }
  if (c.log.sample_every > 0 && (step % c.log.sample_every == 0 || last)) {
    const int eot = sample_eot(r);
    const SampleSettings st = sample_settings(c, c.train.seed + step);
    std::string text = sample_text(r.model, r.store, r.pipeline, r.mesh[Axis::PP], r.tokenizer,
                                   eot, st, r.compute);
    if (r.rank0)
      std::printf("step %5d | sample of %d tokens %s, temperature %g, top_k %d\n"
                  "step %5d | sample:\n%s\n---\n", step, st.tokens,
                  st.kv_cache && r.mesh.shape.cp == 1 ? "with the KV cache (prefill, then one token at a time)"
                              : "recomputing the window for each token",
                  st.temperature, st.top_k, step, text.c_str());
  }
  std::fflush(stdout);
}

// The last step's pipeline, measured: each stage's busy fraction, the bubble measured, the one
// the simulator predicts from the measured durations (ranks that share cores, or communication,
// make the measured one larger) and the formula's, and with [log] pipeline_timeline the step
// drawn per rank. Collective over pp.
static void print_bubble(Run& r) {
  if (r.pipeline.untimed) {
    if (r.rank0) std::printf("pipeline not timed: the step ran as a CUDA graph\n");
    return;
  }
  const PipelineReport rep = pipeline_report(r.pipeline, r.cfg.log.pipeline_timeline);
  if (!r.rank0) return;
  std::printf("pipeline last step %.2f ms; busy per stage:", rep.span_ms);
  for (double b : rep.busy_ms) std::printf(" %.0f%%", 100.0 * b / rep.span_ms);
  std::printf("; bubble %.1f%% measured, %.1f%% predicted from the measured durations, %.1f%% "
              "by the formula at equal costs\n", 100.0 * rep.bubble, 100.0 * rep.bubble_predicted,
              100.0 * rep.bubble_formula);
  if (!rep.timeline.empty())
    std::printf("pipeline timeline of the last step (F/B/W: forward, backward, weight pass of "
                "micro-batch 0-f; f/b/w: later chunks):\n%s%s", rep.timeline.c_str(),
                rep.actions.c_str());
  std::fflush(stdout);
}

// Every rank's device memory peak from the backend's allocator (ops::memory_peak counts every
// ops::alloc: the Allocators' buffers and, on the GPU, the streams' cuBLASLt workspaces and
// scratch), printed with the largest and written to the metrics' end record. Collective.
static void report_memory_peak(Run& r) {
  const size_t mine = ops::memory_peak();
  std::vector<size_t> peaks(r.mesh.shape.world());
  all_gather_host(r.mesh[Axis::World], &mine, sizeof(mine), peaks.data());
  metrics_end(r.metrics, peaks);
  if (!r.rank0) return;
  const auto most = std::max_element(peaks.begin(), peaks.end());
  std::printf("memory   device peak %.2f MiB on rank 0, at most %.2f MiB (rank %d), through the "
              "backend's allocator\n", peaks[0] / 1048576.0, *most / 1048576.0,
              (int)(most - peaks.begin()));
  std::fflush(stdout);
}

// Whether the steps waiting in r.readback are read now (training/step_readback.h): for a step
// line, a checkpoint (it keeps the loss trend), an evaluation (its records follow the step's),
// skip_spikes (read every step anyway) or a full readback. If so, reads them.
static bool read_back_if_due(Run& r, int step, bool first) {
  PendingStep& pending = r.readback.pending.back();
  pending.print = step % r.cfg.log.every == 0 || first || step == r.cfg.train.steps;
  const bool due = pending.print || checkpoint_due(r.cfg, step) || evaluation_due(r.cfg, step) ||
                   r.cfg.train.skip_spikes > 0 ||
                   (int)r.readback.pending.size() == StepReadback::kCapacity;
  if (due) step_readback_settle(r.readback, r.loss_trend, r.cfg.train, r.metrics, r.rank0);
  return due;
}

// The newest step's report completed with what follows the step: the checkpoint's wait, the
// comm counters, the times; and the run summary's share.
static const StepReport& finish_report(Run& r, int step, bool first,
                                       std::chrono::steady_clock::time_point start,
                                       double ckpt_waited_s) {
  PendingStep& pending = r.readback.pending.back();
  StepReport& rep = pending.rep;
  rep.ckpt_wait_ms = ckpt_waited_s < 0 ? -1 : 1e3 * ckpt_waited_s;
  comm_stats_add(r.comm_total, r.mesh.stats);
  pending.comm = r.mesh.stats;
  rep.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  rep.eta_s = rep.elapsed_s / (step - r.resumed_step) * (r.cfg.train.steps - step);
  if (first)  // "auto" decides at the first call
    rep.note += std::string(rep.note.empty() ? "" : " | ") + "attention " +
                ops::attention_impl_name(r.compute);
  r.summary.add(rep.tokens_per_s * rep.ms / 1e3, rep.ms / 1e3);
  return rep;
}

// The steps, from the one after the resumed checkpoint to the last, or until a signal stops
// them (training/preemption.h). Returns that signal (0: the run is done).
static int train_steps(Run& r) {
  const auto start = std::chrono::steady_clock::now();
  for (int step = r.resumed_step + 1; step <= r.cfg.train.steps; step++) {
    r.mesh.watch.step = step;  // named by the watchdog (parallel/watchdog.h)
    trace::step_begin(step);  // [log] trace_steps (kernels/trace.h)
    std::optional<trace::Span> step_span(std::in_place, trace::Lane::Host, "step", "step",
                                         nullptr);
    ops::range_push("step");  // an NVTX range for profilers, and the emulator's step counts
    train_step(r, step);
    ops::range_pop();
    step_span.reset();
    const bool first = step == r.resumed_step + 1;
    const bool due = read_back_if_due(r, step, first);
    const RunState state{r.train_data.sources[0].pos, r.loss_trend,  // what a checkpoint keeps
                         data_mix_state(r.train_data), moe_bias_state(r.model)};
    const double waited = checkpoint_snapshot_if_due(r.async_save, r.cfg, step, r.layout, r.store,
                                                     state, r.mesh);
    const StepReport& rep = finish_report(r, step, first, start, waited);
    const double step_ms = rep.ms, waited_ms = rep.waited_ms;
    if (due) step_readback_write(r.readback, r.metrics, r.rank0);  // (rep is gone after this)
    if (r.cfg.log.check_tied && r.mesh.shape.pp > 1)
      CHECK_ALL(tied_copies_equal(r.store), "step %d: the first and the last pipeline stage's "
                "copies of the tied embedding differ ([log] check_tied)", step);
    if (r.cfg.log.check_replicas && r.mesh.shape.tp > 1)
      CHECK_ALL(tp_replicas_equal(r.store), "step %d: the tp ranks' copies of the replicated "
                "weights differ ([log] check_replicas)", step);
    evaluate(r, step);
    straggler_step(r.stragglers, r.cfg.log, r.mesh[Axis::World], step, step_ms, waited_ms);
    const int stop = preemption_agreed(r.mesh[Axis::World]);  // all ranks stop after one step
    if (stop) {  // the steps not yet read are recorded, and the trend is complete
      step_readback_settle(r.readback, r.loss_trend, r.cfg.train, r.metrics, r.rank0);
      step_readback_write(r.readback, r.metrics, r.rank0);
    }
    const RunState final_state{r.train_data.sources[0].pos, r.loss_trend,  // the trend settled
                               data_mix_state(r.train_data), moe_bias_state(r.model)};
    const bool saved = checkpoint_after_step(r.async_save, r.cfg, step, r.layout, r.store,
                                             final_state, r.mesh, stop != 0);
    trace::step_end(step);
    if (!stop) continue;
    if (r.rank0) {
      char where[512] = "no [checkpoint] dir: nothing saved";
      if (saved) std::snprintf(where, sizeof(where), "checkpoint %s/step_%06d saved; resume it "
                               "with [checkpoint] resume = \"latest\"",
                               r.cfg.checkpoint.dir.c_str(), step);
      std::printf("preempted: %s received: stopped after step %d of %d; %s\n",
                  signal_name(stop), step, r.cfg.train.steps, where);
      std::fflush(stdout);
    }
    r.resumed_step = step;  // the steps this run did end here
    return stop;
  }
  return 0;
}

int main(int argc, char** argv) {
  int world_rank = 0, world_size = 1, local_rank = 0;
  runtime_init(&argc, &argv, &world_rank, &world_size, &local_rank);
  preemption_install();
  Run r;
  r.rank0 = world_rank == 0;
  if (has_flag(argc, argv, "--help") || has_flag(argc, argv, "-h")) {
    if (r.rank0) std::printf(kUsage, argv[0], argv[0], argv[0]);
    runtime_finalize();
    return 0;
  }
  CHECK_ALL(argc >= 2, kUsage, argv[0], argv[0], argv[0]);
  const char* default_backend = std::strcmp(ops::backend_name(), "cuda") == 0 ? "nccl" : "mpi";
  const PlanFlags planner = plan_take_flags(&argc, argv);
  if (planner.any()) {  // the layout the config names, not this launch's: training/plan.h
    r.cfg = load_config(argc - 1, argv + 1, 0, default_backend, pipeline_config_problems);
    const int rc = r.rank0 ? plan_run(r.cfg, planner) : 0;
    runtime_finalize();
    return rc;
  }
  r.cfg = load_config(argc - 1, argv + 1, world_size, default_backend, pipeline_config_problems);
  if (has_flag(argc, argv, "--check-config")) {  // print the resolved config and stop
    check_data(r.cfg);
    if (r.rank0) std::printf("%s", r.cfg.toml_text.c_str());
    runtime_finalize();
    return 0;
  }
  if (r.rank0) std::printf("# config %s\n%s\n", r.cfg.path.c_str(), r.cfg.toml_text.c_str());
  setup(r, world_rank, local_rank);
  if (has_flag(argc, argv, "--sample")) {  // generate from the model as set up, and stop
    sample_only(r);
    gpt_destroy(r.model);
    runtime_finalize();
    return 0;
  }
  print_banner(r);
  if (!r.cfg.log.trace.empty())  // the traced steps' timelines (kernels/trace.h)
    trace::configure(r.cfg.log.trace, r.cfg.log.trace_steps[0], r.cfg.log.trace_steps[1],
                     world_rank, r.compute);
  const int first = r.resumed_step;
  const int stopped_by = train_steps(r);
  metrics_summary(r.metrics, r.summary, r.info, r.rank0);
  if (r.rank0 && r.train_data.sources.size() > 1)
    std::printf("data     rows drawn from each dataset of [data] train since step 0: %s\n",
                data_mix_counts(r.train_data).c_str());
  if (!stopped_by) {
    if (r.rank0) comm_stats_print(r.comm_total, r.cfg.train.steps - first, stdout);
    if (r.mesh.shape.pp > 1 && first < r.cfg.train.steps) print_bubble(r);
    report_memory_peak(r);
  }

  metrics_close(r.metrics);
  trace::shutdown();
  step_readback_destroy(r.readback);
  step_graph_destroy(r.graph);
  gpt_destroy(r.model);
  pipeline_destroy(r.pipeline);
  param_store_destroy(r.store);
  ops::stream_destroy(r.compute);
  ops::stream_destroy(r.comm);
  mesh_destroy(r.mesh);
  runtime_finalize();
  return stopped_by ? kExitPreempted : 0;
}
