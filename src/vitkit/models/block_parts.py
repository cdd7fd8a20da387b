"""The small pieces every kind of encoder block shares: the config's norm, stochastic depth and
an additive attention bias at the logits' precision. Here rather than in vit.py so that
vitkit.models.parallel_blocks, which vit.py imports, uses the same ones."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from vitkit.registry.model_config import ViTConfig


def make_norm(cfg: ViTConfig, dim: int) -> nn.Module:
    """The config's norm over the last axis: the paper's LayerNorm, or with ``norm="rmsnorm"``
    RMSNorm x / sqrt(mean(x^2) + eps) * g, without a bias (AIMv2; timm's ``RmsNorm``)."""
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(dim, eps=cfg.layer_norm_eps)
    return nn.LayerNorm(dim, eps=cfg.layer_norm_eps)


def drop_path(x: Tensor, rate: float, training: bool) -> Tensor:
    """Stochastic depth: drop the whole residual branch per sample (not in the paper)."""
    if rate == 0.0 or not training:
        return x
    keep = 1.0 - rate
    mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
    return x * mask / keep


def logit_bias(bias: Tensor, dtype: torch.dtype) -> Tensor:
    """An additive attention bias (a relative position bias, NaFlex's padding mask) at the
    logits' ``dtype``, clamped to its range. A padding mask holds fp32's most negative number,
    which bf16 rounds to -inf: a padding query masked from every key then got softmax(-inf,
    ...) = NaN, and every token after it through the values (0 * NaN)."""
    if bias.dtype == dtype:
        return bias
    return bias.clamp(min=torch.finfo(dtype).min).to(dtype)
