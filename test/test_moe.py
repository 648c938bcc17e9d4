"""test/test_moe.py - mixture of experts and expert parallelism in the trainer, against the
one-rank run (the gradients against float64 are test/test_moe_grads.py's).

Tiny models from random init ([model] keys), fp32, a global batch of 8 sequences of T = 16 per
step, moe_aux_loss 0.01 and moe_z_loss 0.001, lr 1e-3 and Adam eps 1e-6: Adam turns the
reduction-order noise of gradients near eps into steps of up to lr (with eps 1e-8 a wte element
of a rare token, |g| ~ 1.6e-9 and 15% apart between one rank and dp2, moved its weight 1.8e-5
apart on one seed, and the gradient norms drifted 1e-5 apart; with 1e-6 the layouts stay
within ~1e-7):
  M1  L=2, NH=4, C=32, V=101, E=4 experts of d_expert 24, top_k 2, every block MoE
  M2  as M1 with moe_every 2 (block 0 dense, block 1 MoE) and top_k 1
1. Layouts, 20 steps each: per-step loss, gradient norm, aux_loss and z_loss within 1e-6
   relative of the one-rank run of the same model (measured <= 1.0e-7):
     M1  dp4 x ep 1, 2, 4; dp2 x ep2 FSDP; dp2 x pp2 x ep2; dp1 x cp2 x ep2
     M2  dp2 x tp2 x ep2 with sp and grad_accum 4 (micro-batches of one sequence, which sp
         cuts in two: its expert counts need the all-reduce over tp), and without sp
   M1 dp2 x ep2 with recompute "gelu" and "block" gives bitwise the metrics of no recompute over
   5 steps ("block" with two more ep all-to-alls per MoE layer and micro-batch);
   dp4 x ep4 run twice gives bitwise the same metrics (losses, norms, both router losses,
   tokens per expert), and every run's tokens per expert sum, per MoE layer and step, to the
   global tokens of the step times top_k.
2. Communication per step (the metrics' "comm", world rank 0's counters), exactly:
   ep axis, per MoE layer of rank 0's stage and micro-batch: one all_to_all_host of the counts
   (4E bytes) and four all_to_all_v: the forward dispatch and the backward's gradients to the
   experts each send this rank's N*top_k rows (N*top_k*C*4 bytes), the forward combine and the
   backward's input gradients home each send the M rows this rank's experts ran (M*C*4 bytes;
   parallel/comm.cu counts the send side). M is the tokens per expert of rank 0's experts in
   the metrics wherever rank 0's ep group routes every token of its layers (ep = dp*cp, and the
   tp ranks without sp route the same tokens); where it does not (dp4 x ep2, tp2 with sp) the
   calls are checked and the bytes must leave a whole number of rows M in [0, ep*N*top_k] per
   layer and micro-batch.
   The balance loss's count all-reduces (model/moe.cu balance): over cp, B*E*4 bytes per MoE
   layer and micro-batch, the cp axis's only all-reduce; over tp with sp, the same next to the
   sequence-parallel gradient sums (one all-reduce per unit over its partial-gradient tail,
   from the unit geometry: model/gpt.cu, parallel/placement.cu).
3. Refused before any work, naming the keys: n_experts % ep != 0, top_k > n_experts, ep not
   dividing dp*cp, moe_every 0 and > n_layer, ep > 1 with n_experts = 0, [init] from with experts.
4. M1 learns: 60 steps at lr 1e-2 on learnable_tokens (each token one of 3 successors of the
   previous one: the loss can fall from ln 101 = 4.6 towards ln 3 = 1.1): the mean loss of the
   last 5 steps is below half the first step's (measured: 38-43%).
Fresh random tokens every run (the seed is printed; SEED=<n> reproduces).
"""
import concurrent.futures
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference as ref  # noqa: E402
from trainer import (Checks, base_sections, make_experiment, max_rel, read_metrics,  # noqa: E402
                     run, seeded_rng, write_config)

checks = Checks("test_moe")
L, NH, C, T, V, E, D = 2, 4, 32, 16, 101, 4, 24
ROWS, STEPS = 8, 20  # sequences per step (global), steps per layout
AUX, ZL = 0.01, 0.001
EPS = 1e-6  # Adam's: see the docstring
M1 = {"n_layer": L, "n_head": NH, "d_model": C, "seq_len": T, "vocab_size": V,
      "n_experts": E, "top_k": 2, "d_expert": D, "moe_every": 1}
