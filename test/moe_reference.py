"""test/moe_reference.py - GPT with mixture-of-experts blocks in PyTorch float64: the oracle of
test/test_moe_grads.py. It shares no code with the trainer; the attention, LayerNorms and head
are test/gpt2_reference.py's, the MoE MLP is written here from the definition at the top of
model/moe.cu:

  z = x W_r^T (E logits per token, W_r (E,C), no bias), p = softmax(z), lse = logsumexp(z)
  chosen = the top_k experts by p, a tie going to the lower expert index (a stable sort of -p)
  g_e = p_e / sum_{chosen} p when top_k > 1, the raw p_e when top_k = 1
  out = sum_{e chosen} g_e (gelu_tanh(x W_fc,e^T + b_fc,e) W_proj,e^T + b_proj,e)
  load balance, per sequence s of T tokens: f_{s,e} = (slots of s's tokens choosing e)/(T top_k)
    (a count: no gradient), P_{s,e} = mean over s's tokens of p_e, aux_s = E sum_e f P;
    term = moe_aux_loss * mean over the batch's sequences, summed over the MoE layers
  z-loss: moe_z_loss * mean over tokens of lse^2, summed over the MoE layers
  the loss the optimizer sees: mean cross-entropy + the two terms

The newer options (cfg keys; absent: off):
  score "sigmoid": p = sigmoid(z) instead (lse still of z; gates the same formulas on this p)
  bias {layer: (E,)}: the top_k are chosen by p + b (a stable sort of -(p + b)); gates from p
  capacity c > 0: each expert keeps at most ceil(c * B*T * top_k / E) of the batch's (token,
    slot) pairs, walked in token order (sequence, position) then slot order; a dropped pair's
    output weighs 0 (f in the balance loss still counts the router's choices)
  S shared experts: out += gelu_tanh(x W_s,fc^T + b_s,fc) W_s,proj^T + b_s,proj, one MLP of
    hidden S*D (h.<l>/mlp/shared/fc/weight (S*D,C) ...)

Block l is an MoE block when n_experts > 0 and (l + 1) % moe_every == 0. Tensor names are the
trainer's: h.<l>/mlp/router/weight (E,C), h.<l>/mlp/experts/fc/weight (E*D,C) (expert e's rows
[e*D, (e+1)*D)), experts/proj/weight (E*C,D), experts/fc/bias (E*D), experts/proj/bias (E*C).
"""
import math

import torch
import torch.nn.functional as F

import gpt2_reference as ref


def is_moe(l, E, moe_every):
    return E > 0 and (l + 1) % moe_every == 0


def param_shapes(L, C, T, V, E, D, moe_every, S=0):
    """{name: shape} of every tensor of the model (the dense MLP is 4C wide; S shared
    experts of D)."""
    Vp = ref.padded_vocab(V)
    shapes = {"wte": (Vp, C), "wpe": (T, C), "ln_f/weight": (C,), "ln_f/bias": (C,)}
    for l in range(L):
        h = f"h.{l}/"
        shapes.update({h + "ln_1/weight": (C,), h + "ln_1/bias": (C,),
                       h + "attn/qkv/weight": (3 * C, C), h + "attn/qkv/bias": (3 * C,),
                       h + "attn/proj/weight": (C, C), h + "attn/proj/bias": (C,),
                       h + "ln_2/weight": (C,), h + "ln_2/bias": (C,)})
        if is_moe(l, E, moe_every):
            shapes.update({h + "mlp/router/weight": (E, C),
                           h + "mlp/experts/fc/weight": (E * D, C),
                           h + "mlp/experts/proj/weight": (E * C, D),
                           h + "mlp/experts/fc/bias": (E * D,),
                           h + "mlp/experts/proj/bias": (E * C,)})
            if S > 0:
                shapes.update({h + "mlp/shared/fc/weight": (S * D, C),
                               h + "mlp/shared/fc/bias": (S * D,),
                               h + "mlp/shared/proj/weight": (C, S * D),
                               h + "mlp/shared/proj/bias": (C,)})
        else:
            shapes.update({h + "mlp/fc/weight": (4 * C, C), h + "mlp/fc/bias": (4 * C,),
                           h + "mlp/proj/weight": (C, 4 * C), h + "mlp/proj/bias": (C,)})
    return shapes


def choose(p, top_k):
    """The top_k experts of each token by p (..., E), ties to the lower index."""
    return torch.sort(-p.detach(), dim=-1, stable=True).indices[..., :top_k]


