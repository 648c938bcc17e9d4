"""test/grad_compression_model.py - numpy models of the compressed gradient reductions' formulas
(kernels/ops_decls.h: int8_quantize, int8_dequantize_sum, topk_select; parallel/
grad_compression.cu), every operation rounded once in float32, for test_grad_compression_ops.py
and test_grad_compression.py.

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
