"""test/test_moe_options.py - the MoE options beyond Switch/Mixtral in the trainer: shared
experts, sigmoid router scores, balancing biases ([train] moe_balance = "bias") and the capacity
factor, on every layout against the one-rank run, the biases through a checkpoint, and the
configs refused (their float64 gradients are test/test_moe_grads.py's, cases E-I).

The model, fp32: L=2, NH=4, C=32, V=101, E=8 experts of d_expert 16, top_k 2, every block MoE,
1 shared expert, router_score "sigmoid", moe_balance "bias" at moe_bias_rate 0.01 (so that the
biases move the choices within the run), moe_capacity_factor 1.0 (some pairs dropped every
step), moe_aux_loss 0.001, moe_z_loss 0.001; a global batch of 8 sequences of T = 16, Adam eps
1e-6 (test/test_moe.py says why), 10 steps.
1. Layouts against one rank, per-step loss, aux_loss and z_loss within 1e-6 relative, the
   gradient norm within 1e-5 (cp2 x ep2 measured 1.8e-6 on one draw of the data: a norm sums
   every gradient, in another order per layout) and the tokens per expert and the dropped fractions equal. The capacity is per
   micro-batch, so the one-rank run has the layout's micro-batches: micro_batch 4 and
   grad_accum 2 for dp2 x ep2, dp2 x ep2 FSDP, dp2 x tp2 x ep2 (sp), dp2 x pp2 x ep2,
   cp2 x ep2 (cp cuts each sequence: the choices of a micro-batch are summed over cp to drop
   in token order) and dp1 x tp2 (sp: the same over tp); micro_batch 2 and grad_accum 4 for
   dp4 x ep4; and pp2 with the zb-h1 schedule (the split backward: weight passes apart). Every
   run drops some pairs (the capacity is exercised). dp2 x ep2 with recompute "gelu" and
   "block" gives bitwise its metrics without recompute.
2. The biases move (some non-zero at step 10, read from the checkpoint) and are state: a
   one-rank run of 10 steps saving at step 5, resumed from it, gives
   steps 6-10 bitwise equal to the uninterrupted run's (losses, norms, tokens per expert) and the
   same biases at step 10 bit for bit; resumed by dp2 x ep2 (resharded) within 1e-6.
3. Refused before any work, naming the key and both values: top_k > n_experts, capacity factor
   < 0, moe_balance = "bias" and n_shared_experts with a dense model.
4. configs/demo_deepseek.toml (shared, fine-grained, sigmoid, bias, capacity) and
   configs/demo_mixtral.toml (a Llama with 8 SwiGLU experts, top-2) train 3 steps on this data
   at their own shapes: finite losses, 4 MoE layers of 32 and of 8 experts in the metrics; the
   Mixtral demo's checkpoint exports (tools/export.py hf) as MixtralForCausalLM.
5. Against float64 (test/moe_reference.py, its own AdamW loop and bias updates), one rank, 10
   AdamW steps at lr 1e-3 with weight decay 0.1 (not on the router), a batch of 8 sequences,
   the biases moving every step (rate 0.01, b_e += rate x sign(mean load - load_e), in float32
   as the trainer keeps them), from the trainer's own random init (read from a 1-step lr 0 run):
   M itself (shared expert, sigmoid, capacity 1.0) and fine-grained E=16 of d_expert 8, top_k
   8, softmax, capacity 0.75 (room for 3/4 of the pairs: an overflow every step). Loss, aux_loss
   and z_loss within 1e-6 relative (measured <= 1.1e-7 over 25 seeds), the tokens per expert
   equal every step, the dropped fractions equal (every step drops), the biases at step 10 bit
   for bit.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainer import (Checks, base_sections, check_refused, make_experiment, max_rel,  # noqa: E402
                     read_metrics, run, seeded_rng, write_config)

checks = Checks("test_moe_options")
L, NH, C, T, V = 2, 4, 32, 16, 101
ROWS, STEPS = 8, 10
M = {"n_layer": L, "n_head": NH, "d_model": C, "seq_len": T, "vocab_size": V,
     "n_experts": 8, "top_k": 2, "d_expert": 16, "moe_every": 1, "n_shared_experts": 1,
     "router_score": "sigmoid"}
TRAIN = dict(moe_aux_loss=0.001, moe_z_loss=0.001, moe_balance="bias", moe_bias_rate=0.01,
             moe_capacity_factor=1.0, seed=4242, eps=1e-6)


def sections(tmp, name, steps=STEPS, micro_batch=4, grad_accum=2, dp=1, tp=1, pp=1, cp=1, ep=1,
             fsdp=False, model=M, pp_schedule="1f1b", **train):
    sec = base_sections(tmp, steps, micro_batch=micro_batch, grad_accum=grad_accum,
                        **dict(TRAIN, **train))
    del sec["init"]
    sec["model"] = dict(model)
    sec["parallel"] = {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep, "fsdp": fsdp,
                       "pp_schedule": pp_schedule}
    sec["log"]["metrics"] = os.path.join(tmp, f"{name}.jsonl")
    return sec


def world(sec):
    p = sec["parallel"]
    return p["dp"] * p["tp"] * p["pp"] * p["cp"]


def train(tmp, name, **kw):
    sec = sections(tmp, name, **kw)
    n = world(sec)
    run(write_config(tmp, f"{name}.toml", sec), np_ranks=n if n > 1 else 0)
    return read_metrics(sec["log"]["metrics"])[0]


def moe_of(steps):
    return [[(l["layer"], l["tokens"], l["dropped"]) for l in s["moe"]] for s in steps]


def compare(label, steps, ref):
    errs = {k: max_rel([s[k] for s in steps], [s[k] for s in ref])
            for k in ("loss", "grad_norm", "aux_loss", "z_loss")}
    routed = moe_of(steps) == moe_of(ref)
    dropped = min(l["dropped"] for s in steps for l in s["moe"])
    checks.check(f"{label}: vs one rank",
                 len(steps) == len(ref) == STEPS and routed and
                 all(v < (1e-5 if k == "grad_norm" else 1e-6) for k, v in errs.items()),
                 ", ".join(f"{k} {v:.1e}" for k, v in errs.items()) +
                 f"; tokens per expert and dropped fractions equal: {routed}")
    checks.check(f"{label}: the capacity dropped pairs", dropped > 0,
                 f"the least dropped fraction of a layer and step {dropped:.3f}")


def test_layouts(tmp):
    ref4 = train(tmp, "one_mb4")
    ref2 = train(tmp, "one_mb2", micro_batch=2, grad_accum=4)
    layouts = [("dp2 x ep2", ref4, dict(dp=2, ep=2, grad_accum=1)),
               ("dp2 x ep2 FSDP", ref4, dict(dp=2, ep=2, grad_accum=1, fsdp=True)),
               ("dp2 x tp2 x ep2 (sp)", ref4, dict(dp=2, tp=2, ep=2, grad_accum=1)),
               ("dp2 x pp2 x ep2", ref4, dict(dp=2, pp=2, ep=2, grad_accum=1)),
               ("cp2 x ep2", ref4, dict(cp=2, ep=2)),
               ("tp2 (sp)", ref4, dict(tp=2)),
               ("dp4 x ep4", ref2, dict(dp=4, ep=4, micro_batch=2, grad_accum=1))]
    runs = {}
    for label, ref, kw in layouts:
        runs[label] = train(tmp, label.replace(" ", "").replace("(", "").replace(")", ""), **kw)
        compare(label, runs[label], ref)
    # the split backward (B, then W later) runs the shared experts' and the experts' weight
    # passes apart from their input gradients
    compare("pp2 zb-h1", train(tmp, "pp2_zbh1", pp=2, pp_schedule="zb-h1"), ref4)
    # recompute: the same arithmetic again (the shared experts' GELU, whole blocks), so bitwise
    keys = ("loss", "grad_norm", "aux_loss", "z_loss", "moe")
    for mode in ("gelu", "block"):
        steps = train(tmp, f"dp2_ep2_{mode}", dp=2, ep=2, grad_accum=1, recompute=mode)
        plain = runs["dp2 x ep2"]
        same = len(steps) == len(plain) and all(a[k] == b[k] for a, b in zip(steps, plain)
                                                for k in keys)
        checks.check(f"dp2 x ep2 recompute {mode}: bitwise the metrics of none", same,
                     "losses, norms, router losses, tokens per expert, dropped fractions")


def bias_attr(ckpt):
    import h5py
    with h5py.File(os.path.join(ckpt, "checkpoint.h5"), "r") as f:
        return np.array(f["train"].attrs["moe_bias"], dtype=np.float32)


def test_resume(tmp):
    keys = ("loss", "grad_norm", "aux_loss", "z_loss", "moe")
    full_dir, part_dir = os.path.join(tmp, "ck_full"), os.path.join(tmp, "ck_part")
    full = train_ck(tmp, "full", checkpoint_sections(full_dir, 5))
    bias = bias_attr(os.path.join(full_dir, "step_000010"))
    checks.check("the biases moved", bias.shape == (L * M["n_experts"],) and
                 np.count_nonzero(bias) > 0,
                 f"{np.count_nonzero(bias)} of {bias.size} biases non-zero at step 10, "
                 f"|b| up to {np.abs(bias).max():.3f}")
    train_ck(tmp, "part", checkpoint_sections(part_dir, 5, steps=5))
    again = train_ck(tmp, "resumed", checkpoint_sections(part_dir, 5, resume="latest"))
    same = len(again) == 5 and all(a[k] == b[k] for a, b in zip(again, full[5:]) for k in keys)
    end = bias_attr(os.path.join(part_dir, "step_000010"))
    checks.check("resumed at step 5: steps 6-10 bitwise the uninterrupted run's",
                 same and np.array_equal(end.view(np.uint32), bias.view(np.uint32)),
                 f"{len(again)} steps; losses, norms, router losses, tokens per expert equal: "
                 f"{same}; biases at step 10 bit for bit: {np.array_equal(end, bias)}")
    resharded = train_ck(tmp, "resharded", dict(
        checkpoint_sections(os.path.join(tmp, "ck_other"), 100,
                            resume=os.path.join(full_dir, "step_000005")),
        dp=2, ep=2, grad_accum=1))
    errs = [max_rel([s[k] for s in resharded], [s[k] for s in full[5:]])
            for k in ("loss", "grad_norm")]
    checks.check("resumed at step 5 by dp2 x ep2: steps 6-10 within 1e-6",
                 len(resharded) == 5 and max(errs) < 1e-6 and
                 moe_of(resharded) == moe_of(full[5:]),
                 f"loss {errs[0]:.1e}, norm {errs[1]:.1e}, routing equal "
                 f"{moe_of(resharded) == moe_of(full[5:])}")


def checkpoint_sections(directory, every, steps=STEPS, resume=""):
    """train() keywords for a run saving into directory every `every` steps."""
    return {"checkpoint": {"dir": directory, "every": every, "resume": resume, "keep": 10},
            "steps": steps}


def train_ck(tmp, name, opts):
    """train() with a [checkpoint] section (opts from checkpoint_sections, plus layout keys)."""
    opts = dict(opts)
    ck, steps = opts.pop("checkpoint"), opts.pop("steps")
    sec = sections(tmp, name, steps=steps, **opts)
    sec["checkpoint"] = {k: v for k, v in ck.items() if v != ""}
    n = world(sec)
    run(write_config(tmp, f"{name}.toml", sec), np_ranks=n if n > 1 else 0)
    return read_metrics(sec["log"]["metrics"])[0]


def test_refused(tmp):
    dense = dict(M, n_experts=0, n_shared_experts=0)
    cases = [("top_k > n_experts", dict(M, top_k=9), {}, ["top_k = 9", "n_experts = 8"]),
             ("capacity factor < 0", M, dict(moe_capacity_factor=-0.5),
              ["moe_capacity_factor = -0.5", ">= 0"]),
             ("bias balancing with a dense model", dense, {},
              ["moe_balance = \"bias\"", "n_experts = 0"]),
             ("shared experts with a dense model", dict(dense, n_shared_experts=2),
              dict(moe_balance="aux_loss"), ["n_shared_experts = 2", "n_experts = 0"])]
    for i, (what, model, train_kw, words) in enumerate(cases):
        sub = os.path.join(tmp, f"refused{i}")
        os.makedirs(sub, exist_ok=True)
        check_refused(checks, sub, what, sections(tmp, f"refused{i}", steps=2, model=model,
                                                  **train_kw), 0, words)


def test_demo(tmp):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name, layers, experts in (("demo_deepseek", 4, 32), ("demo_mixtral", 4, 8)):
        metrics, ckpt = os.path.join(tmp, f"{name}.jsonl"), os.path.join(tmp, f"{name}_ckpt")
        run(os.path.join(root, "configs", f"{name}.toml"),
            [f"--data.train={tmp}/train_*.bin", f"--data.val={tmp}/val_*.bin",
             f"--model.vocab_size={V}", "--train.steps=3", "--train.warmup_steps=0",
             "--train.micro_batch=2", "--log.every=1", "--log.val_every=0",
             "--log.sample_every=0", f"--log.metrics={metrics}"] +
            ([f"--checkpoint.dir={ckpt}", "--checkpoint.every=3"] if name == "demo_mixtral"
             else []))
        steps = read_metrics(metrics)[0]
        loss = [s["loss"] for s in steps]
        shape = len(steps[0]["moe"]) == layers and len(steps[0]["moe"][0]["tokens"]) == experts
        checks.check(f"configs/{name}.toml trains", len(loss) == 3 and
                     all(np.isfinite(loss)) and shape,
                     f"losses {', '.join(f'{x:.4f}' for x in loss)}; layers "
                     f"{len(steps[0]['moe'])}, experts {len(steps[0]['moe'][0]['tokens'])}")
    out = os.path.join(tmp, "demo_mixtral_hf")
    r = subprocess.run([sys.executable, os.path.join(root, "tools", "export.py"), "hf", ckpt, out],
                       capture_output=True, text=True, timeout=120)
    arch = json.load(open(os.path.join(out, "config.json")))["architectures"] \
        if r.returncode == 0 else r.stderr.strip()
    checks.check("configs/demo_mixtral.toml exports as MixtralForCausalLM",
                 arch == ["MixtralForCausalLM"], f"config.json architectures {arch}")


# ---------------------------------------------------------------------------------------------
# 5. Against float64 over 10 AdamW steps, the biases moving
# ---------------------------------------------------------------------------------------------
FLOAT64_CASES = [  # (label, [model] changes, [train] changes), TRAIN's otherwise
    ("shared, sigmoid, bias, capacity 1.0", {}, dict(lr=1e-3, weight_decay=0.1)),
    ("fine-grained E=16 top_k=8, softmax, bias, capacity 0.75",
     dict(n_experts=16, top_k=8, d_expert=8, n_shared_experts=0, router_score="softmax"),
     dict(lr=1e-3, weight_decay=0.1, moe_capacity_factor=0.75))]
FLOAT64_TOL = 1e-6  # measured <= 1.1e-7 relative (loss, aux, z) over 25 seeds


def initial_weights(tmp, name, model, train_kw):
    """The trainer's random init (same seed): a 1-step run at lr 0 and bias rate 0 keeps it."""
    import h5py
    ck = os.path.join(tmp, name + "_init")
    sec = sections(tmp, name + "_init", steps=1, micro_batch=ROWS, grad_accum=1, model=model,
                   **dict(train_kw, lr=0.0, moe_bias_rate=0.0))
    sec["checkpoint"] = {"dir": ck, "every": 1}
    run(write_config(tmp, name + "_init.toml", sec))
    with h5py.File(os.path.join(ck, "step_000001", "checkpoint.h5"), "r") as f:
        names = []
        f["model"].visit(lambda n: names.append(n) if isinstance(f["model"][n], h5py.Dataset)
                         else None)
        return {n: np.asarray(f["model"][n][...], dtype=np.float64) for n in names}


