#!/usr/bin/python3
"""test/test_data_mix.py - several datasets mixed with weights ([data] train = [globs], weights;
data/data_mix.h) on the CPU trainer (group `data-mix`).

Two datasets of different token streams (A: two shards, B: one shard, rows of T = 16) and a tiny
GPT-2 (L=2, NH=4, C=32, V=101) from a random llm.c model file.
  1. The draw, exactly: with lr = 0 nothing moves, so each step's loss is the mean loss of the
     model on the step's rows. The test re-implements the documented draw (splitmix64 of the
     seed's key + n*golden, n the global row, against the weights' cumulative slices) and each
     dataset's unshuffled order (its next c rows in one shard), and computes every step's loss in
     float64: the trainer's losses within REF_TOL, and its per-step rows per dataset (the metrics'
     "data_rows") equal to the draw's.
  2. The counts match the weights: over N = STEPS_MANY x G rows with weights [0.7, 0.3], each
     dataset's rows (the end-of-run line and the sum of "data_rows") are within 4 binomial
     standard deviations sqrt(N w (1-w)) of N w; the end-of-run line's tokens are rows x T.
  3. Layouts (shuffle on): dp 2 (micro_batch halved), pp 2, cp 2 and tp 2 draw the same rows per
     dataset per step as one rank, and their losses and gradient norms are within LAYOUT_TOL of
     it (lr > 0, so a wrong row would move every later step).
  4. Resume: a run stopped at step 3 (checkpoint every 3) and resumed to step 6 equals the
     uninterrupted run bitwise (losses, norms, data_rows, the end-of-run counts); the
     checkpoint's data.txt holds the mix record. Resuming it with one dataset, or with the second
     dataset's shard rewritten (as uint32), is refused naming the datasets or the file.
  5. One dataset: train = ["A"] with weights = [1.0] reads llm.c's unshuffled order of A (lr = 0:
     losses vs float64 on it), and equals train = "A" bitwise, shuffled and not.
  6. Bad input, refused before any step naming the key and the value: weights of another count
     than the datasets, a weight 0 and a negative one, a glob that matches nothing.

Run: /usr/bin/python3 test/test_data_mix.py (TRAIN_CPU overrides the trainer; exit status 1 on
failure).
"""
import math
import os
import re
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference as ref  # noqa: E402
from trainer import (Checks, base_sections, check_refused, learnable_tokens, max_rel,  # noqa: E402
                     read_metrics, run, seeded_rng, write_config)

L, NH, C, T, V = 2, 4, 32, 16, 101
B = 4  # rows per global micro-batch on one rank
STEPS, STEPS_MANY = 6, 150
WEIGHTS = [0.7, 0.3]
REF_TOL = 1e-6    # float32 forward vs float64 on 64 tokens: measured <= 1.1e-7
LAYOUT_TOL = 1e-6  # losses and norms vs one rank over 6 steps: measured <= 5.3e-8
MASK64 = (1 << 64) - 1
GOLDEN = 0x9e3779b97f4a7c15
MIX_STREAM = 0x6d69785f726f7773
checks = Checks("test_data_mix")
torch.set_default_dtype(torch.float64)


# --- the draw and the datasets' order, as data/data_mix.h documents them --------------------------
def splitmix64(x):
    x = (x + GOLDEN) & MASK64
    x = ((x ^ (x >> 30)) * 0xbf58476d1ce4e5b9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94d049bb133111eb) & MASK64
    return x ^ (x >> 31)


def draws(seed, rows, weights):
    """The dataset of global rows 0..rows-1."""
    total, acc, upper = sum(weights), 0.0, []
    for k, w in enumerate(weights):
        acc += w
        upper.append(1.0 if k + 1 == len(weights) else acc / total)
    key = splitmix64(seed ^ MIX_STREAM)
    out = []
    for n in range(rows):
        u = (splitmix64((key + n * GOLDEN) & MASK64) >> 11) * 2.0 ** -53
        out.append(next(k for k, up in enumerate(upper) if u < up or k + 1 == len(upper)))
    return out


