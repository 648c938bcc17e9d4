#!/usr/bin/python3
"""test/test_moe_dispatch.py - the mixture-of-experts token movement ops of the CPU backend
(moe_permute, moe_unpermute_backward, moe_combine, moe_combine_backward; contracts in
kernels/ops_decls.h) against numpy float64, fed with the real dispatch plan.

Routing: every token picks top_k distinct experts out of E = 8, with weights 1/(e+1), never
experts 1 and 6 (so those two get no tokens; on small N more of them get none). The plan comes
from parallel/expert_dispatch_plan.cu through the library (op_expert_dispatch_plan, ep = 2),
and is first checked against its definition: order is the stable sort of the pairs by expert
(numpy's argsort, kind="stable"), position its inverse, the counts are bincounts. Then
rows = order // top_k.

Sizes: N in {1, 7, 33} tokens, top_k in {1, 2, 3}, C in {1, 5, 64} channels, fp32 and bf16,
fresh random normal inputs every run (the seed is printed; MOE_SEED=<n> repeats a run); gates
uniform in (0, 1). Outputs are poisoned with NaN first. The references are built from `order`
(scatters with np.add.at), not from `position`, which the ops use: so they also check that the
two index arrays describe the same routing.

Checks and tolerances. A sum's fp32 rounding error is proportional to the sum of the
magnitudes of its terms, not to its value (which cancellation can make tiny), so the fp32 error
is measured against that: err = ||got - ref|| / ||scale||, scale = sum over the terms of |term|
per element (|ref| itself for a single product).
  permute                  exactly in[rows] (a copy: the same bits, both dtypes)
  fp32 outputs             err < 1e-6
  bf16 outputs             every element within one rounding of the float64 value,
                           |got - ref| <= 2^-8 |ref| + 1e-6 scale (half an ulp of bf16 plus the
                           fp32 sum), and ||got - ref|| / ||ref|| < 4e-3
  d_gate (fp32, both)      err < 1e-6 (bf16 products are exact in fp32)
  round trip               permute -> identity expert -> combine equals (sum_j gate) * x[n]
                           (tolerances as above); and its gradient through combine_backward
                           then moe_unpermute_backward equals torch float64 autograd of the same
                           composition (dgate: err < 1e-6; dx: fp32 err < 1e-6, bf16, rounded
                           twice on that path, ||got - ref|| / ||ref|| < 1e-2)
  determinism              a second call, and 1 vs 2 OpenMP threads, give the same bits (on a
                           case large enough for the parallel loops: N = 1024, top_k 2, C 64;
                           the thread counts are set explicitly, as importing torch can leave
                           OpenMP at one thread)

Run: /usr/bin/python3 test/test_moe_dispatch.py   (OPS_LIB overrides build/libops_cpu.so; exit
status 1 on failure)
"""
import ctypes
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from opslib import BUILD, LIB, Fl, I, P, Tally, load, rel_err  # noqa: E402,F401

F32, BF16 = 0, 1
DT_NAME = {F32: "fp32", BF16: "bf16"}
E, EP, DEAD = 8, 2, (1, 6)
report = Tally()
close = report.close


def load_library(path):
    return load(path, {
        "op_moe_permute": [P, P, P, I, I, I],
        "op_moe_unpermute_backward": [P, P, P, I, I, I, I],
        "op_moe_combine": [P, P, P, P, I, I, I, I],
        "op_moe_combine_backward": [P, P, P, P, P, P, I, I, I, I],
        "op_expert_dispatch_plan": [P, I, I, I, I, P, P, P, P],
        "op_set_num_threads": [I],
    })


def ptr(a):
    return a.ctypes.data


# ------------------------------------------------------------------------------------------------
# Storage: fp32 as float32, bf16 as uint16 (the top half of a float32, rounded to nearest even)
# ------------------------------------------------------------------------------------------------
def round_bf16(x):
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).bfloat16().float().numpy()


