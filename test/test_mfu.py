#!/usr/bin/python3
"""test/test_mfu.py - model FLOPs per token in both conventions, HFU, TFLOP/s per GPU and the
peaks MFU is measured against (training/metrics.h, config/device_peaks.h).

1. The planner's FLOP counts (--plan-json) for GPT-2 124M, GPT-2 1.5B with "block" recompute, the
   8x350M mixture of experts and (once the trainer accepts arch = "llama") Llama-3 8B equal a
   count made here from the config alone: the parameters a token's matmuls use, written out per
   tensor (qkv with GQA's k/v rows, SwiGLU's three matrices, the untied head, top_k experts),
   6 N + 6 L T d and 6 N + 12 L T d, plus 2 N_blocks + 2 L T d for block recompute. Exact
   (the counts are integers below 2^53).
2. The planner's peak: [plan] device at the run's precision (H100 SXM BF16 989.4, FP8 1978.9; A100
   312 for fp8 too; B200), and [plan] peak_tflops overriding it; an unknown device is refused.
3. A real run at np 2 (dp 2) with block recompute and [log] peak_tflops: the run record's counts
   equal the Python count; each step record's model_tflops_per_gpu = tokens/s x flops / 2 / 1e12,
   mfu = that / peak, mfu_full / mfu = full / causal, hfu / mfu = hardware / causal; the summary
   record averages the steps after the first (tokens / seconds from the step records). Without a
   peak: mfu, mfu_full, hfu null, TFLOP/s still there.
4. build/test_device_peaks: the driver names of H100/H200 SXM, PCIe and NVL, A100 and B200.
5. Packed documents ([data] document_mask): attention counted per document, Megatron's way. Two
   steps of two rows of T = 16 with planted end-of-text tokens - row lengths (16), (5, 4, 7),
   then (4, 4, 4, 4) twice - give, by hand, sum len^2 / (rows T^2) = (256 + 90) / 512 and
   128 / 512: each step record's "attention_fraction" equals it, its model TFLOP/s = tokens/s x
   (6N + 6LTd x fraction) / 1e12 and mfu_full / mfu = (6N + 12LTd f) / (6N + 6LTd f); the banner
   says attention is counted per document.
Run: /usr/bin/python3 test/test_mfu.py   (BUILD=build by default)
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainer import (Checks, base_sections, make_experiment, read_metrics, run,  # noqa: E402
                     seeded_rng, write_config)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, os.environ.get("BUILD", "build"))
TRAIN = os.path.join(ROOT, "train_cpu")
checks = Checks("test_mfu")


# ------------------------------------------------------------------ the count from the config

def read_toml(path):
    import tomllib
    with open(path, "rb") as f:
        return tomllib.load(f)


def model_count(m, recompute="none"):
    """(N, causal, full, hardware) per token from a [model] table, independently of the trainer."""
    L, C, T, NH = m["n_layer"], m["d_model"], m["seq_len"], m["n_head"]
    llama = m.get("arch", "gpt2") == "llama"
    Vp = (m["vocab_size"] + 127) // 128 * 128
    maxT = m.get("max_seq_len", T)
    NKV = m.get("n_kv_head", 0) or NH
    HS = C // NH
    tied = m.get("tie_embeddings", not llama)
    E, top_k, every = m.get("n_experts", 0), m.get("top_k", 2), m.get("moe_every", 1)
    blocks = 0
    for layer in range(L):
        moe = E > 0 and (layer + 1) % every == 0
        if llama:
            F = m.get("d_ff", 0) or (8 * C // 3 + 255) // 256 * 256
            attn = 2 * C + (NH + 2 * NKV) * HS * C + C * NH * HS  # two RMSNorms, qkv, proj
            D = m.get("d_expert", 0) or 4 * C
            mlp = E * C + top_k * 3 * C * D if moe else 3 * C * F  # router; gate, up, down
        else:
            attn = 4 * C + 3 * C * C + 3 * C + C * C + C  # two LayerNorms, qkv, proj (+ biases)
            D = m.get("d_expert", 0) or 4 * C
            mlp = E * C + top_k * (2 * C * D + D + C) if moe else 8 * C * C + 5 * C
        blocks += attn + mlp
    root = Vp * C + (C if llama else maxT * C + 2 * C)  # the head (tied: wte), ln_f, gpt2's wpe
    N = blocks + root  # an untied model's input embedding is a lookup: not counted
    LTd = L * T * NH * HS
    causal, full = 6 * N + 6 * LTd, 6 * N + 12 * LTd
    hardware = causal + (2 * blocks + 2 * LTd if recompute == "block" else 0)
    return N, causal, full, hardware


def plan_json(tmp, config, overrides=()):
    path = os.path.join(tmp, "plan.json")
    if os.path.exists(path):
        os.remove(path)
    p = subprocess.run([TRAIN, config, "--plan", "--plan-json", path, "--plan.memory_gib=100000"] + list(overrides),
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"--plan {config} failed: {(p.stdout + p.stderr)[-600:]}")
    with open(path) as f:
        return json.load(f)


def llama_refused(config):
    """The refusal of arch = "llama" by a trainer without the Llama model, or None."""
    p = subprocess.run([TRAIN, config, "--plan"], capture_output=True, text=True, timeout=300)
    text = (p.stdout + p.stderr).strip()
    return text.splitlines()[-1] if p.returncode != 0 and "llama" in text else None


def test_planner_counts():
    cases = [("configs/gpt2_124m.toml", ["--train.micro_batch=1"]),
             ("configs/gpt2_1558m.toml", ["--train.micro_batch=1", "--train.recompute=block"]),
             ("configs/gpt_moe_8x350m.toml", ["--train.micro_batch=1"]),
             ("configs/llama3_8b.toml", ["--train.recompute=none"]),
             ("configs/llama3_8b.toml", ["--train.recompute=block", "--model.tie_embeddings=true"]),
             ("configs/llama3_70b.toml", ["--model.seq_len=2048", "--model.n_kv_head=64"])]
    with tempfile.TemporaryDirectory() as tmp:
        for config, overrides in cases:
            path = os.path.join(ROOT, config)
            toml = read_toml(path) if os.path.exists(path) else {}
            m, recompute = toml.get("model", {}), toml.get("train", {}).get("recompute", "none")
            refused = m.get("arch") == "llama" and llama_refused(path)
            if not m or refused:
                print(f"SKIP {config}: {refused or 'no such file'} (the Llama model has not landed)")
                continue
            for o in overrides:  # the overrides, as the trainer applies them
                k, v = o[2:].split("=")
                if k.startswith("model."):
                    m[k[6:]] = v == "true" if v in ("true", "false") else int(v)
                if k == "train.recompute":
                    recompute = v
            N, causal, full, hardware = model_count(m, recompute)
            got = plan_json(tmp, path, overrides)
            want = {"matmul_parameters": N, "flops_per_token": causal, "flops_per_token_full": full,
                    "hardware_flops_per_token": hardware}
            bad = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
            checks.check(f"planner FLOPs per token, {config} {' '.join(overrides)}", not bad,
                         f"N {N:.6g}, causal {causal:.6g}, full {full:.6g}, executed {hardware:.6g}"
                         + (f"; differ (plan, python): {bad}" if bad else ""))
            step_s = got["step_ms"] / 1e3
            world = 1
            tokens = m["seq_len"] * got["layout"]["micro_batch"] * got["layout"]["grad_accum"] * got["layout"]["dp"]
            mfu = tokens / step_s / world * causal / (got["peak_tflops"] * 1e12)
            checks.check(f"planner MFU consistent, {config}",
                         abs(got["mfu"] - mfu) < 1e-5 * mfu and
                         abs(got["mfu_full"] / got["mfu"] - full / causal) < 1e-5 and
                         abs(got["hfu"] / got["mfu"] - hardware / causal) < 1e-5,
                         f"mfu {got['mfu']:.4f}, full {got['mfu_full']:.4f}, hfu {got['hfu']:.4f}")


def test_planner_peaks():
    config = os.path.join(ROOT, "configs/gpt2_124m.toml")
    # NVIDIA datasheets' "with sparsity" TFLOPS, halved: dense peaks.
    cases = [([], 1979 / 2), (["--precision.compute=fp8"], 3958 / 2),
             (["--plan.device=H100 PCIe"], 1513 / 2), (["--plan.device=H100 PCIe", "--precision.compute=fp8"], 3026 / 2),
             (["--plan.device=A100", "--precision.compute=fp8"], 624 / 2),
             (["--plan.device=B200", "--precision.compute=fp8"], 9000 / 2),
             (["--plan.device=B200", "--precision.compute=fp32"], 4500 / 2),
             (["--plan.device=B200", "--plan.peak_tflops=123.5"], 123.5)]
    with tempfile.TemporaryDirectory() as tmp:
        for overrides, want in cases:
            got = plan_json(tmp, config, ["--train.micro_batch=1"] + overrides)["peak_tflops"]
            checks.check(f"planner peak {' '.join(overrides) or '(H100 SXM, bf16)'}",
                         abs(got - want) < 0.6, f"{got} TFLOP/s, datasheet {want}")
        p = subprocess.run([TRAIN, config, "--plan", "--plan.device=H100"], capture_output=True,
                           text=True, timeout=60)
        text = p.stdout + p.stderr
        checks.check("an unknown [plan] device is refused", p.returncode != 0 and "plan.device" in text
                     and "H100 SXM" in text, next((ln for ln in text.splitlines() if "error" in ln), "no error"))


# ------------------------------------------------------------------ a real run

def test_run_records(rng):
    with tempfile.TemporaryDirectory() as tmp:
        L, NH, C, T, V = 2, 3, 36, 16, 101
        make_experiment(tmp, rng, L=L, NH=NH, C=C, T=T, V=V)
        sec = base_sections(tmp, 4, recompute="block")
        sec["parallel"] = {"dp": 2}
        sec["log"]["peak_tflops"] = 0.0005
        run(write_config(tmp, "c.toml", sec), np_ranks=2)
        path = sec["log"]["metrics"]
        with open(path) as f:
            records = [json.loads(line) for line in f]
        info = next(r["run"] for r in records if "run" in r)
        summary = next((r["summary"] for r in records if "summary" in r), None)
        steps, _ = read_metrics(path)
        N, causal, full, hardware = model_count({"n_layer": L, "n_head": NH, "d_model": C,
                                                 "seq_len": T, "vocab_size": V}, "block")
        checks.check("run record FLOPs per token", (info["matmul_parameters"], info["flops_per_token"],
                     info["flops_per_token_full"], info["hardware_flops_per_token"]) == (N, causal, full, hardware),
                     f"N {N}, causal {causal}, full {full}, executed {hardware}")
        peak, world, bad = 0.0005, 2, []
        step_tokens = 2 * T * 2  # micro_batch x seq_len x dp (tokens_per_s is printed rounded)
        for r in steps:
            tflops = step_tokens / (r["ms"] / 1e3) * causal / world / 1e12
            tol = 1e-5 + 6e-4 / r["ms"]  # ms is printed to 0.0005 ms, the rest to 6 digits
            ok = (abs(r["model_tflops_per_gpu"] - tflops) < tol * tflops and
                  abs(r["hardware_tflops_per_gpu"] / r["model_tflops_per_gpu"] - hardware / causal) < 1e-5 and
                  abs(r["mfu"] - r["model_tflops_per_gpu"] / peak) < 1e-5 * r["mfu"] and
                  abs(r["mfu_full"] / r["mfu"] - full / causal) < 1e-5 and
                  abs(r["hfu"] / r["mfu"] - hardware / causal) < 1e-5)
            if not ok:
                bad.append(r["step"])
        checks.check("step records: TFLOP/s per GPU, MFU both conventions, HFU", steps and not bad,
                     f"{len(steps)} steps, hfu/mfu {hardware / causal:.4f}, full/causal {full / causal:.4f}"
                     + (f"; wrong at steps {bad}" if bad else ""))
        later = steps[1:]
        tokens = step_tokens * len(later)
        tps = tokens / sum(r["ms"] / 1e3 for r in later)
        tol = 1e-5 + 6e-4 / min(r["ms"] for r in later)
        ok = summary is not None and summary["steps"] == len(later) and \
            abs(summary["tokens_per_s"] - tps) < tol * tps and \
            abs(summary["mfu"] - tps * causal / world / 1e12 / peak) < tol * summary["mfu"] and \
            abs(summary["mfu_full"] / summary["mfu"] - full / causal) < 1e-5 and \
            abs(summary["hfu"] / summary["mfu"] - hardware / causal) < 1e-5
        checks.check("summary record: the steps after the first", ok, f"{summary}")
        os.remove(path)
        del sec["log"]["peak_tflops"]
        run(write_config(tmp, "c.toml", sec), np_ranks=2)
        steps, _ = read_metrics(path)
        checks.check("without a peak: MFU null, TFLOP/s reported",
                     all(r["mfu"] is None and r["mfu_full"] is None and r["hfu"] is None and
                         r["model_tflops_per_gpu"] > 0 for r in steps), f"{len(steps)} steps")


def test_device_table():
    binary = os.path.join(BUILD, "test_device_peaks")
    if not os.access(binary, os.X_OK):
        checks.check("device peak table", False, f"{binary} not built (make test-bins)")
        return
    p = subprocess.run([binary], capture_output=True, text=True)
    checks.check("device peak table by driver name", p.returncode == 0, p.stdout.strip().splitlines()[-1])


def test_documents(rng):
    """Step records of a run over planted documents against the hand count (docstring 5)."""
    import numpy as np
    import gpt2_reference as ref
    L, NH, C, T, V = 2, 3, 36, 16, 101
    EOT = V - 1
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=L, NH=NH, C=C, T=T, V=V)
        rows = [rng.integers(0, EOT, size=T) for _ in range(4)]
        for row, starts in zip(rows, [(), (0, 5, 9), (0, 4, 8, 12), (0, 4, 8, 12)]):
            row[list(starts)] = EOT
        tokens = np.concatenate(rows + [np.array([1])])  # rows of T+1 overlap by one token
        ref.write_shard(os.path.join(tmp, "train_000.bin"), tokens)
        sec = base_sections(tmp, 2)
        sec["data"].update({"document_mask": True, "eot_token": EOT})
        sec["log"]["peak_tflops"] = 0.0005
        out = run(write_config(tmp, "c.toml", sec)).stdout
        steps, _ = read_metrics(sec["log"]["metrics"])
        N, causal, full, _ = model_count({"n_layer": L, "n_head": NH, "d_model": C,
                                          "seq_len": T, "vocab_size": V})
        LTd = L * T * C
        hand = [(16 ** 2 + 5 ** 2 + 4 ** 2 + 7 ** 2) / (2 * T * T), 8 * 4 ** 2 / (2 * T * T)]
        bad = []
        for r, f in zip(steps, hand):
            model = 6 * N + 6 * LTd * f
            tflops = 2 * T / (r["ms"] / 1e3) * model / 1e12
            tol = 1e-5 + 6e-4 / r["ms"]
            if not (abs(r.get("attention_fraction", -1) - f) < 1e-9 and
                    abs(r["model_tflops_per_gpu"] - tflops) < tol * tflops and
                    abs(r["mfu_full"] / r["mfu"] - (6 * N + 12 * LTd * f) / model) < 1e-5):
                bad.append((r["step"], r.get("attention_fraction"), f))
        checks.check("document_mask: attention FLOPs by sum len^2 (hand count on planted rows)",
                     len(steps) == 2 and not bad and causal == 6 * N + 6 * LTd,
                     f"fractions {[r.get('attention_fraction') for r in steps]} vs {hand}"
                     + (f"; wrong: {bad}" if bad else ""))
        checks.check("document_mask: the banner says attention is counted per document",
                     "attention is counted per document" in out and "len^2" in out,
                     next((ln for ln in out.splitlines() if "counted per document" in ln), "no line"))


def main():
    rng = seeded_rng("test_mfu")
    checks.run_each(test_planner_counts, test_planner_peaks, lambda: test_run_records(rng),
                    test_device_table, lambda: test_documents(rng))
    checks.report()


if __name__ == "__main__":
    main()
