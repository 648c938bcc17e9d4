#!/usr/bin/python3
"""tools/export.py - a training checkpoint (checkpoint/checkpoint.h) to other formats, using
only h5py and numpy: the checkpoint's index presents every tensor whole, so nothing here knows
how many ranks wrote it.

    /usr/bin/python3 tools/export.py hf   CKPT OUT_DIR   Hugging Face GPT-2: model.safetensors
                                                         + config.json (GPT2LMHeadModel)
    /usr/bin/python3 tools/export.py llmc CKPT OUT.bin   llm.c model file, fp32 (version 3);
                                                         ./train_cpu reads it with [init] from
    /usr/bin/python3 tools/export.py hf CKPT OUT_DIR [--dtype bf16]
                                                         a Llama checkpoint ([model] arch =
                                                         "llama"): Hugging Face LlamaForCausalLM
                                                         (MixtralForCausalLM with experts),
                                                         F32 or BF16; [init] from = OUT_DIR
                                                         reads it back

Both keep the whole position table: all max_seq_len rows of wpe, also when the run trained at a
shorter seq_len, so the export loads at any seq_len up to max_seq_len.

CKPT is a checkpoint directory (dir/step_000123), its checkpoint.h5, or a [checkpoint] dir, in
which case the checkpoint that dir/latest names is taken. Every file is checked against the
manifest (size and CRC32) first: a missing source file of a virtual dataset would otherwise
read as NaN. A GPT-2 mixture-of-experts checkpoint (attribute n_experts > 0) is refused:
neither format has experts or a router.

A Llama with experts (n_experts > 0) is written as Hugging Face MixtralForCausalLM: each layer's
router as block_sparse_moe.gate, expert e's fc rows [gate | up] as experts.e.w1 and w3, its proj
as experts.e.w2; config.json gets model_type "mixtral", num_local_experts, num_experts_per_tok
(top_k), intermediate_size = d_expert, sliding_window null, router_jitter_noise 0. What a
Mixtral cannot hold is refused: moe_every other than 1, shared experts, sigmoid router scores,
top_k = 1 (config/config_hf.cu says why).

Llama (the index's attribute llama = 1, with n_kv_head, d_ff and tie_embeddings; rope_theta and
norm_eps come from the [model] section of the config text the checkpoint stores):
our packed tensors are cut into Hugging Face's (checkpoint/hf_llama.h has the mapping, the
inverse of what [init] from reads): qkv's rows into q_proj (n_head*head_dim rows), k_proj and
v_proj (n_kv_head*head_dim each); fc's into gate_proj and up_proj (d_ff each); wte and lm_head cut
to vocab_size rows; lm_head left out when tied. Linear weights are (out, in) in both, so nothing
is transposed. config.json gets max_position_embeddings = max_seq_len, rope_scaling null. BF16
rounds to nearest even.

Conversions. llm.c keeps our layout: linear weights (out, in), wte with the padded vocabulary,
tensors of one kind stacked over the layers. Hugging Face's GPT-2 uses Conv1D, whose weights are
stored (in, out), i.e. transposed; wte has exactly vocab_size rows; lm_head is tied to wte and
not stored (tie_word_embeddings). safetensors is written by hand: an 8-byte little-endian header
length, a JSON header {name: {dtype, shape, data_offsets}} padded with spaces to 8 bytes, then
the raw little-endian tensors back to back.
"""
import argparse
import json
import os
import struct
import sys
import tomllib
import zlib

import h5py
import numpy as np

BLOCK_KINDS = ("ln_1/weight", "ln_1/bias", "attn/qkv/weight", "attn/qkv/bias",
               "attn/proj/weight", "attn/proj/bias", "ln_2/weight", "ln_2/bias",
               "mlp/fc/weight", "mlp/fc/bias", "mlp/proj/weight", "mlp/proj/bias")

# Ours -> Hugging Face GPT-2 (per block), and whether the weight is transposed (Conv1D).
HF_BLOCK = {"ln_1/weight": ("ln_1.weight", False), "ln_1/bias": ("ln_1.bias", False),
            "attn/qkv/weight": ("attn.c_attn.weight", True),
            "attn/qkv/bias": ("attn.c_attn.bias", False),
            "attn/proj/weight": ("attn.c_proj.weight", True),
            "attn/proj/bias": ("attn.c_proj.bias", False),
            "ln_2/weight": ("ln_2.weight", False), "ln_2/bias": ("ln_2.bias", False),
            "mlp/fc/weight": ("mlp.c_fc.weight", True), "mlp/fc/bias": ("mlp.c_fc.bias", False),
            "mlp/proj/weight": ("mlp.c_proj.weight", True),
            "mlp/proj/bias": ("mlp.c_proj.bias", False)}


