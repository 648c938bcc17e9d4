#!/usr/bin/python3
"""tools/plot_trace.py - draws one traced step of a trace (tools/trace_merge.py's file, or one
rank's DIR/rank_<r>.json) as a PNG: one band per rank, split into its host, compute-stream and
comm-stream lanes; each span a bar coloured by its kind (pipeline F/B/W, optimizer, comm, control
(the loss's host messages), data,
checkpoint), nested spans drawn thinner on top, the pipeline's bars labelled with their action
and micro-batch.

    /usr/bin/python3 tools/plot_trace.py DIR/trace.json [--step N] [-o step.png]

--step: the step to draw (default: the first traced one). Needs matplotlib.
"""
import argparse
import json

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLOURS = {"pipeline": "#4c72b0", "optimizer": "#55a868", "comm": "#dd8452", "data": "#8172b3",
           "checkpoint": "#c44e52", "control": "#937860", "op": "#64b5cd", "step": "#dddddd"}
LANES = ["host", "compute", "comm"]


def depth_of(events):
    """Each span's nesting depth within its (rank, lane)."""
    depth, stack = {}, {}
    for i, e in sorted(enumerate(events), key=lambda p: (p[1]["ts"], -p[1]["dur"])):
        key = (e["pid"], e["tid"])
        st = stack.setdefault(key, [])
        while st and st[-1] <= e["ts"] + 1e-3:
            st.pop()
        depth[i] = len(st)
        st.append(e["ts"] + e["dur"])
    return depth


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--step", type=int)
    ap.add_argument("-o", "--out", default="trace_step.png")
    args = ap.parse_args()
    events = [e for e in json.load(open(args.trace))["traceEvents"] if e.get("ph") == "X"]
    step = args.step if args.step is not None else min(e["args"]["step"] for e in events)
    events = [e for e in events if e["args"].get("step") == step]
    if not events:
        raise SystemExit(f"plot_trace: no spans of step {step} in {args.trace}")
    t0 = min(e["ts"] for e in events)
    ranks = sorted({e["pid"] for e in events})
    depth = depth_of(events)
    fig, ax = plt.subplots(figsize=(14, 1.2 + 1.1 * len(ranks)))
    for i, e in enumerate(events):
        row = ranks.index(e["pid"]) * (len(LANES) + 1) + e["tid"]
        h = 0.8 * 0.7 ** depth[i]
        ax.barh(row, e["dur"] / 1e3, left=(e["ts"] - t0) / 1e3, height=h,
                color=COLOURS.get(e["cat"], "#999999"), edgecolor="black", linewidth=0.2)
        if e["cat"] == "pipeline" and e["dur"] > 0:
            ax.text((e["ts"] - t0 + e["dur"] / 2) / 1e3, row, f"{e['name']}{e['args']['micro']}",
                    ha="center", va="center", fontsize=6, color="white")
    ticks = [r * (len(LANES) + 1) + k for r in range(len(ranks)) for k in range(len(LANES))]
    ax.set_yticks(ticks)
    ax.set_yticklabels([f"rank {ranks[r]} {lane}" for r in range(len(ranks)) for lane in LANES])
    ax.invert_yaxis()
    ax.set_xlabel("ms from the step's start")
    ax.set_title(f"step {step}")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()]
    ax.legend(handles, COLOURS.keys(), loc="upper right", fontsize=7, ncol=len(COLOURS))
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"plot_trace: step {step}, {len(ranks)} rank(s), {len(events)} spans -> {args.out}")


if __name__ == "__main__":
    main()
