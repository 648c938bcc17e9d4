"""test/test_plan.py - the planner (./train_cpu config.toml --plan) is checked, not trusted.

For real CPU layouts of a tiny GPT (L = 4, 4 heads, C = 32, T = 16), each trained for 2 steps:
one rank fp32; dp2 DDP bf16; dp2 x tp2 fp8 with recompute "block" (the amax all-reduces); dp2
FSDP with grad_accum 2; tp2 with and without SP, and with SP and recompute "block"; tp4 with SP,
tp_overlap (its chunks as sends and receives) and recompute "block" (TEST_FULL); pp2 1f1b over
4 micro-batches and gpipe over 2; cp2, also with recompute "block"; cp_comm = "all-to-all" at cp2
in bf16, "hybrid" at cp4 x cp_a2a 2, Llama all-to-all at cp4 (kv heads copied) with recompute
"block"; dp2 x pp2 x cp2 x tp2 FSDP
(np = 16); MoE: dp4 x ep4 FSDP bf16 with recompute "gelu", dp2 x cp2 x tp2 (SP) x ep2 fp8,
dp2 x tp2 (SP) x ep2 fp8 with recompute "block" and dense and MoE blocks mixed, dp2 x tp2 (SP) x
ep2 with 2 shared experts (split over tp), sigmoid scores, balancing biases and a capacity factor
(its drops' all-reduce over tp) under recompute "gelu"; Llama (GQA, SwiGLU,
RMSNorm, RoPE tables): dp2 x pp2 x tp2 FSDP untied (embedding and head units on two stages, no
tied sum), tied cp2 x tp2 bf16 with recompute "gelu", MoE (SwiGLU experts) dp2 x ep2 x pp2 zb-h1;
dp2 x pp2 x ep2 FSDP with dense and MoE blocks mixed (their expert all-to-alls' bytes depend
on the routing: calls exact, bytes within 25% of the plan's balanced estimate); the zero-bubble
schedules, whose backward is split into B and W (the weight passes' buffers, the LayerNorm
scratch, the MoE layers' kept gradients, the extra all-gathers of sequence parallelism, the
slots held until W): pp2 zb-h1 over 4 micro-batches, dp2 x pp2 zb-v FSDP over 3, tp2 (SP) x pp2
zb-h1 fp8, dp2 x pp2 x ep2 zb-v with dense and MoE blocks mixed, dp2 x pp2 zb-h1 ZeRO-2 over 3;
pp2 interleaved over 2 chunks;
pp2 1f1b with uneven stages (pp_layers = [1, 3]); the gradient noise scale on cp2 x tp2 (SP) x
pp2 1f1b (its first micro-batch sums over cp, over tp and of the tied root's two stages,
parallel/small_batch_norm.cu); compressed gradient reductions: dp2 x tp2 DDP
with int8 (the replicated complete tensors summed over tp after the reduction), dp2 x pp2 ZeRO-1
with int8 (the tied root's two stages), MoE dp4 x ep2 ZeRO-2 with top-k (expert gradients over
groups of 2, dense ones over 4); DiLoCo islands (their meetings' island bytes against the
analytic count too): dp4 DDP, FSDP and dp2 x pp2 x tp2 ZeRO-1 in 2 islands with fp32
meetings, dp4 DDP and dp4 ZeRO-1 (int8 gradients) with int8 meetings, MoE dp2 x cp2 x ep2 FSDP
(cp and the expert groups inside each island); HSDP (dp_replicate, parallel/hsdp.cu): dp4 = 2 x 2
FSDP with grad_accum 2, dp2 x cp2 = 2 x 1 ZeRO-2, MoE dp4 x ep2 = 2 x 2 ZeRO-1 bf16 (the shard
and replica sub-groups of dp, dp x cp and the experts' ranks), and dp4 = 2 x 2 FSDP with
reduce_dtype = "bf16" (half the reductions' bytes, the bf16 scratch); gradient buckets (bucket_mb: their staging
buffers, fewer calls) on dp2 x pp2 ZeRO-2 over 2 micro-batches and dp2 FSDP with fsdp_prefetch 3
and bf16 reductions (the bf16 scratch of a bucket). For each, rank 0 of the plan (`--plan-json`) must
equal what the run measured exactly: state bytes and activation bytes (the metrics' run
record) and the communication of every step (calls and bytes per axis and collective); every
rank's peak bytes must equal that rank's device memory peak as the backend's allocator counted
it (ops::memory_peak: every ops::alloc, through an Allocator or not; the metrics' end record), so
that a buffer allocated outside the planned code, or only when not counting, shows; the
bubble equals the schedule's formula at equal costs ((p-1)/(v*m+p-1) for 1f1b, gpipe and
interleaved, 1 - 3m/max(3m+p-1, 2m+2p-1) for zb-h1, 1 - 6m/(6m+max(p-1, 2(2p-1-m))) for zb-v);
the JSON records the layout it planned (the degrees, the ZeRO stage and offload, sp, the
schedule, micro_batch and grad_accum) as the config gives it.
Without TEST_FULL=1 (make test-full) the 11 layouts of FULL_ONLY below are left out (39 of the
50 run): combinations whose parts the other layouts check on their own.
Bad input: a plan whose layout does not fit in [plan] memory_gib names the rank and the excess
and exits non-zero; --plan-search with no layout that fits says so and exits non-zero; a
--plan-search of 8 lists only layouts of 8 GPUs, at the config's global batch (dp x grad_accum
fixed), fastest first; for configs/gpt_7b.toml its dp = 8 row fits at a ZeRO rung >= 1 with the
peak --plan gives that rung, where dp = 8 replicated (118 GiB) does not fit.
The lean head (model/gpt_head.cu), from plans that differ only in the vocabulary: on pp2 1f1b,
pp2 x tp2, pp2 zb-v and pp2 interleaved with block recompute, the ranks without the last stage
plan no byte more for a 32x larger vocabulary, the rank with it at most a quarter of one
micro-batch's logits more plus two vocabulary rows.
FSDP's prefetch depth: the plan of dp2 FSDP at fsdp_prefetch 3 holds exactly two gathered blocks
more than at 1 on each rank (peak bytes), the state and activations unchanged.
"""
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grad_compression_model as gcm  # noqa: E402
from checks import FULL, full_only  # noqa: E402
from trainer import (Checks, base_sections, make_experiment, read_memory_peaks,  # noqa: E402
                     read_metrics, read_run_info, run, seeded_rng, unit_numels, write_config)

