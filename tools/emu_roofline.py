#!/usr/bin/env python3
"""tools/emu_roofline.py - a GPU step time predicted from the emulated tier's counts (EMU_COUNTS,
test/emu/counts.cpp), kernel by kernel, with the roofline model:

    time of a kernel = max(bytes / HBM bandwidth, FLOPs / peak)

bytes: its global reads and writes (distinct 32-byte sectors per launch: what DRAM moves if L2
keeps what one launch reuses); FLOPs: the tensor-core FLOPs its mma instructions issue, or a
cuBLASLt GEMM's 2MNK. Peak and bandwidth: config/device_peaks.cu's row for --device (the dense
BF16 or FP8 peak, the datasheet's HBM bandwidth). Summed per micro-step and per optimizer step;
step = grad_accum x micro-step + optimizer step (+ --launch-us per launch, 0 by default: CUDA
graphs, or launches hidden behind the previous kernel). NCCL calls are listed, not timed (they
overlap or not by the layout: training/plan.cu's business).

The emulator runs a reduced shape; the tool scales its counts to the target:
  - layers: from two runs, L1 (n_layer 1) and L2 (n_layer 2): L1 + (layers - 1) x (L2 - L1);
  - tokens: micro-step rows x --tokens-scale (target B*T / measured B*T). A GEMM is rescaled
    by its shape: a dimension equal to --measured-tokens (or one of --token-dims: the
    classifier's chunks) grows by the scale (the calls stay as many), its FLOPs are
    2MNK at the new shape and its bytes grow by the operands' new elements (MK + KN + MN, at
    --elem-bytes each: 2 for bf16) - an fp32 output that does not grow (a weight gradient)
    stays as counted; attention kernels' FLOPs
    grow also with --seq-scale (target T / measured T: work per token is linear in T), their
    bytes with the tokens only (--attention-flops-scale sets the FLOPs' factor instead: at a
    short measured T the flash kernels' 128-row tiles are mostly padding); every other kernel's bytes grow with the tokens (its weight-sized
    part, e.g. LayerNorm's parameter gradients, is overstated by this);
  - the optimizer step is kept as measured (it moves parameter-sized tensors).
MFU = --model-flops-per-token x tokens per step / (step time x peak).

usage: tools/emu_roofline.py L1.json [L2.json] [--layers 12] [--device "H100 SXM"]
         [--compute bf16] [--measured-tokens 64] [--token-dims 16] [--tokens-scale 512]
         [--seq-scale 16]
         [--grad-accum 1] [--model-flops-per-token F] [--launch-us 0] [--rows 20]"""
import argparse
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def device_row(name):
    """(bf16 TFLOP/s, fp8 TFLOP/s, HBM GB/s) of config/device_peaks.cu's row `name`."""
    text = open(os.path.join(ROOT, "config", "device_peaks.cu")).read()
    for m in re.finditer(r'\{\{"([^"]+)", ([0-9.]+), ([0-9.]+), ([0-9.]+),', text):
        if m.group(1) == name:
            return float(m.group(2)), float(m.group(3)), float(m.group(4))
    names = re.findall(r'\{\{"([^"]+)",', text)
    sys.exit(f"emu_roofline: no device '{name}' in config/device_peaks.cu ({', '.join(names)})")


def rows_of(counts, phase):
    """{name: {launches, bytes, flops, comm}} of one phase, per micro-step or optimizer step."""
    p = counts["per_step"][phase]
    rows = {}
    for n, k in p["kernels"].items():
        rows[n] = dict(launches=k["launches"], bytes=k["bytes_read"] + k["bytes_written"],
                       flops=k["tensor_flops"], comm=0.0)
    for n, c in p["library"].items():
        rows[n] = dict(launches=c["calls"], bytes=c["bytes_read"] + c["bytes_written"],
                       flops=c["flops"], comm=c["comm_bytes"])
    return rows


def extrapolate(one, two, layers):
    """one + (layers - 1) x (two - one), row by row."""
    out = {}
    for n in set(one) | set(two):
        a = one.get(n, dict(launches=0, bytes=0, flops=0, comm=0))
        b = two.get(n, dict(launches=0, bytes=0, flops=0, comm=0))
        out[n] = {k: a[k] + (layers - 1) * (b[k] - a[k]) for k in a}
    return out


def scale_gemm(name, r, tokens, scale, elem_bytes):
    """tokens: the GEMM dimensions that count tokens (the micro-batch's B*T, and chunk sizes)."""
    m = re.match(r"cublasLtMatmul (\d+)x(\d+)x(\d+)(?:x\d+)?$", name)
    dims = [int(x) for x in m.groups()] if m else []
    new = [d * scale if d in tokens else d for d in dims]
    if new == dims:  # no shape or no token dimension: FLOPs and bytes with the tokens
        return dict(r, flops=r["flops"] * scale, bytes=r["bytes"] * scale)
    M, N, K = dims
    M2, N2, K2 = new
    grown = (M2 * K2 - M * K) + (K2 * N2 - K * N) + (M2 * N2 - M * N)  # elements, per call
    return dict(r, flops=r["flops"] * (M2 * N2 * K2) / (M * N * K),
                bytes=r["bytes"] + r["launches"] * grown * elem_bytes)


