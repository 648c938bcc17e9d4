#!/usr/bin/env python3
"""test/emu/test_cublaslt.py - the cuBLASLt stand-in (test/emu/lib/cublaslt*.cpp) against numpy.

Runs <build>/emu/test_cublaslt, which calls the stand-in the way kernels/cuda/matmul.cu does (and
for the rest of the subset it implements) and dumps every buffer before and after each call, then
recomputes every case here from the documented cuBLASLt semantics in float64:

  D = epilogue(alpha * scale_a * scale_b * op(A) op(B) + beta * C (+ bias))   per batch matrix

with op(A)/op(B) read through the layouts (column- or row-major, leading dimensions, batch
strides), C ignored when beta == 0, the epilogue's aux matrix (GELU input written by GELU_AUX,
read by DGELU) and bias gradient (BGRADB: the sum over k of op(B)), GELU in its tanh form, TF32
operands rounded to 10 mantissa bits for CUBLAS_COMPUTE_32F_FAST_TF32, and outputs rounded from
the fp32 value to bf16 (nearest even) or FP8 (nearest even, saturating, after the D scale; amax
taken before it). The rounding to bf16 and FP8 is written here from the formats' definitions
(FP8 by searching the table of all representable values), not from any CUDA header.

Checks per case: every output element within 1 ulp of its output type of the reference, and at
most 1% of them (at least one) not bitwise equal to it (the stand-in sums exact products in double
and rounds once, so it should equal the correctly rounded reference; a float64 sum landing on the
other side of a rounding boundary is the only excuse: measured 0 ulps, all equal, on 30 seeds; a
truncating instead of rounding bf16 conversion stays within 1 ulp but differs on half the elements),
every byte outside the matrices (padding between columns and batches) and every input buffer left
as it was, no NaN where the reference has none (the outputs start as NaN, so C == D read with
beta == 0 would show), the amax within 1 fp32 ulp.

  python3 test/emu/test_cublaslt.py BUILD    (seed: env EMU_TEST_SEED, else random, printed)
"""
import json
import os
import random
import subprocess
import sys
import tempfile

import numpy as np

F32, BF16, E4M3, E5M2 = 0, 14, 28, 29  # cudaDataType_t values
COL, ROW = 0, 1
OP_N = 0
EPI_DEFAULT, EPI_BIAS, EPI_GELU_AUX, EPI_GELU_AUX_BIAS, EPI_DGELU, EPI_BGRADB = 1, 4, 160, 164, 192, 512
TF32_COMPUTE = 77  # CUBLAS_COMPUTE_32F_FAST_TF32
ELEM = {F32: 4, BF16: 2, E4M3: 1, E5M2: 1}


# ------------------------------------------------------------------------------------------------
# Number formats, from their definitions
# ------------------------------------------------------------------------------------------------
def fp8_table(kind):
    """Values of all 256 codes of E4M3 (bias 7, 3 mantissa bits, no inf, S.1111.111 NaN) or E5M2
    (bias 15, 2 mantissa bits, IEEE-like inf/NaN)."""
    ebits, mbits, bias = (4, 3, 7) if kind == E4M3 else (5, 2, 15)
    vals = np.zeros(256)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e = (code >> mbits) & ((1 << ebits) - 1)
        m = code & ((1 << mbits) - 1)
        if kind == E4M3 and e == 15 and m == 7 or kind == E5M2 and e == 31 and m != 0:
            vals[code] = np.nan
        elif kind == E5M2 and e == 31:
            vals[code] = sign * np.inf
        elif e == 0:
            vals[code] = sign * m / (1 << mbits) * 2.0 ** (1 - bias)
        else:
            vals[code] = sign * (1 + m / (1 << mbits)) * 2.0 ** (e - bias)
    return vals


FP8 = {E4M3: fp8_table(E4M3), E5M2: fp8_table(E5M2)}


def round_fp8(x, kind):
    """Nearest representable value, ties to the even code, saturating at the largest finite."""
    table = FP8[kind][:128]
    finite = np.isfinite(table)
    codes = np.arange(128)[finite]
    values = table[finite]
    order = np.argsort(values)
    codes, values = codes[order], values[order]
    a = np.abs(x)
    idx = np.clip(np.searchsorted(values, a), 1, len(values) - 1)
    lo, hi = values[idx - 1], values[idx]
    pick_hi = (a - lo > hi - a) | ((a - lo == hi - a) & (codes[idx] % 2 == 0))
    out = np.where(pick_hi, hi, lo)
    out = np.where(a >= values[-1], values[-1], out)
    return np.where(np.isnan(x), np.nan, np.sign(x) * out)


