"""Golden files for the single-device models (src/model, test_model).

An independent PyTorch implementation of the same math as the C++ modules, written from the
formulas rather than from the C++ code:
  - softmax attention as an explicit masked softmax (not SDPA);
  - linear attention as the full quadratic form o = ((q k^T) * M) v with M_ij = lambda^(i-j), i >= j
    (the C++ model uses the chunked form, so this also checks chunking, with T not a multiple of
    the chunk in one case);
  - MoE routing with a Python loop over choices in priority order (all first choices, then all
    second choices) and per-token expert evaluation.
Each case writes model_<case>.safetensors holding the parameters under the C++ names
(TransformerLM::named_parameters()), "idx", "targets" (with some -1 = ignored), "logits", "loss",
"ce_loss", "aux_loss" (shape [1]), "grad.<name>" for every parameter, and "kept.<layer>" (choices
processed per expert) for MoE layers; metadata carries the options.
"""
import math

import torch
import torch.nn.functional as F

import st

EPS = 1e-5

BASE = dict(arch="gpt", vocab_size=64, n_layer=2, n_head=4, n_embd=32, block_size=32, bias=True, ffn="dense",
            moe_experts=4, moe_top_k=1, moe_capacity_factor=1.25, moe_aux_loss_coef=0.01, moe_z_loss_coef=0.001,
            moe_every=1, linear_chunk=8, mlp_ratio=4)
CASES = {
    "gpt": dict(),
    "linear": dict(arch="linear", bias=False),
    "linear_chunk5": dict(arch="linear", linear_chunk=5),  # T = 24 is not a multiple of 5
    "moe_top1": dict(ffn="moe", moe_top_k=1, moe_capacity_factor=1.0),
    "moe_top2": dict(ffn="moe", moe_top_k=2, moe_every=2, moe_capacity_factor=1.25),
    "linear_moe": dict(arch="linear", ffn="moe", moe_top_k=2, moe_capacity_factor=0.75),
}
B, T = 2, 24


def is_moe(cfg, layer):
    return cfg["ffn"] == "moe" and (layer + 1) % cfg["moe_every"] == 0


def make_params(cfg):
    """Random parameters (non-trivial norms and biases so every path matters), C++ names."""
    C, V, H = cfg["n_embd"], cfg["vocab_size"], cfg["mlp_ratio"] * cfg["n_embd"]
    p = {}

    def lin(name, n_out, n_in, std=0.1):
        p[f"{name}.weight"] = torch.randn(n_out, n_in) * std
        if cfg["bias"]:
            p[f"{name}.bias"] = torch.randn(n_out) * 0.05

    def norm(name):
        p[f"{name}.weight"] = 1 + 0.1 * torch.randn(C)
        if cfg["arch"] == "gpt" and cfg["bias"]:
            p[f"{name}.bias"] = 0.05 * torch.randn(C)

    p["wte.weight"] = torch.randn(V, C) * 0.3
    if cfg["arch"] == "gpt":
        p["wpe.weight"] = torch.randn(cfg["block_size"], C) * 0.1
    for l in range(cfg["n_layer"]):
        h = f"h.{l}"
        norm(f"{h}.ln_1")
        if cfg["arch"] == "gpt":
            lin(f"{h}.attn.c_attn", 3 * C, C)
            lin(f"{h}.attn.c_proj", C, C)
        else:
            for proj in ("q_proj", "k_proj", "v_proj", "u_proj", "o_proj"):
                lin(f"{h}.attn.{proj}", C, C, std=0.2)
        norm(f"{h}.ln_2")
        if is_moe(cfg, l):
            E = cfg["moe_experts"]
            p[f"{h}.moe.router.weight"] = torch.randn(E, C) * 0.3
            p[f"{h}.moe.w_fc"] = torch.randn(E, C, H) * 0.1
            p[f"{h}.moe.w_proj"] = torch.randn(E, H, C) * 0.1
            if cfg["bias"]:
                p[f"{h}.moe.b_fc"] = torch.randn(E, H) * 0.05
                p[f"{h}.moe.b_proj"] = torch.randn(E, C) * 0.05
        else:
            lin(f"{h}.mlp.c_fc", (2 if cfg["arch"] == "linear" else 1) * H, C)
            lin(f"{h}.mlp.c_proj", C, H)
    norm("ln_f")
    return {k: v.float().requires_grad_(True) for k, v in p.items()}


def linear(p, name, x):
    y = x @ p[f"{name}.weight"].t()
    return y + p[f"{name}.bias"] if f"{name}.bias" in p else y


def normalize(cfg, p, name, x):
    if cfg["arch"] == "gpt":
        return F.layer_norm(x, (x.shape[-1],), p[f"{name}.weight"], p.get(f"{name}.bias"), EPS)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * p[f"{name}.weight"]


