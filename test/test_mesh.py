#!/usr/bin/python3
"""test/test_mesh.py - the communicator and the device mesh under mpirun, through test_comm.

Drives the binaries built from test/test_comm.cpp (see its header for the modes):
  <build>/test_comm              CPU backend buffers (MPI reads the caller's buffers)
  <build>/test_comm_fake_device  a pretend GPU: the MPI backend must stage through host memory
<build> is the first argument, else env BUILD, else "build".

Checks:
  - the full suite (every layout, every collective and the paired send_recv on every axis, fp32
    and bf16, exact values, groups, coordinates, counters, printed summary) at 1, 2, 3 and 4
    ranks: exit 0, "0 failures"
    and a plausible number of checks; the staged variant at 2 ranks;
  - failure handling at 3 ranks: rank 1 calls FATAL, throws, or SIGKILLs itself while the others
    wait in an all-reduce: mpirun exits non-zero within 60 s and the output names rank 1;
  - the Count backend of the planner (test_comm count: groups, counters, nothing moved, host
    helpers as if every rank were this one);
  - layout_problems' message for each rule (test_comm validate ...; the config reader prints
    them, test_config.py and test_usability.py check that path), and mesh_init's handling of
    backend = nccl in a binary built without NCCL.
The whole file takes about 20 s on 2 cores.
"""
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Filter  # noqa: E402

