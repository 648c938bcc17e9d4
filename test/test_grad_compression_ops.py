"""test/test_grad_compression_ops.py - the kernels of the compressed gradient reductions
(kernels/cpu/grad_compression.cpp) against a numpy model of the same formulas, bit for bit
(test/grad_compression_model.py; the dequantised sum adds the records' code * scale in record
order from 0).

Cases, on fresh random data every run (seed printed), awkward sizes (chunk_n 1, 63, 256, 257,
1000, 4099 with 1 to 5 chunks; top-k n from 1 to 70001, k from 1 to n):
1. int8_quantize: codes, scales and error bitwise the model's, written and accumulated, in place
   (err = x); blocks with an all-zero block (scale 0), values spanning 2^-30 to 2^20, exact ties
   at .5 (x / scale = k + 0.5: nearest even).
2. int8_dequantize_sum over 1-5 records and int8_dequantize of end-to-end records with n cutting
   the last one: bitwise.
3. |error| <= scale / 2 (one half step, plus the rounding of x / scale and code * scale) and error + code * scale == x within one ulp (the error
   is x - code * scale rounded once).
4. topk_select: the record (indices, values) and the residual x bitwise the model's, with many
   ties (values from a set of 7 magnitudes) and with all-distinct values; k = n sends everything.
5. topk_scatter_add over 1-4 records with overlapping index sets into a window [first,
   first + out_n) of a larger vector: bitwise the model's ordered float32 sums.
6. The same results on 1 and 2 OpenMP threads.
"""
import ctypes
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from opslib import LIB, P, I, Tally, load  # noqa: E402
from grad_compression_model import BLOCK, record_bytes  # noqa: E402
from grad_compression_model import quantize as model_quantize  # noqa: E402
from grad_compression_model import dequantized as model_dequantized  # noqa: E402
from grad_compression_model import topk as model_topk  # noqa: E402

Z = ctypes.c_size_t
lib = load(LIB, {
    "op_int8_quantize": [P, P, P, Z, I, I],
    "op_int8_dequantize_sum": [P, P, Z, I],
    "op_int8_dequantize": [P, Z, P, Z, I],
    "op_int8_record_bytes": [Z],
    "op_topk_select": [P, P, Z, Z],
    "op_topk_scatter_add": [P, Z, Z, P, Z, I],
    "op_set_num_threads": [I],
}, returns={"op_int8_record_bytes": ctypes.c_size_t})
check = Tally()


def ptr(a):
    return a.ctypes.data_as(ctypes.c_void_p)


def awkward_values(rng, n):
    """Magnitudes over 2^-30 .. 2^20, some zero blocks, some exact .5 ties."""
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-30, 21, n))).astype(np.float32)
    if n > 2 * BLOCK:
        x[BLOCK:2 * BLOCK] = 0  # a block of zeros: scale 0
    if n > 3 * BLOCK + 4:  # absmax 127 -> scale 1: x = 2.5 and -3.5 round to 2 and -4
        x[2 * BLOCK:3 * BLOCK] = rng.integers(-100, 100, BLOCK).astype(np.float32)
        x[2 * BLOCK] = 127.0
        x[2 * BLOCK + 1:2 * BLOCK + 3] = [2.5, -3.5]
    return x


def run_quantize(x, chunk_n, chunks, accumulate=False, err0=None, in_place=False):
    packed = np.full(record_bytes(chunk_n) * chunks, 0xAB, np.uint8)
    xs = x.copy()
    err = xs if in_place else (err0.copy() if err0 is not None else np.full_like(x, np.nan))
    lib.op_int8_quantize(ptr(packed), ptr(err), ptr(xs), chunk_n, chunks, int(accumulate))
    return packed, err


