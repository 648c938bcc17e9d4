#!/usr/bin/python3
"""test/test_preemption.py - SIGTERM and SIGINT save the run instead of killing it, and a resumed
run reproduces the uninterrupted one with every step in the metrics file once.

Tiny GPT-2 (L=2, NH=3, C=36, T=16, V=101), np = 2 FSDP, global batch 4, shuffled data, 300 steps
saving every 100; the uninterrupted run is the reference. Each preempted run writes into its
own checkpoint directory and metrics file, and is then resumed (resume = "latest") to the end:
1. SIGTERM to both ranks once a random number of steps (10-60) have printed (what Slurm does
   before a preemption or the time limit): the job exits with status 75, rank 0 says which
   signal stopped it after which step k and where the checkpoint went, `latest` names step_k
   (a save that was not due: k is not a multiple of 100), the manifest verifies; resuming
   trains k+1 .. 300 with the losses and gradient norms of the uninterrupted run, bit for bit,
   and the metrics file holds every step 1 .. 300 exactly once.
2. SIGTERM to rank 1 only, and SIGINT to rank 0 only: every rank agrees to stop after the same
   step (the same checks as 1).
3. SIGUSR1 to mpirun, which forwards it to every rank (SIGTERM or SIGINT to mpirun make Open
   MPI kill the ranks a second later, too soon to save): the same, and mpirun exits with 75.
4. Two SIGTERMs 5 ms apart: the second one ends the job at once (status 143, "second signal"),
   no checkpoint is written for it (`latest` unchanged), and the last one verifies.
5. kill -9 of the whole job 1-40 steps after the step-100 save (no chance to save): resuming
   from step_000100 leaves the metrics file with every step exactly once (the killed run's
   steps past 100 are replaced by the resumed run's), with the reference's losses.
"""
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainer import (MPIRUN, TRAIN_CPU, Checks, base_sections, make_experiment,  # noqa: E402
                     json_records, rank_pids, run, seeded_rng, verify_manifest,
                     write_config)

checks = Checks("test_preemption")
STEPS, EVERY = 300, 100
LAYOUT = ["--parallel.dp=2", "--parallel.fsdp=true", "--train.micro_batch=2"]


def step_records(path):
    """The step records of a metrics file, in file order."""
    return [r for r in json_records(path) if "step" in r and "loss" in r]


def latest(ck):
    try:
        return open(os.path.join(ck, "latest")).read().strip()
    except OSError:
        return None