checks = Checks("test_plan")
L, NH, C, T, V = 4, 4, 32, 16, 101

MOE = {"n_experts": 4, "top_k": 2, "d_expert": 48}  # with every block an MoE block unless said
LLAMA = {"arch": "llama", "n_kv_head": 2, "d_ff": 48}  # untied unless said

LAYOUTS = [
    ("one rank fp32", {}, {}),
    ("dp2 DDP bf16", {"dp": 2}, {"precision": {"compute": "bf16"}}),
    ("dp2 x tp2 fp8 recompute block", {"dp": 2, "tp": 2},
     {"precision": {"compute": "fp8"}, "train": {"recompute": "block"}}),
    ("dp2 FSDP grad_accum 2 noise scale", {"dp": 2, "fsdp": True},
     {"train": {"grad_accum": 2}, "log": {"grad_noise_scale": True}}),
    ("tp2 sp", {"tp": 2}, {}),
    ("tp2 no sp", {"tp": 2, "sp": False}, {}),
    ("tp2 sp recompute block", {"tp": 2}, {"train": {"recompute": "block"}}),
    ("tp4 sp overlap recompute block", {"tp": 4, "tp_overlap": True},
     {"train": {"recompute": "block"}}),
    ("pp2 1f1b m4", {"pp": 2}, {"train": {"grad_accum": 4}}),
    ("pp2 gpipe m2", {"pp": 2, "pp_schedule": "gpipe"}, {"train": {"grad_accum": 2}}),
    ("cp2", {"cp": 2}, {}),
    ("cp2 recompute block", {"cp": 2}, {"train": {"recompute": "block"}}),
    ("cp2 all-to-all bf16", {"cp": 2, "cp_comm": "all-to-all"}, {"precision": {"compute": "bf16"}}),
    ("cp4 hybrid cp_a2a 2", {"cp": 4, "cp_comm": "hybrid", "cp_a2a": 2}, {}),
    ("Llama cp4 all-to-all (kv heads copied) recompute block", {"cp": 4, "cp_comm": "all-to-all"},
     {"model": LLAMA, "train": {"recompute": "block"}}),
    ("dp2 x pp2 x cp2 x tp2 FSDP (np=16)", {"dp": 2, "pp": 2, "cp": 2, "tp": 2, "fsdp": True},
     {"train": {"grad_accum": 2}}),
    ("MoE dp4 x ep4 FSDP bf16", {"dp": 4, "ep": 4, "fsdp": True},
     {"model": MOE, "precision": {"compute": "bf16"}, "train": {"recompute": "gelu"}}),
    ("MoE dp2 x cp2 x tp2 sp x ep2 fp8 (np=8)", {"dp": 2, "cp": 2, "tp": 2, "ep": 2},
     {"model": MOE, "precision": {"compute": "fp8"}}),
    ("MoE dp2 x tp2 sp x ep2 fp8 recompute block", {"dp": 2, "tp": 2, "ep": 2},
     {"model": dict(MOE, moe_every=2), "precision": {"compute": "fp8"},
      "train": {"recompute": "block"}}),
    ("MoE shared experts, sigmoid, bias, capacity dp2 x tp2 sp x ep2 recompute gelu",
     {"dp": 2, "tp": 2, "ep": 2},
     {"model": dict(MOE, n_shared_experts=2, router_score="sigmoid"),
      "train": {"moe_balance": "bias", "moe_capacity_factor": 1.0, "recompute": "gelu"}}),
    ("MoE dp2 x pp2 x ep2 FSDP", {"dp": 2, "pp": 2, "ep": 2, "fsdp": True},
     {"model": dict(MOE, moe_every=2), "train": {"grad_accum": 2}}),
    ("pp2 zb-h1 m4", {"pp": 2, "pp_schedule": "zb-h1"}, {"train": {"grad_accum": 4}}),
    ("dp2 x pp2 zb-v FSDP m3", {"dp": 2, "pp": 2, "pp_schedule": "zb-v", "pp_virtual": 2,
                                "fsdp": True}, {"train": {"grad_accum": 3}}),
    ("tp2 sp x pp2 zb-h1 fp8", {"tp": 2, "pp": 2, "pp_schedule": "zb-h1"},
     {"train": {"grad_accum": 2}, "precision": {"compute": "fp8"}}),
    ("MoE dp2 x pp2 x ep2 zb-v", {"dp": 2, "pp": 2, "ep": 2, "pp_schedule": "zb-v",
                                  "pp_virtual": 2},
     {"model": dict(MOE, moe_every=2), "train": {"grad_accum": 3}}),
    ("pp2 interleaved v2 m2", {"pp": 2, "pp_schedule": "interleaved", "pp_virtual": 2},
     {"train": {"grad_accum": 2}}),
    ("pp2 1f1b pp_layers [1, 3]", {"pp": 2, "pp_layers": [1, 3]}, {"train": {"grad_accum": 2}}),
    ("dp2 x pp2 zb-h1 ZeRO-2 m3", {"dp": 2, "pp": 2, "pp_schedule": "zb-h1", "zero": 2},
     {"train": {"grad_accum": 3}}),
    ("dp2 ZeRO-1 bf16", {"dp": 2, "zero": 1}, {"precision": {"compute": "bf16"}}),
    ("dp2 ZeRO-2 grad_accum 2 offload cpu", {"dp": 2, "zero": 2},
     {"train": {"grad_accum": 2, "optimizer_offload": "cpu"}}),
    ("dp2 x pp2 x tp2 ZeRO-1 offload nvme (np=8)", {"dp": 2, "pp": 2, "tp": 2, "zero": 1},
     {"train": {"grad_accum": 2, "optimizer_offload": "nvme"}}),
    ("MoE dp4 x ep2 ZeRO-2 bf16 offload nvme", {"dp": 4, "ep": 2, "zero": 2},
     {"model": MOE, "precision": {"compute": "bf16"}, "train": {"optimizer_offload": "nvme"}}),
    ("dp2 x tp2 DDP int8 compression", {"dp": 2, "tp": 2, "grad_compression": "int8"}, {}),
    ("dp2 x pp2 ZeRO-1 int8 compression grad_accum 2",
     {"dp": 2, "pp": 2, "zero": 1, "grad_compression": "int8"}, {"train": {"grad_accum": 2}}),
    ("MoE dp4 x ep2 ZeRO-2 topk 5% grad_accum 2",
     {"dp": 4, "ep": 2, "zero": 2, "grad_compression": "topk", "topk_ratio": 0.05},
     {"model": MOE, "train": {"grad_accum": 2}}),
    ("dp4 DDP in 2 DiLoCo islands, outer step every 2 steps",
     {"dp": 4, "diloco_islands": 2, "diloco_every": 2}, {}),
    ("dp4 FSDP in 2 DiLoCo islands, outer step every 2 steps",
     {"dp": 4, "zero": 3, "diloco_islands": 2, "diloco_every": 2}, {}),
    ("dp4 DDP in 2 DiLoCo islands, int8 meetings every 2 steps",
     {"dp": 4, "diloco_islands": 2, "diloco_every": 2, "diloco_compression": "int8"}, {}),
    ("dp4 ZeRO-1 int8 in 2 DiLoCo islands, int8 meetings every 2 steps",
     {"dp": 4, "zero": 1, "grad_compression": "int8", "diloco_islands": 2, "diloco_every": 2,
      "diloco_compression": "int8"}, {}),
    ("dp2 x pp2 x tp2 ZeRO-1 in 2 DiLoCo islands (np=8), outer step every 2 steps",
     {"dp": 2, "pp": 2, "tp": 2, "zero": 1, "diloco_islands": 2, "diloco_every": 2},
     {"train": {"grad_accum": 2}}),
    ("MoE dp2 x cp2 x ep2 FSDP in 2 DiLoCo islands, outer step every 2 steps",
     {"dp": 2, "cp": 2, "ep": 2, "zero": 3, "diloco_islands": 2, "diloco_every": 2},
     {"model": MOE}),
    ("Llama dp2 x pp2 x tp2 FSDP untied (np=8)", {"dp": 2, "pp": 2, "tp": 2, "fsdp": True},
     {"model": LLAMA, "train": {"grad_accum": 2}}),
    ("Llama tied cp2 x tp2 bf16 recompute gelu", {"cp": 2, "tp": 2},
     {"model": dict(LLAMA, tie_embeddings=True), "precision": {"compute": "bf16"},
      "train": {"recompute": "gelu"}}),
    ("cp2 x tp2 sp x pp2 1f1b noise scale (np=8)", {"cp": 2, "tp": 2, "pp": 2},
     {"train": {"grad_accum": 2}, "log": {"grad_noise_scale": True}}),
    ("Llama MoE dp2 x ep2 zb-h1 pp2", {"dp": 2, "ep": 2, "pp": 2, "pp_schedule": "zb-h1"},
     {"model": dict(LLAMA, **MOE, moe_every=2), "train": {"grad_accum": 2}}),
    # HSDP (parallel/hsdp.cu): the shard and replica sub-groups of dp, dp x cp and the experts'
    ("HSDP dp4 = 2 x 2 FSDP grad_accum 2", {"dp": 4, "dp_replicate": 2, "zero": 3},
     {"train": {"grad_accum": 2}}),
    ("HSDP dp2 x cp2 = 2 x 1 ZeRO-2", {"dp": 2, "cp": 2, "dp_replicate": 2, "zero": 2}, {}),
    ("HSDP MoE dp4 x ep2 = 2 x 2 ZeRO-1 bf16", {"dp": 4, "ep": 2, "dp_replicate": 2, "zero": 1},
     {"model": MOE, "precision": {"compute": "bf16"}}),
    # [parallel] reduce_dtype = "bf16" (parallel/reduce_dtype.cu): half the bytes, a bf16 scratch
    ("dp4 = 2 x 2 FSDP reduce_dtype bf16 grad_accum 2",
     {"dp": 4, "dp_replicate": 2, "zero": 3, "reduce_dtype": "bf16"}, {"train": {"grad_accum": 2}}),
    # [parallel] bucket_mb (parallel/grad_buckets.cu: staging buffers, fewer calls) and
    # fsdp_prefetch (parallel/fsdp.cu: more gathered buffers); blocks of ~50 KB, buckets of 3
    ("dp2 x pp2 ZeRO-2 bucket_mb grad_accum 2", {"dp": 2, "pp": 2, "zero": 2, "bucket_mb": 0.15},
     {"train": {"grad_accum": 2}}),
    ("dp2 FSDP fsdp_prefetch 3 bucket_mb reduce_dtype bf16",
     {"dp": 2, "zero": 3, "fsdp_prefetch": 3, "bucket_mb": 0.15, "reduce_dtype": "bf16"}, {}),
]
# Run only with TEST_FULL=1 (make test-full): each is a combination whose parts the layouts above
# check on their own (recompute "block" with tp and cp, and with tp_overlap, whose per-step counts
# test_tensor_parallel holds to the analytic ones; FSDP on all four axes, MoE with cp and
# with zb-v, NVMe offload and DiLoCo at np = 8, DiLoCo over FSDP and with int8 meetings alone,
# the noise scale on cp x tp x pp, int8 compression across pipeline stages).
FULL_ONLY = [
    "tp2 sp recompute block",
    "tp4 sp overlap recompute block",
    "cp2 recompute block",
    "dp2 x pp2 x cp2 x tp2 FSDP (np=16)",
    "MoE dp2 x cp2 x tp2 sp x ep2 fp8 (np=8)",
    "MoE dp2 x pp2 x ep2 zb-v",
    "dp2 x pp2 x tp2 ZeRO-1 offload nvme (np=8)",
    "dp2 x pp2 ZeRO-1 int8 compression grad_accum 2",
    "dp4 FSDP in 2 DiLoCo islands, outer step every 2 steps",
    "dp4 DDP in 2 DiLoCo islands, int8 meetings every 2 steps",
    "dp2 x pp2 x tp2 ZeRO-1 in 2 DiLoCo islands (np=8), outer step every 2 steps",
    "cp2 x tp2 sp x pp2 1f1b noise scale (np=8)",
]
assert all(any(what == name for what, _, _ in LAYOUTS) for name in FULL_ONLY)
NO_OFFLOAD = {"to_host_bytes": 0, "to_device_bytes": 0, "disk_read_bytes": 0,
              "disk_write_bytes": 0}


