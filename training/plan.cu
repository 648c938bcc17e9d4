// training/plan.cu - the layout planner (training/plan.h). It does not model the trainer: it runs
// it. For every rank of the layout the config names, it makes the rank's mesh with the Count
// backend (every collective checked and counted exactly as a real one, nothing moved:
// parallel/comm.h), lays the model out, builds the parameter store, the pipeline and the model
// with counting allocators (kernels/allocator.h: every buffer recorded, none allocated), and runs
// one training step - the trainer's own gpt_train_step - on the dry stream, where every kernel
// does nothing. What the counters and the allocators saw is the plan: state bytes, activation
// bytes, and the communication of a step, per axis and collective. A feature is planned by being
// written once, in the trainer.
//
// Two things a dry step cannot know are stated as assumptions: the MoE router's choices (the
// planner gives the model a balanced router, balanced_route below), and time. The step time is a
// device model ([plan]): the FLOPs at matmul_efficiency of the peak, slowed by the schedule's
// bubble, plus the ring bytes of each group at the bandwidth of the link it spans (inside a node
// or across nodes) and optimizer offload's bytes over the host link and to the file ([plan]
// pcie_gbs, nvme_gbs), none of it overlapped. The host AdamW's own time is not modelled.
#include "training/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "model/gpt.h"
#include "model/gpt_pipeline.h"
#include "parallel/diloco.h"
#include "parallel/mesh.h"
#include "parallel/param_store.h"
#include "parallel/pipeline.h"
#include "config/device_peaks.h"
#include "training/metrics.h"
#include "training/optimizer.h"
#include "training/step_readback.h"

