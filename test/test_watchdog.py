#!/usr/bin/python3
"""test/test_watchdog.py - a rank that stops never hangs the job: every wait for other ranks has
a deadline, [parallel] timeout_s.

Tiny GPT-2 (L=2, NH=4, C=32, T=16, V=101) training for many steps under mpirun -np 2 with
timeout_s = 3. Once a few steps have printed, rank 1 is stopped with SIGSTOP (it used to leave
rank 0 waiting forever, spinning). For the data-parallel layout (rank 0 waits in the gradient
all-reduce) and the pipeline (it waits in a point-to-point exchange):
  - the job ends on its own, between timeout_s and timeout_s + 20 s after the stop (the end of
    the job under a loaded machine's scheduling);
  - with exit status 1, and a message "[rank 0] error: watchdog: ..." that names the operation,
    the axis, the step (the one after rank 0's last step line, or that line's own when rank 0
    waits in the agreement that ends a step) and timeout_s;
  - no process of the job is left (the stopped rank was ended too);
  - while it waited, rank 0 slept instead of spinning: its CPU time over the wait is under
    a quarter of the wall time.
Then each kind of wait alone (build/test_watchdog_comm, test/test_watchdog_comm.cpp): after an
all-reduce that completes (no false alarm), rank 1 stops and rank 0 starts an all-reduce, a
point-to-point exchange, or a host helper (all_agree) at step 7; with timeout_s = 1 the job ends
with exit status 1 within 1 to 25 s (mpirun's start-up included: generous for a loaded machine),
the message naming rank 0, the operation, the axis dp and step 7. `--comm BIN nccl` runs only
these, on the NCCL backend (the emulated build's stand-in: build/emu/test_watchdog_comm_nccl,
from test/emu/run_lib_tests.sh), where the watchdog is a thread that watches the queued
operations and calls ncclCommAbort.
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainer import (MPIRUN, TRAIN_CPU, Checks, base_sections, make_experiment,  # noqa: E402
                     rank_pids, seeded_rng, write_config)

checks = Checks("test_watchdog")
TIMEOUT_S = 3


def cpu_seconds(pid):
    """User + system CPU time of a process, from /proc (0 if it is gone)."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


def named_step_fits(line, named, printed):
    """The step the watchdog names is the one after rank 0's last step line, or that line's
    own step when rank 0 waited in the ranks' agreement at the end of a step (after its line:
    the host all-reduce on the world of train.cu's preemption_agreed)."""
    return named == printed + 1 or (named == printed and "host all-reduce on axis world" in line)


def stop_one_rank(what, cfg, overrides):
    cmd = MPIRUN + ["-np", "2", TRAIN_CPU, cfg, *overrides]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = open(cfg + ".out", "w+")
    p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                         start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline and out_text(out).count("| loss") < 3 and p.poll() is None:
        time.sleep(0.02)
    ranks = rank_pids(cfg)
    if p.poll() is not None or 1 not in ranks or 0 not in ranks:
        checks.check(what, False, f"the job did not get going: {out_text(out)[-400:]}")
        os.killpg(p.pid, signal.SIGKILL)
        return None
    os.kill(ranks[1], signal.SIGSTOP)
    stopped, cpu0 = time.time(), cpu_seconds(ranks[0])
    try:
        p.wait(timeout=TIMEOUT_S + 30)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        for pid in rank_pids(cfg).values():
            os.kill(pid, signal.SIGKILL)
        p.wait()
    took = time.time() - stopped
    spin = (cpu_seconds(ranks[0]) - cpu0) / max(took, 1e-9) if took < TIMEOUT_S + 30 else 1.0
    text = out_text(out)
    steps_printed = text.count("| loss")  # rank 0's last step line; the next step waited
    line = next((l for l in text.splitlines() if "watchdog" in l), "no watchdog line")
    m = re.search(r"at step (\d+)", line)
    ok = (p.returncode == 1 and TIMEOUT_S <= took <= TIMEOUT_S + 20 and
          line.startswith("[rank 0] error: watchdog: ") and "axis" in line and
          f"timeout_s = {TIMEOUT_S}" in line and m is not None and
          named_step_fits(line, int(m.group(1)), steps_printed) and not rank_pids(cfg))
    checks.check(f"{what}: rank 1 stopped, the job ends after timeout_s naming rank, op, axis, "
                 f"step", ok, f"exit {p.returncode} after {took:.1f} s, {steps_printed} steps "
                 f"printed, left {rank_pids(cfg)}: {line[:220]}")
    return spin


def out_text(f):
    f.flush()
    f.seek(0)
    return f.read()


COMM_CASES = [("all-reduce", "all-reduce"), ("p2p", "point-to-point"),
              ("host", "host all-reduce")]


def test_comm_waits(binary, backend):
    env = dict(os.environ, OMP_NUM_THREADS="1", COMM_TEST_BACKEND=backend)
    for case, op in COMM_CASES:
        start = time.time()
        try:
            p = subprocess.run(MPIRUN + ["-np", "2", binary, case, "1"], capture_output=True,
                               text=True, timeout=40, env=env)
            rc, err = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired as e:
            rc, err = None, f"hung: {e}"
        took = time.time() - start
        line = next((l for l in err.splitlines() if "watchdog" in l), "no watchdog line")
        nccl = backend == "nccl" and case != "host"  # the host helpers are MPI's on both
        ok = (rc == 1 and 1 <= took <= 25 and line.startswith("[rank 0] error: watchdog: ") and
              f"{'NCCL ' if nccl else ''}{op}" in line and "on axis dp (2 ranks)" in line and
              "at step 7" in line and "timeout_s = 1" in line)
        checks.check(f"{backend}: {case} with a stopped peer ends the job", ok,
                     f"exit {rc} after {took:.1f} s: {line[:200]}")


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--comm":
        print(f"test_watchdog: {sys.argv[2]} on the {sys.argv[3]} backend")
        test_comm_waits(sys.argv[2], sys.argv[3])
        checks.report()
        return
    rng = seeded_rng("test_watchdog")
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=2, NH=4, C=32, T=16, V=101, n_tokens=20000)
        sec = base_sections(tmp, 100000, micro_batch=1)
        sec["parallel"] = {"timeout_s": float(TIMEOUT_S)}
        sec["log"]["metrics"] = ""
        cfg = write_config(tmp, "c.toml", sec)
        spins = []
        for what, layout in (("dp = 2 (all-reduce)", ["--parallel.dp=2"]),
                             ("pp = 2 (point to point, or the tied embedding's all-reduce)", ["--parallel.pp=2",
                                                          "--train.grad_accum=2"])):
            spins.append(stop_one_rank(what, cfg, layout))
            for pid in rank_pids(cfg).values():  # what a failed check left behind
                os.kill(pid, signal.SIGKILL)
        spins = [s for s in spins if s is not None]
        checks.check("rank 0 sleeps while it waits (CPU time / wall time over the wait)",
                     len(spins) == 2 and max(spins) < 0.25,
                     f"{', '.join(f'{s:.2f}' for s in spins)}")
    build = os.environ.get("BUILD", "build")
    test_comm_waits(os.path.join(build, "test_watchdog_comm"), "mpi")
    checks.report()


if __name__ == "__main__":
    main()
