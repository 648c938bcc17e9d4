"""test/gpt2_reference.py - an independent GPT-2 in PyTorch float64, and llm.c file helpers.

The oracle for the model tests: it shares no code with the trainer. It reads and writes llm.c
model files (a header of 256 int32: magic 20240326, version 3 = fp32 or 5 = bf16, maxT, V, L,
NH, C, Vp; then wte, wpe, each block tensor stacked over the layers, ln_f) and token shards
(256 int32: magic 20240520, version 1, token count; then uint16 tokens, or magic 20240801,
version 7 and uint32), computes the loss and gradients of GPT-2 (pre-LayerNorm blocks with
eps 1e-5, causal attention, tanh GELU, the head tied to wte, cross-entropy over the first V of
the Vp logits; a run at T positions adds the first T rows of wpe), and trains with
torch.optim.AdamW in the llm.c unshuffled data order.

Parameter names match the trainer's ("h.3/attn/qkv/weight", ...), so gradients can be compared
tensor by tensor.
"""
import math
import struct

import numpy as np
import torch
import torch.nn.functional as F

MODEL_MAGIC = 20240326


def padded_vocab(V):
    return (V + 127) // 128 * 128


def block_names(l):
    h = f"h.{l}/"
    return [h + s for s in (
        "ln_1/weight", "ln_1/bias", "attn/qkv/weight", "attn/qkv/bias", "attn/proj/weight",
        "attn/proj/bias", "ln_2/weight", "ln_2/bias", "mlp/fc/weight", "mlp/fc/bias",
        "mlp/proj/weight", "mlp/proj/bias")]


def param_shapes(L, C, T, Vp):
    """Every tensor's shape, in llm.c file order (each block kind stacked over layers)."""
    per_block = {
        "ln_1/weight": (C,), "ln_1/bias": (C,), "attn/qkv/weight": (3 * C, C),
        "attn/qkv/bias": (3 * C,), "attn/proj/weight": (C, C), "attn/proj/bias": (C,),
        "ln_2/weight": (C,), "ln_2/bias": (C,), "mlp/fc/weight": (4 * C, C),
        "mlp/fc/bias": (4 * C,), "mlp/proj/weight": (C, 4 * C), "mlp/proj/bias": (C,)}
    order = [("wte", (Vp, C)), ("wpe", (T, C))]
    for kind, shape in per_block.items():
        for l in range(L):
            order.append((f"h.{l}/{kind}", shape))
    order += [("ln_f/weight", (C,)), ("ln_f/bias", (C,))]
    return order


def write_model(path, params, L, NH, C, T, V, version=3):
    """Writes an llm.c model file (version 3 fp32, 5 bf16) from a dict of numpy arrays."""
    Vp = padded_vocab(V)
    header = np.zeros(256, dtype=np.int32)
    header[:8] = [MODEL_MAGIC, version, T, V, L, NH, C, Vp]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for name, shape in param_shapes(L, C, T, Vp):
            a = np.ascontiguousarray(params[name], dtype=np.float32).reshape(shape)
            if version == 5:
                bits = a.view(np.uint32)
                rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
                f.write(rounded.tobytes())
            else:
                f.write(a.tobytes())


def read_model(path):
    """Returns (params as float64 torch tensors, dict of header fields)."""
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype=np.int32)
        assert header[0] == MODEL_MAGIC, "not an llm.c model file"
        version, T, V, L, NH, C, Vp = (int(x) for x in header[1:8])
        raw = f.read()
    if version == 3:
        flat = np.frombuffer(raw, dtype=np.float32).astype(np.float64)
    else:
        flat = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        flat = flat.astype(np.float64)
    params, off = {}, 0
    for name, shape in param_shapes(L, C, T, Vp):
        n = int(np.prod(shape))
        params[name] = torch.tensor(flat[off:off + n].reshape(shape))
        off += n
    assert off == flat.size, "model file size does not match its header"
    return params, dict(L=L, NH=NH, C=C, T=T, V=V, Vp=Vp, version=version)


def random_params(L, C, T, V, rng, std=0.02, ln_noise=0.1):
    """GPT-2-like random weights, with LayerNorm and bias values perturbed so that every
    gradient path is exercised (zeros and ones hide bugs)."""
    Vp = padded_vocab(V)
    params = {}
    for name, shape in param_shapes(L, C, T, Vp):
        if name.endswith("/weight") and len(shape) == 1:
            params[name] = 1.0 + ln_noise * rng.standard_normal(shape)
        elif len(shape) == 1:
            params[name] = ln_noise * rng.standard_normal(shape)
        else:
            params[name] = std * rng.standard_normal(shape)
    params["wte"][V:] = 0.0
    return {k: v.astype(np.float32) for k, v in params.items()}


