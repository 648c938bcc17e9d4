#!/usr/bin/env python3
"""tools/cp_comm_table.py - the ring against the all-to-all (Ulysses) and the hybrid, by the
planner's bytes: for Llama-3 8B (configs/llama3_8b.toml, bf16, micro-batch 1, tp 1, no recompute)
at 32K and 128K tokens and cp 2 .. 32, runs `./train_cpu CONFIG --plan-json` (dry: the planner
runs the real training step and counts every collective, training/plan.cu) with [parallel]
cp_comm = "ring", "all-to-all" and "hybrid" (cp_a2a = min(8, cp/2): all-to-all inside a node
of 8), and prints a markdown table of rank 0's context-parallel bytes per layer (forward and
backward): the payload the comm accounting counts and the wire bytes a rank sends (the
all-to-all's (a-1)/a, each point-to-point send whole). docs/SCALING.md holds the table.

  tools/cp_comm_table.py [--train ./train_cpu] [--check]

--check (test group cp-comm-table): plans the 32K rows up to cp 8 and takes the other cells from
the header formulas (parallel/context_parallel_a2a.cu for the all-to-all, cp_bytes of
parallel/context_parallel_plan.h for the ring, linear in the tokens); exit 1 unless every
planned number equals the formulas and docs/SCALING.md's table equals the one printed. (Without
--check every cell is planned; all 28 plans equal the formulas.)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "llama3_8b.toml")
SEQ_LENS = (32768, 131072)
CPS = (2, 4, 8, 16, 32)
MB = 1e6
ELEM = 2  # bf16


def plan(train, T, cp, comm, a2a, tmp):
    path = os.path.join(tmp, "plan.json")
    args = [train, CONFIG, "--plan-json", path, f"--model.seq_len={T}", f"--parallel.cp={cp}",
            f"--parallel.cp_comm={comm}", "--train.grad_accum=1", "--train.recompute=none",
            "--plan.memory_gib=1000000"]
    if comm == "hybrid":
        args.append(f"--parallel.cp_a2a={a2a}")
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    with open(path) as f:
        return json.load(f)["ranks"][0]["comm"]


def measured(comm, cp, a2a):
    """Payload and wire bytes per step on the context-parallel axes."""
    payload = wire = 0
    for axis, n in (("cp", cp), ("cp-a2a", a2a), ("cp-ring", cp // max(a2a, 1))):
        kinds = comm.get(axis, {})
        if "all_to_all" in kinds:
            size = cp if axis == "cp" else n
            payload += kinds["all_to_all"]["bytes"]
            wire += kinds["all_to_all"]["bytes"] * (size - 1) / size
        if "send" in kinds:
            payload += kinds["send"]["bytes"]
            wire += kinds["send"]["bytes"]
    return payload, wire


def formula(model, T, cp, a):
    """The headers' bytes per layer: the all-to-all of a ranks, then the ring of cp/a ranks;
    (payload, wire)."""
    HS = model["d_model"] // model["n_head"]
    C, nkv = model["d_model"], model["n_kv_head"]
    N = T // cp
    payload = wire = 0
    if a > 1:  # 3 N (C + 2K) b + 3 N C b, K = the kv channels sent
        K = nkv * HS if nkv % a == 0 else a * HS
        part = (3 * N * (C + 2 * K) + 3 * N * C) * ELEM
        payload, wire = part, part * (a - 1) / a
    R = cp // a
    if R > 1:  # cp_bytes(R, 1, T, Ckv): K, V forward and backward, dK, dV in fp32
        ckv = (nkv // a if nkv % a == 0 else 1) * HS
        elems = 2 * 2 * (T // (2 * R)) * ckv
        part = 2 * (R - 1) * elems * ELEM + R * elems * 4
        payload, wire = payload + part, wire + part
    return payload, wire


def rows(train, planned):
    """The table's cells: planned (and checked against the formulas) where planned(T, cp),
    else the formulas' numbers. Returns (rows, mismatches, plans run)."""
    with open(CONFIG, "rb") as f:
        model = tomllib.load(f)["model"]
    L = model["n_layer"]
    out, bad, plans = [], [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for T in SEQ_LENS:
            for cp in CPS:
                cells = {}
                for comm, a in (("ring", 1), ("all-to-all", cp), ("hybrid", min(8, cp // 2))):
                    if comm == "hybrid" and not 1 < a < cp:
                        continue
                    payload, wire = (x * L for x in formula(model, T, cp, a))
                    if planned(T, cp):
                        plans += 1
                        got = measured(plan(train, T, cp, comm, a, tmp), cp,
                                       a if comm == "hybrid" else 0)
                        if got[0] != payload:
                            bad.append(f"T={T} cp={cp} {comm}: plan {got[0]} bytes, formula "
                                       f"{payload}")
                        payload, wire = got
                    cells[comm] = (payload / L, wire / L, a)
                out.append((T, cp, cells))
    return out, bad, plans


def markdown(table):
    lines = ["| tokens | cp | ring: payload / wire MB | all-to-all: payload / wire MB | "
             "hybrid (cp_a2a): payload / wire MB | fewest wire bytes |",
             "|---|---|---|---|---|---|"]
    for T, cp, cells in table:
        def cell(comm):
            if comm not in cells:
                return "-"
            p, w, a = cells[comm]
            return f"{p / MB:.0f} / {w / MB:.0f}" + (f" ({a})" if comm == "hybrid" else "")
        best = min(cells, key=lambda c: cells[c][1])
        lines.append(f"| {T // 1024}K | {cp} | {cell('ring')} | {cell('all-to-all')} | "
                     f"{cell('hybrid')} | {best} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", default=os.path.join(ROOT, "train_cpu"))
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    # --check plans the 32K rows up to cp 8 (the test's time) and takes the rest from the
    # formulas those plans confirm; without it every cell is planned.
    quick = lambda T, cp: T == SEQ_LENS[0] and cp <= 8  # noqa: E731
    table, bad, plans = rows(args.train, quick if args.check else lambda T, cp: True)
    text = markdown(table)
    print(text)
    if not args.check:
        return
    for line in bad:
        print("FAIL", line)
    with open(os.path.join(ROOT, "docs", "SCALING.md")) as f:
        in_docs = text in f.read()
    print(("ok  " if in_docs else "FAIL") + " docs/SCALING.md holds this table")
    print(("ok  " if not bad else "FAIL") + f" planned bytes = the header formulas "
          f"({plans} plans)")
    sys.exit(0 if in_docs and not bad else 1)


if __name__ == "__main__":
    main()
