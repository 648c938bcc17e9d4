#!/usr/bin/python3
"""test/test_loss_spikes.py - [train] skip_spikes skips the update of a step whose loss leaves
its trend, leaves the optimizer state untouched, and stops after max_skips spikes in a row
(training/health.h).

Tiny GPT-2 from an llm.c file (L=2, NH=3, C=36, T=16, V=101), one rank, batch 8, lr 1e-2,
unshuffled: a token stream t[i] = (a t[i-1] + b) mod V (a random permutation cycle, which the
model learns: the loss falls from 4.6 to about 2 in 60 steps) whose rows read by steps G and G+1
(G random in 60-70) are uniformly random tokens (a bad batch: the loss jumps to about 10,
3.5 to 6.5 running standard deviations above the running mean, while the clean steps stay
below it: a falling loss; applied, such updates set the model back for several steps),
skip_spikes = 2.5.
1. The run skips exactly steps G and G+1, naming each with its loss, how many standard
   deviations above the running mean it is, and its batch (the data position of its rows); every
   step's loss around the skips (G .. G+4) equals PyTorch float64 training that leaves out
   those two updates (Adam then counts the applied updates, as torch does) within 3x the fp32
   drift from float64 before them + 1e-3 (the drift is chaotic: below 2e-4 on most seeds, 2e-1
   on 1 in 15), and differs from training that applies them by far more (0.41 to 0.99 there:
   the skip is real).
2. The trend is in the checkpoint: resuming a checkpoint of step G-5 (before the spikes) and one
   of step G+5 (after) reproduces the uninterrupted run bit for bit, the same two steps skipped.
3. A bad stretch of 8 steps with max_skips = 3: the run stops with exit status 1 at the third
   spike in a row, saying so; the last step recorded is the one before it.
"""
import os
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference as ref  # noqa: E402
from trainer import (Checks, base_sections, read_metrics, run, seeded_rng,  # noqa: E402
                     write_config)

checks = Checks("test_loss_spikes")
L, NH, C, T, V, B = 2, 3, 36, 16, 101, 8
STEPS, LR = 90, 1e-2


def losses(path):
    return {r["step"]: r["loss"] for r in read_metrics(path)[0]}


def spikes(stdout):
    return [int(l.split()[2].rstrip(":")) for l in stdout.splitlines() if l.startswith("spike ")]


def experiment(tmp, rng, bad_first, bad_steps):
    """Model file, a shard whose rows of steps bad_first .. bad_first + bad_steps - 1 are random
    tokens, and the config."""
    path = os.path.join(tmp, "model.bin")
    ref.write_model(path, ref.random_params(L, C, T, V, rng), L, NH, C, T, V)
    a, b = int(rng.integers(2, V)), int(rng.integers(0, V))
    tokens = np.empty((STEPS + 2) * B * T + 1, dtype=np.int64)
    tokens[0] = rng.integers(0, V)
    for i in range(1, len(tokens)):
        tokens[i] = (a * tokens[i - 1] + b) % V
    lo, hi = (bad_first - 1) * B * T + 1, (bad_first - 1 + bad_steps) * B * T + 1
    tokens[lo:hi] = rng.integers(0, V, size=hi - lo)
    ref.write_shard(os.path.join(tmp, "train_000.bin"), tokens)
    sec = base_sections(tmp, STEPS, lr=LR, micro_batch=B)
    sec["train"].update({"skip_spikes": 2.5})
    return write_config(tmp, "c.toml", sec), ref.read_model(path)[0], tokens


def run_clean_draw(tmp, rng, bad_steps, args):
    """Draws G and an experiment with bad_steps bad steps from G, and trains it; a draw whose
    clean steps diverge at lr 1e-2 before the bad batch (spikes before G: about 1 run in 12, every
    later step then skipped until max_skips stops the run), or that saw no spike at all (SEED
    2195655532: the bad batch did not stand out), is drawn again, up to 3 times.
    Checkpoints go to tmp/ck."""
    for draw in range(3):
        G = int(rng.integers(60, 71))
        cfg, params, tokens = experiment(tmp, rng, G, bad_steps)
        shutil.rmtree(os.path.join(tmp, "ck"), ignore_errors=True)  # a draw's checkpoints
        if os.path.exists(os.path.join(tmp, "metrics.jsonl")):  # and metrics
            os.remove(os.path.join(tmp, "metrics.jsonl"))
        r = run(cfg, args, check=False, timeout=300)
        early = [s for s in spikes(r.stdout) if s < G]
        if spikes(r.stdout) and not early:
            break
        print(f"note: draw {draw + 1} diverged before its bad batch or saw no spike (spikes at "
              f"steps {early[:3]}, bad batch at {G}): drawing again")
    return G, cfg, params, tokens, r


