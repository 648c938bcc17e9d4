"""bench/slow_links.py - does training over slow links still converge? The demo model
(configs/demo.toml: 4 layers, 128 wide, GPT-2 vocabulary, fortunes) trained on dp ranks with the
uncompressed DDP all-reduce and with each [parallel] grad_compression, at equal tokens; the
final validation loss and the dp bytes per step side by side, and the validation curves plotted.

    python3 bench/slow_links.py [--steps 1000] [--np 2] [--micro-batch 8] [--seq-len 64]
                                [--val-every 50] [--out docs] [--reuse]

Writes OUT/slow_links.png and prints a Markdown table (docs/PERF.md has the recorded one). Runs
./train_cpu under mpirun (the CPU backend: the losses are what a GPU would give, the time is not).
"""
import argparse
import json
import os
import subprocess

RUNS = [
    ("DDP fp32 (uncompressed)", []),
    ("int8 + error feedback", ["--parallel.grad_compression=int8"]),
    ("top-k 1% + error feedback", ["--parallel.grad_compression=topk",
                                   "--parallel.topk_ratio=0.01"]),
]
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]


def train(name, extra, args):
    metrics = os.path.join(args.work, f"{name}.jsonl")
    if args.reuse and os.path.exists(metrics):
        return read(metrics, args)
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = MPIRUN + ["-np", str(args.np), "./train_cpu", "configs/demo.toml",
                    f"--train.steps={args.steps}", f"--parallel.dp={args.np}",
                    f"--train.micro_batch={args.micro_batch}", f"--model.seq_len={args.seq_len}",
                    f"--train.warmup_steps={max(1, args.steps // 30)}",
                    f"--log.val_every={args.val_every}", "--log.sample_every=0",
                    f"--log.every={args.val_every}", f"--log.metrics={metrics}", *extra]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL,
                   env=dict(os.environ, OMP_NUM_THREADS="1"))
    return read(metrics, args)


def read(metrics, args):
    """(validation curve, dp payload bytes of the last step, its wire bytes per rank)."""
    steps, vals = [], []
    with open(metrics) as f:
        for line in f:
            r = json.loads(line)
            if "val_loss" in r:
                vals.append((r["step"], r["val_loss"]))
            elif "loss" in r:
                steps.append(r)
    dp = steps[-1].get("comm", {}).get("dp", {})
    payload = sum(k["bytes"] for k in dp.values())
    # a ring's wire bytes per rank (parallel/comm.h): 2(N-1)/N of an all-reduce, (N-1)/N else
    f = (args.np - 1) / args.np
    wire = sum(k["bytes"] * (2 * f if kind == "all_reduce" else f) for kind, k in dp.items())
    return vals, payload, wire


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--val-every", type=int, default=50)
    p.add_argument("--out", default="docs")
    p.add_argument("--work", default="build/slow_links")
    p.add_argument("--reuse", action="store_true", help="report the runs already in --work")
    args = p.parse_args()
    os.makedirs(args.work, exist_ok=True)
    results = []
    for i, (label, extra) in enumerate(RUNS):
        vals, payload, wire = train(f"run{i}", extra, args)
        results.append((label, vals, payload, wire))
        print(f"{label}: final val loss {vals[-1][1]:.4f}, dp payload {payload}, wire {wire:.0f}",
              flush=True)
    base = results[0][3]
    print("\n| run | final val loss | dp payload bytes / step | dp wire bytes / step / rank | "
          "wire vs fp32 |")
    print("|---|---|---|---|---|")
    for label, vals, payload, wire in results:
        print(f"| {label} | {vals[-1][1]:.4f} | {payload:,} | {wire:,.0f} | {wire / base:.3f} |")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, vals, _, _ in results:
        ax.plot([s for s, _ in vals], [v for _, v in vals], label=label, marker=".")
    ax.set_xlabel("step (equal tokens per step in every run)")
    ax.set_ylabel("validation loss")
    ax.set_title(f"demo model, dp = {args.np}, micro_batch {args.micro_batch}, seq_len "
                 f"{args.seq_len}, CPU backend")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = os.path.join(args.out, "slow_links.png")
    fig.savefig(path, dpi=110)
    print(f"\nplot: {path}")


if __name__ == "__main__":
    main()
