#!/usr/bin/env python3
"""The PyTorch twin of `tessera bench`: the same GPT (pre-LayerNorm, learned positions, SDPA causal
attention, GELU-tanh MLP, tied head), or with --family llama the same Llama (RMSNorm, rotary
positions, grouped-query SDPA attention, SwiGLU MLP, untied head, no biases), the same AdamW (fused, decay on matrices only), gradient
clipping and synthetic batch, in eager mode or under torch.compile. Prints one JSON object.

--device cuda times each step between two torch.cuda.synchronize() calls (the step's kernels are
asynchronous); --dtype bf16 runs the forward and loss under bf16 autocast with float32 parameters,
gradients and optimizer state, as tessera's precision.dtype = bf16 does.
--trace FILE records --steps more steps with torch.profiler (host ops and device kernels) into a
Chrome trace, as `tessera_profile_step --trace` does for tessera (bench/trace_summary.py sums both).
--activation-compression bf16|int8|int4 encodes what autograd saves inside each block with
torch.autograd.graph.saved_tensors_hooks, as tessera's memory.activation_compression does
(memory/saved_activations.h): parameters (and views of them), tensors off the gradient's path and
tensors whose last dimension is not adjacent in memory are kept; the others are rounded to bfloat16,
to int8 with one float32 scale per 32 elements of the last dimension, or to int4 (the same groups
scaled to 7, two codes a byte as tessera packs them); CODEC+CORE (int4+int8) encodes what
scaled-dot-product attention saves with CORE, as memory.attention_compression does for tessera's
attention core (which holds the same tensors). Unlike tessera it encodes a
tensor saved twice twice. The bytes it holds at the step's peak (encodings, and kept tensors other
than parameters, each counted whole) are printed as saved_activation_bytes.
--activation-offload N runs the first N blocks under torch.autograd.graph.save_on_cpu(pin_memory=True),
PyTorch's own activation offload, beside tessera's memory.activation_offload: every tensor a block
saves (its parameters too) is copied to host memory when saved (pinned where CUDA is) and back when
used, on the compute stream, without prefetch.
"""
import argparse
import contextlib
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.attn_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