def to_storage(x, dt):
    x = np.ascontiguousarray(x, np.float32)
    if dt == F32:
        return x.copy()
    return (round_bf16(x).view(np.uint32) >> 16).astype(np.uint16)


def to_float64(buf, dt):
    if dt == F32:
        return buf.astype(np.float64)
    return (buf.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def poisoned(shape, dt):
    a = np.empty(shape, np.float32 if dt == F32 else np.uint16)
    a.view(np.uint8).fill(0xFF)  # NaN in both
    return a


# ------------------------------------------------------------------------------------------------
# Comparisons
# ------------------------------------------------------------------------------------------------
def close_scaled(what, got, ref, scale, tol=1e-6):
    """||got - ref|| / ||scale||: the error of fp32 sums against the size of their terms."""
    err = rel_err(got, ref) * np.linalg.norm(ref) / (np.linalg.norm(scale) + 1e-300)
    report(err < tol, f"{what}: err {err:.2e} of the terms' size (tol {tol:.0e})")


def close_dt(what, got, ref, scale, dt):
    """fp32: error < 1e-6 of the terms' size. bf16: one rounding per element (docstring)."""
    if dt == F32:
        return close_scaled(what, got, ref, scale)
    err = rel_err(got, ref)
    bound = 2.0 ** -8 * np.abs(ref) + 1e-6 * scale + 1e-300
    worst = float(np.max(np.abs(got - ref) / bound)) if got.size else 0.0
    ok = err < 4e-3 and np.all(np.isfinite(got)) and worst <= 1.0
    report(ok, f"{what}: rel err {err:.2e} (tol 4e-03), worst element {worst:.2f} of its "
               f"one-rounding bound")


# ------------------------------------------------------------------------------------------------
# Routing and the plan
# ------------------------------------------------------------------------------------------------
def random_experts(rng, N, top_k):
    live = np.array([e for e in range(E) if e not in DEAD])
    w = 1.0 / (live + 1.0)
    return np.array([rng.choice(live, size=top_k, replace=False, p=w / w.sum())
                     for _ in range(N)], np.int32).reshape(-1)


def plan(lib, expert, N, top_k):
    M = N * top_k
    order, position = np.full(M, -1, np.int32), np.full(M, -1, np.int32)
    counts, rank_counts = np.zeros(E, np.int32), np.zeros(EP, np.int32)
    lib.op_expert_dispatch_plan(ptr(expert), N, top_k, E, EP, ptr(order), ptr(position),
                                ptr(counts), ptr(rank_counts))
    return order, position, counts


def check_plan(name, expert, order, position, counts):
    stable = np.argsort(expert, kind="stable").astype(np.int32)
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.size, dtype=np.int32)
    ok = (np.array_equal(order, stable) and np.array_equal(position, inverse) and
          np.array_equal(counts, np.bincount(expert, minlength=E)))
    report(ok and counts[DEAD[0]] == 0 and counts[DEAD[1]] == 0,
           f"{name} plan: order = stable sort by expert, position its inverse, counts; "
           f"{int(np.sum(counts == 0))} of {E} experts without tokens")


