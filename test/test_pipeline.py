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
   stage group; the backward casts each micro-batch's input with its own scale): the gradient
   norms of the first 6 steps within 1e-6 (measured <= 8e-8 over 16 seeds: only the tied wte's
   gradient is summed in another order, head and embedding parts on two stages), the losses of
   all 20 steps within 2e-3 (measured up to 1.5e-4 in fp8 and 3.2e-5 in bf16: after some steps
   such 1e-7 differences flip a bf16 or FP8 code now and then, and Adam carries it on). A backward
   that casts with the last forward's scale (another micro-batch's) moves the fp8 norms by 3e-3
   from step 1. dp2 x pp2 with FSDP and with DDP,
   tp2 x pp2 with sequence parallelism, and dp2 x tp2 x pp2 at np = 8 within 3e-6 (LAYOUT_TOL:
   about 10x the worst measured over 2 seeds, 2.1e-7 here and 2.7e-7 in test_context_parallel).
4. Checkpoints reshard across pp: a dp2 x pp2 FSDP save at step 10 resumed on one rank, and a
   one-rank save resumed at pp4 x tp2 (np = 8), continue within 1e-5 of the uninterrupted runs.
5. The measured bubble report and the ASCII timeline ([log] pipeline_timeline): one line per pp
   rank holding each of its m forwards and m backwards.
6. Refused before any work: n_layer not a multiple of pp (the pipeline-schedule rules of
   [parallel] pp_schedule and pp_virtual are checked in test_distributed.py).
"""
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainer import (Checks, base_sections, check_refused, compare_runs,  # noqa: E402
                     make_experiment, max_rel, read_metrics, run, seeded_rng, with_validation,
                     write_config)

checks = Checks("test_pipeline")
NH, C, T, V = 2, 32, 16, 101
Vp = 128
GLOBAL_ROWS, STEPS = 8, 20
LAYOUT_TOL = 3e-6  # layouts vs one rank, fp32: measured <= 2.1e-7 over 2 seeds


def round_up(x, m):
    return (x + m - 1) // m * m


def root_numel(tp=1):
    """The root unit's flat length: wte (Vp/tp rows), wpe, ln_f weight and bias, 64-aligned."""
    return sum(round_up(n, 64) for n in [Vp // tp * C, T * C, C, C])


def expected_comm(p, v, m, B, dp=1, tp=1, sp=True, fsdp=False, dtype_bytes=4, rank=0):
    """pp and embed axis counters of one step on pp rank `rank`."""
    msg = B * T * C * dtype_bytes // (tp if sp else 1)
    sends = recvs = 0
    for chunk in range(v):
        stage = chunk * p + rank
        if stage < p * v - 1:
            sends, recvs = sends + m, recvs + m  # activation forward, gradient back
        if stage > 0:
            sends, recvs = sends + m, recvs + m
    out = {"pp": {"send": {"calls": sends, "bytes": sends * msg},
                  "recv": {"calls": recvs, "bytes": recvs * msg}}}
    shard = round_up(root_numel(tp), dp * 64) // dp if fsdp else root_numel(tp)
    out["embed"] = {"all_reduce": {"calls": 1, "bytes": 4 * shard}}
    return out


def train(tmp, name, L, m, B, pp=1, schedule="1f1b", v=1, dp=1, tp=1, sp=True, fsdp=False,
          dtype="fp32", extra=(), steps=STEPS, ckpt=None, cp=1, ep=1, moe=None):
    """moe: [model] keys of a mixture of experts (n_experts, top_k, ...), or None: dense."""
    # Adam eps 1e-6, not 1e-8: a rare token's wte gradient (~1e-9) differs between layouts by its
    # reduction order, and with eps 1e-8 Adam turns that noise into steps of up to lr, which
    # drift the gradient norms apart by up to 2e-5 on some datasets (seen in test_matrix).
    sec = base_sections(tmp, steps, micro_batch=B, grad_accum=m, eps=1e-6)
    del sec["init"]
    sec["model"] = {"n_layer": L, "n_head": NH, "d_model": C, "seq_len": T, "vocab_size": V,
                    **(moe or {})}
    sec["train"]["seed"] = 777
    sec["parallel"] = {"dp": dp, "tp": tp, "sp": sp, "fsdp": fsdp, "pp": pp, "cp": cp, "ep": ep,
                       "pp_schedule": schedule, "pp_virtual": v}
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


def test_schedules(tmp):
    L = 4
    for m in (1, 2, 4, 8):
        B = GLOBAL_ROWS // m
        ref = train(tmp, f"one_m{m}", L, m, B)
        for p in (2, 4):
            for schedule in ("1f1b", "gpipe"):
                got = train(tmp, f"pp{p}_{schedule}_m{m}", L, m, B, pp=p, schedule=schedule)
                what = f"pp={p} {schedule} m={m}"
                compare_runs(checks, what, got, ref, LAYOUT_TOL)
                check_comm(what, got[0], expected_comm(p, 1, m, B))
    L = 8
    for m in (4, 8):
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
        norms = max_rel([s["grad_norm"] for s in got[0][:6]], [s["grad_norm"] for s in ref[0][:6]])
        loss = max_rel([s["loss"] for s in got[0]], [s["loss"] for s in ref[0]])
        checks.check(f"{dtype} pp=2: first 6 gradient norms, {STEPS} losses", norms < 1e-6 and
                     loss < 2e-3, f"max rel err {norms:.1e}, {loss:.1e} vs one-rank {dtype} "
                     "(tolerances 1e-6, 2e-3)")
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


def test_timeline(tmp):
    p, m = 2, 4
    _, _, _, out = train(tmp, "timeline", 4, m, 2, pp=p, extra=["--log.pipeline_timeline=true"])
    report = re.search(r"bubble ([\d.]+)% measured, ([\d.]+)% by the formula", out)
    lines = re.findall(r"^pp rank (\d) \|([^|]*)\|$", out, re.M)
    formula = 100.0 * (p - 1) / (m + p - 1)
    ok = (report is not None and abs(float(report.group(2)) - formula) < 0.05 and
          len(lines) == p and all(line.count("F") == m and line.count("B") == m
                                  for _, line in lines))
    checks.check("measured bubble and timeline", ok,
                 (report.group(0) if report else "no bubble line") +
                 f"; {len(lines)} timeline lines")


def test_refused(tmp):
    sec = base_sections(tmp, 2)
    del sec["init"]
    sec["model"] = {"n_layer": 4, "n_head": NH, "d_model": C, "seq_len": T, "vocab_size": V}
    sec["parallel"] = {"pp": 3}
    check_refused(checks, tmp, "n_layer not a multiple of pp", sec, 3,
                  ["n_layer = 4 is not a multiple of pp*v = 3*1 = 3"])


def main():
    rng = seeded_rng("test_pipeline")
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=4, NH=NH, C=C, T=T, V=V, model=False)
        test_schedules(tmp)
        test_with_other_axes(tmp)
        test_checkpoints(tmp)
        test_timeline(tmp)
        test_refused(tmp)
    checks.report()


if __name__ == "__main__":
    main()
