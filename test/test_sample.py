"""test/test_sample.py - sampling with a KV cache (model/kv_cache.h, training/sample.h) against
sampling that recomputes the whole window for every token, through ./train_cpu --sample.

The KV cache runs the prompt once and then one token at a time, each token's attention reading
the cached keys and values (ops::attention_cached_forward); recomputing runs the window of the
last seq_len tokens for every token. At temperature 0 (greedy) the two must choose the same
tokens, token for token: on one rank, under tp 2 (with and without sequence parallelism, which
the cached passes switch off) and pp 2, for GPT-2 (learned positions) and Llama (RoPE from the
cache's position, grouped-query attention). At temperature 1 with the same seed they draw the
same uniform numbers, so the tokens agree too (a draw within ~1e-7 of a boundary between two
tokens could part them: not seen). top_k = 1 is greedy whatever the temperature. A sample longer
than the window makes the cache start again from the window's last half (it must run). --sample
resumes a checkpoint and samples from its weights. Bad values of the sample keys are refused
before any work.

The model is a random tiny GPT-2 (llm.c file) or a random Llama; without a tokenizer the sample
prints token ids, which is what is compared.
"""
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference as ref  # noqa: E402
from trainer import (Checks, base_sections, check_refused, make_experiment, run,  # noqa: E402
                     seeded_rng, write_config)

T = 24
TOKENS = 18  # < T - 1: no window restart, so the two ways see the same positions


def sample_of(tmp, sections, overrides=(), np_ranks=0):
    r = run(write_config(tmp, "sample.toml", sections), ["--sample", *overrides],
            np_ranks=np_ranks)
    m = re.search(r"^sample .*:\n(.*)\n---$", r.stdout, re.M | re.S)
    if not m:
        print(r.stdout[-2000:])
        raise RuntimeError("no sample in the output")
    return re.findall(r"<(\d+)>", m.group(1))


def gpt2_sections(tmp):
    sec = base_sections(tmp, 1)
    sec["model"] = {"n_layer": 2, "n_head": 4, "d_model": 32, "seq_len": T, "max_seq_len": T,
                    "vocab_size": 101}
    sec["log"].update({"sample_tokens": TOKENS, "sample_temperature": 0.0})
    return sec


def llama_sections(tmp):
    sec = gpt2_sections(tmp)
    del sec["init"]
    sec["model"].update({"arch": "llama", "n_kv_head": 2, "d_model": 32, "n_head": 4})
    return sec


def main():
    checks = Checks("sample")
    rng = seeded_rng("test_sample")
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=2, NH=4, C=32, T=T, V=101, model=False)
        # weights large enough that the greedy tokens vary (at std 0.02 they are one token)
        params = ref.random_params(2, 32, T, 101, rng, std=0.3)
        ref.write_model(os.path.join(tmp, "model.bin"), params, 2, 4, 32, T, 101)
        for arch, sections in (("gpt2", gpt2_sections(tmp)), ("llama", llama_sections(tmp))):
            want = sample_of(tmp, sections, ["--log.sample_kv_cache=false"])
            checks.check(f"{arch}: {TOKENS} tokens sampled, not all one token (at least two distinct)",
                         len(want) == TOKENS and len(set(want)) > 1, f"{want}")
            layouts = [("one rank", [], 0), ("tp 2", ["--parallel.tp=2"], 2),
                       ("tp 2 sp", ["--parallel.tp=2", "--parallel.sp=true"], 2),
                       ("pp 2", ["--parallel.pp=2"], 2)]
            for name, over, np_ranks in layouts:
                if not checks.wanted(f"{arch} {name}"):
                    continue
                got = sample_of(tmp, sections, over, np_ranks)
                checks.check(f"{arch} {name}: KV cache = recompute at temperature 0",
                             got == want, f"\n  cache     {got}\n  recompute {want}")
        sec = gpt2_sections(tmp)
        sec["log"]["sample_temperature"] = 1.0
        hot = sample_of(tmp, sec)
        checks.check("temperature 1: KV cache = recompute (same draws)",
                     hot == sample_of(tmp, sec, ["--log.sample_kv_cache=false"]), f"{hot}")
        greedy = sample_of(tmp, gpt2_sections(tmp))
        checks.check("top_k 1 at temperature 1 is greedy",
                     sample_of(tmp, sec, ["--log.sample_top_k=1"]) == greedy, "")
        checks.check("temperature 1 differs from greedy", hot != greedy, "")
        long = sample_of(tmp, gpt2_sections(tmp), [f"--log.sample_tokens={2 * T + 3}"])
        checks.check("a sample longer than the window (the cache restarts)",
                     len(long) == 2 * T + 3 and long[:TOKENS] == greedy, f"{len(long)}")
        # --sample from a checkpoint: 8 steps saved, then resumed for a sample (no training)
        sec = gpt2_sections(tmp)
        sec["train"]["steps"] = 8
        sec["checkpoint"] = {"dir": os.path.join(tmp, "ckpt"), "every": 8}
        run(write_config(tmp, "train.toml", sec))
        sec["checkpoint"]["resume"] = "latest"
        resumed = sample_of(tmp, sec)
        checks.check("--sample from a checkpoint: KV cache = recompute, not the initial model's",
                     resumed == sample_of(tmp, sec, ["--log.sample_kv_cache=false"]) and
                     resumed != greedy, f"{resumed}")
        for key, value in (("sample_temperature", -0.5), ("sample_top_k", -1)):
            bad = gpt2_sections(tmp)
            bad["log"][key] = value
            check_refused(checks, tmp, f"{key} = {value}", bad, 0, [key, "must be >= 0"])
    checks.report()


if __name__ == "__main__":
    main()