namespace {

// The router the plan assumes (a dry step has no logits): token slot p takes expert p % E, which
// spreads every rank's pairs evenly over the experts. The model asks for it where the trainer
// reads the router's choices back from the device (GPT::moe_route_source).
void balanced_route(int* expert, const int* device_expert, int pairs, int E, ops::Stream s) {
  for (int p = 0; p < pairs; p++) expert[p] = p % E;
}

// What one rank of the layout holds and sends in a training step, found by running the step
// dry: the trainer's setup (train.cu) and gpt_train_step with count-only parts.
struct DryRank {
  Mesh mesh;
  GPTLayout layout;
  ParamStore store;
  Pipeline pipeline;
  GPT model;
  Diloco diloco;  // [parallel] diloco_islands: its outer state and device buffer are counted
  StepReadback readback;  // the step's loss and norm on the device (a few bytes, counted)
};

void dry_setup(DryRank& d, const Config& c, const PipelineSchedule& schedule, int world_rank) {
  const ops::Stream dry = ops::dry_stream();
  mesh_init(d.mesh, mesh_shape(c), world_rank, 0, CommBackend::Count);
  d.layout = gpt_layout(c.model, d.mesh);
  d.store.count_only = true;
  const ShardingMode mode = store_options(d.store, c);
  param_store_init(d.store, d.layout.units, mode, compute_dtype(c.precision),
                   diloco_store_comms(d.mesh, c), dry, dry, ParamFill{});
  if (diloco_enabled(c)) diloco_init(d.diloco, c, d.store, d.mesh[Axis::Island]);
  d.pipeline.count_only = true;
  pipeline_init_with(d.pipeline, schedule, &d.mesh[Axis::PP]);
  d.model.memory.count_only = true;
  d.model.moe_route_source = balanced_route;
  d.model.split_backward = schedule.split;
  d.model.grad_buffers = d.pipeline.grads;
  gpt_create_from_config(d.model, d.layout, c, &d.mesh[Axis::Stage], d.pipeline.slots, dry, dry);
  step_readback_init(d.readback, d.model.memory, d.mesh.shape.world(), dry);
}

// One training step of rank `world_rank`, dry: its memory and its communication.
// `tokens`: the step's micro-batches (m * B * T/cp ids), read by no kernel: the step is dry.
RankPlan plan_rank(const Config& c, const PipelineSchedule& schedule, const int* tokens,
                   int world_rank) {
  DryRank d;
  dry_setup(d, c, schedule, world_rank);
  const int B = c.train.micro_batch, T = c.model.seq_len, m = c.train.grad_accum;
  const int T_local = T / c.parallel.cp;
  comm_stats_reset(d.mesh.stats);
  store_stats_reset(d.store);
  gpt_train_step(d.model, d.store, d.pipeline, {tokens, tokens, m, B, T_local},
                 1.0f / ((float)B * T * m * c.parallel.dp), 1.0f / ((float)B * T * m),
                 ops::dry_stream());
  // the update: ZeRO-1/2's all-gathers and the offload's copies are part of the step (the norm
  // and its uncounted control gather are not: a dry step has none; the factor moves no bytes)
  optimizer_step(d.store, d.layout, c.train, 1, c.train.lr);
  RankPlan r;
  const MeshCoords at = mesh_coords(d.mesh.shape, world_rank);
  r.rank = world_rank;
  r.dp_rank = at.dp, r.pp_rank = at.pp, r.cp_rank = at.cp, r.tp_rank = at.tp;
  r.state_bytes = d.store.state_memory.bytes;
  r.activation_bytes = d.model.memory.bytes;
  r.peak_bytes = r.state_bytes + r.activation_bytes + d.store.work_memory.bytes;
  r.gpu = gpu_memory_terms(c, d.mesh);
  r.device_peak_bytes = r.peak_bytes + r.gpu.total();
  r.host_bytes = d.store.offload.memory.bytes;
  r.disk_bytes = d.store.offload.disk_bytes;
  r.comm = d.mesh.stats;
  if (diloco_enabled(c))  // one outer all-reduce every diloco_every steps, amortised
    r.diloco_bytes_per_step = (double)diloco_outer_bytes(d.diloco, d.store) / c.parallel.diloco_every;
  r.offload = d.store.offload.stats;
  gpt_destroy(d.model);
  pipeline_destroy(d.pipeline);
  param_store_destroy(d.store);
  mesh_destroy(d.mesh);
  return r;
}

// Whether every member of a group sits in one node ([plan] gpus_per_node consecutive ranks).
bool inside_one_node(const std::vector<int>& members, int gpus_per_node) {
  for (int w : members)
    if (w / gpus_per_node != members[0] / gpus_per_node) return false;
  return true;
}

// The time rank 0's collectives take: the bytes a ring algorithm puts on the wire per rank, over
// the link its group spans.
double comm_ms(const Config& c, const CommStats& st) {
  const PlanConfig& p = c.plan;
  const MeshShape shape = mesh_shape(c);
  double ms = 0;
  for (int a = 0; a < (int)Axis::Count; a++) {
    const int n = st.group_size[a];
    const bool near = inside_one_node(mesh_group_members(shape, (Axis)a, 0), p.gpus_per_node);
    const double gbs = near ? p.intra_node_gbs : p.inter_node_gbs;
    const CommCounters& k = st.axis[a];
    double wire = k.bytes[(int)CollectiveKind::Send];
    if (n > 1) {
      wire += 2.0 * (n - 1) / n * k.bytes[(int)CollectiveKind::AllReduce];
      wire += (double)(n - 1) / n * (k.bytes[(int)CollectiveKind::AllGather] +
                                     k.bytes[(int)CollectiveKind::ReduceScatter] +
                                     k.bytes[(int)CollectiveKind::AllToAll]);
    }
    ms += wire / (gbs * 1e9) * 1e3;
  }
  return ms;
}

// Optimizer offload's transfers: the host link each way, and the file.
double offload_ms(const Config& c, const OffloadStats& o) {
  const double link = std::max(o.to_host_bytes, o.to_device_bytes) / (c.plan.pcie_gbs * 1e9);
  const double disk = (double)(o.disk_read_bytes + o.disk_write_bytes) / (c.plan.nvme_gbs * 1e9);
  return (link + disk) * 1e3;
}

// The step time and MFU from the device model, over rank 0's layout.
void estimate_time(Plan& plan, const Config& c, const PipelineSchedule& sched) {
  DryRank d;  // rank 0's layout (its FLOPs), built like the others'
  mesh_init(d.mesh, mesh_shape(c), 0, 0, CommBackend::None);
  const GPTLayout g = gpt_layout(c.model, d.mesh);
  const int world = d.mesh.shape.world();
  const Recompute rc = parse_recompute(c.train.recompute);
  plan.tokens_per_step =
      (double)c.train.micro_batch * c.model.seq_len * c.train.grad_accum * c.parallel.dp;
  plan.flops = flops_per_token(g, rc);
  plan.peak_tflops = plan_peak_tflops(c);
  const double flops = plan.flops.hardware * plan.tokens_per_step / world;
  plan.compute_ms = flops / (plan.peak_tflops * 1e12 * c.plan.matmul_efficiency) * 1e3;
  plan.bubble = pipeline_simulate(sched, PipeCosts{}).bubble();  // at the nominal costs
  plan.comm_ms = comm_ms(c, plan.ranks[0].comm) + offload_ms(c, plan.ranks[0].offload);
  plan.step_ms = plan.compute_ms / (1.0 - plan.bubble) + plan.comm_ms;
  const double achieved = plan.tokens_per_step / (plan.step_ms / 1e3) / world / 1e12;  // per GPU
  plan.mfu = achieved * plan.flops.causal / plan.peak_tflops;
  plan.mfu_full = achieved * plan.flops.full / plan.peak_tflops;
  plan.hfu = achieved * plan.flops.hardware / plan.peak_tflops;
  mesh_destroy(d.mesh);
}

}  // namespace

