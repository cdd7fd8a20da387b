"""The two small layers every kind of encoder block shares: the config's norm and stochastic
depth. Here rather than in model.py so that vitkit.parallel_blocks, which model.py imports,
uses the same ones."""

from __future__ import annotations

from torch import Tensor, nn

from vitkit.config import ViTConfig


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