def checkpoint_dir(path):
    """The checkpoint directory a CKPT argument names."""
    if os.path.basename(path) == "checkpoint.h5":
        return os.path.dirname(path) or "."
    if os.path.isfile(os.path.join(path, "latest")):
        with open(os.path.join(path, "latest")) as f:
            return os.path.join(path, f.read().strip())
    return path


def verify_manifest(ckpt):
    """Every file listed in manifest.txt is present with its size and CRC32."""
    path = os.path.join(ckpt, "manifest.txt")
    if not os.path.isfile(path):
        sys.exit(f"error: {path} is missing: not a complete checkpoint")
    with open(path, "rb") as f:
        text = f.read()
    end = text.rfind(b"end ")
    if end < 0 or int(text[end + 4:].split()[0], 16) != zlib.crc32(text[:end]):
        sys.exit(f"error: {path} is damaged (its own checksum line does not match)")
    for line in text[:end].decode().splitlines()[1:]:
        size, crc, name = line.split()
        file = os.path.join(ckpt, name)
        if not os.path.isfile(file):
            sys.exit(f"error: {file} is missing (listed in the manifest)")
        if os.path.getsize(file) != int(size):
            sys.exit(f"error: {file} is {os.path.getsize(file)} bytes, the manifest says {size}")
        c = 0
        with open(file, "rb") as f:
            while chunk := f.read(1 << 24):
                c = zlib.crc32(chunk, c)
        if c != int(crc, 16):
            sys.exit(f"error: {file} fails its checksum (the file is corrupt)")


def refuse_moe(f, ckpt):
    """Experts and routers have no place in llm.c's or Hugging Face's GPT-2 (a Llama with
    experts is exported as a Mixtral: mixtral_keys)."""
    experts = int(f.attrs.get("n_experts", 0))  # absent before MoE existed: dense
    if experts > 0 and not int(f.attrs.get("llama", 0)):
        sys.exit(f"error: {ckpt} is a mixture-of-experts model (n_experts = {experts}): MoE has "
                 "no llm.c or Hugging Face GPT-2 equivalent, so it cannot be exported")


def open_checkpoint(path):
    ckpt = checkpoint_dir(path)
    verify_manifest(ckpt)
    f = h5py.File(os.path.join(ckpt, "checkpoint.h5"), "r")
    refuse_moe(f, ckpt)
    shape = {k: int(f.attrs[k]) for k in ("n_layer", "n_head", "d_model", "seq_len",
                                          "vocab_size", "padded_vocab")}
    # wpe's rows; checkpoints written before max_seq_len was recorded trained at all of them
    shape["max_seq_len"] = int(f.attrs.get("max_seq_len", shape["seq_len"]))
    return f, shape


def model_tensor(f, name):
    a = np.asarray(f["model/" + name][...], dtype=np.float32)
    if np.isnan(a).any():
        sys.exit(f"error: model/{name} holds NaN (a source file of the index is unreadable)")
    return a


def llmc_order(L):
    names = ["wte", "wpe"]
    for kind in BLOCK_KINDS:
        names += [f"h.{l}/{kind}" for l in range(L)]
    return names + ["ln_f/weight", "ln_f/bias"]


def export_llmc(f, s, out):
    header = np.zeros(256, dtype="<i4")
    header[:8] = [20240326, 3, s["max_seq_len"], s["vocab_size"], s["n_layer"], s["n_head"],
                  s["d_model"], s["padded_vocab"]]
    with open(out, "wb") as o:
        o.write(header.tobytes())
        for name in llmc_order(s["n_layer"]):
            o.write(model_tensor(f, name).astype("<f4").tobytes())


def hf_tensors(f, s):
    """(name, array) in Hugging Face GPT-2 naming and layout."""
    V, L = s["vocab_size"], s["n_layer"]
    out = [("transformer.wte.weight", model_tensor(f, "wte")[:V]),
           ("transformer.wpe.weight", model_tensor(f, "wpe"))]
    for l in range(L):
        for ours, (theirs, transpose) in HF_BLOCK.items():
            a = model_tensor(f, f"h.{l}/{ours}")
            out.append((f"transformer.h.{l}.{theirs}", a.T if transpose else a))
    out += [("transformer.ln_f.weight", model_tensor(f, "ln_f/weight")),
            ("transformer.ln_f.bias", model_tensor(f, "ln_f/bias"))]
    return out


