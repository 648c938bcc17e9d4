#!/usr/bin/python3
"""test/test_attention_block.py - ring attention's block ops on the CPU backend (through ctypes on
build/libops_cpu.so): attention_block_forward, attention_block_backward, copy_columns, against
float64 (numpy, and torch autograd for gradients).

Grouped-query attention: NH query heads share NKV kv heads (query head h uses kv head
h // (NH/NKV)); qkv is (B,T,(NH+2NKV)HS) = [q heads | k heads | v heads] and kv (B,T,2 NKV HS).
The float64 references repeat each kv head NH/NKV times (np.repeat, torch's repeat_interleave)
and sum the repeated heads' dk, dv back per kv head: the ops never copy, only the references do.

Part 1, one block: q from a packed qkv, k and v from a packed kv, causal and full masks, T in
{1, 3, 5, 17}, HS in {7, 16}, (NH, NKV) in {(1,1), (2,2), (3,3), (4,2), (6,3), (6,1), (4,1)},
B in {1, 2}, fp32 and bf16 (inputs rounded to bf16 first; the reference is computed from those
values).
  forward: out and lse against the float64 block softmax. Tolerances (relative error
    ||got - ref|| / ||ref||): fp32 2e-6 for out (measured <= 2.0e-7 over 4 seeds), 1e-5 for lse
    (7.5e-7); bf16: out 1e-2 (stored in bf16: one rounding, about 2e-3), lse 1e-5 (fp32 math on
    exact bf16 inputs).
  backward, with the block standing alone (its own out and lse are the final ones): dq, dk, dv
    against (i) the contract's formula in float64 from the very out and lse the op was given
    (p = exp(s - lse), D = rowsum(dout * out)): 1e-5 in fp32 and in bf16 (fp32 outputs, exact
    inputs); (ii) torch float64 autograd of the block's attention, the three gradients as one
    vector (dq and dk are analytically zero at T = 1): fp32 1e-5, bf16 2e-2 (out was rounded to
    bf16 before D = rowsum(dout * out) was formed, and dq, dk = sum p (dP - D) k cancel; the worst
    seen over 30 seeds was 6e-3). dq and dkv start at random values ("+="); the test compares
    got - start. The qkv's k and v columns hold other values (the op must read k, v from kv).
    The results must be bitwise the same on 1 and 2 OpenMP threads.
Part 2, the whole ring: for cp = 2, 3 and chunk sizes c in {1, 3, 4} (T = 2*cp*c), B = 2, NH = 3,
HS = 7 (and GQA rings: cp = 2, c = 3, NH 4 with NKV 2; cp = 3, c = 2, NH 4 with NKV 1), the zigzag
plan from `build/test_context_parallel_plan --dump cp T` (as
test_ring_attention.py reads it). Each rank computes its blocks with attention_block_forward on
the chunks' packed qkv / kv and folds them, in ring-step order, into one accumulator per local
query chunk with attention_merge (starting from lse = -inf, out = NaN). Every rank's result must
equal full causal attention (torch float64) at its global positions: out 2e-6 and lse 2e-6 in
fp32 (measured <= 1.5e-7 and 1.3e-7 over 4 seeds).
Then the backward: with each query chunk's final (merged) out and lse and a random dout, every
rank runs attention_block_backward over the same blocks, into dq of its query chunks and into a
dkv of its own for each key/value chunk it was sent (as the ring carries dK, dV back to their
owner); the dkv of a chunk are summed over the ranks. dq, dk, dv (global order) must equal the
float64 autograd gradient of full causal attention: fp32 3e-6 each; and the contract's formula
in float64 from the final out and lse the blocks were given: 3e-6 (measured <= 2.7e-7). cp = 2
also runs in bf16 (qkv, out and the accumulators in bf16, so every merge rounds out): out 1e-2,
lse 2e-6, dq/dk/dv vs the formula 3e-6 (measured 1.6e-7), vs autograd 2e-2 (as in part 1; worst
seen 4e-3).
Part 3, copy_columns: fp32->fp32, bf16->bf16, fp32->bf16 and bf16->fp32 between strided column
ranges (k, v out of qkv into kv; dq, dk, dv from fp32 into a bf16 dqkv), bitwise: values equal to
torch's conversion (round to nearest even; ties and values near the bf16 limits included), and
columns outside the range untouched.

Run: /usr/bin/python3 test/test_attention_block.py   (OPS_LIB and CP_PLAN_BIN override the
paths; OPS_SEED=<n> repeats a run; exit status 1 on failure).
"""
import ctypes
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from opslib import BUILD, LIB, Fl, I, P, Tally, load  # noqa: E402,F401
from test_ring_attention import read_plan, rel_err  # noqa: E402  (the plan and the error measure)