def round_bf16(x32):
    u = np.asarray(x32, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    out = r.astype(np.uint32).view(np.float32).astype(np.float64)
    return np.where(np.isnan(x32), np.nan, out)


def round_to(x, kind):
    """float64 -> the value stored in `kind`, via fp32 as a GPU's fp32 accumulator would be."""
    x32 = np.asarray(x, dtype=np.float64).astype(np.float32)
    if kind == F32:
        return x32.astype(np.float64)
    if kind == BF16:
        return round_bf16(x32)
    return round_fp8(x32.astype(np.float64), kind)


def decode(raw, kind):
    if kind == F32:
        return np.frombuffer(raw, dtype=np.float32).astype(np.float64)
    if kind == BF16:
        u = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
        return u.view(np.float32).astype(np.float64)
    return FP8[kind][np.frombuffer(raw, dtype=np.uint8)]


def ulp(ref, kind):
    """One unit in the last place of `kind` at the reference value."""
    mbits, emin = {F32: (23, -126), BF16: (7, -126), E4M3: (3, -6), E5M2: (2, -14)}[kind]
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.abs(ref)))
    e = np.where(np.isfinite(e), np.maximum(e, emin), emin)
    return 2.0 ** (e - mbits)


def to_tf32(x64):
    u = x64.astype(np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x1000) & ~np.uint64(0x1FFF)).astype(np.uint32).view(np.float32)
    return r.astype(np.float64)


# ------------------------------------------------------------------------------------------------
# Layouts
# ------------------------------------------------------------------------------------------------
def positions(a, batch):
    """Element offsets of matrix `batch` of array description a, as a rows x cols index array."""
    i = np.arange(a["rows"])[:, None]
    j = np.arange(a["cols"])[None, :]
    within = i + j * a["ld"] if a["order"] == COL else i * a["ld"] + j
    return batch * a["stride"] + within


def matrix(values, a, batch):
    return values[positions(a, batch)]


class Array:
    def __init__(self, folder, desc):
        self.desc = desc
        self.type = desc["type"]
        with open(os.path.join(folder, desc["file"] + ".before"), "rb") as f:
            self.before_raw = f.read()
        with open(os.path.join(folder, desc["file"] + ".after"), "rb") as f:
            self.after_raw = f.read()
        self.before = decode(self.before_raw, self.type)
        self.after = decode(self.after_raw, self.type)

    def all_positions(self):
        return np.concatenate([positions(self.desc, b).ravel() for b in range(self.desc["batch"])])


# ------------------------------------------------------------------------------------------------
# The reference
# ------------------------------------------------------------------------------------------------
def one_plus_tanh(u):
    """1 + tanh(u), without the cancellation of the plain sum for u << 0 (where it is
    2 e^(2u) / (1 + e^(2u)))."""
    neg = np.minimum(u, 0.0)
    return np.where(u >= 0, 1 + np.tanh(u), 2 * np.exp(2 * neg) / (1 + np.exp(2 * neg)))


def gelu(x):
    return 0.5 * x * one_plus_tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))


def gelu_grad(x):
    s = np.sqrt(2 / np.pi)
    u = s * (x + 0.044715 * x ** 3)
    sech2 = 1 / np.cosh(u) ** 2
    return 0.5 * one_plus_tanh(u) + 0.5 * x * sech2 * s * (1 + 3 * 0.044715 * x * x)


def reference(case, arr):
    """Per batch: D, aux and bias gradient references (float64 values of the stored types)."""
    c, e = case, case["epilogue"]
    scales = arr["scales"].before
    scale = c["alpha"] * (scales[0] * scales[1] if c["scales"] else 1.0)
    out = {"D": [], "aux": [], "bias": [], "amax": 0.0}
    for b in range(arr["D"].desc["batch"]):
        A = matrix(arr["A"].before, arr["A"].desc, b)
        B = matrix(arr["B"].before, arr["B"].desc, b)
        A = A if c["op_a"] == OP_N else A.T
        B = B if c["op_b"] == OP_N else B.T
        Ab, Bb = (to_tf32(A), to_tf32(B)) if c["compute"] == TF32_COMPUTE else (A, B)
        t = scale * (Ab @ Bb)
        if c["beta"] != 0:
            C = arr["C"] if c["c_mode"] == 1 else arr["D"]
            t = t + c["beta"] * matrix(C.before, C.desc, b)
        if e in (EPI_BIAS, EPI_GELU_AUX_BIAS):
            t = t + matrix(arr["bias"].before, arr["bias"].desc, b)
        t = t.astype(np.float32).astype(np.float64)
        res = t
        if e in (EPI_GELU_AUX, EPI_GELU_AUX_BIAS):
            out["aux"].append(round_to(t, arr["aux"].type))
            res = gelu(t).astype(np.float32).astype(np.float64)
        elif e == EPI_DGELU:
            res = (t * gelu_grad(matrix(arr["aux"].before, arr["aux"].desc, b)))
            res = res.astype(np.float32).astype(np.float64)
        if e == EPI_BGRADB:
            out["bias"].append(round_to(B.sum(axis=0)[:, None], arr["bias"].type))
        out["amax"] = max(out["amax"], float(np.max(np.abs(res))))
        if c["d_scale"]:
            res = (res.astype(np.float32) * np.float32(scales[2])).astype(np.float64)
        out["D"].append(round_to(res, arr["D"].type))
    return out


