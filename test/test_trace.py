#!/usr/bin/python3
"""test/test_trace.py - `[log] trace = "DIR"`: the per-rank Chrome trace-event files
(kernels/trace.h) against what the trainer measures and counts itself.

Tiny GPT-2 (L=2, NH=4, C=64, T=32, V=101), micro-batch 4, steps 2..3 traced of 3:
1. dp = 2 (DDP), grad_accum 2; and zero = 1: each rank's file parses as JSON (Perfetto's and
   chrome://tracing's format: complete events with ts, dur, pid = the rank, tid = the lane, and
   names for the process and its threads); the events of each (rank, lane) nest (two spans either
   do not overlap or one holds the other, 1 ns of rounding allowed); in each traced step the
   compute, communication and data-loading spans cover the step's measured time (the metrics'
   ms) to within 10%, and no span leaves the step; every collective and message the comm
   accounting counted on rank 0 that step (the metrics' "comm": calls and bytes per axis and
   kind) is in rank 0's trace once, with its bytes.
2. pp = 2, 4 micro-batches: each rank's F/B order in the trace is 1F1B's (pp - 1 - rank
   forwards, then one backward and one forward in turn, then the backwards), computed here from
   the schedule's definition; zb-h1's F/B/W order is the schedule's list as the trainer prints it
   ([log] pipeline_timeline), W's included; the p2p messages carry the pp axis and the peer.
3. The ops through the backend seam (kernels/op_spans.h): on each rank of dp = 2 every op span
   of the compute lane that is a GEMM or attention lies inside an F or B span of its step (they
   nest, as 1.), each traced step holds (4 L + 4) x micro-batches matmul_forward spans (per
   layer qkv, attention projection, fc, fc projection; then the LM head over 4 token chunks, a
   quarter of the micro-batch each: model/gpt_head.cu), and the qkv GEMM's `bytes` is
   kernels/op_spans.h's formula from its shapes: fp32 (4 bytes) x (inp N*C + weight 3C*C + bias
   3C + out N*3C).
4. tools/trace_merge.py joins the ranks into one file that parses with both ranks' events, and
   tools/plot_trace.py draws a PNG of a traced step.
"""
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainer import (Checks, base_sections, make_experiment, read_metrics, run,  # noqa: E402
                     seeded_rng, write_config)

checks = Checks("test_trace")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACED = [2, 3]
COVER_TOL = 0.10


def load(trace_dir):
    files = sorted(glob.glob(os.path.join(trace_dir, "rank_*.json")))
    return {int(re.search(r"rank_(\d+)", f).group(1)): json.load(open(f)) for f in files}


def spans(doc):
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"]


def nests(events):
    """Whether the spans nest: sorted by start (longest first), each is inside every open one."""
    stack = []
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        end = e["ts"] + e["dur"]
        while stack and stack[-1] <= e["ts"] + 1e-3:
            stack.pop()
        if stack and end > stack[-1] + 1e-3:
            return False, e
        stack.append(end)
    return True, None


def covered(intervals):
    total, last = 0.0, None
    for b, e in sorted(intervals):
        if last is None or b > last:
            total += e - b
            last = e
        elif e > last:
            total += e - last
            last = e
    return total


