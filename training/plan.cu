// training/plan.cu - the layout planner (training/plan.h): per rank, state and activation bytes from
// the trainer's own accounting, communication per step from the collectives' counts, then a
// device model for the step time.
//
// Communication per step, per micro-batch of N = B*T/cp tokens, on a rank holding Lr blocks (the
// first stage also the embedding, the last the head), C channels, e bytes per element:
//   tp (tp > 1)   sums: 4 per block (2 forward, 2 backward) + 1 per recomputed block + 1 on the
//                 first stage (embedding) + 1 on the last (head); all-reduces of N*C*e, or with
//                 SP reduce-scatters; with SP also gathers: 6 per block (2 forward, 4 backward)
//                 + 2 per recomputed block + 1 first + 1 last, N*C*e each; the last stage's
//                 cross-entropy statistics, one all-gather of tp*N*3*4; per step one all-reduce
//                 of each unit's LayerNorm-gradient range in this rank's shard (SP).
//   dp / dp*cp    DDP: one all-reduce per unit per step (fp32). FSDP: per block and micro-batch
//                 two all-gathers (forward, backward) and one reduce-scatter; the root once per
//                 step each.
//   embed         pp > 1, first and last stage: one all-reduce of the root's gradient shard.
//   pp            the schedule's sends and receives, each B*T/cp (/tp with SP) * C * e.
//   cp            per block: cp-1 K, V transfers of N*2C/tp*e forward (again when recomputed),
//                 cp-1 backward and cp of dK, dV in fp32.
//   stage         FP8: one 4-byte all-reduce (max) per cast, 16 per block (22 recomputed), 8
//                 per MoE block (12 recomputed; its experts run in the compute dtype).
//   ep            per MoE block and micro-batch (ep > 1): one all-to-all of the expert counts
//                 (4*E bytes) and four of the pairs' rows (2 forward, 2 backward): the two
//                 trips out send tokens(N)*top_k*C*e bytes each (dropless: every pair is sent,
//                 its own rank's too); the two trips back send the rows this rank's experts ran,
//                 which depends on the routing: the plan assumes a balanced router (the same).
//                 Recompute "block" repeats the forward's two trips (not the counts).
//   expert grads  the expert units' gradients over the ranks holding the same experts (ep-dp),
//                 as dp above; an MoE block also sums its sequences' expert counts for the
//                 load-balancing loss, B*E*4 bytes per micro-batch over tp (SP) and over cp.
// An MoE block has no dense MLP: 2 tp sums (and with SP 3 gathers) instead of 4 (and 6); its
// recomputed forward adds 1 sum and 1 gather (a dense block's: 1 and 2).
#include "training/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "model/fp8.h"
#include "model/gpt.h"
#include "training/metrics.h"
#include "parallel/mesh.h"
#include "parallel/pipeline.h"
#include "parallel/pipeline_schedule.h"

