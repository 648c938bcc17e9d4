#!/usr/bin/env python3
"""bench/reduce_dtype_losses.py - what bf16 gradient reductions ([parallel] reduce_dtype = "bf16",
parallel/reduce_dtype.cu) do to the losses: the demo model (configs/demo.toml) trained twice at
dp 2 under mpirun, once with fp32 reductions and once with bf16, same seed and data order, and the
per-step losses compared. Prints the largest |loss difference| and the step it occurs at, the mean
relative difference, the last 20 steps' mean of each run, and the loss at a few steps
(docs/PERF.md records a run of it). A measurement, not a test: nothing here passes or fails.

  bench/reduce_dtype_losses.py [--train ./train_cpu] [--steps 200] [--np 2] [--zero 0]
                               [--micro-batch 4] [--seq-len 32] [--keep DIR]

Each rank reduces its gradient bucket (DDP's all-reduce at --zero 0; the ZeRO stages'
reduce-scatters otherwise) over the dp group; in bf16 each rank's fp32 gradient and every partial
sum are rounded to bf16, half the bytes. The global batch is np x micro_batch sequences of
seq_len tokens; validation, samples and the eval are off so that only training runs.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]


def losses(args, dtype, out_dir):
    metrics = os.path.join(out_dir, f"{dtype}.jsonl")
    cmd = MPIRUN + ["-np", str(args.np), args.train, os.path.join(ROOT, "configs", "demo.toml"),
                    f"--train.steps={args.steps}", "--log.every=1", "--log.val_every=0",
                    "--log.sample_every=0", "--eval.every=0", "--eval.file=",
                    f"--train.micro_batch={args.micro_batch}", f"--model.seq_len={args.seq_len}",
                    f"--parallel.dp={args.np}", f"--parallel.zero={args.zero}",
                    f"--parallel.reduce_dtype={dtype}", f"--log.metrics={metrics}"]
    print(" ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    by_step = {}
    with open(metrics) as f:
        for line in f:
            r = json.loads(line)
            if "step" in r and "loss" in r:
                by_step[r["step"]] = r["loss"]
    return [by_step[s] for s in sorted(by_step)]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train", default="./train_cpu")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--zero", type=int, default=0)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--keep", help="directory for the two metrics files (default: a temporary one)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = args.keep or tmp
        os.makedirs(out, exist_ok=True)
        fp32, bf16 = losses(args, "fp32", out), losses(args, "bf16", out)
    n = min(len(fp32), len(bf16))
    diff = [abs(a - b) for a, b in zip(fp32[:n], bf16[:n])]
    worst = max(range(n), key=lambda i: diff[i])
    first = next((i for i in range(n) if diff[i] > 0), None)
    tail = min(20, n)
    print(f"dp {args.np}, zero {args.zero}, {n} steps, micro_batch {args.micro_batch}, "
          f"seq_len {args.seq_len}")
    print(f"max |loss(bf16) - loss(fp32)| = {diff[worst]:.4f} at step {worst + 1} "
          f"({100 * diff[worst] / fp32[worst]:.2f}% of {fp32[worst]:.4f})")
    print(f"mean relative difference {100 * sum(d / a for d, a in zip(diff, fp32)) / n:.2f}%; "
          f"first difference at step {first + 1 if first is not None else '-'}")
    print(f"mean of the last {tail} steps: fp32 {sum(fp32[-tail:]) / tail:.4f}, "
          f"bf16 {sum(bf16[-tail:]) / tail:.4f}")
    print("| step | fp32 reductions | bf16 reductions |\n|---|---|---|")
    for s in sorted({1, 10, n // 4, n // 2, 3 * n // 4, n} - {0}):
        print(f"| {s} | {fp32[s - 1]:.4f} | {bf16[s - 1]:.4f} |")


if __name__ == "__main__":
    main()