FWD_OUT_TOL = 2e-6   # fp32 out of a block or of the merged ring (measured <= 2.0e-7)
RING_LSE_TOL = 2e-6  # the merged ring's lse, fp32 and bf16 (measured <= 1.3e-7)
RING_BWD_TOL = 3e-6  # the ring's dq, dk, dv: fp32, and vs the formula (measured <= 2.7e-7)

F32, BF16 = 0, 1
DT_NAME = {F32: "fp32", BF16: "bf16"}
report = Tally()


def load_library(path):
    return load(path, {
        "op_attention_block_forward": [P, P, P, P, I, I, I, I, I, I, I],
        "op_attention_block_backward": [P, P, P, P, P, P, P, I, I, I, I, I, I, I],
        "op_attention_merge": [P, P, P, P, I, I, I, I, I],
        "op_copy_columns": [P, I, I, P, I, I, I, I],
        "op_set_num_threads": [I],
        "op_get_max_threads": [],
    }, returns={"op_get_max_threads": I})


def ptr(a, offset_elems=0):
    assert a.flags["C_CONTIGUOUS"]
    return ctypes.c_void_p(a.ctypes.data + offset_elems * a.itemsize)


# --- buffers in the ops' dtypes ------------------------------------------------------------------
def device(x, dt):
    """The buffer an op reads: fp32 values, or the bf16 bits (round to nearest even) of x."""
    t = torch.from_numpy(np.ascontiguousarray(x, np.float64)).float()
    if dt == F32:
        return t.numpy().copy()
    return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).copy()


def host(a, dt):
    """float64 values of a buffer."""
    if dt == F32:
        return a.astype(np.float64)
    t = torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return t.to(torch.float64).numpy()


def rounded(x, dt):
    return host(device(x, dt), dt)


def poisoned(shape, dt=F32):
    a = np.empty(shape, np.float32 if dt == F32 else np.uint16)
    a.view(np.uint8).fill(0xFF)
    return a


# --- layouts: (B, NH, n, HS) float64 <-> the ops' rows (B, n, C) ---------------------------------
def rows(x):
    B, NH, n, HS = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, n, NH * HS)


