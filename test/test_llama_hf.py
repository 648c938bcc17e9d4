"""test/test_llama_hf.py - Hugging Face Llama weights in: the reader, its refusals, and training.

Every Hugging Face directory here is written by test/llama_reference.py (its own safetensors
writer) with random weights, at awkward sizes (d_model 40, head size 10 or 8, d_ff 44, vocabulary 101 padded to
128), for grouped-query attention (4 query heads on 2 kv heads), none (5 on 5) and one kv head
(4 on 1); tied and untied heads; F32 and BF16; one file and 3 shards with an index.

1. The reader without the model (build/test_hf_llama: checkpoint/hf_llama.cu's ParamFill on the
   design's tensor-parallel placements, fed in pieces of 37 elements, so that blocks start and
   end inside rows, and whole, so that at tp 1 one block crosses the q/k/v and gate/up
   sections): every local buffer of every tp
   rank (tp 1 and 2; tp 1 only with one kv head) equals the one built here from the tensors
   written, bit for bit (BF16: widened exactly), the padded vocabulary rows zero.
2. Bad input, each a non-zero exit whose message names the culprit: a missing tensor, a wrong
   shape, a wrong dtype (F16), an extra tensor, a corrupt header (length past the end of the
   file, malformed JSON with its byte offset, data_offsets past the data, a span that does not
   match the shape), an index naming a missing shard.
3. config.json against [model] (./train_cpu): a mismatched key names the key and both values;
   rope_scaling present, hidden_act other than silu, seq_len past max_position_embeddings,
   arch = "gpt2": refused before any work, and no checkpoint or metrics file written.
4. Training (needs the Llama model, issue 22's llama-model branch): ./train_cpu trains 12 AdamW
   steps from each directory and its losses equal the float64 reference's within 1e-4 relative;
   the tensor-level refusals of 2 through ./train_cpu write nothing. Until the model is built the
   trainer refuses arch = "llama", and this part prints SKIP.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference as gref  # noqa: E402
import llama_reference as ref  # noqa: E402
from trainer import Checks, learnable_tokens, max_rel, read_metrics, run, seeded_rng  # noqa: E402
from trainer import write_config  # noqa: E402

checks = Checks("test_llama_hf")
BUILD = os.environ.get("BUILD", "build")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
READER = os.path.join(BUILD, "test_hf_llama")
C, F_, V, L, T = 40, 44, 101, 2, 16
TRAIN_TOL = 1e-5  # measured <= 1.0e-6 relative (issue 22 asks for 1e-4)
CASES = [  # (what, NH, NKV, tied, dtype, shards)
    ("GQA 4 on 2, untied, F32", 4, 2, False, "F32", 1),
    ("no GQA 5 on 5, tied, BF16, 3 shards", 5, 5, True, "BF16", 3),
    ("one kv head 4 on 1, untied, F32, 3 shards", 4, 1, False, "F32", 3),
]


def hf_dir(tmp, rng, NH, NKV, tied, dtype, shards, name="hf"):
    cfg = ref.llama_config(L, NH, NKV, C, F_, V, max_pos=64, theta=10000.0 + rng.integers(0, 5e5),
                           eps=1e-5, tied=tied)
    params = ref.random_llama(cfg, rng)
    path = os.path.join(tmp, name)
    ref.write_hf_dir(path, cfg, params, dtype=dtype, shards=shards)
    return path, cfg


def run_reader(path, NH, NKV, tied, tp, out, chunk=37):
    cmd = [READER, path, str(L), str(NH), str(NKV), str(C), str(F_), str(V), str(int(tied)),
           str(tp), str(chunk), out]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


# ---------------------------------------------------------------------------------------------
# 1. What each tp rank reads
# ---------------------------------------------------------------------------------------------
def ours_global(P, cfg):
    """Our logical tensors from Hugging Face's (design note's mapping), float64."""
    Vp = gref.padded_vocab(V)
    pad = lambda a: np.concatenate([a, np.zeros((Vp - a.shape[0], a.shape[1]))])  # noqa: E731
    g = {"wte": pad(P["model.embed_tokens.weight"]), "ln_f/weight": P["model.norm.weight"]}
    if not cfg["tie_word_embeddings"]:
        g["lm_head"] = pad(P["lm_head.weight"])
    for l in range(L):
        p, h = f"model.layers.{l}.", f"h.{l}/"
        g[h + "ln_1/weight"] = P[p + "input_layernorm.weight"]
        g[h + "ln_2/weight"] = P[p + "post_attention_layernorm.weight"]
        g[h + "attn/qkv/weight"] = np.concatenate([P[p + f"self_attn.{x}_proj.weight"]
                                                   for x in "qkv"])
        g[h + "attn/proj/weight"] = P[p + "self_attn.o_proj.weight"]
        g[h + "mlp/fc/weight"] = np.concatenate([P[p + "mlp.gate_proj.weight"],
                                                 P[p + "mlp.up_proj.weight"]])
        g[h + "mlp/proj/weight"] = P[p + "mlp.down_proj.weight"]
    return g


def local_block(name, a, r, tp, NH, NKV):
    """Rank r's block: column-parallel sections (rows), row-parallel (columns), vocabulary rows."""
    if a.ndim == 1:
        return a[:, None]
    HS = C // NH
    if name.endswith("qkv/weight"):
        sections = [NH * HS, NKV * HS, NKV * HS]
    elif name.endswith("fc/weight"):
        sections = [F_, F_]
    elif name in ("wte", "lm_head"):
        sections = [a.shape[0]]
    else:  # attn/proj, mlp/proj: columns
        n = a.shape[1] // tp
        return a[:, r * n:(r + 1) * n]
    rows, start = [], 0
    for s in sections:
        rows.append(a[start + r * s // tp: start + (r + 1) * s // tp])
        start += s
    return np.concatenate(rows)


def test_reader(rng):
    with tempfile.TemporaryDirectory() as tmp:
        for what, NH, NKV, tied, dtype, shards in CASES:
            path, cfg = hf_dir(tmp, rng, NH, NKV, tied, dtype, shards)
            _, P = ref.read_hf_dir(path)
            want = ours_global(P, cfg)
            for tp, chunk in [(tp, chunk) for tp in ((1, 2) if NKV % 2 == 0 else (1,))
                              for chunk in (37, 1 << 30)]:
                out = os.path.join(tmp, "read.safetensors")
                r = run_reader(path, NH, NKV, tied, tp, out, chunk)
                what_tp = f"reader {what} tp {tp}, pieces of {min(chunk, 1 << 20)}"
                if r.returncode != 0:
                    checks.check(what_tp, False, r.stderr.strip())
                    continue
                got, _ = ref.read_safetensors(out)
                worst, count = 0.0, 0
                for rank in range(tp):
                    for name, a in want.items():
                        exp = local_block(name, a, rank, tp, NH, NKV)
                        g = got[f"r{rank}/{name}"][1]
                        worst = max(worst, float(np.max(np.abs(g - exp))) if g.shape == exp.shape
                                    else float("inf"))
                        count += 1
                expected_count = tp * len(want)
                checks.check(what_tp, worst == 0 and len(got) == expected_count,
                             f"{count} local blocks, max |read - written| = {worst:g} (exact)")


# ---------------------------------------------------------------------------------------------
# 2. Tensor-level refusals
# ---------------------------------------------------------------------------------------------
def corrupt(path, how):
    """Damages path/model.safetensors in place."""
    file = os.path.join(path, "model.safetensors")
    blob = bytearray(open(file, "rb").read())
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    if how == "length":
        blob[:8] = struct.pack("<Q", len(blob))
    elif how == "json":
        i = blob.index(b'"shape"', 8)
        blob[i + 8:i + 9] = b"{"  # '[' -> '{' inside the first shape
    else:
        name = "model.norm.weight"
        b, e = header[name]["data_offsets"]
        header[name]["data_offsets"] = [b, e + (10**9 if how == "offsets" else -4)]
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        blob = struct.pack("<Q", len(text)) + text + blob[8 + n:]
    open(file, "wb").write(blob)


def bad_inputs(tmp, rng):
    """(what, directory, words the message must hold) for each tensor-level refusal."""
    NH, NKV = 4, 2
    cases = []

    def variant(name, edit, words, shards=1):
        path, cfg = hf_dir(tmp, rng, NH, NKV, False, "F32", shards, name=name)
        _, P = ref.read_hf_dir(path)
        P = {k: v.astype(np.float32) for k, v in P.items()}
        edit(path, cfg, P)
        cases.append((name, path, words))

    def rewrite(path, cfg, P, dtypes=None):
        shutil.rmtree(path)
        os.makedirs(path)
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(cfg, f)
        ref.write_safetensors(os.path.join(path, "model.safetensors"),
                              {k: ((dtypes or {}).get(k, "F32"), v) for k, v in P.items()})

    k = "model.layers.1.self_attn.k_proj.weight"
    variant("missing", lambda p, c, P: (P.pop(k), rewrite(p, c, P)), [k, "missing"])
    variant("shape", lambda p, c, P: (P.__setitem__(k, P[k][:-1]), rewrite(p, c, P)),
            [k, "model.safetensors", "[19, 40]", "[20, 40]"])
    variant("dtype", lambda p, c, P: rewrite(p, c, {**P, k: P[k].astype(np.float16)}, {k: "F16"}),
            [k, "F16", "model.safetensors"])
    variant("extra", lambda p, c, P: rewrite(p, c, {**P, "model.layers.0.self_attn.q_proj.bias":
                                                    np.zeros(40, np.float32)}),
            ["q_proj.bias", "no place"])
    variant("length", lambda p, c, P: corrupt(p, "length"), ["model.safetensors", "header length"])
    variant("json", lambda p, c, P: corrupt(p, "json"), ["model.safetensors", "byte ", "malformed"])
    variant("offsets", lambda p, c, P: corrupt(p, "offsets"), ["model.norm.weight", "data_offsets"])
    variant("span", lambda p, c, P: corrupt(p, "span"), ["model.norm.weight", "span"])
    variant("shard", lambda p, c, P: os.remove(os.path.join(p, "model-00002-of-00003.safetensors")),
            ["model-00002-of-00003.safetensors", "cannot open"], shards=3)
    return cases


def test_reader_refusals(rng):
    with tempfile.TemporaryDirectory() as tmp:
        for what, path, words in bad_inputs(tmp, rng):
            r = run_reader(path, 4, 2, False, 1, os.path.join(tmp, "out.safetensors"))
            text = r.stdout + r.stderr
            ok = r.returncode != 0 and all(w in text for w in words) and \
                not os.path.exists(os.path.join(tmp, "out.safetensors"))
            checks.check(f"reader refuses: {what}", ok,
                         text.strip().splitlines()[-1] if text.strip() else "no message")


# ---------------------------------------------------------------------------------------------
# 3. config.json against [model], through the trainer
# ---------------------------------------------------------------------------------------------
def sections(tmp, path, steps=12, lr=3e-3, **model):
    return {"init": {"from": path}, "model": {"seq_len": T, **model},
            "data": {"train": os.path.join(tmp, "train_*.bin"), "shuffle": False},
            "train": {"micro_batch": 2, "grad_accum": 1, "steps": steps, "lr": lr,
                      "warmup_steps": 0, "lr_schedule": "constant", "weight_decay": 0.0,
                      "grad_clip": 0.0, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8},
            "log": {"every": 1, "metrics": os.path.join(tmp, "metrics.jsonl")},
            "checkpoint": {"dir": os.path.join(tmp, "ckpt"), "every": 1}}


def refused(tmp, what, sec, words):
    for f in ("metrics.jsonl", "ckpt"):  # left by an earlier run: the refused one must write none
        shutil.rmtree(os.path.join(tmp, f), ignore_errors=True)
        if os.path.exists(os.path.join(tmp, f)):
            os.remove(os.path.join(tmp, f))
    r = run(write_config(tmp, "bad.toml", sec), check=False, timeout=120)
    text = r.stdout + r.stderr
    wrote = [f for f in ("metrics.jsonl", "ckpt") if os.path.exists(os.path.join(tmp, f))]
    ok = r.returncode != 0 and all(w in text for w in words) and not wrote
    line = next((ln for ln in text.splitlines() if "error" in ln), "no error line")
    checks.check(f"refused: {what}", ok, line + (f" (wrote {wrote})" if wrote else ""))


def edit_config(path, **changes):
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(changes)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)


def test_config_refusals(rng):
    with tempfile.TemporaryDirectory() as tmp:
        gref.write_shard(os.path.join(tmp, "train_000.bin"), learnable_tokens(rng, 3000, V))
        path, _ = hf_dir(tmp, rng, 4, 2, False, "F32", 1)
        refused(tmp, "d_model mismatch", sections(tmp, path, d_model=48),
                ["d_model = 48", "hidden_size = 40", "config.json"])
        refused(tmp, "n_kv_head mismatch", sections(tmp, path, n_kv_head=4),
                ["n_kv_head = 4", "num_key_value_heads = 2"])
        refused(tmp, "norm_eps mismatch", sections(tmp, path, norm_eps=1e-6),
                ["norm_eps", "rms_norm_eps = 1e-05"])
        refused(tmp, "arch gpt2", sections(tmp, path, arch="gpt2"), ["arch = \"gpt2\"", "llama"])
        refused(tmp, "seq_len past max_position_embeddings", sections(tmp, path, seq_len=128),
                ["seq_len = 128", "max_position_embeddings = 64"])
        edit_config(path, rope_scaling={"rope_type": "llama3", "factor": 8.0})
        refused(tmp, "rope_scaling", sections(tmp, path), ["rope_scaling", "config.json"])
        edit_config(path, rope_scaling=None, hidden_act="gelu")
        refused(tmp, "hidden_act gelu", sections(tmp, path), ["hidden_act = \"gelu\""])
        edit_config(path, hidden_act="silu", intermediate_size="44")
        refused(tmp, "a string where a number goes", sections(tmp, path),
                ["intermediate_size is a string"])
        with open(os.path.join(path, "config.json"), "w") as f:
            f.write('{"hidden_size": 36,, "num_hidden_layers": 2}')
        refused(tmp, "malformed config.json", sections(tmp, path),
                ["config.json: byte 19", "expected a string key"])


# ---------------------------------------------------------------------------------------------
# 4. tools/export.py hf of a Llama checkpoint
# ---------------------------------------------------------------------------------------------
EXPORT = [sys.executable, os.path.join(ROOT, "tools", "export.py")]


def fake_checkpoint(path, cfg, ours, model_toml):
    """A checkpoint directory as checkpoint/ writes it, as far as the exporter reads it: one
    checkpoint.h5 with the shape and Llama attributes, the resolved config text (a string
    dataset "config") and model/<name> datasets, and manifest.txt ("<bytes> <crc32> <file>"
    lines, then "end <crc32 of the above>")."""
    os.makedirs(path)
    with h5py.File(os.path.join(path, "checkpoint.h5"), "w") as f:
        f.attrs.update({"step": 7, "n_layer": L, "n_head": cfg["num_attention_heads"],
                        "d_model": C, "seq_len": T, "vocab_size": V,
                        "padded_vocab": gref.padded_vocab(V), "n_experts": 0,
                        "max_seq_len": cfg["max_position_embeddings"], "llama": 1,
                        "n_kv_head": cfg["num_key_value_heads"], "d_ff": F_,
                        "tie_embeddings": int(cfg["tie_word_embeddings"])})
        f["config"] = model_toml
        for name, a in ours.items():
            f["model/" + name] = a.astype(np.float32)
    blob = open(os.path.join(path, "checkpoint.h5"), "rb").read()
    text = f"manifest 1\n{len(blob)} {zlib.crc32(blob):08x} checkpoint.h5\n"
    with open(os.path.join(path, "manifest.txt"), "w") as f:
        f.write(text + f"end {zlib.crc32(text.encode()):08x}\n")


def test_export_synthetic(rng):
    with tempfile.TemporaryDirectory() as tmp:
        for i, (what, NH, NKV, tied, _, _) in enumerate(CASES):
            path, cfg = hf_dir(tmp, rng, NH, NKV, tied, "F32", 1, name=f"in{i}")
            _, P = ref.read_hf_dir(path)
            toml = (f'[model]\narch = "llama"\nrope_theta = {cfg["rope_theta"]!r}\n'
                    f'norm_eps = 1e-05\n')
            ckpt = os.path.join(tmp, f"ckpt{i}")
            fake_checkpoint(ckpt, cfg, ours_global(P, cfg), toml)
            for dtype in ("fp32", "bf16"):
                out = os.path.join(tmp, f"out{i}{dtype}")
                r = subprocess.run(EXPORT + ["hf", ckpt, out, "--dtype", dtype],
                                   capture_output=True, text=True, timeout=120)
                if r.returncode != 0:
                    checks.check(f"export {what} {dtype}", False, r.stderr.strip())
                    continue
                got_cfg, got = ref.read_hf_dir(out)
                tensors, _ = ref.read_safetensors(os.path.join(out, "model.safetensors"))
                want = {k: ref.bf16_bits_to_f32(ref.f32_to_bf16_bits(v)) if dtype == "bf16"
                        else v for k, v in P.items()}
                worst = max(float(np.max(np.abs(got[k] - want[k]))) for k in want) \
                    if set(got) == set(want) else float("inf")
                same_cfg = all(got_cfg.get(k) == v for k, v in cfg.items() if k != "torch_dtype")
                dtypes = {d for d, _ in tensors.values()}
                checks.check(f"export {what} {dtype}", worst == 0 and same_cfg and
                             dtypes == {"F32" if dtype == "fp32" else "BF16"},
                             f"{len(got)} tensors, max |exported - original| = {worst:g}, "
                             f"config.json {'equal' if same_cfg else 'DIFFERS'}, dtypes {dtypes}")


def test_export_roundtrip(tmp, rng, tokens):
    """Import -> one lr = 0 step -> checkpoint -> export: the tensors imported, exactly. The GQA
    case at tp 2 (each rank read its q/k/v sections), the tied BF16 one exported as BF16 (the
    same bits as the file read)."""
    for i, tp, dtype in ((0, 2, "fp32"), (1, 1, "bf16")):
        what, NH, NKV, tied, in_dtype, shards = CASES[i]
        path, cfg = hf_dir(tmp, rng, NH, NKV, tied, in_dtype, shards, name=f"rt{i}")
        sec = sections(tmp, path, steps=1, lr=0.0)
        sec["checkpoint"] = {"dir": os.path.join(tmp, f"rtckpt{i}"), "every": 1}
        run(write_config(tmp, f"rt{i}.toml", sec), [f"--parallel.tp={tp}"], np_ranks=tp)
        out = os.path.join(tmp, f"rtout{i}")
        r = subprocess.run(EXPORT + ["hf", os.path.join(tmp, f"rtckpt{i}"), out, "--dtype", dtype],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            checks.check(f"round trip {what}", False, r.stderr.strip())
            continue
        got_cfg, got = ref.read_hf_dir(out)
        if dtype == "bf16":  # the stored bits, not their values
            got = {k: a for k, (_, a) in ref.read_safetensors(
                os.path.join(out, "model.safetensors"))[0].items()}
            want = {}
            for file in os.listdir(path):
                if file.endswith(".safetensors"):
                    want.update({k: a for k, (_, a) in ref.read_safetensors(
                        os.path.join(path, file))[0].items()})
        else:
            want = ref.read_hf_dir(path)[1]
        same = set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)
        same_cfg = all(got_cfg.get(k) == v for k, v in cfg.items() if k != "torch_dtype")
        checks.check(f"import, lr 0 step at tp {tp}, export {dtype}: {what}", same and same_cfg,
                     f"{len(got)} tensors {'bit-identical' if same else 'DIFFER'}, config.json "
                     f"{'equal' if same_cfg else 'DIFFERS'}")


# ---------------------------------------------------------------------------------------------
# 5. Training against the float64 reference
# ---------------------------------------------------------------------------------------------
def llama_trains(tmp, path):
    """False (after a SKIP line) while the trainer refuses arch = "llama"."""
    r = run(write_config(tmp, "probe.toml", sections(tmp, path, steps=1)),
            ["--check-config"], check=False, timeout=120)
    if "llama architecture is not built yet" in r.stdout + r.stderr:
        print("  SKIP training from Hugging Face weights: the trainer does not build the Llama "
              "model yet (issue 22, branch llama-model)")
        return False
    return True


def test_training(rng):
    with tempfile.TemporaryDirectory() as tmp:
        tokens = learnable_tokens(rng, 3000, V)
        gref.write_shard(os.path.join(tmp, "train_000.bin"), tokens)
        probe, _ = hf_dir(tmp, rng, 4, 2, False, "F32", 1, name="probe")
        if not llama_trains(tmp, probe):
            return
        steps, lr = 12, 3e-3
        for i, (what, NH, NKV, tied, dtype, shards) in enumerate(CASES):
            path, cfg = hf_dir(tmp, rng, NH, NKV, tied, dtype, shards, name=f"case{i}")
            sec = sections(tmp, path, steps=steps)
            del sec["checkpoint"]
            _, P = ref.read_hf_dir(path)
            theirs = ref.train_losses(P, cfg, tokens, steps, 2, T, lr=lr)
            layouts = [("one rank", [], 0)]
            if i == 0:  # every rank reads only its blocks: q/k/v sections over tp, stages over pp
                layouts.append(("tp2 x pp2", ["--parallel.tp=2", "--parallel.pp=2",
                                              "--train.grad_accum=2", "--train.micro_batch=1"], 4))
            for layout, overrides, np_ranks in layouts:
                if os.path.exists(os.path.join(tmp, "metrics.jsonl")):
                    os.remove(os.path.join(tmp, "metrics.jsonl"))
                run(write_config(tmp, "c.toml", sec), overrides, np_ranks=np_ranks)
                ours = [s["loss"] for s in read_metrics(os.path.join(tmp, "metrics.jsonl"))[0]]
                err = max_rel(ours, theirs) if len(ours) == steps else float("inf")
                checks.check(f"trains like float64: {what}, {layout}", err < TRAIN_TOL,
                             f"max rel loss error {err:.2e} over {steps} steps (tolerance "
                             f"{TRAIN_TOL:g}); loss {theirs[0]:.4f} -> {theirs[-1]:.4f}")
        for what, path, words in bad_inputs(tmp, rng):
            refused(tmp, f"trainer: {what}", sections(tmp, path), words)
        test_export_roundtrip(tmp, rng, tokens)


def main():
    rng = seeded_rng("test_llama_hf")
    if not os.path.exists(READER):
        sys.exit(f"{READER} is missing: make BUILD={BUILD} test-bins")
    checks.run_each(lambda: test_reader(rng), lambda: test_reader_refusals(rng),
                    lambda: test_config_refusals(rng), lambda: test_export_synthetic(rng),
                    lambda: test_training(rng))
    checks.report()


if __name__ == "__main__":
    main()