def float64_run(W, model, train_kw, tokens):
    """Per step: (lm, aux, z, {layer: tokens per expert}, {layer: dropped}) and the final biases
    (float32, as the trainer keeps them) of float64 AdamW training with bias balancing."""
    import torch
    import gpt2_reference as gref
    import moe_reference as mref
    t = dict(TRAIN, **train_kw)
    E, k = model["n_experts"], model["top_k"]
    P = {n: torch.tensor(a.reshape(mref.param_shapes(L, C, T, V, E, model["d_expert"], 1,
                                                     model["n_shared_experts"])[n]),
                         requires_grad=True) for n, a in W.items()}
    decay = [p for n, p in P.items() if p.dim() >= 2 and not n.endswith("router/weight")]
    rest = [p for n, p in P.items() if not (p.dim() >= 2 and not n.endswith("router/weight"))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t["weight_decay"]},
                             {"params": rest, "weight_decay": 0.0}], lr=t["lr"],
                            betas=(0.9, 0.95), eps=t["eps"], foreach=False)
    bias = {l: np.zeros(E, np.float32) for l in range(L)}
    cfg = dict(L=L, NH=NH, V=V, E=E, top_k=k, moe_every=1, aux=t["moe_aux_loss"],
               z=t["moe_z_loss"], S=model["n_shared_experts"], score=model["router_score"],
               capacity=t["moe_capacity_factor"])
    batches, out = gref.llmc_batches(tokens, ROWS, T), []
    for _ in range(STEPS):
        x, y = next(batches)
        cfg["bias"] = {l: torch.tensor(b, dtype=torch.float64) for l, b in bias.items()}
        opt.zero_grad()
        total, lm, aux, zl, chosen, _ = mref.moe_gpt_loss(P, x, y, cfg)
        total.backward()
        opt.step()
        loads = {l: np.bincount(c.reshape(-1).numpy(), minlength=E) for l, c in chosen.items()}
        drops = {l: float((mref.keep_within_capacity(c, E, cfg["capacity"]) == 0).sum()) /
                 c.numel() for l, c in chosen.items()}
        for l, load in loads.items():  # b_e += rate * sign(mean load - load_e), in float32
            step = np.float32(t["moe_bias_rate"]) * np.sign(load.mean() - load).astype(np.float32)
            bias[l] = (bias[l] + step).astype(np.float32)
        out.append((lm.item(), float(aux), float(zl), loads, drops))
    return out, np.concatenate([bias[l] for l in range(L)])


