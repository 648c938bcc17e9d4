"""test/test_distributed.py - data parallelism (DDP and FSDP) against the one-rank run.

For np = 2 and 4, DDP and FSDP, from a random init (same seed) and from an llm.c model file:
  per-step losses equal the one-rank run with the same global batch within 1e-5 relative over
  20 steps (fp32). The global batch is fixed at 4 sequences: one rank with micro_batch 4, two
  ranks with 2 each, four with 1 each (and a grad-accum variant: 2 ranks x 1 x 2 micro-steps).
Per-rank weights + gradients + optimizer state under FSDP equal the analytic shard size and are
  at most 1/dp of the one-rank figure plus padding.
Communication counted per step equals the analytic value exactly: DDP one fp32 all-reduce per
  unit; FSDP per micro-step an all-gather per block forward, another per block backward, and a
  reduce-scatter per block, and per step one all-gather and one reduce-scatter of the root.
A rank killed mid-run (SIGKILL) makes mpirun exit non-zero within 60 s; bad degree combinations,
  the pipeline schedule's rules ([parallel] pp_schedule, pp_virtual against n_layer and the
  micro-batches of a step) and ep on a dense model are refused before any work.
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainer import (MPIRUN, TRAIN_CPU, Checks, base_sections, check_refused,  # noqa: E402
                     make_experiment, max_rel, read_metrics, read_run_info, run, write_config)
from trainer import round_up, seeded_rng, unit_numels  # noqa: E402

checks = Checks("test_distributed")
L, NH, C, T, V = 2, 3, 36, 16, 101
GLOBAL_ROWS, STEPS = 4, 20


def expected_comm(mode, dp, accum):
    if dp == 1:
        return {}
    units = unit_numels(L, C, T, V)
    if mode == "ddp":
        return {"all_reduce": {"calls": len(units), "bytes": 4 * sum(units)}}
    padded = [round_up(n, dp * 64) for n in units]
    # the root once per step (gathered and reduce-scattered), each block per micro-batch: its
    # forward and its backward gather, one reduce-scatter
    blocks = sum(padded[1:])
    return {"all_gather": {"calls": 1 + accum * 2 * L,
                           "bytes": 4 * (padded[0] + accum * 2 * blocks)},
            "reduce_scatter": {"calls": 1 + accum * L, "bytes": 4 * (padded[0] + accum * blocks)}}


def train(tmp, name, np_ranks, mode, accum=1, from_file=True):
    sec = base_sections(tmp, STEPS, lr=1e-2, micro_batch=GLOBAL_ROWS // np_ranks // accum,
                        grad_accum=accum, weight_decay=0.1, grad_clip=1.0,
                        lr_schedule="cosine", warmup_steps=2, min_lr=1e-3)
    if not from_file:
        del sec["init"]
        sec["model"] = {"n_layer": L, "n_head": NH, "d_model": C, "seq_len": T,
                        "vocab_size": V}
        sec["train"]["seed"] = 4242
    sec["parallel"] = {"dp": np_ranks, "fsdp": mode == "fsdp"}
    sec["log"]["metrics"] = os.path.join(tmp, f"{name}.jsonl")
    run(write_config(tmp, f"{name}.toml", sec), np_ranks=np_ranks if np_ranks > 1 else 0)
    steps, _ = read_metrics(sec["log"]["metrics"])
    return steps, read_run_info(sec["log"]["metrics"])


def test_equivalence(rng, from_file):
    origin = "llm.c model file" if from_file else "random init"
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=L, NH=NH, C=C, T=T, V=V, model=from_file)
        base, base_info = train(tmp, "one", 1, "ddp", from_file=from_file)
        ref_losses = [s["loss"] for s in base]
        for np_ranks, mode, accum in [(2, "ddp", 1), (2, "fsdp", 1), (4, "ddp", 1),
                                      (4, "fsdp", 1), (2, "fsdp", 2)]:
            steps, info = train(tmp, f"{mode}{np_ranks}x{accum}", np_ranks, mode, accum,
                                from_file)
            r = max_rel([s["loss"] for s in steps], ref_losses)
            label = f"{origin}: np={np_ranks} {mode}" + (f" grad_accum={accum}" if accum > 1 else "")
            checks.check(f"{label} losses", len(steps) == STEPS and r < 1e-5,
                         f"max rel err {r:.2e} vs one rank over {STEPS} steps")
            want = expected_comm(mode, np_ranks, accum)
            got = [s["comm"].get("dp", {}) for s in steps]
            checks.check(f"{label} comm", all(g == want for g in got),
                         f"per step {got[0]} (analytic {want})")
            if mode == "fsdp" and from_file:
                units = unit_numels(L, C, T, V)
                shard = sum(round_up(n, np_ranks * 64) // np_ranks for n in units)
                bound = base_info["state_bytes"] / np_ranks + 16 * 64 * len(units)
                checks.check(f"{label} state bytes",
                             info["state_bytes"] == 16 * shard and info["state_bytes"] <= bound,
                             f"{info['state_bytes']} B per rank (one rank {base_info['state_bytes']}"
                             f" B, bound {bound:.0f} B)")


def test_killed_rank(rng):
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=L, NH=NH, C=C, T=T, V=V)
        sec = base_sections(tmp, 1000000, micro_batch=2)
        sec["parallel"] = {"dp": 2}
        cfg = write_config(tmp, "kill.toml", sec)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        proc = subprocess.Popen(MPIRUN + ["-np", "2", TRAIN_CPU, cfg], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env)
        metrics = sec["log"]["metrics"]
        deadline = time.time() + 60
        while time.time() < deadline and not (os.path.exists(metrics) and
                                             os.path.getsize(metrics) > 200):
            time.sleep(0.2)
        pids = subprocess.run(["pgrep", "-f", cfg], capture_output=True, text=True).stdout.split()
        ranks = [int(p) for p in pids if int(p) != proc.pid]
        victim = max(ranks) if ranks else None
        start = time.time()
        if victim:
            os.kill(victim, signal.SIGKILL)
        try:
            out, _ = proc.communicate(timeout=60)
            elapsed, code = time.time() - start, proc.returncode
        except subprocess.TimeoutExpired:
            proc.kill()
            out, elapsed, code = "", 60.0, None
        named = "rank" in out and "signal 9" in out
        checks.check("killed rank ends the job", victim is not None and code not in (0, None)
                     and elapsed < 60 and named,
                     f"mpirun exit {code} {elapsed:.1f} s after SIGKILL of one rank; "
                     f"its message names the rank: {named}")


def test_refused_layouts(rng):
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=L, NH=NH, C=C, T=T, V=V)
        cases = [
            ("dp*tp*pp*cp != world", 2, {"dp": 1}, ["dp", "2"]),
            ("tp must divide n_head", 2, {"tp": 2}, ["n_head", "tp"]),
            ("ep > 1 on a dense model", 2, {"dp": 2, "ep": 2}, ["[parallel] ep = 2", "n_experts"]),
            ("unknown pipeline schedule", 2, {"pp": 2, "pp_schedule": "zigzag"},
             ["pp_schedule", "zigzag"]),
            ("pp_virtual > 1 without interleaving", 2, {"pp": 2, "pp_virtual": 2},
             ["pp_virtual = 2", "needs the \"interleaved\" or \"zb-v\" schedule"]),
            ("interleaved: n_layer % (pp * pp_virtual), micro-batches % pp", 4,
             {"pp": 4, "pp_schedule": "interleaved", "pp_virtual": 2},
             ["n_layer = 2 is not a multiple of pp*v = 4*2 = 8", "multiple of pp = 4"]),
        ]
        for what, np_ranks, par, words in cases:
            sec = base_sections(tmp, 2)
            sec["parallel"] = par
            check_refused(checks, tmp, what, sec, np_ranks, words)


def main():
    rng = seeded_rng("test_distributed")
    test_equivalence(rng, from_file=True)
    test_equivalence(rng, from_file=False)
    test_killed_rank(rng)
    test_refused_layouts(rng)
    checks.report()


if __name__ == "__main__":
    main()