# ------------------------------------------------------------------------------------------------
# The ops
# ------------------------------------------------------------------------------------------------
def run_ops(lib, case, dt):
    """Every op once on the case's inputs (storage arrays); returns the outputs."""
    N, k, C = case["N"], case["top_k"], case["C"]
    M = N * k
    out = {"perm": poisoned((M, C), dt), "din": poisoned((N, C), dt),
           "comb": poisoned((N, C), dt), "d_eo": poisoned((M, C), dt),
           "d_gate": poisoned(M, F32), "trip": poisoned((N, C), dt),
           "trip_deo": poisoned((M, C), dt), "trip_dgate": poisoned(M, F32),
           "trip_dx": poisoned((N, C), dt)}
    x, eo, dout_m, dout_n = case["x"], case["eo"], case["dout_m"], case["dout_n"]
    gate, rows, pos = case["gate"], case["rows"], case["position"]
    lib.op_moe_permute(ptr(out["perm"]), ptr(x), ptr(rows), M, C, dt)
    lib.op_moe_unpermute_backward(ptr(out["din"]), ptr(dout_m), ptr(pos), N, k, C, dt)
    lib.op_moe_combine(ptr(out["comb"]), ptr(eo), ptr(gate), ptr(pos), N, k, C, dt)
    lib.op_moe_combine_backward(ptr(out["d_eo"]), ptr(out["d_gate"]), ptr(dout_n), ptr(eo),
                                ptr(gate), ptr(pos), N, k, C, dt)
    # The round trip: the permuted x is the identity expert's output.
    lib.op_moe_combine(ptr(out["trip"]), ptr(out["perm"]), ptr(gate), ptr(pos), N, k, C, dt)
    lib.op_moe_combine_backward(ptr(out["trip_deo"]), ptr(out["trip_dgate"]), ptr(dout_n),
                                ptr(out["perm"]), ptr(gate), ptr(pos), N, k, C, dt)
    lib.op_moe_unpermute_backward(ptr(out["trip_dx"]), ptr(out["trip_deo"]), ptr(pos), N, k, C,
                                  dt)
    return out


