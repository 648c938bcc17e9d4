"""test/test_mixtral_hf.py - Hugging Face Mixtral (MixtralForCausalLM) in and out (group llama-hf).

Every Mixtral directory here is written by the test (test/llama_reference.py's safetensors
writer, random weights): L = 2 layers, d_model 32, 4 query heads on 2 kv heads, E = 4 experts of
hidden size 24 (intermediate_size), top_k 2, vocabulary 101 (padded to 128), T = 16, untied;
F32 in one file, or BF16 in 3 shards with an index. The float64 model is llama_reference's
Mixtral (softmax over all E, torch.topk, renormalised over the chosen k: the router of
model/moe.cu, config/config_hf.cu says why); [train] moe_aux_loss and moe_z_loss are 0, so the
trainer's loss is the language-model loss alone.
1. Import -> 10 AdamW steps (lr 3e-3): the per-step losses (step 1's is the imported model's
   loss) equal float64's within 3e-5 relative (measured <= 2.4e-6 over 25 seeds), on one rank
   and on dp2 x ep2 (each expert-parallel rank reads only its experts' w1, w3, w2).
2. Import -> one lr = 0 step -> checkpoint -> tools/export.py hf: every tensor bit-identical to
   the directory read and config.json's keys equal, at dp2 x ep2 (F32) and on one rank from the
   BF16 shards exported as BF16 (the same bits).
3. Refused before any work (no metrics or checkpoint written), naming the key and both values
   (the reader reports every problem of a config at once, so these take five runs):
   [model] n_experts, top_k, d_expert, n_kv_head, router_score, n_shared_experts and moe_every
   disagreeing with config.json; num_experts_per_tok = 1, router_jitter_noise != 0, a
   sliding_window shorter than max_position_embeddings; a Llama directory with [model]
   n_experts; a missing expert tensor (named). tools/export.py refuses a Llama MoE checkpoint
   with shared experts, naming the key.
Fresh random weights and tokens every run (the seed is printed; SEED=<n> reproduces).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference as gref  # noqa: E402
import llama_reference as ref  # noqa: E402
from trainer import Checks, learnable_tokens, max_rel, read_metrics, run, seeded_rng  # noqa: E402
from trainer import write_config  # noqa: E402

checks = Checks("test_mixtral_hf")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPORT = [sys.executable, os.path.join(ROOT, "tools", "export.py")]
L, NH, NKV, C, F_, V, T, E, K = 2, 4, 2, 32, 24, 101, 16, 4, 2
STEPS, LR = 10, 3e-3
TRAIN_TOL = 3e-5  # measured <= 2.4e-6 relative over 25 seeds
DP2_EP2 = (["--parallel.dp=2", "--parallel.ep=2", "--train.micro_batch=1"], 2)


def mixtral_dir(tmp, rng, name, dtype="F32", shards=1, **changes):
    cfg = ref.mixtral_config(L, NH, NKV, C, F_, V, E, K, max_pos=64, eps=1e-5,
                             theta=10000.0 + rng.integers(0, 5e5))
    params = ref.random_llama(cfg, rng)
    cfg.update(changes)
    path = os.path.join(tmp, name)
    ref.write_hf_dir(path, cfg, params, dtype=dtype, shards=shards)
    return path, cfg


def sections(tmp, path, steps=STEPS, lr=LR, ckpt=None, **model):
    sec = {"init": {"from": path}, "model": {"seq_len": T, **model},
           "data": {"train": os.path.join(tmp, "train_*.bin"), "shuffle": False},
           "train": {"micro_batch": 2, "grad_accum": 1, "steps": steps, "lr": lr,
                     "warmup_steps": 0, "lr_schedule": "constant", "weight_decay": 0.0,
                     "grad_clip": 0.0, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
                     "moe_aux_loss": 0.0, "moe_z_loss": 0.0},
           "log": {"every": 1, "metrics": os.path.join(tmp, "metrics.jsonl")}}
    if ckpt:
        sec["checkpoint"] = {"dir": ckpt, "every": 1}
    return sec


def test_training(tmp, rng, tokens):
    path, cfg = mixtral_dir(tmp, rng, "train")
    _, P = ref.read_hf_dir(path)
    theirs = ref.train_losses(P, cfg, tokens, STEPS, 2, T, lr=LR)
    for layout, (overrides, np_ranks) in (("one rank", ([], 0)), ("dp2 x ep2", DP2_EP2)):
        metrics = os.path.join(tmp, "metrics.jsonl")
        if os.path.exists(metrics):
            os.remove(metrics)
        run(write_config(tmp, "train.toml", sections(tmp, path)), overrides, np_ranks=np_ranks)
        steps = read_metrics(metrics)[0]
        ours = [s["loss"] for s in steps]
        err = max_rel(ours, theirs) if len(ours) == STEPS else float("inf")
        experts = len(steps[0]["moe"][0]["tokens"]) if steps and steps[0].get("moe") else 0
        checks.check(f"Mixtral import trains like float64: {layout}",
                     err < TRAIN_TOL and experts == E,
                     f"max rel loss error {err:.2e} over {STEPS} steps (tolerance {TRAIN_TOL:g}); "
                     f"loss {theirs[0]:.4f} -> {theirs[-1]:.4f}; {experts} experts routed")


def stored_bits(path):
    """{name: stored array (BF16 as its uint16 bits)} of every safetensors file in path."""
    out = {}
    for file in sorted(os.listdir(path)):
        if file.endswith(".safetensors"):
            out.update({k: a for k, (_, a) in ref.read_safetensors(os.path.join(path, file))[0]
                        .items()})
    return out


def test_roundtrip(tmp, rng):
    for what, dtype, shards, (overrides, np_ranks) in (
            ("dp2 x ep2, F32", "F32", 1, DP2_EP2), ("one rank, BF16 in 3 shards", "BF16", 3,
                                                    ([], 0))):
        name = "rt" + dtype
        path, cfg = mixtral_dir(tmp, rng, name, dtype=dtype, shards=shards)
        ckpt = os.path.join(tmp, name + "_ckpt")
        run(write_config(tmp, name + ".toml", sections(tmp, path, steps=1, lr=0.0, ckpt=ckpt)),
            overrides, np_ranks=np_ranks)
        out = os.path.join(tmp, name + "_out")
        r = subprocess.run(EXPORT + ["hf", ckpt, out, "--dtype", dtype.lower().replace("f32",
                                                                                     "fp32")],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            checks.check(f"Mixtral round trip {what}", False, r.stderr.strip())
            continue
        got, want = stored_bits(out), stored_bits(path)
        same = set(got) == set(want) and all(
            got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]) for k in want)
        with open(os.path.join(out, "config.json")) as f:
            got_cfg = json.load(f)
        diff = [k for k, v in cfg.items() if k != "torch_dtype" and got_cfg.get(k) != v]
        checks.check(f"Mixtral import, lr 0 step, export bit-identical: {what}",
                     same and not diff,
                     f"{len(got)} tensors {'bit-identical' if same else 'DIFFER'}; config.json "
                     f"keys that differ: {diff}")


def refused(tmp, what, sec, words):
    for f in ("metrics.jsonl", "ckpt"):
        shutil.rmtree(os.path.join(tmp, f), ignore_errors=True)
        if os.path.exists(os.path.join(tmp, f)):
            os.remove(os.path.join(tmp, f))
    sec = dict(sec, checkpoint={"dir": os.path.join(tmp, "ckpt"), "every": 1})
    r = run(write_config(tmp, "bad.toml", sec), check=False, timeout=120)
    text = r.stdout + r.stderr
    wrote = [f for f in ("metrics.jsonl", "ckpt") if os.path.exists(os.path.join(tmp, f))]
    ok = r.returncode != 0 and all(w in text for w in words) and not wrote
    line = next((ln for ln in text.splitlines() if "error" in ln or "disagrees" in ln),
                "no error line")
    checks.check(f"Mixtral refused: {what}", ok, line + (f" (wrote {wrote})" if wrote else ""))


def test_refusals(tmp, rng):
    """The config reader reports every problem of a run at once: the keys are refused in three
    runs (two of [model] keys, one of config.json keys), each message checked."""
    path, _ = mixtral_dir(tmp, rng, "bad")
    for keys in ((("n_experts", 8, "num_local_experts = 4"),
                  ("top_k", 3, "num_experts_per_tok = 2"),
                  ("d_expert", 32, "intermediate_size = 24"),
                  ("n_kv_head", 4, "num_key_value_heads = 2")),
                 (("router_score", "sigmoid", "a softmax router"),
                  ("n_shared_experts", 1, "no shared experts"), ("moe_every", 2, "moe_every = 1"))):
        words = [w for key, value, theirs in keys
                 for w in (f"{key} = " + (f'"{value}"' if isinstance(value, str) else str(value)),
                           theirs)]
        refused(tmp, "[model] " + ", ".join(k for k, _, _ in keys) + " disagree",
                sections(tmp, path, **{k: v for k, v, _ in keys}), words + ["config.json"])
    p, _ = mixtral_dir(tmp, rng, "unsupported", num_experts_per_tok=1, router_jitter_noise=0.01,
                       sliding_window=8)
    refused(tmp, "num_experts_per_tok = 1, router_jitter_noise, a sliding window",
            sections(tmp, p), ["num_experts_per_tok = 1", "renormalises",
                               "router_jitter_noise = 0.01", "sliding_window = 8",
                               "max_position_embeddings = 64"])
    p, cfg = mixtral_dir(tmp, rng, "missing")
    _, P = ref.read_hf_dir(p)
    gone = "model.layers.1.block_sparse_moe.experts.3.w3.weight"
    del P[gone]
    shutil.rmtree(p)
    ref.write_hf_dir(p, cfg, {k: v.astype(np.float32) for k, v in P.items()})
    refused(tmp, "a missing expert tensor", sections(tmp, p), [gone, "missing"])
    cfg = ref.llama_config(L, NH, NKV, C, F_, V, max_pos=64, eps=1e-5)
    p = os.path.join(tmp, "llama")
    ref.write_hf_dir(p, cfg, ref.random_llama(cfg, rng))
    refused(tmp, "a Llama directory with experts", sections(tmp, p, n_experts=4),
            ["n_experts = 4", "model_type = \"llama\""])


def test_export_refusal(tmp):
    """A Llama MoE with a shared expert has no Mixtral form: tools/export.py names the key."""
    ckpt = os.path.join(tmp, "shared_ckpt")
    sec = sections(tmp, "", steps=1, lr=0.0, ckpt=ckpt, arch="llama", n_layer=L, n_head=NH,
                   n_kv_head=NKV, d_model=C, vocab_size=V, n_experts=E, top_k=K, d_expert=F_,
                   n_shared_experts=1)
    del sec["init"]
    run(write_config(tmp, "shared.toml", sec))
    r = subprocess.run(EXPORT + ["hf", ckpt, os.path.join(tmp, "shared_out")],
                       capture_output=True, text=True, timeout=120)
    checks.check("export refuses a Llama MoE with shared experts",
                 r.returncode != 0 and "n_shared_experts = 1" in r.stderr and
                 not os.path.exists(os.path.join(tmp, "shared_out")),
                 r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "no message")


def main():
    rng = seeded_rng("test_mixtral_hf")
    with tempfile.TemporaryDirectory() as tmp:
        tokens = learnable_tokens(rng, 3000, V)
        gref.write_shard(os.path.join(tmp, "train_000.bin"), tokens)
        checks.run_each(lambda: test_training(tmp, rng, tokens), lambda: test_roundtrip(tmp, rng),
                        lambda: test_refusals(tmp, rng), lambda: test_export_refusal(tmp))
    checks.report()


if __name__ == "__main__":
    main()
