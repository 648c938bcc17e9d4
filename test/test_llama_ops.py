#!/usr/bin/python3
"""test/test_llama_ops.py - Llama's layers in the CPU backend (rmsnorm_forward/backward,
rope_forward/backward, swiglu_forward/backward; contracts in kernels/ops_decls.h) against PyTorch
float64, gradients by autograd.

The references are written here from Hugging Face's LlamaRMSNorm, apply_rotary_pos_emb (with
rotate_half: the two halves of a head, cos and sin duplicated over both) and LlamaMLP's
silu(gate) * up, in float64; nothing is taken from the code under test. The RoPE tables the ops
read are made here the way the model makes them (inv_freq[j] = theta^(-2j/HS), angle =
p * inv_freq[j], cos/sin in double, rounded to fp32), but the reference uses the float64 cos/sin
themselves, so the tables' rounding is part of the measured error.

Sizes are awkward: C, F not multiples of 8 (37, 203, 777), N = 1, HS with an odd half (HS = 6,
10), NH = 6 with NKV = 2 (GQA), NKV = 1 (one kv head) and NKV = NH; positions nullptr (p = t)
and a context-parallel zigzag list (rank 1 of 3: two chunks, far apart in the sequence) and
positions near 4000 with theta = 500000. Fresh random inputs every run (the seed is printed;
OPS_SEED=<n> repeats a run). Outputs that are written are poisoned with NaN first; "+=" outputs
start at random values and the increment is compared.

Tolerances, relative error ||got - ref|| / ||ref||, about 10x the largest error measured:
  fp32 outputs and fp32 gradients (out, rstd, dinp, dweight, q/k rotations)   see FP32_TOL
  bf16 outputs (inputs rounded to bf16 first, the reference from those)      BF16_TOL
Exact checks: RoPE leaves the v columns bitwise untouched (forward and backward); RoPE backward
after forward returns the input (to the fp32 rounding); 1 vs 2 OpenMP threads bitwise equal.

Run: /usr/bin/python3 test/test_llama_ops.py   (OPS_LIB overrides build/libops_cpu.so; exit
status 1 on failure)
"""
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from opslib import LIB, Fl, I, P, load  # noqa: E402
from test_ops import (BF16, DT_NAME, F32, Library, Report, device, host, poisoned,  # noqa: E402
                      randn, rounded, same_bits)

FP32_TOL = {"rmsnorm": 1e-6, "rope": 1e-6, "swiglu": 2e-6}  # measured <= 7.6e-8, 5.6e-8, 3.5e-7
FP32_GRAD_TOL = 1e-6  # fp32 "+=" gradients (dinp of fp32 runs, dweight of both): <= 8.7e-8
BF16_TOL = 1e-2       # outputs stored in bf16: one rounding each, measured <= 2.5e-3


def load_library(path):
    return Library(load(path, {
        "op_rmsnorm_forward": [P, P, P, P, I, I, Fl, I],
        "op_rmsnorm_backward": [P, P, P, P, P, P, I, I, I],
        "op_rope_forward": [P, P, P, P, I, I, I, I, I, I],
        "op_rope_backward": [P, P, P, P, I, I, I, I, I, I],
        "op_swiglu_forward": [P, P, I, I, I],
        "op_swiglu_backward": [P, P, P, I, I, I],
        "op_set_num_threads": [I],
    }))


def tol(dt, op):
    return FP32_TOL[op] if dt == F32 else BF16_TOL


