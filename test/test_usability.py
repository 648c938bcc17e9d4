#!/usr/bin/python3
"""test/test_usability.py - what a user of llm.c meets first: training at a shorter seq_len than
the model file, the messages of errors every rank finds alike, the step line, and tools/plot.py.

1. seq_len < maxT: an llm.c model file with maxT = 32 trained at seq_len = 16 gives the per-step
   losses of the float64 reference (test/gpt2_reference.py), which adds the first 16 rows of
   wpe, within 1e-6 relative. Its checkpoint still holds all 32 rows of wpe (the 16 unused ones
   unchanged: no weight decay, zero gradient) and records max_seq_len = 32; the llm.c export of
   it has maxT = 32 and trains at seq_len = 32 with the reference's losses (1e-6); the checkpoint
   resumes at seq_len = 32 with the losses of the reference trained 8 steps at 16 and 2 at 32
   (1e-6: its weights, AdamW state and data position all carried over). Measured: <= 5.1e-8.
   seq_len = 64 is refused, naming seq_len, max_seq_len and the file.
2. Random init: [model] max_seq_len = 32 at seq_len = 16 reports the model's parameter count
   (32 rows of wpe) and the same losses as max_seq_len = 16 (the rows used draw the same values).
3. Errors every rank finds alike (a config error, --check-config, a layout rule, a bad token
   shard), alone and under mpirun -np 2: exit status 1, one message starting "error: ", no
   MPI_ABORT banner, no source location of ours (".cu:", ".cpp:").
4. The step line: the first one names the attention implementation, every one shows the elapsed
   time and the time left; no line of its own between steps.
5. tools/plot.py on metrics files (two runs, one file holding two runs, validation records)
   writes a PNG that decodes to the figure's size; a file that is not metrics is an error.
"""
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference as ref  # noqa: E402
from trainer import (MPIRUN, TRAIN_CPU, Checks, base_sections, make_experiment,  # noqa: E402
                     max_rel, read_metrics, read_run_info, run, write_config)
from trainer import seeded_rng, with_validation  # noqa: E402

checks = Checks("test_usability")
PY = "/usr/bin/python3"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def losses(tmp, name="metrics.jsonl"):
    return [s["loss"] for s in read_metrics(os.path.join(tmp, name))[0]]


def reference(model_path, tokens, steps, T, B=2, lr=1e-3):
    params, cfg = ref.read_model(model_path)
    return ref.train_losses(params, cfg, tokens, steps, B, T, lr=lr)


def reference_resumed(model_path, tokens, lr):
    """Float64 losses of steps 9 and 10 of a run trained 8 steps at T=16, saved, and resumed at
    T=32: the same weights and AdamW state (moments and step count) go on, and the loader goes
    on at its saved position, row 16, counted in rows of the new T (data/dataloader.h: row i
    starts at token i*T), that is at the 9th (B=2, T=32) batch of llm.c's order."""
    params, cfg = ref.read_model(model_path)
    P = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    opt = torch.optim.AdamW(list(P.values()), lr=lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.0, foreach=False)

    def step(x, y):
        opt.zero_grad()
        loss = ref.gpt2_loss(P, x, y, cfg["L"], cfg["NH"], cfg["V"])
        loss.backward()
        opt.step()
        return loss.item()

    short = ref.llmc_batches(tokens, 2, 16)
    for _ in range(8):
        step(*next(short))
    long = ref.llmc_batches(tokens, 2, 32)
    for _ in range(8):
        next(long)
    return [step(*next(long)) for _ in range(2)]


