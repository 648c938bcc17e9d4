"""test/test_eval.py - the multiple-choice evaluation ([eval], training/eval.h) on planted sets,
against a float64 scoring written here (test/gpt2_reference.py's GPT-2), and its refusals.

The model: a random tiny GPT-2 (llm.c file, weights large enough that its predictions differ
between endings), trained for one step at lr 0 so that the eval after it sees the initial
weights. An example's ending is scored by the mean loss of its tokens after the context; the
choice is the lowest (the first on a tie).
  planted 100%: four random endings per example, the label the float64 argmin (examples whose
    best two endings are within 1e-3 of each other are left out: the fp32 model could swap
    them); every layout must score every example.
  planted 25%: the four endings are the same tokens, so all four tie and the first wins; labels
    0, 1, 2, 3 in turn: exactly a quarter right.
  random labels: the count must be the float64 scoring's count exactly.
Layouts: one rank, dp 2 (the examples split over the ranks; padding rows where the counts
differ), tp 2, pp 2, cp 2: the same counts. Bad files are refused before any step, naming the
file and the example (record) with its byte offset.
"""
import os
import re
import struct
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import gpt2_reference as ref  # noqa: E402
from make_eval import write_eval_file  # noqa: E402
from trainer import (Checks, base_sections, check_refused, make_experiment, run,  # noqa: E402
                     seeded_rng, write_config)

L, NH, C, T, V = 2, 4, 32, 32, 101


def mean_losses(P, ex):
    """float64 mean loss of each ending's tokens after the context."""
    out = []
    for end in ex["endings"]:
        row = ex["context"] + end
        idx = torch.tensor([row[:-1]])
        tg = torch.tensor([[-100] * (len(ex["context"]) - 1) + end])
        out.append(float(ref.gpt2_loss(P, idx, tg, L, NH, V)))
    return out


def random_example(rng, label=0):
    ctx = rng.integers(0, V, int(rng.integers(1, 12))).tolist()
    endings = [rng.integers(0, V, int(rng.integers(1, 6))).tolist() for _ in range(4)]
    return {"label": label, "context": ctx, "endings": endings}


def eval_of(tmp, path, overrides=(), np_ranks=0):
    sec = base_sections(tmp, 1, lr=0.0, micro_batch=2)
    sec["model"] = {"n_layer": L, "n_head": NH, "d_model": C, "seq_len": T, "max_seq_len": T,
                    "vocab_size": V}
    sec["eval"] = {"file": path, "every": 1}
    r = run(write_config(tmp, "eval.toml", sec), overrides, np_ranks=np_ranks)
    m = re.search(r"eval acc [0-9.]+ \((\d+) of (\d+)", r.stdout)
    if not m:
        print(r.stdout[-2000:])
        raise RuntimeError("no eval line")
    return int(m.group(1)), int(m.group(2))


def main():
    checks = Checks("eval")
    rng = seeded_rng("test_eval")
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=L, NH=NH, C=C, T=T, V=V, model=False)
        params = ref.random_params(L, C, T, V, rng, std=0.3)
        ref.write_model(os.path.join(tmp, "model.bin"), params, L, NH, C, T, V)
        P = {k: torch.tensor(v, dtype=torch.float64) for k, v in params.items()}

        best, random_set, expected = [], [], 0
        while len(best) < 10:
            ex = random_example(rng)
            losses = mean_losses(P, ex)
            order = np.argsort(losses)
            if losses[order[1]] - losses[order[0]] < 1e-3:
                continue
            best.append(dict(ex, label=int(order[0])))
            ex = dict(ex, label=int(rng.integers(0, 4)))
            random_set.append(ex)
            expected += ex["label"] == int(order[0])
        same = []
        for i in range(8):
            ex = random_example(rng, label=i % 4)
            ex["endings"] = [ex["endings"][0]] * 4
            same.append(ex)
        files = {}
        for name, examples in (("best", best), ("same", same), ("random", random_set)):
            files[name] = os.path.join(tmp, f"{name}.bin")
            write_eval_file(files[name], examples)

        layouts = [("one rank", [], 0), ("dp 2", ["--parallel.dp=2"], 2),
                   ("tp 2", ["--parallel.tp=2"], 2), ("pp 2", ["--parallel.pp=2"], 2),
                   ("cp 2", ["--parallel.cp=2"], 2)]
        for name, over, np_ranks in layouts:
            if not checks.wanted(name):
                continue
            got = eval_of(tmp, files["best"], over, np_ranks)
            checks.check(f"{name}: planted 100%", got == (10, 10), f"{got}")
            if name in ("one rank", "dp 2"):
                got = eval_of(tmp, files["same"], over, np_ranks)
                checks.check(f"{name}: planted 25% (ties go first)", got == (2, 8), f"{got}")
            got = eval_of(tmp, files["random"], over, np_ranks)
            checks.check(f"{name}: random labels = float64 scoring", got == (expected, 10),
                         f"{got}, float64 {expected} of 10")
        got = eval_of(tmp, files["best"], ["--eval.examples=4"])
        checks.check("[eval] examples = 4 scores the first 4", got == (4, 4), f"{got}")
        bad_files(checks, tmp, best)
    checks.report()


def bad_files(checks, tmp, examples):
    """Broken files: each refused before any step, naming the file and the record."""
    good = os.path.join(tmp, "good.bin")
    write_eval_file(good, examples)
    raw = open(good, "rb").read()
    second = 1024 + struct.unpack_from("<H", raw, 1024 + 2)[0]  # byte offset of example 1

    def variant(name, data):
        path = os.path.join(tmp, name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    bad_label = [dict(ex) for ex in examples]
    bad_label[3] = dict(bad_label[3], label=4)
    write_eval_file(os.path.join(tmp, "label.bin"), bad_label)
    bad_token = [dict(ex) for ex in examples]
    bad_token[2] = dict(bad_token[2], context=[V + 5])
    write_eval_file(os.path.join(tmp, "token.bin"), bad_token)
    too_long = [dict(ex) for ex in examples]
    too_long[5] = dict(too_long[5], context=[1] * T)
    write_eval_file(os.path.join(tmp, "long.bin"), too_long)
    cases = [
        ("no start marker", variant("marker.bin", raw[:second] + b"\0\0" + raw[second + 2:]),
         ["marker.bin", "example 1", f"byte {second}", "start marker"]),
        ("truncated", variant("cut.bin", raw[:-3]), ["cut.bin", "example 9"]),
        ("label past the endings", os.path.join(tmp, "label.bin"),
         ["label.bin", "example 3", "label 4 of 4 endings"]),
        ("token outside the vocabulary", os.path.join(tmp, "token.bin"),
         ["token.bin", "example 2", "outside the vocabulary"]),
        ("longer than seq_len", os.path.join(tmp, "long.bin"), ["long.bin", "example 5",
                                                                 "seq_len"]),
        ("not an eval file", variant("magic.bin", b"\1" * 2048), ["magic.bin", "magic"]),
    ]
    for what, path, words in cases:
        sec = base_sections(tmp, 1)
        sec["model"] = {"n_layer": L, "n_head": NH, "d_model": C, "seq_len": T, "vocab_size": V}
        sec["eval"] = {"file": path, "every": 1}
        check_refused(checks, tmp, what, sec, 0, ["[eval] file", *words])
    sec = base_sections(tmp, 1)
    sec["eval"] = {"every": 5}
    check_refused(checks, tmp, "every without a file", sec, 0, ["every", "needs [eval] file"])


if __name__ == "__main__":
    main()