# --- RMSNorm -------------------------------------------------------------------------------------
def rmsnorm_ref(x, w, eps):
    """Hugging Face LlamaRMSNorm in float64."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def test_rmsnorm(lib, r, dt):
    for N, C, eps in [(3, 37, 1e-5), (14, 37, 1e-6), (1, 8, 1e-5), (33, 203, 1e-5),
                      (130, 777, 1e-5), (5, 40, 0.5)]:
        tag = f"rmsnorm {DT_NAME[dt]} N={N} C={C} eps={eps:g}"
        x = randn(N, C, scale=2.0) + 0.5
        x[0] *= 0.01  # a small row, where eps matters
        w = 1.0 + randn(C, scale=0.3)
        x_d, w_d = device(x, dt), device(w, dt)
        out, rstd = poisoned(N * C, dt), poisoned(N)
        lib.op_rmsnorm_forward(out, rstd, x_d, w_d, N, C, eps, dt)
        xr = rounded(x, dt).requires_grad_()
        wr = rounded(w, dt).requires_grad_()
        ref = rmsnorm_ref(xr, wr, eps)
        r.close(tag + " out", host(out, dt), ref, tol(dt, "rmsnorm"))
        r.close(tag + " rstd", host(rstd), torch.rsqrt(xr.detach().pow(2).mean(-1) + eps),
                FP32_GRAD_TOL)

        dout = randn(N, C)
        ref.backward(rounded(dout, dt))
        dinp = device(randn(N, C), dt)
        dinp0 = host(dinp, dt)
        dw = device(randn(C), F32)
        dw0 = dw.copy()
        lib.op_rmsnorm_backward(dinp, dw, device(dout, dt), x_d, w_d, rstd, N, C, dt)
        if dt == F32:
            r.close(tag + " dinp (+=)", host(dinp) - dinp0, xr.grad, FP32_GRAD_TOL)
        else:  # a bf16 sum is rounded: compare the stored sum
            r.close(tag + " dinp (+=)", host(dinp, dt), dinp0 + xr.grad, BF16_TOL)
        r.close(tag + " dweight (+=)", host(dw) - host(dw0), wr.grad, FP32_GRAD_TOL)


# --- RoPE ----------------------------------------------------------------------------------------
def rope_angles(positions, HS, theta):
    """(len(positions), HS/2) float64 angles p * theta^(-2j/HS)."""
    j = torch.arange(HS // 2, dtype=torch.float64)
    inv_freq = 1.0 / theta ** (2.0 * j / HS)
    return torch.as_tensor(positions, dtype=torch.float64)[:, None] * inv_freq[None, :]


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_ref(qkv, pos, NH, NKV, HS, theta):
    """Hugging Face apply_rotary_pos_emb on the q and k heads of qkv (B, T, (NH + 2 NKV) HS)."""
    B, T, _ = qkv.shape
    ang = rope_angles(pos, HS, theta)
    cos = torch.cat((ang.cos(), ang.cos()), -1)[None, :, None, :]  # (1, T, 1, HS)
    sin = torch.cat((ang.sin(), ang.sin()), -1)[None, :, None, :]
    qk = qkv[..., :(NH + NKV) * HS].reshape(B, T, NH + NKV, HS)
    qk = qk * cos + rotate_half(qk) * sin
    return torch.cat((qk.reshape(B, T, -1), qkv[..., (NH + NKV) * HS:]), -1)


def zigzag_positions(chunk, ranks, rank):
    """Context parallelism's zigzag: rank r holds chunks r and 2 ranks - 1 - r of the sequence."""
    second = 2 * ranks - 1 - rank
    return np.concatenate([np.arange(rank * chunk, (rank + 1) * chunk),
                           np.arange(second * chunk, (second + 1) * chunk)]).astype(np.int32)


ROPE_CASES = [  # B, T, NH, NKV, HS, positions ("none", "zigzag" or "far"), theta
    (3, 7, 6, 2, 10, "none", 10000.0),
    (2, 10, 6, 1, 6, "zigzag", 10000.0),
    (1, 1, 3, 3, 10, "far", 500000.0),
    (2, 13, 6, 2, 64, "far", 500000.0),
    (2, 10, 4, 4, 18, "zigzag", 500000.0),
    (4, 64, 6, 2, 64, "none", 500000.0),
]