def formula_bubble(par, m):
    """The schedule's bubble at equal costs (parallel/pipeline_schedule.cu)."""
    p, v, kind = par.get("pp", 1), par.get("pp_virtual", 1), par.get("pp_schedule", "1f1b")
    if kind == "zb-h1":
        return 1 - 3 * m / max(3 * m + p - 1, 2 * m + 2 * p - 1)
    if kind == "zb-v":
        return 1 - 6 * m / (6 * m + max(p - 1, 2 * (2 * p - 1 - m)))
    return (p - 1) / (v * m + p - 1)


def sections(tmp, name, par, extra):
    sec = base_sections(tmp, 2)
    del sec["init"]
    sec["model"] = {"n_layer": L, "n_head": NH, "d_model": C, "seq_len": T, "vocab_size": V}
    sec["parallel"] = dict(par)
    sec["log"]["metrics"] = os.path.join(tmp, f"{name}.jsonl")
    for key, values in extra.items():
        sec.setdefault(key, {}).update(values)
    if sec["train"].get("optimizer_offload") == "nvme":
        sec["train"]["offload_dir"] = os.path.join(tmp, "offload")
        os.makedirs(sec["train"]["offload_dir"], exist_ok=True)
    return sec


def int8_meeting(shards, K):
    """An int8 meeting's island collectives (parallel/diloco.h): per unit shard of n weights an
    all-to-all and an all-gather of K records of ceil(n/K) codes + scales."""
    want = {"all_to_all": {"calls": len(shards), "bytes": 0},
            "all_gather": {"calls": len(shards), "bytes": 0}}
    for n in shards:
        b = gcm.analytic_bytes("int8", n, K, True, 0)
        for k in want:
            want[k]["bytes"] += b[k]
    return want


