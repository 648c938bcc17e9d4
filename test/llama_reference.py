"""test/llama_reference.py - an independent Llama in PyTorch float64, and Hugging Face files.

The oracle for the Llama tests: it shares no code with the trainer, and follows Hugging Face's
LlamaForCausalLM as written in its modeling file, in float64:
  - RMSNorm: x / sqrt(mean(x^2) + eps) * w (no bias);
  - rotary embeddings in rotate_half form: inv_freq[j] = theta^(-2j/hd) for j < hd/2, the angle
    of position p is p * inv_freq[j], cos/sin repeated over the two halves of a head, and
    q' = q cos + rotate_half(q) sin with rotate_half([a | b]) = [-b | a]; positions 0..T-1;
  - grouped-query attention: query head h reads kv head h // (n_head / n_kv_head), causal,
    scaled by 1/sqrt(hd);
  - SwiGLU MLP: down(silu(gate(x)) * up(x)); no biases anywhere;
  - logits = norm(x) lm_head^T, or embed_tokens^T when tie_word_embeddings; the loss is the mean
    cross-entropy over the V logits.
Parameters carry Hugging Face's names ("model.layers.0.self_attn.q_proj.weight", ...).

Mixtral (config model_type "mixtral", MixtralForCausalLM), as its modeling file writes the sparse
MoE block that replaces every MLP: router logits = h gate^T (E = num_local_experts), weights =
softmax over all E, the top k = num_experts_per_tok of them by torch.topk, renormalised over
those k; out = sum over the chosen experts of weight * w2(silu(w1 h) * w3 h), experts of hidden
size intermediate_size, no biases. Its tensors: block_sparse_moe.gate.weight (E, C) and
block_sparse_moe.experts.e.{w1,w3}.weight (F, C), w2.weight (C, F).

Files:
  - safetensors, read and written with struct + json + numpy: an 8-byte little-endian header
    length n, n bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}} with an
    optional "__metadata__" {str: str}, then the raw little-endian tensors, offsets relative to
    the end of the header. BF16 is kept as its uint16 bit patterns (the top half of an fp32).
  - a Hugging Face model directory: config.json + model.safetensors, or shards
    model-0000k-of-0000n.safetensors with model.safetensors.index.json {"metadata",
    "weight_map": {tensor: file}}.
Training (train_losses) is gpt2_reference's: torch.optim.AdamW, weight decay on 2-D tensors
only, the trainer's lr schedule via `schedule`, llm.c's unshuffled batch order.
"""
import json
import math
import os
import struct

import numpy as np
import torch
import torch.nn.functional as F

import gpt2_reference

# dtype name -> (numpy dtype of the stored bits, bytes per element)
ST_DTYPES = {"F32": ("<f4", 4), "BF16": ("<u2", 2), "F16": ("<f2", 2), "F64": ("<f8", 8),
             "I64": ("<i8", 8), "I32": ("<i4", 4)}


# ---------------------------------------------------------------------------------------------
# bf16 bits
# ---------------------------------------------------------------------------------------------
def f32_to_bf16_bits(a):
    """Round-to-nearest-even fp32 -> bf16 bit patterns (uint16)."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_bits_to_f32(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


# ---------------------------------------------------------------------------------------------
# safetensors
# ---------------------------------------------------------------------------------------------
def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: (dtype, array)}; an array of dtype "BF16" is uint16 bits, or float (then
    rounded here). Written in name order, back to back, header padded with spaces to 8 bytes."""
    header, blobs, offset = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        dtype, a = tensors[name]
        a = np.asarray(a)
        if dtype == "BF16" and a.dtype != np.uint16:
            a = f32_to_bf16_bits(a)
        blob = np.ascontiguousarray(a, dtype=ST_DTYPES[dtype][0]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def read_safetensors(path):
    """{name: (dtype, array of the stored bits' numpy dtype)}, metadata."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    metadata = header.pop("__metadata__", None)
    out = {}
    for name, h in header.items():
        begin, end = h["data_offsets"]
        a = np.frombuffer(data[begin:end], dtype=ST_DTYPES[h["dtype"]][0])
        out[name] = (h["dtype"], a.reshape(h["shape"]))
    return out, metadata


def as_float64(dtype, a):
    return (bf16_bits_to_f32(a) if dtype == "BF16" else a).astype(np.float64)


# ---------------------------------------------------------------------------------------------
# Hugging Face directories
# ---------------------------------------------------------------------------------------------
def llama_config(L, NH, NKV, C, F_, V, max_pos=64, theta=10000.0, eps=1e-5, tied=False):
    """A LlamaForCausalLM config.json dict."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": C,
            "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": NKV,
            "intermediate_size": F_, "vocab_size": V, "rms_norm_eps": eps, "rope_theta": theta,
            "max_position_embeddings": max_pos, "tie_word_embeddings": tied,
            "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
            "rope_scaling": None, "torch_dtype": "float32", "initializer_range": 0.02}