def scale_micro(rows, tokens, scale, seq_scale, elem_bytes, attention_flops_scale):
    out = {}
    for n, r in rows.items():
        if n.startswith("cublasLtMatmul"):
            out[n] = scale_gemm(n, r, tokens, scale, elem_bytes)
        elif n.startswith("nccl"):
            out[n] = dict(r, comm=r["comm"] * scale)
        elif "attention" in n or "flash" in n:
            f = attention_flops_scale or scale * seq_scale
            out[n] = dict(r, bytes=r["bytes"] * scale, flops=r["flops"] * f)
        else:
            out[n] = dict(r, bytes=r["bytes"] * scale)
    return out


def timed(rows, peak_flops, hbm_bytes, launch_s):
    """Adds each row's roofline time (s) and bound; NCCL rows get none."""
    for n, r in rows.items():
        if n.startswith("nccl"):
            r.update(time=0.0, bound="comm")
            continue
        tb, tf = r["bytes"] / hbm_bytes, r["flops"] / peak_flops
        r.update(time=max(tb, tf) + r["launches"] * launch_s, bound="FLOPs" if tf > tb else "HBM")
    return rows


def print_rows(title, rows, limit):
    total = sum(r["time"] for r in rows.values())
    print(f"{title}: {total * 1e3:.3f} ms, {sum(r['launches'] for r in rows.values()):.0f} "
          f"launches/calls, {sum(r['bytes'] for r in rows.values()) / 1e9:.3f} GB, "
          f"{sum(r['flops'] for r in rows.values()) / 1e12:.3f} TFLOP issued")
    print(f"  {'kernel or call':<64} {'launches':>8} {'MB':>10} {'GFLOP':>10} {'us':>9} bound")
    ordered = sorted(rows.items(), key=lambda kv: -kv[1]["time"])
    for n, r in ordered[:limit]:
        print(f"  {n[:64]:<64} {r['launches']:8.1f} {r['bytes'] / 1e6:10.2f} "
              f"{r['flops'] / 1e9:10.2f} {r['time'] * 1e6:9.1f} {r['bound']}")
    if len(ordered) > limit:
        rest = ordered[limit:]
        print(f"  ({len(rest)} more rows: {sum(r['time'] for _, r in rest) * 1e6:.1f} us)")
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("counts", nargs="+", help="L1.json [L2.json] from EMU_COUNTS")
    ap.add_argument("--layers", type=int, default=0, help="target n_layer (needs two files)")
    ap.add_argument("--device", default="H100 SXM")
    ap.add_argument("--compute", default="bf16", choices=["bf16", "fp8"])
    ap.add_argument("--measured-tokens", type=int, default=0, help="B*T of the counted run")
    ap.add_argument("--token-dims", default="", help="more GEMM dimensions that count tokens "
                    "(the classifier's chunk of rows), comma-separated")
    ap.add_argument("--tokens-scale", type=float, default=1.0)
    ap.add_argument("--seq-scale", type=float, default=1.0)
    ap.add_argument("--attention-flops-scale", type=float, default=0.0,
                    help="attention FLOPs at the target / measured (default tokens x seq scale); "
                    "the flash kernels' tile counts give it exactly: docs/PERF.md")
    ap.add_argument("--elem-bytes", type=float, default=2.0,
                    help="bytes per element a GEMM operand grows by (2: bf16)")
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--model-flops-per-token", type=float, default=0.0)
    ap.add_argument("--launch-us", type=float, default=0.0)
    ap.add_argument("--rows", type=int, default=20)
    a = ap.parse_args()
    counts = [json.load(open(p)) for p in a.counts]
    micro, opt = rows_of(counts[0], "micro_step"), rows_of(counts[0], "optimizer_step")
    if len(counts) == 2 and a.layers:
        micro = extrapolate(micro, rows_of(counts[1], "micro_step"), a.layers)
        opt = extrapolate(opt, rows_of(counts[1], "optimizer_step"), a.layers)
    token_dims = {a.measured_tokens} | {int(x) for x in a.token_dims.split(",") if x}
    micro = scale_micro(micro, token_dims, a.tokens_scale, a.seq_scale, a.elem_bytes,
                        a.attention_flops_scale)
    bf16, fp8, hbm = device_row(a.device)
    peak = (fp8 if a.compute == "fp8" else bf16) * 1e12
    print(f"{a.device}: {peak / 1e12:g} TFLOP/s dense {a.compute}, {hbm:g} GB/s HBM; "
          f"{a.launch_us:g} us per launch")
    t_micro = print_rows("per micro-step", timed(micro, peak, hbm * 1e9, a.launch_us * 1e-6), a.rows)
    t_opt = print_rows("per optimizer step", timed(opt, peak, hbm * 1e9, a.launch_us * 1e-6), a.rows)
    step = a.grad_accum * t_micro + t_opt
    print(f"step: {a.grad_accum} x {t_micro * 1e3:.3f} + {t_opt * 1e3:.3f} = {step * 1e3:.3f} ms")
    if a.model_flops_per_token and a.measured_tokens:
        tokens = a.measured_tokens * a.tokens_scale * a.grad_accum
        model = a.model_flops_per_token * tokens
        issued = a.grad_accum * sum(r["flops"] for r in micro.values()) + \
            sum(r["flops"] for r in opt.values())
        print(f"model FLOPs per step {model:.4g}, issued {issued:.4g} ({issued / model:.3f}x); "
              f"predicted MFU {model / (step * peak) * 100:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
