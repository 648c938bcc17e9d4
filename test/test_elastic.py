#!/usr/bin/python3
"""test/test_elastic.py - tools/elastic_run.sh: a job that loses ranks finishes on the ones left.

Tiny GPT-2 (L=2, NH=3, C=36, T=16, V=101), 60 steps of a global batch of 4 sequences, shuffled
data, a checkpoint every 5 steps. The launcher starts it at np = 4 (dp 4, micro_batch 1,
grad_accum 1). Once a checkpoint of step 10 or later exists, the slots file is set to 2 (two
ranks' node is gone) and rank 3 is killed (SIGKILL). Then:
  - the launcher notices the failure and starts attempt 2 with 2 ranks (dp 2, micro_batch 2:
    the same rows per step, in the same order), which resumes the latest checkpoint, resharded,
    and finishes; the launcher exits 0;
  - the metrics file holds every step 1-60 exactly once; the steps of attempt 1 equal the
    uninterrupted np = 4 run bit for bit, and those of attempt 2 within 1e-5 (the sums over
    2 ranks run in another order than over 4);
  - `latest` names step_000060, whose manifest verifies.
A slots file of 1 with --min-np 2 makes the launcher give up (exit 1) instead of looping.
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainer import (MPIRUN, TRAIN_CPU, Checks, base_sections, make_experiment,  # noqa: E402
                     json_records, rank_pids, run, seeded_rng, verify_manifest,
                     write_config)

checks = Checks("test_elastic")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 60


def loss_records(path):
    return [r for r in json_records(path) if "loss" in r]


def launcher(cfg, slots, *extra):
    mpirun = " ".join(MPIRUN[:1] + MPIRUN[1:])
    return [os.path.join(ROOT, "tools/elastic_run.sh"), "--np", "4", "--min-np", "2",
            "--global-batch", "4", "--slots-file", slots,
            "--mpirun", mpirun, *extra, "--", TRAIN_CPU, cfg]


def test_lose_two_ranks(tmp, cfg, reference):
    ck, slots = os.path.join(tmp, "ck"), os.path.join(tmp, "slots")
    open(slots, "w").write("4\n")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    log = open(os.path.join(tmp, "elastic.log"), "w+")
    p = subprocess.Popen(launcher(cfg, slots), stdout=log, stderr=subprocess.STDOUT, env=env,
                         start_new_session=True)
    deadline, killed = time.time() + 120, None
    while time.time() < deadline and p.poll() is None:
        latest = os.path.join(ck, "latest")
        step = int(open(latest).read().strip()[5:]) if os.path.exists(latest) else 0
        pids = rank_pids(cfg)
        if step >= 10 and len(pids) == 4:
            open(slots, "w").write("2\n")
            os.kill(pids[3], signal.SIGKILL)
            killed = step
            break
        time.sleep(0.01)
    try:
        p.wait(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    log.seek(0)
    text = log.read()
    attempts = [l for l in text.splitlines() if l.startswith("elastic_run: attempt") and
                "rank(s)" in l]
    recs = loss_records(os.path.join(tmp, "metrics.jsonl"))
    steps = [r["step"] for r in recs]
    resumed_at = next((int(l.split("step ")[1].split(",")[0]) for l in text.splitlines()
                       if l.startswith("resume ") and ": step " in l), None)
    before = [r for r in recs if resumed_at and r["step"] <= resumed_at]
    after = [r for r in recs if resumed_at and r["step"] > resumed_at]
    exact = all(r["loss"] == reference[r["step"]] for r in before)
    close = max((abs(r["loss"] - reference[r["step"]]) / reference[r["step"]] for r in after),
                default=1.0)
    latest = open(os.path.join(ck, "latest")).read().strip() if os.path.exists(
        os.path.join(ck, "latest")) else None
    ok = (killed is not None and p.returncode == 0 and len(attempts) == 2 and
          "attempt 1: 4 rank(s) (dp 4" in attempts[0] and
          "attempt 2: 2 rank(s) (dp 2 x 1, micro_batch 2 x grad_accum 1" in attempts[1] and
          sorted(steps) == list(range(1, STEPS + 1)) and exact and close < 1e-5 and
          latest == f"step_{STEPS:06d}" and verify_manifest(os.path.join(ck, latest)) == "")
    checks.check("np 4, rank 3 killed after a checkpoint: finishes at np 2 from it", ok,
                 f"killed after step_{killed}, exit {p.returncode}, attempts {attempts}, resumed "
                 f"at {resumed_at}, {len(steps)} records ({len(set(steps))} steps), attempt 1 "
                 f"bit-exact {exact}, attempt 2 max rel err {close:.2e}, latest {latest}")


def test_gives_up(tmp, cfg):
    slots = os.path.join(tmp, "slots_one")
    open(slots, "w").write("1\n")
    p = subprocess.run(launcher(cfg, slots), capture_output=True, text=True, timeout=60)
    checks.check("fewer ranks than --min-np: the launcher gives up", p.returncode == 1 and
                 "giving up" in p.stderr and "attempt" not in p.stdout, p.stderr.strip()[:200])


def main():
    rng = seeded_rng("test_elastic")
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=2, NH=3, C=36, T=16, V=101, n_tokens=3000)
        sec = base_sections(tmp, STEPS, micro_batch=1)
        sec["data"]["shuffle"] = True
        sec["checkpoint"] = {"dir": os.path.join(tmp, "ck"), "every": 5}
        cfg = write_config(tmp, "c.toml", sec)
        ref = os.path.join(tmp, "reference.jsonl")
        run(cfg, ["--parallel.dp=4", f"--log.metrics={ref}", "--checkpoint.dir="],
            np_ranks=4, timeout=300)
        reference = {r["step"]: r["loss"] for r in loss_records(ref)}
        checks.run_each(lambda: test_lose_two_ranks(tmp, cfg, reference),
                        lambda: test_gives_up(tmp, cfg))
    checks.report()


if __name__ == "__main__":
    main()
