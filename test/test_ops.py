#!/usr/bin/python3
"""test/test_ops.py - every op of the CPU backend against PyTorch in float64.

The CPU backend is the oracle the CUDA backend and every parallelism are tested against, so it is
tested here against an independent reference: PyTorch float64, gradients by autograd. Fresh
random inputs every run (the seed is printed; OPS_SEED=<n> repeats a run), awkward sizes (C = 37,
T = 1, B = 3, NH = 3 with HS = 5, V = 1000 padded to 1024 with huge values in the padding).
Attention also runs grouped-query (NKV kv heads < NH query heads: 6/3, 4/1, 4/2, 2/1); its
reference repeats each kv head NH/NKV times (repeat_interleave, whose autograd sums the repeated
heads' gradients back into dk, dv).

Tolerances, relative error ||got - ref|| / ||ref||:
  fp32 runs                                            1e-5
  bf16 runs, outputs stored in bf16                    1e-2 (inputs rounded to bf16 first and
                                                       the reference computed from those)
  bf16 runs, fp32 outputs (weight grads, lse, losses)  1e-5 (exact bf16 inputs, fp32 sums)
Outputs that are written are first poisoned with NaN; outputs that accumulate ("+=") start at
random values and the test compares got - start with the reference. Bitwise checks: 1 vs 2
OpenMP threads, pieces of a batch / of the output columns / of the heads computed alone against
the same pieces of the whole, bf16 casts against torch's rounding, AdamW against
torch.optim.AdamW.

Run: OPS_LIB=build/libops_cpu.so /usr/bin/python3 test/test_ops.py   (exit status 1 on failure)
"""
import ctypes
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Filter  # noqa: E402

F32, BF16 = 0, 1
DT_NAME = {F32: "fp32", BF16: "bf16"}
TOL = {F32: 1e-5, BF16: 1e-2}
TOL_FP32_OUT = 1e-5  # fp32 outputs (grads of weights, lse, losses) whatever the compute dtype


# ------------------------------------------------------------------------------------------------
# The library
# ------------------------------------------------------------------------------------------------
def load_library(path):
    lib = ctypes.CDLL(path)
    P, I, Z, Fl = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_float
    signatures = {
        "op_set_num_threads": [I],
        "op_alloc": [Z],
        "op_release": [P],
        "op_memory_in_use": [],
        "op_memory_peak": [],
        "op_encoder_forward": [P, P, P, P, I, I, I, I],
        "op_encoder_backward": [P, P, P, P, I, I, I, I],
        "op_layernorm_forward": [P, P, P, P, P, P, I, I, I],
        "op_layernorm_backward": [P, P, P, P, P, P, P, P, I, I, I],
        "op_matmul_forward": [P, P, P, P, P, P, I, I, I, I],
        "op_matmul_backward": [P, P, P, P, P, P, P, I, I, I, I],
        "op_gelu_forward": [P, P, Z, I],
        "op_gelu_backward": [P, P, P, Z, I],
        "op_attention_forward": [P, P, P, I, I, I, I, I, I],
        "op_attention_backward": [P, P, P, P, P, I, I, I, I, I, I],
        "op_classifier_forward_backward": [P, P, P, Fl, I, I, I, I],
        "op_adamw_update": [P, P, P, P, P, Z, Fl, Fl, Fl, Fl, Fl, Fl, I, I],
        "op_sum_squares_accumulate": [P, P, Z],
        "op_sum_accumulate": [P, P, Z, Fl],
        "op_add_inplace": [P, P, Z],
        "op_cast": [P, I, P, I, Z],
    }
    for name, args in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = None
    lib.op_alloc.restype = P
    lib.op_memory_in_use.restype = Z
    lib.op_memory_peak.restype = Z
    return Library(lib)


class Library:
    """The C functions, callable with numpy arrays (passed as pointers) and None (nullptr)."""

    def __init__(self, lib):
        self._lib = lib

    def __getattr__(self, name):
        fn = getattr(self._lib, name)

        def call(*args):  # `args` keeps every array alive until the call returns
            return fn(*[a.ctypes.data if isinstance(a, np.ndarray) else a for a in args])

        return call


# ------------------------------------------------------------------------------------------------
# Buffers: numpy arrays holding fp32 values or bf16 bits, converted from and to float64 tensors
# ------------------------------------------------------------------------------------------------
def bf16_bits(t):
    """float tensor -> uint16 array of its bf16 rounding (torch: round to nearest even)."""
    return t.detach().float().to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).copy()


def from_bf16_bits(a):
    return torch.from_numpy((a.astype(np.uint32) << 16).view(np.float32)).double()