M2 = dict(M1, top_k=1, moe_every=2)


def sections(tmp, name, model, steps=STEPS, lr=1e-3, dp=1, tp=1, pp=1, cp=1, ep=1, sp=True,
             fsdp=False, grad_accum=1, recompute="none"):
    sec = base_sections(tmp, steps, lr=lr, micro_batch=ROWS // dp // grad_accum,
                        grad_accum=grad_accum, moe_aux_loss=AUX, moe_z_loss=ZL, seed=4242,
                        eps=EPS, recompute=recompute)
    del sec["init"]
    sec["model"] = dict(model)
    sec["parallel"] = {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep, "sp": sp, "fsdp": fsdp}
    sec["log"]["metrics"] = os.path.join(tmp, f"{name}.jsonl")
    return sec


def train(tmp, name, model, **kw):
    """Step records of one run (layout keywords as in sections)."""
    sec = sections(tmp, name, model, **kw)
    world = kw.get("dp", 1) * kw.get("tp", 1) * kw.get("pp", 1) * kw.get("cp", 1)
    run(write_config(tmp, f"{name}.toml", sec), np_ranks=world if world > 1 else 0)
    return read_metrics(sec["log"]["metrics"])[0]


def series(steps, key):
    return [s[key] for s in steps]


def check_tokens(label, steps, model):
    want = ROWS * T * model["top_k"]
    sums = {sum(layer["tokens"]) for s in steps for layer in s["moe"]}
    layers = {tuple(layer["layer"] for layer in s["moe"]) for s in steps}
    moe = tuple(l for l in range(L) if (l + 1) % model["moe_every"] == 0)
    checks.check(f"{label}: tokens per expert", sums == {want} and layers == {moe},
                 f"sums {sorted(sums)} per layer and step (want {ROWS} x {T} x top_k = {want}), "
                 f"layers {sorted(layers)}")


def compare(label, steps, ref, model):
    errs = {k: max_rel(series(steps, k), series(ref, k))
            for k in ("loss", "grad_norm", "aux_loss", "z_loss")}
    checks.check(f"{label}: vs one rank", len(steps) == len(ref) and max(errs.values()) < 1e-6,
                 ", ".join(f"{k} {v:.1e}" for k, v in errs.items()) + f" over {len(steps)} steps")
    check_tokens(label, steps, model)


# ---------------------------------------------------------------------------------------------
# Communication
# ---------------------------------------------------------------------------------------------
def round_up(x, m):
    return (x + m - 1) // m * m


def tail_floats(sizes, first_partial):
    """A unit's flat length minus the offset of its first partial-gradient tensor (tensors at
    multiples of 64 elements, the unit rounded up to 64: parallel/placement.cu)."""
    n, offsets = 0, []
    for k in sizes:
        n = round_up(n, 64)
        offsets.append(n)
        n += k
    return round_up(n, 64) - offsets[first_partial]