def write_shard(path, tokens, version=1):
    """llm.c token shard: v1 uint16 (magic 20240520) or v7 uint32 (magic 20240801)."""
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [20240520 if version == 1 else 20240801, version, len(tokens)]
    dtype = np.uint16 if version == 1 else np.uint32
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=dtype).tobytes())


def llmc_batches(tokens, B, T):
    """llm.c's unshuffled order for one process over one shard: (inputs, targets) of B*T."""
    tokens = np.asarray(tokens, dtype=np.int64)
    per = B * T
    n = (len(tokens) - 1) // per
    while True:
        for s in range(n):
            window = tokens[s * per: s * per + per + 1]
            yield (torch.tensor(window[:-1].reshape(B, T)), torch.tensor(window[1:].reshape(B, T)))


def dense_mlp(P, l, ln2):
    """Block l's MLP: gelu(ln2 W_fc^T + b_fc) W_proj^T + b_proj."""
    h = f"h.{l}/"
    fc = F.gelu(ln2 @ P[h + "mlp/fc/weight"].T + P[h + "mlp/fc/bias"], approximate="tanh")
    return fc @ P[h + "mlp/proj/weight"].T + P[h + "mlp/proj/bias"]


def gpt2_loss(P, idx, targets, L, NH, V, mlp=dense_mlp):
    """Mean cross-entropy of GPT-2 (float64) over idx (B,T). mlp(P, l, ln2) -> block l's MLP
    output (test/moe_reference.py passes its mixture of experts)."""
    B, T = idx.shape
    C = P["wte"].shape[1]
    HS = C // NH
    x = P["wte"][idx] + P["wpe"][:T]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    for l in range(L):
        h = f"h.{l}/"
        ln1 = F.layer_norm(x, (C,), P[h + "ln_1/weight"], P[h + "ln_1/bias"], 1e-5)
        qkv = ln1 @ P[h + "attn/qkv/weight"].T + P[h + "attn/qkv/bias"]
        q, k, v = (t.reshape(B, T, NH, HS).transpose(1, 2) for t in qkv.split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(HS)
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ P[h + "attn/proj/weight"].T + P[h + "attn/proj/bias"]
        ln2 = F.layer_norm(x, (C,), P[h + "ln_2/weight"], P[h + "ln_2/bias"], 1e-5)
        x = x + mlp(P, l, ln2)
    lnf = F.layer_norm(x, (C,), P["ln_f/weight"], P["ln_f/bias"], 1e-5)
    logits = lnf @ P["wte"].T
    return F.cross_entropy(logits[..., :V].reshape(B * T, V), targets.reshape(B * T))


def train_losses(params, cfg, tokens, steps, B, T, grad_accum=1, lr=1e-3, weight_decay=0.0,
                 grad_clip=0.0, betas=(0.9, 0.95), eps=1e-8, schedule=None, skip=(), loss_fn=None):
    """Per-step losses of AdamW training in float64, llm.c unshuffled order, one process.
    Weight decay applies to 2-D tensors only. schedule(step) -> lr for 1-based steps. The
    updates of the steps in `skip` are not applied (torch's AdamW then counts one step fewer).
    loss_fn(P, x, y) replaces GPT-2's loss (test/llama_reference.py passes Llama's)."""
    if loss_fn is None:
        loss_fn = lambda P_, x, y: gpt2_loss(P_, x, y, cfg["L"], cfg["NH"], cfg["V"])  # noqa
    P = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    decay = [p for p in P.values() if p.dim() >= 2]
    no_decay = [p for p in P.values() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=betas, eps=eps, foreach=False)
    batches = llmc_batches(tokens, B, T)
    losses = []
    for step in range(1, steps + 1):
        opt.zero_grad()
        total = 0.0
        for _ in range(grad_accum):
            x, y = next(batches)
            loss = loss_fn(P, x, y) / grad_accum
            loss.backward()
            total += loss.item()
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(list(P.values()), grad_clip)
        if schedule is not None:
            for g in opt.param_groups:
                g["lr"] = schedule(step)
        if step not in skip:
            opt.step()
        losses.append(total)
    return losses