class Job:
    """The trainer under mpirun in its own session, its output in a file."""

    def __init__(self, cfg, name, tmp, *extra):
        self.ck, self.metrics = os.path.join(tmp, "ck_" + name), os.path.join(tmp, name + ".jsonl")
        self.log = open(os.path.join(tmp, name + ".log"), "w+")
        self.marker = self.ck
        cmd = MPIRUN + ["-np", "2", TRAIN_CPU, cfg, *LAYOUT, f"--checkpoint.dir={self.ck}",
                        f"--log.metrics={self.metrics}", *extra]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        self.p = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                  start_new_session=True)

    def text(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def wait_steps(self, n, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline and self.p.poll() is None and \
                self.text().count("| loss") < n:
            time.sleep(0.005)

    def finish(self, timeout=60):
        try:
            self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()
        for pid in rank_pids(self.marker).values():
            os.kill(pid, signal.SIGKILL)
        return self.p.returncode


def resume_to_end(cfg, job):
    return run(cfg, LAYOUT + [f"--checkpoint.dir={job.ck}", f"--log.metrics={job.metrics}",
                              "--checkpoint.resume=latest"], np_ranks=2, check=False, timeout=300)


def check_resumed(what, job, reference, r):
    got = step_records(job.metrics)
    steps = [g["step"] for g in got]
    same = all(g["loss"] == reference[g["step"]]["loss"] and
               g["grad_norm"] == reference[g["step"]]["grad_norm"] for g in got)
    ok = r.returncode == 0 and sorted(steps) == list(range(1, STEPS + 1)) and same
    dup = sorted({s for s in steps if steps.count(s) > 1})
    checks.check(f"{what}: resumed to step {STEPS}, bit-exact, every step once in the metrics",
                 ok, f"exit {r.returncode}, {len(steps)} records, duplicated {dup[:8]}, "
                 f"equal to the uninterrupted run {same} {r.stderr.strip()[-200:]}")


def preempt(cfg, tmp, reference, name, how):
    job = Job(cfg, name, tmp)
    job.wait_steps(random.randint(10, 60))
    pids = rank_pids(job.marker)
    sig = {"every rank": "SIGTERM", "rank 1": "SIGTERM", "rank 0": "SIGINT"}.get(how, "SIGUSR1")
    if how == "every rank":
        for pid in pids.values():
            os.kill(pid, signal.SIGTERM)
    elif how == "rank 1":
        os.kill(pids[1], signal.SIGTERM)
    elif how == "rank 0":
        os.kill(pids[0], signal.SIGINT)
    else:
        os.kill(job.p.pid, signal.SIGUSR1)
    rc = job.finish()
    text = job.text()
    line = next((l for l in text.splitlines() if l.startswith("preempted")), "no preempted line")
    name_ = latest(job.ck)
    k = int(name_[5:]) if name_ else -1
    ok = (rc == 75 and f"{sig} received" in line and f"after step {k} " in line and
          f"{name_} saved" in line and verify_manifest(os.path.join(job.ck, name_)) == "" and
          max(r["step"] for r in step_records(job.metrics)) == k)
    checks.check(f"{sig} to {how}: exit 75 after saving the step in flight", ok,
                 f"exit {rc}, latest {name_}: {line[:200]}")
    check_resumed(f"{sig} to {how}", job, reference, resume_to_end(cfg, job))


def double_signal(cfg, tmp):
    job = Job(cfg, "double", tmp)
    job.wait_steps(EVERY + 20)
    before = latest(job.ck)
    pids = rank_pids(job.marker)
    for pid in pids.values():
        os.kill(pid, signal.SIGTERM)
    time.sleep(0.005)  # signals do not queue: the first must have been handled
    for pid in pids.values():
        os.kill(pid, signal.SIGTERM)
    rc = job.finish()
    text = job.text()
    ok = (rc == 143 and "second signal" in text and latest(job.ck) == before and
          verify_manifest(os.path.join(job.ck, before)) == "")
    checks.check("two SIGTERMs: the second ends the job at once, nothing saved for it", ok,
                 f"exit {rc}, latest {before} -> {latest(job.ck)}: "
                 f"{next((l for l in text.splitlines() if 'second' in l), '')[:160]}")


def killed_after_save(cfg, tmp, reference):
    job = Job(cfg, "killed", tmp)
    job.wait_steps(EVERY + random.randint(1, 40))
    os.killpg(job.p.pid, signal.SIGKILL)
    job.finish()
    past = [r["step"] for r in step_records(job.metrics) if r["step"] > EVERY]
    checks.check("kill -9 after the step-100 save left steps past it in the metrics",
                 latest(job.ck) == f"step_{EVERY:06d}" and len(past) > 0,
                 f"latest {latest(job.ck)}, {len(past)} steps past {EVERY}")
    check_resumed("kill -9", job, reference, resume_to_end(cfg, job))


def main():
    rng = seeded_rng("test_preemption")
    random.seed(int(rng.integers(1 << 30)))
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=2, NH=3, C=36, T=16, V=101, n_tokens=3000)
        sec = base_sections(tmp, STEPS, micro_batch=2)
        sec["data"]["shuffle"] = True
        sec["checkpoint"] = {"every": EVERY}
        sec["log"]["every"] = 1
        cfg = write_config(tmp, "c.toml", sec)
        ref = os.path.join(tmp, "reference.jsonl")
        run(cfg, LAYOUT + [f"--log.metrics={ref}"], np_ranks=2, timeout=300)
        reference = {r["step"]: r for r in step_records(ref)}
        for name, how in (("all", "every rank"), ("one", "rank 1"), ("int", "rank 0"),
                          ("usr1", "mpirun")):
            try:
                preempt(cfg, tmp, reference, name, how)
            except (OSError, KeyError, ValueError, TypeError) as e:
                checks.check(f"preempted by a signal to {how}", False, f"{type(e).__name__}: {e}")
        checks.run_each(lambda: double_signal(cfg, tmp),
                        lambda: killed_after_save(cfg, tmp, reference))
    checks.report()


if __name__ == "__main__":
    main()
