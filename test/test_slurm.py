#!/usr/bin/python3
"""test/test_slurm.py - the trainer under a real Slurm (a private single-node one,
test/slurm_cluster.py: its own munged, slurmctld and slurmd, config, spool and ports in a
temporary directory), and the OpenMP threads each rank chooses under every launcher.

Tiny GPT-2 (L=2, NH=3, C=36, T=16, V=101), dp = 2, global batch 4, 200 steps saving every 100;
the reference is `mpirun -np 2` (unbound: --bind-to none).
1. Threads (parallel/host_threads.h), OMP_NUM_THREADS unset: a bare ./train_cpu runs one thread
   per core of its affinity mask; 2 ranks whose masks are the same n cores (mpirun --bind-to none,
   srun under Slurm's task/none, which binds nothing) run max(1, n // 2) each, never 2n in all;
   OMP_NUM_THREADS=3 under srun gives 3 and the banner says why.
2. `srun -n 2 --mpi=pmix ./train_cpu` trains with the losses and gradient norms of the mpirun
   run, bit for bit.
3. tools/slurm/train.sbatch under sbatch: once 10 steps are in the metrics, every rank of the
   job step gets SIGTERM, as Slurm sends it before the time limit (`--signal=TERM@120` without
   "B:" signals the step's tasks; here `scancel --signal=TERM` sends the same signal to the same
   processes now instead of minutes before a limit). The ranks save and exit 75, the script
   requeues the job, the job starts again from `latest` and trains to step 200: Slurm counts one
   restart, the job's output says so, and the metrics hold every step 1..200 once with the
   reference's losses and gradient norms, bit for bit.
Where a private Slurm cannot start (not root, no munge or slurm-wlm), the group prints a SKIP
line naming why and exits 77.
"""
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from slurm_cluster import SlurmCluster, SlurmUnavailable  # noqa: E402
from trainer import (MPIRUN, TRAIN_CPU, Checks, base_sections, make_experiment,  # noqa: E402
                     read_metrics, seeded_rng, write_config)

checks = Checks("test_slurm")
STEPS, EVERY = 200, 100
LAYOUT = ["--parallel.dp=2", "--train.micro_batch=2"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NO_OMP = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}


def threads_line(text):
    m = re.search(r"^threads +(\d+) OpenMP threads? on rank 0: (.*)$", text, re.M)
    return (int(m.group(1)), m.group(2)) if m else (None, "no threads line")


def losses(path):
    return [(s["step"], s["loss"], s["grad_norm"]) for s in read_metrics(path)[0]]


def launch(cmd, env, timeout=300):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    if r.returncode != 0:
        print(r.stdout[-2000:], r.stderr[-2000:])
    return r