def check_diloco_steps(what, par, steps, r0):
    """DiLoCo's outer all-reduce (island axis) comes every diloco_every steps, one call per unit
    of 4 bytes per weight of the rank's shards: the plan's amortised bytes times diloco_every.
    On DDP dp-only islands that is 4 bytes per weight of the model, in one call per unit; under
    FSDP (dp/K = 2 per island) rank 0's shards are half of every unit, rounded up by the
    padding: between 2 and 4 bytes per weight. With int8 meetings on dp-only islands the
    collectives are those of int8_meeting, exactly (shards: whole units under DDP, halves of the
    padded units under ZeRO-1 with 2 ranks per island). Removed from those steps' records, which
    must then equal the plan like every other step; so is, under ZeRO-1/2 with 2 ranks per island,
    the meeting's all-gather of the new weights inside the island (dp axis: one call per unit,
    4 bytes per weight of the padded unit), which the plan's per-step count leaves out."""
    every = par["diloco_every"]
    want_bytes = r0["diloco_bytes_per_step"] * every
    units = len(unit_numels(L, C, T, V))
    full = 4 * sum(unit_numels(L, C, T, V))
    dp_only_ddp = par.get("zero", 0) == 0 and par.get("tp", 1) == par.get("pp", 1) == 1
    halves = par.get("zero", 0) == 3 and par["dp"] // par["diloco_islands"] == 2
    int8 = par.get("diloco_compression") == "int8"
    if int8:
        per = par["dp"] // par["diloco_islands"]
        shards = [n if par.get("zero", 0) == 0 else gcm.round_up(n, per * 64) // per
                  for n in unit_numels(L, C, T, V)]
        want_int8 = int8_meeting(shards, par["diloco_islands"])
    gathers = par.get("zero", 0) in (1, 2) and par["dp"] // par["diloco_islands"] == 2 and \
        par.get("tp", 1) == par.get("pp", 1) == 1
    for s in steps:
        island = s["comm"].pop("island", None)
        if s["step"] % every == 0 and gathers:
            gather = s["comm"]["dp"]["all_gather"]
            gather["calls"] -= units
            gather["bytes"] -= 4 * sum(gcm.round_up(n, 2 * 64) for n in unit_numels(L, C, T, V))
        if s["step"] % every == 0 and int8:
            total = sum(c["bytes"] for c in want_int8.values())
            checks.check(f"{what}: step {s['step']} int8 meeting = the analytic count = the plan's",
                         island == want_int8 and total == want_bytes,
                         f"measured {island}, analytic {want_int8}, plan {want_bytes:.0f} B")
        elif s["step"] % every == 0:
            got = (island or {}).get("all_reduce", {})
            analytic = ((got.get("calls") == units and want_bytes == full) if dp_only_ddp else
                        (got.get("calls") == units and full <= 2 * want_bytes < 2 * full)
                        if halves else got.get("calls", 0) >= 1)
            checks.check(f"{what}: step {s['step']} outer all-reduce = the plan's",
                         analytic and got.get("bytes") == want_bytes and len(island or {}) == 1,
                         f"measured {island}, plan {want_bytes:.0f} B (the whole model {full} B, "
                         f"{units} units)")
        else:
            checks.check(f"{what}: step {s['step']}: no outer step", island is None, f"{island}")


