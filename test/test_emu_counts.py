"""test/test_emu_counts.py - holds the CUDA step's counts on the emulated tier (EMU_COUNTS,
test/emu/counts.cpp) to the checked-in table test/emu_counts_table.json: per kernel and per
library call, its launches, global bytes read and written (distinct 32-byte sectors per launch)
and tensor-core FLOPs, for one layer (the counts of a 2-layer model minus a 1-layer one) and for
the whole micro-step and optimizer step of the 2-layer model. A change to any kernel's traffic,
FLOPs or launch count fails here, naming the kernel and the field: update the table on purpose
(`python3 test/test_emu_counts.py --update`) and say why in the commit (docs/PERF.md, "The step
on the emulated tier", reads the same counts at the GPT-2 124M block's width).

The model: bf16, 2 heads of 64 (the flash kernels), d_model 128, T 32, vocab 101, 2 sequences
per micro-step, 2 micro-steps per step, 2 steps (AdamW, the gradient norm and clipping on). The
data are fixed (seed 1): the embedding kernels' bytes depend on which tokens a batch holds (the
distinct rows of wte they read and write; seeds 7 and 12345 differ there and only there), every
other count on the shapes alone.

usage: TRAIN=./train_emu python3 test/test_emu_counts.py [--update]"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trainer  # noqa: E402

TRAIN = os.environ.get("TRAIN", "./train_emu")
TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "emu_counts_table.json")
FIELDS = ("launches", "bytes_read", "bytes_written", "tensor_flops")
LIB_FIELDS = ("calls", "flops", "bytes_read", "bytes_written", "comm_bytes")
SHAPE = dict(NH=2, C=128, T=32, V=101)
B, ACCUM, STEPS = 2, 2, 2


def run_counts(tmp, L):
    sections = trainer.base_sections(tmp, STEPS, micro_batch=B, grad_accum=ACCUM,
                                     weight_decay=0.1, grad_clip=1.0)
    del sections["init"]
    sections["model"] = {"n_layer": L, "n_head": SHAPE["NH"], "d_model": SHAPE["C"],
                         "seq_len": SHAPE["T"], "vocab_size": SHAPE["V"]}
    sections["precision"] = {"compute": "bf16"}
    config = trainer.write_config(tmp, f"L{L}.toml", sections)
    path = os.path.join(tmp, f"counts_L{L}.json")
    env = dict(os.environ, EMU_COUNTS=path, EMU_ORDER="forward", OMP_NUM_THREADS="1")
    out = subprocess.run([TRAIN, config], env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit(out.stdout[-3000:] + out.stderr[-3000:] + f"\n{TRAIN} failed")
    return json.load(open(path))


def rows(phase):
    """{name: [fields]} of one phase's totals, kernels and library calls together."""
    table = {k: [v[f] for f in FIELDS] for k, v in phase["kernels"].items()}
    table.update({k: [v[f] for f in LIB_FIELDS] for k, v in phase["library"].items()})
    return table


def difference(two, one):
    names = sorted(set(two) | set(one))
    diff = {}
    for n in names:
        a, b = two.get(n), one.get(n)
        width = len(a if a else b)
        a, b = a or [0] * width, b or [0] * width
        d = [x - y for x, y in zip(a, b)]
        if any(d):
            diff[n] = d
    return diff


def measure():
    with tempfile.TemporaryDirectory() as tmp:
        trainer.make_experiment(tmp, np.random.default_rng(1), L=2, model=False,
                                n_tokens=STEPS * ACCUM * B * SHAPE["T"] + 1,
                                **{k: SHAPE[k] for k in ("NH", "C", "T", "V")})
        one, two = run_counts(tmp, 1), run_counts(tmp, 2)
    for c in (one, two):
        if (c["steps"], c["micro_steps"]) != (STEPS, STEPS * ACCUM):
            sys.exit(f"counted {c['steps']} steps and {c['micro_steps']} micro-steps, want "
                     f"{STEPS} and {STEPS * ACCUM}")
    micro2, opt2 = rows(two["totals"]["micro_step"]), rows(two["totals"]["optimizer_step"])
    layer = difference(micro2, rows(one["totals"]["micro_step"]))
    return {
        "model": dict(SHAPE, L=2, B=B, grad_accum=ACCUM, steps=STEPS, precision="bf16"),
        "fields": {"kernel": FIELDS, "library": LIB_FIELDS},
        "totals_over": f"{STEPS} steps, {STEPS * ACCUM} micro-steps",
        "layer_micro_steps": layer,
        "micro_steps": micro2,
        "optimizer_steps": opt2,
    }


def compare(got, want):
    bad = 0
    for part in ("layer_micro_steps", "micro_steps", "optimizer_steps"):
        g, w = got[part], want[part]
        for name in sorted(set(g) | set(w)):
            if g.get(name) != w.get(name):
                bad += 1
                print(f"  {part}: {name}: got {g.get(name)}, table {w.get(name)} : FAIL")
    launches = sum(v[0] for n, v in got["layer_micro_steps"].items() if not n.startswith("cublasLt"))
    gemms = sum(v[0] for n, v in got["layer_micro_steps"].items() if n.startswith("cublasLt"))
    print(f"  per layer and micro-step: {launches / STEPS / ACCUM:g} kernel launches, "
          f"{gemms / STEPS / ACCUM:g} cuBLASLt GEMMs")
    return bad


def main():
    got = measure()
    if "--update" in sys.argv:
        with open(TABLE, "w") as f:
            json.dump(got, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"test_emu_counts: wrote {TABLE}")
        return 0
    want = json.load(open(TABLE))
    bad = compare(got, want)
    rows_n = sum(len(got[p]) for p in ("layer_micro_steps", "micro_steps", "optimizer_steps"))
    print(f"test_emu_counts: {rows_n - bad}/{rows_n} rows equal to {os.path.basename(TABLE)}"
          + ("" if not bad else " (a deliberate change: --update, and say why)"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