Plan plan_layout(const Config& c, PlanScope scope) {
  Plan plan;
  const MeshShape shape = mesh_shape(c);
  const PipelineSchedule schedule = pipeline_build(c.parallel.pp_schedule, shape.pp,
                                                   c.train.grad_accum, shape.pp_virtual);
  const std::vector<int> tokens(
      (size_t)c.train.grad_accum * c.train.micro_batch * c.model.seq_len / shape.cp, 0);
  for (int w = 0; w < shape.world(); w++) {
    const MeshCoords at = mesh_coords(shape, w);
    if (scope == PlanScope::EveryRank || (at.dp == 0 && at.cp == 0 && at.tp == 0))
      plan.ranks.push_back(plan_rank(c, schedule, tokens.data(), w));
  }
  estimate_time(plan, c, schedule);
  const double limit = c.plan.memory_gib * (1ull << 30);
  for (const RankPlan& r : plan.ranks)
    if (r.device_peak_bytes > limit && plan.does_not_fit.empty()) {
      char msg[200];
      std::snprintf(msg, sizeof(msg), "rank %d needs %.4g GiB, %.4g GiB more than [plan] "
                    "memory_gib = %g", r.rank, r.device_peak_bytes / 1073741824.0,
                    (r.device_peak_bytes - limit) / 1073741824.0, c.plan.memory_gib);
      plan.does_not_fit = msg;
    }
  return plan;
}

std::string plan_memory_problem(const Plan& plan, size_t device_free, size_t host_free,
                                bool device_is_host) {
  for (const RankPlan& r : plan.ranks) {
    // Free memory is measured with this process's CUDA context already made: not counted twice.
    const double device = device_is_host ? (double)r.peak_bytes + (double)r.host_bytes
                                         : (double)r.device_peak_bytes - (double)r.gpu.context;
    const double host = device_is_host ? 0.0 : (double)r.host_bytes;
    const bool on_device = device_free > 0 && device > (double)device_free;
    if (!on_device && !(host_free > 0 && host > (double)host_free)) continue;
    const bool is_host = !on_device || device_is_host;
    const double need = on_device ? device : host;
    const size_t free = on_device ? device_free : host_free;
    char msg[400];
    std::snprintf(msg, sizeof(msg), "this layout's training step, run dry by the planner "
                  "(training/plan.h; --plan shows it), needs %.0f bytes (%.3g GiB) of %s memory "
                  "on rank %d, but %s has %zu bytes (%.3g GiB) free: make the model or [train] "
                  "micro_batch smaller, or shard more ([parallel] zero, tp, pp; [train] "
                  "optimizer_offload)", need, need / 1073741824.0, is_host ? "host" : "device",
                  r.rank, is_host ? "the host" : "the device", free, free / 1073741824.0);
    return msg;
  }
  return "";
}