def check_memory_peaks(what, plan, measured):
    """Every rank's device memory peak as the CPU backend's allocator counted it (every
    ops::alloc, made through an Allocator or not) equals the plan's peak of that rank exactly:
    the CPU backend has none of the GPU-only terms (training/device_memory.h)."""
    planned = [r["peak_bytes"] for r in sorted(plan["ranks"], key=lambda r: r["rank"])]
    checks.check(f"{what}: every rank's allocator peak = the plan's peak", measured == planned,
                 f"measured {measured}, plan {planned}")


def check_layout(tmp, i, what, par, extra):
    sec = sections(tmp, f"run{i}", par, extra)
    cfg = write_config(tmp, f"run{i}.toml", sec)
    world = par.get("dp", 1) * par.get("tp", 1) * par.get("pp", 1) * par.get("cp", 1)
    run(cfg, np_ranks=world if world > 1 else 0)
    steps, _ = read_metrics(sec["log"]["metrics"])
    info = read_run_info(sec["log"]["metrics"])
    plan_path = os.path.join(tmp, f"plan{i}.json")
    run(cfg, ["--plan-json", plan_path])
    with open(plan_path) as f:
        plan = json.load(f)
    r0 = plan["ranks"][0]
    lay = plan.get("layout", {})
    zero = par.get("zero", 3 if par.get("fsdp") else 0)  # fsdp = true is zero = 3
    want = {"dp": par.get("dp", 1), "pp": par.get("pp", 1), "cp": par.get("cp", 1),
            "tp": par.get("tp", 1), "ep": par.get("ep", 1), "zero": zero, "fsdp": zero == 3,
            "optimizer_offload": sec["train"].get("optimizer_offload", "none"),
            "sp": par.get("sp", True), "pp_schedule": par.get("pp_schedule", "1f1b"),
            "micro_batch": sec["train"]["micro_batch"],
            "grad_accum": sec["train"].get("grad_accum", 1),
            "dp_replicate": par.get("dp_replicate", 1)}
    checks.check(f"{what}: the plan records its layout",
                 all(lay.get(k) == v for k, v in want.items()), f"{lay}")
    same_state = r0["state_bytes"] == info["state_bytes"]
    same_act = r0["activation_bytes"] == info["activation_bytes"]
    if "ep" in r0["comm"]:
        # The rows a rank's experts send back depend on the routing: the plan assumes a balanced
        # router. Calls are exact; bytes within 25% (test_moe checks them against the routing).
        planned = r0["comm"]["ep"]["all_to_all"]
        for s in steps:
            got = s["comm"]["ep"]["all_to_all"]
            checks.check(f"{what}: ep all-to-all calls exact, bytes near the balanced plan",
                         got["calls"] == planned["calls"] and
                         abs(got["bytes"] - planned["bytes"]) <= 0.25 * planned["bytes"],
                         f"plan {planned}, measured {got}")
            got["bytes"] = planned["bytes"]
    if par.get("diloco_islands", 0) >= 1:
        check_diloco_steps(what, par, steps, r0)
    same_comm = all(s["comm"] == r0["comm"] for s in steps)
    same_host = (r0["host_bytes"], r0["disk_bytes"]) == (info["host_bytes"], info["disk_bytes"])
    same_offload = all(s.get("offload", NO_OFFLOAD) == r0["offload"] for s in steps)
    checks.check(f"{what}: plan = measured", same_state and same_act and same_comm and
                 same_host and same_offload and len(plan["ranks"]) == world,
                 f"state {r0['state_bytes']} vs {info['state_bytes']}, activations "
                 f"{r0['activation_bytes']} vs {info['activation_bytes']}, host/disk "
                 f"{r0['host_bytes']}/{r0['disk_bytes']} vs {info['host_bytes']}/"
                 f"{info['disk_bytes']}, offload {r0['offload']} vs {steps[0].get('offload')}, "
                 f"comm {'equal' if same_comm else str(r0['comm']) + ' vs ' + str(steps[0]['comm'])}")
    check_memory_peaks(what, plan, read_memory_peaks(sec["log"]["metrics"]))
    bubble = formula_bubble(par, sec["train"].get("grad_accum", 1))
    checks.check(f"{what}: bubble", abs(plan["bubble"] - bubble) < 1e-9,
                 f"{plan['bubble']:.6f} vs the formula's {bubble:.6f}")


