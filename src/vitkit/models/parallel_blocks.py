"""Later members of the family whose blocks are not the paper's Eq. 2-3 (none is the paper's).

The paper's block is sequential: attention (Eq. 2), then the MLP on its output (Eq. 3). Three
``ViTConfig`` switches change that, each with timm's parameter names so that its checkpoints
convert key for key:

- ``parallel=N`` (Touvron et al. 2022, "Three things everyone should know about Vision
  Transformers"; timm's ``ParallelThingsBlock``, ``vit_*_patch16_18x2_224``): N attention
  branches side by side, then N MLP branches, each with its own LayerNorm and layer scale::

      z' = z + sum_i LS(MSA_i(LN_i(z))),    z'' = z' + sum_i LS(MLP_i(LN_i(z')))

- ``parallel_scaling`` (Dehghani et al. 2023, ViT-22B; timm's ``ParallelScalingBlock``,
  ``vit_*_xp_*``, ``vit_pwee_*``): attention and MLP read the same LayerNorm and their outputs
  are added in one residual::

      y = LN(z),    z' = z + LS(MSA(y) + MLP(y))

  One Linear (``in_proj``) computes the MLP's hidden layer and q, k, v at once, split
  [MLP | q | k | v] (``in_split``); with ``qkv_bias`` it has one bias over all four, without
  it the MLP's hidden layer keeps its own (``mlp_bias``) and q, k, v have none. The outputs
  are ``attn_out_proj`` and ``mlp_out_proj`` (with ``diff_attn``: one ``out_proj`` over
  [attention | MLP], timm's ``DiffParallelScalingBlock``).
- ``diff_attn`` (Ye et al. 2024, "Differential Transformer"; timm's ``DiffAttention``): each
  head splits its queries and keys in two halves and takes the difference of two softmaxes::

      A = softmax(Q1 K1^T / sqrt(d/2)) - lambda softmax(Q2 K2^T / sqrt(d/2))
      head = (1 - lambda_init) RMSNorm(A V)
      lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init

  with lambda_init = 0.8 - 0.6 exp(-0.3 l) for block l (0-based). As the authors' code, lambda
  is computed in float32 (``sub_norm``: RMSNorm, epsilon 1e-5, over the head's width).

``forward`` runs PyTorch's fused attention kernel (differential attention: two of them,
softmax_1 V - lambda softmax_2 V); ``forward_explicit`` computes the softmax itself and returns
the maps (the differential ones, A above), as :class:`vitkit.models.vit.Attention` does.

The blocks of ``parallel=N`` are built from :mod:`vitkit.models.vit`'s attention, MLP and layer
scale, passed in by the model (this module imports nothing from it).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitkit.models.block_parts import drop_path, make_norm
from vitkit.registry.model_config import ViTConfig

Factory = Callable[[], nn.Module]


class ParallelThingsBlock(nn.Module):
    """``parallel=N``: N attention branches summed, then N MLP branches summed."""

    def __init__(
        self, cfg: ViTConfig, drop_path_rate: float, attn: Factory, mlp: Factory, scale: Factory
    ) -> None:
        super().__init__()
        d, drop = cfg.width, cfg.dropout
        self.drop_path_rate = drop_path_rate
        self.attns = nn.ModuleList(
            nn.Sequential(
                OrderedDict(norm=make_norm(cfg, d), attn=attn(), drop=nn.Dropout(drop), ls=scale())
            )
            for _ in range(cfg.parallel)
        )
        self.ffns = nn.ModuleList(
            nn.Sequential(OrderedDict(norm=make_norm(cfg, d), mlp=mlp(), ls=scale()))
            for _ in range(cfg.parallel)
        )

    def _add(self, x: Tensor, branches: list[Tensor]) -> Tensor:
        return x + sum(drop_path(b, self.drop_path_rate, self.training) for b in branches)

    def forward(self, x: Tensor) -> Tensor:
        x = self._add(x, [branch(x) for branch in self.attns])
        return self._add(x, [branch(x) for branch in self.ffns])

    def forward_explicit(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """As ``forward``; also returns the branches' attention weights, averaged."""
        outs, weights = [], []
        for branch in self.attns:
            part: dict[str, Any] = dict(branch.named_children())  # norm, attn, drop, ls
            out, w = part["attn"].forward_explicit(part["norm"](x))
            outs.append(part["ls"](part["drop"](out)))
            weights.append(w)
        x = self._add(x, outs)
        return self._add(x, [branch(x) for branch in self.ffns]), torch.stack(weights).mean(0)