def heads(x, NH):
    B, n, C = x.shape
    return x.reshape(B, n, NH, C // NH).transpose(0, 2, 1, 3)


def packed(*parts):
    """(B,heads,n,HS) tensors side by side in rows: qkv (B,n,(NH+2NKV)HS) or kv (B,n,2 NKV HS)."""
    return np.concatenate([rows(p) for p in parts], 2)


def repeat_kv(x, NH):
    """(B,NKV,n,HS) -> (B,NH,n,HS): kv head g serves query heads g*G..g*G+G-1 (G = NH/NKV)."""
    return np.repeat(x, NH // x.shape[1], axis=1)


def sum_groups(x, NKV):
    """(B,NH,n,HS) gradients of the repeated kv heads -> (B,NKV,n,HS), summed per kv head."""
    B, NH, n, HS = x.shape
    return x.reshape(B, NKV, NH // NKV, n, HS).sum(2)


# --- float64 references --------------------------------------------------------------------------
def mask_of(n, causal):
    return np.tril(np.ones((n, n), bool)) if causal else np.ones((n, n), bool)


def block_attention(q, k, v, causal):
    """out (B,NH,n,HS), lse (B,NH,n) of q against k, v; key j visible to query i iff j <= i when
    causal."""
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    s = np.where(mask_of(s.shape[-1], causal), s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    l = p.sum(-1, keepdims=True)
    return (p / l) @ v, (m + np.log(l))[..., 0]


def block_backward_formula(q, k, v, out, lse, dout, causal):
    """The contract's gradients (B,NH,n,HS): p = exp(s - lse), D = rowsum(dout * out)."""
    scale = 1 / np.sqrt(q.shape[-1])
    s = np.where(mask_of(q.shape[2], causal), q @ k.transpose(0, 1, 3, 2) * scale, -np.inf)
    p = np.exp(s - lse[..., None])
    D = (dout * out).sum(-1, keepdims=True)
    ds = p * (dout @ v.transpose(0, 1, 3, 2) - D)
    return scale * ds @ k, scale * ds.transpose(0, 1, 3, 2) @ q, p.transpose(0, 1, 3, 2) @ dout


def autograd_attention(q, k, v, dout, causal):
    """float64 torch autograd of softmax attention: (dq, dk, dv) of sum(out * dout)."""
    q, k, v = (torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v))
    s = q @ k.transpose(-1, -2) / np.sqrt(q.shape[-1])
    s = s.masked_fill(~torch.from_numpy(mask_of(s.shape[-1], causal)), float("-inf"))
    out = torch.softmax(s, -1) @ v
    (out * torch.from_numpy(dout)).sum().backward()
    return out.detach().numpy(), q.grad.numpy(), k.grad.numpy(), v.grad.numpy()


# --- the ops -------------------------------------------------------------------------------------
def block_forward(lib, qkv, kv, NH, NKV, causal, dt):
    B, n, width = qkv.shape
    HS = width // (NH + 2 * NKV)
    out, lse = poisoned((B, n, NH * HS), dt), poisoned((B, NH, n))
    lib.op_attention_block_forward(ptr(out), ptr(lse), ptr(qkv), ptr(kv), B, n, NH, NKV, HS,
                                   int(causal), dt)
    return out, lse


def block_backward(lib, dq, dkv, dout, out, lse, qkv, kv, NH, NKV, causal, dt):
    B, n, C = dq.shape
    lib.op_attention_block_backward(ptr(dq), ptr(dkv), ptr(dout), ptr(out), ptr(lse), ptr(qkv),
                                    ptr(kv), B, n, NH, NKV, C // NH, int(causal), dt)


def grouped_grads(dq, dk, dv, NKV):
    """Gradients against the repeated kv heads -> per kv head (dk, dv summed over the group)."""
    return dq, sum_groups(dk, NKV), sum_groups(dv, NKV)


# --- part 1: one block ---------------------------------------------------------------------------
def check_block(lib, rng, B, T, NH, NKV, HS, causal, dt):
    tag = (f"block {DT_NAME[dt]} {'causal' if causal else 'full  '} B={B} T={T:2d} NH={NH} "
           f"NKV={NKV} HS={HS:2d}")
    q = 1.5 * rng.standard_normal((B, NH, T, HS))
    k, v, junk = (1.5 * rng.standard_normal((B, NKV, T, HS)) for _ in range(3))
    # The qkv's k, v columns hold other values: the op must take k, v from kv only.
    qkv, kv = device(packed(q, junk, -junk), dt), device(packed(k, v), dt)
    q, k, v = (rounded(x, dt) for x in (q, k, v))
    out, lse = block_forward(lib, qkv, kv, NH, NKV, causal, dt)
    kr, vr = repeat_kv(k, NH), repeat_kv(v, NH)
    want, want_lse = block_attention(q, kr, vr, causal)
    e_out, e_lse = rel_err(host(out, dt), rows(want)), rel_err(host(lse, F32), want_lse)
    report(e_out < (FWD_OUT_TOL if dt == F32 else 1e-2) and e_lse < 1e-5,
           f"{tag} forward: out {e_out:.1e}, lse {e_lse:.1e}")

    dout = device(rng.standard_normal((B, T, NH * HS)), dt)
    dq0 = rng.standard_normal((B, T, NH * HS)).astype(np.float32)
    dkv0 = rng.standard_normal((B, T, 2 * NKV * HS)).astype(np.float32)
    dq, dkv = dq0.copy(), dkv0.copy()
    block_backward(lib, dq, dkv, dout, out, lse, qkv, kv, NH, NKV, causal, dt)
    got = [heads(dq - dq0.astype(np.float64), NH)] + \
          [heads(x, NKV) for x in np.split(dkv - dkv0.astype(np.float64), 2, axis=2)]
    d64, out64 = heads(host(dout, dt), NH), heads(host(out, dt), NH)
    formula = grouped_grads(*block_backward_formula(q, kr, vr, out64, host(lse, F32), d64, causal),
                            NKV)
    grads = grouped_grads(*autograd_attention(q, kr, vr, d64, causal)[1:], NKV)
    whole = lambda parts: np.concatenate([x.reshape(-1) for x in parts])
    # dq and dk are analytically zero at T = 1 (one key: dP = D), so there the three are
    # measured together; otherwise each on its own against the formula.
    e_formula = rel_err(whole(got), whole(formula))
    if T > 1:
        e_formula = max(rel_err(g, w) for g, w in zip(got, formula))
    e_grad = rel_err(whole(got), whole(grads))
    report(e_formula < 1e-5 and e_grad < (1e-5 if dt == F32 else 2e-2),
           f"{tag} backward (+=): dq, dk, dv vs the formula {e_formula:.1e}, vs autograd "
           f"{e_grad:.1e}")
    return qkv, kv, dout, out, lse


def check_threads(lib, rng, dt, NH=3, NKV=3):
    """Bitwise the same results on 1 and 2 threads (one task per (batch, head), sequential)."""
    B, T, HS = 2, 37, 16
    q = rng.standard_normal((B, NH, T, HS))
    k, v = (rng.standard_normal((B, NKV, T, HS)) for _ in range(2))
    qkv, kv = device(packed(q, k, v), dt), device(packed(k, v), dt)
    dout = device(rng.standard_normal((B, T, NH * HS)), dt)
    results = []
    for threads in (1, 2):
        lib.op_set_num_threads(threads)
        out, lse = block_forward(lib, qkv, kv, NH, NKV, False, dt)
        dq = np.zeros((B, T, NH * HS), np.float32)
        dkv = np.zeros((B, T, 2 * NKV * HS), np.float32)
        block_backward(lib, dq, dkv, dout, out, lse, qkv, kv, NH, NKV, False, dt)
        results.append([out, lse, dq, dkv])
    lib.op_set_num_threads(2)
    same = all(np.array_equal(a, b) for a, b in zip(*results))
    report(same, f"block {DT_NAME[dt]} NH={NH} NKV={NKV} forward and backward on 1 and 2 threads, "
           f"bitwise")


# --- part 2: the ring ----------------------------------------------------------------------------
def ring_forward(lib, blocks, cp, qkv, kv, NH, NKV, dt):
    """Every rank's blocks, merged per local query chunk: {chunk: (out, lse)}."""
    B, c, width = qkv[0].shape
    C = width // (NH + 2 * NKV) * NH
    result = {}
    for r in range(cp):
        acc = {qc: np.full((B, c, C), np.nan, np.float32) for qc in (r, 2 * cp - 1 - r)}
        if dt == BF16:
            acc = {qc: poisoned((B, c, C), BF16) for qc in acc}  # NaN bits
        acc_lse = {qc: np.full((B, NH, c), -np.inf, np.float32) for qc in acc}
        for _, qc, kc, causal in sorted(blocks[r], key=lambda b: b[0]):  # ring order (stable)
            out_b, lse_b = block_forward(lib, qkv[qc], kv[kc], NH, NKV, causal, dt)
            lib.op_attention_merge(ptr(acc[qc]), ptr(acc_lse[qc]), ptr(out_b), ptr(lse_b), B, c,
                                   NH, C // NH, dt)
        result.update({qc: (acc[qc], acc_lse[qc]) for qc in acc})
    return result


def ring_backward(lib, blocks, cp, qkv, kv, dout, final, NH, NKV, dt):
    """dq per query chunk and dkv per key chunk, each rank's dkv summed over the ranks."""
    B, c, width = qkv[0].shape
    HS = width // (NH + 2 * NKV)
    dq = {ch: np.zeros((B, c, NH * HS), np.float32) for ch in range(2 * cp)}
    dkv = {ch: np.zeros((B, c, 2 * NKV * HS), np.float64) for ch in range(2 * cp)}
    for r in range(cp):
        mine = {}  # this rank's dK, dV of the chunks it was sent
        for _, qc, kc, causal in sorted(blocks[r], key=lambda b: b[0]):
            part = mine.setdefault(kc, np.zeros((B, c, 2 * NKV * HS), np.float32))
            out, lse = final[qc]
            block_backward(lib, dq[qc], part, dout[qc], out, lse, qkv[qc], kv[kc], NH, NKV, causal,
                           dt)
        for kc, part in mine.items():
            dkv[kc] += part
    return dq, dkv


def check_ring(lib, rng, cp, c, dt, B=2, NH=3, NKV=3, HS=7):
    T = 2 * cp * c
    blocks, positions = read_plan(cp, T)
    q = rounded(rng.standard_normal((B, NH, T, HS)), dt)
    k, v = (rounded(rng.standard_normal((B, NKV, T, HS)), dt) for _ in range(2))
    d_out = rounded(rng.standard_normal((B, NH, T, HS)), dt)
    chunk = lambda x, ch: x[:, :, ch * c:(ch + 1) * c]
    qkv = {ch: device(packed(*(chunk(x, ch) for x in (q, k, v))), dt) for ch in range(2 * cp)}
    kv = {ch: device(packed(chunk(k, ch), chunk(v, ch)), dt) for ch in range(2 * cp)}
    dout = {ch: device(rows(chunk(d_out, ch)), dt) for ch in range(2 * cp)}
    kr, vr = repeat_kv(k, NH), repeat_kv(v, NH)
    ref_out, ref_lse = block_attention(q, kr, vr, True)
    tag = f"ring {DT_NAME[dt]} cp={cp} T={T:2d} NH={NH} NKV={NKV}"

    final = ring_forward(lib, blocks, cp, qkv, kv, NH, NKV, dt)
    e_out = e_lse = 0.0
    for r in range(cp):
        local = (r, 2 * cp - 1 - r)
        got = np.concatenate([host(final[qc][0], dt) for qc in local], 1)
        got_lse = np.concatenate([final[qc][1] for qc in local], 2)
        pos = positions[r]
        e_out = max(e_out, rel_err(got, rows(ref_out[:, :, pos])))
        e_lse = max(e_lse, rel_err(got_lse.astype(np.float64), ref_lse[:, :, pos]))
    report(e_out < (FWD_OUT_TOL if dt == F32 else 1e-2) and e_lse < RING_LSE_TOL,
           f"{tag}: forward (blocks + merges) vs full causal float64 on every rank: "
           f"out {e_out:.1e}, lse {e_lse:.1e}")

    dq, dkv = ring_backward(lib, blocks, cp, qkv, kv, dout, final, NH, NKV, dt)
    in_order = lambda parts: np.concatenate(parts, 2)  # chunks 0..2cp-1 = global order
    got = [in_order([heads(dq[ch].astype(np.float64), NH) for ch in range(2 * cp)])]
    got += [in_order([heads(np.split(dkv[ch], 2, axis=2)[i], NKV) for ch in range(2 * cp)])
            for i in (0, 1)]
    # The formula with the very out (rounded in bf16 by every merge) and lse the blocks were
    # given, and the true gradient.
    out = in_order([heads(host(final[ch][0], dt), NH) for ch in range(2 * cp)])
    lse = in_order([final[ch][1].astype(np.float64) for ch in range(2 * cp)])
    formula = grouped_grads(*block_backward_formula(q, kr, vr, out, lse, d_out, True), NKV)
    e_formula = max(rel_err(g, w) for g, w in zip(got, formula))
    true_grads = grouped_grads(*autograd_attention(q, kr, vr, d_out, True)[1:], NKV)
    errs = [rel_err(g, w) for g, w in zip(got, true_grads)]
    report(e_formula < RING_BWD_TOL and max(errs) < (RING_BWD_TOL if dt == F32 else 2e-2),
           f"{tag}: backward over the same blocks: dq, dk, dv vs the formula {e_formula:.1e}; "
           f"vs float64 autograd of full causal attention: dq {errs[0]:.1e}, dk {errs[1]:.1e}, "
           f"dv {errs[2]:.1e}")


# --- part 3: copy_columns ------------------------------------------------------------------------
def tricky_values(rng, shape):
    """Random values with exact bf16 ties (both parities), values that round up into the next
    binade, the largest finite floats (round to inf), subnormals, zeros of both signs."""
    x = (rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, shape)).astype(np.float32)
    bits = x.view(np.uint32).reshape(-1)
    n = bits.size
    bits[0:n:7] = (bits[0:n:7] & 0xFFFF0000) | 0x8000              # ties: to even
    bits[1:n:11] = 0x3F7FFFFF                                       # just below 1: rounds to 1
    bits[2:n:13] = 0x7F7FFFFF                                       # largest float: to inf
    bits[3:n:17] = 0x00000001                                       # smallest subnormal
    bits[4:n:19] = 0x80000000                                       # -0
    return x


def check_copy(lib, rng, dst_dt, src_dt, rows_=37, src_cols=3 * 21, dst_cols=2 * 21, src_col0=21,
               dst_col0=0, width=42):
    src_f = tricky_values(rng, (rows_, src_cols))
    src = device(src_f, src_dt) if src_dt == BF16 else src_f
    before = poisoned((rows_, dst_cols), dst_dt) if dst_dt == F32 else \
        rng.integers(0, 1 << 16, (rows_, dst_cols)).astype(np.uint16)
    dst = before.copy()
    lib.op_copy_columns(ptr(dst, dst_col0), dst_cols, dst_dt, ptr(src, src_col0), src_cols, src_dt,
                        rows_, width)
    window = slice(dst_col0, dst_col0 + width)
    piece = np.ascontiguousarray(src[:, src_col0:src_col0 + width])
    if src_dt == BF16:
        piece = torch.from_numpy(piece.view(np.int16)).view(torch.bfloat16)
    else:
        piece = torch.from_numpy(piece)
    want = piece.to(torch.float32 if dst_dt == F32 else torch.bfloat16)
    want = want.numpy() if dst_dt == F32 else want.view(torch.int16).numpy().view(np.uint16)
    bits = lambda a: np.ascontiguousarray(a).view(np.uint8)
    same = np.array_equal(bits(dst[:, window]), bits(want))
    outside = np.ones(dst_cols, bool)
    outside[window] = False
    untouched = np.array_equal(bits(dst[:, outside]), bits(before[:, outside]))
    report(same and untouched, f"copy_columns {DT_NAME[src_dt]} -> {DT_NAME[dst_dt]}: "
           f"{rows_} rows x {width} of {src_cols} columns (from {src_col0}) into {dst_cols} (at "
           f"{dst_col0}), bitwise as torch converts, other columns untouched")


def main():
    lib = load_library(LIB)
    seed = int(os.environ.get("OPS_SEED", np.random.SeedSequence().entropy % (1 << 31)))
    print(f"seed {seed} (OPS_SEED={seed} repeats this run)")
    rng = np.random.default_rng(seed)
    shapes = [(1, 1, 1, 1, 7), (2, 3, 2, 2, 16), (1, 5, 3, 3, 7), (2, 17, 3, 3, 16),
              (2, 17, 1, 1, 7), (2, 17, 4, 2, 7), (1, 5, 6, 3, 16), (2, 17, 6, 1, 7),
              (1, 1, 4, 1, 7)]
    for dt in (F32, BF16):
        for B, T, NH, NKV, HS in shapes:
            for causal in (True, False):
                check_block(lib, rng, B, T, NH, NKV, HS, causal, dt)
        check_threads(lib, rng, dt)
        check_threads(lib, rng, dt, NH=4, NKV=2)
    for cp in (2, 3):
        for c in (1, 3, 4):
            check_ring(lib, rng, cp, c, F32)
    check_ring(lib, rng, 2, 3, F32, NH=4, NKV=2)
    check_ring(lib, rng, 3, 2, F32, NH=4, NKV=1)
    check_ring(lib, rng, 2, 3, BF16)
    check_ring(lib, rng, 2, 3, BF16, NH=4, NKV=2)
    for dst_dt, src_dt in ((F32, F32), (BF16, BF16), (BF16, F32), (F32, BF16)):
        check_copy(lib, rng, dst_dt, src_dt)
    # dq, dk, dv (fp32, separate buffers) into the columns of a bf16 dqkv, as ring attention does
    check_copy(lib, rng, BF16, F32, src_cols=21, dst_cols=3 * 21, src_col0=0, dst_col0=42,
               width=21)
    check_copy(lib, rng, F32, F32, rows_=1, src_cols=5, dst_cols=5, src_col0=0, width=5)
    report.finish("test_attention_block")


if __name__ == "__main__":
    main()