def test_bad_input(tmp):
    sec = sections(tmp, "bad", {"dp": 2}, {"plan": {"memory_gib": 0.0001}})
    cfg = write_config(tmp, "bad.toml", sec)
    r = run(cfg, ["--plan"], check=False)
    checks.check("a plan that does not fit: names the rank and the excess, exits non-zero",
                 r.returncode != 0 and "DOES NOT FIT: rank 0 needs" in r.stdout and
                 "more than [plan] memory_gib" in r.stdout, r.stdout.strip().splitlines()[-1])
    r = run(cfg, ["--plan-search", "4"], check=False)
    checks.check("--plan-search with no layout that fits: says so, exits non-zero",
                 r.returncode != 0 and "no layout of 4 GPUs fits" in r.stdout,
                 r.stdout.strip().splitlines()[-1])
    sec = sections(tmp, "search", {}, {"train": {"micro_batch": 1, "grad_accum": 8}})
    r = run(write_config(tmp, "search.toml", sec), ["--plan-search=8"])
    rows = [ln.split() for ln in r.stdout.splitlines() if ln.startswith("  ") and
            ln.split()[0].isdigit()]
    products = [int(a) * int(b) * int(c) * int(d) for a, b, c, d, *_ in rows]
    same_batch = all(int(row[0]) * int(row[5]) == 8 for row in rows)  # dp x grad_accum x 1
    times = [float(row[6]) for row in rows]
    checks.check("--plan-search 8: layouts of 8 GPUs at the config's global batch, fastest first",
                 rows and all(x == 8 for x in products) and same_batch and
                 times == sorted(times) and all(row[4] == "1" for row in rows) and
                 any(row[:6] == ["8", "1", "1", "1", "1", "1"] for row in rows),
                 f"{len(rows)} layouts, first {rows[0][:7] if rows else None}")
    # Issue 26's finding: GPT 7B on 8 GPUs was "not fitting" at dp 8 (118 GiB replicated) although
    # sharding its states fits. The dp 8 row must fit at a sharded rung, with --plan's peak of
    # that rung, and --plan of dp 8 replicated must say it does not fit.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    gpt7b = os.path.join(root, "configs/gpt_7b.toml")
    r = run(gpt7b, ["--plan-search=8"])
    row = next((ln.split() for ln in r.stdout.splitlines()
                if ln.split()[:5] == ["8", "1", "1", "1", "1"]), [])
    zero, offload = (int(row[10]), row[11]) if len(row) > 11 else (0, "none")
    dp8 = ["--plan", "--parallel.dp=8", "--parallel.pp=1", "--train.grad_accum=128"]
    r = run(gpt7b, dp8 + [f"--parallel.zero={zero}", f"--train.optimizer_offload={offload}"],
            check=False)
    planned = re.search(r"\n +0 +0 +0 +0 +0 +[\d.]+ +[\d.]+ +[\d.]+ +([\d.]+)\n", r.stdout)
    replicated = run(gpt7b, dp8 + ["--parallel.zero=0"], check=False)
    checks.check("--plan-search 8 of GPT 7B: dp 8 fits with its states sharded (as --plan of "
                 "that rung says), replicated not",
                 row and "does not fit" not in " ".join(row) and zero >= 1 and
                 planned is not None and abs(float(planned.group(1)) / 1024 - float(row[9])) < 0.01
                 and "DOES NOT FIT" in replicated.stdout,
                 f"row {' '.join(row)} | --plan peak {planned.group(1) if planned else None} MiB | "
                 f"replicated: {replicated.stdout.strip().splitlines()[-1][:80]}")
    sec = sections(tmp, "search_moe", {}, {"train": {"micro_batch": 1, "grad_accum": 8},
                                           "model": MOE})
    r = run(write_config(tmp, "search_moe.toml", sec), ["--plan-search=8"])
    rows = [[int(x) for x in ln.split()[:6]] for ln in r.stdout.splitlines()
            if ln.startswith("  ") and ln.split()[0].isdigit()]
    eps = sorted({row[4] for row in rows})
    valid = all((row[0] * row[2]) % row[4] == 0 and MOE["n_experts"] % row[4] == 0 for row in rows)
    checks.check("--plan-search 8 of an MoE model: every valid ep of each layout",
                 eps == [1, 2, 4] and valid and any(row[:5] == [8, 1, 1, 1, 4] for row in rows),
                 f"{len(rows)} layouts, ep values {eps}")