def test_int8(rng):
    for chunk_n in (1, 63, 256, 257, 1000, 4099):
        for chunks in (1, 2, 5):
            x = awkward_values(rng, chunk_n * chunks)
            want_packed, want_err = model_quantize(x, chunk_n, chunks)
            packed, err = run_quantize(x, chunk_n, chunks)
            check(lib.op_int8_record_bytes(chunk_n) == record_bytes(chunk_n) and
                  np.array_equal(packed, want_packed) and np.array_equal(err, want_err),
                  f"int8_quantize chunk_n {chunk_n} x {chunks}: codes, scales, error bitwise")
            _, err_in_place = run_quantize(x, chunk_n, chunks, in_place=True)
            check(np.array_equal(err_in_place, want_err), f"  ... error written in place")
            err0 = rng.standard_normal(x.size).astype(np.float32)
            _, acc = run_quantize(x, chunk_n, chunks, accumulate=True, err0=err0)
            check(np.array_equal(acc, err0 + want_err), "  ... error accumulated")
            deq = np.concatenate([model_dequantized(want_packed, chunk_n, c)
                                  for c in range(chunks)])
            half = np.repeat([[np.float32(np.max(np.abs(x[c * chunk_n + b * BLOCK:
                                                             c * chunk_n + (b + 1) * BLOCK])))
                               / np.float32(127) for b in range((chunk_n + BLOCK - 1) // BLOCK)]
                              for c in range(chunks)], BLOCK, axis=1)[:, :chunk_n].ravel() / 2
            # x / scale and code * scale are each rounded once (|code| <= 127, float32 ulp
            # 2^-23 at 1): the half step may be exceeded by 2 * 127 * 2^-24 of a step, 3.0e-5 of
            # half a step; seeds 7 and 332 measured 1.5e-6 and 1.9e-6.
            ok = np.all(np.abs(want_err) <= half * (1 + 2 * 127 * 2.0**-24 * 2)) and \
                np.all(np.abs((deq + want_err) - x) <= np.spacing(np.abs(x)))
            check(ok, "  ... |error| <= scale/2 and code*scale + error = x within an ulp")
            test_dequantize(rng, chunk_n, chunks, want_packed)


def test_dequantize(rng, chunk_n, chunks, packed):
    out = np.full(chunk_n, np.nan, np.float32)
    lib.op_int8_dequantize_sum(ptr(out), ptr(packed), chunk_n, chunks)
    want = np.zeros(chunk_n, np.float32)
    for r in range(chunks):
        want = want + model_dequantized(packed, chunk_n, r)
    check(np.array_equal(out, want), f"  int8_dequantize_sum of {chunks} records bitwise")
    n = max(1, chunk_n * chunks - int(rng.integers(0, chunk_n)))
    out = np.full(chunk_n * chunks + 3, np.nan, np.float32)
    lib.op_int8_dequantize(ptr(out), n, ptr(packed), chunk_n, chunks)
    want = np.concatenate([model_dequantized(packed, chunk_n, c) for c in range(chunks)])[:n]
    check(np.array_equal(out[:n], want) and np.all(np.isnan(out[n:])),
          f"  int8_dequantize of {chunks} records into n = {n}: bitwise, nothing past n")


def run_topk(x, k):
    rec = np.full(2 * k, -7, np.int32)
    xs = x.copy()
    lib.op_topk_select(ptr(rec), ptr(xs), x.size, k)
    return rec[:k], rec[k:].view(np.float32), xs


def test_topk(rng):
    for n in (1, 7, 300, 4096, 4097, 70001):
        for k in sorted({1, max(1, n // 100), max(1, n // 3), n}):
            for ties in (False, True):
                if ties:
                    mags = np.float32([0.5, 1, 1.5, 2, 3, 1e-3, 7])
                    x = (rng.choice(mags, n) * rng.choice([-1, 1], n)).astype(np.float32)
                else:
                    x = rng.standard_normal(n).astype(np.float32)
                idx, val, rest = run_topk(x, k)
                widx, wval, wrest = model_topk(x, k)
                check(np.array_equal(idx, widx) and np.array_equal(val, wval) and
                      np.array_equal(rest, wrest),
                      f"topk_select n {n} k {k}{' with ties' if ties else ''}: record and "
                      "residual bitwise")


def test_scatter_add(rng):
    for n, k, records in ((50, 7, 1), (1000, 100, 3), (20000, 1500, 4)):
        recs = []
        for _ in range(records):
            idx = np.sort(rng.choice(n, k, replace=False)).astype(np.int32)
            recs.append(np.concatenate([idx, rng.standard_normal(k).astype(np.float32)
                                        .view(np.int32)]))
        recs = np.concatenate(recs)
        first, out_n = int(rng.integers(0, n // 2)), int(rng.integers(1, n // 2))
        base = rng.standard_normal(out_n).astype(np.float32)
        out = base.copy()
        lib.op_topk_scatter_add(ptr(out), first, out_n, ptr(recs), k, records)
        want = base.copy()
        for r in range(records):
            rec = recs[r * 2 * k:(r + 1) * 2 * k]
            for i, v in zip(rec[:k], rec[k:].view(np.float32)):
                if first <= i < first + out_n:
                    want[i - first] = want[i - first] + v
        check(np.array_equal(out, want),
              f"topk_scatter_add {records} records of {k} into [{first}, {first + out_n}) of "
              f"{n}: bitwise")


def test_threads(rng):
    x = awkward_values(rng, 4099 * 3)
    results = []
    for threads in (1, 2):
        lib.op_set_num_threads(threads)
        packed, err = run_quantize(x, 4099, 3)
        out = np.empty(4099, np.float32)
        lib.op_int8_dequantize_sum(ptr(out), ptr(packed), 4099, 3)
        results.append((packed, err, out))
    check(all(np.array_equal(a, b) for a, b in zip(*results)), "1 and 2 threads: bitwise")


def main():
    seed = int(os.environ.get("SEED", np.random.SeedSequence().entropy % (2**32)))
    print(f"test_grad_compression_ops: seed {seed} (SEED={seed} reproduces)")
    rng = np.random.default_rng(seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        test_int8(rng)
        test_topk(rng)
        test_scatter_add(rng)
        test_threads(rng)
    check.finish("test_grad_compression_ops")


if __name__ == "__main__":
    main()
