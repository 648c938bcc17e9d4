// training/plan.h - the layout planner: `./train config.toml --plan` (no MPI launch, no GPU).
//
// For the layout the config names (dp x pp x cp x tp, the ZeRO stage and optimizer offload, the
// pipeline schedule), it runs each rank's training step and optimizer step dry - the trainer's own setup and step over counting
// collectives and counting allocators, every kernel a no-op (training/plan.cu) - so what it
// reports per rank (state bytes on the device and, with offload, on the host and on disk,
// activation bytes, the communication of a step per axis and collective, the offload's bytes
// over the host link and to the file) is what the trainer holds and sends, not a model of it; test/test_plan.py runs real
// CPU layouts and requires them to be equal, exactly. Then a rough device model ([plan]) turns
// FLOPs and bytes into a step time and an MFU.
//
// FSDP's full-unit buffers and the store's other working buffers are in `peak_bytes`, not in
// `state_bytes` (as the trainer counts them). `peak_bytes` is every buffer above the seam, which
// test/test_plan.py requires to equal the CPU backend's allocator peak (ops::memory_peak) on every
// rank; a GPU rank needs more, the GPU-only terms of training/device_memory.h (cuBLASLt
// workspaces, stream scratch, NCCL buffers, the CUDA context): `device_peak_bytes`, what the
// memory_gib check and the search use.
#pragma once
#include <string>
#include <vector>

#include "config/config.h"
#include "parallel/comm.h"
#include "parallel/offload.h"
#include "training/device_memory.h"
#include "training/metrics.h"

struct RankPlan {
  int rank = 0;
  int dp_rank = 0, pp_rank = 0, cp_rank = 0, tp_rank = 0;
  size_t state_bytes = 0;       // weights, gradients, Adam moments, working copy (as measured)
  size_t activation_bytes = 0;  // the model's activation buffers (as measured)
  size_t peak_bytes = 0;        // both, plus the store's working buffers (FSDP's full units):
                                // what the backend's allocator peaks at on the CPU backend
  GpuMemoryTerms gpu;           // what a GPU rank holds besides (training/device_memory.h)
  size_t device_peak_bytes = 0; // peak_bytes + gpu.total(): the GPU's memory the rank needs
  size_t host_bytes = 0;        // optimizer offload: pinned host memory (as measured)
  size_t disk_bytes = 0;        // optimizer offload to nvme: the rank's file
  CommStats comm{};             // per step, as the metrics count them
  OffloadStats offload{};       // per step: host link and file bytes (host_ms not planned)
  double diloco_bytes_per_step = 0;  // DiLoCo's outer all-reduce payload / diloco_every
};

struct Plan {
  std::vector<RankPlan> ranks;  // every world rank (or one per role: PlanScope)
  double bubble = 0;            // the schedule's idle fraction, (p-1)/(v*m+p-1) for 1f1b
  double compute_ms = 0, comm_ms = 0, step_ms = 0;
  double mfu = 0, mfu_full = 0, hfu = 0;  // causal attention at half, at full; hardware FLOPs
  double peak_tflops = 0;       // [plan] peak_tflops, or [plan] device's at the precision
  FlopsPerToken flops;          // per token (training/metrics.h)
  double tokens_per_step = 0;
  std::string does_not_fit;     // "" or which rank needs how much more than [plan] memory_gib
};

// Which ranks a plan runs: every rank, or the first rank of each pipeline stage (dp, cp and tp
// rank 0). The ranks of a stage hold the same bytes (the layout rules make dp, cp, tp and ep
// split everything evenly), and rank 0, among them, has the communication the step time uses;
// the search plans stages only.
enum class PlanScope { EveryRank, Stages };
// Plans cfg's layout; cfg must have passed layout_problems (config/config.h).
Plan plan_layout(const Config& cfg, PlanScope scope = PlanScope::EveryRank);
void plan_print(const Plan& plan, const Config& cfg, FILE* out);
// At start-up, before anything is allocated (train.cu, after config/size_limits.h's cheap
// bound): "" or why a rank of the plan cannot fit - its device peak (on the CPU backend, where
// the device is the host, its peak plus its pinned host bytes) against `device_free`, and its
// optimizer offload's host bytes against `host_free` (0: unknown, not checked).
std::string plan_memory_problem(const Plan& plan, size_t device_free, size_t host_free,
                                bool device_is_host);
// The plan as JSON, with the metrics file's names: {"layout": {"dp", "pp", "cp", "tp", "ep",
// "zero", "fsdp", "optimizer_offload", "sp", "pp_schedule", "pp_virtual", "micro_batch",
// "grad_accum"}, "ranks": [{"rank", "state_bytes", "activation_bytes", "peak_bytes",
// "device_peak_bytes", "gpu": {"cublas_workspace", "scratch", "scratch_request", "nccl",
// "nccl_communicators", "context"}, "comm"}...], "bubble",
// "step_ms", "mfu", ...}. Returns "" or the problem.
std::string plan_write_json(const Plan& plan, const Config& cfg, const std::string& path);
// Every valid layout of n GPUs for cfg's model and batch (dp, pp, cp, tp; the config's
// schedule and grad_accum), best estimated step time first, those that do not fit marked. A
// layout that does not fit at the config's ZeRO stage climbs the ladder: the higher stages, then
// optimizer offload to the host at stages 1-3; the first rung that fits is listed.
// Returns false (after printing why) when no layout of n GPUs is valid or none fits in memory.
bool plan_search(const Config& cfg, int n, FILE* out);

// The planner's flags, taken out of argv (argc updated): --plan, --plan-json FILE,
// --plan-search N (also --plan-json=FILE, --plan-search=N).
struct PlanFlags {
  bool plan = false;
  std::string json;
  int search = 0;
  bool any() const { return plan || search > 0; }
};
PlanFlags plan_take_flags(int* argc, char** argv);
// Prints the plan (or the search) the flags ask for; returns the exit status (1: does not fit).
int plan_run(const Config& cfg, const PlanFlags& flags);
