"""test/test_hsdp.py - HSDP ([parallel] dp_replicate = R, parallel/hsdp.cu): dp = R x S, the ZeRO
stages shard over S consecutive dp ranks and the R replicas all-reduce the gradient shards; and
the dtype of the data-parallel reductions ([parallel] reduce_dtype, parallel/reduce_dtype.cu).

Tiny GPT-2 from an llm.c file (L=2, NH=4, C=44, T=16, V=101: shards split rows mid-row), fixed
global batch of 8 sequences, AdamW with weight decay, clipping and a cosine schedule (lr 1e-3),
fp32, 20 steps:
1. Losses and gradient norms of every HSDP layout equal the one-rank run with the same global
   batch within 1e-5 relative (test_distributed's tolerance; measured at most ~1e-7): dp4 = 2 x 2
   at zero 0, 1, 2 and 3, with grad_accum 2 at zero 2 and 3, dp4 = 4 x 1 (pure replication of
   one-rank shards) FSDP, dp2 x cp2 = 2 x 1 FSDP (the dp*cp sub-groups) and dp2 x tp2 (SP) ZeRO-1.
   Each also equals the same stage without HSDP on the same layout within 1e-6 (only the order of
   the fp32 additions differs).
2. On the dp-only layouts what each rank holds and moves equals the analytic count: the ladder of
   parallel/zero.cu with the shard group's S ranks in place of dp (state bytes, run record), and
   per step on the dp-shard axis the ladder's collectives over S, on the dp-replica axis one
   all-reduce per unit of the shard (4 x padded / S bytes; DDP: the whole unit), nothing on dp.
3. Checkpoints reshard to and from HSDP (logical tensors): a dp4 = 2 x 2 FSDP run saves at step 5;
   resumed under the same layout, steps 6-10 equal the uninterrupted run bit for bit; resumed
   under plain FSDP dp4 and under DDP dp2 within 1e-6; a plain FSDP dp4 checkpoint resumed under
   dp4 = 2 x 2 ZeRO-1 within 1e-6 of the uninterrupted plain run. Every element is written once
   (the index's count check) and the index records writer_dp_replicate = 2.
4. reduce_dtype = "bf16" on dp4 DDP, dp4 ZeRO-2 with grad_accum 2 and dp4 = 2 x 2 FSDP: losses
   within BF16_LOSS_TOL and gradient norms within BF16_NORM_TOL of the one-rank fp32 run (see
   there: measured), and not equal to the fp32 reduction's (the rounding happens); every
   reduce-scatter and all-reduce of the dp groups moves exactly half the bytes of the same
   layout in fp32, with the same calls, and the all-gathers of the weights the same bytes.
5. Gradient buckets ([parallel] bucket_mb, parallel/grad_buckets.cu: the two blocks, 2 x ~96 KB,
   in one bucket of 0.5 MiB) and FSDP's prefetch depth ([parallel] fsdp_prefetch, parallel/
   fsdp.cu): at dp2 with one micro-batch every stage is bitwise DDP, and so is DDP, ZeRO-1,
   ZeRO-2 (TEST_FULL=1) and FSDP with bucket_mb (FSDP also with fsdp_prefetch 2): losses and
   norms bit for bit the dp2 DDP run's, each bucketed reduction one call fewer per step (the blocks' two become
   one) with the same bytes. Then against the one-rank run within 1e-5 (bf16 reductions within
   BF16_*_TOL): dp2 x pp2 FSDP with grad_accum 2 and fsdp_prefetch 3 (across the pipeline's
   actions); dp2 x tp2 (SP) ZeRO-2 with grad_accum 2 and bucket_mb (the buckets' sums added to
   the shards every micro-batch); dp2 x cp2 = 2 x 1 HSDP FSDP, cp_comm "all-to-all", bucket_mb,
   fsdp_prefetch 2 and reduce_dtype "bf16".
(Refusals - dp_replicate not dividing dp, < 1, with grad_compression, DiLoCo or the noise scale -
are test/test_bad_input.py's; the planner's exactness under HSDP is test/test_plan.py's.)
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import FULL  # noqa: E402
from trainer import (Checks, base_sections, make_experiment, max_rel, read_metrics,  # noqa: E402
                     read_run_info, round_up, run, seeded_rng, unit_numels, write_config)

checks = Checks("test_hsdp")
L, NH, C, T, V = 2, 4, 44, 16, 101
GLOBAL_ROWS, STEPS = 8, 20
ONE_RANK_TOL, SAME_STAGE_TOL = 1e-5, 1e-6
# bf16 reductions against the one-rank fp32 run, 20 steps at lr 1e-3: measured at most 8.1e-6 on
# losses and 2.2e-4 on norms over the layouts below (the fp32 reductions: ~1e-7); the tolerances
# are ~10x that.
BF16_LOSS_TOL, BF16_NORM_TOL = 1e-4, 3e-3


def train(tmp, name, par, zero=0, accum=1, steps=STEPS, extra=()):
    world = par.get("dp", 1) * par.get("tp", 1) * par.get("pp", 1) * par.get("cp", 1)
    sec = base_sections(tmp, steps, lr=1e-3, micro_batch=GLOBAL_ROWS // par.get("dp", 1) // accum,
                        grad_accum=accum, weight_decay=0.1, grad_clip=1.0,
                        lr_schedule="cosine", warmup_steps=2, min_lr=1e-4)
    sec["parallel"] = dict(par, zero=zero)
    sec["log"]["metrics"] = os.path.join(tmp, f"{name}.jsonl")
    if os.path.exists(sec["log"]["metrics"]):
        os.remove(sec["log"]["metrics"])
    run(write_config(tmp, f"{name}.toml", sec), list(extra), np_ranks=world if world > 1 else 0)
    steps_, _ = read_metrics(sec["log"]["metrics"])
    return steps_, read_run_info(sec["log"]["metrics"])


def hsdp_counts(zero, dp, R, accum):
    """What a rank of a dp-only HSDP layout holds (state bytes) and moves per step (the dp-shard
    and dp-replica axes), fp32: the ladder of parallel/zero.cu over the S = dp/R ranks of a
    shard group, plus one all-reduce of each unit's shard over the R replicas."""
    units = unit_numels(L, C, T, V)
    S = dp // R
    N = S if zero > 0 else 1
    padded = [round_up(n, N * 64) for n in units]
    shard = [p // N for p in padded]
    state = 0
    for n, p, s in zip(units, padded, shard):
        weights = [4 * n, 4 * p, 4 * p, 4 * s][zero]  # fp32: the master is the working copy
        grads = [4 * n, 4 * p, 4 * s, 4 * s][zero]
        state += weights + grads + 8 * s
    shard_axis = {}
    if S > 1:
        gather = {"calls": len(units), "bytes": 4 * sum(padded)}
        rs_micro = {"calls": 1 + accum * L, "bytes": 4 * (padded[0] + accum * sum(padded[1:]))}
        if zero == 0:
            shard_axis = {"all_reduce": {"calls": len(units), "bytes": 4 * sum(units)}}
        elif zero == 1:
            shard_axis = {"reduce_scatter": {"calls": len(units), "bytes": 4 * sum(padded)},
                          "all_gather": gather}
        elif zero == 2:
            shard_axis = {"reduce_scatter": rs_micro, "all_gather": gather}
        else:
            shard_axis = {"all_gather": {"calls": 1 + accum * 2 * L,
                                         "bytes": 4 * (padded[0] + accum * 2 * sum(padded[1:]))},
                          "reduce_scatter": rs_micro}
    replica_axis = {"all_reduce": {"calls": len(units), "bytes": 4 * sum(shard)}}
    return state, shard_axis, replica_axis


def check_counts(what, steps, info, zero, dp, R, accum):
    state, shard_axis, replica_axis = hsdp_counts(zero, dp, R, accum)
    checks.check(f"{what}: state bytes = the ladder over the shard group",
                 info["state_bytes"] == state, f"{info['state_bytes']} vs analytic {state}")
    got = [(s["comm"].get("dp-shard", {}), s["comm"].get("dp-replica", {}), s["comm"].get("dp"))
           for s in steps]
    checks.check(f"{what}: bytes moved per step on dp-shard and dp-replica = analytic, none on dp",
                 all(g == (shard_axis, replica_axis, None) for g in got),
                 f"{got[0]} vs analytic {(shard_axis, replica_axis, None)}")


# (what, parallel, zero, grad_accum)
LAYOUTS = [
    ("dp4 = 2 x 2 DDP", {"dp": 4, "dp_replicate": 2}, 0, 1),
    ("dp4 = 2 x 2 ZeRO-1", {"dp": 4, "dp_replicate": 2}, 1, 1),
    ("dp4 = 2 x 2 ZeRO-2", {"dp": 4, "dp_replicate": 2}, 2, 1),
    ("dp4 = 2 x 2 FSDP", {"dp": 4, "dp_replicate": 2}, 3, 1),
    ("dp4 = 2 x 2 ZeRO-2 grad_accum 2", {"dp": 4, "dp_replicate": 2}, 2, 2),
    ("dp4 = 2 x 2 FSDP grad_accum 2", {"dp": 4, "dp_replicate": 2}, 3, 2),
    ("dp4 = 4 x 1 FSDP", {"dp": 4, "dp_replicate": 4}, 3, 1),
    ("dp2 x cp2 = 2 x 1 FSDP", {"dp": 2, "cp": 2, "dp_replicate": 2}, 3, 1),
    ("dp2 x tp2 sp = 2 x 1 ZeRO-1", {"dp": 2, "tp": 2, "dp_replicate": 2}, 1, 1),
]


def rel(a, b, key):
    if len(a) != len(b):
        return float("inf")
    return max_rel([s[key] for s in a], [s[key] for s in b])


def test_equivalence(tmp):
    one, _ = train(tmp, "one_rank", {})
    for what, par, zero, accum in LAYOUTS:
        name = what.replace(" ", "_").replace("=", "")
        steps, info = train(tmp, name, par, zero, accum)
        loss, norm = rel(steps, one, "loss"), rel(steps, one, "grad_norm")
        checks.check(f"{what}: losses and norms = one rank", len(steps) == STEPS and
                     max(loss, norm) < ONE_RANK_TOL,
                     f"max rel err loss {loss:.2e} norm {norm:.2e} over {len(steps)} steps")
        plain = {k: v for k, v in par.items() if k != "dp_replicate"}
        ref, _ = train(tmp, name + "_plain", plain, zero, accum)
        loss, norm = rel(steps, ref, "loss"), rel(steps, ref, "grad_norm")
        checks.check(f"{what}: = the same stage without HSDP", max(loss, norm) < SAME_STAGE_TOL,
                     f"max rel err loss {loss:.2e} norm {norm:.2e}")
        if set(par) == {"dp", "dp_replicate"}:
            check_counts(what, steps, info, zero, par["dp"], par["dp_replicate"], accum)


def by_step(steps):
    return {s["step"]: (s["loss"], s["grad_norm"]) for s in steps}


def resumed_rel(got, ref):
    if sorted(got) != list(range(6, 11)):
        return float("inf")
    return max(max_rel([got[s][i] for s in got], [ref[s][i] for s in got]) for i in (0, 1))


def index_attribute(ck, name):
    try:
        import h5py
    except ImportError:
        return None
    with h5py.File(os.path.join(ck, "step_000005", "checkpoint.h5"), "r") as f:
        return int(f.attrs.get(name, 1))


def test_checkpoints(tmp):
    hsdp, plain = {"dp": 4, "dp_replicate": 2}, {"dp": 4}
    ck_h, ck_p = os.path.join(tmp, "ck_hsdp"), os.path.join(tmp, "ck_plain")
    save = ["--checkpoint.every=5", "--data.shuffle=true"]
    ref_h = by_step(train(tmp, "ck_hsdp", hsdp, 3, steps=10,
                          extra=[f"--checkpoint.dir={ck_h}"] + save)[0])
    ref_p = by_step(train(tmp, "ck_plain", plain, 3, steps=10,
                          extra=[f"--checkpoint.dir={ck_p}"] + save)[0])
    attr = index_attribute(ck_h, "writer_dp_replicate")
    checks.check("the HSDP checkpoint's index records writer_dp_replicate = 2", attr in (2, None),
                 f"{attr} (None: no h5py here)")
    legs = [("dp4 = 2 x 2 FSDP -> the same", ck_h, hsdp, 3, ref_h, 0.0),
            ("dp4 = 2 x 2 FSDP -> plain FSDP dp4", ck_h, plain, 3, ref_h, SAME_STAGE_TOL),
            ("dp4 = 2 x 2 FSDP -> DDP dp2", ck_h, {"dp": 2}, 0, ref_h, SAME_STAGE_TOL),
            ("plain FSDP dp4 -> dp4 = 2 x 2 ZeRO-1", ck_p, hsdp, 1, ref_p, SAME_STAGE_TOL)]
    for i, (what, ck, par, zero, ref, tol) in enumerate(legs):
        got = by_step(train(tmp, f"ck_leg{i}", par, zero, steps=10,
                            extra=[f"--checkpoint.resume={ck}/step_000005",
                                   "--data.shuffle=true"])[0])
        err = resumed_rel(got, ref)
        checks.check(f"checkpoint {what}: steps 6-10 " +
                     ("bit for bit" if tol == 0 else f"within {tol:.0e}"), err <= tol,
                     f"max rel err {err:.2e} over steps {sorted(got)}")


BF16_LAYOUTS = [("dp4 DDP", {"dp": 4}, 0, 1), ("dp4 ZeRO-2 grad_accum 2", {"dp": 4}, 2, 2),
                ("dp4 = 2 x 2 FSDP", {"dp": 4, "dp_replicate": 2}, 3, 1)]


def halved(bf16, fp32):
    """Whether step comm records bf16 equal fp32's with every reduction's bytes halved."""
    for axis, kinds in fp32.items():
        for kind, c in kinds.items():
            want = c["bytes"] // 2 if kind in ("all_reduce", "reduce_scatter") and \
                axis.startswith("dp") else c["bytes"]
            got = bf16.get(axis, {}).get(kind, {})
            if got != {"calls": c["calls"], "bytes": want}:
                return False
    return set(bf16) == set(fp32)


def test_bf16_reductions(tmp):
    one, _ = train(tmp, "one_rank", {})
    for what, par, zero, accum in BF16_LAYOUTS:
        name = what.replace(" ", "_").replace("=", "")
        bf16, _ = train(tmp, name + "_bf16", dict(par, reduce_dtype="bf16"), zero, accum)
        fp32, _ = train(tmp, name + "_fp32", par, zero, accum)
        loss, norm = rel(bf16, one, "loss"), rel(bf16, one, "grad_norm")
        checks.check(f"{what} reduce_dtype bf16: = one rank within {BF16_LOSS_TOL:.0e} (losses), "
                     f"{BF16_NORM_TOL:.0e} (norms), and not the fp32 reduction's",
                     len(bf16) == STEPS and loss < BF16_LOSS_TOL and norm < BF16_NORM_TOL and
                     rel(bf16, fp32, "grad_norm") > 0,
                     f"max rel err loss {loss:.2e} norm {norm:.2e}; vs fp32 reductions "
                     f"{rel(bf16, fp32, 'grad_norm'):.2e}")
        ok = all(halved(b["comm"], f["comm"]) for b, f in zip(bf16, fp32))
        checks.check(f"{what} reduce_dtype bf16: half the reductions' bytes, the same calls", ok,
                     f"{bf16[0]['comm']} vs fp32 {fp32[0]['comm']}")


# (what, parallel, zero): bitwise the dp2 DDP run (one micro-batch: every stage is DDP at dp2)
BUCKET_MB = 0.5
BITWISE_LAYOUTS = [("dp2 DDP bucket_mb", {"dp": 2, "bucket_mb": BUCKET_MB}, 0),
                   ("dp2 ZeRO-1 bucket_mb", {"dp": 2, "bucket_mb": BUCKET_MB}, 1),
                   ("dp2 ZeRO-2 bucket_mb", {"dp": 2, "bucket_mb": BUCKET_MB}, 2),  # FULL
                   ("dp2 FSDP bucket_mb fsdp_prefetch 2",
                    {"dp": 2, "bucket_mb": BUCKET_MB, "fsdp_prefetch": 2}, 3)]
# (what, parallel, zero, grad_accum, tolerance on losses and norms) against one rank
BUCKET_LAYOUTS = [
    # one block per stage: no bucket of two; the prefetch crosses the pipeline's actions
    ("dp2 x pp2 FSDP grad_accum 2 fsdp_prefetch 3", {"dp": 2, "pp": 2, "fsdp_prefetch": 3}, 3, 2,
     (ONE_RANK_TOL, ONE_RANK_TOL)),
    ("dp2 x tp2 sp ZeRO-2 grad_accum 2 bucket_mb", {"dp": 2, "tp": 2, "bucket_mb": BUCKET_MB}, 2,
     2, (ONE_RANK_TOL, ONE_RANK_TOL)),
    ("dp2 x cp2 = 2 x 1 FSDP all-to-all bucket_mb fsdp_prefetch 2 bf16",
     {"dp": 2, "cp": 2, "dp_replicate": 2, "cp_comm": "all-to-all", "bucket_mb": BUCKET_MB,
      "fsdp_prefetch": 2, "reduce_dtype": "bf16"}, 3, 1, (BF16_LOSS_TOL, BF16_NORM_TOL))]


def reductions(step, axis="dp"):
    """{collective: (calls, bytes)} of a step's gradient reductions on an axis."""
    kinds = step["comm"].get(axis, {})
    return {k: (c["calls"], c["bytes"]) for k, c in kinds.items()
            if k in ("all_reduce", "reduce_scatter")}


def test_buckets_and_prefetch(tmp):
    ref, _ = train(tmp, "dp2_ddp", {"dp": 2}, 0)
    for what, par, zero in BITWISE_LAYOUTS:
        if zero == 2 and not FULL:  # its release path runs in the dp2 x tp2 layout below
            continue
        steps, _ = train(tmp, what.replace(" ", "_"), par, zero)
        same = len(steps) == STEPS and all(
            (a["loss"], a["grad_norm"]) == (b["loss"], b["grad_norm"]) for a, b in zip(steps, ref))
        checks.check(f"{what}: losses and norms bit for bit dp2 DDP's", same,
                     f"max rel err loss {rel(steps, ref, 'loss'):.2e} "
                     f"norm {rel(steps, ref, 'grad_norm'):.2e}")
        # unbucketed: one call per unit (the root, two blocks); here the two blocks share one
        units = unit_numels(L, C, T, V)
        padded = units if zero == 0 else [round_up(n, 2 * 64) for n in units]
        want = {"reduce_scatter" if zero else "all_reduce": (len(units) - 1, 4 * sum(padded))}
        got = reductions(steps[0])
        checks.check(f"{what}: the bucket is one reduction: one call fewer, the same bytes",
                     got == want, f"{got} vs {want}")
    one, _ = train(tmp, "one_rank", {})
    for what, par, zero, accum, (loss_tol, norm_tol) in BUCKET_LAYOUTS:
        steps, _ = train(tmp, what.replace(" ", "_").replace("=", ""), par, zero, accum)
        loss, norm = rel(steps, one, "loss"), rel(steps, one, "grad_norm")
        checks.check(f"{what}: losses within {loss_tol:.0e}, norms within {norm_tol:.0e} of one "
                     "rank", len(steps) == STEPS and loss < loss_tol and norm < norm_tol,
                     f"max rel err loss {loss:.2e} norm {norm:.2e} over {len(steps)} steps")


def main():
    rng = seeded_rng("test_hsdp")
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=L, NH=NH, C=C, T=T, V=V)
        checks.run_each(lambda: test_equivalence(tmp), lambda: test_checkpoints(tmp),
                        lambda: test_bf16_reductions(tmp),
                        lambda: test_buckets_and_prefetch(tmp))
    checks.report()


if __name__ == "__main__":
    main()