def plan_json(tmp, sec, name):
    """The --plan-json of sec's layout (dry: no run)."""
    path = os.path.join(tmp, f"{name}.json")
    run(write_config(tmp, f"{name}.toml", sec), ["--plan-json", path])
    with open(path) as f:
        return json.load(f)


HEAD_LAYOUTS = [  # (what, parallel, train): where the head runs differs
    ("pp2 1f1b", {"pp": 2}, {"grad_accum": 4}),
    ("pp2 x tp2 sp 1f1b", {"pp": 2, "tp": 2}, {"grad_accum": 2}),
    ("pp2 zb-v (the last stage on rank 0)", {"pp": 2, "pp_schedule": "zb-v", "pp_virtual": 2},
     {"grad_accum": 3}),
    ("pp2 interleaved v2, recompute block", {"pp": 2, "pp_schedule": "interleaved",
                                             "pp_virtual": 2}, {"grad_accum": 2,
                                                                "recompute": "block"}),
]


def test_head_placement(tmp):
    """The head's buffers only on the rank that runs the last stage, and no (N, Vp) logits there.
    Two plans of each layout that differ only in the vocabulary (V = 101, Vp = 128, and V = 4001,
    Vp = 4096): a rank without the last stage must plan the same activation bytes for both (no
    buffer of it depends on the vocabulary: pipeline rank 0 of a Loop order holds the embedding,
    not the head); the rank with it at most a quarter of one micro-batch's logits more
    (N x dVp/tp elements / 4, the head's chunk) plus its two vocabulary rows (sampling: this
    rank's columns and, under tp, the gathered row), and more than nothing."""
    for what, par, train in HEAD_LAYOUTS:
        plans = []
        for vocab in (V, 4001):
            sec = sections(tmp, "head", par, {"train": train})
            sec["model"]["vocab_size"] = vocab
            plans.append(plan_json(tmp, sec, "head"))
        lay = plans[0]["layout"]
        p, tp, a = lay["pp"], lay["tp"], 4  # fp32
        last_owner = 0 if lay["pp_schedule"] in ("zb-v",) else p - 1  # V order: rank 0
        N = lay["micro_batch"] * T
        d_local = (4096 - 128) // tp
        allowed = N * d_local * a // 4 + d_local * a + (4096 - 128) * a * (tp > 1)
        bad = []
        for r0, r1 in zip(plans[0]["ranks"], plans[1]["ranks"]):
            diff = r1["activation_bytes"] - r0["activation_bytes"]
            if r0["pp_rank"] != last_owner and diff != 0:
                bad.append(f"rank {r0['rank']} (pp {r0['pp_rank']}, no head): +{diff} B")
            if r0["pp_rank"] == last_owner and not 0 < diff <= allowed:
                bad.append(f"rank {r0['rank']} (pp {r0['pp_rank']}, head): +{diff} B > {allowed}")
        checks.check(f"{what}: vocabulary-sized buffers only on the head's rank, a quarter of "
                     "the logits at most", not bad and len(plans[0]["ranks"]) == p * tp,
                     "; ".join(bad) or f"head rank +<= {allowed} B, others +0 B")


