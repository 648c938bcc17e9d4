#!/usr/bin/python3
"""test/test_moe_router.py - the mixture-of-experts router ops of the CPU backend
(moe_router_forward, moe_router_backward; contracts in kernels/ops_decls.h) against PyTorch
float64, the backward with the load-balancing gradient and the z-loss on.

Inputs: router logits z (N, E), random normal times 2, rounded to fp32 (the reference starts from
the same fp32 values, in float64). Rows are redrawn until no two logits of a row lie within 1e-3
of each other (no near-ties), and then row 0 gets a deliberate exact tie at the top (experts 0
and E-1 share the row's largest logit) to check that a tie goes to the lower index. Sizes:
E in {3, 8, 13}, top_k in {1, 2, 3} (top_k <= E), (B sequences, T tokens) in {(1, 1), (1, 37),
(3, 13)}, and one case large enough to run on several threads (B = 8, T = 512, E = 16,
top_k = 2). Fresh random inputs every run (the seed is printed; MOE_SEED=<n> repeats a run).

The reference, in float64 with autograd: p = softmax(z), lse = logsumexp(z), the top_k experts by
p in decreasing order (ties: lower index first), gates p / (sum of the chosen p) when top_k > 1 or
the raw p; f_{s,e} = slots of sequence s routed to e / (T top_k) (a constant), P_{s,e} = mean of
p_e over s, aux = mean_s E sum_e f P; the loss
    L = sum(gate * w) + aux_coef * aux + z_coef * mean_n lse^2       (w random)
and dL/dz by autograd. The ops get dgate = w, z_coef / N and dprobs_aux, the balance gradient,
made here in numpy from the op's own expert choices by the formula of kernels/ops_decls.h (the
one model/moe.cu's `balance` uses on the host, where a sequence's counts are summed over the
context-parallel and sequence-parallel ranks first):
    dprobs_aux[t,e] = aux_coef * E * f_{s(t),e} / (T * B)

Checks (relative error ||got - ref|| / ||ref||; outputs poisoned with NaN first):
  expert                  exactly the reference's choice (and order), tie row included
  gate, probs, lse        1e-6
  dprobs_aux              1e-6: the numpy formula above against autograd of aux_coef * aux
                          w.r.t. p (p as a leaf)
  dlogits                 1e-5 against autograd of L w.r.t. z (also with no aux and no z-loss)
  determinism             a second call, and a call on 1 OpenMP thread, give the same bits

Run: /usr/bin/python3 test/test_moe_router.py   (OPS_LIB overrides build/libops_cpu.so; exit
status 1 on failure)
"""
import ctypes
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from opslib import BUILD, LIB, Fl, I, P, Tally, load, rel_err  # noqa: E402,F401

report = Tally()
close = report.close


def load_library(path):
    return load(path, {"op_moe_router_forward": [P, I, I, I, P, P, P, P],
                       "op_moe_router_backward": [P, P, P, P, P, P, P, Fl, I, I, I],
                       "op_set_num_threads": [I]})


def ptr(a):
    return None if a is None else a.ctypes.data


def poisoned(n, dtype=np.float32):
    a = np.empty(n, dtype=dtype)
    a.view(np.uint8).fill(0xFF)  # NaN in fp32, -1 in int32
    return a


def random_logits(N, E):
    """fp32 logits, no two of a row within 1e-3, then an exact tie at the top of row 0."""
    z = np.empty((N, E), np.float32)
    for n in range(N):
        while True:
            row = (torch.randn(E, dtype=torch.float64) * 2).float().numpy()
            gaps = np.abs(row[:, None] - row[None, :]) + np.eye(E) * 1e9
            if gaps.min() > 1e-3:
                break
        z[n] = row
    if E > 1:
        z[0, 0] = z[0, E - 1] = z[0].max() + 1.0  # above every other logit: a tie of two
    return z


def reference_choice(p, top_k):
    """Top-k experts by float64 p, decreasing, ties to the lower index."""
    return np.array([sorted(range(p.shape[1]), key=lambda e: (-p[n, e], e))[:top_k]
                     for n in range(p.shape[0])], dtype=np.int32)


def balance_grad(expert, B, T, E, top_k, aux_coef):
    """dprobs_aux (N*E, fp32) from the chosen experts: aux_coef * E * f_{s,e} / (T * B), the same
    for every token of sequence s; f_{s,e} = slots of s choosing e / (T * top_k)."""
    counts = np.zeros((B, E))
    np.add.at(counts, (np.repeat(np.arange(B), T * top_k), expert.astype(np.int64)), 1)
    f = counts / (T * top_k)
    return np.repeat(aux_coef * E * f / (T * B), T, axis=0).astype(np.float32).ravel()