# ------------------------------------------------------------------------------------------------
# Checks
# ------------------------------------------------------------------------------------------------
class Checker:
    def __init__(self):
        self.failures = 0
        self.worst = 0.0

    def check(self, ok, what):
        if not ok:
            self.failures += 1
            print(f"FAIL {what}")

    def compare(self, name, got_arr, refs):
        """got_arr's matrices against refs (one per batch), within 1 ulp of the stored type."""
        worst, equal, total = 0.0, 0, 0
        for b, ref in enumerate(refs):
            got = matrix(got_arr.after, got_arr.desc, b)
            bad_nan = np.isnan(got) != np.isnan(ref)
            fin = ~np.isnan(ref)
            err = np.abs(got[fin] - ref[fin]) / ulp(ref[fin], got_arr.type)
            worst = max(worst, float(err.max()) if err.size else 0.0)
            equal += int(np.sum(got[fin] == ref[fin]))
            total += int(fin.sum())
            self.check(not bad_nan.any(), f"{name}: NaN where the reference has none (or back)")
        self.check(worst <= 1.0, f"{name}: {worst:.2f} ulp from the reference (tolerance 1)")
        self.check(total - equal <= max(1, total // 100),
                   f"{name}: {total - equal} of {total} elements differ from the reference "
                   "(rounding-boundary cases are rare: at most 1% may)")
        self.worst = max(self.worst, worst)
        return f"{name} {worst:.2f} ulp ({equal}/{total} equal)"

    def untouched_outside(self, name, arr):
        inside = np.zeros(len(arr.before), dtype=bool)
        inside[arr.all_positions()] = True
        before, after = np.frombuffer(arr.before_raw, np.uint8), np.frombuffer(arr.after_raw, np.uint8)
        size = ELEM[arr.type]
        outside = np.repeat(~inside, size)
        self.check(np.array_equal(before[outside], after[outside]),
                   f"{name}: bytes outside the matrices changed")

    def untouched(self, name, arr):
        self.check(arr.before_raw == arr.after_raw, f"{name}: an input buffer changed")


def check_case(chk, folder, case):
    arr = {k: Array(folder, v) for k, v in case["arrays"].items()}
    ref = reference(case, arr)
    e = case["epilogue"]
    notes = [chk.compare("D", arr["D"], ref["D"])]
    chk.untouched_outside("D", arr["D"])
    for k in ("A", "B", "C"):
        if k in arr:
            chk.untouched(k, arr[k])
    if e in (EPI_GELU_AUX, EPI_GELU_AUX_BIAS):
        notes.append(chk.compare("aux", arr["aux"], ref["aux"]))
        chk.untouched_outside("aux", arr["aux"])
    elif "aux" in arr:
        chk.untouched("aux", arr["aux"])
    if e == EPI_BGRADB:
        notes.append(chk.compare("bias gradient", arr["bias"], ref["bias"]))
    elif "bias" in arr:
        chk.untouched("bias", arr["bias"])
    sc = arr["scales"]
    chk.check(sc.before_raw[:12] == sc.after_raw[:12], "the scales changed")
    if case["amax"]:
        amax = sc.after[3]
        chk.check(abs(amax - ref["amax"]) <= ulp(ref["amax"], F32), f"amax {amax} vs {ref['amax']}")
        notes.append(f"amax {amax:.6g}")
    else:
        chk.check(sc.before_raw[12:] == sc.after_raw[12:], "amax written though not asked for")
    print(f"  {case['name']:42s} " + "; ".join(notes))


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: test_cublaslt.py BUILD")
    binary = os.path.join(sys.argv[1], "emu", "test_cublaslt")
    seed = int(os.environ.get("EMU_TEST_SEED", random.randrange(1 << 31)))
    chk = Checker()
    with tempfile.TemporaryDirectory() as folder:
        run = subprocess.run([binary, folder, str(seed)], capture_output=True, text=True, timeout=120)
        print(run.stdout, end="")
        chk.check(run.returncode == 0, f"{binary} exited with {run.returncode}: {run.stderr[-2000:]}")
        with open(os.path.join(folder, "manifest.json")) as f:
            cases = json.load(f)
        for case in cases:
            check_case(chk, folder, case)
    print(f"test_cublaslt.py: {len(cases)} cases, worst {chk.worst:.2f} ulp, "
          f"{chk.failures} failures (EMU_TEST_SEED={seed})")
    sys.exit(1 if chk.failures else 0)


if __name__ == "__main__":
    main()
