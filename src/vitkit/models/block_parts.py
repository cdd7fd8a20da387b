"""The small pieces every kind of encoder block shares: the config's norm, stochastic depth, an
additive attention bias at the logits' precision, LayerScale and the MLP of Eq. 3. Here rather
than in vit.py so that vitkit.models.parallel_blocks, which vit.py imports, uses the same ones."""

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
    mask = x.new_empty([x.shape[0]] + [1] * (x.dim() - 1)).bernoulli_(keep)  # (TorchScript)
    return x * mask / keep


def logit_bias(bias: Tensor, dtype: torch.dtype) -> Tensor:
    """An additive attention bias (a relative position bias, NaFlex's padding mask) at the
    logits' ``dtype``, clamped to its range. A padding mask holds fp32's most negative number,
    which bf16 rounds to -inf: a padding query masked from every key then got softmax(-inf,
    ...) = NaN, and every token after it through the values (0 * NaN)."""
    if bias.dtype == dtype:
        return bias
    return bias.clamp(min=torch.finfo(dtype).min).to(dtype)


class QuickGELU(nn.Module):
    """CLIP's GELU approximation x * sigmoid(1.702 x) (``gelu="quick"``; not the paper's)."""

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.sigmoid(1.702 * x)


class LayerScale(nn.Module):
    """Per-channel scale of a residual branch (CaiT, DeiT-III, DINOv2; not the paper's)."""

    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


class Mlp(nn.Module):
    """The MLP of Eq. 3: two dense layers with a GELU between them."""

    def __init__(self, cfg: ViTConfig, mlp_dim: int | None = None) -> None:
        super().__init__()
        mlp_dim = mlp_dim or cfg.mlp_dim  # (the MAP head's may differ: map_mlp_dim)
        self.fc1 = nn.Linear(cfg.width, mlp_dim, bias=cfg.proj_bias)
        self.swiglu = cfg.mlp == "swiglu"  # DINOv2-giant: SiLU(x1) * x2 from one packed fc1
        self.act: nn.Module = nn.SiLU() if self.swiglu else nn.GELU(approximate=cfg.gelu)
        self.act = QuickGELU() if cfg.gelu == "quick" and not self.swiglu else self.act
        hidden = mlp_dim // 2 if self.swiglu else mlp_dim
        # BEiT-3's sub-LayerNorm on the hidden units, after the activation
        self.norm = make_norm(cfg, hidden) if cfg.scale_mlp_norm else nn.Identity()
        self.fc2 = nn.Linear(hidden, cfg.width, bias=cfg.proj_bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        if self.swiglu:
            x1, x2 = self.fc1(x).chunk(2, dim=-1)
            return self.drop(self.fc2(self.norm(self.drop(self.act(x1) * x2))))
        return self.drop(self.fc2(self.norm(self.drop(self.act(self.fc1(x))))))