def run_ops(lib, z, B, T, E, top_k, aux_coef, z_coef):
    N = B * T
    ex, gate = poisoned(N * top_k, np.int32), poisoned(N * top_k)
    probs, lse = poisoned(N * E), poisoned(N)
    lib.op_moe_router_forward(ptr(z), N, E, top_k, ptr(ex), ptr(gate), ptr(probs), ptr(lse))
    dpa = balance_grad(ex, B, T, E, top_k, aux_coef) if aux_coef != 0 else None
    w = np.random.default_rng(N * 131 + E * 7 + top_k).standard_normal(N * top_k).astype(np.float32)
    dz = poisoned(N * E)
    lib.op_moe_router_backward(ptr(dz), ptr(probs), ptr(ex), ptr(gate), ptr(w), ptr(dpa), ptr(lse),
                               z_coef / N, N, E, top_k)
    return dict(expert=ex, gate=gate, probs=probs, lse=lse, dprobs_aux=dpa, dlogits=dz, w=w)


def reference(z32, B, T, E, top_k, w, aux_coef, z_coef):
    N = B * T
    z = torch.from_numpy(z32.astype(np.float64)).requires_grad_()
    p = torch.softmax(z, dim=1)
    lse = torch.logsumexp(z, dim=1)
    chosen = reference_choice(p.detach().numpy(), top_k)
    idx = torch.from_numpy(chosen.astype(np.int64))
    g = p.gather(1, idx)
    if top_k > 1:
        g = g / g.sum(dim=1, keepdim=True)
    counts = np.zeros((B, E))
    for n in range(N):
        for e in chosen[n]:
            counts[n // T, e] += 1
    f = torch.from_numpy(counts / (T * top_k))

    def aux_of(probs):
        return (E * (f * probs.view(B, T, E).mean(dim=1)).sum(dim=1))  # (B,)

    aux_s = aux_of(p)
    wt = torch.from_numpy(w.astype(np.float64)).view(N, top_k)
    loss = (g * wt).sum() + aux_coef * aux_s.mean() + z_coef * (lse ** 2).mean()
    loss.backward()
    p_leaf = p.detach().clone().requires_grad_()
    (aux_coef * aux_of(p_leaf).mean()).backward()
    return dict(expert=chosen, gate=g.detach().numpy(), probs=p.detach().numpy(),
                lse=lse.detach().numpy(), dprobs_aux=p_leaf.grad.numpy(), dlogits=z.grad.numpy())


def check_case(lib, B, T, E, top_k, aux_coef, z_coef):
    N = B * T
    z = random_logits(N, E)
    got = run_ops(lib, z, B, T, E, top_k, aux_coef, z_coef)
    ref = reference(z, B, T, E, top_k, got["w"], aux_coef, z_coef)
    name = f"B={B} T={T} E={E} top_k={top_k} aux={aux_coef} z={z_coef}"
    report(np.array_equal(got["expert"].reshape(N, top_k), ref["expert"]),
           f"{name} experts exactly the float64 choice")
    if E > 1 and top_k >= 2:
        report(list(got["expert"][:2]) == [0, E - 1], f"{name} tie row 0: experts 0 then {E - 1}")
    elif E > 1:
        report(got["expert"][0] == 0, f"{name} tie row 0: expert 0 (the lower index)")
    for key in ("gate", "probs", "lse"):
        close(f"{name} {key}", got[key].ravel(), ref[key].ravel(), 1e-6)
    if aux_coef != 0:
        close(f"{name} dprobs_aux (numpy formula)", got["dprobs_aux"], ref["dprobs_aux"].ravel(),
              1e-6)
    close(f"{name} dlogits", got["dlogits"], ref["dlogits"].ravel(), 1e-5)
    return z, got


def check_determinism(lib, z, B, T, E, top_k, first):
    again = run_ops(lib, z, B, T, E, top_k, 0.01, 0.001)
    lib.op_set_num_threads(1)
    one = run_ops(lib, z, B, T, E, top_k, 0.01, 0.001)
    lib.op_set_num_threads(2)
    same = all(np.array_equal(first[k].view(np.uint8), again[k].view(np.uint8)) and
               np.array_equal(first[k].view(np.uint8), one[k].view(np.uint8))
               for k in first if first[k] is not None)
    report(same, f"B={B} T={T} E={E} top_k={top_k}: same bits on a second call and on 1 thread")


def main():
    seed = int(os.environ.get("MOE_SEED", np.random.SeedSequence().entropy % (1 << 31)))
    print(f"test_moe_router: seed {seed} (MOE_SEED={seed} repeats this run)")
    torch.manual_seed(seed)
    lib = load_library(LIB)
    for E in (3, 8, 13):
        for top_k in (1, 2, 3):
            for B, T in ((1, 1), (1, 37), (3, 13)):
                z, got = check_case(lib, B, T, E, top_k, 0.01, 0.001)
                if (B, T) == (3, 13):
                    check_determinism(lib, z, B, T, E, top_k, got)
    for E, top_k in ((8, 2), (13, 1)):  # no aux loss (dprobs_aux = nullptr), no z-loss
        check_case(lib, 3, 13, E, top_k, 0.0, 0.0)
    # Large z-loss and aux coefficients, so that a wrong term in either shows clearly.
    check_case(lib, 3, 13, 8, 2, 1.0, 1.0)
    # Large enough for the ops' OpenMP loops to run in parallel (N*E > CPU_PARALLEL_MIN).
    z, got = check_case(lib, 8, 512, 16, 2, 0.01, 0.001)
    check_determinism(lib, z, 8, 512, 16, 2, got)
    report.finish("test_moe_router")


if __name__ == "__main__":
    main()
