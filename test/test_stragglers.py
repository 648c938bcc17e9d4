#!/usr/bin/python3
"""test/test_stragglers.py - the straggler report ([log] straggler_every, straggler_factor;
training/health.h).

100 steps, a report every 25, straggler_factor = 1.5:
1. Balanced: GPT-2 (L=2, NH=4, C=64, T=32, V=101) at dp = 2 (mpirun -np 2: one rank per core
   here; oversubscribed, the scheduler itself makes stragglers), both ranks doing the same work:
   a report line every 25 steps ("steps 1-25" .. "steps 76-100"), each naming the slowest and
   the fastest rank (rank and host) with their busy milliseconds per step and the median of the
   ranks; no rank is named a straggler.
2. Unbalanced, as a slow device would be: the model with 3 layers and a vocabulary of 4096 over
   a pipeline of 3 stages (mpirun -np 3, 3 micro-batches). The last stage (rank 2) also
   computes the 4096-wide head and the loss: every step it is busy about twice as long as the
   median rank (measured 2.1-2.4x); the other stages wait for it in the pipeline's messages,
   which is not busy time. Every report names rank 2 the slowest, and rank 2, and only it, a
   straggler.
What this cannot show: a rank slowed from outside (SIGSTOP, a CPU hog on its core) is slow in
its MPI progress too, so much of its slowness is counted as waiting (training/health.h).
"""
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainer import (Checks, base_sections, make_experiment, run, seeded_rng,  # noqa: E402
                     write_config)

checks = Checks("test_stragglers")
STEPS, EVERY = 100, 25


def reports(text):
    """[(first, last, slowest rank, fastest rank)] of the report lines, and the straggler lines'
    (rank, first step of the window)."""
    rep = [(int(m[1]), int(m[2]), int(m[3]), int(m[4])) for m in re.finditer(
        r"^ranks +steps (\d+)-(\d+), busy ms per step .*?slowest rank (\d+) \(.*?fastest rank "
        r"(\d+) \(", text, re.M)]
    strag = [(int(m[1]), int(m[2])) for m in re.finditer(
        r"^straggler rank (\d+) \(.*?over steps (\d+)-", text, re.M)]
    return rep, strag


def experiment(tmp, rng, V):
    make_experiment(tmp, rng, L=2, NH=4, C=64, T=32, V=V, n_tokens=40000, model=False)
    sec = base_sections(tmp, STEPS, micro_batch=1)
    del sec["init"]
    sec["model"] = {"n_layer": 2, "n_head": 4, "d_model": 64, "seq_len": 32, "vocab_size": V}
    sec["log"].update({"metrics": "", "every": 25, "straggler_every": EVERY,
                       "straggler_factor": 1.5})
    return write_config(tmp, "c.toml", sec)


def main():
    rng = seeded_rng("test_stragglers")
    windows_want = [(s - EVERY + 1, s) for s in range(EVERY, STEPS + 1, EVERY)]
    with tempfile.TemporaryDirectory() as tmp:
        r = run(experiment(tmp, rng, 101), ["--parallel.dp=2"], np_ranks=2, check=False,
                timeout=300)
        rep, strag = reports(r.stdout)
        checks.check("balanced dp = 2: a report every 25 steps, no straggler",
                     r.returncode == 0 and [w[:2] for w in rep] == windows_want and not strag,
                     f"exit {r.returncode}, windows {[w[:2] for w in rep]}, stragglers {strag}: "
                     f"{next((l for l in r.stdout.splitlines() if l.startswith('ranks')), '')}")
    with tempfile.TemporaryDirectory() as tmp:
        r = run(experiment(tmp, rng, 4096), ["--parallel.pp=3", "--train.grad_accum=3",
                                             "--model.n_layer=3"], np_ranks=3, check=False,
                timeout=300)
        rep, strag = reports(r.stdout)
        slowest_ok = all(w[2] == 2 for w in rep)
        named = sorted(strag)
        want = [(2, first) for first, _ in windows_want]
        checks.check("pp = 3 with the head on the last stage: rank 2 the slowest and a straggler "
                     "in every report, no other rank",
                     r.returncode == 0 and [w[:2] for w in rep] == windows_want and slowest_ok and
                     named == want, f"exit {r.returncode}, slowest/fastest "
                     f"{[(w[2], w[3]) for w in rep]}, stragglers {named}: "
                     f"{next((l for l in r.stdout.splitlines() if l.startswith('straggler')), '')}")
    checks.report()


if __name__ == "__main__":
    main()
