"""Optimizers with the paper's parameter grouping.

Weight decay is decoupled (AdamW) and applies only to weight matrices and convolution kernels:
never to norms, biases, the position embeddings, the class token or a pre-training mask token
(as big_vision and timm), nor to the family's other learned tokens (distillation token,
registers, the MAP head's probe: big_vision decays only kernels).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

from vitkit.errors import VitkitError

OptimizerName = Literal["adamw", "sgd"]

NO_DECAY_NAMES = ("pos_embed", "cls_token", "dist_token", "reg_token", "mask_token", "latent")


def decays(name: str, param: torch.Tensor) -> bool:
    """True for parameters that get weight decay: 2-D+ weights that are not embeddings."""
    return param.ndim >= 2 and not any(n in name for n in NO_DECAY_NAMES)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two groups: decayed weights and everything else (norms, biases, pos_embed, cls_token)."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (decay if decays(name, p) else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


# On the CPU, fused AdamW (one kernel over all parameters) from this many parameters: it is
# 3.8-4.8x faster than for-each for Ti/16 and S/16 but slower for the 0.2-0.5 M-parameter MNIST
# models (bench/results/optimizer_step.md).
CPU_FUSED_ADAMW_MIN_PARAMS = 1_000_000


def build_optimizer(
    model: nn.Module,
    name: OptimizerName,
    lr: float,
    weight_decay: float,
    *,
    betas: tuple[float, float] = (0.9, 0.999),
    momentum: float = 0.9,
    fused: bool | None = None,
) -> torch.optim.Optimizer:
    """AdamW or SGD over :func:`param_groups`. ``fused``: one kernel for all parameters;
    ``None`` chooses by the parameters' device: fused on CUDA, and on the CPU for AdamW from
    ``CPU_FUSED_ADAMW_MIN_PARAMS``. Otherwise the for-each implementation, which PyTorch picks
    itself only on CUDA-like devices: on the CPU its default runs one parameter at a time,
    1.3-1.5x slower per AdamW step than for-each for the MNIST models."""
    groups = param_groups(model, weight_decay)
    if fused is None:
        params = [p for g in groups for p in g["params"]]
        device = params[0].device.type if params else "cpu"
        n = sum(p.numel() for p in params)
        fused = device == "cuda" or (
            device == "cpu" and name == "adamw" and n >= CPU_FUSED_ADAMW_MIN_PARAMS
        )
    extra = {"fused": True} if fused else {"foreach": True}
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=betas, **extra)
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, **extra)
    raise VitkitError(f"unknown optimizer {name!r}: expected adamw or sgd")
