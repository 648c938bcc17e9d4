"""test/test_diloco.py - DiLoCo islands ([parallel] diloco_islands, parallel/diloco.cu).

(a) One island, outer lr 1, momentum 0 at dp 2 is plain DDP: per-step losses and gradient norms
    equal the dp 2 run without DiLoCo within 1e-6 relative (the outer step sets w = w_island).
(b) K = 2 islands at dp 2 (one rank each), H = 3, 6 steps: the losses equal a float64 PyTorch
    model (test/gpt2_reference.py) of two islands, each running torch AdamW on its half of the
    global batch (dp rank r reads rows [r*B, (r+1)*B) of each global micro-batch), and the outer
    step of parallel/diloco.h in float64 after steps 3 and 6: delta = mean_k (w_sync - w_k);
    m = mu m + delta; w_sync -= lr (delta + mu m); every island restarts from w_sync with its own
    AdamW moments. The reported loss is the mean over islands, the gradient norm island 0's.
    Tolerance 1e-6 relative (measured 2e-8 to 7e-8 for losses and norms: about 10x-20x).
(c) Refusals: K not dividing dp, ZeRO/FSDP, tp > 1, checkpointing - each names its keys with
    file:line:col.
"""
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference as ref  # noqa: E402
from trainer import (Checks, base_sections, check_refused, make_experiment, max_rel,  # noqa: E402
                     read_metrics, run, seeded_rng, write_config)

checks = Checks("test_diloco")
L, NH, C, T, V = 2, 3, 36, 16, 101
B = 2  # rows per rank


def train(tmp, name, steps, parallel, lr=1e-2):
    sec = base_sections(tmp, steps, lr=lr, micro_batch=B, weight_decay=0.1)
    sec["parallel"] = parallel
    sec["log"]["metrics"] = os.path.join(tmp, f"{name}.jsonl")
    run(write_config(tmp, f"{name}.toml", sec), np_ranks=parallel.get("dp", 1))
    return read_metrics(sec["log"]["metrics"])[0]


def test_one_island_is_ddp(rng):
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=L, NH=NH, C=C, T=T, V=V)
        plain = train(tmp, "ddp", 8, {"dp": 2})
        one = train(tmp, "one", 8, {"dp": 2, "diloco_islands": 1, "diloco_every": 3,
                                      "diloco_outer_lr": 1.0, "diloco_outer_momentum": 0.0})
        loss = max_rel([s["loss"] for s in one], [s["loss"] for s in plain])
        norm = max_rel([s["grad_norm"] for s in one], [s["grad_norm"] for s in plain])
        checks.check("one island, lr 1, mu 0 = DDP", len(one) == 8 and max(loss, norm) < 1e-6,
                     f"max rel err loss {loss:.2e} norm {norm:.2e}")


def reference(params, cfg, tokens, steps, every, outer_lr, mu, lr, wd, islands=2):
    """float64: per-step mean loss over islands and island 0's gradient norm."""
    w_sync = {k: v.clone() for k, v in params.items()}
    mom = {k: torch.zeros_like(v) for k, v in params.items()}
    isl, opts = [], []
    for _ in range(islands):
        P = {k: v.clone().requires_grad_(True) for k, v in params.items()}
        decay = [p for p in P.values() if p.dim() >= 2]
        no_decay = [p for p in P.values() if p.dim() < 2]
        opts.append(torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                                       {"params": no_decay, "weight_decay": 0.0}],
                                      lr=lr, betas=(0.9, 0.95), eps=1e-8, foreach=False))
        isl.append(P)
    batches = ref.llmc_batches(tokens, B * islands, T)
    losses, norms = [], []
    for step in range(1, steps + 1):
        x, y = next(batches)
        total = 0.0
        for k, (P, opt) in enumerate(zip(isl, opts)):
            opt.zero_grad()
            loss = ref.gpt2_loss(P, x[k * B:(k + 1) * B], y[k * B:(k + 1) * B], cfg["L"],
                                 cfg["NH"], cfg["V"])
            loss.backward()
            total += loss.item() / islands
            if k == 0:
                norms.append(torch.sqrt(sum((p.grad ** 2).sum() for p in P.values())).item())
            opt.step()
        losses.append(total)
        if step % every == 0:
            with torch.no_grad():
                for name in w_sync:
                    delta = sum(w_sync[name] - P[name] for P in isl) / islands
                    mom[name] = mu * mom[name] + delta
                    w_sync[name] = w_sync[name] - outer_lr * (delta + mu * mom[name])
                    for P in isl:
                        P[name].copy_(w_sync[name])
    return losses, norms


def test_two_islands(rng):
    with tempfile.TemporaryDirectory() as tmp:
        tokens = make_experiment(tmp, rng, L=L, NH=NH, C=C, T=T, V=V)
        steps = train(tmp, "k2", 6, {"dp": 2, "diloco_islands": 2, "diloco_every": 3,
                                     "diloco_outer_lr": 0.7, "diloco_outer_momentum": 0.9})
        params, cfg = ref.read_model(os.path.join(tmp, "model.bin"))
        want, want_norm = reference(params, cfg, tokens, 6, 3, 0.7, 0.9, 1e-2, 0.1)
        got = [s["loss"] for s in steps]
        r = max_rel(got, want)
        rn = max_rel([s["grad_norm"] for s in steps], want_norm)
        r_outer = max_rel(got[3:], want[3:])
        checks.check("K=2, H=3: losses and norms = float64 islands + outer Nesterov",
                     len(got) == 6 and max(r, rn) < 1e-6,
                     f"max rel err loss {r:.2e} (after the outer step {r_outer:.2e}) norm {rn:.2e}"
                     f"; loss {got[0]:.5f} -> {got[-1]:.5f}")


def test_refusals(rng):
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=L, NH=NH, C=C, T=T, V=V)
        isl = "[parallel] diloco_islands = "
        cases = [
            ("K does not divide dp", 2, {"dp": 2, "diloco_islands": 3},
             [isl + "3", "does not divide", "[parallel] dp = 2", "bad.toml:"]),
            ("FSDP", 2, {"dp": 2, "diloco_islands": 2, "zero": 3}, [isl + "2", "zero"]),
            ("ZeRO-1", 2, {"dp": 2, "diloco_islands": 2, "zero": 1}, [isl + "2", "DDP only"]),
            ("tp > 1", 2, {"tp": 2, "diloco_islands": 2}, [isl + "2", "dp-only"]),
            ("outer momentum 1", 2, {"dp": 2, "diloco_islands": 2, "diloco_outer_momentum": 1.0},
             ["diloco_outer_momentum", "[0, 1)"]),
        ]
        for what, np_ranks, par, words in cases:
            sec = base_sections(tmp, 2)
            sec["parallel"] = par
            check_refused(checks, tmp, what, sec, np_ranks, words)
        sec = base_sections(tmp, 2)
        sec["parallel"] = {"dp": 2, "diloco_islands": 2}
        sec["checkpoint"] = {"dir": os.path.join(tmp, "ck")}
        check_refused(checks, tmp, "checkpointing", sec, 2,
                      [isl + "2", "cannot be checkpointed", "[checkpoint] dir"])


def main():
    rng = seeded_rng("test_diloco")
    checks.run_each(lambda: test_one_island_is_ddp(rng), lambda: test_two_islands(rng),
                    lambda: test_refusals(rng))
    checks.report()


if __name__ == "__main__":
    main()
