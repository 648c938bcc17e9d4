"""test/opslib.py - what the ctypes tests of the CPU ops share: where build/libops_cpu.so is (the
C entry points of test/ops_capi.cpp), loading it with argument types, and a tally of checks."""
import ctypes
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Filter  # noqa: E402

BUILD = os.environ.get("BUILD", "build")
LIB = os.environ.get("OPS_LIB", os.path.join(BUILD, "libops_cpu.so"))
P, I, Fl = ctypes.c_void_p, ctypes.c_int, ctypes.c_float


def load(path, signatures, returns=None):
    """The library with argtypes from {name: [types]}, restype None (or returns[name])."""
    lib = ctypes.CDLL(path)
    for name, args in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = (returns or {}).get(name)
    return lib


def rel_err(got, ref):
    """||got - ref|| / ||ref|| in float64; inf if got has a NaN or an inf."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if not np.all(np.isfinite(got)):
        return float("inf")
    return float(np.linalg.norm(got - ref) / (np.linalg.norm(ref) + 1e-300))


class Tally:
    """report(ok, what) prints one line per check; finish(name) prints the count and exits 1 on
    any failure. Honours TEST_ONLY (test/checks.py): only the checks it names count."""

    def __init__(self):
        self.failures = self.checks = 0
        self.only = Filter()

    def __call__(self, ok, what):
        if not self.only.counts(what):
            return
        self.checks += 1
        self.failures += 0 if ok else 1
        print(("ok   " if ok else "FAIL ") + what)

    def close(self, what, got, ref, tol):
        err = rel_err(got, ref)
        self(err < tol, f"{what}: rel err {err:.2e} (tol {tol:.0e})")

    def wanted(self, name):
        """Whether the work named `name` is to run under TEST_ONLY: ask before running it."""
        return self.only.wanted(name)

    def finish(self, name):
        nothing_matched = self.only.finish(self.checks)
        print(f"{name}: {self.checks - self.failures}/{self.checks} checks passed")
        sys.exit(1 if self.failures or nothing_matched else 0)