namespace {

struct Shape {
  int B, T, Tl, m, dp, pp, cp, tp, v, ep;
  bool sp, fsdp, fp8;
  DType dt;
  size_t e;
  Recompute rc;
};

Shape shape_of(const Config& c) {
  const ParallelConfig& p = c.parallel;
  Shape s;
  s.B = c.train.micro_batch, s.T = c.model.seq_len, s.Tl = s.T / p.cp, s.m = c.train.grad_accum;
  s.dp = p.dp, s.pp = p.pp, s.cp = p.cp, s.tp = p.tp, s.v = p.pp_virtual, s.ep = p.ep;
  s.sp = p.sp && p.tp > 1, s.fsdp = p.fsdp && p.dp * p.cp > 1;
  s.dt = c.precision.compute == "fp32" ? DType::F32 : DType::BF16;
  s.fp8 = c.precision.compute == "fp8";
  s.e = dtype_size(s.dt);
  s.rc = parse_recompute(c.train.recompute);
  return s;
}

void add(CommStats& st, Axis a, CollectiveKind k, uint64_t calls, uint64_t bytes) {
  st.axis[(int)a].calls[(int)k] += calls;
  st.axis[(int)a].bytes[(int)k] += bytes;
}

// Rank r's layout, over a mesh that describes its place (parallel/mesh.h).
GPTLayout layout_of(const Config& c, const RankPlan& r, Mesh& mesh) {
  mesh_init(mesh, mesh_shape(c.parallel), r.rank, 0, CommBackend::None);
  return gpt_layout(c.model, mesh);
}

// The MoE and dense blocks this rank holds (all chunks).
struct BlockCounts {
  uint64_t dense = 0, moe = 0;
};
BlockCounts blocks_held(const GPTLayout& g) {
  BlockCounts n;
  for (int l = 0; l < g.L; l++)
    if (g.block_unit[l] >= 0) (g.moe[l] ? n.moe : n.dense)++;
  return n;
}

// The dp (x cp) group of a unit: its size, this rank's index, and the shard it owns.
struct Group {
  int size, rank;
  Axis axis;
};
Group grad_group(const Shape& s, const RankPlan& r, const ParamUnit& u) {
  const int dpcp = r.dp_rank * s.cp + r.cp_rank;
  if (u.grad_axis == Axis::EPDP) return {s.dp * s.cp / s.ep, dpcp / s.ep, Axis::EPDP};
  if (s.cp > 1) return {s.dp * s.cp, r.dp_rank * s.cp + r.cp_rank, Axis::DPCP};
  return {s.dp, r.dp_rank, Axis::DP};
}
FlatRange shard_of(const Shape& s, const Group& g, const ParamUnit& u) {
  return s.fsdp ? shard_range(u.numel, g.rank, g.size) : FlatRange{0, u.numel};
}

void tp_comm(const Shape& s, const GPTLayout& g, const RankPlan& r, CommStats& st) {
  if (s.tp == 1) return;
  const bool first = r.pp_rank == 0, last = r.pp_rank == s.pp - 1;
  const BlockCounts held = blocks_held(g);
  const uint64_t Lr = held.dense + held.moe, N = (uint64_t)s.B * s.Tl;
  const uint64_t act = N * g.C * s.e, recomputed = s.rc == Recompute::Block ? Lr : 0;
  const uint64_t sums = 4 * held.dense + 2 * held.moe + recomputed + first + last;
  add(st, Axis::TP, s.sp ? CollectiveKind::ReduceScatter : CollectiveKind::AllReduce,
      s.m * sums, s.m * sums * act);
  if (s.sp) {
    const uint64_t regathers = s.rc == Recompute::Block ? 2 * held.dense + held.moe : 0;
    const uint64_t gathers = 6 * held.dense + 3 * held.moe + regathers + first + last;
    add(st, Axis::TP, CollectiveKind::AllGather, s.m * gathers, s.m * gathers * act);
  }
  if (last) add(st, Axis::TP, CollectiveKind::AllGather, s.m, s.m * s.tp * N * 3 * 4);
  if (!s.sp) return;
  for (const ParamUnit& u : g.units) {  // the LayerNorms' partial gradients, once per step
    const FlatRange sh = shard_of(s, grad_group(s, r, u), u);
    const size_t lo = std::max(sh.first, u.partial_begin), hi = std::min(sh.end, u.numel);
    if (hi > lo) add(st, Axis::TP, CollectiveKind::AllReduce, 1, 4 * (hi - lo));
  }
}

// FP8 (model/fp8.h): every cast's amax is agreed (max, one float) over the stage group: per
// block and micro-batch 4 linear layers x 2 casts forward (input, weight) and 2 backward
// (gradient, input again), and 3 x 2 more when the block's forward is recomputed.
void fp8_comm(const Shape& s, const GPTLayout& g, CommStats& st) {
  const int stage = s.dp * s.cp * s.tp;
  if (!s.fp8 || stage == 1) return;
  const BlockCounts held = blocks_held(g);
  const bool block = s.rc == Recompute::Block;
  const uint64_t casts =
      s.m * (held.dense * (16 + (block ? 6 : 0)) + held.moe * (8 + (block ? 4 : 0)));
  add(st, Axis::Stage, CollectiveKind::AllReduce, casts, casts * 4);
}

// Expert parallelism and the load-balancing loss's counts (model/moe.cu), per micro-batch.
void moe_comm(const Shape& s, const GPTLayout& g, CommStats& st) {
  const uint64_t moe = blocks_held(g).moe * s.m;
  if (moe == 0) return;
  const uint64_t rows = (uint64_t)g.tp.tokens(s.B * s.Tl) * g.top_k;
  if (s.ep > 1) {  // recompute "block" runs the forward's two trips again
    const uint64_t trips = s.rc == Recompute::Block ? 6 : 4;
    add(st, Axis::EP, CollectiveKind::AllToAll, moe, moe * 4 * g.E);
    add(st, Axis::EP, CollectiveKind::AllToAll, trips * moe, trips * moe * rows * g.C * s.e);
  }
  const uint64_t counts = (uint64_t)s.B * g.E * 4;
  if (s.sp) add(st, Axis::TP, CollectiveKind::AllReduce, moe, moe * counts);
  if (s.cp > 1) add(st, Axis::CP, CollectiveKind::AllReduce, moe, moe * counts);
}

void dp_comm(const Shape& s, const GPTLayout& g, const RankPlan& r, CommStats& st) {
  for (const ParamUnit& u : g.units) {
    const Group gg = grad_group(s, r, u);
    const size_t padded = padded_numel(u.numel, gg.size), shard = shard_of(s, gg, u).size();
    if (gg.size > 1 && !s.fsdp) add(st, gg.axis, CollectiveKind::AllReduce, 1, 4 * u.numel);
    if (gg.size > 1 && s.fsdp) {
      const uint64_t times = u.whole_step ? 1 : s.m;
      add(st, gg.axis, CollectiveKind::AllGather, times * (u.whole_step ? 1 : 2),
          times * (u.whole_step ? 1 : 2) * padded * s.e);
      add(st, gg.axis, CollectiveKind::ReduceScatter, times, times * padded * 4);
    }
    if (u.tied) add(st, Axis::Embed, CollectiveKind::AllReduce, 1, 4 * shard);
  }
}

void pp_cp_comm(const Shape& s, const GPTLayout& g, const PipelineSchedule& sched,
                const RankPlan& r, CommStats& st) {
  const uint64_t N = (uint64_t)s.B * s.Tl;
  const uint64_t msg = (uint64_t)g.tp.tokens((int)N) * g.C * s.e;
  for (const PipeAction& a : sched.ranks[r.pp_rank]) {
    if (pipe_op_is_comm(a.op))
      add(st, Axis::PP, pipe_op_is_send(a.op) ? CollectiveKind::Send : CollectiveKind::Recv, 1,
          msg);
  }
  if (s.cp == 1) return;
  const uint64_t Lr = (uint64_t)s.v * g.blocks_per_stage, kv = N * 2 * (g.C / s.tp);
  const uint64_t forwards = s.rc == Recompute::Block ? 2 : 1;
  const uint64_t kv_moves = s.m * Lr * (forwards + 1) * (s.cp - 1), dkv_moves = s.m * Lr * s.cp;
  for (CollectiveKind k : {CollectiveKind::Send, CollectiveKind::Recv}) {
    add(st, Axis::CP, k, kv_moves, kv_moves * kv * s.e);
    add(st, Axis::CP, k, dkv_moves, dkv_moves * kv * 4);
  }
}

// State bytes as the store counts them: fp32 master, m, v, gradient of the shard, and the
// compute-dtype working copy (of the shard under FSDP, of the unit under DDP; none in fp32).
// Peak adds FSDP's full-unit buffers: the root's (weights and fp32 gradient) and two of each
// for blocks.
void memory(const Config& c, const Shape& s, const GPTLayout& g, const PipelineSchedule& sched,
            RankPlan& r) {
  size_t largest = 0, transient = 0;
  for (const ParamUnit& u : g.units) {
    const Group gg = grad_group(s, r, u);
    const size_t shard = shard_of(s, gg, u).size(), padded = padded_numel(u.numel, gg.size);
    r.state_bytes += 16 * shard;
    if (s.dt != DType::F32) r.state_bytes += (s.fsdp ? shard : u.numel) * s.e;
    if (!s.fsdp) continue;
    if (u.whole_step) transient += padded * (s.e + 4);
    else largest = std::max(largest, padded);
  }
  transient += fsdp_pool_slots(g.units) * largest * (s.e + 4);
  GPT m;
  m.count_only = true;
  Fp8Recipe recipe;
  recipe.delayed = c.precision.fp8_recipe == "delayed";
  recipe.history = c.precision.fp8_amax_history;
  const bool fp8 = c.precision.compute == "fp8";
  gpt_create(m, g, s.dt, s.rc, s.B, s.Tl, nullptr, fp8 ? &recipe : nullptr,
             pipeline_slots(sched, r.pp_rank));
  r.activation_bytes = m.activation_bytes;
  gpt_destroy(m);
  r.peak_bytes = r.state_bytes + r.activation_bytes + transient;
}

// Bytes a ring algorithm puts on the wire per rank, over the link of the group's span.
double comm_ms(const Config& c, const Shape& s, const CommStats& st) {
  const PlanConfig& p = c.plan;
  double ms = 0;
  for (int a = 0; a < (int)Axis::Count; a++) {
    const int n = st.group_size[a];
    int span = s.tp * s.cp * s.pp * s.dp;  // the ranks a group reaches across (tp innermost)
    if (a == (int)Axis::TP) span = s.tp;
    if (a == (int)Axis::CP) span = s.tp * s.cp;
    if (a == (int)Axis::PP || a == (int)Axis::Embed) span = s.tp * s.cp * s.pp;
    const double gbs = span <= p.gpus_per_node ? p.intra_node_gbs : p.inter_node_gbs;
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

}  // namespace

Plan plan_layout(const Config& c) {
  const Shape s = shape_of(c);
  const int world = s.dp * s.pp * s.cp * s.tp;
  const PipelineSchedule sched = pipeline_build(c.parallel.pp_schedule, s.pp, s.m, s.v);
  Plan plan;
  // The layout and the memory of a rank depend on its pp and tp ranks only (dp x cp shards are
  // equal): worked out once per (pp, tp) role; the communication per rank (its shard decides
  // which LayerNorm ranges it sums over tp).
  const int sizes[] = {world, s.dp, s.tp, s.pp, s.cp, s.ep, s.dp * s.cp, s.dp * s.cp / s.ep,
                       world / s.pp, s.pp > 1 ? 2 : 1};  // per Axis, as the mesh builds them
  std::vector<GPTLayout> layouts(s.pp * s.tp);
  std::vector<std::unique_ptr<Mesh>> meshes(s.pp * s.tp);
  std::vector<RankPlan> roles(s.pp * s.tp);
  const MeshShape shape = mesh_shape(c.parallel);
  for (int w = 0; w < world; w++) {
    RankPlan r;
    for (int a = 0; a < (int)Axis::Count; a++) r.comm.group_size[a] = sizes[a];
    const MeshCoords at = mesh_coords(shape, w);
    r.rank = w, r.tp_rank = at.tp, r.cp_rank = at.cp, r.pp_rank = at.pp, r.dp_rank = at.dp;
    const int role = r.pp_rank * s.tp + r.tp_rank;
    if (layouts[role].units.empty()) {
      meshes[role] = std::make_unique<Mesh>();
      layouts[role] = layout_of(c, r, *meshes[role]);
      roles[role] = r;  // the role's first rank: dp and cp rank 0
      memory(c, s, layouts[role], sched, roles[role]);
    }
    const GPTLayout& g = layouts[role];
    r.state_bytes = roles[role].state_bytes;
    r.activation_bytes = roles[role].activation_bytes;
    r.peak_bytes = roles[role].peak_bytes;
    tp_comm(s, g, r, r.comm);
    dp_comm(s, g, r, r.comm);
    pp_cp_comm(s, g, sched, r, r.comm);
    fp8_comm(s, g, r.comm);
    moe_comm(s, g, r.comm);
    plan.ranks.push_back(r);
  }
  // The step: the rank with the most compute-bound work sets it (all ranks of a balanced
  // layout do the same), slowed by the bubble, plus the communication that is not overlapped.
  const GPTLayout& g0 = layouts[0];  // rank 0's role
  plan.tokens_per_step = (double)s.B * s.T * s.m * s.dp;
  const double flops = hardware_flops_per_token(g0, s.rc) * plan.tokens_per_step / world;
  plan.compute_ms = flops / (c.plan.peak_tflops * 1e12 * c.plan.matmul_efficiency) * 1e3;
  const PipelineSimulation sim = pipeline_simulate(sched, 1.0, 2.0);
  plan.bubble = 1.0 - sim.busy[0] / sim.makespan;
  plan.comm_ms = comm_ms(c, s, plan.ranks[0].comm);
  plan.step_ms = plan.compute_ms / (1.0 - plan.bubble) + plan.comm_ms;
  plan.mfu = model_flops_per_token(g0) * plan.tokens_per_step /
             (plan.step_ms / 1e3 * c.plan.peak_tflops * 1e12 * world);
  const double limit = c.plan.memory_gib * (1ull << 30);
  for (const RankPlan& r : plan.ranks)
    if (r.peak_bytes > limit && plan.does_not_fit.empty()) {
      char msg[200];
      std::snprintf(msg, sizeof(msg), "rank %d needs %.4g GiB, %.4g GiB more than [plan] "
                    "memory_gib = %g", r.rank, r.peak_bytes / 1073741824.0,
                    (r.peak_bytes - limit) / 1073741824.0, c.plan.memory_gib);
      plan.does_not_fit = msg;
    }
  return plan;
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
    const std::string problem = plan_write_json(plan, f.json);
    CHECK_ALL(problem.empty(), "--plan-json: %s", problem.c_str());
  }
  return plan.does_not_fit.empty() ? 0 : 1;
}

// ---------------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------------
static double mib(size_t b) { return b / 1048576.0; }

void plan_print(const Plan& plan, const Config& c, FILE* out) {
  const ParallelConfig& p = c.parallel;
  std::fprintf(out, "plan     dp=%d%s pp=%d (%s, v=%d) cp=%d tp=%d%s ep=%d: %zu ranks, %.0f "
               "tokens per step\n", p.dp, p.fsdp ? " FSDP" : "", p.pp, p.pp_schedule.c_str(),
               p.pp_virtual, p.cp, p.tp, p.sp && p.tp > 1 ? " SP" : "", p.ep, plan.ranks.size(),
               plan.tokens_per_step);
  std::fprintf(out, "  rank  dp pp cp tp    state MiB  activ. MiB   peak MiB\n");
  for (const RankPlan& r : plan.ranks) {
    if (r.dp_rank > 0 || r.cp_rank > 0) continue;  // the same as their dp x cp rank 0
    std::fprintf(out, "  %4d %3d %2d %2d %2d %12.1f %11.1f %10.1f\n", r.rank, r.dp_rank,
                 r.pp_rank, r.cp_rank, r.tp_rank, mib(r.state_bytes), mib(r.activation_bytes),
                 mib(r.peak_bytes));
  }
  std::fprintf(out, "  communication per step on rank 0:\n");
  CommStats st = plan.ranks[0].comm;
  comm_stats_print(st, 1, out);
  std::fprintf(out, "  bubble %.1f%%, compute %.2f ms, communication %.2f ms (at [plan] bandwidths)"
               "\n  estimated step %.2f ms, MFU %.1f%% of %.0f TFLOP/s per GPU\n",
               100 * plan.bubble, plan.compute_ms, plan.comm_ms, plan.step_ms, 100 * plan.mfu,
               c.plan.peak_tflops);
  if (!plan.does_not_fit.empty())
    std::fprintf(out, "  DOES NOT FIT: %s\n", plan.does_not_fit.c_str());
}

std::string plan_write_json(const Plan& plan, const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return "cannot write " + path;
  std::fprintf(f, "{\"ranks\":[");
  for (size_t i = 0; i < plan.ranks.size(); i++) {
    const RankPlan& r = plan.ranks[i];
    std::fprintf(f, "%s{\"rank\":%d,\"dp_rank\":%d,\"pp_rank\":%d,\"cp_rank\":%d,\"tp_rank\":%d,"
                 "\"state_bytes\":%zu,\"activation_bytes\":%zu,\"peak_bytes\":%zu", i ? "," : "",
                 r.rank, r.dp_rank, r.pp_rank, r.cp_rank, r.tp_rank, r.state_bytes,
                 r.activation_bytes, r.peak_bytes);
    print_comm_json(f, r.comm);
    std::fprintf(f, "}");
  }
  std::fprintf(f, "],\"bubble\":%.10g,\"compute_ms\":%.6g,\"comm_ms\":%.6g,\"step_ms\":%.6g,"
               "\"mfu\":%.6g,\"fits\":%s}\n", plan.bubble, plan.compute_ms, plan.comm_ms,
               plan.step_ms, plan.mfu, plan.does_not_fit.empty() ? "true" : "false");
  return std::fclose(f) == 0 ? "" : "cannot write " + path;
}

bool plan_search(const Config& cfg, int n, FILE* out) {
  struct Row {
    int dp, pp, cp, tp, ep, accum;
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
          if (!layout_problems(c, n).empty()) continue;
          rows.push_back({c.parallel.dp, pp, cp, tp, ep, c.train.grad_accum, plan_layout(c)});
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
               "    dp   pp   cp   tp   ep  accum    step ms    MFU   bubble  peak GiB\n", n, global,
               cfg.model.seq_len, cfg.train.micro_batch);
  bool any_fits = false;
  for (const Row& r : rows) {
    size_t peak = 0;
    for (const RankPlan& rp : r.plan.ranks) peak = std::max(peak, rp.peak_bytes);
    any_fits = any_fits || r.plan.does_not_fit.empty();
    std::fprintf(out, "  %4d %4d %4d %4d %4d %6d %10.3f %5.1f%% %6.1f%% %9.2f%s\n", r.dp, r.pp,
                 r.cp, r.tp, r.ep, r.accum, r.plan.step_ms, 100 * r.plan.mfu, 100 * r.plan.bubble,
                 peak / 1073741824.0, r.plan.does_not_fit.empty() ? "" : "  does not fit");
  }
  if (!any_fits)
    std::fprintf(out, "error: no layout of %d GPUs fits in [plan] memory_gib = %g per GPU\n", n,
                 cfg.plan.memory_gib);
  return any_fits;
}
