"""Golden parameter trajectories for tessera's optimizers (tests/unit/optim/test_optimizers.cpp).

Three parameters (a [4, 6] matrix, a [2, 3, 5] tensor, a [6] vector) take 3 steps with seeded
gradients. AdamW is torch.optim.AdamW (foreach=False) with weight decay on the 2+-dim parameters
only. Adafactor is written here from the paper and HF transformers' formulas (not imported from
transformers), in two configurations: the defaults (relative step, parameter scaling, no first
moment) and explicit lr with a first moment and no parameter scaling. SGD is torch.optim.SGD with
momentum 0.9, plain and Nesterov, weight decay (L2) on the 2+-dim parameters only.

File optim_trajectories.safetensors:
  init.<p>, grad<k>.<p>                       k = 0, 1, 2
  adamw.<k>.<p>, adafactor.<k>.<p>, adafactor_lr.<k>.<p>   parameters after step k
  sgd.<k>.<p>, sgd_nesterov.<k>.<p>           torch.optim.SGD, momentum 0.9 (heavy ball, Nesterov)
  lr                                          [3] float64, the lr passed to step k
"""
import math

import torch

import st

NAMES = ["w", "t", "b"]
SHAPES = {"w": (4, 6), "t": (2, 3, 5), "b": (6,)}
LRS = [1e-2, 5e-3, 2e-3]
STEPS = 3
WD = 0.1


def torch_trajectory(init, grads, tag, make_optimizer):
    """The parameters after each step of a torch.optim optimizer, weight decay on 2+-dim only."""
    params = {n: init[n].clone().requires_grad_(True) for n in NAMES}
    decay = [params[n] for n in NAMES if params[n].dim() >= 2]
    no_decay = [params[n] for n in NAMES if params[n].dim() < 2]
    opt = make_optimizer([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}])
    out = {}
    for k in range(STEPS):
        for group in opt.param_groups:
            group["lr"] = LRS[k]
        for n in NAMES:
            params[n].grad = grads[k][n].clone()
        opt.step()
        out.update({f"{tag}.{k}.{n}": params[n].detach().clone() for n in NAMES})
    return out


def adamw(init, grads):
    return torch_trajectory(init, grads, "adamw",
                            lambda groups: torch.optim.AdamW(groups, lr=LRS[0], betas=(0.9, 0.95), eps=1e-8,
                                                             foreach=False))


def sgd(init, grads, tag, nesterov):
    return torch_trajectory(init, grads, tag,
                            lambda groups: torch.optim.SGD(groups, lr=LRS[0], momentum=0.9, nesterov=nesterov,
                                                           foreach=False))


def rms(x):
    return (x.norm(2) / math.sqrt(x.numel())).item()


def adafactor(init, grads, tag, relative_step, scale_parameter, beta1,
              clip_threshold=1.0, decay_rate=-0.8, eps1=1e-30, eps2=1e-3):
    """Adafactor after Shazeer & Stern (2018) Algorithms 4/5 with HF's choices: row/column means,
    update clipping, relative step min(1e-2, 1/sqrt(t)), step scaled by max(eps2, RMS(X)), and
    weight decay X -= wd * alpha * X (here only on 2+-dim parameters)."""
    params = {n: init[n].clone() for n in NAMES}
    state = {}
    for n in NAMES:
        p = params[n]
        s = {"step": 0}
        if p.dim() >= 2:
            s["row"] = torch.zeros(p.shape[:-1])
            s["col"] = torch.zeros(p.shape[:-2] + p.shape[-1:])
        else:
            s["v"] = torch.zeros_like(p)
        if beta1 > 0:
            s["m"] = torch.zeros_like(p)
        state[n] = s
    out = {}
    for k in range(STEPS):
        for n in NAMES:
            p, g, s = params[n], grads[k][n], state[n]
            s["step"] += 1
            t = s["step"]
            rho = min(1e-2, 1.0 / math.sqrt(t)) if relative_step else LRS[k]
            alpha = rho * (max(eps2, rms(p)) if scale_parameter else 1.0)
            beta2t = 1.0 - t ** decay_rate
            q = g * g + eps1
            if p.dim() >= 2:
                s["row"] = beta2t * s["row"] + (1 - beta2t) * q.mean(dim=-1)
                s["col"] = beta2t * s["col"] + (1 - beta2t) * q.mean(dim=-2)
                v_hat = (s["row"] / s["row"].mean(dim=-1, keepdim=True)).unsqueeze(-1) * s["col"].unsqueeze(-2)
                u = g / v_hat.sqrt()
            else:
                s["v"] = beta2t * s["v"] + (1 - beta2t) * q
                u = g / s["v"].sqrt()
            u = u / max(1.0, rms(u) / clip_threshold)
            u = alpha * u
            if beta1 > 0:
                s["m"] = beta1 * s["m"] + (1 - beta1) * u
                u = s["m"]
            if p.dim() >= 2:
                p = p - WD * alpha * p
            params[n] = p - u
        out.update({f"{tag}.{k}.{n}": params[n].clone() for n in NAMES})
    return out


def generate(out):
    init = {n: torch.randn(SHAPES[n]) for n in NAMES}
    grads = [{n: torch.randn(SHAPES[n]) * (0.5 + k) for n in NAMES} for k in range(STEPS)]
    tensors = {f"init.{n}": init[n] for n in NAMES}
    for k in range(STEPS):
        tensors.update({f"grad{k}.{n}": grads[k][n] for n in NAMES})
    tensors.update(adamw(init, grads))
    tensors.update(sgd(init, grads, "sgd", nesterov=False))
    tensors.update(sgd(init, grads, "sgd_nesterov", nesterov=True))
    tensors.update(adafactor(init, grads, "adafactor", relative_step=True, scale_parameter=True, beta1=0.0))
    tensors.update(adafactor(init, grads, "adafactor_lr", relative_step=False, scale_parameter=False, beta1=0.9))
    tensors["lr"] = torch.tensor(LRS, dtype=torch.float64)
    st.save(out / "optim_trajectories.safetensors", tensors)