// ---------------------------------------------------------------------------------------------
// The command line
// ---------------------------------------------------------------------------------------------
PlanFlags plan_take_flags(int* argc, char** argv) {
  PlanFlags f;
  int out = 1;
  for (int i = 1; i < *argc; i++) {
    const std::string a = argv[i];
    auto value = [&](const std::string& flag) -> std::string {
      if (a.size() > flag.size() && a.compare(0, flag.size() + 1, flag + "=") == 0)
        return a.substr(flag.size() + 1);
      CHECK_ALL(i + 1 < *argc, "%s needs a value", flag.c_str());
      return argv[++i];
    };
    if (a == "--plan") f.plan = true;
    else if (a.rfind("--plan-json", 0) == 0) f.json = value("--plan-json");
    else if (a.rfind("--plan-search", 0) == 0) {
      const std::string n = value("--plan-search");
      f.search = std::atoi(n.c_str());
      CHECK_ALL(f.search > 0, "--plan-search %s: expects a number of GPUs > 0", n.c_str());
    } else argv[out++] = argv[i];
  }
  *argc = out;
  f.plan = f.plan || !f.json.empty();
  return f;
}

int plan_run(const Config& cfg, const PlanFlags& f) {
  if (f.search > 0) return plan_search(cfg, f.search, stdout) ? 0 : 1;
  const Plan plan = plan_layout(cfg);
  plan_print(plan, cfg, stdout);
  if (!f.json.empty()) {
    const std::string problem = plan_write_json(plan, cfg, f.json);
    CHECK_ALL(problem.empty(), "--plan-json: %s", problem.c_str());
  }
  return plan.does_not_fit.empty() ? 0 : 1;
}

// ---------------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------------
static double mib(size_t b) { return b / 1048576.0; }

// Rank 0's GPU-only memory, a line per term (training/device_memory.h): peak + these = device.
static void plan_print_gpu_terms(const GpuMemoryTerms& g, FILE* out) {
  std::fprintf(out, "  GPU-only memory on rank 0 (device MiB = peak MiB + these; "
               "training/device_memory.h):\n");
  std::fprintf(out, "    cuBLASLt workspace    %8.1f MiB  (%d streams x %.0f MiB)\n",
               mib(g.cublas_workspace), kStreamsPerRank, mib(kCublasWorkspaceBytes));
  std::fprintf(out, "    stream scratch        %8.1f MiB  (largest request %.3f MiB: %s)\n",
               mib(g.scratch), mib(g.scratch_request), g.scratch_what.c_str());
  std::fprintf(out, "    NCCL buffers          %8.1f MiB  (%d communicators x %.0f MiB, estimate)\n",
               mib(g.nccl), g.nccl_communicators, mib(kNcclCommunicatorBytes));
  std::fprintf(out, "    CUDA context          %8.1f MiB  (estimate)\n", mib(g.context));
}