def test_shorter_seq_len(rng):
    with tempfile.TemporaryDirectory() as tmp:
        tokens = make_experiment(tmp, rng, T=32)
        model = os.path.join(tmp, "model.bin")
        sec = base_sections(tmp, 8, lr=2e-3)
        sec["model"] = {"seq_len": 16}
        sec["checkpoint"] = {"dir": os.path.join(tmp, "ckpt")}
        run(write_config(tmp, "c.toml", sec))
        ours, theirs = losses(tmp), reference(model, tokens, 8, T=16, lr=2e-3)
        r = max_rel(ours, theirs)
        checks.check("seq_len 16 from a maxT 32 file vs float64", len(ours) == 8 and r < 1e-6,
                     f"max rel err {r:.2e} over {len(ours)} steps")

        index = os.path.join(tmp, "ckpt", "step_000008", "checkpoint.h5")
        params, _ = ref.read_model(model)
        with h5py.File(index, "r") as f:
            wpe = np.asarray(f["model/wpe"][...])
            attrs = (int(f.attrs["max_seq_len"]), int(f.attrs["seq_len"]))
        unused_same = np.array_equal(wpe[16:], params["wpe"].numpy()[16:].astype(np.float32))
        used_moved = not np.allclose(wpe[:16], params["wpe"].numpy()[:16])
        checks.check("checkpoint keeps all 32 rows of wpe",
                     wpe.shape == (32, 36) and attrs == (32, 16) and unused_same and used_moved,
                     f"wpe {wpe.shape}, (max_seq_len, seq_len) = {attrs}, rows 16-31 unchanged "
                     f"{unused_same}, rows 0-15 trained {used_moved}")

        exported = os.path.join(tmp, "exported.bin")
        subprocess.run([PY, os.path.join(ROOT, "tools/export.py"), "llmc", index, exported],
                       check=True, capture_output=True)
        header = np.fromfile(exported, dtype=np.int32, count=8)
        sec32 = base_sections(tmp, 3, lr=2e-3)
        sec32["init"]["from"] = exported
        sec32["log"]["metrics"] = os.path.join(tmp, "m32.jsonl")
        r32 = run(write_config(tmp, "c32.toml", sec32), check=False)
        ok = r32.returncode == 0
        rel = max_rel(losses(tmp, "m32.jsonl"), reference(exported, tokens, 3, T=32, lr=2e-3)) \
            if ok else float("inf")
        checks.check("llm.c export loads at seq_len 32", header[2] == 32 and ok and rel < 1e-6,
                     f"header maxT {header[2]}, exit {r32.returncode}, 3 steps at T=32: "
                     f"max rel err {rel:.2e} {r32.stderr[-300:]}")

        res = sec32.copy()
        res["init"] = {"from": model}
        res["train"] = dict(sec32["train"], steps=10)
        res["checkpoint"] = {"dir": os.path.join(tmp, "ckpt"), "resume": "latest"}
        res["log"] = {"every": 1, "metrics": os.path.join(tmp, "resumed.jsonl")}
        rr = run(write_config(tmp, "resume.toml", res), check=False)
        recs = read_metrics(os.path.join(tmp, "resumed.jsonl"))[0] if rr.returncode == 0 else []
        steps = [s["step"] for s in recs]
        rel = max_rel([s["loss"] for s in recs], reference_resumed(model, tokens, 2e-3)) \
            if steps == [9, 10] else float("inf")
        checks.check("checkpoint trained at T=16 resumes at T=32 with the reference's losses",
                     rr.returncode == 0 and steps == [9, 10] and "resume" in rr.stdout and
                     rel < 1e-6, f"exit {rr.returncode}, steps {steps}, losses vs float64 "
                     f"(8 steps at T=16, then 2 at T=32): max rel err {rel:.2e} "
                     f"{rr.stderr[-300:]}")

        r64 = run(write_config(tmp, "c64.toml", sec), ["--model.seq_len=64"], check=False)
        said = all(s in r64.stderr for s in ("seq_len = 64", "max_seq_len = 32", model))
        checks.check("seq_len 64 > maxT 32 is refused", r64.returncode == 1 and said,
                     r64.stderr.strip()[:300])


def test_random_init_max_seq_len(rng):
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, model=False)
        sec = base_sections(tmp, 4, lr=2e-3)
        del sec["init"]
        C, T = 32, 16
        sec["model"] = {"n_layer": 2, "n_head": 2, "d_model": C, "seq_len": T,
                        "vocab_size": 101}
        results = {}
        for max_seq_len in (16, 32):
            name = f"m{max_seq_len}.jsonl"
            sec["log"]["metrics"] = os.path.join(tmp, name)
            run(write_config(tmp, "c.toml", sec), [f"--model.max_seq_len={max_seq_len}"])
            results[max_seq_len] = (read_run_info(os.path.join(tmp, name))["parameters"],
                                    losses(tmp, name))
        (n16, l16), (n32, l32) = results[16], results[32]
        checks.check("max_seq_len sizes wpe, not the run", n32 - n16 == 16 * C and l16 == l32,
                     f"parameters {n16} -> {n32} (+{n32 - n16} = 16 rows x C), losses "
                     f"identical {l16 == l32}")


def one_message(what, p):
    """Exit 1, one 'error: ' message (no rank prefix: printed once), no abort banner, no
    source location."""
    err = p.stderr
    lines = [l for l in err.splitlines() if "error:" in l.lower()]
    ours = [l for l in lines if l.startswith("error: ")]
    ok = (p.returncode == 1 and len(ours) == 1 and err.startswith("error: ") and
          "MPI_ABORT" not in err and ".cu:" not in err and ".cpp:" not in err and
          "[rank" not in err)
    checks.check(what, ok, f"exit {p.returncode}: {err.strip()[:200]!r}"
                 if not ok else f"exit 1: {ours[0][:110]}")