def bf16_bits(a):
    """fp32 -> bf16 bit patterns, rounded to nearest even (NaN stays NaN)."""
    bits = np.ascontiguousarray(a, dtype="<f4").view("<u4").astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")
    nan = np.isnan(np.asarray(a, dtype=np.float32))
    return np.where(nan, ((bits >> 16) | 0x40).astype("<u2"), rounded)


def write_safetensors(path, tensors, metadata, dtype="F32"):
    header, offset = {"__metadata__": metadata}, 0
    blobs = []
    for name, a in sorted(tensors, key=lambda kv: kv[0]):
        blob = (bf16_bits(a) if dtype == "BF16" else np.ascontiguousarray(a, dtype="<f4")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as o:
        o.write(struct.pack("<Q", len(text)))
        o.write(text)
        for blob in blobs:
            o.write(blob)


def hf_config(s):
    V = s["vocab_size"]
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": V,
            "n_positions": s["max_seq_len"], "n_ctx": s["max_seq_len"], "n_embd": s["d_model"],
            "n_layer": s["n_layer"], "n_head": s["n_head"], "n_inner": None,
            "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
            "initializer_range": 0.02, "scale_attn_weights": True, "use_cache": True,
            "tie_word_embeddings": True, "bos_token_id": V - 1, "eos_token_id": V - 1,
            "torch_dtype": "float32"}


def llama_keys(f):
    """A Llama's own keys: the index's attributes (llama, n_kv_head, d_ff, tie_embeddings, as
    resolved) and rope_theta, norm_eps from the [model] section of the config text it stores.
    {} for a GPT-2."""
    if not int(f.attrs.get("llama", 0)):
        return {}
    m = {"arch": "llama", "n_kv_head": int(f.attrs["n_kv_head"]), "d_ff": int(f.attrs["d_ff"]),
         "tie_embeddings": bool(int(f.attrs["tie_embeddings"]))}
    text = f["config"][()] if "config" in f else b""
    text = text.decode() if isinstance(text, bytes) else str(text)
    try:
        model = tomllib.loads(text).get("model", {})
    except tomllib.TOMLDecodeError as e:
        sys.exit(f"error: {f.filename}: the config it stores does not parse: {e}")
    for key in ("rope_theta", "norm_eps"):
        if key not in model:
            sys.exit(f"error: {f.filename}: the config it stores has no [model] {key}")
        m[key] = float(model[key])
    if int(f.attrs.get("n_experts", 0)) > 0:
        m.update(mixtral_keys(f, model))
    return m


def mixtral_keys(f, model):
    """A Llama with experts as a Mixtral: n_experts, d_expert from the index's attributes, top_k
    from the stored [model]; what MixtralForCausalLM cannot hold is refused (config/config_hf.cu
    says why each)."""
    m = {"n_experts": int(f.attrs["n_experts"]), "d_expert": int(f.attrs["d_expert"]),
         "top_k": int(model.get("top_k", 2))}
    rules = [("moe_every", int(f.attrs.get("moe_every", 1)) != 1, "every layer of a Mixtral "
              "is an MoE layer (moe_every = 1)"),
             ("n_shared_experts", int(f.attrs.get("n_shared_experts", 0)) != 0,
              "a Mixtral has no shared experts"),
             ("router_score", model.get("router_score", "softmax") != "softmax",
              "a Mixtral's router is a softmax"),
             ("top_k", m["top_k"] < 2, "a Mixtral renormalises a single gate to 1, the router "
              "here keeps the raw softmax probability")]
    for key, bad, why in rules:
        if bad:
            value = model.get(key, f.attrs.get(key))
            sys.exit(f"error: {f.filename}: [model] {key} = {value!r}: not expressible as a "
                     f"Hugging Face Mixtral ({why})")
    return m


def llama_tensors(f, s, m):
    """(name, array) in Hugging Face LlamaForCausalLM naming; all (out, in) as ours."""
    V, L, C, NH = s["vocab_size"], s["n_layer"], s["d_model"], s["n_head"]
    HS, NKV, F = C // NH, m["n_kv_head"], m["d_ff"]
    out = [("model.embed_tokens.weight", model_tensor(f, "wte")[:V]),
           ("model.norm.weight", model_tensor(f, "ln_f/weight"))]
    if not m["tie_embeddings"]:
        out.append(("lm_head.weight", model_tensor(f, "lm_head")[:V]))
    for l in range(L):
        h, p = f"h.{l}/", f"model.layers.{l}."
        qkv = model_tensor(f, h + "attn/qkv/weight")
        out += [(p + "input_layernorm.weight", model_tensor(f, h + "ln_1/weight")),
                (p + "post_attention_layernorm.weight", model_tensor(f, h + "ln_2/weight")),
                (p + "self_attn.q_proj.weight", qkv[:NH * HS]),
                (p + "self_attn.k_proj.weight", qkv[NH * HS:(NH + NKV) * HS]),
                (p + "self_attn.v_proj.weight", qkv[(NH + NKV) * HS:]),
                (p + "self_attn.o_proj.weight", model_tensor(f, h + "attn/proj/weight"))]
        if "n_experts" in m:
            out += mixtral_tensors(f, h, p + "block_sparse_moe.", m, C)
            continue
        fc = model_tensor(f, h + "mlp/fc/weight")
        out += [(p + "mlp.gate_proj.weight", fc[:F]), (p + "mlp.up_proj.weight", fc[F:]),
                (p + "mlp.down_proj.weight", model_tensor(f, h + "mlp/proj/weight"))]
    return out