void plan_print(const Plan& plan, const Config& c, FILE* out) {
  const ParallelConfig& p = c.parallel;
  const bool offload = c.train.optimizer_offload != "none";
  const std::string hsdp =  // parallel/hsdp.cu: dp = replicas x shard group
      p.dp_replicate > 1 ? " (" + std::to_string(p.dp_replicate) + " replicas of " +
                               std::to_string(p.dp / p.dp_replicate) + ")" : "";
  std::fprintf(out, "plan     dp=%d%s %s%s pp=%d (%s, v=%d) cp=%d tp=%d%s ep=%d: %zu ranks, %.0f "
               "tokens per step\n", p.dp, hsdp.c_str(), sharding_mode_name(sharding_mode(p.zero)),
               offload ? (", optimizer offload " + c.train.optimizer_offload).c_str() : "", p.pp,
               p.pp_schedule.c_str(), p.pp_virtual, p.cp, p.tp, p.sp && p.tp > 1 ? " SP" : "",
               p.ep, plan.ranks.size(), plan.tokens_per_step);
  std::fprintf(out, "  rank  dp pp cp tp    state MiB  activ. MiB   peak MiB  device MiB%s\n",
               offload ? "   host MiB   disk MiB" : "");
  for (const RankPlan& r : plan.ranks) {
    if (r.dp_rank > 0 || r.cp_rank > 0) continue;  // the same as their dp x cp rank 0
    std::fprintf(out, "  %4d %3d %2d %2d %2d %12.1f %11.1f %10.1f %11.1f", r.rank, r.dp_rank,
                 r.pp_rank, r.cp_rank, r.tp_rank, mib(r.state_bytes), mib(r.activation_bytes),
                 mib(r.peak_bytes), mib(r.device_peak_bytes));
    if (offload) std::fprintf(out, " %10.1f %10.1f", mib(r.host_bytes), mib(r.disk_bytes));
    std::fprintf(out, "\n");
  }
  plan_print_gpu_terms(plan.ranks[0].gpu, out);
  std::fprintf(out, "  communication per step on rank 0:\n");
  CommStats st = plan.ranks[0].comm;
  comm_stats_print(st, 1, out);
  if (p.diloco_islands >= 1)
    std::fprintf(out, "    DiLoCo (%d islands): an %s all-reduce of %.2f MB over the island axis "
                 "every %d steps: %.2f MB per step amortised (parallel/diloco.h)\n",
                 p.diloco_islands, p.diloco_compression == "int8" ? "int8" : "fp32",
                 plan.ranks[0].diloco_bytes_per_step * p.diloco_every / 1e6,
                 p.diloco_every, plan.ranks[0].diloco_bytes_per_step / 1e6);
  const OffloadStats& o = plan.ranks[0].offload;
  if (offload)
    std::fprintf(out, "    offload: %.1f MiB to the host, %.1f MiB to the device, %.1f MiB read "
                 "from and %.1f MiB written to the file\n", mib(o.to_host_bytes),
                 mib(o.to_device_bytes), mib(o.disk_read_bytes), mib(o.disk_write_bytes));
  std::fprintf(out, "  bubble %.1f%%, compute %.2f ms, communication %.2f ms (at [plan] bandwidths)"
               "\n  estimated step %.2f ms, MFU %.1f%% of %.1f TFLOP/s per GPU (%s %s; causal "
               "attention at half; %.1f%% at full, HFU %.1f%%)\n",
               100 * plan.bubble, plan.compute_ms, plan.comm_ms, plan.step_ms, 100 * plan.mfu,
               plan.peak_tflops, c.plan.peak_tflops > 0 ? "[plan] peak_tflops" : c.plan.device.c_str(),
               c.precision.compute == "fp8" ? "FP8" : "BF16", 100 * plan.mfu_full, 100 * plan.hfu);
  std::fprintf(out, "  model FLOPs per token %.4g (6N + 6LTd, N = %.4g), %.4g (6N + 12LTd), "
               "executed %.4g\n", plan.flops.causal, plan.flops.matmul_parameters,
               plan.flops.full, plan.flops.hardware);
  if (!plan.does_not_fit.empty())
    std::fprintf(out, "  DOES NOT FIT: %s\n", plan.does_not_fit.c_str());
}