def keep_within_capacity(chosen, E, capacity):
    """(B,T,top_k) 1 for the pairs an expert keeps, 0 for those over its capacity: pairs in
    token order (sequence, position), then slot order."""
    B, T, k = chosen.shape
    cap = math.ceil(capacity * B * T * k / E)
    keep = torch.ones(chosen.shape, dtype=torch.float64)
    taken = [0] * E
    for b in range(B):
        for t in range(T):
            for j in range(k):
                e = int(chosen[b, t, j])
                if taken[e] < cap:
                    taken[e] += 1
                else:
                    keep[b, t, j] = 0
    return keep


def moe_mlp(P, l, x, E, top_k, aux_coef, z_coef, chosen=None, opts=None):
    """Block l's MoE MLP on x (B,T,C). Returns (out, aux term, z term, chosen (B,T,top_k),
    p (B,T,E) detached, pairs dropped).
    chosen overrides the routing (the trainer's choices, where fp32 and float64 disagree on a
    near tie); the gates still come from this p. opts: score, bias, capacity, S (the top)."""
    opts = opts or {}
    B, T, C = x.shape
    h = f"h.{l}/mlp/"
    z = x @ P[h + "router/weight"].T
    p = torch.sigmoid(z) if opts.get("score") == "sigmoid" else z.softmax(dim=-1)
    lse = torch.logsumexp(z, dim=-1)
    bias = opts.get("bias", {}).get(l)
    if chosen is None:
        chosen = choose(p if bias is None else p + bias, top_k)
    picked = p.gather(-1, chosen)
    gates = picked / picked.sum(-1, keepdim=True) if top_k > 1 else picked
    dropped = 0
    if opts.get("capacity", 0) > 0:
        keep = keep_within_capacity(chosen, E, opts["capacity"])
        dropped = int((keep == 0).sum())
        gates = gates * keep
    D = P[h + "experts/fc/weight"].shape[0] // E
    fc_w = P[h + "experts/fc/weight"].reshape(E, D, C)
    proj_w = P[h + "experts/proj/weight"].reshape(E, C, D)
    fc_b = P[h + "experts/fc/bias"].reshape(E, D)
    proj_b = P[h + "experts/proj/bias"].reshape(E, C)
    out = torch.zeros_like(x)
    for e in range(E):
        weight = (gates * (chosen == e)).sum(-1, keepdim=True)  # (B,T,1), 0 where not chosen
        y = F.gelu(x @ fc_w[e].T + fc_b[e], approximate="tanh") @ proj_w[e].T + proj_b[e]
        out = out + weight * y
    if opts.get("S", 0) > 0:
        out = out + (F.gelu(x @ P[h + "shared/fc/weight"].T + P[h + "shared/fc/bias"],
                            approximate="tanh") @ P[h + "shared/proj/weight"].T
                     + P[h + "shared/proj/bias"])
    counts = F.one_hot(chosen, E).sum(dim=(1, 2)).to(x.dtype)  # (B,E) slots per sequence
    f = counts / (T * top_k)
    aux = aux_coef * (E * (f * p.mean(dim=1)).sum(-1)).mean()
    zl = z_coef * (lse ** 2).mean()
    return out, aux, zl, chosen, p.detach(), dropped


def moe_gpt_loss(P, idx, targets, cfg, chosen=None):
    """(total, lm, aux, z, {layer: chosen}, {layer: p}) of the MoE GPT on idx (B,T), float64.
    cfg: L, NH, V, E, top_k, moe_every, aux, z. chosen: {layer: (B,T,top_k)} overrides."""
    terms = {"aux": 0.0, "z": 0.0, "chosen": {}, "p": {}, "dropped": 0}

    def mlp(P, l, ln2):
        if not is_moe(l, cfg["E"], cfg["moe_every"]):
            return ref.dense_mlp(P, l, ln2)
        out, aux, zl, ch, p, dropped = moe_mlp(P, l, ln2, cfg["E"], cfg["top_k"], cfg["aux"],
                                               cfg["z"], None if chosen is None else chosen.get(l),
                                               cfg)
        terms["aux"] = terms["aux"] + aux
        terms["z"] = terms["z"] + zl
        terms["chosen"][l] = ch
        terms["p"][l] = p
        terms["dropped"] += dropped
        return out

    lm = ref.gpt2_loss(P, idx, targets, cfg["L"], cfg["NH"], cfg["V"], mlp=mlp)
    moe_gpt_loss.dropped = terms["dropped"]  # pairs the capacity dropped (the last call)
    return (lm + terms["aux"] + terms["z"], lm, terms["aux"], terms["z"], terms["chosen"],
            terms["p"])