def rope_positions(kind, T):
    """(positions array or None, the positions the reference uses, the tables' maxT)."""
    if kind == "none":
        return None, np.arange(T), T + 3
    if kind == "zigzag":
        pos = zigzag_positions(T // 2, 3, 1)
        return pos, pos, 3 * T
    pos = (4000 + np.random.permutation(T) * 7).astype(np.int32)
    return pos, pos, 4100


def test_rope(lib, r, dt):
    for B, T, NH, NKV, HS, kind, theta in ROPE_CASES:
        tag = f"rope {DT_NAME[dt]} B={B} T={T} NH={NH} NKV={NKV} HS={HS} {kind}"
        pos_d, pos, maxT = rope_positions(kind, T)
        ang = rope_angles(np.arange(maxT), HS, theta)
        cos_t, sin_t = ang.cos().float().numpy().copy(), ang.sin().float().numpy().copy()
        W = (NH + 2 * NKV) * HS
        x = randn(B, T, W, scale=1.5)
        buf = device(x, dt)
        lib.op_rope_forward(buf, cos_t, sin_t, pos_d, B, T, NH, NKV, HS, dt)
        xr = rounded(x, dt).requires_grad_()
        ref = rope_ref(xr, pos, NH, NKV, HS, theta)
        qk = (NH + NKV) * HS
        got = host(buf, dt).view(B, T, W)
        r.close(tag + " forward q,k", got[..., :qk], ref[..., :qk], tol(dt, "rope"))
        r.exact(tag + " forward v untouched",
                same_bits(buf.reshape(B, T, W)[..., qk:], device(x, dt).reshape(B, T, W)[..., qk:]))

        dout = randn(B, T, W)
        ref.backward(rounded(dout, dt))
        dbuf = device(dout, dt)
        lib.op_rope_backward(dbuf, cos_t, sin_t, pos_d, B, T, NH, NKV, HS, dt)
        dgot = host(dbuf, dt).view(B, T, W)
        r.close(tag + " backward dq,dk", dgot[..., :qk], xr.grad[..., :qk], tol(dt, "rope"))
        r.exact(tag + " backward dv untouched", same_bits(
            dbuf.reshape(B, T, W)[..., qk:], device(dout, dt).reshape(B, T, W)[..., qk:]))
        if dt == F32:  # the backward is the inverse rotation: it undoes the forward
            lib.op_rope_backward(buf, cos_t, sin_t, pos_d, B, T, NH, NKV, HS, dt)
            r.close(tag + " backward(forward(x)) = x", host(buf), rounded(x, dt).flatten(),
                    FP32_TOL["rope"])


# --- SwiGLU --------------------------------------------------------------------------------------
def test_swiglu(lib, r, dt):
    for N, F in [(3, 37), (14, 37), (1, 1), (33, 203), (130, 300)]:
        tag = f"swiglu {DT_NAME[dt]} N={N} F={F}"
        x = randn(N, 2 * F, scale=3.0)
        x[0, 0] = 95.0  # saturated sigmoids (exp(-x) underflows / overflows)
        if N * F > 1:  # not alone in the output, where its tiny reference would be the norm
            x[-1, F - 1] = -95.0
        x_d = device(x, dt)
        out = poisoned(N * F, dt)
        lib.op_swiglu_forward(out, x_d, N, F, dt)
        xr = rounded(x, dt).requires_grad_()
        gate, up = xr[:, :F], xr[:, F:]
        ref = torch.nn.functional.silu(gate) * up
        r.close(tag + " out", host(out, dt), ref, tol(dt, "swiglu"))

        dout = randn(N, F)
        ref.backward(rounded(dout, dt))
        dinp = poisoned(N * 2 * F, dt)
        lib.op_swiglu_backward(dinp, device(dout, dt), x_d, N, F, dt)
        dgot = host(dinp, dt).view(N, 2 * F)
        r.close(tag + " d gate", dgot[:, :F], xr.grad[:, :F], tol(dt, "swiglu"))
        r.close(tag + " d up", dgot[:, F:], xr.grad[:, F:], tol(dt, "swiglu"))


# --- Thread-count independence -------------------------------------------------------------------
def test_threads(lib, r):
    N, C = 130, 777
    x, w, d = device(randn(N, C), BF16), device(randn(C), BF16), device(randn(N, C), BF16)
    rstd = poisoned(N)
    lib.op_rmsnorm_forward(poisoned(N * C, BF16), rstd, x, w, N, C, 1e-5, BF16)
    dinp0, dw0 = device(randn(N, C), BF16), device(randn(C), F32)

    def rmsnorm():
        out, rs, dinp, dw = poisoned(N * C, BF16), poisoned(N), dinp0.copy(), dw0.copy()
        lib.op_rmsnorm_forward(out, rs, x, w, N, C, 1e-5, BF16)
        lib.op_rmsnorm_backward(dinp, dw, d, x, w, rstd, N, C, BF16)
        return [out, rs, dinp, dw]

    B, T, NH, NKV, HS = 4, 64, 6, 2, 64
    ang = rope_angles(np.arange(T), HS, 500000.0)
    cos_t, sin_t = ang.cos().float().numpy().copy(), ang.sin().float().numpy().copy()
    qkv = device(randn(B, T, (NH + 2 * NKV) * HS), F32)

    def rope():
        a, b = qkv.copy(), qkv.copy()
        lib.op_rope_forward(a, cos_t, sin_t, None, B, T, NH, NKV, HS, F32)
        lib.op_rope_backward(b, cos_t, sin_t, None, B, T, NH, NKV, HS, F32)
        return [a, b]

    Ns, Fs = 130, 300
    xs, ds = device(randn(Ns, 2 * Fs), F32), device(randn(Ns, Fs), F32)

    def swiglu():
        out, dinp = poisoned(Ns * Fs), poisoned(Ns * 2 * Fs)
        lib.op_swiglu_forward(out, xs, Ns, Fs, F32)
        lib.op_swiglu_backward(dinp, ds, xs, Ns, Fs, F32)
        return [out, dinp]

    for name, fn in [("rmsnorm bf16", rmsnorm), ("rope", rope), ("swiglu", swiglu)]:
        results = []
        for threads in (1, 2):
            lib.op_set_num_threads(threads)
            results.append(fn())
        r.exact(f"threads 1 vs 2, bitwise: {name}", all(map(same_bits, *results)))
    lib.op_set_num_threads(2)


def main():
    seed = int(os.environ.get("OPS_SEED", int.from_bytes(os.urandom(4), "little")))
    print(f"test_llama_ops: {LIB}, seed {seed} (OPS_SEED={seed} repeats this run)")
    torch.manual_seed(seed)
    np.random.seed(seed)
    torch.set_num_threads(1)
    lib = load_library(LIB)
    lib.op_set_num_threads(2)
    r = Report()
    start = time.time()
    for dt in (F32, BF16):
        for test in (test_rmsnorm, test_rope, test_swiglu):
            print(f"{test.__name__} {DT_NAME[dt]}")
            test(lib, r, dt)
    print("test_threads")
    test_threads(lib, r)
    r.only.finish(r.checks)  # a filtered run that matched nothing fails below (no checks)
    print(f"{r.checks} checks, {len(r.failures)} failures, {time.time() - start:.1f} s, seed {seed}")
    for name in r.failures:
        print(f"FAILED: {name}")
    return 1 if r.failures or r.checks == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