def make_case(lib, rng, N, top_k, C, dt):
    expert = random_experts(rng, N, top_k)
    order, position, counts = plan(lib, expert, N, top_k)
    M = N * top_k
    case = dict(N=N, top_k=top_k, C=C, expert=expert, order=order, position=position,
                counts=counts, rows=(order // top_k).astype(np.int32),
                gate=rng.uniform(0.05, 1.0, M).astype(np.float32))
    for key, rows in (("x", N), ("eo", M), ("dout_m", M), ("dout_n", N)):
        case[key] = to_storage(rng.standard_normal((rows, C)), dt)
    return case


def references(case, dt):
    """float64, from `order` (scatter-adds), never from `position`."""
    N, k, C = case["N"], case["top_k"], case["C"]
    order, rows = case["order"], case["rows"]
    g = case["gate"].astype(np.float64)[order]  # gate of dispatch row i
    x, eo = to_float64(case["x"], dt), to_float64(case["eo"], dt)
    dm, dn = to_float64(case["dout_m"], dt), to_float64(case["dout_n"], dt)
    ref = {"perm": x[rows]}
    ref["din"], ref["din_scale"] = np.zeros((N, C)), np.zeros((N, C))
    np.add.at(ref["din"], rows, dm)
    np.add.at(ref["din_scale"], rows, np.abs(dm))
    ref["comb"], ref["comb_scale"] = np.zeros((N, C)), np.zeros((N, C))
    np.add.at(ref["comb"], rows, g[:, None] * eo)
    np.add.at(ref["comb_scale"], rows, np.abs(g[:, None] * eo))
    ref["d_eo"] = g[:, None] * dn[rows]
    ref["d_gate"], ref["d_gate_scale"] = np.zeros(order.size), np.zeros(order.size)
    ref["d_gate"][order] = np.sum(dn[rows] * eo, axis=1)
    ref["d_gate_scale"][order] = np.sum(np.abs(dn[rows] * eo), axis=1)
    gate_sum = np.zeros(N)
    np.add.at(gate_sum, rows, g)
    ref["trip"] = gate_sum[:, None] * x
    ref["trip_scale"] = np.abs(ref["trip"])
    ref["trip_dx"], ref["trip_dgate"] = autograd_round_trip(case, x, dn)
    ref["trip_dx_scale"] = np.zeros((N, C))
    np.add.at(ref["trip_dx_scale"], rows, np.abs(g[:, None] * dn[rows]))
    ref["trip_dgate_scale"] = np.zeros(order.size)
    ref["trip_dgate_scale"][order] = np.sum(np.abs(dn[rows] * x[rows]), axis=1)
    return ref


def autograd_round_trip(case, x, dout):
    """d/dx and d/dgate of sum(dout * combine(permute(x), gate)), torch float64 autograd."""
    order, rows = torch.from_numpy(case["order"].astype(np.int64)), \
        torch.from_numpy(case["rows"].astype(np.int64))
    xt = torch.from_numpy(x).requires_grad_()
    gt = torch.from_numpy(case["gate"].astype(np.float64)).requires_grad_()
    dispatched = xt[rows]
    out = torch.zeros_like(xt).index_add(0, rows, gt[order][:, None] * dispatched)
    (out * torch.from_numpy(dout)).sum().backward()
    return xt.grad.numpy(), gt.grad.numpy()


def check_case(lib, rng, N, top_k, C, dt):
    name = f"N={N} top_k={top_k} C={C} {DT_NAME[dt]}"
    case = make_case(lib, rng, N, top_k, C, dt)
    if dt == F32:
        check_plan(name, case["expert"], case["order"], case["position"], case["counts"])
    got = run_ops(lib, case, dt)
    ref = references(case, dt)
    report(np.array_equal(got["perm"], case["x"][case["rows"]]),
           f"{name} moe_permute: exactly in[rows]")
    f64 = {key: to_float64(got[key], dt) for key in ("din", "comb", "d_eo", "trip", "trip_dx")}
    close_dt(f"{name} moe_unpermute_backward", f64["din"], ref["din"], ref["din_scale"], dt)
    close_dt(f"{name} moe_combine", f64["comb"], ref["comb"], ref["comb_scale"], dt)
    close_dt(f"{name} moe_combine_backward d_expert_out", f64["d_eo"], ref["d_eo"],
             np.abs(ref["d_eo"]), dt)
    close_scaled(f"{name} moe_combine_backward d_gate", got["d_gate"], ref["d_gate"],
                 ref["d_gate_scale"])
    close_dt(f"{name} round trip = (sum_j gate) x", f64["trip"], ref["trip"], ref["trip_scale"],
             dt)
    if dt == F32:
        close_scaled(f"{name} round trip dx = autograd", f64["trip_dx"], ref["trip_dx"],
                     ref["trip_dx_scale"])
    else:
        close(f"{name} round trip dx = autograd", f64["trip_dx"], ref["trip_dx"], 1e-2)
    close_scaled(f"{name} round trip dgate = autograd", got["trip_dgate"], ref["trip_dgate"],
                 ref["trip_dgate_scale"])
    return case, got


def same_bits(a, b):
    return all(np.array_equal(a[key].view(np.uint8), b[key].view(np.uint8)) for key in a)


def check_determinism(lib, rng, dt):
    """2 threads set explicitly: importing torch leaves OpenMP at 1 thread on some machines."""
    case = make_case(lib, rng, 1024, 2, 64, dt)
    lib.op_set_num_threads(2)
    first = run_ops(lib, case, dt)
    again = run_ops(lib, case, dt)
    lib.op_set_num_threads(1)
    one = run_ops(lib, case, dt)
    lib.op_set_num_threads(2)
    report(same_bits(first, again) and same_bits(first, one),
           f"N=1024 top_k=2 C=64 {DT_NAME[dt]}: same bits on a second call and on 1 thread")


def main():
    seed = int(os.environ.get("MOE_SEED", np.random.SeedSequence().entropy % (1 << 31)))
    print(f"test_moe_dispatch: seed {seed} (MOE_SEED={seed} repeats this run)")
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    lib = load_library(LIB)
    for dt in (F32, BF16):
        for N in (1, 7, 33):
            for top_k in (1, 2, 3):
                for C in (1, 5, 64):
                    check_case(lib, rng, N, top_k, C, dt)
        check_determinism(lib, rng, dt)
    report.finish("test_moe_dispatch")


if __name__ == "__main__":
    main()