def mixtral_tensors(f, h, p, m, C):
    """One MoE layer as Mixtral's block_sparse_moe: gate (E, C); per expert w1 (gate) and w3 (up)
    from the expert's fc rows [gate | up] (D each), w2 its proj (C, D)."""
    E, D = m["n_experts"], m["d_expert"]
    fc = model_tensor(f, h + "mlp/experts/fc/weight").reshape(E, 2 * D, C)
    proj = model_tensor(f, h + "mlp/experts/proj/weight").reshape(E, C, D)
    out = [(p + "gate.weight", model_tensor(f, h + "mlp/router/weight"))]
    for e in range(E):
        x = f"{p}experts.{e}."
        out += [(x + "w1.weight", fc[e, :D]), (x + "w3.weight", fc[e, D:]),
                (x + "w2.weight", proj[e])]
    return out


def llama_config(s, m, dtype):
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": s["d_model"], "num_hidden_layers": s["n_layer"],
            "num_attention_heads": s["n_head"], "num_key_value_heads": m["n_kv_head"],
            "intermediate_size": m["d_ff"], "vocab_size": s["vocab_size"],
            "max_position_embeddings": s["max_seq_len"], "rms_norm_eps": m["norm_eps"],
            "rope_theta": m["rope_theta"], "rope_scaling": None,
            "tie_word_embeddings": m["tie_embeddings"], "hidden_act": "silu",
            "attention_bias": False, "mlp_bias": False, "initializer_range": 0.02,
            "use_cache": True, "torch_dtype": "bfloat16" if dtype == "BF16" else "float32"}


def mixtral_config(s, m, dtype):
    """MixtralForCausalLM's config.json: the Llama keys, intermediate_size the experts' hidden
    size, a full attention window, no router noise."""
    c = llama_config(s, m, dtype)
    for key in ("attention_bias", "mlp_bias"):
        del c[key]
    c.update({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
              "intermediate_size": m["d_expert"], "num_local_experts": m["n_experts"],
              "num_experts_per_tok": m["top_k"], "sliding_window": None,
              "router_jitter_noise": 0.0})
    return c


def export_llama(f, s, m, out_dir, dtype):
    os.makedirs(out_dir, exist_ok=True)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), llama_tensors(f, s, m),
                      {"format": "pt", "step": str(int(f.attrs["step"]))}, dtype)
    with open(os.path.join(out_dir, "config.json"), "w") as o:
        json.dump((mixtral_config if "n_experts" in m else llama_config)(s, m, dtype), o,
                  indent=2)
        o.write("\n")


def export_hf(f, s, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), hf_tensors(f, s),
                      {"format": "pt", "step": str(int(f.attrs["step"]))})
    with open(os.path.join(out_dir, "config.json"), "w") as o:
        json.dump(hf_config(s), o, indent=2)
        o.write("\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("format", choices=["hf", "llmc"])
    p.add_argument("checkpoint")
    p.add_argument("out")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                   help="hf of a Llama: the tensors' dtype (GPT-2 exports are fp32)")
    args = p.parse_args()
    f, shape = open_checkpoint(args.checkpoint)
    m = llama_keys(f)
    llama = bool(m)
    if llama and args.format == "llmc":
        sys.exit(f"error: {f.filename} is a Llama ([model] arch = \"llama\"): llm.c files hold "
                 "GPT-2 only; export it with `hf`")
    if args.dtype == "bf16" and not llama:
        sys.exit("error: --dtype bf16 is for Llama exports; GPT-2 exports are fp32")
    if args.format == "llmc":
        export_llmc(f, shape, args.out)
    elif llama:
        export_llama(f, shape, m, args.out, "BF16" if args.dtype == "bf16" else "F32")
    else:
        export_hf(f, shape, args.out)
    print(f"exported step {int(f.attrs['step'])} of {f.filename} to {args.out}")


if __name__ == "__main__":
    main()
