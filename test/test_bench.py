#!/usr/bin/python3
"""test/test_bench.py - the kernel benchmark's smoke run (bench-smoke) with its accounting checked.

build/bench_kernels_cpu --quick (the benchmark linked with the CPU backend, tiny sizes) writes
its table as TSV. Times are not checked (speed belongs to bench/); what every number in
docs/PERF.md rests on is: each row's work, rate x time, must equal the work an independent
formula gives from the row's shape, within the TSV's 9 significant digits (relative 1e-6):
  ceilings   copy: 2 x its bytes (read + write); GEMM: 2 n^3 FLOPs
  memory     the fewest bytes each op must move (bench/bench_memory.cu's table, written out
             again here per op: encoder, layernorm, gelu, classifier, adamw, sums, casts,
             rmsnorm, rope, swiglu)
  gemm       forward 2 N C OC FLOPs, backward 4 N C OC, FP8 rows 2 N C OC, MoE rows 4 rows C D
  attention  causal forward 2 B NH T^2 HS, backward 2.5x, forward + backward 3.5x over the sum
             of both times
and each percentage is of the ceiling measured in the same run (memory: copy GB/s; gemm: the
GEMM ceiling). Every section must be present with its rows (a benchmark silently doing less
fails), and every time positive and finite.
"""
import math
import os
import re
import subprocess
import sys
import tempfile

BUILD = os.environ.get("BUILD", "build")
failures = []


def check(name, ok, detail):
    print(f"  {'ok  ' if ok else 'FAIL'} {name}: {detail}")
    if not ok:
        failures.append(name)


def shape_ints(shape):
    """"B=2 T=64 C=64 U=113.9375" -> {"B": 2, ...} (U: distinct tokens, a mean over buffer sets)"""
    return {k: float(v) if "." in v else int(v) for k, v in re.findall(r"(\w+)=([\d.]+)", shape)}


def memory_bytes(name, shape):
    s = 2  # bf16 activations
    d = shape_ints(shape)
    N = d.get("B", 0) * d.get("T", 0)
    C, n = d.get("C", 0), d.get("n", 0)
    table = {
        "encoder_forward": lambda: 3 * N * C * s + 4 * N,
        "encoder_backward": lambda: 2 * N * C * s + 8 * d.get("T", 0) * C + 8 * d.get("U", 0) * C,
        "layernorm_forward": lambda: 2 * N * C * s + 2 * C * s + 8 * N,
        "layernorm_backward": lambda: 4 * N * C * s + C * s + 8 * N,
        "gelu_forward": lambda: 2 * n * s,
        "gelu_backward": lambda: 3 * n * s,
        "classifier": lambda: d["N"] * d["V"] * s + d["N"] * d["Vp"] * s + 8 * d["N"],
        "adamw_update": lambda: 28 * n + 2 * n,
        "sum_squares_accumulate": lambda: 4 * n,
        "add_inplace": lambda: 12 * n,
        "cast": lambda: 6 * n,  # fp32 <-> bf16: 4 + 2 bytes per element
        "rmsnorm_forward": lambda: 2 * N * C * s + C * s + 4 * N,
        "rmsnorm_backward": lambda: 4 * N * C * s + C * s + 4 * N,
        "rope_": lambda: 2 * N * (d.get("NH", 0) + d.get("NKV", 0)) * d.get("HS", 0) * s
        + 4 * d.get("T", 0) * d.get("HS", 0),
        "swiglu_forward": lambda: 3 * N * d.get("F", 0) * s,
        "swiglu_backward": lambda: 5 * N * d.get("F", 0) * s,
    }
    for key, f in table.items():
        if name.startswith(key):
            return f()
    return None


def gemm_flops(name, shape):
    d = shape_ints(shape)
    if "moe" in name:
        return 4.0 * d["rows"] * d["C"] * d["D"]
    base = 2.0 * d["N"] * d["C"] * d["OC"]
    return 2 * base if name.endswith(" bwd") else base


