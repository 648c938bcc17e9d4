"""test/test_model.py - the whole GPT-2 of the CPU backend against PyTorch float64.

One forward + backward of build/test_model_grads (the trainer's model code on the CPU backend)
on a random llm.c model file and random tokens, compared with test/gpt2_reference.py:
  fp32:  loss within 1e-6 relative, every parameter's gradient ||g - g_ref|| / ||g_ref|| < 1e-5
  recompute "gelu" and "block": bitwise equal to no recompute
  the head over token chunks (default: a quarter of the tokens; and 7, dividing no N here) equal
  to one chunk of all tokens within fp32 rounding (1.5e-6 relative), fp32 and bf16
  bf16:  (emulated bf16 storage) loss within 7e-4 relative, each gradient within 5e-2
Tolerances are about 10x the worst measured over 16 cases (8 seeds x the two shapes): fp32 loss
1.1e-7, gradients 1.1e-6; bf16 loss 7.3e-5, gradients 1.6e-2 (bf16 keeps 8 bits: a LayerNorm
weight's gradient sums N products each rounded at 2^-8, so 5e-2 is 3x, not 10x, the worst).
  the padded rows of wte receive no gradient
Awkward shapes on purpose: C = 36 (not a multiple of 8), 3 heads of 12, V = 101 (Vp = 128),
B = 3, T = 13, and a second case with T = 1. Fresh random weights and tokens each run.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference as ref  # noqa: E402

BUILD = os.environ.get("BUILD", "build")
BIN = os.path.join(BUILD, "test_model_grads")
failures = []


def check(name, ok, detail):
    print(f"  {'ok  ' if ok else 'FAIL'} {name}: {detail}")
    if not ok:
        failures.append(name)


# The chunked head differs from one chunk of all tokens only in the order the output weight's
# gradient sums its chunks' fp32 products: measured at most 1.3e-7 relative over all gradients
# (8 seeds, both cases; the loss bitwise equal); the tolerance is 10x that.
HEAD_CHUNK_TOL = 1.5e-6


def head_chunk_default(N):
    """model/gpt_head.cu's choice (head_chunk_tokens): N/4, down to a multiple of 8 from 8 up."""
    q = N // 4
    return q // 8 * 8 if q >= 8 else max(1, q)


def run_case(tmp, L, NH, C, T, V, B, rng):
    Vp = ref.padded_vocab(V)
    params = ref.random_params(L, C, T, V, rng)
    model_path = os.path.join(tmp, "model.bin")
    ref.write_model(model_path, params, L, NH, C, T, V)
    inputs = rng.integers(0, V, size=(B, T)).astype(np.int32)
    targets = rng.integers(0, V, size=(B, T)).astype(np.int32)
    tok_path = os.path.join(tmp, "tokens.bin")
    np.concatenate([inputs.ravel(), targets.ravel()]).tofile(tok_path)

    P, cfg = ref.read_model(model_path)
    P = {k: v.requires_grad_(True) for k, v in P.items()}
    loss = ref.gpt2_loss(P, torch.tensor(inputs, dtype=torch.long),
                         torch.tensor(targets, dtype=torch.long), L, NH, V)
    loss.backward()

    def run(dtype, recompute, head_chunk=0):
        out = os.path.join(tmp, f"grads_{dtype}_{recompute}.bin")
        chunk = [str(head_chunk)] if head_chunk else []
        r = subprocess.run([BIN, model_path, tok_path, str(B), str(T), dtype, recompute, out]
                           + chunk, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        names = [(ln.split()[0], int(ln.split()[1])) for ln in r.stdout.split("\n") if ln]
        raw = open(out, "rb").read()
        got_loss = np.frombuffer(raw[:8], dtype=np.float64)[0]
        flat = np.frombuffer(raw[8:], dtype=np.float32)
        grads, off = {}, 0
        for name, n in names:
            grads[name] = flat[off:off + n]
            off += n
        return got_loss, grads, flat

    print(f"case L={L} NH={NH} C={C} T={T} V={V} (Vp={Vp}) B={B}")
    loss32, grads32, flat32 = run("fp32", "none")
    rel = abs(loss32 - loss.item()) / abs(loss.item())
    check("fp32 loss", rel < 1e-6, f"{loss32:.8f} vs torch {loss.item():.8f} (rel {rel:.2e})")
    worst = max(
        (np.linalg.norm(grads32[n] - P[n].grad.numpy().ravel()) /
         np.linalg.norm(P[n].grad.numpy().ravel()), n) for n in grads32)
    check("fp32 gradients", worst[0] < 1e-5,
          f"{len(grads32)} tensors, worst rel err {worst[0]:.2e} ({worst[1]})")
    check("padded wte rows", np.all(grads32["wte"].reshape(Vp, C)[V:] == 0),
          "no gradient reaches rows >= V")

    for recompute in ("gelu", "block"):
        loss_r, _, flat_r = run("fp32", recompute)
        check(f"recompute {recompute}", loss_r == loss32 and np.array_equal(flat_r, flat32),
              "bitwise equal to recompute none")

    # The head over token chunks (model/gpt_head.cu; the runs above use its default, a quarter of
    # the tokens) against one chunk of all N tokens and a chunk of 7, which divides no N here.
    N = B * T
    for dtype in ("fp32", "bf16"):
        loss_d, _, flat_d = run(dtype, "none")
        loss_w, _, flat_w = run(dtype, "none", head_chunk=N)
        loss_7, _, flat_7 = run(dtype, "none", head_chunk=7)
        scale = np.linalg.norm(flat_w)
        err = max(np.linalg.norm(flat_d - flat_w), np.linalg.norm(flat_7 - flat_w)) / scale
        lerr = max(abs(loss_d - loss_w), abs(loss_7 - loss_w)) / abs(loss_w)
        check(f"{dtype} head chunks", err < HEAD_CHUNK_TOL and lerr < HEAD_CHUNK_TOL,
              f"chunk {head_chunk_default(N)}, 7 vs one chunk of {N}: gradients rel {err:.1e}, "
              f"loss rel {lerr:.1e}")

    loss16, grads16, _ = run("bf16", "none")
    rel16 = abs(loss16 - loss.item()) / abs(loss.item())
    check("bf16 loss", rel16 < 7e-4, f"{loss16:.6f} vs {loss.item():.6f} (rel {rel16:.2e})")
    worst16 = max(
        (np.linalg.norm(grads16[n] - P[n].grad.numpy().ravel()) /
         np.linalg.norm(P[n].grad.numpy().ravel()), n) for n in grads16)
    check("bf16 gradients", worst16[0] < 5e-2,
          f"worst rel err {worst16[0]:.2e} ({worst16[1]})")


def main():
    seed = int(os.environ.get("SEED", np.random.SeedSequence().entropy % (2**32)))
    print(f"test_model: seed {seed} (SEED={seed} reproduces)")
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        run_case(tmp, L=2, NH=3, C=36, T=13, V=101, B=3, rng=rng)
        run_case(tmp, L=1, NH=2, C=16, T=1, V=300, B=2, rng=rng)
    if failures:
        print(f"test_model: {len(failures)} FAILED: {', '.join(failures)}")
        sys.exit(1)
    print("test_model: all passed")


if __name__ == "__main__":
    main()
