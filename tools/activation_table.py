#!/usr/bin/env python3
"""tools/activation_table.py - the planner's activation bytes beside Megatron-LM's formula.

For each documented layout of the GPT-2 774M, 1.5B and 7B configs (the --plan-search answers in
their comments), without and with block recompute, runs `./train_cpu CONFIG --plan-json` (dry:
the planner runs the real training step with counting allocators, training/plan.cu) and prints a
markdown table: pipeline rank 0's activation bytes (the first stage, whose footprint is the
largest, as the formula assumes), Megatron's figure, the extras the formula leaves out, and the
two ratios. docs/SCALING.md explains the formula and each difference.

  tools/activation_table.py [--train ./train_cpu] [--check 1.2] [--recompute none,block]

--check R: exit 1 unless every block-recompute layout has its peak (the larger of the first and
the last stage) / (formula + extras) at most R
(the test: test/run_all.sh group activation-table).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 2**20

# (config, dp, pp, cp, tp, grad_accum): the layouts the configs' comments document
LAYOUTS = [
    ("gpt2_774m", 8, 1, 1, 1, 8), ("gpt2_774m", 8, 4, 1, 2, 8), ("gpt2_774m", 16, 4, 2, 4, 4),
    ("gpt2_1558m", 8, 1, 1, 1, 16), ("gpt2_1558m", 8, 8, 1, 1, 16),
    ("gpt2_1558m", 8, 16, 4, 1, 16),
    ("gpt_7b", 4, 2, 1, 1, 256), ("gpt_7b", 8, 8, 1, 1, 128), ("gpt_7b", 8, 16, 1, 4, 128),
]


def padded_vocab(V):
    return (V + 127) // 128 * 128


def megatron(s, b, h, L, ffn, Vp, p, m, t, recompute):
    """Megatron-LM's theoretical activation bytes of the first pipeline stage (16-bit
    activations, flash attention, sequence parallelism), as its theoretical_memory_usage
    computes them from Korthikanti et al. 2022, Table 2; full (block) recompute keeps each
    layer's input only (2sbh, the paper's full-recomputation row). s: the tokens of a sequence
    this rank holds (seq_len / cp)."""
    per_layer = 2 * s * b * h if recompute == "block" else s * b * h * (18 + 4 * ffn / h)
    act = per_layer * L                       # L/p layers x p micro-batches in flight
    act += 8 * s * b * p + s * b * h * p      # the embedding's input ids and dropout mask
    if p > 1:
        act *= min(1, m / p)                  # fewer micro-batches than stages: fewer in flight
    else:
        act += 4 * s * b * h * (1 + Vp / h)   # the output layer's input and fp32 logits
    return act / t


def extras(s, b, h, ffn, Vp, p, m, t, cp, sp, recompute):
    """What the formula leaves out on pipeline rank 0 (bytes, bf16), by name."""
    a, N = 2, s * b
    Nt = N // t if t > 1 and sp else N
    slots = min(m, p) if p > 1 else 1
    dfch = N * ffn // t * a
    out = {
        "gradient buffer": Nt * h * a,  # pooled: 1F1B's rank 0 holds one (parallel/pipeline.cu)
        "backward scratch": dfch + Nt * h * a + (N * h * a if t > 1 else 0)
        + (N * h * a if t > 1 and sp else 0),
    }
    if p > 1:  # each slot's input in bf16, where the formula counts a 1-byte dropout mask
        out["slot inputs"] = slots * Nt * h * a - s * b * h * p / t
    if recompute == "block":  # the block being recomputed holds all its activations
        out["recomputed block"] = s * b * h * (18 + 4 * ffn / h) / t
    if cp > 1:  # ring attention: K,V twice in bf16 and fp32, a block's output, dq in fp32
        out["ring attention"] = 29 * N * h / t
    return out


def plan(train, config, dp, pp, cp, tp, accum, recompute, tmp):
    path = os.path.join(tmp, "plan.json")
    subprocess.run([train, os.path.join(ROOT, "configs", config + ".toml"), "--plan-json", path,
                    f"--parallel.dp={dp}", f"--parallel.pp={pp}", f"--parallel.cp={cp}",
                    f"--parallel.tp={tp}", f"--train.grad_accum={accum}",
                    f"--train.recompute={recompute}"], check=True, stdout=subprocess.DEVNULL)
    with open(path) as f:
        return json.load(f)


def row(train, layout, recompute, tmp):
    config, dp, pp, cp, tp, accum = layout
    with open(os.path.join(ROOT, "configs", config + ".toml"), "rb") as f:
        cfg = tomllib.load(f)
    mod, tr = cfg["model"], cfg["train"]
    s, b, h, L = mod["seq_len"] // cp, tr["micro_batch"], mod["d_model"], mod["n_layer"]
    ffn, Vp = 4 * h, padded_vocab(mod["vocab_size"])
    pl = plan(train, config, dp, pp, cp, tp, accum, recompute, tmp)
    ranks = pl["ranks"]
    first = max(r["activation_bytes"] for r in ranks if r["pp_rank"] == 0)
    last = max(r["activation_bytes"] for r in ranks if r["pp_rank"] == pp - 1)
    meg = megatron(s, b, h, L, ffn, Vp, pp, accum, tp, recompute)
    ext = extras(s, b, h, ffn, Vp, pp, accum, tp, cp, pl["layout"]["sp"], recompute)
    return {"layout": f"{config} dp{dp} pp{pp} cp{cp} tp{tp} m{accum}", "recompute": recompute,
            "plan": first, "last": last, "megatron": meg, "extras": ext,
            "ratio": first / meg, "ratio_extras": max(first, last) / (meg + sum(ext.values()))}


def markdown(rows):
    out = ["| layout | recompute | plan, pp rank 0 (MiB) | last stage (MiB) | Megatron (MiB) | "
           "plan / Megatron | extras (MiB) | peak plan / (Megatron + extras) |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ext = ", ".join(f"{k} {v / MiB:.0f}" for k, v in r["extras"].items())
        out.append(f"| {r['layout']} | {r['recompute']} | {r['plan'] / MiB:.0f} | "
                   f"{r['last'] / MiB:.0f} | {r['megatron'] / MiB:.0f} | {r['ratio']:.2f} | "
                   f"{ext} | {r['ratio_extras']:.2f} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", default=os.path.join(ROOT, "train_cpu"))
    ap.add_argument("--check", type=float, default=0)
    ap.add_argument("--recompute", default="none,block")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for recompute in args.recompute.split(","):
            for layout in LAYOUTS:
                rows.append(row(args.train, layout, recompute, tmp))
    print(markdown(rows))
    if not args.check:
        return
    bad = [r for r in rows if r["recompute"] == "block" and
           not 0 < r["ratio_extras"] <= args.check]
    for r in bad:
        print(f"FAIL {r['layout']} block: plan / (Megatron + extras) = {r['ratio_extras']:.3f}")
    print(f"activation_table: {len(rows) - len(bad)} of {len(rows)} within {args.check}x"
          if not bad else f"activation_table: {len(bad)} FAILED")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