def mixtral_config(L, NH, NKV, C, F_, V, E, top_k, **kw):
    """A MixtralForCausalLM config.json dict (llama_config's keys otherwise)."""
    cfg = llama_config(L, NH, NKV, C, F_, V, **kw)
    for key in ("attention_bias", "mlp_bias"):
        del cfg[key]
    cfg.update({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                "num_local_experts": E, "num_experts_per_tok": top_k, "sliding_window": None,
                "router_jitter_noise": 0.0})
    return cfg


def is_mixtral(cfg):
    return cfg.get("model_type") == "mixtral"


def hf_shapes(cfg):
    """{name: shape} of every tensor of a LlamaForCausalLM with config cfg."""
    C, V, F_ = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    NH = cfg["num_attention_heads"]
    NKV = cfg.get("num_key_value_heads", NH)
    HS = C // NH
    s = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,)}
    if not cfg.get("tie_word_embeddings", False):
        s["lm_head.weight"] = (V, C)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        s.update({p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,),
                  p + "self_attn.q_proj.weight": (NH * HS, C),
                  p + "self_attn.k_proj.weight": (NKV * HS, C),
                  p + "self_attn.v_proj.weight": (NKV * HS, C),
                  p + "self_attn.o_proj.weight": (C, NH * HS)})
        if is_mixtral(cfg):
            m = p + "block_sparse_moe."
            s[m + "gate.weight"] = (cfg["num_local_experts"], C)
            for e in range(cfg["num_local_experts"]):
                x = f"{m}experts.{e}."
                s.update({x + "w1.weight": (F_, C), x + "w3.weight": (F_, C),
                          x + "w2.weight": (C, F_)})
            continue
        s.update({p + "mlp.gate_proj.weight": (F_, C), p + "mlp.up_proj.weight": (F_, C),
                  p + "mlp.down_proj.weight": (C, F_)})
    return s


def random_llama(cfg, rng, std=0.1, norm_noise=0.2):
    """Random float32 weights: matrices N(0, std) (large enough that attention is far from
    uniform), norm weights 1 + N(0, norm_noise) so that every gradient path is exercised."""
    out = {}
    for name, shape in hf_shapes(cfg).items():
        if len(shape) == 1:
            out[name] = 1.0 + norm_noise * rng.standard_normal(shape)
        else:
            out[name] = std * rng.standard_normal(shape)
    return {k: v.astype(np.float32) for k, v in out.items()}