def test_shared_errors(rng):
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, NH=3)
        sec = base_sections(tmp, 2)
        good = write_config(tmp, "good.toml", sec)
        bad_glob = ["--data.train=" + os.path.join(tmp, "nothing_*.bin")]
        bad_shard = os.path.join(tmp, "bad_000.bin")
        with open(os.path.join(tmp, "train_000.bin"), "rb") as f:
            data = bytearray(f.read())
        data[0:4] = (12345).to_bytes(4, "little")
        with open(bad_shard, "wb") as f:
            f.write(data)
        cases = [("config error", 1, bad_glob),
                 ("config error, --check-config", 1, bad_glob + ["--check-config"]),
                 ("config error", 2, bad_glob + ["--parallel.dp=2"]),
                 ("config error, --check-config", 2, bad_glob + ["--parallel.dp=2",
                                                                "--check-config"]),
                 ("layout rule (tp=2 does not divide n_head=3)", 2, ["--parallel.tp=2"]),
                 ("bad token shard", 1, ["--data.train=" + bad_shard]),
                 ("bad token shard", 2, ["--data.train=" + bad_shard, "--parallel.dp=2"])]
        for what, ranks, overrides in cases:
            p = run(good, overrides, np_ranks=ranks if ranks > 1 else 0, check=False,
                    timeout=120)
            one_message(f"{what}, {'alone' if ranks == 1 else 'mpirun -np 2'}", p)


def test_step_line(rng):
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng)
        sec = base_sections(tmp, 5)
        sec["log"]["every"] = 2
        out = run(write_config(tmp, "c.toml", sec)).stdout.splitlines()
        steps = [l for l in out if l.startswith("step ")]
        first, rest = steps[0], steps[1:]
        between = [l for l in out if l.startswith("attention ") and "=" not in l]
        checks.check("attention choice in the first step line",
                     "| attention cpu" in first and not between and
                     not any("attention" in l for l in rest), first[-60:])
        checks.check("elapsed and time left in every step line",
                     [l.split()[1] for l in steps] == ["1/5", "2/5", "4/5", "5/5"] and
                     all(" elapsed, " in l and " left" in l for l in steps), steps[-1][-40:])


def test_plot(rng):
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng)
        sec = base_sections(tmp, 6)
        with_validation(sec, tmp, 3, 2)
        cfg = write_config(tmp, "c.toml", sec)
        run(cfg)
        run(cfg, ["--train.lr=3e-3"])  # appended: the file now holds two runs
        other = os.path.join(tmp, "other.jsonl")
        run(cfg, ["--log.metrics=" + other, "--log.peak_tflops=0.001"])
        png = os.path.join(tmp, "loss.png")
        p = subprocess.run([PY, os.path.join(ROOT, "tools/plot.py"),
                            os.path.join(tmp, "metrics.jsonl"), other, "-o", png],
                           capture_output=True, text=True)
        size = os.path.getsize(png) if os.path.exists(png) else 0
        shape = None
        if size:
            import matplotlib.image
            shape = matplotlib.image.imread(png).shape
        checks.check("plot.py writes a PNG", p.returncode == 0 and size > 20000 and
                     shape is not None and shape[:2] == (900, 1400) and "3 run(s)" in p.stdout,
                     f"exit {p.returncode}, {size} bytes, decodes to {shape}: "
                     f"{(p.stdout + p.stderr).strip()[:200]}")
        p = subprocess.run([PY, os.path.join(ROOT, "tools/plot.py"), cfg, "-o", png],
                           capture_output=True, text=True)
        checks.check("plot.py refuses a file that is not metrics",
                     p.returncode == 1 and p.stderr.startswith("error: "), p.stderr.strip())


def main():
    rng = seeded_rng("test_usability", f", trainer {TRAIN_CPU}, "
          f"mpirun {' '.join(MPIRUN)}")
    for test in (test_shorter_seq_len, test_random_init_max_seq_len, test_shared_errors,
                 test_step_line, test_plot):
        try:
            test(rng)
        except (RuntimeError, OSError, KeyError, IndexError, TypeError,
                subprocess.SubprocessError) as e:  # a trainer that failed: the test failed
            checks.check(test.__name__, False, f"{type(e).__name__}: {e}")
    checks.report()


if __name__ == "__main__":
    main()
