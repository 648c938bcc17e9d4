"""test/test_export.py - tools/export.py: a checkpoint to llm.c and Hugging Face GPT-2 files.

A tiny GPT-2 (L=2, NH=3, C=36, T=16, V=101, padded vocabulary 128) trains 6 steps at np=4 FSDP
and saves; then
1. llm.c: the exported .bin has the llm.c header and size, holds exactly the checkpoint's
   tensors, and ./train_cpu started from it ([init] from, lr = 0, one step, same layout) reports
   the same validation loss as the run that saved the checkpoint, bit for bit.
2. Hugging Face: model.safetensors, read back by a parser written here from the format's
   definition (8-byte little-endian header length, JSON header, contiguous little-endian data),
   has GPT-2's names, F32 dtype, Conv1D weights (in, out) equal to our (out, in) transposed, wte
   cut to vocab_size rows and no lm_head (tied); config.json has the shape. A float64 GPT-2
   forward written in Hugging Face's conventions (x @ W + b, fused c_attn split into q, k, v,
   gelu_new, logits = h @ wte^T) over the validation rows gives the trainer's validation loss
   within 1e-5 relative.
3. A checkpoint with a corrupted file is refused by the exporter, naming the file.
4. A mixture-of-experts checkpoint (one step of a tiny MoE model on one rank) is refused by both
   exports, naming the checkpoint and saying why, and nothing is written.
"""
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference as ref  # noqa: E402
from trainer import Checks, base_sections, make_experiment, read_metrics, run  # noqa: E402
from trainer import write_config, seeded_rng, with_validation  # noqa: E402

checks = Checks("test_export")
L, NH, C, T, V = 2, 3, 36, 16, 101
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPORT = [sys.executable, os.path.join(ROOT, "tools", "export.py")]
NP, MICRO, VAL_BATCHES = 4, 1, 2  # validation: 2 global batches of 4 x 1 rows
FSDP4 = ["--parallel.dp=4", "--parallel.fsdp=true"]


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (hlen,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + hlen])
    data = blob[8 + hlen:]
    meta = header.pop("__metadata__", {})
    spans = sorted(h["data_offsets"] for h in header.values())
    contiguous = spans[0][0] == 0 and spans[-1][1] == len(data) and \
        all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    tensors = {}
    for name, h in header.items():
        a, b = h["data_offsets"]
        tensors[name] = np.frombuffer(data[a:b], dtype="<f4").reshape(h["shape"])
    dtypes = {h["dtype"] for h in header.values()}
    return tensors, meta, contiguous and hlen % 8 == 0, dtypes


def hf_gpt2_loss(W, cfg, idx, targets):
    """Float64 GPT-2 in Hugging Face's conventions, from exported tensors."""
    t = {k: torch.tensor(v, dtype=torch.float64) for k, v in W.items()}
    C, NH, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    B, T = idx.shape
    x = t["transformer.wte.weight"][idx] + t["transformer.wpe.weight"][:T]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    for l in range(cfg["n_layer"]):
        p = f"transformer.h.{l}."
        h = F.layer_norm(x, (C,), t[p + "ln_1.weight"], t[p + "ln_1.bias"], eps)
        q, k, v = (h @ t[p + "attn.c_attn.weight"] + t[p + "attn.c_attn.bias"]).split(C, dim=2)
        q, k, v = (z.view(B, T, NH, C // NH).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-1, -2) / math.sqrt(C // NH)).masked_fill(mask, -math.inf)
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ t[p + "attn.c_proj.weight"] + t[p + "attn.c_proj.bias"]
        h = F.layer_norm(x, (C,), t[p + "ln_2.weight"], t[p + "ln_2.bias"], eps)
        h = F.gelu(h @ t[p + "mlp.c_fc.weight"] + t[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + h @ t[p + "mlp.c_proj.weight"] + t[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), t["transformer.ln_f.weight"], t["transformer.ln_f.bias"], eps)
    logits = x @ t["transformer.wte.weight"].T  # tied lm_head, exactly vocab_size columns
    return float(F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1)))


def val_rows(tmp):
    """The validation rows the trainer averages over: rows of T+1 tokens overlapping by one."""
    with open(os.path.join(tmp, "val_000.bin"), "rb") as f:
        tokens = np.frombuffer(f.read()[1024:], dtype="<u2").astype(np.int64)
    n = NP * MICRO * VAL_BATCHES
    x = np.stack([tokens[i * T:i * T + T] for i in range(n)])
    y = np.stack([tokens[i * T + 1:i * T + T + 1] for i in range(n)])
    return torch.tensor(x), torch.tensor(y)


def test_llmc(tmp, ckpt, val_loss):
    out = os.path.join(tmp, "exported.bin")
    subprocess.run(EXPORT + ["llmc", ckpt, out], check=True, capture_output=True)
    params, hdr = ref.read_model(out)  # asserts magic and size
    with h5py.File(os.path.join(ckpt, "checkpoint.h5"), "r") as f:
        same = all(np.array_equal(params[k].numpy().astype(np.float32), f["model/" + k][...])
                   for k in params)
    header_ok = (hdr["version"], hdr["L"], hdr["NH"], hdr["C"], hdr["T"], hdr["V"], hdr["Vp"]) \
        == (3, L, NH, C, T, V, 128)
    checks.check("llm.c export: header, size and every tensor", same and header_ok, f"{hdr}")
    sec = base_sections(tmp, 1, micro_batch=MICRO, lr=0.0)
    sec["init"]["from"] = out
    with_validation(sec, tmp, 1, VAL_BATCHES)
    sec["log"]["metrics"] = os.path.join(tmp, "reload.jsonl")
    run(write_config(tmp, "reload.toml", sec), FSDP4, np_ranks=NP)
    again = read_metrics(os.path.join(tmp, "reload.jsonl"))[1][0]["val_loss"]
    checks.check("llm.c export loaded by ./train_cpu gives the same loss", again == val_loss,
                 f"val loss {again} from the export vs {val_loss} from the run that saved it")


def test_hf(tmp, ckpt, val_loss):
    out = os.path.join(tmp, "hf")
    subprocess.run(EXPORT + ["hf", ckpt, out], check=True, capture_output=True)
    W, meta, well_formed, dtypes = read_safetensors(os.path.join(out, "model.safetensors"))
    cfg = json.load(open(os.path.join(out, "config.json")))
    names = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight",
             "transformer.ln_f.bias"}
    for l in range(L):
        names |= {f"transformer.h.{l}.{n}" for n in (
            "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
            "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
            "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias")}
    with h5py.File(os.path.join(ckpt, "checkpoint.h5"), "r") as f:
        values = (np.array_equal(W["transformer.wte.weight"], f["model/wte"][:V]) and
                  np.array_equal(W["transformer.h.1.attn.c_attn.weight"],
                                 f["model/h.1/attn/qkv/weight"][...].T) and
                  np.array_equal(W["transformer.h.0.mlp.c_proj.weight"],
                                 f["model/h.0/mlp/proj/weight"][...].T) and
                  np.array_equal(W["transformer.h.0.ln_2.bias"], f["model/h.0/ln_2/bias"][...]))
        P = {k: torch.tensor(f["model/" + k][...], dtype=torch.float64)
             for k, _ in ref.param_shapes(L, C, T, 128)}
    shapes = (W["transformer.wte.weight"].shape, W["transformer.h.0.attn.c_attn.weight"].shape,
              W["transformer.h.0.mlp.c_proj.weight"].shape)
    config_ok = (cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["n_positions"],
                 cfg["vocab_size"], cfg["activation_function"], cfg["tie_word_embeddings"]) == \
        (L, NH, C, T, V, "gelu_new", True)
    checks.check("safetensors: header, names, dtype, shapes, transposed values, config.json",
                 well_formed and set(W) == names and dtypes == {"F32"} and values and config_ok
                 and shapes == ((V, C), (C, 3 * C), (4 * C, C)) and meta.get("format") == "pt",
                 f"{len(W)} tensors, wte {shapes[0]}, c_attn {shapes[1]}, mlp.c_proj {shapes[2]}")
    x, y = val_rows(tmp)
    hf = hf_gpt2_loss(W, cfg, x, y)
    ours = float(ref.gpt2_loss(P, x, y, L, NH, V))
    rel = abs(hf - val_loss) / val_loss
    checks.check("Hugging Face-convention forward of the export = trainer's loss",
                 rel < 1e-5 and abs(hf - ours) < 1e-10,
                 f"{hf:.8f} vs trainer {val_loss:.8f} (rel {rel:.1e}); vs our-layout float64 "
                 f"{abs(hf - ours):.1e}")