def write_hf_dir(path, cfg, params, dtype="F32", shards=1):
    """config.json + model.safetensors (shards == 1) or shards + model.safetensors.index.json.
    A parameter that is not float32 is written as given (for bad-input tests)."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    names = sorted(params)
    if shards == 1:
        write_safetensors(os.path.join(path, "model.safetensors"),
                          {n: (dtype, params[n]) for n in names}, {"format": "pt"})
        return
    weight_map = {}
    for k in range(shards):
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = names[k::shards]
        write_safetensors(os.path.join(path, file), {n: (dtype, params[n]) for n in part},
                          {"format": "pt"})
        weight_map.update({n: file for n in part})
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=1)


def read_hf_dir(path):
    """(config dict, {name: float64 numpy array}) of a Hugging Face Llama directory."""
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    params = {}
    for file in files:
        tensors, _ = read_safetensors(os.path.join(path, file))
        params.update({n: as_float64(d, a) for n, (d, a) in tensors.items()})
    return cfg, params


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------
def rms_norm(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_cos_sin(T, hd, theta):
    """cos, sin (T, hd) in float64, the two halves equal."""
    inv_freq = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    angles = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos(), emb.sin()


def mixtral_moe(P, m, h, cfg):
    """Mixtral's sparse MoE block on h (B, T, C): softmax over all E, top k, renormalised."""
    E, k = cfg["num_local_experts"], cfg["num_experts_per_tok"]
    weights = (h @ P[m + "gate.weight"].T).softmax(dim=-1)
    top, chosen = torch.topk(weights, k, dim=-1)
    top = top / top.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(h)
    for e in range(E):
        x = f"{m}experts.{e}."
        y = (F.silu(h @ P[x + "w1.weight"].T) * (h @ P[x + "w3.weight"].T)) @ P[x + "w2.weight"].T
        out = out + (top * (chosen == e)).sum(dim=-1, keepdim=True) * y
    return out


def llama_loss(P, idx, targets, cfg):
    """Mean cross-entropy (float64) of LlamaForCausalLM (or MixtralForCausalLM) over idx (B, T)."""
    B, T = idx.shape
    C, NH = cfg["hidden_size"], cfg["num_attention_heads"]
    NKV = cfg.get("num_key_value_heads", NH)
    HS, eps, V = C // NH, cfg["rms_norm_eps"], cfg["vocab_size"]
    cos, sin = rope_cos_sin(T, HS, cfg.get("rope_theta", 10000.0))
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    x = P["model.embed_tokens.weight"][idx]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms_norm(x, P[p + "input_layernorm.weight"], eps)
        q = (h @ P[p + "self_attn.q_proj.weight"].T).reshape(B, T, NH, HS).transpose(1, 2)
        k = (h @ P[p + "self_attn.k_proj.weight"].T).reshape(B, T, NKV, HS).transpose(1, 2)
        v = (h @ P[p + "self_attn.v_proj.weight"].T).reshape(B, T, NKV, HS).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(NH // NKV, dim=1)  # query head h reads kv head h // group
        v = v.repeat_interleave(NH // NKV, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(HS)
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, NH * HS)
        x = x + y @ P[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, P[p + "post_attention_layernorm.weight"], eps)
        if is_mixtral(cfg):
            x = x + mixtral_moe(P, p + "block_sparse_moe.", h, cfg)
            continue
        mlp = F.silu(h @ P[p + "mlp.gate_proj.weight"].T) * (h @ P[p + "mlp.up_proj.weight"].T)
        x = x + mlp @ P[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, P["model.norm.weight"], eps)
    head = P["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) \
        else P["lm_head.weight"]
    logits = x @ head.T
    return F.cross_entropy(logits.reshape(B * T, V), targets.reshape(B * T))


def train_losses(params, cfg, tokens, steps, B, T, **kw):
    """Per-step losses of float64 AdamW training from params ({HF name: array}); keyword
    arguments as gpt2_reference.train_losses (lr, weight_decay, grad_clip, schedule, ...)."""
    P = {k: torch.tensor(np.asarray(v, dtype=np.float64)) for k, v in params.items()}
    return gpt2_reference.train_losses(P, cfg, tokens, steps, B, T,
                                       loss_fn=lambda P_, x, y: llama_loss(P_, x, y, cfg), **kw)


def main():
    """python3 test/llama_reference.py HF_DIR TOKENS.bin STEPS B T LR: print the losses."""
    import sys
    d, shard, steps, B, T, lr = sys.argv[1:7]
    cfg, params = read_hf_dir(d)
    raw = np.fromfile(shard, dtype=np.int32, count=256)
    tokens = np.fromfile(shard, dtype=np.uint16 if raw[1] == 1 else np.uint32, offset=1024)
    for s, loss in enumerate(train_losses(params, cfg, tokens, int(steps), int(B), int(T),
                                          lr=float(lr)), 1):
        print(f"step {s} loss {loss:.9f}")


if __name__ == "__main__":
    main()
