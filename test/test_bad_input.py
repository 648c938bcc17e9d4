#!/usr/bin/python3
"""test/test_bad_input.py - bad input never trains and never crashes: it stops the run with a
message that says what is wrong and where, before any work it would spoil.

1. Token ids at or past [model] vocab_size (V = 101, a tiny GPT with n_head 4 so that tp = 2 is
   valid): a uint16 shard whose first token is 65535, alone and at tp = 2 (which used to train
   to the end on garbage); a bad id at a random offset inside the train data at dp = 2, inside
   a validation shard, and in a uint32 (Llama-3 style) shard. Each run exits with status 1 (not
   a signal), its message names the shard, the token offset, the id and the vocab size, no step
   runs on the bad batch (no step line at all when the first batch is bad; with the bad id at
   offset o, exactly the steps whose rows end before o ran).
2. The kernels' own guard: the CPU encoder given an id equal to the vocab size (or negative) in
   a batch of awkward size stops with a message naming the id and the vocabulary (a forked
   Python calling build/libops_cpu.so; exit 1, no crash); ids below it embed as before.
3. The command line and the config, each refused with exit status 1 and a message saying what
   is wrong, before any work: --check-config opens the data shards (a train shard with a bad
   magic, a val shard too small for one batch); micro_batch = 2147483647 (tokens of a step that
   overflow 32-bit positions: it used to ask for a 16-exabyte allocation); a missing
   [data] tokenizer file; a directory given as the config. --help and -h print the usage, with
   every flag (--check-config, --plan, --plan-json, --plan-search), and exit 0; no argument at
   all prints the same usage as an error.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference as ref  # noqa: E402
from trainer import (TRAIN_CPU, Checks, base_sections, make_experiment, run,  # noqa: E402
                     seeded_rng, with_validation, write_config)

checks = Checks("test_bad_input")
L, NH, C, T, V = 2, 4, 32, 16, 101
B = 2  # sequences per step (micro_batch x dp)


def step_lines(out):
    return [l for l in out.splitlines() if l.startswith("step ") and "| loss" in l]


def expect_stop(what, p, needles, steps_run):
    """Exit status 1 (no signal, no crash), every needle in stderr, `steps_run` step lines."""
    text = p.stdout + p.stderr
    found = all(n in p.stderr for n in needles)
    crashed = any(w in text for w in ("Segmentation", "signal 11", "Aborted (core", "SIGSEGV"))
    ran = len(step_lines(p.stdout))
    message = next((l for l in p.stderr.splitlines() if "error:" in l), "no error line")
    checks.check(what, p.returncode == 1 and found and not crashed and ran == steps_run,
                 f"exit {p.returncode}, {ran} step(s) ran (want {steps_run}), crash {crashed}: "
                 f"{message[:220]}")


def bad_shard(tmp, name, tokens, offset, token, version=1):
    t = np.array(tokens, dtype=np.int64)
    t[offset] = token
    path = os.path.join(tmp, name)
    ref.write_shard(path, t, version)
    return path


def test_token_ids(rng):
    with tempfile.TemporaryDirectory() as tmp:
        tokens = make_experiment(tmp, rng, L=L, NH=NH, C=C, T=T, V=V, n_tokens=1200)
        sec = base_sections(tmp, 12)
        cfg = write_config(tmp, "c.toml", sec)
        first = bad_shard(tmp, "first_000.bin", tokens, 0, 65535)
        want = [first, "offset 0", "65535", "vocab_size = 101"]
        for what, np_ranks, layout in (("one rank", 0, []), ("tp = 2", 2, ["--parallel.tp=2"])):
            p = run(cfg, [f"--data.train={first}", *layout], np_ranks=np_ranks, check=False,
                    timeout=120)
            expect_stop(f"first token 65535, {what}: stopped naming shard, offset, id, vocab", p,
                        want, 0)
        # Inside the data at dp = 2: step k reads tokens [(k-1) B T, k B T] (unshuffled).
        offset = int(rng.integers(3 * B * T + 1, 10 * B * T))
        token = int(rng.integers(V, 65536))
        inside = bad_shard(tmp, "inside_000.bin", tokens, offset, token)
        p = run(cfg, [f"--data.train={inside}", "--parallel.dp=2", "--train.micro_batch=1"],
                np_ranks=2, check=False, timeout=120)
        expect_stop(f"id {token} at offset {offset}, dp = 2: stopped before the step reading it",
                    p, [inside, f"offset {offset}", str(token), "vocab_size = 101"],
                    (offset - 1) // (B * T))
        # A validation shard, and a uint32 shard.
        val_tokens = np.fromfile(os.path.join(tmp, "val_000.bin"), dtype=np.uint16, offset=1024)
        val_offset = int(rng.integers(1, 2 * B * T))
        bad_val = bad_shard(tmp, "badval_000.bin", val_tokens, val_offset, 4000)
        vsec = with_validation(base_sections(tmp, 4), tmp, 2, 2)
        vsec["data"]["val"] = bad_val
        p = run(write_config(tmp, "v.toml", vsec), check=False, timeout=120)
        expect_stop("a bad id in the validation shard", p,
                    [bad_val, f"offset {val_offset}", "4000", "vocab_size = 101"], 2)
        wide = bad_shard(tmp, "wide_000.bin", tokens, 5, 70000, version=7)
        p = run(cfg, [f"--data.train={wide}"], check=False, timeout=120)
        expect_stop("uint32 shard, id 70000", p, [wide, "offset 5", "70000"], 0)


KERNEL_CALL = """
import ctypes, sys
import numpy as np
sys.path.insert(0, "test")
import opslib
lib = opslib.load(opslib.LIB, {"op_encoder_forward_vocab": [opslib.P] * 4 + [opslib.I] * 5})
B, T, C, V, bad = (int(a) for a in sys.argv[1:6])
tokens = np.random.default_rng(B * T).integers(0, V, size=B * T).astype(np.int32)
tokens[int(sys.argv[6])] = bad
wte = np.random.default_rng(1).standard_normal((V + 37, C)).astype(np.float32)
wpe = np.zeros((T, C), np.float32)
out = np.zeros((B * T, C), np.float32)
ptr = lambda a: a.ctypes.data_as(ctypes.c_void_p)
lib.op_encoder_forward_vocab(ptr(out), ptr(tokens), ptr(wte), ptr(wpe), B, T, C, 0, V)
ok = np.array_equal(out, wte[tokens])
print("embedded", ok)
sys.exit(0 if ok else 2)
"""


def test_kernel_guard(rng):
    B_, T_, C_, V_ = 3, 7, 5, int(rng.integers(50, 200))
    for bad, stop in ((V_, True), (-1, True), (V_ - 1, False)):
        at = int(rng.integers(0, B_ * T_))
        p = subprocess.run([sys.executable, "-c", KERNEL_CALL, *map(str, (B_, T_, C_, V_, bad, at))],
                           capture_output=True, text=True, timeout=60)
        if stop:
            ok = p.returncode == 1 and f"token {bad} at position {at}" in p.stderr and \
                f"[0, {V_})" in p.stderr
        else:
            ok = p.returncode == 0 and "embedded True" in p.stdout
        checks.check(f"CPU encoder given id {bad} (vocab {V_}) at position {at}: "
                     f"{'stops' if stop else 'embeds'}", ok,
                     f"exit {p.returncode}: {(p.stderr.strip() or p.stdout.strip())[:160]}")


def refused(what, p, needles):
    text = p.stdout + p.stderr
    ok = (p.returncode == 1 and all(n in p.stderr for n in needles) and
          "| loss" not in p.stdout and "out of host memory" not in text)
    checks.check(f"refused: {what}", ok, f"exit {p.returncode}: "
                 f"{next((l for l in p.stderr.splitlines() if 'error' in l), 'no error')[:200]}")


def test_config_and_cli(rng):
    with tempfile.TemporaryDirectory() as tmp:
        tokens = make_experiment(tmp, rng, L=L, NH=NH, C=C, T=T, V=V, n_tokens=1200)
        sec = base_sections(tmp, 4)
        cfg = write_config(tmp, "c.toml", sec)
        p = run(cfg, ["--check-config"], check=False, timeout=60)
        checks.check("--check-config of a good config", p.returncode == 0 and "[data]" in p.stdout,
                     f"exit {p.returncode} {p.stderr.strip()[:120]}")
        magic = os.path.join(tmp, "magic_000.bin")
        with open(os.path.join(tmp, "train_000.bin"), "rb") as f:
            data = bytearray(f.read())
        data[0:4] = (31337).to_bytes(4, "little")
        open(magic, "wb").write(data)
        refused("--check-config with a train shard of a bad magic",
                run(cfg, ["--check-config", f"--data.train={magic}"], check=False, timeout=60),
                [magic, "bad magic 31337"])
        small = os.path.join(tmp, "small_000.bin")
        ref.write_shard(small, tokens[:B * T - 3])
        refused("--check-config with a val shard too small for one batch",
                run(cfg, ["--check-config", f"--data.val={small}"], check=False, timeout=60),
                [small, "too few for one global micro-batch"])
        refused("micro_batch = 2147483647", run(cfg, ["--train.micro_batch=2147483647"],
                                                 check=False, timeout=60),
                ["[train] micro_batch = 2147483647", "seq_len = 16", "32-bit"])
        for extra in ([], ["--check-config"]):
            refused(f"a missing [data] tokenizer file {' '.join(extra)}",
                    run(cfg, [f"--data.tokenizer={tmp}/no_tokenizer.bin", *extra], check=False,
                        timeout=60), ["[data] tokenizer", f"{tmp}/no_tokenizer.bin"])
        refused("a directory as the config", run(tmp, [], check=False, timeout=60),
                [tmp, "is a directory"])
        flags = ("--check-config", "--plan", "--plan-json", "--plan-search")
        for arg in ("--help", "-h"):
            p = subprocess.run([TRAIN_CPU, arg], capture_output=True, text=True, timeout=60)
            checks.check(f"{arg} prints the usage with every flag, exit 0",
                         p.returncode == 0 and p.stdout.startswith("usage: ") and
                         all(f in p.stdout for f in flags) and not p.stderr,
                         f"exit {p.returncode}: {(p.stdout + p.stderr).strip()[:160]}")
        p = subprocess.run([TRAIN_CPU], capture_output=True, text=True, timeout=60)
        checks.check("no argument: the usage as an error", p.returncode == 1 and
                     all(f in p.stderr for f in flags), p.stderr.strip()[:160])


def main():
    rng = seeded_rng("test_bad_input")
    for test in (test_token_ids, test_kernel_guard, test_config_and_cli):
        try:
            test(rng)
        except (RuntimeError, OSError, KeyError, IndexError, ValueError) as e:
            checks.check(test.__name__, False, f"{type(e).__name__}: {e}")
    checks.report()


if __name__ == "__main__":
    main()
