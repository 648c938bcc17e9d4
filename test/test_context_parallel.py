"""test/test_context_parallel.py - context parallelism (ring attention) against the one-rank run.

A tiny GPT (L = 2, 2 heads, C = 32, T = 16), 20 steps at lr 1e-3, global batch 4 sequences; the
one-rank run with the same batch is the reference.
1. cp = 2 and 4 from random init and from an llm.c model file: per-step losses and gradient
   norms within 3e-6 relative, the validation loss within 3e-6, the sampled tokens identical
   (the cp rank holding the last position samples); bf16 at cp = 2 against one-rank bf16:
   losses within 8e-4, gradient norms within 2e-2, about 10x the worst of 6 seeds (7.9e-5,
   1.9e-3: attention's blocks are merged in another order and rounded to bf16).
2. dp2 x cp2 with FSDP, tp2 x cp2 with sequence parallelism, pp2 x cp2: within 3e-6 (every
   axis at once: test_matrix.py).
3. Communication per step on rank 0 equals the analytic ring exactly: on the cp axis, per layer,
   cp-1 transfers of K, V forward, cp-1 again backward and cp of dK, dV (fp32); the dense
   gradients' all-reduce over dp x cp ("dp*cp" axis) once per unit.
4. Activation bytes per rank at cp = 4 are between 0.25 and 0.32 of cp = 1's (every
   per-token buffer scales as T/cp; the ring's K, V and dK, dV buffers add a few percent).
5. A dp2 x cp2 FSDP checkpoint at step 10 resumes on one rank within 1e-5 of the uninterrupted
   run.
6. Refused before any work: seq_len not a multiple of 2 * cp.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainer import (Checks, base_sections, check_refused, compare_runs,  # noqa: E402
                     make_experiment, max_rel, read_metrics, read_run_info, run, seeded_rng,
                     with_validation, write_config)

checks = Checks("test_context_parallel")
L, NH, C, T, V = 2, 2, 32, 16, 101
GLOBAL_ROWS, STEPS = 4, 20
# Layouts against the one-rank run (1. and 2.): fp32 sums in another order only; measured <= 2.7e-7
# (losses, norms, validation loss) over 2 seeds here and in test_pipeline.py.
LAYOUT_TOL = 3e-6


def round_up(x, m):
    return (x + m - 1) // m * m


def unit_numels():
    """Flat lengths of the root and a block, tensors 64-aligned (model/gpt.cu's order)."""
    root = [128 * C, T * C, C, C]
    block = [3 * C * C, C * C, 4 * C * C, 4 * C * C, 3 * C, 4 * C, C, C, C, C, C, C]
    return [sum(round_up(n, 64) for n in sizes) for sizes in [root] + [block] * L]


def expected_comm(cp, B, dtype_bytes=4):
    """cp and dp*cp axis counters of one step (grad_accum 1, DDP, dp 1, tp 1)."""
    kv = B * (T // cp) * 2 * C  # K and V of this rank's two chunks
    calls = L * (2 * (cp - 1) + cp)
    nbytes = L * (2 * (cp - 1) * kv * dtype_bytes + cp * kv * 4)
    units = unit_numels()
    return {"cp": {"send": {"calls": calls, "bytes": nbytes},
                   "recv": {"calls": calls, "bytes": nbytes}},
            "dp*cp": {"all_reduce": {"calls": len(units), "bytes": 4 * sum(units)}}}


def train(tmp, name, cp=1, dp=1, tp=1, pp=1, fsdp=False, dtype="fp32", from_file=False,
          ckpt=None):
    sec = base_sections(tmp, STEPS, micro_batch=GLOBAL_ROWS // dp)
    if not from_file:
        del sec["init"]
        sec["model"] = {"n_layer": L, "n_head": NH, "d_model": C, "seq_len": T, "vocab_size": V}
        sec["train"]["seed"] = 99
    sec["parallel"] = {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "fsdp": fsdp}
    sec["precision"] = {"compute": dtype}
    sec["log"]["metrics"] = os.path.join(tmp, f"{name}.jsonl")
    sec["log"].update({"sample_every": STEPS, "sample_tokens": 8})
    with_validation(sec, tmp, STEPS, 2)
    if ckpt:
        sec["checkpoint"] = ckpt
    world = dp * tp * pp * cp
    r = run(write_config(tmp, f"{name}.toml", sec), np_ranks=world if world > 1 else 0)
    steps, vals = read_metrics(sec["log"]["metrics"])
    sample = r.stdout.split("| sample:\n")[-1].split("\n---")[0]
    return steps, vals, sample, read_run_info(sec["log"]["metrics"])


def test_against_one_rank(tmp):
    ref = train(tmp, "one")
    for cp in (2, 4):
        got = train(tmp, f"cp{cp}", cp=cp)
        compare_runs(checks, f"cp={cp}", got, ref, LAYOUT_TOL)
        want = expected_comm(cp, GLOBAL_ROWS)
        comm = [{k: s["comm"][k] for k in ("cp", "dp*cp") if k in s["comm"]} for s in got[0]]
        checks.check(f"cp={cp}: comm per step", all(c == want for c in comm),
                     f"{comm[0]} (analytic {want})")
        if cp == 4:
            ratio = got[3]["activation_bytes"] / ref[3]["activation_bytes"]
            checks.check("cp=4 activation bytes per rank vs cp=1", 0.25 <= ratio <= 0.32,
                         f"{got[3]['activation_bytes']} / {ref[3]['activation_bytes']} = "
                         f"{ratio:.3f}")
    for what, name, kw in [("dp2 x cp2 FSDP", "dp2cp2", {"dp": 2, "fsdp": True}),
                           ("tp2 x cp2 sp", "tp2cp2", {"tp": 2}),
                           ("pp2 x cp2", "pp2cp2", {"pp": 2})]:
        compare_runs(checks, what, train(tmp, name, cp=2, **kw), ref, LAYOUT_TOL)
    b1 = train(tmp, "one_bf16", dtype="bf16")
    b2 = train(tmp, "cp2_bf16", cp=2, dtype="bf16")
    r = max_rel([s["loss"] for s in b2[0]], [s["loss"] for s in b1[0]])
    n = max_rel([s["grad_norm"] for s in b2[0]], [s["grad_norm"] for s in b1[0]])
    checks.check("bf16 cp=2 losses and norms", r < 8e-4 and n < 2e-2,
                 f"max rel err {r:.2e}, {n:.2e} vs one-rank bf16 (tolerances 8e-4, 2e-2)")


def test_llmc_file(tmp):
    ref = train(tmp, "file_one", from_file=True)
    for cp in (2, 4):
        compare_runs(checks, f"llm.c file, cp={cp}",
                     train(tmp, f"file_cp{cp}", cp=cp, from_file=True), ref, LAYOUT_TOL)


def test_checkpoint(tmp):
    d = os.path.join(tmp, "ck")
    saved = train(tmp, "ck_dp2cp2", cp=2, dp=2, fsdp=True, ckpt={"dir": d, "every": 10})
    resumed = train(tmp, "ck_one", ckpt={"dir": d, "resume": os.path.join(d, "step_000010")})
    r = max_rel([s["loss"] for s in resumed[0]], [s["loss"] for s in saved[0][10:]])
    checks.check("dp2 x cp2 FSDP save at step 10 resumed on one rank",
                 len(resumed[0]) == 10 and r < 1e-5,
                 f"steps 11-20 max rel err {r:.2e} vs the uninterrupted run")


def test_refused(tmp):
    sec = base_sections(tmp, 2)
    del sec["init"]
    sec["model"] = {"n_layer": L, "n_head": NH, "d_model": C, "seq_len": T, "vocab_size": V}
    sec["parallel"] = {"cp": 3}
    check_refused(checks, tmp, "seq_len not a multiple of 2*cp", sec, 3, ["seq_len", "cp"])


def main():
    rng = seeded_rng("test_context_parallel")
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=L, NH=NH, C=C, T=T, V=V)
        test_against_one_rank(tmp)
        test_llmc_file(tmp)
        test_checkpoint(tmp)
        test_refused(tmp)
    checks.report()


if __name__ == "__main__":
    main()
