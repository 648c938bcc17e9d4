#!/usr/bin/python3
"""tools/plot.py - plots the JSONL metrics of one or more runs ([log] metrics) into one PNG.

    /usr/bin/python3 tools/plot.py metrics.jsonl [more.jsonl ...] -o loss.png

The top panel holds the training loss of every run (a line) and its validation loss (dashed,
with markers), so runs of several layouts or settings compare on one plot. Below: the learning
rate, the gradient norm (before clipping), tokens/s and MFU (a run without a known peak has no
MFU; its panel says so). A run's colour is the same in every panel.

A metrics file is appended to, so it may hold several runs, each starting with its {"run": ...}
record (a resumed run, or the same command run twice): each is plotted as its own line, named
"<file> #2" and so on. Needs matplotlib (Debian: python3-matplotlib); it draws without a display.
"""
import argparse
import json
import os
import sys


def read_runs(path):
    """The runs in a metrics file: a list of {"steps": [...], "vals": [...]}."""
    runs = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"error: {path}:{n}: not a JSON line ({e.msg})")
            if "run" in rec or not runs:
                runs.append({"steps": [], "vals": []})
            if "val_loss" in rec:
                runs[-1]["vals"].append(rec)
            elif "loss" in rec:
                runs[-1]["steps"].append(rec)
    return [r for r in runs if r["steps"] or r["vals"]]


def labels_for(paths):
    """Short names: the file name without .jsonl, or the path where two names collide."""
    names = [os.path.splitext(os.path.basename(p))[0] for p in paths]
    if len(set(names)) < len(names):
        names = [os.path.splitext(os.path.normpath(p))[0] for p in paths]
    return names


def series(records, key, scale=1.0):
    xs = [r["step"] for r in records if r.get(key) is not None]
    ys = [r[key] * scale for r in records if r.get(key) is not None]
    return xs, ys


def plot(runs, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig = plt.figure(figsize=(14, 9), constrained_layout=True)
    grid = fig.add_gridspec(2, 4, height_ratios=[3, 2])
    loss = fig.add_subplot(grid[0, :])
    panels = [(fig.add_subplot(grid[1, i]), key, title, scale) for i, (key, title, scale) in
              enumerate([("lr", "learning rate", 1.0), ("grad_norm", "gradient norm", 1.0),
                         ("tokens_per_s", "tokens/s", 1.0), ("mfu", "MFU (%)", 100.0)])]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, run) in enumerate(runs):
        color = colors[i % len(colors)]
        xs, ys = series(run["steps"], "loss")
        loss.plot(xs, ys, color=color, linewidth=1.2, label=f"{label} train")
        xs, ys = series(run["vals"], "val_loss")
        if xs:
            loss.plot(xs, ys, color=color, linestyle="--", marker="o", markersize=4,
                      label=f"{label} val")
        for ax, key, _, scale in panels:
            xs, ys = series(run["steps"], key, scale)
            if xs:
                ax.plot(xs, ys, color=color, linewidth=1.0)
    loss.set_title("loss")
    loss.set_xlabel("step")
    loss.xaxis.set_major_locator(MaxNLocator(integer=True))
    loss.grid(alpha=0.3)
    loss.legend(fontsize="small", ncol=max(1, min(4, len(runs))))
    for ax, key, title, _ in panels:
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if not ax.lines:
            ax.set_xticks([])
            ax.set_yticks([])
            ax.text(0.5, 0.5, "n/a" if key != "mfu" else "n/a: no peak known\n([log] peak_tflops)",
                    ha="center", va="center", transform=ax.transAxes, color="gray")
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("metrics", nargs="+", help="JSONL metrics files ([log] metrics)")
    p.add_argument("-o", "--out", default="loss.png", help="PNG to write (default loss.png)")
    args = p.parse_args()
    runs = []
    for path, label in zip(args.metrics, labels_for(args.metrics)):
        if not os.path.isfile(path):
            sys.exit(f"error: {path}: no such file")
        found = read_runs(path)
        if not found:
            sys.exit(f"error: {path}: no step records (is it a [log] metrics file?)")
        for k, run in enumerate(found):
            runs.append((label if k == 0 else f"{label} #{k + 1}", run))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        sys.exit("error: tools/plot.py needs matplotlib "
                 "(Debian: apt-get install python3-matplotlib)")
    plot(runs, args.out)
    print(f"plot: {len(runs)} run(s) -> {args.out}")


if __name__ == "__main__":
    main()