def check_threads(cfg, tmp, slurm):
    n = len(os.sched_getaffinity(0))
    one = ["--train.steps=1"]
    r = launch([TRAIN_CPU, cfg, *one], NO_OMP)
    got, why = threads_line(r.stdout)
    checks.check(f"bare process: {n} thread(s), its mask", got == n, f"{got}: {why}")
    share = max(1, n // 2)
    r = launch(MPIRUN + ["-np", "2", TRAIN_CPU, cfg, *LAYOUT, *one], NO_OMP)
    got, why = threads_line(r.stdout)
    checks.check(f"mpirun --bind-to none -np 2: {share} thread(s) each", got == share,
                 f"{got}: {why}")
    r = launch(["srun", "-n", "2", "--mpi=pmix", TRAIN_CPU, cfg, *LAYOUT, *one],
               slurm.env(**{"OMP_NUM_THREADS": "3"}))
    got, why = threads_line(r.stdout)
    checks.check("srun with OMP_NUM_THREADS=3: 3 threads, said why", got == 3 and
                 "OMP_NUM_THREADS=3" in why, f"{got}: {why}")


def check_srun_losses(cfg, tmp, slurm, reference):
    metrics = os.path.join(tmp, "srun.jsonl")
    env = dict(slurm.env(), **{"OMP_NUM_THREADS": ""})
    env.pop("OMP_NUM_THREADS")
    r = launch(["srun", "-n", "2", "--mpi=pmix", TRAIN_CPU, cfg, *LAYOUT,
                f"--log.metrics={metrics}"], env)
    got, why = threads_line(r.stdout)
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    checks.check(f"srun -n 2, unbound (task/none): {share} thread(s) each", got == share,
                 f"{got}: {why}")
    ok = r.returncode == 0 and os.path.exists(metrics) and losses(metrics) == reference
    checks.check(f"srun -n 2 --mpi=pmix: {STEPS} steps, losses and norms equal to mpirun's", ok,
                 f"exit {r.returncode}: {r.stderr.strip()[-300:]}")


def wait_for(what, predicate, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    print(f"timed out waiting for {what}")
    return False


def check_job_script(cfg, tmp, slurm, reference):
    metrics, out = os.path.join(tmp, "job.jsonl"), os.path.join(tmp, "job.out")
    ck = os.path.join(tmp, "ck_job")
    env = dict(slurm.env(TRAIN=os.path.abspath(os.path.join(ROOT, TRAIN_CPU))))
    env.pop("OMP_NUM_THREADS", None)
    r = subprocess.run(["sbatch", "--parsable", f"--output={out}", f"--chdir={ROOT}",
                        "tools/slurm/train.sbatch", cfg, *LAYOUT, f"--checkpoint.dir={ck}",
                        f"--log.metrics={metrics}"], env=env, capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    job = r.stdout.strip().split(";")[0]
    accepted = r.returncode == 0 and bool(job)
    checks.check("sbatch tools/slurm/train.sbatch accepted", accepted, r.stderr.strip())
    if not accepted:
        return
    started = wait_for("10 steps", lambda: os.path.exists(metrics) and len(losses(metrics)) >= 10,
                       120)
    subprocess.run(["scancel", "--signal=TERM", job], env=env, timeout=30)
    finished = wait_for("the requeued job to finish",
                        lambda: slurm.job_state(job)[0] in ("COMPLETED", "FAILED", "CANCELLED",
                                                            "TIMEOUT", "NODE_FAIL"), 180)
    state, restarts = slurm.job_state(job)
    text = open(out).read() if os.path.exists(out) else ""
    print("\n".join(l for l in text.splitlines() if l.startswith("train.sbatch")))
    checks.check("job script: SIGTERM to the ranks -> saved, exit 75, requeued once, completed",
                 started and finished and state == "COMPLETED" and restarts == 1 and
                 text.count("preempted (status 75)") == 1 and "start 2" in text,
                 f"state {state}, restarts {restarts}; output:\n{text[-1500:]}")
    got = losses(metrics) if os.path.exists(metrics) else []
    checks.check(f"job script: steps 1..{STEPS} once each, bit-exact with the uninterrupted run",
                 got == reference, f"{len(got)} records; first differences "
                 f"{[g for g, w in zip(got, reference) if g != w][:3]}")


def main():
    rng = seeded_rng("test_slurm")
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng)
        sec = base_sections(tmp, STEPS)
        sec["checkpoint"] = {"every": EVERY}
        cfg = write_config(tmp, "slurm.toml", sec)
        try:
            slurm = SlurmCluster(tmp).__enter__()
        except SlurmUnavailable as e:
            print(f"SKIP slurm: {e}")
            sys.exit(77)
        try:
            ref_metrics = os.path.join(tmp, "mpirun.jsonl")
            r = launch(MPIRUN + ["-np", "2", TRAIN_CPU, cfg, *LAYOUT,
                                 f"--log.metrics={ref_metrics}"], NO_OMP)
            reference = losses(ref_metrics) if r.returncode == 0 else []
            checks.check(f"mpirun -np 2: {STEPS} steps", len(reference) == STEPS,
                         f"exit {r.returncode}")
            checks.run_each(lambda: check_threads(cfg, tmp, slurm),
                            lambda: check_srun_losses(cfg, tmp, slurm, reference),
                            lambda: check_job_script(cfg, tmp, slurm, reference))
        finally:
            slurm.stop()
    checks.report()


if __name__ == "__main__":
    main()