def device(t, dt):
    """The buffer an op reads: fp32 values or bf16 bits of the float64 tensor t."""
    if dt == F32:
        return t.detach().float().numpy().copy()
    return bf16_bits(t)


def host(a, dt=F32):
    """float64 tensor of the values in a buffer."""
    return from_bf16_bits(a) if dt == BF16 else torch.from_numpy(a.astype(np.float64))


def rounded(t, dt):
    """The values an op sees when given device(t, dt)."""
    return host(device(t, dt), dt)


def poisoned(shape, dt=F32):
    """An output buffer filled with NaN (all bits set), so that unwritten elements show."""
    a = np.empty(shape, dtype=np.float32 if dt == F32 else np.uint16)
    a.view(np.uint8).fill(0xFF)
    return a


def randn(*shape, scale=1.0):
    return torch.randn(*shape, dtype=torch.float64) * scale


# ------------------------------------------------------------------------------------------------
# Checks
# ------------------------------------------------------------------------------------------------
class Report:
    """The checks' tally; honours TEST_ONLY (test/checks.py): only the checks it names count."""

    def __init__(self):
        self.checks = 0
        self.failures = []
        self.only = Filter()

    def close(self, name, got, ref, tol):
        got, ref = got.double().flatten(), ref.double().flatten()
        finite = bool(torch.isfinite(got).all())
        err = float((got - ref).norm() / (ref.norm() + 1e-30)) if finite else float("nan")
        ok = finite and err < tol
        self.record(name, ok, f"rel err {err:.2e} (tol {tol:.0e})" + ("" if finite else " non-finite"))

    def exact(self, name, ok):
        self.record(name, bool(ok), "")

    def record(self, name, ok, detail):
        if not self.only.counts(name):
            return
        self.checks += 1
        if not ok:
            self.failures.append(name)
        print(f"  {name:<58} {detail}{' ' if detail else ''}{'ok' if ok else 'FAIL'}")


def accumulated(report, name, got, start, ref, tol):
    """An fp32 "+=" output: got - start must equal the reference increment."""
    report.close(name + " (+=)", host(got) - host(start), ref, tol)