def heads(x, n_head):
    b, t, c = x.shape
    return x.view(b, t, n_head, c // n_head).transpose(1, 2)


def softmax_attention(cfg, p, h, x):
    q, k, v = linear(p, f"{h}.attn.c_attn", x).split(cfg["n_embd"], -1)
    q, k, v = (heads(t, cfg["n_head"]) for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
    y = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
    return linear(p, f"{h}.attn.c_proj", y.transpose(1, 2).reshape(x.shape))


def alibi_slopes(n):
    def pow2(m):
        return [2 ** (-8 * (i + 1) / m) for i in range(m)]
    base = 2 ** int(math.floor(math.log2(n)))
    return pow2(base) + pow2(2 * base)[0::2][: n - base]


def decayed_linear_attention(q, k, v, lam):
    """o_i = sum_{j<=i} lam^(i-j) (q_i . k_j) v_j, all positions at once."""
    t = q.shape[2]
    i = torch.arange(t, dtype=torch.float64)
    dist = i[:, None] - i[None, :]
    m = torch.where(dist >= 0, lam.double()[:, None, None] ** dist.clamp(min=0), torch.zeros(()))
    return ((q @ k.transpose(-1, -2)) * m.float()) @ v


def linear_attention(cfg, p, h, x):
    q = heads(F.silu(linear(p, f"{h}.attn.q_proj", x)), cfg["n_head"])
    k = heads(F.silu(linear(p, f"{h}.attn.k_proj", x)), cfg["n_head"])
    v = heads(linear(p, f"{h}.attn.v_proj", x), cfg["n_head"])
    lam = torch.exp(-torch.tensor(alibi_slopes(cfg["n_head"]), dtype=torch.float64))
    o = decayed_linear_attention(q, k, v, lam)
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + EPS)
    o = o.transpose(1, 2).reshape(x.shape) * torch.sigmoid(linear(p, f"{h}.attn.u_proj", x))
    return linear(p, f"{h}.attn.o_proj", o)


def mlp(cfg, p, h, x):
    a = linear(p, f"{h}.mlp.c_fc", x)
    if cfg["arch"] == "linear":
        u, g = a.chunk(2, -1)
        return linear(p, f"{h}.mlp.c_proj", u * F.silu(g))
    return linear(p, f"{h}.mlp.c_proj", F.gelu(a, approximate="tanh"))


def moe(cfg, p, h, x):
    """Returns (y, aux_loss, kept_per_expert)."""
    E, k, shape = cfg["moe_experts"], cfg["moe_top_k"], x.shape
    x = x.reshape(-1, shape[-1])
    n = x.shape[0]
    logits = x.float() @ p[f"{h}.moe.router.weight"].float().t()
    probs = logits.softmax(-1)
    top_p, top_e = probs.topk(k, -1)
    gates = top_p if k == 1 else top_p / top_p.sum(-1, keepdim=True)
    capacity = math.ceil(k * n / E * cfg["moe_capacity_factor"])
    counts, kept = [0] * E, [0] * E
    y = [torch.zeros(shape[-1]) for _ in range(n)]
    for c in range(k):
        for t in range(n):
            e = int(top_e[t, c])
            if counts[e] < capacity:
                kept[e] += 1
                hid = x[t] @ p[f"{h}.moe.w_fc"][e]
                hid = F.gelu(hid + p[f"{h}.moe.b_fc"][e] if cfg["bias"] else hid, approximate="tanh")
                out = hid @ p[f"{h}.moe.w_proj"][e]
                out = out + p[f"{h}.moe.b_proj"][e] if cfg["bias"] else out
                y[t] = y[t] + gates[t, c] * out
            counts[e] += 1
    f = torch.bincount(top_e[:, 0], minlength=E).float() / n
    balance = cfg["moe_aux_loss_coef"] * E * (f * probs.mean(0)).sum()
    z = cfg["moe_z_loss_coef"] * torch.logsumexp(logits, -1).pow(2).mean()
    return torch.stack(y).view(shape), balance + z, torch.tensor(kept)


def forward(cfg, p, idx, targets):
    x = p["wte.weight"][idx]
    if cfg["arch"] == "gpt":
        x = x + p["wpe.weight"][: idx.shape[1]]
    aux, kept = torch.zeros(()), {}
    for l in range(cfg["n_layer"]):
        h = f"h.{l}"
        a = normalize(cfg, p, f"{h}.ln_1", x)
        x = x + (softmax_attention if cfg["arch"] == "gpt" else linear_attention)(cfg, p, h, a)
        m = normalize(cfg, p, f"{h}.ln_2", x)
        if is_moe(cfg, l):
            y, layer_aux, kept[l] = moe(cfg, p, h, m)
            aux = aux + layer_aux
        else:
            y = mlp(cfg, p, h, m)
        x = x + y
    logits = normalize(cfg, p, "ln_f", x) @ p["wte.weight"].t()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
    return logits, ce, aux, kept


def generate(out):
    for name, overrides in CASES.items():
        cfg = dict(BASE, **overrides)
        params = make_params(cfg)
        idx = torch.randint(0, cfg["vocab_size"], (B, T))
        targets = torch.randint(0, cfg["vocab_size"], (B, T))
        targets[0, :3] = -1
        logits, ce, aux, kept = forward(cfg, params, idx, targets)
        loss = ce + aux
        loss.backward()
        tensors = {k: v.detach() for k, v in params.items()}
        tensors.update(idx=idx, targets=targets, logits=logits.detach(), loss=loss.detach().reshape(1), ce_loss=ce.detach().reshape(1),
                       aux_loss=aux.detach().reshape(1))
        tensors.update({f"grad.{k}": v.grad for k, v in params.items()})
        tensors.update({f"kept.{l}": v for l, v in kept.items()})
        st.save(out / f"model_{name}.safetensors", tensors, metadata={k: str(v) for k, v in cfg.items()})