def test_skips(rng):
    with tempfile.TemporaryDirectory() as tmp:
        ck = os.path.join(tmp, "ck")
        G, cfg, params, tokens, r = run_clean_draw(
            tmp, rng, 2, [f"--checkpoint.dir={ck}", "--checkpoint.every=1", "--checkpoint.keep=100"])
        got = losses(os.path.join(tmp, "metrics.jsonl"))
        lines = [l for l in r.stdout.splitlines() if l.startswith("spike ")]
        named = all("standard deviations above the running mean" in l and "update skipped" in l
                    and "[data] train rows (epoch 0, shard 0, row" in l for l in lines)
        checks.check(f"exactly the bad steps {G}, {G + 1} are skipped, each named with its batch",
                     spikes(r.stdout) == [G, G + 1] and named,
                     f"skipped {spikes(r.stdout)}: {lines[0][:170] if lines else ''}")
        model_cfg = {"L": L, "NH": NH, "V": V}
        want = ref.train_losses(params, model_cfg, tokens, STEPS, B, T, lr=LR, skip={G, G + 1})
        applied = ref.train_losses(params, model_cfg, tokens, STEPS, B, T, lr=LR)
        ours = np.array([got[s] for s in range(1, STEPS + 1)])
        want, applied = np.array(want), np.array(applied)
        # fp32 against float64 drifts chaotically on some seeds before any spike (up to 2e-1 by
        # step G-1 on 1 seed in 15, below 2e-4 on most): the skips are judged by the error
        # they add. Around them (steps G .. G+4) the error must stay within 3x the drift
        # before them (measured at most 2.4x) + 1e-3, while training that applies the bad
        # updates is 0.41 to 0.99 away there.
        pre = float(np.max(np.abs(ours[:G - 1] - want[:G - 1]) / want[:G - 1]))
        win = slice(G - 1, G + 4)
        err = float(np.max(np.abs(ours[win] - want[win]) / want[win]))
        off = float(np.max(np.abs(ours[win] - applied[win]) / applied[win]))
        checks.check("losses around the skips equal float64 training without those updates "
                     "(within the drift before them), and differ from training with them",
                     err < 3 * pre + 1e-3 and off > 0.2,
                     f"max rel err {err:.2e} vs skipping (drift before: {pre:.2e}), "
                     f"{off:.2e} vs applying")
        for start in (G - 5, G + 5):
            m = os.path.join(tmp, f"resumed_{start}.jsonl")
            rr = run(cfg, [f"--checkpoint.resume={ck}/step_{start:06d}", f"--log.metrics={m}"],
                     timeout=300)
            res = losses(m)
            same = sorted(res) == list(range(start + 1, STEPS + 1)) and \
                all(res[s] == got[s] for s in res)
            want_skips = [s for s in (G, G + 1) if s > start]
            checks.check(f"resumed at step {start}: bit-exact, skipping {want_skips}",
                         same and spikes(rr.stdout) == want_skips,
                         f"steps {min(res, default=0)}-{max(res, default=0)}, skipped "
                         f"{spikes(rr.stdout)}")


def test_too_many(rng):
    with tempfile.TemporaryDirectory() as tmp:
        G, _, _, _, r = run_clean_draw(tmp, rng, 8, ["--train.max_skips=3"])
        ran = max(losses(os.path.join(tmp, "metrics.jsonl")), default=0)
        checks.check("8 bad steps, max_skips = 3: stops at the third spike in a row",
                     r.returncode == 1 and spikes(r.stdout) == [G, G + 1, G + 2] and
                     ran == G + 1 and "3 loss spikes in a row" in r.stderr,
                     f"exit {r.returncode}, skipped {spikes(r.stdout)}, last step {ran}: "
                     f"{r.stderr.strip()[:160]}")


def main():
    rng = seeded_rng("test_loss_spikes")
    for test in (test_skips, test_too_many):
        try:
            test(rng)
        except (RuntimeError, OSError, KeyError, ValueError) as e:
            checks.check(test.__name__, False, f"{type(e).__name__}: {e}")
    checks.report()


if __name__ == "__main__":
    main()
