"""test/test_pipeline.py - pipeline parallelism against the one-rank run.

A tiny GPT from random init (the counter-based RNG: every layout starts from the same weights),
20 steps at lr 1e-3 (Adam eps 1e-6, see train()), global batch fixed at 8 sequences. The one-rank run with the same
micro-batches (grad_accum m x micro_batch B) is the reference.
1. pp = 2 and 4 (L = 4: two blocks per stage, then one), m = 1, 2, 4, 8, schedules "1f1b" and
   "gpipe"; "interleaved" with v = 2 at pp = 4 (L = 8), m = 4 and 8 (it needs pp >= 3 and
   m % pp == 0): per-step losses and gradient norms within 3e-6 relative of the one-rank run,
   the validation loss within 3e-6, the sampled tokens identical (the last stage samples and
   sends each token to the others); the two copies of the tied root (first and last stage) are
   bitwise equal after every step ([log] check_tied: the trainer compares them and stops if not).
2. Communication per step on rank 0 equals the analytic value exactly: on the pp axis one
   send and one receive of B*T*C elements per micro-batch and stage boundary of each of its
   chunks, on the embed axis one all-reduce of the root's gradient (its shard under FSDP).
3. bf16 and fp8 at pp = 2 against the one-rank bf16 / fp8 run (FP8's amaxes agree over the
   stage group; the backward casts each micro-batch's input with its own scale): step 1's
   gradient norm within 1e-6 (measured <= 8e-8: only the tied wte's gradient is summed in
   another order, head and embedding parts on two stages), the norms of the first 6 steps
   within 2e-3 (1 seed in ~8 flips a bf16 or FP8 code by step 2-6 and shows 1.5e-4), the losses
   of all 20 steps within 2e-3 (measured up to 1.5e-4 in fp8 and 3.2e-5 in bf16: after some steps
   such 1e-7 differences flip a bf16 or FP8 code now and then, and Adam carries it on). A backward
   that casts with the last forward's scale (another micro-batch's) moves the fp8 norms by 3e-3
   from step 1. dp2 x pp2 with FSDP and with DDP,
   tp2 x pp2 with sequence parallelism, and dp2 x tp2 x pp2 at np = 8, and the split schedules
   with dp, tp, cp (zb-h1, zb-v), within 1e-5 (LAYOUT_TOL: the gradient norms' reduction order;
   measured up to 1.6e-6 for tp2 x pp2 zb-v sp over 12 seeds, 8.6e-7 for cp2 x pp2; 3e-6 failed
   on one seed of 20).
4. Checkpoints reshard across pp: a dp2 x pp2 FSDP save at step 10 resumed on one rank, and a
   one-rank save resumed at pp4 x tp2 (np = 8), continue within 1e-5 of the uninterrupted runs.
5. The measured bubble report and the ASCII timeline ([log] pipeline_timeline), 1f1b and zb-h1 at
   pp = 2, m = 4, checked on what machine load cannot change (the durations are wall-clock): each
   rank's listed actions in the schedule's order (built here independently), one after the other;
   the measured bubble recomputed from the listed times; the predicted bubble against a
   simulation here of the listed durations (equal for 1f1b, at least it for zb-h1); the formula;
   every action drawn, in order, with its micro-batch where it has room. And when the ranks do
   not share cores (nproc >= 2; else a counted SKIP), the measured bubble itself against the
   prediction from the measured durations: pp = 2 with stages of 1 and 5 blocks (prediction
   37-42%, the formula 20%), one thread per rank, three runs, each within [-0.5, +5] points
   (BUBBLE_TOL: measured 0.2-1.4 points apart under load).
6. Refused before any work: n_layer not a multiple of pp (the pipeline-schedule rules of
   [parallel] pp_schedule and pp_virtual are checked in test_distributed.py); a zero-bubble
   schedule with recompute; pp_layers that do not sum to n_layer, or given with pp_balance =
   "auto"; a user schedule file with a mistake, named by file and line (every kind of mistake:
   test_pipeline_file.cpp).
7. The zero-bubble schedules (the backward split into B and W), interleaving at pp = 2 and user
   schedules, within 1e-5 (LAYOUT_TOL: norms measured 1.2e-6 on SEED=637578360) of one rank (losses, norms, validation loss;
   the same samples): zb-h1 at pp = 2 (m = 1, 4) and 4 (m = 2, 8); zb-v at pp = 2 (m = 1, 3, 4)
   and 4 (L = 8, m = 4, 8); interleaved at pp = 2 (m = 2, 4, and with dp2 FSDP); with dp2 FSDP,
   DDP, ZeRO-1 and -2 (the weight pass W releases the gradients the stage reduces), tp2 with SP,
   cp2 (zb-h1 and zb-v), MoE (dp2 x ep2), fp8 (zb-h1, against the one-rank fp8 run as in 3.: W
   scales the gradient again, grad_w, the same scale bit for bit when tensorwise); uneven stages
   (pp_layers [1, 3] with 1f1b and zb-h1; L = 6, [2, 1, 1, 2] with zb-v and interleaved);
   pp_balance = "auto" on a 4096-token vocabulary (the head moves the last stage's blocks to the
   first: blocks 3,1); a zb-h1 schedule written to a file; message counts per step on every
   pipeline rank equal the analytic value for the schedule's stage order (V: rank p-1's two chunks
   meet without a message, and the root is rank 0's alone: no embedding all-reduce). A zb-v
   save with uneven stages resumes on one rank.
Without TEST_FULL=1 (make test-full) the matrices of 1. and 7. run a subset, each schedule at
each depth still: 1. m = 1 and 4 (m = 2 and 8 and interleaved's m = 8 only in the full run);
7. zb-h1 at pp = 2 m = 1 and pp = 4 m = 2, zb-v at pp = 2 m = 3 and pp = 4 m = 4, interleaved
at m = 4 (the other five cases of its list only in the full run). The output names what it left
out.
"""
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import FULL, full_only  # noqa: E402
from trainer import (Checks, base_sections, check_refused, compare_runs,  # noqa: E402
                     make_experiment, max_rel, read_metrics, run, seeded_rng, with_validation,
                     write_config)

