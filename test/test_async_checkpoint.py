#!/usr/bin/python3
"""test/test_async_checkpoint.py - asynchronous checkpoints ([checkpoint] async = true,
checkpoint/async_save.h).

Tiny GPT-2 (L=2, NH=3, C=36, T=16, V=101), np = 2 FSDP, global batch 4, shuffled data.
1. The same checkpoints: a 12-step run saving every 3 steps asynchronously and the same run
   saving synchronously write step_000003 .. step_000012 with every dataset of the index
   (model/*, optim/m/*, optim/v/*, read through h5py) equal bit for bit, and the same step,
   seed and data position: the copy is the state at the end of its step, not of a later one.
   Every asynchronous checkpoint's manifest verifies (zlib's CRC32).
2. Training goes on while a file is written: at least one asynchronous save is reported after
   the step line of a later step; the step lines of steps 3, 6 and 9 (and only those) show
   "ckpt copy <ms>", and their metrics records hold ckpt_wait_ms.
3. Resuming the asynchronous step_000006 gives steps 7-12 with the uninterrupted run's losses,
   bit for bit.
4. ZeRO-1 with the optimizer offloaded to host memory: steps 3 and 6 saved asynchronously equal
   the synchronous ones bit for bit (the copy reads the state where the store keeps it).
5. int8-compressed DDP gradients (the residuals live in each rank's file, not in the index):
   steps 3 and 6 saved asynchronously equal the synchronous ones bit for bit, index and every
   rank file's /residual datasets, which are not all zero.
6. kill -9 of the job at random moments while it saves every step asynchronously (5 kills, the
   first during start-up): after each, `latest` names a checkpoint that verifies; the last run
   finishes, and every step's loss, whichever run computed it, equals the uninterrupted run's.
"""
import os
import random
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainer import (MPIRUN, TRAIN_CPU, Checks, base_sections, make_experiment,  # noqa: E402
                     kill_job, read_metrics, run, seeded_rng, steps_against, verify_manifest,
                     write_config)

checks = Checks("test_async_checkpoint")
LAYOUT = ["--parallel.dp=2", "--parallel.fsdp=true", "--train.micro_batch=2"]


def index_contents(ckpt):
    """{dataset: array} of the index's tensors, and its step, seed and data position."""
    out = {}
    with h5py.File(os.path.join(ckpt, "checkpoint.h5"), "r") as f:
        def grab(name, obj):
            if isinstance(obj, h5py.Dataset) and name != "config":
                out[name] = obj[...]
        f.visititems(grab)
        meta = (int(f.attrs["step"]), int(f["rng"].attrs["seed"]),
                tuple(int(f["data"].attrs[k]) for k in ("epoch", "shard", "row")))
    return out, meta


def same_checkpoints(a, b):
    (ta, ma), (tb, mb) = index_contents(a), index_contents(b)
    return ma == mb and ta.keys() == tb.keys() and all(
        np.array_equal(ta[k], tb[k]) and not np.isnan(ta[k]).any() for k in ta)


def losses(path):
    return {r["step"]: r["loss"] for r in read_metrics(path)[0]}


def test_same_checkpoints(tmp, cfg):
    runs = {}
    for mode in ("sync", "async"):
        ck = os.path.join(tmp, "ck_" + mode)
        r = run(cfg, LAYOUT + [f"--checkpoint.dir={ck}", "--checkpoint.every=3",
                               "--checkpoint.keep=10",
                               f"--checkpoint.async={'true' if mode == 'async' else 'false'}",
                               f"--log.metrics={tmp}/{mode}.jsonl"], np_ranks=2, timeout=180)
        runs[mode] = (ck, r.stdout)
    names = [f"step_{s:06d}" for s in (3, 6, 9, 12)]
    equal = [n for n in names if same_checkpoints(os.path.join(runs["sync"][0], n),
                                                   os.path.join(runs["async"][0], n))]
    verified = [n for n in names if verify_manifest(os.path.join(runs["async"][0], n)) == ""]
    checks.check("asynchronous checkpoints equal the synchronous ones bit for bit, and verify",
                 equal == names and verified == names, f"equal {equal}, verified {verified}")
    lines = runs["async"][1].splitlines()
    copy_steps = [int(l.split()[1].split("/")[0]) for l in lines
                  if l.startswith("step ") and "ckpt copy" in l]
    waits = [r["step"] for r in read_metrics(f"{tmp}/async.jsonl")[0] if "ckpt_wait_ms" in r]
    late = 0
    for s in (3, 6, 9):
        saved = next(i for i, l in enumerate(lines) if f"step_{s:06d} saved" in l)
        stepped = next(i for i, l in enumerate(lines) if l.startswith(f"step {s + 1:5d}/"))
        late += saved > stepped
    checks.check("steps 3, 6, 9 show the copy's wait; a save finished while training went on",
                 copy_steps == [3, 6, 9] and waits == [3, 6, 9] and late >= 1,
                 f"'ckpt copy' on steps {copy_steps}, ckpt_wait_ms on {waits}, {late} of 3 saves "
                 f"reported after a later step")
    m = f"{tmp}/resumed.jsonl"
    run(cfg, LAYOUT + [f"--checkpoint.resume={runs['async'][0]}/step_000006",
                       f"--log.metrics={m}"], np_ranks=2, timeout=180)
    ref, got = losses(f"{tmp}/sync.jsonl"), losses(m)
    checks.check("resuming the asynchronous step_000006 is bit-exact",
                 sorted(got) == list(range(7, 13)) and all(got[s] == ref[s] for s in got),
                 f"steps {sorted(got)}")