std::string plan_write_json(const Plan& plan, const Config& c, const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return "cannot write " + path;
  const ParallelConfig& p = c.parallel;
  std::fprintf(f, "{\"layout\":{\"dp\":%d,\"pp\":%d,\"cp\":%d,\"tp\":%d,\"ep\":%d,\"zero\":%d,"
               "\"fsdp\":%s,\"optimizer_offload\":\"%s\",\"sp\":%s,\"pp_schedule\":\"%s\","
               "\"pp_virtual\":%d,\"micro_batch\":%d,\"grad_accum\":%d,\"dp_replicate\":%d},",
               p.dp, p.pp, p.cp, p.tp, p.ep, p.zero, p.fsdp ? "true" : "false",
               c.train.optimizer_offload.c_str(), p.sp ? "true" : "false", p.pp_schedule.c_str(),
               p.pp_virtual, c.train.micro_batch, c.train.grad_accum, p.dp_replicate);
  std::fprintf(f, "\"ranks\":[");
  for (size_t i = 0; i < plan.ranks.size(); i++) {
    const RankPlan& r = plan.ranks[i];
    std::fprintf(f, "%s{\"rank\":%d,\"dp_rank\":%d,\"pp_rank\":%d,\"cp_rank\":%d,\"tp_rank\":%d,"
                 "\"state_bytes\":%zu,\"activation_bytes\":%zu,\"peak_bytes\":%zu,"
                 "\"host_bytes\":%zu,\"disk_bytes\":%zu", i ? "," : "", r.rank, r.dp_rank,
                 r.pp_rank, r.cp_rank, r.tp_rank, r.state_bytes, r.activation_bytes, r.peak_bytes,
                 r.host_bytes, r.disk_bytes);
    std::fprintf(f, ",\"device_peak_bytes\":%zu,\"gpu\":{\"cublas_workspace\":%zu,"
                 "\"scratch\":%zu,\"scratch_request\":%zu,\"nccl\":%zu,"
                 "\"nccl_communicators\":%d,\"context\":%zu}", r.device_peak_bytes,
                 r.gpu.cublas_workspace, r.gpu.scratch, r.gpu.scratch_request, r.gpu.nccl,
                 r.gpu.nccl_communicators, r.gpu.context);
    print_comm_json(f, r.comm);
    print_offload_json(f, r.offload);
    if (c.parallel.diloco_islands >= 1)
      std::fprintf(f, ",\"diloco_bytes_per_step\":%.10g", r.diloco_bytes_per_step);
    std::fprintf(f, "}");
  }
  std::fprintf(f, "],\"bubble\":%.10g,\"compute_ms\":%.6g,\"comm_ms\":%.6g,\"step_ms\":%.6g,"
               "\"mfu\":%.6g,\"mfu_full\":%.6g,\"hfu\":%.6g,\"peak_tflops\":%.6g,"
               "\"flops_per_token\":%.0f,\"flops_per_token_full\":%.0f,"
               "\"hardware_flops_per_token\":%.0f,\"matmul_parameters\":%.0f,\"fits\":%s}\n",
               plan.bubble, plan.compute_ms, plan.comm_ms, plan.step_ms, plan.mfu, plan.mfu_full,
               plan.hfu, plan.peak_tflops, plan.flops.causal, plan.flops.full, plan.flops.hardware,
               plan.flops.matmul_parameters, plan.does_not_fit.empty() ? "true" : "false");
  return std::fclose(f) == 0 ? "" : "cannot write " + path;
}

// The plan of c's layout at the first rung of the memory ladder that fits: c's own ZeRO stage
// and offload, then each higher stage, then (without offload in c) offload to the host at stages
// 1, 2, 3. c is left at that rung (or at the last one tried, which does not fit).
static Plan plan_on_the_ladder(Config& c) {
  std::vector<std::pair<int, std::string>> rungs = {{c.parallel.zero, c.train.optimizer_offload}};
  for (int z = c.parallel.zero + 1; z <= 3; z++) rungs.push_back({z, c.train.optimizer_offload});
  if (c.train.optimizer_offload == "none")
    for (int z = 1; z <= 3; z++) rungs.push_back({z, "cpu"});
  Plan plan;
  for (const auto& [zero, offload] : rungs) {
    c.parallel.zero = zero, c.parallel.fsdp = zero == 3, c.train.optimizer_offload = offload;
    plan = plan_layout(c, PlanScope::Stages);
    if (plan.does_not_fit.empty()) break;
  }
  return plan;
}