def test_prefetch_memory(tmp):
    """[parallel] fsdp_prefetch = N holds N gathered units ahead: the plan of dp2 FSDP at N = 3
    holds exactly two more gathered blocks (fp32, padded to 2 x 64) than at N = 1, on every
    rank, and the same state and activation bytes."""
    plans = []
    for depth in (1, 3):
        sec = sections(tmp, "prefetch", {"dp": 2, "zero": 3, "fsdp_prefetch": depth}, {})
        plans.append(plan_json(tmp, sec, "prefetch"))
    block = -(-unit_numels(L, C, T, V)[1] // 128) * 128 * 4
    diffs = [(b["peak_bytes"] - a["peak_bytes"], b["state_bytes"] - a["state_bytes"],
              b["activation_bytes"] - a["activation_bytes"])
             for a, b in zip(plans[0]["ranks"], plans[1]["ranks"])]
    checks.check("dp2 FSDP fsdp_prefetch 3: the plan holds two more gathered blocks than at 1",
                 len(diffs) == 2 and all(d == (2 * block, 0, 0) for d in diffs),
                 f"(peak, state, activation) bytes more per rank: {diffs}; block {block} B")


def plan_peak(tmp, sec, zero, offload="none"):
    """The largest device peak (the GPU-only terms included) in the plan of sec's layout at one
    rung of the ladder: what --plan-search compares with [plan] memory_gib."""
    path = os.path.join(tmp, "rung.json")
    cfg = write_config(tmp, "rung.toml", sec)
    run(cfg, ["--plan-json", path, f"--parallel.zero={zero}", f"--train.optimizer_offload={offload}"])
    with open(path) as f:
        return max(r["device_peak_bytes"] for r in json.load(f)["ranks"])


def test_search_ladder(tmp):
    """--plan-search 8 with [plan] memory_gib set between two rungs of the dp8 layout: its row
    is the first rung (zero 1, 2, 3, then zero 1, 2, 3 with offload to the host) whose plan fits,
    each rung's peak taken from --plan-json."""
    sec = sections(tmp, "ladder", {}, {"train": {"micro_batch": 1, "grad_accum": 8}})
    dp8 = dict(sec, parallel={"dp": 8}, train=dict(sec["train"], grad_accum=1))
    rungs = [(z, "none") for z in range(4)] + [(z, "cpu") for z in (1, 2, 3)]
    peaks = [plan_peak(tmp, dp8, z, o) for z, o in rungs]
    for a, b in [(0, 3), (3, 6)]:  # between DDP and ZeRO-3, between ZeRO-3 and ZeRO-3 + cpu
        limit = (peaks[a] + peaks[b]) / 2
        want = next(rungs[i] for i in range(len(rungs)) if peaks[i] <= limit)
        sec["plan"] = {"memory_gib": limit / 2**30}
        r = run(write_config(tmp, "ladder.toml", sec), ["--plan-search=8"])
        row = next((ln.split() for ln in r.stdout.splitlines()
                    if ln.split()[:6] == ["8", "1", "1", "1", "1", "1"]), [])
        got = (int(row[10]), row[11]) if len(row) > 11 else None
        checks.check(f"--plan-search 8 between rungs {rungs[a]} and {rungs[b]}: the dp8 row is "
                     "the first rung that fits", got == want and "does not fit" not in " ".join(row),
                     f"row {' '.join(row)}; expected zero {want[0]} offload {want[1]} (peaks MiB "
                     f"{[round(p / 2**20, 3) for p in peaks]}, limit {limit / 2**20:.3f})")


def main():
    rng = seeded_rng("test_plan")
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=L, NH=NH, C=C, T=T, V=V, model=False)
        only = sys.argv[1:]  # substrings of layout names: check only those (by hand)
        for i, (what, par, extra) in enumerate(LAYOUTS):
            if (FULL or what not in FULL_ONLY) and (not only or any(o in what for o in only)):
                check_layout(tmp, i, what, par, extra)
        full_only("test_plan", [] if only else FULL_ONLY)
        if not only:
            test_bad_input(tmp)
            test_search_ladder(tmp)
            test_head_placement(tmp)
            test_prefetch_memory(tmp)
    checks.report()


if __name__ == "__main__":
    main()