class Order:
    """A dataset's unshuffled rows: shards in order, row i = tokens [i T, i T + T]; `take(c)` the
    next c rows of one shard (moving on when fewer remain), wrapping after the last shard."""
    def __init__(self, shards):
        self.shards, self.shard, self.row = shards, 0, 0

    def take(self, c):
        while self.row + c > (len(self.shards[self.shard]) - 1) // T:
            self.shard, self.row = (self.shard + 1) % len(self.shards), 0
        s = self.shards[self.shard]
        rows = [s[(self.row + i) * T:(self.row + i) * T + T + 1] for i in range(c)]
        self.row += c
        return rows


def expected(seed, shards_of, steps, G):
    """Per step: (the rows (inputs+1 token) in global order, the rows drawn per dataset)."""
    orders = [Order(s) for s in shards_of]
    src = draws(seed, steps * G, WEIGHTS)
    out = []
    for step in range(steps):
        d = src[step * G:(step + 1) * G]
        taken = [orders[k].take(d.count(k)) if d.count(k) else [] for k in range(len(orders))]
        rows = [taken[k].pop(0) for k in d]
        out.append((rows, [d.count(k) for k in range(len(orders))]))
    return out


# --- the experiment ---------------------------------------------------------------------------------
def experiment(tmp, rng):
    params = ref.random_params(L, C, T, V, rng)
    ref.write_model(os.path.join(tmp, "model.bin"), params, L, NH, C, T, V)
    a = [learnable_tokens(rng, 1500, V), learnable_tokens(rng, 1100, V)]
    b = [rng.integers(0, V, size=900)]  # another distribution: uniform noise
    for i, t in enumerate(a):
        ref.write_shard(os.path.join(tmp, f"a_{i:03d}.bin"), t)
    ref.write_shard(os.path.join(tmp, "b_000.bin"), b[0])
    return params, [a, b]


def sections(tmp, steps, seed, shuffle=False, lr=1e-3, **data):
    sec = base_sections(tmp, steps, micro_batch=B, lr=lr, seed=seed)
    sec["data"] = {"train": [os.path.join(tmp, "a_*.bin"), os.path.join(tmp, "b_*.bin")],
                   "weights": WEIGHTS, "shuffle": shuffle}
    sec["data"].update(data)
    return sec


def trained(tmp, name, sec, args=(), np_ranks=0):
    metrics = os.path.join(tmp, name + ".jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    out = run(write_config(tmp, name + ".toml", sec), [f"--log.metrics={metrics}", *args],
              np_ranks=np_ranks).stdout
    return read_metrics(metrics)[0], out


def counts_line(out):
    """{dataset index: (rows, tokens)} from the end-of-run line."""
    line = next((ln for ln in out.splitlines() if ln.startswith("data     rows drawn")), "")
    found = re.findall(r"\): (\d+) rows = (\d+) tokens", line)
    return [(int(r), int(t)) for r, t in found], line


def refused(tmp, what, sec, words, args=()):
    """Exit status 1, every word in the output, no step line (check_refused with overrides)."""
    r = run(write_config(tmp, "bad.toml", sec), list(args), check=False, timeout=60)
    text = r.stdout + r.stderr
    checks.check(f"refused: {what}", r.returncode == 1 and all(w in text for w in words) and
                 "| loss" not in r.stdout,
                 next((ln for ln in text.splitlines() if "error" in ln), "no error line")[:300])


def test_draw_exact(tmp, params, shards, seed):
    steps, _ = trained(tmp, "exact", sections(tmp, STEPS, seed, lr=0.0))
    want = expected(seed, shards, STEPS, B)
    P = {k: torch.tensor(v) for k, v in params.items()}
    losses = []
    for rows, _ in want:
        x = torch.tensor(np.array([r[:-1] for r in rows], dtype=np.int64))
        y = torch.tensor(np.array([r[1:] for r in rows], dtype=np.int64))
        losses.append(ref.gpt2_loss(P, x, y, L, NH, V).item())
    got = [s["loss"] for s in steps]
    err = max_rel(got, losses) if len(got) == len(losses) else float("inf")
    checks.check("the rows read are the documented draw's: losses vs float64", err < REF_TOL,
                 f"max rel err {err:.2e} over {len(got)} steps (tol {REF_TOL})")
    rows = [s.get("data_rows") for s in steps]
    checks.check("data_rows per step equal the documented draw's", rows == [w[1] for w in want],
                 f"{rows} vs {[w[1] for w in want]}")