def attention_flops(name, shape):
    d = shape_ints(shape)
    fwd = 2.0 * d["B"] * d["NH"] * d["T"] ** 2 * d["HS"]  # causal: half of 4 B NH T^2 HS
    return fwd * (3.5 if name.endswith("fwd+bwd") else 2.5 if name.endswith("bwd") else 1.0)


def expected_work(row):
    """FLOPs or bytes of a row, from its name and shape; None: no formula for it."""
    sec, name, shape = row["section"], row["name"], row["shape"]
    if sec == "ceiling":
        if "copy" in name:
            return 2.0 * (int(shape.split()[0]) << 20)  # "16 MiB", read + written
        return 2.0 * int(shape.split("x")[0]) ** 3
    if sec == "memory":
        return memory_bytes(name, shape)
    if sec == "gemm":
        return gemm_flops(name, shape)
    return attention_flops(name, shape)


def work_of(row, times):
    """rate x time in FLOPs or bytes (the fwd+bwd attention row's rate is over fwd + bwd time)."""
    ms = row["ms"]
    if row["section"] == "attention" and row["name"].endswith("fwd+bwd"):
        stem = row["name"][:-len("fwd+bwd")]
        ms = times[stem + "fwd"] + times[stem + "bwd"]
    scale = 1e9 if row["unit"] == "TFLOP/s" else 1e6  # TFLOP/s x ms = 1e9 FLOP; GB/s x ms = 1e6 B
    return row["rate"] * ms * scale


def main():
    tsv = os.path.join(tempfile.mkdtemp(), "bench.tsv")
    r = subprocess.run([os.path.join(BUILD, "bench_kernels_cpu"), "--quick", "--tsv", tsv],
                       capture_output=True, text=True, timeout=600)
    print(r.stdout[-2000:])
    check("bench_kernels_cpu --quick ran", r.returncode == 0,
          f"exit {r.returncode} {r.stderr[-500:]}")
    if r.returncode != 0:
        sys.exit(1)
    lines = open(tsv).read().splitlines()
    head = lines[0].split("\t")
    rows = []
    for ln in lines[1:]:
        row = dict(zip(head, ln.split("\t")))
        for k in ("ms", "rate", "percent"):
            row[k] = float(row[k])
        rows.append(row)
    times = {row["name"]: row["ms"] for row in rows}
    counts = {sec: sum(1 for row in rows if row["section"] == sec)
              for sec in ("ceiling", "memory", "gemm", "attention")}
    check("sections and rows", counts == {"ceiling": 2, "memory": 29, "gemm": 42, "attention": 15},
          f"{counts}")
    check("times positive and finite",
          all(row["ms"] > 0 and math.isfinite(row["ms"]) for row in rows), f"{len(rows)} rows")
    worst, bad = 0.0, []
    for row in rows:
        want = expected_work(row)
        if want is None:
            bad.append(f"{row['name']}: no formula")
            continue
        err = abs(work_of(row, times) - want) / want
        worst = max(worst, err)
        if err > 1e-6:
            bad.append(f"{row['name']} {row['shape']}: rate x time {work_of(row, times):.6g}, "
                       f"formula {want:.6g}")
    check("every row's work (rate x time) equals its formula", not bad,
          f"worst rel err {worst:.1e} (tolerance 1e-6: 9 digits printed); {bad[:4]}")
    ceil = {("memory" if "copy" in row["name"] else "gemm"): row["rate"]
            for row in rows if row["section"] == "ceiling"}
    off = [row["name"] for row in rows if row["section"] in ceil and
           abs(row["percent"] - 100 * row["rate"] / ceil[row["section"]]) >
           1e-5 * max(1.0, row["percent"])]
    check("percentages are of this run's ceilings", not off, f"{off[:4]}")
    if failures:
        sys.exit(f"test_bench: {len(failures)} FAILED: {', '.join(failures)}")
    print("test_bench: all passed")


if __name__ == "__main__":
    main()
