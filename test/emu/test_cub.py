#!/usr/bin/env python3
"""test/emu/test_cub.py - the cub stand-in (test/emu/include/cub/cub.cuh) against numpy.

Runs <build>/emu/test_cub (which sorts random pairs through cub::DeviceRadixSort::SortPairs with
the two-call protocol of kernels/cuda/encoder.cu, and checks the protocol's refusals itself), then
checks every sort here: the output must be exactly the input pairs reordered by numpy's stable
argsort of the keys' bits [begin_bit, end_bit), where a signed key's bits are taken with the sign
bit flipped (CUB's order: negatives first). Exact equality: a sort has no rounding.

  python3 test/emu/test_cub.py BUILD    (seed: env EMU_TEST_SEED, else random, printed)
"""
import json
import os
import random
import subprocess
import sys
import tempfile

import numpy as np


def sort_bits(keys, begin, end):
    if keys.dtype == np.int32:
        bits = (keys.astype(np.int64) + (1 << 31)).astype(np.uint64)  # sign bit flipped
    else:
        bits = keys.astype(np.uint64)
    width = end - begin
    if width == 0:
        return np.zeros_like(bits)
    mask = np.uint64((1 << width) - 1) if width < 64 else np.uint64(0xFFFFFFFFFFFFFFFF)
    return (bits >> np.uint64(begin)) & mask


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: test_cub.py BUILD")
    binary = os.path.join(sys.argv[1], "emu", "test_cub")
    seed = int(os.environ.get("EMU_TEST_SEED", random.randrange(1 << 31)))
    failures = 0
    with tempfile.TemporaryDirectory() as folder:
        run = subprocess.run([binary, folder, str(seed)], capture_output=True, text=True, timeout=120)
        print(run.stdout, end="")
        if run.returncode != 0:
            failures += 1
            print(f"FAIL {binary} exited with {run.returncode}: {run.stderr[-2000:]}")
        with open(os.path.join(folder, "manifest.json")) as f:
            cases = json.load(f)
        for c in cases:
            kt = np.int32 if c["key"] == "int32" else np.uint64
            vt = np.int32 if c["value"] == "int32" else np.float32
            keys = np.fromfile(c["file"] + ".keys_in", dtype=kt)
            values = np.fromfile(c["file"] + ".values_in", dtype=vt)
            order = np.argsort(sort_bits(keys, c["begin"], c["end"]), kind="stable")
            got_k = np.fromfile(c["file"] + ".keys_out", dtype=kt)
            got_v = np.fromfile(c["file"] + ".values_out", dtype=vt)
            ok = np.array_equal(got_k, keys[order]) and np.array_equal(got_v.view(np.uint32),
                                                                        values[order].view(np.uint32))
            dupes = len(keys) - len(np.unique(sort_bits(keys, c["begin"], c["end"])))
            print(f"{'ok  ' if ok else 'FAIL'} {c['name']}: n={c['n']} bits [{c['begin']},{c['end']}),"
                  f" {dupes} keys equal to an earlier one")
            failures += not ok
    print(f"test_cub.py: {len(cases)} sorts, {failures} failures (EMU_TEST_SEED={seed})")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