def rotate(x, cos, sin):
    """Rotary positions in the "rotate half" layout (tessera's model/rotary.h, Hugging Face's)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class LlamaBlock(nn.Module):
    def __init__(self, d, heads, kv_heads, hidden):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d // heads
        self.ln_1, self.ln_2 = nn.RMSNorm(d, eps=1e-5), nn.RMSNorm(d, eps=1e-5)
        self.q_proj = nn.Linear(d, d, bias=False)
        self.kv_proj = nn.Linear(d, 2 * kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.up_gate = nn.Linear(d, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, c = x.shape
        h = self.ln_1(x)
        q = self.q_proj(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv_proj(h).view(b, t, 2, self.kv_heads, self.head_dim).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        y = F.scaled_dot_product_attention(rotate(q, cos, sin), rotate(k, cos, sin), v, is_causal=True,
                                           enable_gqa=True)
        x = x + self.o_proj(y.transpose(1, 2).reshape(b, t, c))
        a, g = self.up_gate(self.ln_2(x)).chunk(2, dim=-1)
        return x + self.down(a * F.silu(g))


class Llama(nn.Module):
    def __init__(self, vocab, layers, heads, kv_heads, d, hidden, theta):
        super().__init__()
        self.wte, self.lm_head = nn.Embedding(vocab, d), nn.Linear(d, vocab, bias=False)
        self.h = nn.ModuleList(LlamaBlock(d, heads, kv_heads, hidden) for _ in range(layers))
        self.ln_f = nn.RMSNorm(d, eps=1e-5)
        half = d // heads // 2
        self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(half, dtype=torch.float32) / half),
                             persistent=False)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        angles = torch.outer(torch.arange(idx.shape[1], device=idx.device, dtype=torch.float32), self.inv_freq)
        cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
        x = self.wte(idx)
        for block in self.h:
            x = block(x, cos, sin)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


class GPT(nn.Module):
    def __init__(self, vocab, block, layers, heads, d):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


class SavedActivationCodec:
    """Pack and unpack hooks for the blocks' saved tensors, and the bytes a step's forward packs
    (all of them are held at the forward's end, the peak; `held` is reset before each step)."""

    GROUP = 32

    def __init__(self, model, codec, core=None):
        self.codec, self.core = codec, core or codec
        self.in_core = False
        self.weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.held = self.peak = 0

    def keeps(self, t):
        return (not t.is_floating_point() or not t.requires_grad or t.dim() == 0 or t.stride(-1) != 1
                or t.untyped_storage().data_ptr() in self.weights)

    def count(self, nbytes):
        self.held += nbytes
        self.peak = max(self.peak, self.held)

    def pack(self, t):
        if self.keeps(t):
            weight = t.untyped_storage().data_ptr() in self.weights
            nbytes = 0 if weight else t.numel() * t.element_size()
            self.count(nbytes)
            return ("kept", t, nbytes)
        x = t.detach()
        codec = self.core if self.in_core else self.codec
        if codec == "none":
            nbytes = t.numel() * t.element_size()
            self.count(nbytes)
            return ("kept", t, nbytes)
        if codec == "bf16":
            packed = ("bf16", x.to(torch.bfloat16), t.dtype)
            nbytes = packed[1].numel() * 2
        else:
            last = x.shape[-1]
            rows = x.reshape(-1, last).float()
            pad = (-last) % self.GROUP
            groups = F.pad(rows, (0, pad)).view(-1, self.GROUP)
            top = 127 if codec == "int8" else 7
            amax = groups.abs().amax(dim=1, keepdim=True)
            scale = torch.where(amax > 0, amax / top, torch.ones_like(amax))  # as tessera's codec
            q = torch.round(groups / scale).clamp_(-top, top).to(torch.int8)
            if codec == "int4":  # two codes a byte, offset by 8 into 1..15
                nibbles = (q + 8).to(torch.uint8).view(-1, 2)
                q = nibbles[:, 0] | (nibbles[:, 1] << 4)
            packed = (codec, q, scale, x.shape, t.dtype, pad)
            nbytes = q.numel() + scale.numel() * 4
        self.count(nbytes)
        return packed + (nbytes,)

    def unpack(self, packed):
        if packed[0] == "kept":
            return packed[1]
        if packed[0] == "bf16":
            return packed[1].to(packed[2])
        form, q, scale, shape, dtype, pad, _ = packed
        if form == "int4":
            q = torch.stack([(q & 15), (q >> 4)], dim=1).view(-1, self.GROUP).to(torch.int8) - 8
        rows = (q.float() * scale).view(-1, shape[-1] + pad)
        return rows[:, :shape[-1]].reshape(shape).to(dtype)

    def wrap(self, block):
        forward = block.forward
        sdpa = F.scaled_dot_product_attention

        def core(*args, **kwargs):  # the attention core's saved tensors, encoded with self.core
            self.in_core = True
            try:
                return sdpa(*args, **kwargs)
            finally:
                self.in_core = False

        def hooked(*args, **kwargs):
            F.scaled_dot_product_attention = core
            try:
                with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
                    return forward(*args, **kwargs)
            finally:
                F.scaled_dot_product_attention = sdpa
        block.forward = hooked


def main():
    a = argparse.ArgumentParser()
    for name, default in [("vocab", 256), ("block", 128), ("layers", 4), ("heads", 4), ("embd", 128),
                          ("batch", 16), ("seq", 128), ("steps", 5), ("warmup", 2), ("threads", 0),
                          ("kv_heads", 0), ("ffn", 0)]:
        a.add_argument(f"--{name}", type=int, default=default)
    a.add_argument("--lr", type=float, default=1e-3)
    a.add_argument("--mode", choices=["eager", "compile"], default="eager")
    a.add_argument("--family", choices=["gpt", "llama"], default="gpt")
    a.add_argument("--rope_theta", type=float, default=10000.0)
    a.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    a.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    a.add_argument("--trace", help="record --steps more steps into this Chrome trace")
    a.add_argument("--activation-compression", default="none",
                   choices=["none", "bf16", "int8", "int4", "int4+int8", "none+int8"])
    a.add_argument("--activation-offload", type=int, default=0)
    args = a.parse_args()
    if args.activation_offload and args.activation_compression != "none":
        a.error("--activation-offload and --activation-compression: one at a time")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if args.dtype == "bf16" \
        else contextlib.nullcontext
    torch.manual_seed(1337)
    if args.family == "llama":
        model = Llama(args.vocab, args.layers, args.heads, args.kv_heads or args.heads, args.embd,
                      args.ffn or 4 * args.embd, args.rope_theta).to(device)
    else:
        model = GPT(args.vocab, args.block, args.layers, args.heads, args.embd).to(device)
    params = sum(p.numel() for p in model.parameters())
    codec = None
    if args.activation_compression != "none":
        block_codec, _, core_codec = args.activation_compression.partition("+")
        codec = SavedActivationCodec(model, block_codec, core_codec)
        for block in model.h:
            codec.wrap(block)
    for block in list(model.h)[:args.activation_offload]:
        def offloaded(*a, forward=block.forward, **k):
            with torch.autograd.graph.save_on_cpu(pin_memory=True):
                return forward(*a, **k)
        block.forward = offloaded
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    forward = torch.compile(model) if args.mode == "compile" else model
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(args.vocab, (args.batch, args.seq + 1), generator=g)
    x, y = tokens[:, :-1].to(device), tokens[:, 1:].to(device)

    def step():
        if codec:
            codec.held = 0
        with autocast():
            loss = forward(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    seconds = []
    compile_s = 0.0
    for i in range(args.warmup + args.steps):
        sync()
        start = time.perf_counter()
        loss = step()
        sync()
        s = time.perf_counter() - start
        if i == 0:
            compile_s = s
        if i >= args.warmup:
            seconds.append(s)
    if args.trace:
        activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(args.steps):
                step()
            sync()
        prof.export_chrome_trace(args.trace)
    median = sorted(seconds)[len(seconds) // 2]
    tokens_per_step = args.batch * args.seq
    print(json.dumps({"peer": f"pytorch-{args.mode}", "parameters": params, "tokens_per_step": tokens_per_step,
                      "step_s": seconds, "median_step_s": median, "tokens_per_s": tokens_per_step / median,
                      "first_step_s": compile_s, "threads": torch.get_num_threads(),
                      "torch": torch.__version__, "loss": float(loss.detach()), "device": str(device),
                      "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
                      "dtype": args.dtype, "activation_compression": args.activation_compression,
                      "activation_offload": args.activation_offload,
                      "saved_activation_bytes": codec.peak if codec else None, "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if cuda else None}))


if __name__ == "__main__":
    main()