def check_layout(name, tmp, cfg, np_ranks, extra):
    trace_dir = os.path.join(tmp, "trace_" + name)
    metrics = os.path.join(tmp, name + ".jsonl")
    r = run(cfg, extra + [f"--log.trace={trace_dir}", f"--log.trace_steps={TRACED}",
                          f"--log.metrics={metrics}"], np_ranks=np_ranks, check=False)
    checks.check(f"{name}: trained", r.returncode == 0, r.stderr[-300:])
    docs = load(trace_dir)
    checks.check(f"{name}: one file per rank, each parses", sorted(docs) == list(range(np_ranks)),
                 f"ranks {sorted(docs)}")
    steps = {s["step"]: s for s in read_metrics(metrics)[0]}
    for rank, doc in docs.items():
        ev = spans(doc)
        named = {(e.get("tid"), e["args"]["name"]) for e in doc["traceEvents"]
                 if e.get("ph") == "M" and e["name"] == "thread_name"}
        ok_format = all(e["pid"] == rank and e["tid"] in (0, 1, 2) and e["dur"] >= 0 and
                        e["name"] and e["cat"] for e in ev) and len(named) == 3
        checks.check(f"{name}: rank {rank}: complete events, pid = rank, 3 named lanes",
                     ok_format and ev, f"{len(ev)} spans, lanes {sorted(named)}")
        for tid in (0, 1, 2):
            ok, bad = nests([e for e in ev if e["tid"] == tid])
            checks.check(f"{name}: rank {rank} lane {tid}: spans nest", ok, f"first outlier {bad}")
        for step in TRACED:
            in_step = [e for e in ev if e["args"]["step"] == step]
            outer = [e for e in in_step if e["name"] == "step"]
            if len(outer) != 1:
                checks.check(f"{name}: rank {rank} step {step}: one step span", False, f"{outer}")
                continue
            s0, s1 = outer[0]["ts"], outer[0]["ts"] + outer[0]["dur"]
            work = [(e["ts"], e["ts"] + e["dur"]) for e in in_step
                    if e["tid"] in (1, 2) or e["cat"] == "data"]
            inside = all(b >= s0 - 1e-3 and e <= s1 + 1e-3 for b, e in work)
            busy = covered(work) / 1e3  # ms
            measured = steps[step]["ms"] if rank == 0 else outer[0]["dur"] / 1e3
            checks.check(f"{name}: rank {rank} step {step}: compute + comm + data cover the "
                         f"measured step within {COVER_TOL:.0%}",
                         inside and abs(busy - measured) <= COVER_TOL * measured,
                         f"{busy:.2f} ms of {measured:.2f} ms, all inside the step: {inside}")
    for step in TRACED:
        want = {}
        for axis, kinds in steps[step].get("comm", {}).items():
            for kind, v in kinds.items():
                want[(axis, kind)] = (v["calls"], v["bytes"])
        got = {}
        for e in spans(docs.get(0, {"traceEvents": []})):
            if e["cat"] != "comm" or e["args"]["step"] != step:
                continue
            msgs = e["args"].get("messages")
            items = [(m["op"], m["bytes"]) for m in msgs] if msgs else \
                [(e["name"].replace("-", "_"), e["args"]["bytes"])]
            for kind, nbytes in items:
                calls, total = got.get((e["args"]["axis"], kind), (0, 0))
                got[(e["args"]["axis"], kind)] = (calls + 1, total + nbytes)
        checks.check(f"{name}: step {step}: rank 0's traced collectives = its comm accounting",
                     got == want and want, f"trace {sorted(got.items())}, metrics "
                     f"{sorted(want.items())}")
    return docs, r


def within(e, intervals):
    return any(b - 1e-3 <= e["ts"] and e["ts"] + e["dur"] <= f + 1e-3 for b, f in intervals)


def check_op_spans(docs, L, C, micro_batches):
    for rank, doc in docs.items():
        ev = spans(doc)
        for step in TRACED:
            in_step = [e for e in ev if e["args"]["step"] == step]
            fb = [(e["ts"], e["ts"] + e["dur"]) for e in in_step
                  if e["cat"] == "pipeline" and e["tid"] == 1]
            op = [e for e in in_step if e["cat"] == "op"]
            outside = [e for e in op if e["tid"] == 1 and not within(e, fb) and
                       e["name"].startswith(("matmul", "attention"))]
            checks.check(f"ops: rank {rank} step {step}: op spans, the GEMMs and attention inside "
                         f"F/B", op and fb and not outside,
                         f"{len(op)} ops, {len(fb)} F/B, first outside {outside[:1]}")
            fwd = [e for e in op if e["name"] == "matmul_forward"]
            want = (4 * L + 4) * micro_batches
            checks.check(f"ops: rank {rank} step {step}: matmul_forward spans = (4 L + 4) x "
                         f"micro-batches", len(fwd) == want, f"{len(fwd)}, want {want}")
            qkv = [e["args"] for e in fwd if e["args"]["C"] == C and e["args"]["OC"] == 3 * C]
            bad = [a for a in qkv
                   if a["bytes"] != 4 * (a["N"] * C + 3 * C * C + 3 * C + a["N"] * 3 * C)]
            checks.check(f"ops: rank {rank} step {step}: the qkv GEMM's bytes from its shapes",
                         len(qkv) == L * micro_batches and not bad,
                         f"{len(qkv)} qkv, wrong {bad[:1]}")


