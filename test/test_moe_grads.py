"""test/test_moe_grads.py - the mixture-of-experts GPT's loss and gradients: the trainer's model
code on the CPU backend (build/test_moe_grads, fp32, one rank) against PyTorch float64
(test/moe_reference.py) and against finite differences of its own loss.

Tiny cases, B = 2 sequences of T = 8, C = 24, 4 heads, V = 61, E = 4 experts of d_expert = 20
unless said otherwise; GPT-2 random init (model/init.h, the seed printed) with the LayerNorms and
biases perturbed (N(1, 0.1), N(0, 0.1)), expert matrices N(0, 0.1) and router N(0, 0.3) so that
the gates are far from uniform and every path carries weight; fresh random tokens every run.
  A  L=2, moe_every=1 (both blocks MoE), top_k=2, moe_aux_loss 0.05, moe_z_loss 0.01
  B  L=2, moe_every=2 (block 0 dense, block 1 MoE), top_k=1, the same coefficients
  C  as A with E=6, top_k=3
  D  as A with the router rows of experts 1 and 2 both set to the mean of rows 0 and 3 in every
     MoE layer: z_1 = z_2 exactly (fp32 and float64) and between z_0 and z_3, so every token's
     2nd and 3rd best experts tie, and the rule (the lower index) must pick expert 1
  E  as A with 2 shared experts (MOE_SHARED: one MLP of 2 x d_expert every token runs)
  F  as C with sigmoid router scores (MOE_SCORE)
  G  as A with balancing biases N(0, 0.3) per layer and expert (MOE_BIAS): chosen by p + b,
     gated by p; at least one token must choose otherwise than by p alone
  H  as A with capacity factor 0.5 (MOE_CAPACITY): room for half the pairs, so pairs are
     dropped (counted in the reference), contributing nothing and no gate gradient
  I  fine-grained: E=16 of d_expert 6, top_k=8, with all of E-H at once (capacity 0.75)
  (checks 1 and 2 for E-I, and 3 and 4 for F; the reference implements each from its
  definition at the top of test/moe_reference.py)
Checks:
  1. routing: the reference's own top-k equals the trainer's choices (a token where they differ
     must be a near tie, |p_k - p_k+1| < 1e-6, and then the reference takes the trainer's
     choices); in D every tie went to expert 1, and there was at least one
  2. the three loss terms (LM, aux, z) within 1e-6 relative of float64, and every parameter's
     gradient of LM + aux + z within 1e-5 relative (||g - g_ref|| / ||g_ref||, per tensor):
     about 10x the worst of 5 seeds x 4 cases, 8.5e-8 and 5.8e-7 (fp32 rounding)
  3. finite differences of the trainer's own loss (fp32 forward, per-token losses summed in
     float64; A, B, C): for each MoE layer, along unit directions within one tensor: the
     gradient's direction of the router and of each expert tensor, a random direction of the
     router, the largest-gradient element of the router and of the expert fc weight. The central
     difference L(W + eps d) - L(W - eps d) must equal g . (W+ - W-) (the realised fp32 step)
     within 2e-2 of it + 1e-6 (the fp32 loss' noise, ~1e-7 measured), at the largest eps of
     1e-2, 3e-3, 1e-3, 3e-4, 1e-4, 3e-5, 1e-5 at which no token's routing changes (a flip is a jump:
     the router's choice has no gradient; an expert weight of block 0 moves block 1's routing
     too). At most a quarter of the directions may find no such eps. The exact comparison is 2;
     this one checks the trainer's gradients against its own loss, with no reference.
  4. finite differences in float64 of the reference itself at fixed routing (eps 1e-6), on the
     largest-gradient element and a random one of each router and expert tensor: |fd - g| <=
     1e-6 max(|g|, 1e-2) (float64 round-off of the loss / eps is ~1e-9)
  5. identical experts (moe_every=1, top_k=2, d_expert = 4C, no aux or z term): every expert a
     copy of one MLP and any router give the dense model's LM loss within 1e-6 (the gates sum to
     1), its gradients of the shared tensors within 1e-5, the experts' gradients summed over the
     experts equal to the dense MLP's within 1e-5 (measured: loss bitwise, gradients 1.0e-6 and
     2.0e-7 over 5 seeds), and a router gradient ~0 (its norm < 5e-7, measured 4.5e-8, of
     the dense fc weight's)
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moe_reference as mref  # noqa: E402
from trainer import Checks, seeded_rng  # noqa: E402

BUILD = os.environ.get("BUILD", "build")
BIN = os.path.join(BUILD, "test_moe_grads")
checks = Checks("test_moe_grads")
torch.set_default_dtype(torch.float64)

BASE = dict(L=2, NH=4, C=24, T=8, V=61, E=4, top_k=2, moe_every=1, D=20, aux=0.05, z=0.01, B=2)
ROUTER_STD, EXPERT_STD, NOISE = 0.3, 0.1, 0.1
NAMES = {}  # tensor names and sizes in the harness's order, per config
EXPERT_TENSORS = ("experts/fc/weight", "experts/proj/weight", "experts/fc/bias",
                  "experts/proj/bias")


def parse(raw, names, E):
    """The harness's output file (test/test_moe_grads.cpp)."""
    at = 0

    def take(dtype, n):
        nonlocal at
        a = np.frombuffer(raw, dtype=dtype, count=n, offset=at)
        at += a.nbytes
        return a

    res = {}
    res["lm"], res["aux"], res["z"], res["fine"] = (float(x) for x in take(np.float64, 4))
    res["chosen"], res["probs"] = {}, {}
    for _ in range(int(take(np.int32, 1)[0])):
        layer, Nt, k = (int(x) for x in take(np.int32, 3))
        res["chosen"][layer] = take(np.int32, Nt * k).reshape(Nt, k).copy()
        res["probs"][layer] = take(np.float32, Nt * E).reshape(Nt, E).copy()
    total = sum(n for _, n in names)
    flat_w, flat_g = take(np.float32, total), take(np.float32, total)
    res["W"], res["G"], off = {}, {}, 0
    for name, n in names:
        res["W"][name], res["G"][name] = flat_w[off:off + n].copy(), flat_g[off:off + n].copy()
        off += n
    res["fd"] = []
    for _ in range(int(take(np.int32, 1)[0])):
        plus, minus, predicted = (float(x) for x in take(np.float64, 3))
        same = bool(take(np.int32, 1)[0])
        res["fd"].append((plus, minus, predicted, same))
    assert at == len(raw), f"{len(raw) - at} bytes left over"
    return res