def gelu_ref(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


# ------------------------------------------------------------------------------------------------
# Op tests
# ------------------------------------------------------------------------------------------------
def test_encoder(lib, r, dt):
    for B, T, C, V, Vp, maxT in [(3, 5, 37, 7, 16, 9), (1, 1, 8, 3, 4, 1), (2, 17, 100, 50, 128, 20)]:
        tag = f"encoder {DT_NAME[dt]} B={B} T={T} C={C}"
        tokens = torch.randint(0, V, (B, T), dtype=torch.int32).numpy()
        wte, wpe = randn(Vp, C), randn(maxT, C)
        wte_d, wpe_d = device(wte, dt), device(wpe, dt)
        out = poisoned(B * T * C, dt)
        lib.op_encoder_forward(out, tokens, wte_d, wpe_d, B, T, C, dt)
        wte_r = rounded(wte, dt).requires_grad_()
        wpe_r = rounded(wpe, dt).requires_grad_()
        ref = wte_r[torch.from_numpy(tokens).long()] + wpe_r[:T].unsqueeze(0)
        r.close(tag + " forward", host(out, dt), ref, TOL[dt])

        dout = randn(B, T, C)
        dout_d = device(dout, dt)
        ref.backward(rounded(dout, dt).view(B, T, C))
        dwte, dwpe = device(randn(Vp, C), F32), device(randn(maxT, C), F32)
        dwte0, dwpe0 = dwte.copy(), dwpe.copy()
        lib.op_encoder_backward(dwte, dwpe, dout_d, tokens, B, T, C, dt)
        accumulated(r, tag + " dwte", dwte, dwte0, wte_r.grad.flatten(), TOL_FP32_OUT)
        accumulated(r, tag + " dwpe", dwpe, dwpe0, wpe_r.grad.flatten(), TOL_FP32_OUT)


def test_layernorm(lib, r, dt):
    for N, C in [(3, 37), (14, 37), (1, 8), (33, 200)]:
        tag = f"layernorm {DT_NAME[dt]} N={N} C={C}"
        x = randn(N, C, scale=2.0) + 3.0  # an offset mean tests the variance's numerics
        w, b = 1.0 + randn(C, scale=0.3), randn(C, scale=0.3)
        x_d, w_d, b_d = device(x, dt), device(w, dt), device(b, dt)
        out, mean, rstd = poisoned(N * C, dt), poisoned(N), poisoned(N)
        lib.op_layernorm_forward(out, mean, rstd, x_d, w_d, b_d, N, C, dt)
        xr = rounded(x, dt).requires_grad_()
        wr = rounded(w, dt).requires_grad_()
        br = rounded(b, dt).requires_grad_()
        ref = F.layer_norm(xr, (C,), wr, br, 1e-5)
        r.close(tag + " out", host(out, dt), ref, TOL[dt])
        xd = xr.detach()
        r.close(tag + " mean", host(mean), xd.mean(-1), TOL_FP32_OUT)
        r.close(tag + " rstd", host(rstd), 1.0 / torch.sqrt(xd.var(-1, unbiased=False) + 1e-5), TOL_FP32_OUT)

        dout = randn(N, C)
        ref.backward(rounded(dout, dt))
        dinp = device(randn(N, C), dt)
        dinp0 = host(dinp, dt)
        dw, db = device(randn(C), F32), device(randn(C), F32)
        dw0, db0 = dw.copy(), db.copy()
        lib.op_layernorm_backward(dinp, dw, db, device(dout, dt), x_d, w_d, mean, rstd, N, C, dt)
        if dt == F32:
            r.close(tag + " dinp (+=)", host(dinp) - dinp0, xr.grad, TOL[dt])
        else:  # a bf16 sum is rounded: compare the stored sum
            r.close(tag + " dinp (+=)", host(dinp, dt), dinp0 + xr.grad, TOL[dt])
        accumulated(r, tag + " dweight", dw, dw0, wr.grad, TOL_FP32_OUT)
        accumulated(r, tag + " dbias", db, db0, br.grad, TOL_FP32_OUT)


def test_matmul(lib, r, dt):
    # (bias, residual, gelu) epilogues; the GELU epilogue takes no residual
    every = [(True, False, False), (True, True, False), (False, True, False), (True, False, True),
             (False, False, True), (False, False, False)]
    # sums longer than 256 (the GEMM's k-chunk): 517 in the forward, 300 and 270 in the backward
    cases = [((21, 37, 53), every), ((67, 130, 200), every[1::2]), ((1, 5, 3), every[0::2]),
             ((40, 64, 9), every[1::2]), ((37, 517, 45), every[0:2]), ((300, 20, 270), every[3:4])]
    for (N, C, OC), variants in cases:
        for has_bias, has_res, has_gelu in variants:
            tag = (f"matmul {DT_NAME[dt]} N={N} C={C} OC={OC}" + (" bias" if has_bias else "")
                   + (" residual" if has_res else "") + (" gelu" if has_gelu else ""))
            x, w = randn(N, C), randn(OC, C, scale=C ** -0.5)
            b = randn(OC) if has_bias else None
            res = randn(N, OC) if has_res else None
            x_d, w_d = device(x, dt), device(w, dt)
            b_d = device(b, dt) if has_bias else None
            res_d = device(res, dt) if has_res else None
            out = poisoned(N * OC, dt)
            pre = poisoned(N * OC, dt) if has_gelu else None
            lib.op_matmul_forward(out, pre, x_d, w_d, b_d, res_d, N, C, OC, dt)
            xr, wr = rounded(x, dt).requires_grad_(), rounded(w, dt).requires_grad_()
            br = rounded(b, dt).requires_grad_() if has_bias else None
            y = xr @ wr.t()
            if has_bias:
                y = y + br
            if has_res:
                y = y + rounded(res, dt)
            if has_gelu:
                r.close(tag + " pre_gelu", host(pre, dt), y, TOL[dt])
                r.close(tag + " out", host(out, dt), gelu_ref(y), TOL[dt])
            else:
                r.close(tag + " out", host(out, dt), y, TOL[dt])

            # backward of y = x @ w^T + b, with the GELU that produced x fused when has_gelu
            dout = randn(N, OC)
            (xr @ wr.t() + (br if has_bias else 0)).backward(rounded(dout, dt))
            dinp = poisoned(N * C, dt)
            dw = device(randn(OC, C), F32)
            db = device(randn(OC), F32) if has_bias else None
            dw0, db0 = dw.copy(), (db.copy() if has_bias else None)
            g = randn(N, C, scale=2.0) if has_gelu else None
            g_d = device(g, dt) if has_gelu else None
            lib.op_matmul_backward(dinp, dw, db, device(dout, dt), x_d, w_d, g_d, N, C, OC, dt)
            dinp_ref = xr.grad
            if has_gelu:
                gr = rounded(g, dt).requires_grad_()
                dinp_ref = dinp_ref * torch.autograd.grad(gelu_ref(gr).sum(), gr)[0]
            r.close(tag + " dinp", host(dinp, dt), dinp_ref, TOL[dt])
            accumulated(r, tag + " dweight", dw, dw0, wr.grad, TOL_FP32_OUT)
            if has_bias:
                accumulated(r, tag + " dbias", db, db0, br.grad, TOL_FP32_OUT)

    # dinp may be nullptr; dweight alone must still be right
    N, C, OC = 9, 37, 11
    x, dout = randn(N, C), randn(N, OC)
    dw = device(randn(OC, C), F32)
    dw0 = dw.copy()
    lib.op_matmul_backward(None, dw, None, device(dout, dt), device(x, dt),
                           device(randn(OC, C), dt), None, N, C, OC, dt)
    accumulated(r, f"matmul {DT_NAME[dt]} dinp=nullptr dweight", dw, dw0,
                rounded(dout, dt).t() @ rounded(x, dt), TOL_FP32_OUT)

    # The backward split in two (zero-bubble pipeline schedules): the input gradient alone (inp
    # not read: a NaN-filled buffer must not leak in), then the weight and bias gradients alone
    # (weight and gelu_input not read), and dbias alone.
    N, C, OC = 13, 29, 19
    x, w, dout, g = randn(N, C), randn(OC, C, scale=C ** -0.5), randn(N, OC), randn(N, C)
    nan_inp, nan_w = poisoned(N * C, dt), poisoned(OC * C, dt)
    dinp = poisoned(N * C, dt)
    lib.op_matmul_backward(dinp, None, None, device(dout, dt), nan_inp, device(w, dt),
                           device(g, dt), N, C, OC, dt)
    gr = rounded(g, dt).requires_grad_()
    gelu_grad = torch.autograd.grad(gelu_ref(gr).sum(), gr)[0]
    r.close(f"matmul {DT_NAME[dt]} dinp alone (gelu)", host(dinp, dt),
            (rounded(dout, dt) @ rounded(w, dt)) * gelu_grad, TOL[dt])
    dw, db = device(randn(OC, C), F32), device(randn(OC), F32)
    dw0, db0 = dw.copy(), db.copy()
    lib.op_matmul_backward(None, dw, db, device(dout, dt), device(x, dt), nan_w, nan_inp, N, C,
                           OC, dt)
    accumulated(r, f"matmul {DT_NAME[dt]} dweight and dbias alone", dw, dw0,
                rounded(dout, dt).t() @ rounded(x, dt), TOL_FP32_OUT)
    accumulated(r, f"matmul {DT_NAME[dt]} dweight and dbias alone: dbias", db, db0,
                rounded(dout, dt).sum(0), TOL_FP32_OUT)
    db0 = db.copy()
    lib.op_matmul_backward(None, None, db, device(dout, dt), nan_inp, nan_w, None, N, C, OC, dt)
    accumulated(r, f"matmul {DT_NAME[dt]} dbias alone", db, db0, rounded(dout, dt).sum(0),
                TOL_FP32_OUT)


def test_gelu(lib, r, dt):
    n = 1037
    x = randn(n, scale=3.0)
    x_d = device(x, dt)
    out = poisoned(n, dt)
    lib.op_gelu_forward(out, x_d, n, dt)
    xr = rounded(x, dt).requires_grad_()
    y = gelu_ref(xr)
    r.close(f"gelu {DT_NAME[dt]} forward", host(out, dt), y, TOL[dt])
    dout = randn(n)
    y.backward(rounded(dout, dt))
    dinp = poisoned(n, dt)
    lib.op_gelu_backward(dinp, x_d, device(dout, dt), n, dt)
    r.close(f"gelu {DT_NAME[dt]} backward", host(dinp, dt), xr.grad, TOL[dt])
    inplace = device(dout, dt)  # dinp aliasing dout
    lib.op_gelu_backward(inplace, x_d, inplace, n, dt)
    r.exact(f"gelu {DT_NAME[dt]} backward in place (dinp = dout), bitwise", np.array_equal(inplace, dinp))


def attention_ref(qkv, B, T, NH, NKV, HS):
    """Causal attention of packed qkv [q: NH heads | k: NKV | v: NKV]; query head h uses kv head
    h // (NH/NKV), here by repeating the kv heads (the op under test reads them in place)."""
    C, Ckv = NH * HS, NKV * HS
    q = qkv[..., :C].reshape(B, T, NH, HS).transpose(1, 2)
    k, v = (qkv[..., C + i * Ckv:C + (i + 1) * Ckv].reshape(B, T, NKV, HS).transpose(1, 2)
            .repeat_interleave(NH // NKV, dim=1) for i in range(2))
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(HS)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    scores = scores.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # (B, NH, T)
    out = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    return out, lse


def test_attention(lib, r, dt):
    shapes = [(3, 1, 3, 3, 5), (2, 9, 3, 3, 5), (1, 33, 2, 2, 16), (2, 20, 1, 1, 64),
              (2, 9, 6, 3, 5), (1, 33, 4, 1, 16), (3, 13, 4, 2, 7), (3, 1, 2, 1, 5)]
    for B, T, NH, NKV, HS in shapes:
        tag = f"attention {DT_NAME[dt]} B={B} T={T} NH={NH} NKV={NKV} HS={HS}"
        C, width = NH * HS, (NH + 2 * NKV) * HS
        qkv = randn(B, T, width, scale=1.5)
        qkv_d = device(qkv, dt)
        out, lse = poisoned(B * T * C, dt), poisoned(B * NH * T)
        lib.op_attention_forward(out, lse, qkv_d, B, T, NH, NKV, HS, dt)
        qr = rounded(qkv, dt).requires_grad_()
        out_ref, lse_ref = attention_ref(qr, B, T, NH, NKV, HS)
        r.close(tag + " out", host(out, dt), out_ref, TOL[dt])
        r.close(tag + " lse", host(lse), lse_ref.detach(), TOL_FP32_OUT)
        dout = randn(B, T, C)
        out_ref.backward(rounded(dout, dt))
        dqkv = poisoned(B * T * width, dt)
        lib.op_attention_backward(dqkv, device(dout, dt), qkv_d, out, lse, B, T, NH, NKV, HS, dt)
        r.close(tag + " dqkv", host(dqkv, dt), qr.grad, TOL[dt])


def test_classifier(lib, r, dt):
    for B, T, V, Vp in [(3, 5, 1000, 1024), (1, 1, 7, 128)]:
        tag = f"classifier {DT_NAME[dt]} N={B * T} V={V} Vp={Vp}"
        N = B * T
        logits = randn(N, Vp, scale=2.0)
        logits[:, V:] = 1e4  # padded columns must not leak into the loss or the gradient
        targets = torch.randint(0, V, (N,), dtype=torch.int32)
        if N > 2:
            targets[1] = -1  # ignored
        targets = targets.numpy()
        lr_ = rounded(logits, dt)
        live = torch.from_numpy(targets) >= 0

        # forward only: losses, logits untouched
        buf = device(logits, dt)
        before = buf.copy()
        losses = poisoned(N)
        lib.op_classifier_forward_backward(buf, losses, targets, 0.0, N, V, Vp, dt)
        x = lr_[:, :V].clone().requires_grad_()
        ref = F.cross_entropy(x, torch.from_numpy(targets).long(), ignore_index=-1, reduction="none")
        r.close(tag + " losses", host(losses), ref.detach(), TOL_FP32_OUT)
        r.exact(tag + " dloss=0 leaves logits (bitwise)", np.array_equal(buf, before))

        # forward and backward: gradient of dloss * sum(losses) in place
        dloss = 0.37
        losses = poisoned(N)
        lib.op_classifier_forward_backward(buf, losses, targets, dloss, N, V, Vp, dt)
        (dloss * ref.sum()).backward()
        grad = host(buf, dt).view(N, Vp)
        r.close(tag + " losses (with backward)", host(losses), ref.detach(), TOL_FP32_OUT)
        r.close(tag + " dlogits", grad[:, :V], x.grad, TOL[dt])
        r.exact(tag + " padded columns of dlogits are 0", bool((grad[:, V:] == 0).all()))
        r.exact(tag + " ignored rows: loss 0, gradient 0",
                bool((grad[~live] == 0).all()) and bool((host(losses)[~live] == 0).all()))


def test_adamw(lib, r):
    n = 1013
    f32 = lambda x: float(np.float32(x))  # hyperparameters exactly representable in fp32
    lr, beta1, beta2, eps, wd = f32(1e-2), f32(0.9), f32(0.95), f32(1e-8), f32(0.1)
    for grad_scale in [1.0, 0.25]:
        param = torch.nn.Parameter(torch.randn(n, dtype=torch.float32) * 0.5)
        opt = torch.optim.AdamW([param], lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd)
        master = param.detach().numpy().copy()
        m, v = np.zeros(n, np.float32), np.zeros(n, np.float32)
        out_bf16 = poisoned(n, BF16)
        for step in range(1, 6):
            grad = (torch.randn(n, dtype=torch.float32) * 0.1).numpy()
            param.grad = torch.from_numpy(grad * np.float32(grad_scale))  # exact: power of 2
            opt.step()
            lib.op_adamw_update(master, out_bf16, grad, m, v, n, lr, beta1, beta2, eps, wd,
                                grad_scale, step, BF16)
        tag = f"adamw 5 steps grad_scale={grad_scale}"
        st = opt.state[param]
        r.close(tag + " params", host(master), param.detach().double(), 1e-7)
        # m, v: PyTorch's vectorised add fuses a multiply-add, so these differ in the last bit
        r.close(tag + " m", host(m), st["exp_avg"].double(), 1e-6)
        r.close(tag + " v", host(v), st["exp_avg_sq"].double(), 1e-6)
        r.exact(tag + " bf16 params = RNE(master), bitwise",
                np.array_equal(out_bf16, bf16_bits(torch.from_numpy(master))))


def test_reductions(lib, r):
    n = 100003  # several chunks plus a ragged tail
    x = torch.randn(n, dtype=torch.float32)
    xs = x.numpy().copy()
    out = np.array([1.5], np.float32)
    lib.op_sum_squares_accumulate(out, xs, n)
    r.close("sum_squares_accumulate (+=)", torch.tensor(out[0] - 1.5), (x.double() ** 2).sum(), 1e-6)
    out = np.array([-2.0], np.float32)
    lib.op_sum_accumulate(out, xs, n, 0.3)
    r.close("sum_accumulate scale 0.3 (+=)", torch.tensor(out[0] + 2.0),
            0.3 * x.double().sum(), 1e-5)
    dst = torch.randn(n, dtype=torch.float32).numpy()
    expect = dst + xs
    lib.op_add_inplace(dst, xs, n)
    r.exact("add_inplace, bitwise", np.array_equal(dst, expect))

    # casts: random values, exact ties (low 16 bits 0x8000) both ways, specials
    bits = np.random.randint(0, 2 ** 32, size=4096, dtype=np.uint64).astype(np.uint32)
    bits[:512] = (bits[:512] & 0xFFFF0000) | 0x8000
    vals = bits.view(np.float32)
    vals = vals[np.isfinite(vals)]
    vals = np.concatenate([vals, np.array([0.0, -0.0, np.inf, -np.inf, 3.0e38, -3.4e38, 1e-40],
                                          np.float32), xs[:1000]])
    m = len(vals)
    got = poisoned(m, BF16)
    lib.op_cast(got, BF16, vals, F32, m)
    r.exact(f"cast fp32 -> bf16 = torch .to(bfloat16) ({m} values, ties, specials)",
            np.array_equal(got, bf16_bits(torch.from_numpy(vals))))
    back = poisoned(m)
    lib.op_cast(back, F32, got, BF16, m)
    r.exact("cast bf16 -> fp32, bitwise",
            np.array_equal(back.view(np.uint32), got.astype(np.uint32) << 16))
    same = poisoned(m)
    lib.op_cast(same, F32, vals, F32, m)
    r.exact("cast fp32 -> fp32 copy, bitwise", np.array_equal(same, vals))
    nan = np.array([np.nan], np.float32)
    nan_bf = poisoned(1, BF16)
    lib.op_cast(nan_bf, BF16, nan, F32, 1)
    r.exact("cast NaN -> bf16 NaN", bool(np.isnan(from_bf16_bits(nan_bf).numpy()).all()))


def test_runtime(lib, r):
    in_use = lib.op_memory_in_use()
    p, q = lib.op_alloc(1000), lib.op_alloc(3)
    r.exact("alloc: 64-byte aligned", p % 64 == 0 and q % 64 == 0)
    r.exact("alloc: fresh memory poisoned with 0xFF (NaN)",
            all(b == 0xFF for b in ctypes.string_at(p, 1000)))
    r.exact("alloc: memory_in_use and memory_peak count the bytes",
            lib.op_memory_in_use() - in_use == 1003 and lib.op_memory_peak() >= in_use + 1003)
    lib.op_release(p)
    lib.op_release(q)
    lib.op_release(None)
    r.exact("release: memory_in_use back where it was", lib.op_memory_in_use() == in_use)


# ------------------------------------------------------------------------------------------------
# Split invariance: the parallelisms cut batches (DP, PP micro-batches), output columns and heads
# (TP); the oracle must give the same bits for a piece computed alone as inside the whole.
# ------------------------------------------------------------------------------------------------
def same_bits(a, b):
    return np.array_equal(np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


def test_split_invariance(lib, r):
    every = slice(None)
    for dt in (F32, BF16):
        N, C, OC, cut_n, cut_o = 50, 300, 70, 23, 40
        top, bottom, left, right = slice(0, cut_n), slice(cut_n, N), slice(0, cut_o), slice(cut_o, OC)
        x, w, b = device(randn(N, C), dt), device(randn(OC, C), dt), device(randn(OC), dt)
        x, w = x.reshape(N, C), w.reshape(OC, C)
        res, dout = device(randn(N, OC), dt).reshape(N, OC), device(randn(N, OC), dt).reshape(N, OC)
        for gelu in (False, True):
            def forward(rows, cols):
                n, o = len(range(N)[rows]), len(range(OC)[cols])
                rs = None if gelu else np.ascontiguousarray(res[rows, cols])
                out, pre = poisoned(n * o, dt), (poisoned(n * o, dt) if gelu else None)
                lib.op_matmul_forward(out, pre, np.ascontiguousarray(x[rows]), np.ascontiguousarray(w[cols]),
                                      np.ascontiguousarray(b[cols]), rs, n, C, o, dt)
                return out.reshape(n, o)

            full = forward(every, every)
            tag = f"split {DT_NAME[dt]} matmul forward{' gelu' if gelu else ''}"
            r.exact(tag + ": rows alone = rows of the whole, bitwise",
                    same_bits(full, np.concatenate([forward(top, every), forward(bottom, every)])))
            r.exact(tag + ": columns alone = columns of the whole, bitwise",
                    same_bits(full, np.concatenate([forward(every, left), forward(every, right)], 1)))

        def backward(rows, cols):
            n, o = len(range(N)[rows]), len(range(OC)[cols])
            dinp, dw = poisoned(n * C, dt), np.zeros(o * C, np.float32)
            lib.op_matmul_backward(dinp, dw, None, np.ascontiguousarray(dout[rows, cols]),
                                   np.ascontiguousarray(x[rows]), np.ascontiguousarray(w[cols]), None,
                                   n, C, o, dt)
            return dinp.reshape(n, C), dw.reshape(o, C)

        dinp, dw = backward(every, every)
        tag = f"split {DT_NAME[dt]} matmul backward"
        r.exact(tag + ": dinp of rows alone, bitwise",
                same_bits(dinp, np.concatenate([backward(top, every)[0], backward(bottom, every)[0]])))
        r.exact(tag + ": dweight of output columns alone, bitwise",
                same_bits(dw, np.concatenate([backward(every, left)[1], backward(every, right)[1]])))

    B, T, NH, HS, cut_b, cut_h = 3, 11, 4, 8, 1, 2
    C = NH * HS
    qkv = device(randn(B, T, 3 * C), F32).reshape(B, T, 3, NH, HS)
    dout = device(randn(B, T, C), F32).reshape(B, T, NH, HS)

    def attention(batches, heads):
        q = np.ascontiguousarray(qkv[batches][:, :, :, heads])
        d = np.ascontiguousarray(dout[batches][:, :, heads])
        b, nh = q.shape[0], q.shape[3]
        out, lse, dq = poisoned(b * T * nh * HS), poisoned(b * nh * T), poisoned(q.size)
        lib.op_attention_forward(out, lse, q, b, T, nh, nh, HS, F32)
        lib.op_attention_backward(dq, d, q, out, lse, b, T, nh, nh, HS, F32)
        return out.reshape(b, T, nh, HS), lse.reshape(b, nh, T), dq.reshape(b, T, 3, nh, HS)

    full = attention(every, every)
    pieces = [attention(slice(0, cut_b), every), attention(slice(cut_b, B), every)]
    r.exact("split attention: batches alone (out, lse, dqkv), bitwise",
            all(same_bits(f, np.concatenate([p[i] for p in pieces])) for i, f in enumerate(full)))
    pieces = [attention(every, slice(0, cut_h)), attention(every, slice(cut_h, NH))]
    head_axis = [2, 1, 3]  # of out, lse, dqkv
    r.exact("split attention: heads alone (out, lse, dqkv), bitwise",
            all(same_bits(f, np.concatenate([p[i] for p in pieces], head_axis[i])) for i, f in enumerate(full)))


# ------------------------------------------------------------------------------------------------
# Thread-count independence: the same calls on 1 and 2 OpenMP threads, outputs bitwise equal.
# Sizes are above the ops' thresholds for going parallel.
# ------------------------------------------------------------------------------------------------
def test_threads(lib, r):
    N, C, OC = 130, 200, 300
    x, w, dout, g = (device(randn(*shape), F32) for shape in [(N, C), (OC, C), (N, OC), (N, C)])
    dw0, db0 = device(randn(OC, C), F32), device(randn(OC), F32)

    def matmul():
        dinp, dw, db, out = poisoned(N * C), dw0.copy(), db0.copy(), poisoned(N * OC)
        lib.op_matmul_backward(dinp, dw, db, dout, x, w, g, N, C, OC, F32)
        lib.op_matmul_forward(out, None, x, w, None, None, N, C, OC, F32)
        return [dinp, dw, db, out]

    Nl, Cl = 64, 777
    xl, wl, dl = device(randn(Nl, Cl), BF16), device(randn(Cl), BF16), device(randn(Nl, Cl), BF16)
    mean, rstd = poisoned(Nl), poisoned(Nl)
    lib.op_layernorm_forward(poisoned(Nl * Cl, BF16), mean, rstd, xl, wl, wl, Nl, Cl, BF16)
    dinp0, dwl0 = device(randn(Nl, Cl), BF16), device(randn(Cl), F32)

    def layernorm():
        dinp, dw, db = dinp0.copy(), dwl0.copy(), dwl0.copy()
        lib.op_layernorm_backward(dinp, dw, db, dl, xl, wl, mean, rstd, Nl, Cl, BF16)
        return [dinp, dw, db]

    B, T, Ce, V = 4, 64, 300, 50
    tokens = torch.randint(0, V, (B, T), dtype=torch.int32).numpy()
    de, dwte0, dwpe0 = device(randn(B, T, Ce), F32), device(randn(V, Ce), F32), device(randn(T, Ce), F32)

    def encoder():
        dwte, dwpe = dwte0.copy(), dwpe0.copy()
        lib.op_encoder_backward(dwte, dwpe, de, tokens, B, T, Ce, F32)
        return [dwte, dwpe]

    xs = torch.randn(1000003, dtype=torch.float32).numpy()

    def sum_squares():
        out = np.array([0.25], np.float32)
        lib.op_sum_squares_accumulate(out, xs, len(xs))
        return [out]

    Ba, Ta, NH, HS = 2, 40, 6, 16

    def attention(NKV):
        def run():
            out, lse, dqkv = poisoned(Ba * Ta * NH * HS), poisoned(Ba * NH * Ta), poisoned(qkv.size)
            lib.op_attention_forward(out, lse, qkv, Ba, Ta, NH, NKV, HS, F32)
            lib.op_attention_backward(dqkv, da, qkv, out, lse, Ba, Ta, NH, NKV, HS, F32)
            return [out, lse, dqkv]
        qkv = device(randn(Ba, Ta, (NH + 2 * NKV) * HS), F32)
        da = device(randn(Ba, Ta, NH * HS), F32)
        return run

    for name, fn in [("matmul forward+backward (gelu)", matmul), ("layernorm backward bf16", layernorm),
                     ("encoder backward", encoder), ("sum_squares_accumulate", sum_squares),
                     ("attention forward+backward", attention(NH)),
                     ("attention forward+backward, 6 query heads on 2 kv heads", attention(2))]:
        results = []
        for threads in (1, 2):
            lib.op_set_num_threads(threads)
            results.append(fn())
        r.exact(f"threads 1 vs 2, bitwise: {name}", all(map(same_bits, *results)))


def main():
    lib_path = os.environ.get("OPS_LIB", "build/libops_cpu.so")
    seed = int(os.environ.get("OPS_SEED", int.from_bytes(os.urandom(4), "little")))
    print(f"test_ops: {lib_path}, seed {seed} (OPS_SEED={seed} repeats this run)")
    torch.manual_seed(seed)
    np.random.seed(seed)
    torch.set_num_threads(1)
    lib = load_library(lib_path)
    lib.op_set_num_threads(2)
    r = Report()
    start = time.time()
    for dt in (F32, BF16):
        for test in (test_encoder, test_layernorm, test_matmul, test_gelu, test_attention, test_classifier):
            print(f"{test.__name__} {DT_NAME[dt]}")
            test(lib, r, dt)
    for test in (test_adamw, test_reductions, test_runtime, test_split_invariance, test_threads):
        print(test.__name__)
        test(lib, r)
    r.only.finish(r.checks)  # a filtered run that matched nothing fails below (no checks)
    print(f"{r.checks} checks, {len(r.failures)} failures, {time.time() - start:.1f} s, seed {seed}")
    for name in r.failures:
        print(f"FAILED: {name}")
    return 1 if r.failures or r.checks == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