def test_kill(tmp, cfg):
    steps = 100
    ref = f"{tmp}/uninterrupted.jsonl"
    run(cfg, LAYOUT + [f"--train.steps={steps}", f"--log.metrics={ref}"], np_ranks=2, timeout=180)
    reference = losses(ref)
    ck = os.path.join(tmp, "ck_kill")
    args = LAYOUT + [f"--train.steps={steps}", f"--checkpoint.dir={ck}", "--checkpoint.every=1",
                     "--checkpoint.keep=2", "--checkpoint.async=true",
                     "--checkpoint.resume=latest"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    bad, after = [], []
    for attempt in range(5):
        log = open(f"{tmp}/kill_{attempt}.log", "w")
        p = subprocess.Popen(MPIRUN + ["-np", "2", TRAIN_CPU, cfg, *args,
                                       f"--log.metrics={tmp}/kill_{attempt}.jsonl"],
                             stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        time.sleep(random.uniform(0.05, 0.4) if attempt == 0 else random.uniform(0.5, 1.5))
        if p.poll() is not None and p.returncode != 0:
            bad.append(f"run {attempt} failed by itself (rc {p.returncode})")
        kill_job(p, cfg)
        log.close()
        name = open(os.path.join(ck, "latest")).read().strip() \
            if os.path.exists(os.path.join(ck, "latest")) else None
        after.append(name)
        if name and verify_manifest(os.path.join(ck, name)):
            bad.append(f"after kill {attempt}: {name} does not verify")
    final = run(cfg, args + [f"--log.metrics={tmp}/kill_final.jsonl"], np_ranks=2, check=False,
                timeout=180)
    if final.returncode != 0:
        bad.append("the final run failed: " + final.stderr[-300:])
    seen, mismatched = steps_against(f"{tmp}/kill_*.jsonl", reference)
    checks.check("kill -9 during asynchronous saves: latest always verifies, resumes bit-exact",
                 not bad and not mismatched and seen == set(range(1, steps + 1)),
                 f"latest after each kill {after}; problems {bad}; steps differing "
                 f"{sorted(mismatched)}; steps seen {len(seen)}")


def save_both_ways(tmp, cfg, layout, tag):
    """Runs `layout` saving every 3 steps synchronously and asynchronously: {mode: its dir}."""
    cks = {}
    for mode in ("sync", "async"):
        cks[mode] = os.path.join(tmp, f"ck_{tag}_{mode}")
        run(cfg, layout + [f"--checkpoint.dir={cks[mode]}", "--checkpoint.every=3",
                           f"--checkpoint.async={'true' if mode == 'async' else 'false'}",
                           f"--log.metrics={tmp}/{tag}_{mode}.jsonl"], np_ranks=2, timeout=180)
    return cks


def test_offload(tmp, cfg):
    """ZeRO-1 with the optimizer's state in host memory (optimizer_offload = "cpu"): the copy
    reads each part where the store keeps it (store_state_read), so the asynchronous
    checkpoints equal the synchronous ones bit for bit there too."""
    layout = ["--parallel.dp=2", "--parallel.zero=1", "--train.optimizer_offload=cpu",
              "--train.micro_batch=2", "--train.steps=6"]
    cks = save_both_ways(tmp, cfg, layout, "offload")
    names = ["step_000003", "step_000006"]
    equal = [n for n in names if same_checkpoints(os.path.join(cks["sync"], n),
                                                   os.path.join(cks["async"], n))]
    checks.check("ZeRO-1 with cpu offload: asynchronous checkpoints equal the synchronous ones",
                 equal == names, f"equal {equal} of {names}")


def residuals(ckpt, rank):
    """{dataset: array} under /residual of a rank file (and its layout string)."""
    out = {}
    with h5py.File(os.path.join(ckpt, f"rank_{rank:05d}.h5"), "r") as f:
        for name, obj in f["residual"].items():
            out[name] = obj[()] if name == "layout" else obj[...]
    return out


def test_compressed(tmp, cfg):
    """DDP with int8-compressed gradients: the asynchronous copy takes the residuals too."""
    layout = ["--parallel.dp=2", "--parallel.grad_compression=int8", "--train.micro_batch=2",
              "--train.steps=6"]
    cks = save_both_ways(tmp, cfg, layout, "int8")
    equal, nonzero = [], 0
    for n in ("step_000003", "step_000006"):
        a, b = os.path.join(cks["sync"], n), os.path.join(cks["async"], n)
        ra, rb = [residuals(a, r) for r in (0, 1)], [residuals(b, r) for r in (0, 1)]
        same = all(x.keys() == y.keys() and all(
            np.array_equal(x[k], y[k]) for k in x) for x, y in zip(ra, rb))
        nonzero += sum(int(np.any(v != 0)) for x in ra for k, v in x.items() if k != "layout")
        if same and same_checkpoints(a, b):
            equal.append(n)
    checks.check("int8 compression: asynchronous checkpoints (index and residuals) equal the "
                 "synchronous ones", equal == ["step_000003", "step_000006"] and nonzero > 0,
                 f"equal {equal}; {nonzero} non-zero residual datasets")


def main():
    rng = seeded_rng("test_async_checkpoint")
    random.seed(int(rng.integers(1 << 30)))
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=2, NH=3, C=36, T=16, V=101, n_tokens=1500)
        sec = base_sections(tmp, 12, micro_batch=2)
        sec["data"]["shuffle"] = True
        cfg = write_config(tmp, "c.toml", sec)
        checks.run_each(lambda: test_same_checkpoints(tmp, cfg), lambda: test_offload(tmp, cfg),
                        lambda: test_compressed(tmp, cfg), lambda: test_kill(tmp, cfg))
    checks.report()


if __name__ == "__main__":
    main()