def test_counts(tmp, seed):
    steps, out = trained(tmp, "many", sections(tmp, STEPS_MANY, seed, shuffle=True, lr=0.0))
    N = STEPS_MANY * B
    counts, line = counts_line(out)
    summed = list(np.sum([s["data_rows"] for s in steps], axis=0))
    ok = len(counts) == 2 and [c[0] for c in counts] == summed
    ok = ok and all(c[1] == c[0] * T for c in counts)
    for k, w in enumerate(WEIGHTS):
        bound = 4 * math.sqrt(N * w * (1 - w))
        ok = ok and abs(summed[k] - N * w) <= bound
    checks.check("per-dataset counts within 4 binomial sd of the weights; line = data_rows, "
                 "tokens = rows x T", ok,
                 f"N {N}, rows {summed} vs {[N * w for w in WEIGHTS]} +- "
                 f"{[round(4 * math.sqrt(N * w * (1 - w)), 1) for w in WEIGHTS]}; '{line}'")


def test_layouts(tmp, seed):
    base = sections(tmp, STEPS, seed, shuffle=True)
    one, _ = trained(tmp, "one", base)
    layouts = [("dp 2", {"parallel": {"dp": 2}}, B // 2), ("pp 2", {"parallel": {"pp": 2}}, B),
               ("cp 2", {"parallel": {"cp": 2}}, B), ("tp 2", {"parallel": {"tp": 2}}, B)]
    for name, extra, mb in layouts:
        if not checks.wanted(f"{name} equals one rank"):
            continue
        sec = sections(tmp, STEPS, seed, shuffle=True)
        sec["train"]["micro_batch"] = mb
        sec.update(extra)
        got, _ = trained(tmp, name.replace(" ", ""), sec, np_ranks=2)
        same_rows = [s.get("data_rows") for s in got] == [s["data_rows"] for s in one]
        loss = max_rel([s["loss"] for s in got], [s["loss"] for s in one])
        norm = max_rel([s["grad_norm"] for s in got], [s["grad_norm"] for s in one])
        checks.check(f"{name} equals one rank: rows per dataset, losses, norms",
                     same_rows and len(got) == STEPS and max(loss, norm) < LAYOUT_TOL,
                     f"same data_rows {same_rows}, max rel err loss {loss:.2e} norm {norm:.2e}")


def test_resume(tmp, seed):
    ck = os.path.join(tmp, "ck")
    sec = sections(tmp, STEPS, seed, shuffle=True)
    full, out_full = trained(tmp, "full", sec, [f"--checkpoint.dir={ck}", "--checkpoint.every=3"])
    record = open(os.path.join(ck, "step_000003", "data.txt")).read()
    part, out_part = trained(tmp, "part", sec, [f"--checkpoint.dir={ck}", "--checkpoint.every=3",
                                                f"--checkpoint.resume={ck}/step_000003"])
    key = lambda s: (s["loss"], s["grad_norm"], s["data_rows"])  # noqa: E731
    same = [key(s) for s in part] == [key(s) for s in full[3:]] and len(part) == 3
    checks.check("resume at step 3 equals the uninterrupted run bitwise (losses, norms, rows)",
                 same, f"{[s['loss'] for s in part]} vs {[s['loss'] for s in full[3:]]}")
    checks.check("resume: the end-of-run counts equal the uninterrupted run's",
                 counts_line(out_part)[0] == counts_line(out_full)[0] and counts_line(out_full)[0],
                 f"{counts_line(out_part)[1]} vs {counts_line(out_full)[1]}")
    checks.check("the checkpoint's data.txt holds the mix record (both datasets' positions)",
                 record.startswith("# data mix") and record.count("\ndataset ") == 2,
                 record.splitlines()[1] if "\n" in record else record)
    resume = [f"--checkpoint.dir={ck}", f"--checkpoint.resume={ck}/step_000003"]
    one = sections(tmp, STEPS, seed, shuffle=True)
    one["data"] = {"train": os.path.join(tmp, "a_*.bin"), "shuffle": True}
    refused(tmp, "resume of a mix with another number of datasets", one,
            ["trained on 2 datasets", "[data] train names 1"], resume)
    b = os.path.join(tmp, "b_000.bin")
    saved = open(b, "rb").read()
    ref.write_shard(b, np.frombuffer(saved[1024:], dtype=np.uint16), 7)  # the same, as uint32
    try:
        refused(tmp, "resume of a mix whose second dataset changed", sec,
                ["[data] train dataset 1", "changed: " + b, "uint16 tokens, now uint32"], resume)
    finally:
        open(b, "wb").write(saved)


def test_one_dataset(tmp, params, shards, seed):
    one = sections(tmp, STEPS, seed, lr=0.0)
    one["data"] = {"train": [os.path.join(tmp, "a_*.bin")], "weights": [1.0]}
    steps, _ = trained(tmp, "single_llmc", one)
    P = {k: torch.tensor(v) for k, v in params.items()}
    order, want = Order(shards[0]), []  # llm.c's unshuffled order: B rows a step, shard by shard
    for _ in range(STEPS):
        rows = np.array(order.take(B), dtype=np.int64)
        want.append(ref.gpt2_loss(P, torch.tensor(rows[:, :-1]), torch.tensor(rows[:, 1:]),
                                  L, NH, V).item())
    err = max_rel([s["loss"] for s in steps], want) if len(steps) == STEPS else float("inf")
    checks.check("train = [A], weights = [1.0] reads llm.c's order of A: losses vs float64",
                 err < REF_TOL and all("data_rows" not in s for s in steps),
                 f"max rel err {err:.2e} (tol {REF_TOL})")
    for shuffle in (False, True):
        plain = sections(tmp, STEPS, seed, shuffle=shuffle)
        plain["data"] = {"train": os.path.join(tmp, "a_*.bin"), "shuffle": shuffle}
        one = sections(tmp, STEPS, seed, shuffle=shuffle)
        one["data"] = {"train": [os.path.join(tmp, "a_*.bin")], "weights": [1.0],
                       "shuffle": shuffle}
        a, _ = trained(tmp, "plain", plain)
        b, _ = trained(tmp, "single", one)
        key = lambda s: (s["loss"], s["grad_norm"], "data_rows" in s)  # noqa: E731
        checks.check(f"train = [A], weights = [1.0] equals train = \"A\" bitwise "
                     f"(shuffle {shuffle})", [key(s) for s in a] == [key(s) for s in b] and a,
                     f"{[s['loss'] for s in a]} vs {[s['loss'] for s in b]}")


def test_bad_input(tmp, seed):
    a, b = os.path.join(tmp, "a_*.bin"), os.path.join(tmp, "b_*.bin")
    cases = [
        ("one weight for two datasets", {"weights": [0.7]}, ["[data] weights = [0.7]", "2 datasets"]),
        ("three weights for two datasets", {"weights": [0.5, 0.3, 0.2]},
         ["[data] weights = [0.5, 0.3, 0.2]", "3 weights"]),
        ("no weights for two datasets", {"weights": []}, ["[data] weights = []", "one weight"]),
        ("a weight of 0", {"weights": [0.7, 0.0]}, ["[data] weights = [0.7, 0.0]", "> 0"]),
        ("a negative weight", {"weights": [-0.5, 1.5]}, ["[data] weights = [-0.5, 1.5]", "> 0"]),
        ("a glob that matches nothing", {"train": [a, os.path.join(tmp, "nothing_*.bin")]},
         ["[data] train = [", "nothing_*.bin", "matches no file"]),
        ("an empty array of globs", {"train": []}, ["[data] train", "non-empty array"]),
    ]
    for what, data, words in cases:
        sec = sections(tmp, STEPS, seed)
        sec["data"].update(data)
        if "weights" in data and not data["weights"]:
            sec["data"]["train"] = [a, b]
        check_refused(checks, tmp, what, sec, 0, words)


def main():
    rng = seeded_rng("test_data_mix")
    seed = int(rng.integers(1, 2**31))
    with tempfile.TemporaryDirectory() as tmp:
        params, shards = experiment(tmp, rng)
        checks.run_each(lambda: test_draw_exact(tmp, params, shards, seed),
                        lambda: test_counts(tmp, seed), lambda: test_layouts(tmp, seed),
                        lambda: test_resume(tmp, seed), lambda: test_one_dataset(tmp, params, shards, seed),
                        lambda: test_bad_input(tmp, seed))
    checks.report()


if __name__ == "__main__":
    main()