def harness(tmp, cfg, tokens, seed, weights=None, dirs=None, eps=0.0):
    """One run of build/test_moe_grads: (names in dump order, parsed output). weights: {name:
    array} over the random init; dirs: a list of {name: array} directions (missing = 0)."""
    out = os.path.join(tmp, "out.bin")
    tok_path = os.path.join(tmp, "tokens.bin")
    tokens.astype(np.int32).tofile(tok_path)
    args = [BIN] + [str(cfg[k]) for k in ("L", "NH", "C", "T", "V", "E", "top_k", "moe_every",
                                          "D", "aux", "z")]
    args += [str(seed), str(cfg["B"]), tok_path, out]
    if weights is not None or dirs is not None:
        key = tuple(sorted((k, v) for k, v in cfg.items() if k not in ("bias", "bias_file")))
        if key not in NAMES:  # the order the harness reads them in
            NAMES[key] = harness(tmp, cfg, tokens, seed)[0]
        names = NAMES[key]
        wpath = "-"
        if weights is not None:
            wpath = os.path.join(tmp, "weights.bin")
            flat(weights, names).tofile(wpath)
        args.append(wpath)
        if dirs is not None:
            dpath = os.path.join(tmp, "dirs.bin")
            np.stack([flat(d, names) for d in dirs]).tofile(dpath)
            args += [dpath, repr(eps)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for key, var in (("S", "MOE_SHARED"), ("score", "MOE_SCORE"), ("capacity", "MOE_CAPACITY")):
        if cfg.get(key):
            env[var] = str(cfg[key])
    if cfg.get("bias_file"):
        env["MOE_BIAS"] = cfg["bias_file"]
    r = subprocess.run(args, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr + r.stdout
    names = [(ln.split()[0], int(ln.split()[1])) for ln in r.stdout.split("\n") if ln]
    return names, parse(open(out, "rb").read(), names, cfg["E"])


def flat(tensors, names):
    """{name: array} -> one fp32 vector in the harness's order (missing names: zeros)."""
    return np.concatenate([np.asarray(tensors[n], np.float32).ravel() if n in tensors
                           else np.zeros(k, np.float32) for n, k in names])


def spread(W, cfg, rng):
    """The init, with LayerNorms and biases perturbed, expert matrices N(0, EXPERT_STD) and
    routers N(0, ROUTER_STD)."""
    out = {}
    for name, w in W.items():
        w = w.copy()
        if "router" in name:
            w = ROUTER_STD * rng.standard_normal(w.shape)
        elif "experts/" in name and name.endswith("weight"):
            w = EXPERT_STD * rng.standard_normal(w.shape)
        elif name.endswith("bias"):
            w = w + NOISE * rng.standard_normal(w.shape)
        elif name.endswith("ln_1/weight") or name.endswith("ln_2/weight") or name == \
                "ln_f/weight":
            w = w + NOISE * rng.standard_normal(w.shape)
        out[name] = w.astype(np.float32)
    V, Vp, C = cfg["V"], (cfg["V"] + 127) // 128 * 128, cfg["C"]
    out["wte"].reshape(Vp, C)[V:] = 0
    return out


def torch_params(W, cfg):
    shapes = mref.param_shapes(cfg["L"], cfg["C"], cfg["T"], cfg["V"], cfg["E"], cfg["D"],
                               cfg["moe_every"], cfg.get("S", 0))
    assert set(shapes) == set(W), sorted(set(shapes) ^ set(W))
    return {n: torch.tensor(W[n].astype(np.float64).reshape(shapes[n]), requires_grad=True)
            for n in W}


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def reference(W, cfg, inputs, targets, trainer_choice):
    """The float64 loss terms and gradients; the routing agreed with the trainer's choices
    (returns the reference's own disagreements, each a near tie, or it says so)."""
    B, T, k = cfg["B"], cfg["T"], cfg["top_k"]
    P = torch_params(W, cfg)
    idx, tgt = torch.tensor(inputs, dtype=torch.long), torch.tensor(targets, dtype=torch.long)
    out = mref.moe_gpt_loss(P, idx, tgt, cfg)
    own, probs = out[4], out[5]
    trainer = {l: torch.tensor(c.reshape(B, T, k), dtype=torch.long)
               for l, c in trainer_choice.items()}
    disagree, far = 0, 0
    for l, ch in own.items():
        differ = (torch.sort(ch, -1).values != torch.sort(trainer[l], -1).values).any(-1)
        key = probs[l] + cfg["bias"][l] if cfg.get("bias") else probs[l]  # what chose
        for b, t in differ.nonzero().tolist():
            disagree += 1
            p = torch.sort(key[b, t], descending=True).values
            if k < cfg["E"] and p[k - 1] - p[k] >= 1e-6:
                far += 1
    if disagree:
        out = mref.moe_gpt_loss(P, idx, tgt, cfg, chosen=trainer)
    dropped = mref.moe_gpt_loss.dropped
    out[0].backward()
    grads = {n: p.grad.numpy().ravel() for n, p in P.items()}
    return dict(lm=out[1].item(), aux=float(out[2]), z=float(out[3]), grads=grads,
                disagree=disagree, far=far, P=P, idx=idx, tgt=tgt, chosen=own, dropped=dropped)


def moe_layers(cfg):
    return [l for l in range(cfg["L"]) if mref.is_moe(l, cfg["E"], cfg["moe_every"])]


def compare(label, got, want, cfg):
    checks.check(f"{label}: routing", want["far"] == 0,
                 f"the reference's top-{cfg['top_k']} differs from the trainer's on "
                 f"{want['disagree']} token(s), {want['far']} of them not a near tie")
    terms = [(t, abs(got[t] - want[t]) / abs(want[t])) for t in ("lm", "aux", "z")]
    checks.check(f"{label}: loss terms", all(e < 1e-6 for _, e in terms),
                 ", ".join(f"{t} {got[t]:.7g} vs {want[t]:.7g} (rel {e:.1e})" for t, e in terms))
    errs = sorted(((rel(got["G"][n], want["grads"][n]), n) for n in got["G"]), reverse=True)
    moe = [e for e in errs if "mlp/router" in e[1] or "mlp/experts" in e[1] or
           "mlp/shared" in e[1]]
    checks.check(f"{label}: gradients", errs[0][0] < 1e-5,
                 f"{len(errs)} tensors, worst rel err {errs[0][0]:.1e} ({errs[0][1]}); worst "
                 f"router/expert {moe[0][0]:.1e} ({moe[0][1]})")
    return errs[0][0]


FD_EPS = (1e-2, 3e-3, 1e-3, 3e-4, 1e-4, 3e-5, 1e-5)  # tried in turn until the routing holds at W +- eps d


def fd_directions(G, cfg, rng):
    """(label, unit direction) pairs for the trainer's finite differences."""
    out = []
    for l in moe_layers(cfg):
        h = f"h.{l}/mlp/"
        for t in ("router/weight",) + EXPERT_TENSORS:
            g = G[h + t].astype(np.float64)
            out.append((f"h.{l} {t} along its gradient", {h + t: g / np.linalg.norm(g)}))
        r = rng.standard_normal(G[h + "router/weight"].shape)
        out.append((f"h.{l} router/weight random", {h + "router/weight": r / np.linalg.norm(r)}))
        for t in ("router/weight", "experts/fc/weight"):
            e = np.zeros_like(G[h + t], dtype=np.float64)
            e[np.argmax(np.abs(G[h + t]))] = 1
            out.append((f"h.{l} {t} largest element", {h + t: e}))
    return out


def finite_differences(tmp, label, cfg, tokens, seed, W, G, rng):
    """Central differences of the trainer's loss along each direction, at the largest step of
    FD_EPS that changes no token's routing (a router choice flipping is a jump in the loss)."""
    todo = fd_directions(G, cfg, rng)
    results = {}
    for eps in FD_EPS:
        pending = [d for d in todo if d[0] not in results]
        if not pending:
            break
        _, res = harness(tmp, cfg, tokens, seed, weights=W, dirs=[d[1] for d in pending],
                         eps=eps)
        for (name, _), (plus, minus, predicted, same) in zip(pending, res["fd"]):
            if same:
                err = abs((plus - minus) - predicted)
                results[name] = (err / (2e-2 * abs(predicted) + 1e-6), err / abs(predicted), eps)
    skipped = [d[0] for d in todo if d[0] not in results]
    worst = max(results.values())
    checks.check(f"{label}: finite differences of the trainer's loss",
                 worst[0] <= 1 and len(skipped) <= len(todo) // 4,
                 f"{len(results)} directions, worst |fd - g.dW| / (2e-2 |g.dW| + 1e-6) "
                 f"{worst[0]:.2f} (rel err {worst[1]:.1e} at eps {worst[2]:g})"
                 + (f"; routing changed at every eps along {skipped}" if skipped else ""))


def reference_fd(label, want, cfg, rng):
    """Elementwise central differences of the float64 reference at fixed routing: in each MoE
    layer's router and expert tensors, the largest-gradient element and a random one."""
    P, idx, tgt = want["P"], want["idx"], want["tgt"]
    worst, n, eps = 0.0, 0, 1e-6
    with torch.no_grad():
        for l in moe_layers(cfg):
            h = f"h.{l}/mlp/"
            for t in ("router/weight",) + EXPERT_TENSORS:
                p = P[h + t]
                flat_grad = p.grad.reshape(-1)
                for i in (int(torch.argmax(flat_grad.abs())), int(rng.integers(0, p.numel()))):
                    old = p.view(-1)[i].item()
                    vals = []
                    for s in (1, -1):
                        p.view(-1)[i] = old + s * eps
                        out = mref.moe_gpt_loss(P, idx, tgt, cfg)
                        assert all(torch.equal(out[4][m], want["chosen"][m]) for m in out[4])
                        vals.append(out[0].item())
                    p.view(-1)[i] = old
                    g = flat_grad[i].item()
                    fd = (vals[0] - vals[1]) / (2 * eps)
                    worst, n = max(worst, abs(fd - g) / max(abs(g), 1e-2)), n + 1
    checks.check(f"{label}: float64 reference vs its finite differences", worst < 1e-6,
                 f"{n} router and expert elements, worst |fd - g| / max(|g|, 1e-2) {worst:.1e}")


def plant_bias(tmp, cfg, rng):
    """Random balancing biases (N(0, 0.3), comparable to the scores' spread) for every layer,
    as the harness's file and as the reference's {layer: tensor}."""
    L, E = cfg["L"], cfg["E"]
    b = (0.3 * rng.standard_normal((L, E))).astype(np.float32)
    cfg["bias_file"] = os.path.join(tmp, "bias.bin")
    b.tofile(cfg["bias_file"])
    cfg["bias"] = {l: torch.tensor(b[l].astype(np.float64)) for l in range(L)}


def run_case(tmp, label, cfg, rng, tie=False, fd=True, overflow=False):
    seed = int(rng.integers(1, 2**31))
    B, T, V = cfg["B"], cfg["T"], cfg["V"]
    inputs = rng.integers(0, V, size=(B, T))
    targets = rng.integers(0, V, size=(B, T))
    tokens = np.concatenate([inputs.ravel(), targets.ravel()])
    if cfg.get("bias") == "random":
        plant_bias(tmp, cfg, rng)
    _, init = harness(tmp, cfg, tokens, seed)
    W = spread(init["W"], cfg, rng)
    if tie:  # z_1 = z_2 = (z_0 + z_3) / 2: between the two, so the 2nd and 3rd best tie
        for l in moe_layers(cfg):
            r = W[f"h.{l}/mlp/router/weight"].reshape(cfg["E"], cfg["C"])
            r[1] = r[2] = (r[0] + r[3]) / 2
    _, got = harness(tmp, cfg, tokens, seed, weights=W)
    want = reference(W, cfg, inputs, targets, got["chosen"])
    compare(label, got, want, cfg)
    if cfg.get("bias"):  # the biases must have changed some choice, else this tests nothing
        changed = 0
        for l in moe_layers(cfg):
            p = torch.tensor(got["probs"][l].astype(np.float64))
            plain = torch.sort(mref.choose(p, cfg["top_k"]), -1).values
            changed += int((plain != torch.sort(torch.tensor(got["chosen"][l]), -1).values)
                           .any(-1).sum())
        checks.check(f"{label}: the biases moved choices", changed > 0,
                     f"{changed} token(s) chose otherwise than by the scores alone")
    if overflow:  # a factor below 1 leaves room for fewer pairs than there are: drops for sure
        checks.check(f"{label}: the capacity dropped pairs", want["dropped"] > 0,
                     f"{want['dropped']} pairs over capacity dropped (float64 reference)")
    if tie:
        ties = wrong = 0
        for l in moe_layers(cfg):
            p, ch = got["probs"][l], got["chosen"][l]
            for n in range(B * T):
                picked = set(ch[n].tolist())
                if p[n, 1] == p[n, 2] and (1 in picked) != (2 in picked):
                    ties += 1
                    wrong += 2 in picked
        checks.check(f"{label}: exact ties go to the lower index", ties > 0 and wrong == 0,
                     f"{ties} tied tokens, {wrong} sent to expert 2 instead of 1")
    if fd:
        finite_differences(tmp, label, cfg, tokens, seed, W, got["G"], rng)
        reference_fd(label, want, cfg, rng)


def identical_experts(tmp, rng):
    """Every expert a copy of one MLP: the dense model's loss and gradients."""
    C = BASE["C"]
    moe = dict(BASE, D=4 * C, aux=0.0, z=0.0, moe_every=1)
    dense = dict(moe, E=0)
    seed = int(rng.integers(1, 2**31))
    B, T, V, E = moe["B"], moe["T"], moe["V"], moe["E"]
    inputs, targets = rng.integers(0, V, size=(B, T)), rng.integers(0, V, size=(B, T))
    tokens = np.concatenate([inputs.ravel(), targets.ravel()])
    _, dinit = harness(tmp, dense, tokens, seed)
    Wd = spread(dinit["W"], dense, rng)
    _, d = harness(tmp, dense, tokens, seed, weights=Wd)
    _, minit = harness(tmp, moe, tokens, seed)
    Wm = {}
    for name, w in minit["W"].items():
        if name in Wd:
            Wm[name] = Wd[name]
        elif "router" in name:
            Wm[name] = (ROUTER_STD * rng.standard_normal(w.shape)).astype(np.float32)
        else:  # h.<l>/mlp/experts/<fc|proj>/<weight|bias>: E copies of the dense tensor
            Wm[name] = np.tile(Wd[name.replace("experts/", "")], E)
    _, m = harness(tmp, moe, tokens, seed, weights=Wm)
    r = abs(m["lm"] - d["lm"]) / abs(d["lm"])
    checks.check("identical experts: the dense model's loss", r < 1e-6,
                 f"{m['lm']:.8f} vs dense {d['lm']:.8f} (rel {r:.1e})")
    shared = max((rel(m["G"][n], d["G"][n]), n) for n in d["G"] if n in m["G"])
    summed = max((rel(m["G"][n].reshape(E, -1).sum(0), d["G"][n.replace("experts/", "")]), n)
                 for n in m["G"] if "experts/" in n)
    router = max(np.linalg.norm(m["G"][f"h.{l}/mlp/router/weight"]) /
                 np.linalg.norm(d["G"][f"h.{l}/mlp/fc/weight"]) for l in range(moe["L"]))
    checks.check("identical experts: the dense model's gradients",
                 shared[0] < 1e-5 and summed[0] < 1e-5 and router < 5e-7,
                 f"shared tensors worst rel err {shared[0]:.1e} ({shared[1]}), experts summed "
                 f"{summed[0]:.1e} ({summed[1]}), router/fc gradient norms {router:.1e}")


def main():
    rng = seeded_rng("test_moe_grads")
    with tempfile.TemporaryDirectory() as tmp:
        run_case(tmp, "A: L=2 all MoE, top_k=2", dict(BASE), rng)
        run_case(tmp, "B: dense + MoE, top_k=1", dict(BASE, moe_every=2, top_k=1), rng)
        run_case(tmp, "C: E=6, top_k=3", dict(BASE, E=6, top_k=3), rng)
        run_case(tmp, "D: exact router ties", dict(BASE), rng, tie=True, fd=False)
        run_case(tmp, "E: 2 shared experts", dict(BASE, S=2), rng, fd=False)
        run_case(tmp, "F: sigmoid scores, E=6, top_k=3", dict(BASE, E=6, top_k=3,
                                                              score="sigmoid"), rng)
        run_case(tmp, "G: balancing biases choose", dict(BASE, bias="random"), rng, fd=False)
        run_case(tmp, "H: capacity 0.5 drops", dict(BASE, capacity=0.5), rng, fd=False,
                 overflow=True)
        run_case(tmp, "I: fine-grained E=16 top_k=8, all of E-H",
                 dict(BASE, E=16, top_k=8, D=6, S=1, score="sigmoid", bias="random",
                      capacity=0.75), rng, fd=False, overflow=True)
        identical_experts(tmp, rng)
    checks.report()


if __name__ == "__main__":
    main()