BUILD = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("BUILD", "build")
TEST_COMM = os.path.join(BUILD, "test_comm")
FAKE_DEVICE = os.path.join(BUILD, "test_comm_fake_device")
# Root in a container needs --allow-run-as-root; 4 ranks on 2 cores need --oversubscribe, and
# waiting ranks should yield the core instead of busy-polling (Open MPI's mpi_yield_when_idle:
# without it a rank waiting in a collective spins and starves the ranks sharing its core).
MPIRUN = ["mpirun", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1"]
if os.geteuid() == 0:
    MPIRUN.insert(1, "--allow-run-as-root")
FAILURES = []
CHECKS = [0]
ONLY = Filter()


def check(ok, what, output=""):
    if not ONLY.counts(what):  # TEST_ONLY (test/checks.py): only the checks it names
        return
    CHECKS[0] += 1
    if not ok:
        FAILURES.append(what)
        print("FAIL:", what)
        if output:
            print("  " + output.strip().replace("\n", "\n  ")[-3000:])


def run(cmd, timeout):
    """Runs cmd in its own process group; returns (exit status or None on timeout, output, s)."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out, time.monotonic() - start
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # mpirun and every rank it started
        out, _ = proc.communicate()
        return None, out, time.monotonic() - start


def mpi(np, *args, binary=TEST_COMM, timeout=60):
    return run(MPIRUN + ["-np", str(np), binary] + list(args), timeout)


# ----------------------------------------------------------------------------------------------
# The suite
# ----------------------------------------------------------------------------------------------
def test_suite(binary, np, min_checks):
    name = f"{os.path.basename(binary)} at {np} rank(s)"
    if not ONLY.wanted(name):  # TEST_ONLY names another part: skip this suite's run
        return
    # A hang's limit, not a speed check: about 12 s of CPU, which took 50 s on a 2-core machine
    # shared with other work (load 15) where a 40 s limit failed it.
    rc, out, secs = mpi(np, binary=binary, timeout=150)
    last = out.strip().splitlines()[-1] if out.strip() else "(no output)"
    print(f"{name}: {last} [{secs:.1f} s]")
    check(rc == 0, f"{name}: exit status {rc}", out)
    summary = [l for l in out.splitlines() if l.startswith("test_comm (")]
    check(len(summary) == 1 and ", 0 failures" in summary[0], f"{name}: summary line", out)
    if summary:
        checks = int(summary[0].split(" checks")[0].split()[-1])
        check(checks >= min_checks, f"{name}: only {checks} checks ran (expected >= {min_checks})")


# ----------------------------------------------------------------------------------------------
# One rank fails
# ----------------------------------------------------------------------------------------------
def test_failure(mode, expect_text):
    if not ONLY.wanted(mode):
        return
    rc, out, secs = mpi(3, mode, timeout=60)
    print(f"{mode}: exit status {rc} after {secs:.1f} s")
    check(rc is not None, f"{mode}: the job did not end within 60 s", out)
    check(rc is not None and rc != 0, f"{mode}: exit status {rc}, expected non-zero", out)
    check(expect_text in out, f"{mode}: output lacks {expect_text!r}", out)
    check("survived" not in out, f"{mode}: a rank went on after rank 1 failed", out)


# ----------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------
# (world, dp, tp, pp, cp, ep, n_head, seq_len, n_layer) -> the lines expected ("ok" if valid)
VALIDATE_CASES = [
    ((1, 1, 1, 1, 1, 1, 12, 1024, 12), ["ok"]),
    ((8, 2, 2, 1, 2, 4, 12, 1024, 12), ["ok"]),
    ((4, 1, 1, 4, 1, 1, 12, 1024, 4), ["ok"]),
    ((3, 1, 3, 1, 1, 1, 12, 1024, 12), [
        "[parallel] tp = 3 does not divide [model] seq_len = 1024 (sequence parallelism gives "
        "each tensor-parallel rank seq_len/tp positions; or set sp = false)"]),
    ((3, 1, 3, 1, 1, 1, 16, 48, 12), [
        "[parallel] tp = 3 does not divide [model] n_head = 16 (each tensor-parallel rank holds "
        "n_head/tp heads)"]),
    ((4, 2, 1, 1, 1, 1, 12, 1024, 12), [
        "the parallel degrees multiply to dp*pp*cp*tp = 2*1*1*1 = 2, but the job has world size 4 "
        "([parallel] dp = 2, [parallel] pp = 1, [parallel] cp = 1, [parallel] tp = 1; ep is not a "
        "factor of the world: it lives inside dp*cp): launch with mpirun -np 2 or change the "
        "degrees"]),
    ((3, 1, 1, 1, 3, 1, 12, 1024, 12), [
        "[parallel] cp = 3: 2*cp = 6 does not divide [model] seq_len = 1024 (zigzag context "
        "parallelism cuts each sequence into 2*cp chunks, two per rank)"]),
    ((8, 1, 4, 1, 2, 1, 12, 20, 12), [
        "[parallel] tp = 4 does not divide seq_len/cp = 20/2 = 10 (sequence parallelism splits "
        "each context-parallel rank's positions over tp)"]),
    ((8, 1, 1, 8, 1, 1, 12, 1024, 6), [
        '[parallel] pp = 8, [parallel] pp_schedule = "1f1b", [parallel] pp_virtual = 1, [train] '
        'grad_accum = 1 (the '
        'micro-batches of a step): pipeline: n_layer = 6 is not a multiple of pp*v = 8*1 = 8 '
        '(each of the pp*v stages holds the same number of blocks unless [parallel] pp_layers '
        'or pp_balance says otherwise)',
        "[parallel] pp = 8 exceeds [model] n_layer = 6 (each pipeline stage needs at least one "
        "layer)"]),
    ((4, 2, 1, 1, 2, 3, 12, 1024, 12), [
        "[parallel] ep = 3 does not divide dp*cp = 2*2 = 4 ([parallel] dp = 2, [parallel] cp = 2; "
        "expert parallelism shards the experts over blocks of ep ranks inside dp x cp)"]),
    ((2, 2, 1, 1, 1, 0, 12, 1024, 12), ["[parallel] ep = 0 must be at least 1"]),
    # several rules broken at once: every one is reported, one per line
    ((5, 1, 5, 2, 1, 1, 12, 1024, 1), [
        "the parallel degrees multiply to dp*pp*cp*tp = 1*2*1*5 = 10, but the job has world size 5 "
        "([parallel] dp = 1, [parallel] pp = 2, [parallel] cp = 1, [parallel] tp = 5; ep is not a "
        "factor of the world: it lives inside dp*cp): launch with mpirun -np 10 or change the "
        "degrees",
        "[parallel] tp = 5 does not divide [model] n_head = 12 (each tensor-parallel rank holds "
        "n_head/tp heads)",
        "[parallel] tp = 5 does not divide [model] seq_len = 1024 (sequence parallelism gives "
        "each tensor-parallel rank seq_len/tp positions; or set sp = false)",
        '[parallel] pp = 2, [parallel] pp_schedule = "1f1b", [parallel] pp_virtual = 1, [train] '
        'grad_accum = 1 (the '
        'micro-batches of a step): pipeline: n_layer = 1 is not a multiple of pp*v = 2*1 = 2 '
        '(each of the pp*v stages holds the same number of blocks unless [parallel] pp_layers '
        'or pp_balance says otherwise)',
        "[parallel] pp = 2 exceeds [model] n_layer = 1 (each pipeline stage needs at least one "
        "layer)"]),
]


def test_validate():
    for args, want in VALIDATE_CASES:
        rc, out, _ = run([TEST_COMM, "validate"] + [str(a) for a in args], timeout=10)
        check(rc == 0 and out.splitlines() == want,
              f"validate {args}: got {out.splitlines()}, want {want}")


def test_count():
    # The planner's Count backend: groups, counters, nothing moved, host helpers (test_comm count)
    rc, out, _ = run([TEST_COMM, "count"], timeout=60)
    last = out.strip().splitlines()[-1] if out.strip() else "(no output)"
    print(f"count backend: {last}")
    check(rc == 0 and last.startswith("test_comm count:") and last.endswith(", 0 failures") and
          int(last.split()[2]) > 19000, "test_comm count", out)


def test_bad_layouts():
    # a good layout
    rc, out, _ = mpi(4, "layout", "1", "2", "2", "1", "1", timeout=30)
    check(rc == 0 and out.strip() == "ok", f"layout tp=2 pp=2 on 4 ranks: {rc}", out)
    # backend = nccl in a binary without NCCL, on one rank (no NCCL communicator would be made)
    # and on two
    want = 'error: this binary was built without NCCL; use [parallel] backend = "mpi"'
    rc, out, _ = run([TEST_COMM, "layout", "1", "1", "1", "1", "1", "nccl"], timeout=30)
    check(rc not in (0, None) and want in out, f"nccl requested on 1 rank: {rc}", out)
    rc, out, _ = mpi(2, "layout", "2", "1", "1", "1", "1", "nccl", timeout=30)
    check(rc not in (0, None) and want in out, f"nccl requested on 2 ranks: {rc}", out)


def main():
    start = time.monotonic()
    if not os.path.exists(TEST_COMM):
        sys.exit(f"test_mesh.py: {TEST_COMM} not found (build it first)")
    # Lower bounds a little under what the suite runs today (515, 7624, 10837, 52518 checks, with
    # the paired send_recv tests), so that a suite silently doing less fails.
    for np, min_checks in [(1, 500), (2, 7400), (3, 10500), (4, 50000)]:
        test_suite(TEST_COMM, np, min_checks)
    if os.path.exists(FAKE_DEVICE):
        test_suite(FAKE_DEVICE, 2, 7400)
    else:
        print(f"SKIPPED the staged (fake device) suite: {FAKE_DEVICE} not built")
    test_failure("fatal", "[rank 1] error: deliberate failure of rank 1 (test_comm fatal)")
    test_failure("throw", "[rank 1] error: uncaught exception: deliberate exception of rank 1")
    test_failure("hang", "process rank 1")
    test_validate()
    test_count()
    test_bad_layouts()
    secs = time.monotonic() - start
    print(f"test_mesh.py: {CHECKS[0]} checks, {len(FAILURES)} failures, {secs:.1f} s")
    sys.exit(1 if ONLY.finish(CHECKS[0]) or FAILURES else 0)


if __name__ == "__main__":
    main()