bool plan_search(const Config& cfg, int n, FILE* out) {
  struct Row {
    int dp, pp, cp, tp, ep, accum, zero;
    std::string offload;
    Plan plan;
  };
  std::vector<Row> rows;
  // The global batch stays the config's: micro_batch x grad_accum x dp sequences.
  const long global = (long)cfg.train.micro_batch * cfg.train.grad_accum * cfg.parallel.dp;
  for (int tp = 1; tp <= n; tp++)
    for (int cp = 1; tp * cp <= n; cp++)
      for (int pp = 1; tp * cp * pp <= n; pp++) {
        if (n % (tp * cp * pp)) continue;
        Config c = cfg;
        c.parallel.tp = tp, c.parallel.cp = cp, c.parallel.pp = pp;
        c.parallel.dp = n / (tp * cp * pp);
        if (global % ((long)cfg.train.micro_batch * c.parallel.dp)) continue;
        c.train.grad_accum = (int)(global / ((long)cfg.train.micro_batch * c.parallel.dp));
        if (pp == 1) c.parallel.pp_schedule = "1f1b", c.parallel.pp_virtual = 1;
        // Experts: every ep that divides dp x cp and the experts (1 for a dense model).
        for (int ep = 1; ep <= c.parallel.dp * cp; ep++) {
          if ((c.parallel.dp * cp) % ep || (ep > 1 && (cfg.model.n_experts % ep))) continue;
          if (ep > 1 && cfg.model.n_experts == 0) break;
          c.parallel.ep = ep;
          // (a user's schedule file is written for one pp: other layouts refuse it)
          if (!layout_problems(c, n).empty() || !pipeline_config_problems(c).empty()) continue;
          Config rung = c;
          Plan plan = plan_on_the_ladder(rung);
          rows.push_back({c.parallel.dp, pp, cp, tp, ep, c.train.grad_accum, rung.parallel.zero,
                          rung.train.optimizer_offload, plan});
        }
      }
  if (rows.empty()) {
    std::fprintf(out, "error: no valid layout of %d GPUs for this model and batch (tp must divide "
                 "n_head, cp 2*cp seq_len, pp n_layer...): try another count\n", n);
    return false;
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    return a.plan.step_ms < b.plan.step_ms;
  });
  std::fprintf(out, "layouts of %d GPUs for %ld sequences of %d tokens per step (micro_batch %d), "
               "fastest estimated step first:\n"
               "    dp   pp   cp   tp   ep  accum    step ms    MFU   bubble  device GiB  zero  "
               "offload\n", n, global,
               cfg.model.seq_len, cfg.train.micro_batch);
  bool any_fits = false;
  for (const Row& r : rows) {
    size_t peak = 0;
    for (const RankPlan& rp : r.plan.ranks) peak = std::max(peak, rp.device_peak_bytes);
    any_fits = any_fits || r.plan.does_not_fit.empty();
    std::fprintf(out, "  %4d %4d %4d %4d %4d %6d %10.3f %5.1f%% %6.1f%% %11.2f %5d  %-4s%s\n",
                 r.dp, r.pp, r.cp, r.tp, r.ep, r.accum, r.plan.step_ms, 100 * r.plan.mfu,
                 100 * r.plan.bubble, peak / 1073741824.0, r.zero, r.offload.c_str(),
                 r.plan.does_not_fit.empty() ? "" : "  does not fit");
  }
  if (!any_fits)
    std::fprintf(out, "error: no layout of %d GPUs fits in [plan] memory_gib = %g per GPU\n", n,
                 cfg.plan.memory_gib);
  return any_fits;
}