def lambda_init(index: int) -> float:
    """Differential attention's lambda_init for block ``index`` (0-based; Ye et al. 2024)."""
    return 0.8 - 0.6 * math.exp(-0.3 * index)


def _add_lambdas(module: nn.Module, half: int) -> None:
    """Differential attention's parameters on ``module``, initialised as the authors'."""
    for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
        module.register_parameter(name, nn.Parameter(torch.randn(half) * 0.1))
    module.sub_norm = nn.RMSNorm(2 * half, eps=1e-5)


def _attention(
    q: Tensor, k: Tensor, v: Tensor, p: float, training: bool, explicit: bool
) -> tuple[Tensor, Tensor | None]:
    """softmax(q k^T / sqrt(d)) v per head: PyTorch's fused kernel, or (``explicit``) the
    softmax computed here, also returning its weights [B, heads, T, T]."""
    if not explicit:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p if training else 0.0), None
    weights = torch.softmax((q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1), dim=-1)
    return F.dropout(weights, p, training) @ v, weights


def _differential(
    module: nn.Module, q: Tensor, k: Tensor, v: Tensor, init: float, p: float, explicit: bool
) -> tuple[Tensor, Tensor | None]:
    """Differential attention of q, k [B, 2H, T, d/2] (head h's halves at 2h and 2h + 1)
    and v [B, H, T, d]: the heads [B, H, T, d] and (``explicit``) the maps [B, H, T, T]."""
    b, h2, t, half = q.shape
    g = {n: getattr(module, n) for n in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")}
    lam1 = torch.exp((g["lambda_q1"] * g["lambda_k1"]).sum(-1).float())
    lam2 = torch.exp((g["lambda_q2"] * g["lambda_k2"]).sum(-1).float())
    lam = (lam1 - lam2 + init).to(q.dtype)  # float32, as the authors' and timm's code
    q1, q2 = q.reshape(b, h2 // 2, 2, t, half).unbind(2)
    k1, k2 = k.reshape(b, h2 // 2, 2, t, half).unbind(2)
    sub_norm = cast(nn.RMSNorm, module.sub_norm)
    if not explicit:  # A V = softmax_1 V - lambda softmax_2 V: two fused kernels
        out1, _ = _attention(q1, k1, v, p, module.training, explicit)
        out2, _ = _attention(q2, k2, v, p, module.training, explicit)
        return sub_norm(out1 - lam * out2) * (1 - init), None
    w1 = torch.softmax((q1 * half**-0.5) @ k1.transpose(-2, -1), dim=-1)
    w2 = torch.softmax((q2 * half**-0.5) @ k2.transpose(-2, -1), dim=-1)
    maps = F.dropout(w1, p, module.training) - lam * F.dropout(w2, p, module.training)
    return sub_norm(maps @ v) * (1 - init), maps


class DiffAttention(nn.Module):
    """``diff_attn``: differential multi-head self-attention (timm's ``DiffAttention``),
    in place of the paper's MSA in Eq. 2; ``forward_explicit`` also returns the maps."""

    def __init__(self, cfg: ViTConfig, index: int) -> None:
        super().__init__()
        self.num_heads, d = cfg.num_heads, cfg.width
        self.half_dim = d // cfg.num_heads // 2  # each head's queries and keys split in two
        self.init = lambda_init(index)
        self.attn_dropout = cfg.attn_dropout
        self.qkv = nn.Linear(d, 3 * d, bias=cfg.qkv_bias)
        norm = cfg.qk_norm
        self.q_norm = make_norm(cfg, self.half_dim) if norm else nn.Identity()
        self.k_norm = make_norm(cfg, self.half_dim) if norm else nn.Identity()
        self.proj = nn.Linear(d, d)
        _add_lambdas(self, self.half_dim)

    def forward(self, x: Tensor, rope: None = None, bias: None = None) -> Tensor:
        """(``rope`` / ``bias``: the paper's block passes them; the config refuses both here.)"""
        return self._run(x, explicit=False)[0]

    def forward_explicit(
        self, x: Tensor, rope: None = None, bias: None = None
    ) -> tuple[Tensor, Tensor]:
        out, weights = self._run(x, explicit=True)
        assert weights is not None
        return out, weights

    def _run(self, x: Tensor, explicit: bool) -> tuple[Tensor, Tensor | None]:
        b, t, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = self.q_norm(q.reshape(b, t, 2 * self.num_heads, self.half_dim).transpose(1, 2))
        k = self.k_norm(k.reshape(b, t, 2 * self.num_heads, self.half_dim).transpose(1, 2))
        v = v.reshape(b, t, self.num_heads, 2 * self.half_dim).transpose(1, 2)
        heads, weights = _differential(self, q, k, v, self.init, self.attn_dropout, explicit)
        return self.proj(heads.transpose(1, 2).reshape(b, t, d)), weights


class ParallelScalingBlock(nn.Module):
    """``parallel_scaling``: z + LS(MSA(LN(z)) + MLP(LN(z))) with a fused input projection."""

    def __init__(self, cfg: ViTConfig, index: int, drop_path_rate: float, scale: Factory) -> None:
        super().__init__()
        d, m, heads = cfg.width, cfg.mlp_dim, cfg.num_heads
        self.num_heads, self.diff = heads, cfg.diff_attn
        self.head_dim = d // heads // (2 if self.diff else 1)  # q/k width per (half) head
        self.in_split = [m, d, d, d]  # [MLP hidden | q | k | v]
        self.in_norm = make_norm(cfg, d)
        self.in_proj = nn.Linear(d, m + 3 * d, bias=cfg.qkv_bias)
        # Without qkv_bias, the MLP's hidden layer keeps its bias (q, k and v have none).
        self.mlp_bias = None if cfg.qkv_bias else nn.Parameter(torch.zeros(m))
        self.q_norm = make_norm(cfg, self.head_dim) if cfg.qk_norm else nn.Identity()
        self.k_norm = make_norm(cfg, self.head_dim) if cfg.qk_norm else nn.Identity()
        self.attn_dropout = cfg.attn_dropout
        self.mlp_act = nn.GELU(approximate=cfg.gelu)
        self.mlp_drop = nn.Dropout(cfg.dropout)
        if self.diff:  # timm's DiffParallelScalingBlock: one projection of [attention | MLP]
            self.init = lambda_init(index)
            _add_lambdas(self, self.head_dim)
            self.out_proj = nn.Linear(d + m, d)
        else:
            self.attn_out_proj = nn.Linear(d, d)
            self.mlp_out_proj = nn.Linear(m, d)
        self.ls = scale()
        self.drop_path_rate = drop_path_rate
        for linear in (m for m in self.modules() if isinstance(m, nn.Linear)):
            nn.init.xavier_uniform_(linear.weight)
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self._run(x, explicit=False)[0]

    def forward_explicit(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The block's output and its attention weights [B, heads, T, T]."""
        out, weights = self._run(x, explicit=True)
        assert weights is not None
        return out, weights

    def _run(self, x: Tensor, explicit: bool) -> tuple[Tensor, Tensor | None]:
        b, t, d = x.shape
        hidden, q, k, v = torch.split(self.in_proj(self.in_norm(x)), self.in_split, dim=-1)
        if self.mlp_bias is not None:
            hidden = hidden + self.mlp_bias
        split = 2 * self.num_heads if self.diff else self.num_heads
        q = self.q_norm(q.reshape(b, t, split, self.head_dim).transpose(1, 2))
        k = self.k_norm(k.reshape(b, t, split, self.head_dim).transpose(1, 2))
        v = v.reshape(b, t, self.num_heads, d // self.num_heads).transpose(1, 2)
        p = self.attn_dropout
        if self.diff:
            heads, weights = _differential(self, q, k, v, self.init, p, explicit)
        else:
            heads, weights = _attention(q, k, v, p, self.training, explicit)
        attn = heads.transpose(1, 2).reshape(b, t, d)
        mlp = self.mlp_drop(self.mlp_act(hidden))
        if self.diff:
            y = self.out_proj(torch.cat([attn, mlp], dim=-1))
        else:
            y = self.attn_out_proj(attn) + self.mlp_out_proj(mlp)
        return x + drop_path(self.ls(y), self.drop_path_rate, self.training), weights
