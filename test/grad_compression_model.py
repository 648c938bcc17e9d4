"""test/grad_compression_model.py - numpy models of the compressed gradient reductions' formulas
(kernels/ops_decls.h: int8_quantize, int8_dequantize_sum, topk_select; parallel/
grad_compression.cu), every operation rounded once in float32, and of their bytes per step, for
test_grad_compression_ops.py, test_grad_compression.py and test_diloco.py.

int8: per block of 256 values of a chunk, scale = float32(absmax) / float32(127), code =
rint(x / scale) (nearest even) clipped to [-127, 127], error = x - code * scale; a record is the
chunk's codes, zero bytes up to a multiple of 4, then its scales. Top-k: the k largest |x| (ties:
lower index first), indices increasing, the rest left in x.
"""
import numpy as np

BLOCK = 256


def record_bytes(chunk_n):
    return (chunk_n + 3) // 4 * 4 + 4 * ((chunk_n + BLOCK - 1) // BLOCK)


def quantize(x, chunk_n, chunks):
    """(packed bytes, error) of x (chunks * chunk_n float32 values)."""
    rb = record_bytes(chunk_n)
    packed = np.zeros(rb * chunks, np.uint8)
    err = np.empty_like(x)
    f127 = np.float32(127)
    for c in range(chunks):
        codes = np.zeros(chunk_n, np.int8)
        scales = np.zeros((chunk_n + BLOCK - 1) // BLOCK, np.float32)
        for b in range(len(scales)):
            lo, hi = b * BLOCK, min(chunk_n, (b + 1) * BLOCK)
            v = x[c * chunk_n + lo:c * chunk_n + hi]
            scale = np.float32(np.max(np.abs(v))) / f127
            with np.errstate(invalid="ignore", divide="ignore"):
                q = np.clip(np.rint(v / scale), -127, 127) if scale > 0 else np.zeros_like(v)
            scales[b] = scale
            codes[lo:hi] = q.astype(np.int8)
            err[c * chunk_n + lo:c * chunk_n + hi] = v - (q.astype(np.float32) * scale)
        base = c * rb
        packed[base:base + chunk_n] = codes.view(np.uint8)
        off = base + (chunk_n + 3) // 4 * 4
        packed[off:off + 4 * len(scales)] = scales.view(np.uint8)
    return packed, err


def dequantized(packed, chunk_n, r):
    """Record r of packed as float32 values code * scale."""
    rb = record_bytes(chunk_n)
    codes = packed[r * rb:r * rb + chunk_n].view(np.int8).astype(np.float32)
    off = r * rb + (chunk_n + 3) // 4 * 4
    nb = (chunk_n + BLOCK - 1) // BLOCK
    scales = packed[off:off + 4 * nb].view(np.float32)
    return codes * np.repeat(scales, BLOCK)[:chunk_n]


def topk(x, k):
    """(indices, values, x with them zeroed) of the k largest |x|, ties to the lower index."""
    key = np.abs(x).view(np.uint32) & np.uint32(0x7fffffff)
    order = np.lexsort((np.arange(x.size), -key.astype(np.int64)))  # key desc, index asc
    idx = np.sort(order[:k])
    rest = x.copy()
    rest[idx] = 0
    return idx.astype(np.int32), x[idx], rest


# ---------------------------------------------------------------------------------------------
# The int8 reductions of parallel/grad_compression.cu (DiLoCo's int8 meetings use the all-reduce)
# ---------------------------------------------------------------------------------------------
def int8_step(g, e, all_reduce):
    """One step on N ranks: g[r] gradients (n values), e[r] residuals (updated). Returns what
    each rank receives (all-reduce: the n-value sum; reduce-scatter: its shard)."""
    N, n = len(g), g[0].size
    chunk = -(-n // N)
    packed = []
    for r in range(N):
        e[r][:n] = e[r][:n] + g[r]
        p, e[r][:] = quantize(e[r], chunk, N)
        packed.append(p)
    sums = []
    for o in range(N):
        s = np.zeros(chunk, np.float32)
        for r in range(N):
            s = s + dequantized(packed[r], chunk, o)
        sums.append(s)
    if not all_reduce:
        return sums
    result = []
    for o in range(N):
        p, err = quantize(sums[o], chunk, 1)
        e[o][o * chunk:(o + 1) * chunk] = e[o][o * chunk:(o + 1) * chunk] + err
        result.append(dequantized(p, chunk, 0))
    full = np.concatenate(result)[:n]
    return [full] * N


# ---------------------------------------------------------------------------------------------
# Bytes (the header of parallel/grad_compression.cu), as parallel/comm.h counts them
# ---------------------------------------------------------------------------------------------
def analytic_bytes(kind, n, N, all_reduce, ratio):
    """Payload of one compressed reduction of n values over N ranks, per collective."""
    if kind == "topk":
        return {"all_gather": 8 * N * min(n, max(1, int(np.floor(ratio * n + 0.5)))),
                "all_to_all": 0}
    rb = record_bytes(-(-n // N))
    return {"all_to_all": N * rb, "all_gather": N * rb if all_reduce else 0}


def round_up(x, m):
    return (x + m - 1) // m * m


def trainer_bytes(kind, zero, accum, ratio, units, L, dp, root=True):
    """The dp collectives of one trainer step of a dense GPT-2 (units: the flat unit lengths,
    root first, then L blocks; root=False: no root, L units reduced like blocks, e.g. experts)
    over a group of dp ranks: per unit one compressed reduction (ZeRO-2: per micro-batch for
    the blocks), plus ZeRO's all-gather of the fp32 weights."""
    padded = [round_up(n, dp * 64) for n in units]
    buckets = units if zero == 0 else padded
    times = ([1] if root else []) + [accum if zero == 2 else 1] * L
    comm = {}
    for n, m in zip(buckets, times):
        b = analytic_bytes(kind, n, dp, zero == 0, ratio)
        for key, calls in (("all_to_all", 1 if kind == "int8" else 0),
                           ("all_gather", 1 if kind == "topk" or zero == 0 else 0)):
            if calls:
                c = comm.setdefault(key, {"calls": 0, "bytes": 0})
                c["calls"] += m
                c["bytes"] += m * b[key]
    if zero > 0:
        c = comm.setdefault("all_gather", {"calls": 0, "bytes": 0})
        c["calls"] += len(units)
        c["bytes"] += 4 * sum(padded)
    return comm
