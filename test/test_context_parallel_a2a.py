"""test/test_context_parallel_a2a.py - [parallel] cp_comm = "all-to-all" (Ulysses) and "hybrid"
(all-to-all inside groups of cp_a2a ranks, the ring across them) against the one-rank run.

Tiny models (L = 2, 4 query heads, C = 32, T = 16), 10 steps at lr 1e-3, global batch 4
sequences, random init; the one-rank run with the same batch is the reference.
1. GPT-2: all-to-all at cp 2 and 4, hybrid cp 4 x cp_a2a 2, all-to-all with tp 2 x cp 2 (SP),
   pp 2 x cp 2, dp 2 x cp 2 FSDP, and MoE (4 experts, top 2, ep 2) at cp 2: per-step losses and
   gradient norms, the validation loss within 3e-6 relative (test_context_parallel.py's
   tolerance: fp32 sums in another order), the sampled tokens identical.
2. Llama (grouped-query attention, 2 kv heads, RoPE): all-to-all at cp 2 (one kv head per rank),
   cp 4 (fewer kv heads than ranks: each rank gets a copy of its kv head, whose gradients are
   summed), hybrid cp 4 x 2, tp 2 x cp 2 (one kv head per tp rank: copied) within 3e-6.
3. Communication per step on rank 0 equals the analytic bytes of the header of
   parallel/context_parallel_a2a.cu exactly: per layer, with N = B T/cp tokens, C query
   channels and K sent kv channels, all-to-alls of 3 N (C + 2K) + 3 N C elements in 6 calls on
   the cp axis (cp-a2a under hybrid, with the ring's transfers of K/a kv channels at degree
   cp/cp_a2a on cp-ring); nothing else on cp.
4. Refused before any work, naming the keys and the rule: cp_a2a not dividing cp, cp_a2a without
   "hybrid", query heads not divisible by the all-to-all degree, kv heads and the degree not
   dividing one another, an unknown cp_comm.
(Packed documents under both modes: test/test_documents.py; the planner: test/test_plan.py.)
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainer import (Checks, base_sections, check_refused, compare_runs,  # noqa: E402
                     make_experiment, read_metrics, run, seeded_rng, with_validation,
                     write_config)

checks = Checks("test_context_parallel_a2a")
L, NH, NKV, C, T, V = 2, 4, 2, 32, 16, 101
HS = C // NH
GLOBAL_ROWS, STEPS = 4, 10
LAYOUT_TOL = 3e-6  # as test_context_parallel.py: fp32 sums in another order only


def model(arch, moe=False):
    m = {"n_layer": L, "n_head": NH, "d_model": C, "seq_len": T, "vocab_size": V}
    if arch == "llama":
        m.update({"arch": "llama", "n_kv_head": NKV})
    if moe:
        m.update({"n_experts": 4, "top_k": 2})
    return m


def train(tmp, name, arch="gpt2", moe=False, **par):
    dp = par.get("dp", 1)
    sec = base_sections(tmp, STEPS, micro_batch=GLOBAL_ROWS // dp, seed=99)
    del sec["init"]
    sec["model"] = model(arch, moe)
    sec["parallel"] = dict(par)
    sec["log"]["metrics"] = os.path.join(tmp, f"{name}.jsonl")
    sec["log"].update({"sample_every": STEPS, "sample_tokens": 8})
    with_validation(sec, tmp, STEPS, 2)
    world = dp * par.get("tp", 1) * par.get("pp", 1) * par.get("cp", 1)
    r = run(write_config(tmp, f"{name}.toml", sec), np_ranks=world if world > 1 else 0)
    steps, vals = read_metrics(sec["log"]["metrics"])
    sample = r.stdout.split("| sample:\n")[-1].split("\n---")[0]
    return steps, vals, sample


def a2a_elems(a, N, Cq, K):
    """The all-to-all's elements per layer (forward and backward), the header's formula."""
    return 3 * N * (Cq + 2 * K) + 3 * N * Cq


def expected_comm(arch, cp, a, B=GLOBAL_ROWS):
    """Rank 0's per-step counters of the all-to-all (and the hybrid's ring), fp32."""
    nkv = NKV if arch == "llama" else NH
    N = B * T // cp
    K = nkv * HS if nkv % a == 0 else a * HS  # the kv channels sent: split, or one copy each
    want = {"all_to_all": {"calls": 6 * L, "bytes": 4 * L * a2a_elems(a, N, C, K)}}
    if a == cp:
        return {"cp": want}
    R = cp // a
    kv_ring = (nkv // a if nkv % a == 0 else 1) * HS  # the ring's kv channels per rank
    kv = B * (T // R) * 2 * kv_ring  # K and V of the ring rank's two ring chunks
    calls = L * (2 * (R - 1) + R)
    ring = L * (2 * (R - 1) * kv * 4 + R * kv * 4)
    return {"cp-a2a": want, "cp-ring": {"send": {"calls": calls, "bytes": ring},
                                        "recv": {"calls": calls, "bytes": ring}}}


def check_comm(what, got, arch, cp, a):
    want = expected_comm(arch, cp, a)
    axes = ("cp", "cp-a2a", "cp-ring")
    comm = [{k: s["comm"][k] for k in axes if k in s["comm"]} for s in got[0]]
    checks.check(f"{what}: comm per step", all(c == want for c in comm),
                 f"{comm[0]} (analytic {want})")


def test_gpt2(tmp):
    ref = train(tmp, "one")
    a2a = {"cp_comm": "all-to-all"}
    for cp in (2, 4):
        got = train(tmp, f"a2a_cp{cp}", cp=cp, **a2a)
        compare_runs(checks, f"gpt2 all-to-all cp={cp}", got, ref, LAYOUT_TOL)
        check_comm(f"gpt2 all-to-all cp={cp}", got, "gpt2", cp, cp)
    got = train(tmp, "hybrid_cp4", cp=4, cp_comm="hybrid", cp_a2a=2)
    compare_runs(checks, "gpt2 hybrid cp=4 cp_a2a=2", got, ref, LAYOUT_TOL)
    check_comm("gpt2 hybrid cp=4 cp_a2a=2", got, "gpt2", 4, 2)
    for what, name, kw in [("tp2 x cp2 sp", "tp2cp2", {"tp": 2}),
                           ("pp2 x cp2", "pp2cp2", {"pp": 2}),
                           ("dp2 x cp2 FSDP", "dp2cp2", {"dp": 2, "fsdp": True})]:
        compare_runs(checks, f"gpt2 all-to-all {what}",
                     train(tmp, f"a2a_{name}", cp=2, **kw, **a2a), ref, LAYOUT_TOL)
    moe_ref = train(tmp, "moe_one", moe=True)
    compare_runs(checks, "gpt2 MoE all-to-all cp=2 ep=2",
                 train(tmp, "moe_a2a_cp2", moe=True, cp=2, ep=2, **a2a), moe_ref, LAYOUT_TOL)


def test_llama(tmp):
    ref = train(tmp, "llama_one", "llama")
    for cp in (2, 4):
        got = train(tmp, f"llama_a2a_cp{cp}", "llama", cp=cp, cp_comm="all-to-all")
        what = f"llama all-to-all cp={cp}" + (" (kv heads copied)" if cp > NKV else "")
        compare_runs(checks, what, got, ref, LAYOUT_TOL)
        check_comm(what, got, "llama", cp, cp)
    compare_runs(checks, "llama hybrid cp=4 cp_a2a=2",
                 train(tmp, "llama_hybrid", "llama", cp=4, cp_comm="hybrid", cp_a2a=2), ref,
                 LAYOUT_TOL)
    compare_runs(checks, "llama all-to-all tp2 x cp2 sp (kv heads copied)",
                 train(tmp, "llama_tp2cp2", "llama", cp=2, tp=2, cp_comm="all-to-all"), ref,
                 LAYOUT_TOL)


def refused(tmp, what, np_ranks, par, words, **m):
    sec = base_sections(tmp, 2)
    del sec["init"]
    sec["model"] = {**model("gpt2"), **m}
    sec["parallel"] = par
    check_refused(checks, tmp, what, sec, np_ranks, words)


def test_refused(tmp):
    refused(tmp, "cp_a2a not dividing cp", 4, {"cp": 4, "cp_comm": "hybrid", "cp_a2a": 3},
            ["[parallel] cp_a2a = 3", "does not divide", "[parallel] cp = 4", "hybrid"])
    refused(tmp, "cp_a2a without hybrid", 2, {"cp": 2, "cp_a2a": 2},
            ["[parallel] cp_a2a = 2", "cp_comm = \"ring\"", "hybrid"])
    refused(tmp, "query heads not divisible by the all-to-all degree", 4,
            {"cp": 4, "cp_comm": "all-to-all"},
            ["cp_comm = \"all-to-all\"", "cp = 4 does not divide n_head/tp = 2",
             "[model] n_head = 2", "[parallel] tp = 1", "[parallel] cp = 4"], n_head=2)
    refused(tmp, "kv heads and the all-to-all degree", 2, {"cp": 2, "cp_comm": "all-to-all"},
            ["cp_comm = \"all-to-all\"", "n_kv_head/tp = 3", "[model] n_kv_head = 3",
             "[parallel] cp = 2"], arch="llama", n_head=6, n_kv_head=3, d_model=36)
    refused(tmp, "unknown cp_comm", 0, {"cp_comm": "rings"}, ["cp_comm", "rings"])


def main():
    rng = seeded_rng("test_context_parallel_a2a")
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=L, NH=NH, C=C, T=T, V=V, model=False)
        test_gpt2(tmp)
        test_llama(tmp)
        test_refused(tmp)
    checks.report()


if __name__ == "__main__":
    main()