def test_refuses_corrupt(tmp, ckpt):
    bad = os.path.join(tmp, "bad")
    shutil.copytree(ckpt, bad)
    victim = os.path.join(bad, "rank_00001.h5")
    with open(victim, "r+b") as f:
        f.seek(os.path.getsize(victim) - 100)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 1]))
    r = subprocess.run(EXPORT + ["hf", bad, os.path.join(tmp, "never")], capture_output=True,
                       text=True)
    checks.check("exporter refuses a corrupt checkpoint naming the file",
                 r.returncode != 0 and victim in r.stderr and
                 not os.path.exists(os.path.join(tmp, "never")), r.stderr.strip()[:200])


def test_refuses_moe(tmp):
    sec = base_sections(tmp, 1, micro_batch=MICRO)
    del sec["init"]  # an MoE model starts from random init
    sec["model"] = {"n_layer": L, "n_head": NH, "d_model": C, "seq_len": T, "vocab_size": V,
                    "n_experts": 4, "top_k": 2}
    sec["checkpoint"] = {"dir": os.path.join(tmp, "moe_ck")}
    run(write_config(tmp, "moe.toml", sec))
    ckpt = os.path.join(tmp, "moe_ck", "step_000001")
    for fmt, out in (("llmc", "moe.bin"), ("hf", "moe_hf")):
        out = os.path.join(tmp, out)
        r = subprocess.run(EXPORT + [fmt, ckpt, out], capture_output=True, text=True)
        checks.check(f"{fmt} export refuses an MoE checkpoint, naming it",
                     r.returncode != 0 and ckpt in r.stderr and "mixture-of-experts" in r.stderr
                     and "no llm.c or Hugging Face GPT-2 equivalent" in r.stderr and
                     not os.path.exists(out), r.stderr.strip()[:200])


def main():
    rng = seeded_rng("test_export")
    with tempfile.TemporaryDirectory() as tmp:
        make_experiment(tmp, rng, L=L, NH=NH, C=C, T=T, V=V)
        sec = base_sections(tmp, 6, micro_batch=MICRO)
        with_validation(sec, tmp, 6, VAL_BATCHES)
        sec["checkpoint"] = {"dir": os.path.join(tmp, "ck")}
        run(write_config(tmp, "c.toml", sec), FSDP4, np_ranks=NP)
        val_loss = read_metrics(os.path.join(tmp, "metrics.jsonl"))[1][-1]["val_loss"]
        ckpt = os.path.join(tmp, "ck", "step_000006")
        test_llmc(tmp, ckpt, val_loss)
        test_hf(tmp, ckpt, val_loss)
        test_refuses_corrupt(tmp, ckpt)
        test_refuses_moe(tmp)
    checks.report()


if __name__ == "__main__":
    main()