def one_f_one_b(pp, m, rank):
    warm = min(pp - 1 - rank, m)
    order = [f"F{i}" for i in range(warm)]
    f, b = warm, 0
    while b < m:
        if f < m:
            order.append(f"F{f}")
            f += 1
        order.append(f"B{b}")
        b += 1
    return order


def fbw(doc, step):
    return [f"{e['name']}{e['args']['micro']}" for e in sorted(spans(doc), key=lambda e: e["ts"])
            if e["cat"] == "pipeline" and e["args"]["step"] == step]


def check_pipeline(tmp, cfg):
    extra = ["--parallel.pp=2", "--train.grad_accum=4"]
    docs, _ = check_layout("pp2 1f1b", tmp, cfg, 2, extra)
    for rank, doc in docs.items():
        want = one_f_one_b(2, 4, rank)
        got = fbw(doc, TRACED[0])
        checks.check(f"pp2 1f1b: rank {rank}: the trace's F/B order is 1F1B's", got == want,
                     f"trace {got}, 1F1B {want}")
        p2p = [e for e in spans(doc) if e["name"] == "p2p"]
        checks.check(f"pp2 1f1b: rank {rank}: messages on pp to the other rank",
                     p2p and all(e["args"]["axis"] == "pp" and
                                 all(m["peer"] == 1 - rank for m in e["args"]["messages"])
                                 for e in p2p), f"{len(p2p)} p2p spans")
    docs, r = check_layout("pp2 zb-h1", tmp, cfg, 2,
                           extra + ["--parallel.pp_schedule=zb-h1", "--log.pipeline_timeline=true"])
    for rank, doc in docs.items():
        line = re.search(rf"^pp rank {rank} actions:(.*)$", r.stdout, re.M)
        want = re.findall(r"([FBW]\d+)\.\d+@", line.group(1)) if line else None
        got = fbw(doc, TRACED[-1])  # the timeline is the last step's
        checks.check(f"pp2 zb-h1: rank {rank}: the trace's F/B/W order is the schedule's",
                     got == want and "W0" in got, f"trace {got}, schedule {want}")


def check_tools(tmp):
    trace_dir = os.path.join(tmp, "trace_dp2")
    merged = os.path.join(tmp, "merged.json")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools/trace_merge.py"), trace_dir,
                        "-o", merged], capture_output=True, text=True, timeout=120)
    pids = {e.get("pid") for e in json.load(open(merged))["traceEvents"]} \
        if r.returncode == 0 else set()
    checks.check("trace_merge.py: one file with both ranks", pids == {0, 1}, r.stderr[-300:])
    png = os.path.join(tmp, "step.png")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools/plot_trace.py"), merged,
                        "--step", str(TRACED[0]), "-o", png], capture_output=True, text=True,
                       timeout=300)
    ok = r.returncode == 0 and os.path.exists(png) and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    checks.check("plot_trace.py: a PNG of the traced step", ok, r.stderr[-300:])


def main():
    rng = seeded_rng("test_trace")
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=2, NH=4, C=64, T=32, V=101)
        sec = base_sections(tmp, 3)
        sec["train"]["micro_batch"] = 4
        cfg = write_config(tmp, "trace.toml", sec)
        dp = ["--parallel.dp=2", "--train.grad_accum=2"]
        checks.run_each(lambda: check_op_spans(check_layout("dp2", tmp, cfg, 2, dp)[0], L=2, C=64,
                                               micro_batches=2),
                        lambda: check_layout("dp2 zero1", tmp, cfg, 2, dp + ["--parallel.zero=1"]),
                        lambda: check_pipeline(tmp, cfg),
                        lambda: check_tools(tmp))
    checks.report()


if __name__ == "__main__":
    main()
