#!/usr/bin/python3
"""tools/trace_merge.py - joins the per-rank trace files of `[log] trace = "DIR"`
(DIR/rank_<r>.json, kernels/trace.h) into one Chrome trace-event file: one process per rank, in
rank order, each with its host, compute-stream and comm-stream threads. Open the result in
Perfetto (https://ui.perfetto.dev) or chrome://tracing.

    /usr/bin/python3 tools/trace_merge.py DIR [-o DIR/trace.json]

The ranks' times are their wall clocks (microseconds since midnight UTC), so the ranks of one
node line up exactly and those of several nodes as well as their clocks agree.
"""
import argparse
import glob
import json
import os
import re
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="the [log] trace directory")
    ap.add_argument("-o", "--out", help="merged file (default DIR/trace.json)")
    args = ap.parse_args()
    files = glob.glob(os.path.join(args.dir, "rank_*.json"))
    if not files:
        sys.exit(f"trace_merge: no rank_*.json in {args.dir}")
    files.sort(key=lambda f: int(re.search(r"rank_(\d+)\.json$", f).group(1)))
    events = []
    for f in files:
        with open(f) as fh:
            events += json.load(fh)["traceEvents"]
    out = args.out or os.path.join(args.dir, "trace.json")
    with open(out, "w") as fh:
        json.dump({"displayTimeUnit": "ms", "traceEvents": events}, fh)
    spans = sum(1 for e in events if e.get("ph") == "X")
    print(f"trace_merge: {len(files)} rank(s), {spans} spans -> {out}")


if __name__ == "__main__":
    main()
