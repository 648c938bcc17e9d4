"""test/emu/test_counts.py - the emulator's counter (EMU_COUNTS, test/emu/counts.cpp) on kernels
of known traffic (test/emu/test_counts.cu, whose header derives each number): a copy moves 2N
bytes, a block that rereads its input counts it once as distinct sectors and every time as
accessed bytes, an mma issues 2 x 16 x 8 x 16 FLOPs, a cuBLASLt GEMM 2MNK. Run under the order
check (EMU_ORDER=forward,reverse), so a count of the check's rerun would show as double.

usage: python3 test/emu/test_counts.py build/emu/test_counts"""
import json
import os
import subprocess
import sys
import tempfile

N = 1000
WANT = {  # name: (bytes_read, bytes_written, accessed_read, accessed_written, tensor_flops)
    "copy_floats (main)": (4 * N, 4 * N, 4 * N, 4 * N, 0),
    "copy_float4s (main)": (4 * N, 4 * N, 4 * N, 4 * N, 0),
    "pack_copy (main)": (4 * N, 4 * N, 4 * N, 4 * N, 0),
    "scale_in_place (main)": (4 * N, 4 * N, 4 * N, 4 * N, 0),
    "reread (main)": (4 * N, 32, 4 * 4 * N, 16, 0),
    "atomic_adds (main)": (0, 32, 0, 4 * N, 0),
    "cp_async_tile (main)": (512, 32, 512, 4, 0),
    "mma_tiles (main)": (0, 32, 0, 4, 6 * 2 * 16 * 8 * 16),
}
KEYS = ("bytes_read", "bytes_written", "accessed_read", "accessed_written", "tensor_flops")


def main():
    binary = sys.argv[1]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "counts.json")
        env = dict(os.environ, EMU_COUNTS=path, EMU_ORDER="forward,reverse")
        run = subprocess.run([binary], env=env, capture_output=True, text=True)
        if run.returncode != 0:
            print(run.stdout + run.stderr)
            print("test_counts: the program failed: FAIL")
            return 1
        counts = json.load(open(path))["totals"]["outside"]
    kernels, library = counts["kernels"], counts["library"]
    for name, want in WANT.items():
        got = kernels.get(name)
        ok = got is not None and got["launches"] == 1 and all(
            got[k] == w for k, w in zip(KEYS, want))
        failures += not ok
        print(f"  {name}: {'ok' if ok else 'FAIL'}"
              + ("" if ok else f" (got {got}, want {dict(zip(KEYS, want))})"))
    gemm = library.get("cublasLtMatmul 16x8x32")
    want = {"calls": 1, "flops": 2 * 16 * 8 * 32, "bytes_read": 4 * (16 * 32 + 32 * 8),
            "bytes_written": 4 * 16 * 8, "comm_bytes": 0}
    ok = gemm == want
    failures += not ok
    print(f"  cublasLtMatmul m 16 n 8 k 32: {'ok' if ok else 'FAIL'}"
          + ("" if ok else f" (got {gemm}, want {want})"))
    print(f"test_counts: {len(WANT) + 1 - failures}/{len(WANT) + 1} passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