checks = Checks("test_pipeline")
NH, C, T, V = 2, 32, 16, 101
Vp = 128
GLOBAL_ROWS, STEPS = 8, 20
LAYOUT_TOL = 1e-5  # layouts vs one rank, fp32: gradient norms measured <= 1.6e-6 over 12 seeds
                   # (tp2 x pp2 zb-v sp; cp2 x pp2 <= 8.6e-7, dp2 x pp2 <= 2.6e-7)


def round_up(x, m):
    return (x + m - 1) // m * m


def root_numel(tp=1):
    """The root unit's flat length: wte (Vp/tp rows), wpe, ln_f weight and bias, 64-aligned."""
    return sum(round_up(n, 64) for n in [Vp // tp * C, T * C, C, C])


def owner(stage, p, order):
    """The pp rank holding a stage: loop order stage % p; V order r and 2p-1-r."""
    return 2 * p - 1 - stage if order == "v" and stage >= p else stage % p


def expected_comm(p, v, m, B, dp=1, tp=1, sp=True, fsdp=False, dtype_bytes=4, rank=0,
                  order="loop"):
    """pp and embed axis counters of one step on pp rank `rank`: per micro-batch one activation
    and one gradient each way across every stage boundary between two ranks."""
    msg = B * T * C * dtype_bytes // (tp if sp else 1)
    sends = recvs = 0
    for stage in range(p * v):
        if owner(stage, p, order) != rank:
            continue
        for other in (stage - 1, stage + 1):
            if 0 <= other < p * v and owner(other, p, order) != rank:
                sends, recvs = sends + m, recvs + m  # activation one way, gradient the other
    out = {"pp": {"send": {"calls": sends, "bytes": sends * msg},
                  "recv": {"calls": recvs, "bytes": recvs * msg}}}
    if owner(p * v - 1, p, order) != 0 and rank in (0, owner(p * v - 1, p, order)):
        shard = round_up(root_numel(tp), dp * 64) // dp if fsdp else root_numel(tp)
        out["embed"] = {"all_reduce": {"calls": 1, "bytes": 4 * shard}}
    return out


def train(tmp, name, L, m, B, pp=1, schedule="1f1b", v=1, dp=1, tp=1, sp=True, fsdp=False,
          dtype="fp32", extra=(), steps=STEPS, ckpt=None, cp=1, ep=1, moe=None, layers=None,
          balance="equal", vocab=V, zero=None):
    """moe: [model] keys of a mixture of experts (n_experts, top_k, ...), or None: dense.
    layers: [parallel] pp_layers, or None (balance: pp_balance). vocab: [model] vocab_size (the
    data's tokens are all below V)."""
    # Adam eps 1e-6, not 1e-8: a rare token's wte gradient (~1e-9) differs between layouts by its
    # reduction order, and with eps 1e-8 Adam turns that noise into steps of up to lr, which
    # drift the gradient norms apart by up to 2e-5 on some datasets (seen in test_matrix).
    sec = base_sections(tmp, steps, micro_batch=B, grad_accum=m, eps=1e-6)
    del sec["init"]
    sec["model"] = {"n_layer": L, "n_head": NH, "d_model": C, "seq_len": T, "vocab_size": vocab,
                    **(moe or {})}
    sec["train"]["seed"] = 777
    sec["parallel"] = {"dp": dp, "tp": tp, "sp": sp, "fsdp": fsdp, "pp": pp, "cp": cp, "ep": ep,
                       "pp_schedule": schedule, "pp_virtual": v, "pp_balance": balance}
    if layers:
        sec["parallel"]["pp_layers"] = layers
    if zero is not None:
        sec["parallel"]["zero"] = zero
    sec["precision"] = {"compute": dtype}
    sec["log"]["metrics"] = os.path.join(tmp, f"{name}.jsonl")
    sec["log"].update({"sample_every": steps, "sample_tokens": 8, "check_tied": pp > 1})
    with_validation(sec, tmp, steps, 2)
    if ckpt:
        sec["checkpoint"] = ckpt
    world = dp * pp * tp * cp
    r = run(write_config(tmp, f"{name}.toml", sec), list(extra), np_ranks=world if world > 1 else 0)
    steps_rec, vals = read_metrics(sec["log"]["metrics"])
    sample = r.stdout.split("| sample:\n")[-1].split("\n---")[0]
    return steps_rec, vals, sample, r.stdout


def check_comm(what, steps, want):
    got = [{k: s["comm"][k] for k in ("pp", "embed") if k in s["comm"]} for s in steps]
    checks.check(f"{what}: comm per step", all(g == want for g in got),
                 f"{got[0]} (analytic {want})")


REFS = {}


def reference(tmp, L, m, B, **kw):
    """The one-rank run of this model and batch (each computed once)."""
    key = (L, m, B, tuple(sorted((k, str(x)) for k, x in kw.items())))
    if key not in REFS:
        REFS[key] = train(tmp, f"ref{len(REFS)}", L, m, B, **kw)
    return REFS[key]


def test_split_schedules(tmp):
    """zb-h1, zb-v, interleaving at pp = 2, against the one-rank run at 1e-6."""
    cases = [(4, "zb-h1", 2, 1, m) for m in (1, 4)] + [(4, "zb-h1", 4, 1, m) for m in (2, 8)]
    cases += [(4, "zb-v", 2, 2, m) for m in (1, 3, 4)] + [(8, "zb-v", 4, 2, m) for m in (4, 8)]
    cases += [(4, "interleaved", 2, 2, m) for m in (2, 4)]
    # Without TEST_FULL: each schedule at both pipeline depths, m = 1 and m < pp among them.
    core = [(4, "zb-h1", 2, 1, 1), (4, "zb-h1", 4, 1, 2), (4, "zb-v", 2, 2, 3),
            (8, "zb-v", 4, 2, 4), (4, "interleaved", 2, 2, 4)]
    full_only("test_pipeline", [f"pp={p} {s} m={m}" for L, s, p, v, m in cases
                                if (L, s, p, v, m) not in core])
    for L, schedule, p, v, m in cases if FULL else core:
        B = GLOBAL_ROWS // m
        ref = reference(tmp, L, m, B)
        got = train(tmp, f"{schedule}_pp{p}_m{m}_L{L}", L, m, B, pp=p, schedule=schedule, v=v)
        what = f"pp={p} {schedule} v={v} m={m} (L={L})"
        compare_runs(checks, what, got, ref, tol=LAYOUT_TOL)
        order = "v" if schedule == "zb-v" else "loop"
        check_comm(what, got[0], expected_comm(p, v, m, B, order=order))


def test_split_with_other_axes(tmp):
    L, m, B = 4, 2, 4
    ref = reference(tmp, L, m, B)
    runs = [("dp2 x pp2 zb-h1 FSDP", dict(dp=2, fsdp=True, schedule="zb-h1")),
            ("dp2 x pp2 zb-v DDP", dict(dp=2, schedule="zb-v", v=2)),
            ("dp2 x pp2 zb-v ZeRO-2", dict(dp=2, schedule="zb-v", v=2, zero=2)),
            ("dp2 x pp2 zb-h1 ZeRO-1", dict(dp=2, schedule="zb-h1", zero=1)),
            ("tp2 x pp2 zb-v sp", dict(tp=2, schedule="zb-v", v=2)),
            ("cp2 x pp2 zb-h1", dict(cp=2, schedule="zb-h1")),
            ("cp2 x pp2 zb-v", dict(cp=2, schedule="zb-v", v=2)),
            ("dp2 x pp2 interleaved FSDP", dict(dp=2, fsdp=True, schedule="interleaved", v=2))]
    for what, kw in runs:
        got = train(tmp, what.replace(" ", "_"), L, m, B // kw.get("dp", 1), pp=2, **kw)
        compare_runs(checks, what, got, ref, tol=LAYOUT_TOL)
    moe = {"n_experts": 4, "top_k": 2, "d_expert": 48, "moe_every": 2}
    ref = reference(tmp, L, m, B, moe=moe)
    got = train(tmp, "moe_dp2ep2pp2_zbv", L, m, B // 2, pp=2, dp=2, ep=2, schedule="zb-v", v=2,
                moe=moe)
    compare_runs(checks, "MoE dp2 x ep2 x pp2 zb-v", got, ref, tol=LAYOUT_TOL)
    ref = reference(tmp, L, 4, 2, dtype="fp8")
    got = train(tmp, "pp2_fp8_zbh1", L, 4, 2, pp=2, schedule="zb-h1", dtype="fp8")
    # Step 1 starts from the same weights; later steps may quantise a value one FP8 step apart
    # once fp32 rounding has moved the weights (measured up to 3.6e-4 on the first 6 norms)
    first = max_rel([got[0][0]["grad_norm"]], [ref[0][0]["grad_norm"]])
    norms = max_rel([s["grad_norm"] for s in got[0][:6]], [s["grad_norm"] for s in ref[0][:6]])
    loss = max_rel([s["loss"] for s in got[0]], [s["loss"] for s in ref[0]])
    checks.check(f"fp8 pp=2 zb-h1: step 1's gradient norm, the first 6, {STEPS} losses (as "
                 "test_with_other_axes)", first < 1e-6 and norms < 2e-3 and loss < 2e-3,
                 f"max rel err {first:.1e}, {norms:.1e}, {loss:.1e} vs one-rank fp8 "
                 "(tolerances 1e-6, 2e-3, 2e-3)")


def test_uneven_stages(tmp):
    m, B = 4, 2
    ref = reference(tmp, 4, m, B)
    for schedule in ("1f1b", "zb-h1"):
        got = train(tmp, f"layers13_{schedule}", 4, m, B, pp=2, schedule=schedule, layers=[1, 3])
        compare_runs(checks, f"pp=2 {schedule} pp_layers [1, 3]", got, ref, tol=LAYOUT_TOL)
    ref = reference(tmp, 6, m, B)
    for schedule in ("zb-v", "interleaved"):
        got = train(tmp, f"layers6_{schedule}", 6, m, B, pp=2, schedule=schedule, v=2,
                    layers=[2, 1, 1, 2])
        compare_runs(checks, f"pp=2 {schedule} v=2 pp_layers [2, 1, 1, 2] (L=6)", got, ref,
                     tol=LAYOUT_TOL)
    ref = reference(tmp, 4, m, B, vocab=4096)
    got = train(tmp, "auto", 4, m, B, pp=2, balance="auto", vocab=4096)
    compare_runs(checks, "pp=2 pp_balance auto, vocabulary 4096", got, ref, tol=LAYOUT_TOL)
    banner = re.search(r"^stages +blocks ([\d,]+), estimated share (.*) \(pp_balance", got[3], re.M)
    checks.check("pp_balance auto with a 4096-token vocabulary: the last stage's head costs more "
                 "than one block, so blocks 3,1", banner is not None and banner.group(1) == "3,1",
                 banner.group(0) if banner else "no stages line")


def one_f_one_b_lists(p, m):
    """1f1b's compute order per rank, [(op, micro)]: p-r-1 forwards of warm-up, then a forward
    and a backward at a time, then the backwards left."""
    lists = []
    for r in range(p):
        w = min(p - r - 1, m)
        ops = [("F", k) for k in range(w)]
        for k in range(m - w):
            ops += [("F", w + k), ("B", k)]
        lists.append(ops + [("B", k) for k in range(m - w, m)])
    return lists


def zb_h1_lists(p, m):
    """zb-h1's compute order per rank (Qi et al. 2023), [(op, micro)]: 1f1b's warm-up, then F/B
    pairs with each W r micro-batches after its B, then the W's left."""
    lists = []
    for r in range(p):
        ops, w_done = [("F", k) for k in range(p - r - 1)], 0
        for k in range(m - (p - r - 1)):
            ops += [("F", p - r - 1 + k), ("B", k)]
            if k - w_done >= r:
                ops.append(("W", w_done))
                w_done += 1
        for k in range(m - (p - r - 1), m):
            ops.append(("B", k))
            if k - w_done >= r:
                ops.append(("W", w_done))
                w_done += 1
        lists.append(ops + [("W", k) for k in range(w_done, m)])
    return lists


def test_file_schedule(tmp):
    m, B, p = 4, 2, 2
    lines = ["# zb-h1 for pp = 2, m = 4, written by hand", "order,loop"]
    for r, ops in enumerate(zb_h1_lists(p, m)):
        lines += [f"{r},{op},{i},0" for op, i in ops]
    path = os.path.join(tmp, "zb.csv")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    got = train(tmp, "file", 4, m, B, pp=p, schedule="file:" + path,
                extra=["--log.pipeline_timeline=true"])
    compare_runs(checks, "pp=2 schedule from a file (zb-h1 by hand)", got, reference(tmp, 4, m, B),
                 tol=LAYOUT_TOL)
    timeline = re.findall(r"^pp rank (\d) \|([^|]*)\|$", got[3], re.M)
    checks.check("the file's schedule drawn: F, B and W of every micro-batch on each rank",
                 len(timeline) == p and all(line.count(c) == m for _, line in timeline
                                            for c in "FBW"), f"{len(timeline)} lines")


def test_schedules(tmp):
    L = 4
    # Without TEST_FULL: m = 1 and 4, both schedules at both depths (m below, equal to and
    # above pp); m = 2 and 8 with TEST_FULL=1, and interleaved at m = 8.
    ms = (1, 2, 4, 8) if FULL else (1, 4)
    full_only("test_pipeline", ["pp=2 and 4, 1f1b and gpipe, m=2 and 8",
                                "pp=4 interleaved v=2 m=8 (L=8)"])
    for m in ms:
        B = GLOBAL_ROWS // m
        ref = train(tmp, f"one_m{m}", L, m, B)
        for p in (2, 4):
            for schedule in ("1f1b", "gpipe"):
                got = train(tmp, f"pp{p}_{schedule}_m{m}", L, m, B, pp=p, schedule=schedule)
                what = f"pp={p} {schedule} m={m}"
                compare_runs(checks, what, got, ref, LAYOUT_TOL)
                check_comm(what, got[0], expected_comm(p, 1, m, B))
    L = 8
    for m in (4, 8) if FULL else (4,):
        B = GLOBAL_ROWS // m
        ref = train(tmp, f"one8_m{m}", L, m, B)
        got = train(tmp, f"pp4_interleaved_m{m}", L, m, B, pp=4, schedule="interleaved", v=2)
        what = f"pp=4 interleaved v=2 m={m} (L=8)"
        compare_runs(checks, what, got, ref, LAYOUT_TOL)
        check_comm(what, got[0], expected_comm(4, 2, m, B))


def test_with_other_axes(tmp):
    L, m, B = 4, 4, 2
    for dtype in ("bf16", "fp8"):  # fp8: amaxes agree over the stage group
        ref = train(tmp, f"one_{dtype}", L, m, B, dtype=dtype)
        got = train(tmp, f"pp2_{dtype}", L, m, B, pp=2, dtype=dtype)
        first = max_rel([got[0][0]["grad_norm"]], [ref[0][0]["grad_norm"]])
        norms = max_rel([s["grad_norm"] for s in got[0][:6]], [s["grad_norm"] for s in ref[0][:6]])
        loss = max_rel([s["loss"] for s in got[0]], [s["loss"] for s in ref[0]])
        checks.check(f"{dtype} pp=2: step 1's gradient norm, the first 6, {STEPS} losses",
                     first < 1e-6 and norms < 2e-3 and loss < 2e-3,
                     f"max rel err {first:.1e}, {norms:.1e}, {loss:.1e} vs one-rank {dtype} "
                     "(tolerances 1e-6, 2e-3, 2e-3)")
    ref = train(tmp, "ref_m2", L, 2, 4)
    for fsdp in (True, False):
        got = train(tmp, f"dp2pp2_{fsdp}", L, 2, 2, pp=2, dp=2, fsdp=fsdp)
        what = f"dp2 x pp2 {'FSDP' if fsdp else 'DDP'}"
        compare_runs(checks, what, got, ref, LAYOUT_TOL)
        check_comm(what, got[0], expected_comm(2, 1, 2, 2, dp=2, fsdp=fsdp))
    got = train(tmp, "tp2pp2", L, 2, 4, pp=2, tp=2)
    compare_runs(checks, "tp2 x pp2 sp", got, ref, LAYOUT_TOL)
    check_comm("tp2 x pp2 sp", got[0], expected_comm(2, 1, 2, 4, tp=2))
    got = train(tmp, "dp2tp2pp2", L, 2, 2, pp=2, tp=2, dp=2, fsdp=True)
    compare_runs(checks, "dp2 x tp2 x pp2 FSDP sp (np=8)", got, ref, LAYOUT_TOL)


def test_checkpoints(tmp):
    L, m, B = 4, 2, 4
    full = train(tmp, "ck_one", L, m, B)
    d = os.path.join(tmp, "ck_a")
    saved = train(tmp, "ck_dp2pp2", L, m, B // 2, pp=2, dp=2, fsdp=True,
                  ckpt={"dir": d, "every": 10})
    resumed = train(tmp, "ck_a_one", L, m, B,
                    ckpt={"dir": d, "resume": os.path.join(d, "step_000010")})
    r = max_rel([s["loss"] for s in resumed[0]], [s["loss"] for s in saved[0][10:]])
    checks.check("dp2 x pp2 FSDP save at step 10 resumed on one rank", len(resumed[0]) == 10 and
                 r < 1e-5, f"steps 11-20 max rel err {r:.2e} vs the uninterrupted run")
    d = os.path.join(tmp, "ck_b")
    train(tmp, "ck_b_one", L, m, B, ckpt={"dir": d, "every": 10})
    resumed = train(tmp, "ck_b_pp4tp2", L, m, B, pp=4, tp=2,
                    ckpt={"dir": d, "resume": os.path.join(d, "step_000010")})
    r = max_rel([s["loss"] for s in resumed[0]], [s["loss"] for s in full[0][10:]])
    checks.check("one-rank save at step 10 resumed at pp4 x tp2 (np=8)", len(resumed[0]) == 10
                 and r < 1e-5, f"steps 11-20 max rel err {r:.2e} vs the uninterrupted run")
    d = os.path.join(tmp, "ck_c")  # the V order and uneven stages, recorded in the index
    saved = train(tmp, "ck_zbv", 6, m, B, pp=2, schedule="zb-v", v=2, layers=[2, 1, 1, 2],
                  ckpt={"dir": d, "every": 10})
    resumed = train(tmp, "ck_c_one", 6, m, B,
                    ckpt={"dir": d, "resume": os.path.join(d, "step_000010")})
    r = max_rel([s["loss"] for s in resumed[0]], [s["loss"] for s in saved[0][10:]])
    checks.check("pp2 zb-v pp_layers [2, 1, 1, 2] save at step 10 resumed on one rank",
                 len(resumed[0]) == 10 and r < 1e-5,
                 f"steps 11-20 max rel err {r:.2e} vs the uninterrupted run")


def simulated_bubble(lists, durations):
    """The bubble (%) of p ranks running their lists with the given durations, each compute
    starting once its rank is free and its input is there (a forward needs the previous rank's
    forward of the micro-batch, a backward the next rank's backward; W its own B, before it in the
    list), communication free: one stage per rank, the longest path through the step."""
    p = len(lists)
    done, clock, pc = {}, [0.0] * p, [0] * p
    progress = True
    while progress:
        progress = False
        for r in range(p):
            while pc[r] < len(lists[r]):
                op, i = lists[r][pc[r]]
                dep = ("F", i, r - 1) if op == "F" and r > 0 else \
                      ("B", i, r + 1) if op == "B" and r < p - 1 else None
                if dep is not None and dep not in done:
                    break
                clock[r] = max(clock[r], done.get(dep, 0.0)) + durations[r][pc[r]]
                done[(op, i, r)] = clock[r]
                pc[r], progress = pc[r] + 1, True
    return 100.0 * (1 - sum(map(sum, durations)) / p / max(clock))


def check_timeline(schedule, p, m, out, want_lists, formula, exact):
    """The report of one step, against its own numbers: the timings of each rank's actions are
    wall-clock (on a loaded machine anything from 1 to 100 ms, ranks on shared cores), so what is
    checked is what load cannot change - each rank's actions in its schedule's order, one after
    the other; the measured bubble recomputed from the listed times; the predicted one against an
    independent simulation of the listed durations; the formula; the drawing holding every
    action, in order. The trainer predicts under rendezvous (a send waits for its receive), the
    simulation here lets sends complete at once: that is never slower, and the same when every
    send is posted with the receive its rank needs next (`exact`: 1f1b at p = 2, where each
    exchange pairs a send with the receive of the next input); in zb-h1 a rank may wait in a send
    where buffered it would have run a W, so there the prediction is at least the simulation's."""
    what = f"pp={p} {schedule} m={m} measured bubble and timeline"
    report = re.search(r"bubble ([\d.]+)% measured, ([\d.]+)% predicted from the measured "
                       r"durations, ([\d.]+)% by the formula", out)
    drawn = dict(re.findall(r"^pp rank (\d) \|([^|]*)\|$", out, re.M))
    listed = dict(re.findall(r"^pp rank (\d) actions:(.*)$", out, re.M))
    acts = [[(a[0], int(a[1]), int(a[2]), float(a[3]), float(a[4]))
             for a in re.findall(r"([FBW])(\d+)\.(\d+)@([\d.]+)-([\d.]+)", listed.get(str(r), ""))]
            for r in range(p)]
    if report is None or len(drawn) != p:
        return checks.check(what, False, "no bubble line or timeline")
    order = [[(op, i) for op, i, _, _, _ in a] for a in acts]
    in_turn = all(0 <= a[3] <= a[4] and (k == 0 or rank[k - 1][4] <= a[3])
                  for rank in acts for k, a in enumerate(rank))
    checks.check(f"{what}: every rank's actions in the schedule's order, one after the other",
                 order == want_lists and in_turn, f"{order} vs {want_lists}")
    durations = [[a[4] - a[3] for a in rank] for rank in acts]
    span = max(rank[-1][4] for rank in acts)
    # bubbles printed to 0.1%, times to 1 ns: each duration off by up to 1e-6 ms
    tol = 0.051 + 100.0 * 1e-6 * sum(map(len, acts)) / span
    measured = 100.0 * (1 - sum(map(sum, durations)) / p / span)
    predicted = simulated_bubble(want_lists, durations)
    got = float(report.group(2))
    checks.check(f"{what}: bubbles", abs(float(report.group(1)) - measured) < tol and
                 (abs(got - predicted) < tol if exact else got > predicted - tol) and
                 abs(float(report.group(3)) - formula) < 0.051,
                 f"{report.group(0)}; recomputed {measured:.2f}% measured, {predicted:.2f}% "
                 f"predicted{'' if exact else ' at least'}, {formula:.2f}% formula "
                 f"(tolerance {tol:.3f})")
    letters = ["".join(c for c in drawn[str(r)] if c in "FBW") for r in range(p)]
    digits = [re.findall(r"([FBW])([0-9a-f]?)", drawn[str(r)]) for r in range(p)]
    checks.check(f"{what}: the drawing holds every action in order, with its micro-batch where "
                 "it has room", letters == ["".join(op for op, _ in w) for w in want_lists] and
                 all(d == "" or int(d, 16) == i % 16 for r in range(p)
                     for (_, d), (_, i) in zip(digits[r], want_lists[r])),
                 " / ".join(drawn[str(r)] for r in range(p)))


# The measured bubble against the prediction: stages 1 and 5 blocks of a 6-layer, 256-wide model
# (the last stage also runs the head), 1f1b over 4 micro-batches of 2 x 128 tokens, one thread
# per rank. Measured on this 2-core machine at load average 17-23 (other jobs running), over 6
# runs: measured - predicted between 0.2 and 1.4 points (median 0.9); the prediction from the
# measured durations 37-42%, the formula at equal costs 20%.
BUBBLE_TOL = 5.0  # points: 5x the median difference, 3.5x the worst under that load; the
                  # formula's 20% (a prediction that ignores the durations) is 17+ points away
BUBBLE_RUNS = 3


def test_bubble_asserted(tmp):
    """When the ranks do not share cores (nproc >= 2 for pp = 2 ranks of one thread each), the
    bubble the trainer measures is the one its simulator predicts from the measured durations
    (parallel/pipeline_simulator.cu) plus only the messages' time, which the prediction leaves
    out: predicted - 0.5 <= measured <= predicted + BUBBLE_TOL, on every one of BUBBLE_RUNS runs.
    A timer that misses part of an action's work, or a simulator that does not follow the
    schedule, moves them apart."""
    cores = os.cpu_count() or 1
    if cores < 2:
        print(f"SKIP measured bubble vs prediction: {cores} core(s) for 2 ranks (they would share)")
        return
    sec = base_sections(tmp, 2, micro_batch=2, grad_accum=4)
    del sec["init"]
    sec["model"] = {"n_layer": 6, "n_head": 4, "d_model": 256, "seq_len": 128, "vocab_size": V}
    sec["parallel"] = {"pp": 2, "pp_layers": [1, 5]}
    cfg = write_config(tmp, "bubble.toml", sec)
    for k in range(BUBBLE_RUNS):
        out = run(cfg, np_ranks=2, env={"OMP_NUM_THREADS": "1"}).stdout
        got = re.search(r"bubble ([\d.]+)% measured, ([\d.]+)% predicted from the measured "
                        r"durations, ([\d.]+)% by the formula", out)
        if got is None:
            checks.check(f"pp=2 [1, 5] run {k}: measured bubble = predicted", False, "no report")
            continue
        measured, predicted, formula = (float(x) for x in got.groups())
        checks.check(f"pp=2 [1, 5] run {k}: measured bubble = predicted + messages",
                     predicted - 0.5 <= measured <= predicted + BUBBLE_TOL,
                     f"measured {measured}%, predicted {predicted}% (tolerance +{BUBBLE_TOL} "
                     f"points), formula at equal costs {formula}%")


def test_timeline(tmp):
    p, m = 2, 4
    zb_h1 = 100.0 * (1 - 3 * m / max(3 * m + p - 1, 2 * m + 2 * p - 1))
    for schedule, lists, formula, exact in (
            ("1f1b", one_f_one_b_lists(p, m), 100.0 * (p - 1) / (m + p - 1), True),
            ("zb-h1", zb_h1_lists(p, m), zb_h1, False)):
        _, _, _, out = train(tmp, f"timeline_{schedule}", 4, m, 2, pp=p, schedule=schedule,
                             extra=["--log.pipeline_timeline=true"])
        check_timeline(schedule, p, m, out, lists, formula, exact)


def test_refused(tmp):
    sec = base_sections(tmp, 2)
    del sec["init"]
    sec["model"] = {"n_layer": 4, "n_head": NH, "d_model": C, "seq_len": T, "vocab_size": V}
    sec["parallel"] = {"pp": 3}
    check_refused(checks, tmp, "n_layer not a multiple of pp", sec, 3,
                  ["n_layer = 4 is not a multiple of pp*v = 3*1 = 3"])
    sec["parallel"] = {"pp": 2, "pp_schedule": "zb-h1"}
    sec["train"]["recompute"] = "gelu"
    check_refused(checks, tmp, "zb-h1 with recompute", sec, 2,
                  ['[train] recompute = "gelu" with [parallel] pp_schedule = "zb-h1"',
                   'set recompute = "none"'])
    sec["train"]["recompute"] = "none"
    sec["parallel"] = {"pp": 2, "pp_layers": [1, 2]}
    check_refused(checks, tmp, "pp_layers not summing to n_layer", sec, 2,
                  ["[parallel] pp_layers sums to 3 blocks, but [model] n_layer = 4"])
    sec["parallel"] = {"pp": 2, "pp_layers": [1, 3], "pp_balance": "auto"}
    check_refused(checks, tmp, "pp_layers with pp_balance auto", sec, 2,
                  ['pp_layers and pp_balance = "auto" both say'])
    path = os.path.join(tmp, "bad.csv")
    with open(path, "w") as f:
        f.write("# B before F\n0,B,0,0\n0,F,0,0\n1,F,0,0\n1,B,0,0\n")
    sec["parallel"] = {"pp": 2, "pp_schedule": "file:" + path}
    sec["train"]["grad_accum"] = 1
    check_refused(checks, tmp, "a user schedule with a backward before its forward", sec, 2,
                  [f"pipeline schedule file {path}:2: the backward of micro-batch 0 chunk 0 on "
                   "rank 0 comes before its forward"])


def main():
    rng = seeded_rng("test_pipeline")
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=4, NH=NH, C=C, T=T, V=V, model=False)
        test_schedules(tmp)
        test_split_schedules(tmp)
        test_split_with_other_axes(tmp)
        test_uneven_stages(tmp)
        test_file_schedule(tmp)
        test_with_other_axes(tmp)
        test_checkpoints(tmp)
        test_timeline(tmp)
        test_bubble_asserted(tmp)
        test_refused(tmp)
    checks.report()


if __name__ == "__main__":
    main()