def sp_grad_all_reduces(model, tp, ep):
    """(calls, bytes) of the tp all-reduces of the partial gradients (DDP, sp, one stage)."""
    Vp, k = 128, model["n_experts"] // ep
    tails = [tail_floats([Vp // tp * C, T * C, C, C], 2)]
    for l in range(L):
        if (l + 1) % model["moe_every"] == 0:
            tails.append(tail_floats([3 * C // tp * C, C * C // tp, 3 * C // tp, C, C, C, C, C,
                                      E * C], 4))
            tails.append(tail_floats([k * D * C, k * C * D, k * D, k * C], 0))
        else:
            tails.append(tail_floats([3 * C // tp * C, C * C // tp, 4 * C // tp * C,
                                      C * 4 * C // tp, 3 * C // tp, 4 * C // tp, C, C, C, C, C,
                                      C], 8))
    return len(tails), 4 * sum(tails)


def check_comm(label, steps, model, dp=1, tp=1, pp=1, cp=1, ep=1, sp=True, grad_accum=1, **_):
    k = model["top_k"]
    B = ROWS // dp // grad_accum
    N = B * T // cp // (tp if sp else 1)     # rank 0's tokens per micro-batch
    layers = [l for l in range(L // pp) if (l + 1) % model["moe_every"] == 0]  # rank 0's stage
    per = len(layers) * grad_accum           # MoE layer forwards (and backwards) per step
    # rank 0's ep group routes every token of its layers: the metrics' counts give M
    exact = ep == dp * cp and (tp == 1 or not sp)
    ok, notes = True, []
    for s in steps:
        got = s["comm"].get("ep", {})
        if ep == 1:
            ok = ok and got == {}
            continue
        a2a = got.get("all_to_all", {"calls": 0, "bytes": 0})
        fixed = per * (4 * E + 2 * N * k * C * 4)
        rows = (a2a["bytes"] - fixed) / (2 * C * 4)  # M summed over the layers and micro-steps
        want_calls = 5 * per
        if exact:
            M = sum(sum(layer["tokens"][:E // ep]) for layer in s["moe"]
                    if layer["layer"] in layers)
            ok = ok and got == {"all_to_all": {"calls": want_calls,
                                               "bytes": fixed + 2 * C * 4 * M}}
        else:
            ok = ok and set(got) == {"all_to_all"} and a2a["calls"] == want_calls and \
                rows == int(rows) and 0 <= rows <= per * ep * N * k
        notes.append(rows)
    first = steps[0]["comm"].get("ep", {})
    checks.check(f"{label}: ep comm per step", ok,
                 f"step 1 {first}; N*top_k = {N}x{k} rows out per layer and micro-batch, "
                 f"M = {notes[0] if notes else 0:g} rows at rank 0's experts (all its layers and "
                 "micro-batches) "
                 + ("(from the metrics' tokens)" if exact else "(not in the metrics: bounds only)"))
    balance = {"calls": per, "bytes": per * B * E * 4}
    if cp > 1:
        got = [s["comm"]["cp"].get("all_reduce") for s in steps]
        checks.check(f"{label}: balance counts all-reduce over cp", all(g == balance for g in got),
                     f"{got[0]} (B*E*4 bytes per MoE layer and micro-batch: {balance})")
    if tp > 1 and sp:
        calls, nbytes = sp_grad_all_reduces(model, tp, ep)
        want = {"calls": calls + per, "bytes": nbytes + balance["bytes"]}
        got = [s["comm"]["tp"].get("all_reduce") for s in steps]
        checks.check(f"{label}: balance counts all-reduce over tp", all(g == want for g in got),
                     f"{got[0]} = the partial gradients' {calls} calls, {nbytes} B + the "
                     f"counts' {balance}")


# ---------------------------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------------------------
def test_layouts(tmp):
    one = train(tmp, "one", M1)
    check_tokens("M1 one rank", one, M1)
    for ep in (1, 2, 4):
        steps = train(tmp, f"dp4_ep{ep}", M1, dp=4, ep=ep)
        compare(f"M1 dp4 x ep{ep}", steps, one, M1)
        check_comm(f"M1 dp4 x ep{ep}", steps, M1, dp=4, ep=ep)
        if ep == 4:
            again = train(tmp, "dp4_ep4_again", M1, dp=4, ep=4)
            keys = ("loss", "grad_norm", "aux_loss", "z_loss", "moe")
            same = all(a[k] == b[k] for a, b in zip(steps, again) for k in keys)
            checks.check("M1 dp4 x ep4 twice: bitwise the same metrics",
                         same and len(steps) == len(again),
                         "losses, norms, aux_loss, z_loss and tokens per expert of every step")
    for label, kw in [("dp2 x ep2 FSDP", dict(dp=2, ep=2, fsdp=True)),
                      ("dp2 x pp2 x ep2", dict(dp=2, pp=2, ep=2)),
                      ("cp2 x ep2", dict(cp=2, ep=2))]:
        steps = train(tmp, label.replace(" ", ""), M1, **kw)
        compare(f"M1 {label}", steps, one, M1)
        check_comm(f"M1 {label}", steps, M1, **kw)
    # recompute: the same computation again (the route of the forward is kept), so bitwise the
    # same metrics as no recompute; "block" repeats the forward's two all-to-alls per MoE layer
    plain = train(tmp, "dp2_ep2", M1, steps=5, dp=2, ep=2)
    for mode in ("gelu", "block"):
        steps = train(tmp, f"dp2_ep2_{mode}", M1, steps=5, dp=2, ep=2, recompute=mode)
        keys = ("loss", "grad_norm", "aux_loss", "z_loss", "moe")
        same = all(a[k] == b[k] for a, b in zip(steps, plain) for k in keys)
        calls = [s["comm"]["ep"]["all_to_all"]["calls"] for s in (steps[0], plain[0])]
        want = calls[1] + (2 * L if mode == "block" else 0)
        checks.check(f"M1 dp2 x ep2 recompute {mode}: bitwise the metrics of none",
                     same and len(steps) == len(plain) and calls[0] == want,
                     f"5 steps; ep all-to-alls per step {calls[0]} (none: {calls[1]}, want {want})")
    one2 = train(tmp, "one_m2", M2)
    check_tokens("M2 one rank", one2, M2)
    # sp on with grad_accum 4: micro-batches of one sequence, cut in two by sp, so that its
    # expert counts need the all-reduce over tp
    for sp, ga in ((True, 4), (False, 1)):
        label = f"dp2 x tp2 x ep2 sp {'on, grad_accum 4' if sp else 'off'}"
        kw = dict(dp=2, tp=2, ep=2, sp=sp, grad_accum=ga)
        steps = train(tmp, f"m2_tp2_sp{int(sp)}", M2, **kw)
        compare(f"M2 {label}", steps, one2, M2)
        check_comm(f"M2 {label}", steps, M2, **kw)


def test_refused(tmp):
    """Each refused config in its own folder, all at once (they mostly wait for MPI's start)."""
    model_file = os.path.join(tmp, "dense.bin")
    ref.write_model(model_file, ref.random_params(L, C, T, V, np.random.default_rng(0)), L, NH, C,
                    T, V)
    cases = [
        ("n_experts not a multiple of ep", dict(M1, n_experts=3), dict(dp=2, ep=2), {},
         ["n_experts = 3", "ep = 2", "multiple"]),
        ("top_k > n_experts", dict(M1, top_k=5), {}, {}, ["top_k = 5", "n_experts = 4"]),
        ("ep not dividing dp*cp", M1, dict(dp=2, ep=4), {}, ["ep = 4", "dp*cp = 2"]),
        ("moe_every 0", dict(M1, moe_every=0), {}, {}, ["moe_every = 0", "n_layer = 2"]),
        ("moe_every > n_layer", dict(M1, moe_every=3), {}, {}, ["moe_every = 3", "n_layer = 2"]),
        ("ep > 1 without experts", dict(M1, n_experts=0), dict(dp=2, ep=2), {},
         ["ep = 2", "n_experts"]),
        ("[init] from with experts", M1, {}, {"from": model_file},
         ["[init] from", "n_experts = 4"]),
    ]

    def refuse(i, case):
        what, model, par, extra, words = case
        sub = os.path.join(tmp, f"refused{i}")
        os.makedirs(sub, exist_ok=True)
        sec = sections(tmp, f"refused{i}", model, steps=2)
        sec["parallel"] = dict({"dp": 1}, **par)
        if "from" in extra:
            sec["init"] = {"from": extra["from"]}
        else:
            sec["train"].update(extra)
        world = sec["parallel"].get("dp", 1)
        r = run(write_config(sub, "bad.toml", sec), np_ranks=world if world > 1 else 0,
                check=False, timeout=60)
        text = r.stdout + r.stderr
        ok = r.returncode != 0 and all(w in text for w in words) and "| loss" not in r.stdout
        return what, ok, next((ln.strip() for ln in text.splitlines() if "error" in ln or
                               ln.strip().startswith("- [")), "no error line")

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(cases)) as pool:
        results = list(pool.map(lambda ic: refuse(*ic), enumerate(cases)))
    for what, ok, line in results:
        checks.check(f"refused: {what}", ok, line)


def test_learns(tmp):
    steps = train(tmp, "learn", M1, steps=60, lr=1e-2)
    loss = series(steps, "loss")
    last = float(np.mean(loss[-5:]))
    checks.check("M1 learns", len(loss) == 60 and last < 0.5 * loss[0],
                 f"loss {loss[0]:.3f} at step 1, {last:.3f} over steps 56-60; aux_loss "
                 f"{steps[0]['aux_loss']:.4f} -> {steps[-1]['aux_loss']:.4f}, z_loss "
                 f"{steps[0]['z_loss']:.5f} -> {steps[-1]['z_loss']:.5f}")


def main():
    rng = seeded_rng("test_moe")
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=L, NH=NH, C=C, T=T, V=V, model=False)
        test_refused(tmp)
        test_layouts(tmp)
        test_learns(tmp)
    checks.report()


if __name__ == "__main__":
    main()
