#!/usr/bin/python3
"""test/test_long_run.py - what a long run trips on (beyond the kills, signals and full disks of
test_checkpoint_safety.py and test_preemption.py): files of a checkpoint that are valid on their
own but sit in the wrong place.

Tiny GPT-2 (L=2, NH=3, C=36, T=16, V=101), np = 2 FSDP, global batch 4, saves every 2 steps.
1. Rank files in the wrong place: in step_000004, rank_00000.h5 and rank_00001.h5 swapped, or
   rank_00001.h5 replaced by step_000002's, and the manifest recomputed (as a well-meaning
   repair would): resume refuses before any step, naming the file, the rank or step it was
   written by and the place it sits in. (Before each rank file carried its writer and step,
   both loaded silently: the swap trains from another rank's shard.)
"""
import os
import shutil
import sys
import tempfile
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainer import (Checks, base_sections, make_experiment, run, seeded_rng,  # noqa: E402
                     write_config)

checks = Checks("test_long_run")
L, NH, C, T, V = 2, 3, 36, 16, 101
LAYOUT = ["--parallel.dp=2", "--parallel.fsdp=true", "--train.micro_batch=2"]


def trainer(cfg, ck, metrics, *extra, np_ranks=2, check=False, timeout=120):
    return run(cfg, (LAYOUT if np_ranks else []) + [f"--checkpoint.dir={ck}",
                                                    f"--log.metrics={metrics}", *extra],
               np_ranks=np_ranks, check=check, timeout=timeout)


def step_lines(out):
    return [l for l in out.splitlines() if l.startswith("step ") and "| loss" in l]


def error_line(p):
    return next((l for l in (p.stderr + p.stdout).splitlines() if "error" in l), "no error line")


def rewrite_manifest(ckpt):
    """The manifest recomputed over the files as they are now (a repair that trusts them)."""
    with open(os.path.join(ckpt, "manifest.txt")) as f:
        lines = f.read().splitlines()
    text = lines[0] + "\n"
    for line in lines[1:-1]:
        name = line.split()[2]
        data = open(os.path.join(ckpt, name), "rb").read()
        text += f"{len(data)} {zlib.crc32(data):08x} {name}\n"
    text += f"end {zlib.crc32(text.encode()):08x}\n"
    with open(os.path.join(ckpt, "manifest.txt"), "w") as f:
        f.write(text)


def test_misplaced_rank_files(tmp, cfg):
    original = os.path.join(tmp, "ck_misplaced")
    trainer(cfg, original, os.path.join(tmp, "misplaced.jsonl"), "--train.steps=4", check=True)

    def damaged(name, damage, words):
        ck = os.path.join(tmp, name)
        shutil.copytree(original, ck)
        damage(os.path.join(ck, "step_000004"))
        rewrite_manifest(os.path.join(ck, "step_000004"))
        p = trainer(cfg, ck, os.path.join(tmp, name + "_resumed.jsonl"), "--train.steps=6",
                    "--checkpoint.resume=latest")
        text = p.stdout + p.stderr
        ok = p.returncode != 0 and all(w in text for w in words) and not step_lines(p.stdout)
        checks.check(f"{name}: resume refused naming {words}", ok,
                     f"exit {p.returncode}: {error_line(p)[:260]}")

    def swap(d):
        a, b = os.path.join(d, "rank_00000.h5"), os.path.join(d, "rank_00001.h5")
        os.rename(a, a + ".x")
        os.rename(b, a)
        os.rename(a + ".x", b)
    damaged("swapped_rank_files", swap, ["rank_00000.h5", "written by rank 1"])
    damaged("rank_file_of_another_step", lambda d: shutil.copyfile(
        os.path.join(d, "..", "step_000002", "rank_00001.h5"), os.path.join(d, "rank_00001.h5")),
        ["rank_00001.h5", "written at step 2", "step 4"])


def main():
    rng = seeded_rng("test_long_run")
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=L, NH=NH, C=C, T=T, V=V, n_tokens=2000)
        sec = base_sections(tmp, 8, micro_batch=2)
        sec["checkpoint"] = {"every": 2}
        cfg = write_config(tmp, "c.toml", sec)
        checks.run_each(lambda: test_misplaced_rank_files(tmp, cfg))
    checks.report()


if __name__ == "__main__":
    main()