def test_float64(tmp, tokens):
    for i, (label, model_kw, train_kw) in enumerate(FLOAT64_CASES):
        model = dict(M, **model_kw)
        W = initial_weights(tmp, f"f64_{i}", model, train_kw)
        want, want_bias = float64_run(W, model, train_kw, tokens)
        ck = os.path.join(tmp, f"f64_{i}_ck")
        sec = sections(tmp, f"f64_{i}", micro_batch=ROWS, grad_accum=1, model=model, **train_kw)
        sec["checkpoint"] = {"dir": ck, "every": STEPS}
        run(write_config(tmp, f"f64_{i}.toml", sec))
        got = read_metrics(sec["log"]["metrics"])[0]
        errs = [max_rel([s[key] for s in got], [w[j] for w in want])
                for j, key in enumerate(("loss", "aux_loss", "z_loss"))]
        routed = all([list(map(int, l["tokens"])) for l in s["moe"]] ==
                     [w[3][l].tolist() for l in range(L)] for s, w in zip(got, want))
        dropped = max(abs(l["dropped"] - w[4][l["layer"]]) for s, w in zip(got, want)
                      for l in s["moe"])
        bias = bias_attr(os.path.join(ck, f"step_{STEPS:06d}"))
        checks.check(f"float64, {STEPS} AdamW steps: {label}",
                     len(got) == STEPS and max(errs) < FLOAT64_TOL and routed and
                     dropped < 1e-8 and np.array_equal(bias, want_bias) and
                     min(w[4][l] for w in want for l in range(L)) > 0 and np.any(want_bias),
                     f"max rel error loss {errs[0]:.1e}, aux {errs[1]:.1e}, z {errs[2]:.1e} "
                     f"(tolerance {FLOAT64_TOL:g}); tokens per expert equal every step: {routed}; "
                     f"dropped fractions within {dropped:.0e}; biases at step {STEPS} bit for bit: "
                     f"{np.array_equal(bias, want_bias)} "
                     f"({np.count_nonzero(want_bias)} of {want_bias.size} non-zero)")


def main():
    rng = seeded_rng("test_moe_options")
    with tempfile.TemporaryDirectory() as tmp:
        tokens = make_experiment(tmp, rng, L=L, NH=NH, C=C, T=T, V=V, model=False)
        test_float64(tmp, tokens)
        test_refused(tmp)
        test_layouts(tmp)
        test_resume(tmp)
        test_demo(tmp)
    checks.report()


if __name__ == "__main__":
    main()
