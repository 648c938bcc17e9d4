"""bench/slow_links.py - does training over slow links still converge? The demo model
(configs/demo.toml: 4 layers, 128 wide, GPT-2 vocabulary, fortunes) trained on dp ranks with the
uncompressed DDP all-reduce, with each [parallel] grad_compression, and with DiLoCo islands
(--islands K, meeting every --every H steps; one island per rank at K = np), at equal tokens;
the final validation loss and the bytes per step side by side (DiLoCo's outer all-reduce
amortised over its H steps), and the validation curves plotted.

    python3 bench/slow_links.py [--steps 1000] [--np 2] [--micro-batch 8] [--seq-len 64]
                                [--val-every 50] [--islands 2] [--every 50] [--out docs]
                                [--bin ./train_cpu] [--reuse]

--data DIR --vocab V train on another tokenisation of the corpus (DIR/fortunes_{train,val}_*.bin,
e.g. the byte-level one of tools/prepare_fortunes.sh, vocabulary 257). --bin names the trainer binary (copy it aside to keep rebuilding while the runs go on). --only N
trains run N alone (several side by side on a shared machine), --reuse then reports them all.

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


def diloco_args(args):
    return [f"--parallel.diloco_islands={args.islands}", f"--parallel.diloco_every={args.every}"]


def train(name, extra, args):
    metrics = os.path.join(args.work, f"{name}.jsonl")
    if args.reuse and os.path.exists(metrics):
        return read(metrics, args)
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = MPIRUN + ["-np", str(args.np), args.bin, "configs/demo.toml",
                    f"--train.steps={args.steps}", f"--parallel.dp={args.np}",
                    f"--train.micro_batch={args.micro_batch}", f"--model.seq_len={args.seq_len}",
                    f"--train.warmup_steps={max(1, args.steps // 30)}",
                    f"--log.val_every={args.val_every}", "--log.sample_every=0",
                    f"--log.every={args.val_every}", f"--log.metrics={metrics}", *extra]
    if args.data:
        cmd += [f"--data.train={args.data}/fortunes_train_*.bin",
                f"--data.val={args.data}/fortunes_val_*.bin",
                f"--data.tokenizer={args.data}/tokenizer.bin", f"--model.vocab_size={args.vocab}"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL,
                   env=dict(os.environ, OMP_NUM_THREADS="1"))
    return read(metrics, args)


def read(metrics, args):
    """(validation curve, payload bytes per step, wire bytes per step per rank): the dp axis of
    the last step plus the island axis's outer all-reduce of the last step (a multiple of H when
    --steps is) divided by H."""
    steps, vals = [], []
    with open(metrics) as f:
        for line in f:
            r = json.loads(line)
            if "val_loss" in r:
                vals.append((r["step"], r["val_loss"]))
            elif "loss" in r:
                steps.append(r)
    comm = steps[-1].get("comm", {})
    payload = wire = 0.0
    # (axis, ranks in its group, steps it is amortised over)
    for axis, n, per in (("dp", args.np // max(1, args.islands_of_run), 1),
                         ("island", args.islands_of_run, args.every)):
        # a ring's wire bytes per rank (parallel/comm.h): 2(N-1)/N of an all-reduce, (N-1)/N else
        f = (n - 1) / n if n > 0 else 0
        for kind, k in comm.get(axis, {}).items():
            payload += k["bytes"] / per
            wire += k["bytes"] * (2 * f if kind == "all_reduce" else f) / per
    return vals, payload, wire


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--val-every", type=int, default=50)
    p.add_argument("--islands", type=int, default=2, help="DiLoCo islands (0: no DiLoCo run)")
    p.add_argument("--every", type=int, default=50, help="DiLoCo: inner steps per outer step")
    p.add_argument("--bin", default="./train_cpu")
    p.add_argument("--data", default="", help="a folder of fortunes shards (default: the demo's)")
    p.add_argument("--vocab", type=int, default=50257, help="with --data: its vocabulary")
    p.add_argument("--out", default="docs")
    p.add_argument("--work", default="build/slow_links")
    p.add_argument("--only", type=int, default=-1, help="train only run N (0-based), no report")
    p.add_argument("--reuse", action="store_true", help="report the runs already in --work")
    args = p.parse_args()
    os.makedirs(args.work, exist_ok=True)
    runs = list(RUNS)
    if args.islands >= 1:
        runs.append((f"DiLoCo K = {args.islands}, H = {args.every}", diloco_args(args)))
    results = []
    for i, (label, extra) in enumerate(runs):
        args.islands_of_run = args.islands if "DiLoCo" in label else 0
        if args.only >= 0 and i != args.only:
            continue
        vals, payload, wire = train(f"run{i}", extra, args)
        results.append((label, vals, payload, wire))
        print(f"{label}: final val loss {vals[-1][1]:.4f}, dp payload {payload}, wire {wire:.0f}",
              flush=True)
    if args.only >= 0:
        return
    base = results[0][3]
    print("\n| run | final val loss | payload bytes / step | wire bytes / step / rank | "
          "wire vs fp32 |")
    print("|---|---|---|---|---|")
    for label, vals, payload, wire in results:
        print(f"| {label} | {vals[-1][1]:.4f} | {payload:,.0f} | {wire:,.0f} | "
              f"{wire / base:.3f} |")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, vals, _, _ in results:
        ax.plot([s for s, _ in vals], [v for _, v in vals], label=label, marker=".")
    ax.set_xlabel("step (equal tokens per step in every run)")
    ax.set_ylabel("validation loss")
    vocab = f", vocabulary {args.vocab}" if args.data else ""
    ax.set_title(f"demo model{vocab}, dp = {args.np}, micro_batch {args.micro_batch}, seq_len "
                 f"{args.seq_len}, CPU backend", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = os.path.join(args.out, "slow_links.png")
    fig.savefig(path, dpi=110)
    print(f"\nplot: {path}")


if __name__ == "__main__":
    main()
